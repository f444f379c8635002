"""Waiting for a card-present interaction: ActionCable WebSocket first, polling as the fallback.

``InteractionHandle.wait()``:

1. takes a fresh single-use token (``POST /api/ws-token``), connects ``{ws_url}/cable?token=``,
   waits for ``welcome``, subscribes to ``terminal_job:<interaction_id>`` and reads records until
   one is no longer pending. Server pings (every 3 s) prove the socket is alive; silence for
   :data:`STALE_AFTER` seconds counts as a drop.
2. when the socket is refused or drops it reconnects with capped backoff, asking the status
   endpoint between attempts (the interaction may have finished meanwhile); after
   :data:`MAX_SOCKET_ATTEMPTS` failures, :data:`MAX_EMPTY_SESSIONS` sockets that confirmed the
   subscription and closed before any record, a rejected subscription or a ``disconnect`` that
   forbids reconnecting, it polls the status endpoint instead.
3. a finished record seen on the socket is the answer, with no GET to confirm it: the interface
   offers polling *or* the WebSocket (flow rule 2), and both carry the same record (choices.md).
   A confirming GET cost a request per interaction, and under a rate limit its 429 cost a
   ``Retry-After`` per sale. The status endpoint is asked only when the socket cannot say: between
   reconnects, when polling, and once the interaction's lifetime (3 minutes) has passed, when what
   it says is returned as it is.

The client is aiohttp's, not the ``websockets`` package: it rides the transport's one session
(same connector, timeouts and shutdown), so there is a single HTTP stack to reason about.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from typing import TYPE_CHECKING, Any

import aiohttp

from kiosk_agent.service.errors import (
    InvalidResponseError,
    RateLimitedError,
    ServerError,
    ServiceError,
    ServiceUnreachableError,
)
from kiosk_agent.service.models.terminal import Interaction, InteractionKind
from kiosk_agent.service.parsing import parse_interaction
from kiosk_agent.service.settings import CallKind

if TYPE_CHECKING:
    from kiosk_agent.service.terminal import TerminalClient

_LOGGER = logging.getLogger(__name__)

INTERACTION_LIFETIME = 180.0  # seconds, when a record does not say
STALE_AFTER = 10.0  # seconds without any frame (the server pings every 3 s)
MAX_SOCKET_ATTEMPTS = 4  # socket failures before polling for the rest of the wait
# Sockets that confirmed the subscription and then closed before any record: after this many,
# the service is dropping them on purpose, and reconnecting only costs requests: poll instead.
MAX_EMPTY_SESSIONS = 2
RECONNECT_BASE = 0.1  # seconds, doubled per failure
RECONNECT_MAX = 2.0
EXPIRY_GRACE = 2.0  # at most this long past the lifetime, then the status endpoint's word
PROTOCOLS = ("actioncable-v1-json",)


class SocketUnavailable(Exception):
    """The WebSocket could not be used this time; ``retry`` says whether another try may work."""

    def __init__(self, reason: str, *, retry: bool = True) -> None:
        super().__init__(reason)
        self.retry = retry


class _LifetimeOver(Exception):
    """The interaction's lifetime (and grace) passed while following it on the socket."""


class InteractionHandle:
    """A started read-card or charge-card: its ids, and :meth:`wait` for its outcome."""

    def __init__(
        self,
        terminal: TerminalClient,
        *,
        device_id: str,
        kind: InteractionKind,
        interaction_id: str,
        order_id: str | None = None,
    ) -> None:
        self._terminal = terminal
        self.device_id = device_id
        self.kind = kind
        self.interaction_id = interaction_id
        self.order_id = order_id
        self.last: Interaction | None = None
        loop = asyncio.get_running_loop()
        self._started = loop.time()
        self._expiry = self._started + INTERACTION_LIFETIME + EXPIRY_GRACE
        # how the wait went (diagnostics, tests, benchmarks)
        self.socket_connects = 0
        self.socket_failures = 0
        self.polls = 0
        self.empty_sessions = 0  # confirmed, then closed with no record
        self.via: str | None = None  # "websocket" or "polling": who saw the end first

    def __repr__(self) -> str:
        return (
            f"InteractionHandle({self.kind.value} {self.interaction_id} on {self.device_id}, "
            f"status={self.last.status if self.last else 'pending'})"
        )

    @property
    def identifier(self) -> str:
        """The ActionCable channel identifier (JSON text, sent and matched verbatim)."""
        return json.dumps({"channel": f"terminal_job:{self.interaction_id}"})

    async def wait(self, timeout: float | None = None) -> Interaction:  # noqa: ASYNC109 (contract)
        """The interaction once it is no longer pending (or its lifetime is over).

        ``timeout`` (seconds) bounds the wait; past it, ``TimeoutError`` (the interaction goes on
        on the service's side: call ``wait`` again, or cancel it).
        """
        if self.last is not None and self.last.finished:
            return self.last
        try:
            async with asyncio.timeout(timeout):
                return await self._wait()
        except TimeoutError:
            raise TimeoutError(
                f"{self.kind.value} {self.interaction_id} still pending after {timeout} s"
            ) from None

    async def refresh(self) -> Interaction:
        """Ask the status endpoint now."""
        record = await self._terminal.get_interaction(
            self.device_id, self.kind, self.interaction_id
        )
        self._note(record)
        self.polls += 1
        return record

    # -- the wait ------------------------------------------------------------------------------

    async def _wait(self) -> Interaction:
        if self._terminal.settings.websocket:
            record = await self._wait_on_socket()
            if record is not None:
                return record
        return await self._poll()

    async def _wait_on_socket(self) -> Interaction | None:
        """The finished record, or None to poll for the rest of the wait."""
        loop = asyncio.get_running_loop()
        while self.socket_failures < MAX_SOCKET_ATTEMPTS:
            if loop.time() >= self._expiry:
                return None
            try:
                record = await self._follow_socket()
            except SocketUnavailable as exc:
                self.socket_failures += 1
                _LOGGER.debug("%s: WebSocket unavailable: %s", self.interaction_id, exc)
                if not exc.retry or self.empty_sessions >= MAX_EMPTY_SESSIONS:
                    return None
            except _LifetimeOver:
                return None  # the status endpoint decides
            else:
                self.via = "websocket"
                return record
            # Between attempts the interaction may have finished: ask once, then back off.
            polled = await self._refresh_through_outages()
            if polled is not None and polled.finished:
                self.via = "polling"
                return polled
            ceiling = min(RECONNECT_MAX, RECONNECT_BASE * 2.0 ** (self.socket_failures - 1))
            await asyncio.sleep(ceiling * random.uniform(0.5, 1.0))
        return None

    async def _poll(self) -> Interaction:
        loop = asyncio.get_running_loop()
        interval = self._terminal.settings.poll_interval
        while True:
            record = await self._refresh_through_outages()
            if record is not None and (record.finished or loop.time() >= self._expiry):
                self.via = self.via or "polling"
                return record
            await asyncio.sleep(min(interval, max(0.0, self._expiry - loop.time())))

    async def _refresh_through_outages(self) -> Interaction | None:
        """The status endpoint's record, or None after a passing outage (before the expiry).

        A network blip, a 5xx or a rate limit while waiting must not end the wait: the
        interaction goes on at the service, so keep asking until its lifetime is over.
        """
        try:
            return await self.refresh()
        except (ServiceUnreachableError, ServerError, RateLimitedError) as exc:
            if asyncio.get_running_loop().time() >= self._expiry:
                raise
            _LOGGER.warning("%s: status check failed, will ask again: %s", self.interaction_id, exc)
            return None

    async def _follow_socket(self) -> Interaction:
        """One socket session: the first finished record, or SocketUnavailable."""
        terminal = self._terminal
        try:
            token = await terminal.ws_token()
        except ServiceError as exc:
            raise SocketUnavailable(f"no WebSocket token: {exc}") from None
        url = f"{terminal.settings.websocket_base}/cable"
        handshake = terminal.settings.timeouts(CallKind.WEBSOCKET)
        started, outcome = time.monotonic(), "unreachable"
        try:
            async with asyncio.timeout(handshake.total):
                ws = await terminal.session.ws_connect(
                    url, params={"token": token}, protocols=PROTOCOLS, autoping=True,
                    heartbeat=None, timeout=aiohttp.ClientWSTimeout(ws_close=handshake.read),
                )  # fmt: skip
            outcome = "ok"
        except aiohttp.WSServerHandshakeError as exc:
            outcome = "error"
            raise SocketUnavailable(f"refused with HTTP {exc.status}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise SocketUnavailable(f"cannot connect: {type(exc).__name__}") from None
        except TimeoutError:
            raise SocketUnavailable(f"no handshake within {handshake.total:g} s") from None
        except asyncio.CancelledError:
            outcome = ""  # abandoned, not ended
            raise
        finally:
            if outcome:
                terminal.report_call(CallKind.WEBSOCKET, started, outcome)
        self.socket_connects += 1
        async with ws:
            return await self._read_socket(ws)

    async def _read_socket(self, ws: aiohttp.ClientWebSocketResponse) -> Interaction:
        identifier = self.identifier
        subscribed = confirmed = heard = False
        try:
            while True:
                frame = await self._next_frame(ws)
                kind = frame.get("type")
                if kind == "welcome" and not subscribed:
                    subscribe = {"command": "subscribe", "identifier": identifier}
                    await ws.send_str(json.dumps(subscribe))
                    subscribed = True
                elif kind == "confirm_subscription":
                    confirmed = True
                elif kind == "reject_subscription":
                    raise SocketUnavailable("subscription rejected", retry=False)
                elif kind == "disconnect":
                    reconnect = frame.get("reconnect") is not False
                    reason = f"server disconnect: {frame.get('reason')}"
                    raise SocketUnavailable(reason, retry=reconnect)
                elif frame.get("identifier") == identifier and "message" in frame:
                    heard = True
                    try:
                        record = parse_interaction(
                            frame["message"], what="interaction over WebSocket"
                        )
                    except InvalidResponseError as exc:
                        # the status endpoint decides instead (and names the field if bad too)
                        raise SocketUnavailable(str(exc), retry=False) from None
                    self._note(record)
                    if record.finished:
                        return record
                # ping and anything new: nothing to do but keep reading
        except SocketUnavailable:
            if confirmed and not heard:
                self.empty_sessions += 1
            raise

    async def _next_frame(self, ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
        # The lifetime is read afresh for every frame: the first record tells the real one.
        until_expiry = self._expiry - asyncio.get_running_loop().time()
        if until_expiry <= 0:
            raise _LifetimeOver
        try:
            message = await ws.receive(timeout=min(STALE_AFTER, until_expiry))
        except TimeoutError:
            if until_expiry < STALE_AFTER:
                raise _LifetimeOver from None
            raise SocketUnavailable(f"no frame for {STALE_AFTER:g} s") from None
        if message.type is not aiohttp.WSMsgType.TEXT:
            raise SocketUnavailable(f"socket {message.type.name.lower()}")
        try:
            frame = json.loads(message.data)
        except json.JSONDecodeError:
            raise SocketUnavailable("a frame that is not JSON") from None
        if not isinstance(frame, dict):
            raise SocketUnavailable("a frame that is not a JSON object")
        return frame

    def _note(self, record: Interaction) -> None:
        """Keep the latest record and learn the real lifetime from it."""
        self.last = record
        lifetime = self._terminal.real_lifetime(self._started, record)
        if lifetime is not None:
            grace = min(EXPIRY_GRACE, lifetime * 0.05)
            self._expiry = self._started + lifetime + grace
