"""Waiting for a card-present interaction: ActionCable WebSocket first, polling as the fallback.

One :class:`Cable` per terminal client carries every interaction's subscription (ActionCable
multiplexes channels on one connection): a sale no longer pays a token request, a TCP connect and
a WebSocket handshake of its own.

- The cable opens on first need: a fresh single-use token (``POST /api/ws-token``), connect
  ``{ws_url}/cable?token=``, wait for ``welcome``. A redirect answering the upgrade is refused,
  not followed (``redirects.py``): this wait polls. Each wait subscribes ``terminal_job:<id>`` on
  it and unsubscribes when done (the frame once no customer waits for a machine's answer:
  :attr:`Cable.leave_when`). Server pings (every 3 s) prove the socket alive; silence for
  :data:`STALE_AFTER` seconds counts as a drop.
- With no subscription left it lingers :data:`CABLE_LINGER` seconds for the next sale, then
  closes, so an idle agent is not woken by the pings. A dropped cable is not reopened by itself:
  the next wait that needs it opens it afresh, with a new token.

``InteractionHandle.wait()``:

1. subscribes on the cable and reads its records until one is no longer pending.
2. when the cable cannot be opened or drops, it asks the status endpoint (the interaction may
   have finished meanwhile, and a record pushed while the socket was down is lost), backs off and
   subscribes again, on a cable reopened by whichever wait needs it first. After
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
import contextlib
import json
import json.encoder
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

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
from kiosk_agent.service.redirects import RedirectRefused
from kiosk_agent.service.settings import CallKind
from kiosk_agent.service.timeouts import INTERACTION_LIFETIME
from kiosk_agent.tasks import cancel_and_wait

if TYPE_CHECKING:
    from kiosk_agent.service.terminal import TerminalClient

_LOGGER = logging.getLogger(__name__)

STALE_AFTER = 10.0  # seconds without any frame (the server pings every 3 s)
# An idle cable stays open this long for the next sale (a queue of customers), then closes: an
# agent with no sale is not woken every 3 s by the pings, and reopening costs one token request.
CABLE_LINGER = 60.0
MAX_SOCKET_ATTEMPTS = 4  # socket failures before polling for the rest of the wait
# Sockets that confirmed the subscription and then closed before any record: after this many,
# the service is dropping them on purpose, and reconnecting only costs requests: poll instead.
MAX_EMPTY_SESSIONS = 2
RECONNECT_BASE = 0.1  # seconds, doubled per failure
RECONNECT_MAX = 2.0
EXPIRY_GRACE = 2.0  # at most this long past the lifetime, then the status endpoint's word
PROTOCOLS = ("actioncable-v1-json",)
# A finished wait's unsubscribe frame waits at most this long for no customer to wait for a
# machine's answer (Cable.leave_when): sent inside the window, it was a socket write and some
# 0.1 ms of CPU before the approve, ten times that at a tenth of a core.
LEAVE_WAITS_FOR_CUSTOMER_S = 1.0


class SocketUnavailable(Exception):
    """The WebSocket could not be used this time; ``retry`` says whether another try may work."""

    def __init__(self, reason: str, *, retry: bool = True) -> None:
        super().__init__(reason)
        self.retry = retry


class _LifetimeOver(Exception):
    """The interaction's lifetime (and grace) passed while following it on the socket."""


class CableClock(Protocol):
    """The clock the linger is measured on (the sale code's clock fits; tests move a fake one)."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class _LoopClock:
    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


Frame = dict[str, Any]


class Subscription:
    """One wait's place on the cable: its channel's frames, then the socket's end, in order.

    A deque and the one reader's future, not an ``asyncio.Queue``: a frame put and taken is a
    few Python calls where the queue's own took a dozen (its ``put_nowait``, ``_put``,
    ``_wakeup_next``, ``get``, ``empty``, ``get_nowait``, ``_get``), and :meth:`next` is bounded
    by one timer on the loop's clock instead of an ``asyncio.timeout`` entered around it."""

    def __init__(self, identifier: str, connection: _Connection) -> None:
        self.identifier = identifier
        self.connection = connection
        self._frames: deque[Frame | SocketUnavailable] = deque()
        self._reader: asyncio.Future[None] | None = None  # set when a frame or the end comes
        self.confirmed = False  # the server confirmed it
        self.heard = False  # a record for it arrived

    def put(self, item: Frame | SocketUnavailable) -> None:
        """A frame for the channel, or why the socket can say no more (never refused)."""
        self._frames.append(item)
        reader = self._reader
        if reader is not None and not reader.done():
            reader.set_result(None)

    async def next(self, deadline: float | None = None) -> Frame:
        """The channel's next record frame; SocketUnavailable once the socket cannot say more;
        :class:`_LifetimeOver` when none came by ``deadline`` (the loop's time)."""
        frames = self._frames
        if not frames:
            if self._reader is not None:  # its wake-up would be taken: the first one stranded
                raise RuntimeError("a cable subscription has one reader at a time")
            loop = asyncio.get_running_loop()
            reader = self._reader = loop.create_future()
            bound = None if deadline is None else loop.call_at(deadline, _lapse, reader)
            try:
                await reader
            finally:
                self._reader = None
                if bound is not None:
                    bound.cancel()
            if not frames:  # the bound lapsed with nothing come
                raise _LifetimeOver
        item = frames.popleft()
        if isinstance(item, SocketUnavailable):
            raise item
        return item


def _lapse(reader: asyncio.Future[None]) -> None:
    if not reader.done():
        reader.set_result(None)


class _Connection:
    """One socket session of the cable and the subscriptions placed on it."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.subscriptions: dict[str, list[Subscription]] = {}
        self.ended: SocketUnavailable | None = None
        self.idle_since = 0.0
        self.reader: asyncio.Task[None] | None = None
        # channels left whose unsubscribe frame is still to send (Cable.leave_when)
        self.leaving: list[str] = []

    def dispatch(self, frame: Frame) -> None:
        kind = frame.get("type")
        if kind is not None and kind not in ("confirm_subscription", "reject_subscription"):
            if kind == "disconnect":
                reconnect = frame.get("reconnect") is not False
                reason = f"server disconnect: {frame.get('reason')}"
                raise SocketUnavailable(reason, retry=reconnect)
            return  # welcome, ping and anything new: nothing to do
        identifier = frame.get("identifier")
        subscribers = self.subscriptions.get(identifier) if isinstance(identifier, str) else None
        if not subscribers:
            return  # a channel nobody follows any more
        if kind == "confirm_subscription":
            for subscription in subscribers:
                subscription.confirmed = True
        elif kind == "reject_subscription":
            for subscription in subscribers:
                subscription.put(SocketUnavailable("subscription rejected", retry=False))
        elif "message" in frame:
            for subscription in subscribers:
                subscription.heard = True
                subscription.put(frame)

    def end(self, reason: SocketUnavailable) -> None:
        """No more frames: every subscription hears why."""
        if self.ended is not None:
            return
        self.ended = reason
        for subscribers in self.subscriptions.values():
            for subscription in subscribers:
                subscription.put(reason)


class Cable:
    """The terminal client's one ActionCable connection, shared by every interaction's wait."""

    def __init__(
        self,
        terminal: TerminalClient,
        *,
        linger: float = CABLE_LINGER,
        clock: CableClock | None = None,
    ) -> None:
        self._terminal = terminal
        self.linger = linger
        self.clock: CableClock = clock or _LoopClock()
        self._connection: _Connection | None = None
        self._opening: asyncio.Task[_Connection] | None = None
        self._lingering: asyncio.Task[None] | None = None
        self.connects = 0  # sockets opened (diagnostics, tests, benchmarks)
        # Calls back once no customer waits for a machine's answer (the agent's
        # SaleRunner.when_no_terminal_held): a finished wait's unsubscribe frame is sent then,
        # or after LEAVE_WAITS_FOR_CUSTOMER_S, not on the way from the card to the approve.
        # None: sent at once.
        self.leave_when: Callable[[Callable[[], None]], None] | None = None
        self._leave_asked = False
        self._leave_bound: asyncio.TimerHandle | None = None
        self._leaving: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        return self._connection is not None and self._connection.ended is None

    async def subscribe(self, identifier: str) -> Subscription:
        """A subscription to ``identifier`` on the cable, opened first if need be.

        SocketUnavailable when the cable cannot be opened or the subscribe cannot be sent.
        """
        connection = await self._open_connection()
        if identifier in connection.leaving:  # left and not yet said: said first, in order
            connection.leaving.remove(identifier)
            await _send_leave(connection, identifier)
        subscription = Subscription(identifier, connection)
        subscribers = connection.subscriptions.setdefault(identifier, [])
        subscribers.append(subscription)
        if len(subscribers) == 1:
            try:
                await connection.ws.send_str(_command("subscribe", identifier))
            except (aiohttp.ClientError, OSError) as exc:
                await self.unsubscribe(subscription)
                raise SocketUnavailable(f"subscribe not sent: {type(exc).__name__}") from None
        return subscription

    async def unsubscribe(self, subscription: Subscription) -> None:
        """Leave the channel (the server stops pushing it); the last one out starts the linger."""
        connection = subscription.connection
        subscribers = connection.subscriptions.get(subscription.identifier, [])
        if subscription in subscribers:
            subscribers.remove(subscription)
        if subscribers:
            return
        connection.subscriptions.pop(subscription.identifier, None)
        if not connection.subscriptions:
            connection.idle_since = self.clock.monotonic()
        if connection.ended is None and not connection.ws.closed:
            if self.leave_when is None:
                await _send_leave(connection, subscription.identifier)
                return
            connection.leaving.append(subscription.identifier)
            if not self._leave_asked:  # no task and no loop turn here: a callback and a timer
                self._leave_asked = True
                self._leave_bound = asyncio.get_running_loop().call_later(
                    LEAVE_WAITS_FOR_CUSTOMER_S, self._leave_now
                )
                self.leave_when(self._leave_now)

    def _leave_now(self) -> None:
        """No customer waits (or the bound is over): the frames go, in a task of their own."""
        if not self._leave_asked:
            return  # the other of the two came first, or the cable closed
        self._leave_asked = False
        if self._leave_bound is not None:
            self._leave_bound.cancel()
            self._leave_bound = None
        if self._leaving is None or self._leaving.done():
            self._leaving = asyncio.ensure_future(self._send_leaving())

    async def _send_leaving(self) -> None:
        """The unsubscribe frames of finished waits. A cable closed or dropped meanwhile has
        left every channel with its socket."""
        connection = self._connection
        while connection is not None and connection.leaving:
            if connection.ended is not None or connection.ws.closed:
                connection.leaving.clear()
                return
            await _send_leave(connection, connection.leaving.pop(0))

    async def close(self) -> None:
        """Close the cable (the client is closing); a later wait would open it again."""
        await cancel_and_wait(self._opening)
        await cancel_and_wait(self._lingering)
        self._leave_asked = False
        if self._leave_bound is not None:
            self._leave_bound.cancel()
        await cancel_and_wait(self._leaving)
        self._opening = self._lingering = self._leaving = self._leave_bound = None
        connection, self._connection = self._connection, None
        if connection is not None:
            await self._shut(connection, SocketUnavailable("the client closed the cable"))

    # -- the connection ------------------------------------------------------------------------

    async def _open_connection(self) -> _Connection:
        if self._connection is not None and self._connection.ended is None:
            return self._connection
        if self._opening is None:
            # one opening for every wait that needs the cable now; a wait given up (cancelled)
            # does not cancel it for the others
            self._opening = asyncio.ensure_future(self._open())
            self._opening.add_done_callback(self._opened)
        return await asyncio.shield(self._opening)

    def _opened(self, opening: asyncio.Task[_Connection]) -> None:
        if self._opening is opening:
            self._opening = None
        if not opening.cancelled():
            opening.exception()  # retrieved: every wait that needed it has raised it already

    async def _open(self) -> _Connection:
        terminal = self._terminal
        try:
            token = await terminal.ws_token()
        except ServiceError as exc:
            raise SocketUnavailable(f"no WebSocket token: {exc}") from None
        url = f"{terminal.settings.websocket_base}/cable"
        handshake = terminal.settings.timeouts(CallKind.WEBSOCKET)
        started, outcome = time.monotonic(), "unreachable"
        ws: aiohttp.ClientWebSocketResponse | None = None
        try:
            async with asyncio.timeout(handshake.total):
                ws = await terminal.session.ws_connect(
                    url, params={"token": token}, protocols=PROTOCOLS, autoping=True,
                    heartbeat=None, timeout=aiohttp.ClientWSTimeout(ws_close=handshake.read),
                )  # fmt: skip
                connection = _Connection(ws)
                while (frame := await _receive(ws, STALE_AFTER)).get("type") != "welcome":
                    connection.dispatch(frame)  # a ping may come first; a disconnect ends it
            outcome = "ok"
        except SocketUnavailable:
            outcome = "error"
            raise
        except aiohttp.WSServerHandshakeError as exc:
            outcome = "error"
            raise SocketUnavailable(f"refused with HTTP {exc.status}") from None
        except RedirectRefused as exc:
            # not a passing fault: the address is wrong (or not the service's); poll this wait
            outcome = "error"
            _LOGGER.warning("the cable's handshake at %s: %s", url, exc)
            raise SocketUnavailable(f"handshake {exc}", retry=False) from None
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
            if outcome != "ok" and ws is not None:
                await ws.close()
        self.connects += 1
        connection.idle_since = self.clock.monotonic()
        connection.reader = asyncio.ensure_future(self._read(connection))
        self._connection = connection
        if self._lingering is None or self._lingering.done():
            self._lingering = asyncio.ensure_future(self._linger())
        return connection

    async def _read(self, connection: _Connection) -> None:
        """Dispatch the socket's frames until it ends; then every subscription hears why."""
        silence = _Silence(STALE_AFTER)
        try:
            while True:
                connection.dispatch(await _receive(connection.ws))
                silence.heard()
        except SocketUnavailable as exc:
            reason = exc
        except asyncio.CancelledError:
            if not silence.ended_it():
                connection.end(SocketUnavailable("the cable was closed"))
                raise
            reason = SocketUnavailable(f"no frame for {STALE_AFTER:g} s")
        except Exception as exc:  # never a silent death: the waits fall back, and say why
            _LOGGER.exception("the cable's reader failed")
            reason = SocketUnavailable(f"the cable's reader failed: {type(exc).__name__}")
        finally:
            silence.stop()
        connection.end(reason)
        if self._connection is connection:
            self._connection = None
        _LOGGER.debug("cable closed: %s", reason)
        with contextlib.suppress(aiohttp.ClientError, OSError):
            await connection.ws.close()

    async def _linger(self) -> None:
        """Close the cable once it has had no subscription for :attr:`linger` seconds."""
        while (connection := self._connection) is not None and connection.ended is None:
            if connection.subscriptions:
                await self.clock.sleep(self.linger)
                continue
            left = connection.idle_since + self.linger - self.clock.monotonic()
            if left > 0:
                await self.clock.sleep(left)
                continue
            self._connection = None
            await self._shut(connection, SocketUnavailable("idle: closed after its linger"))

    async def _shut(self, connection: _Connection, reason: SocketUnavailable) -> None:
        connection.end(reason)
        await cancel_and_wait(connection.reader)
        with contextlib.suppress(aiohttp.ClientError, OSError):
            await connection.ws.close()


class _Silence:
    """The open cable's bound on silence: one timer for the socket, moved on lazily. A bound
    around each frame's read armed and cancelled a timer per frame (two a sale); here a frame
    only notes when it came, and the timer, firing before the bound, is set for the rest. Past
    it, the reading task is cancelled (:meth:`ended_it` tells that cancel from any other)."""

    def __init__(self, after: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._reader = asyncio.current_task()
        self.after = after
        self.heard_at = self._loop.time()
        self._fired = False
        self._timer = self._loop.call_at(self.heard_at + after, self._check)

    def heard(self) -> None:
        self.heard_at = self._loop.time()

    def _check(self) -> None:
        due = self.heard_at + self.after
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._check)
            return
        self._fired = True
        if self._reader is not None:
            self._reader.cancel()

    def ended_it(self) -> bool:
        """The reader's cancel was this bound's (taken back), not its owner's."""
        return self._fired and self._reader is not None and self._reader.uncancel() == 0

    def stop(self) -> None:
        self._timer.cancel()


async def _send_leave(connection: _Connection, identifier: str) -> None:
    """The unsubscribe frame of one channel (a socket that fails it has left them all)."""
    with contextlib.suppress(aiohttp.ClientError, OSError):
        await connection.ws.send_str(_command("unsubscribe", identifier))


# JSON as json.dumps writes it (its defaults: ASCII, ", " and ": ") by its C string encoder,
# and read by its C scanner: one Python call each where json.dumps makes three (dumps, encode,
# iterencode) at each of a sale's channel identifier, subscribe and unsubscribe, and json.loads
# three (loads, decode, raw_decode) at each frame the cable reads
_quoted = json.encoder.encode_basestring_ascii
# json.scanner.make_scanner(a decoder of json.loads's defaults): the C scanner, (value, end)
# (set by the decoder's __init__; typeshed does not declare it)
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _command(command: str, identifier: str) -> str:
    """``json.dumps({"command": command, "identifier": identifier})``."""
    return f'{{"command": {_quoted(command)}, "identifier": {_quoted(identifier)}}}'


def _channel(interaction_id: str) -> str:
    """``json.dumps({"channel": f"terminal_job:{interaction_id}"})``."""
    return f'{{"channel": {_quoted("terminal_job:" + interaction_id)}}}'


def _loads(text: str) -> Any:
    """``json.loads(text)``: a frame as a server sends it (a value from its first character to
    its last) by the C scanner alone; anything else (spaces around it, extra data, no JSON) by
    json.loads itself, for its result or its error."""
    try:
        value, end = _scan(text, 0)
    except (StopIteration, ValueError):
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


async def _receive(ws: aiohttp.ClientWebSocketResponse, stale_after: float | None = None) -> Frame:
    """The socket's next frame as a JSON object; SocketUnavailable when it is not one, or when
    the socket ends or (with ``stale_after``) stays silent that many seconds."""
    try:
        message = await ws.receive(timeout=stale_after)
    except TimeoutError:
        raise SocketUnavailable(f"no frame for {stale_after:g} s") from None
    if message.type is not aiohttp.WSMsgType.TEXT:
        raise SocketUnavailable(f"socket {message.type.name.lower()}")
    try:
        frame = _loads(message.data)
    except json.JSONDecodeError:
        raise SocketUnavailable("a frame that is not JSON") from None
    if not isinstance(frame, dict):
        raise SocketUnavailable("a frame that is not a JSON object")
    return frame


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
        # the ActionCable channel identifier (JSON text, sent and matched verbatim)
        self.identifier = _channel(interaction_id)
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

    async def wait(self, timeout: float | None = None) -> Interaction:  # noqa: ASYNC109 (contract)
        """The interaction once it is no longer pending (or its lifetime is over).

        ``timeout`` (seconds) bounds the wait; past it, ``TimeoutError`` (the interaction goes on
        on the service's side: call ``wait`` again, or cancel it).
        """
        if self.last is not None and self.last.finished:
            return self.last
        if timeout is not None:
            try:
                async with asyncio.timeout(timeout):
                    return await self.wait()
            except TimeoutError:
                raise TimeoutError(
                    f"{self.kind.value} {self.interaction_id} still pending after {timeout} s"
                ) from None
        # bounded by the caller (a sale's card wait): no bound of its own, and the socket's
        # wait awaited here, not in a coroutine between: each wake-up of a card wait resumes
        # every coroutine it waits in (one frame fewer, two Python calls a sale)
        if self._terminal.settings.websocket:
            record = await self._wait_on_socket()
            if record is not None:
                return record
        return await self._poll()

    async def refresh(self) -> Interaction:
        """Ask the status endpoint now."""
        record = await self._terminal.get_interaction(
            self.device_id, self.kind, self.interaction_id
        )
        self._note(record)
        self.polls += 1
        return record

    # -- the wait ------------------------------------------------------------------------------

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
        cable = self._terminal.cable
        subscription = await cable.subscribe(self.identifier)
        self.socket_connects += 1
        try:
            loop = asyncio.get_running_loop()
            while True:
                # the lifetime is read afresh for every frame (the first record tells the real
                # one); read here, not in a coroutine of its own resumed at each frame
                if self._expiry <= loop.time():
                    raise _LifetimeOver
                frame = await subscription.next(self._expiry)
                try:
                    record = parse_interaction(
                        frame["message"], what="interaction over WebSocket",
                        asked=(self.interaction_id, self.kind),
                    )  # fmt: skip
                except InvalidResponseError as exc:
                    # the status endpoint decides instead (and names the field if bad too)
                    raise SocketUnavailable(str(exc), retry=False) from None
                self._note(record)
                if record.finished:
                    return record
        except SocketUnavailable:
            if subscription.confirmed and not subscription.heard:
                self.empty_sessions += 1
            raise
        finally:
            await cable.unsubscribe(subscription)

    def _note(self, record: Interaction) -> None:
        """Keep the latest record and learn the real lifetime from it."""
        self.last = record
        lifetime = self._terminal.real_lifetime(self._started, record)
        if lifetime is not None:
            grace = min(EXPIRY_GRACE, lifetime * 0.05)
            self._expiry = self._started + lifetime + grace
