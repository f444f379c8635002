"""The terminal interface: card readers, their sessions, and card-present interactions.

``read_card`` and ``charge_card`` answer at once with an :class:`InteractionHandle`; its
``wait()`` follows the interaction on the client's one shared ActionCable WebSocket (see
``cable.py``). Starting an
interaction is never re-POSTed blindly: a lost 202 raises ``ServiceUnreachableError`` and the
caller reconciles (the charge-card ``order_id`` is made here for that).
"""

from __future__ import annotations

import functools
import logging
from typing import Any
from urllib.parse import quote

import aiohttp

from kiosk_agent.service.cable import Cable, InteractionHandle
from kiosk_agent.service.models.terminal import (
    Interaction,
    InteractionAccepted,
    InteractionKind,
    PingResult,
    Terminal,
    TerminalConnection,
    TerminalList,
    WsToken,
)
from kiosk_agent.service.parsing import parse_interaction, sent_back
from kiosk_agent.service.payments import new_order_id, require_cents
from kiosk_agent.service.settings import CallKind, ServiceSettings
from kiosk_agent.service.transport import Transport

_LOGGER = logging.getLogger(__name__)

_BASE = "/api/terminal"
# How far the service's interaction lifetime may be from the expected one before a warning.
LIFETIME_TOLERANCE = 0.1
# Interactions started this far apart (real seconds) tell the rate of the service's clock; a rate
# within CLOCK_RATE_TOLERANCE of 1 is real time (network jitter, not a time scale).
CLOCK_BASELINE_S = 2.0
CLOCK_RATE_TOLERANCE = 0.25


@functools.lru_cache(maxsize=64)  # a unit's few terminals: quoted once, not at each request
def _device(device_id: str) -> str:
    return f"{_BASE}/{quote(device_id, safe='')}"


class TerminalClient:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        # The interaction lifetime the caller plans with (the agent's sales.interaction_lifetime);
        # None: no check. lifetime_seen is the service's own, from its latest record.
        self.expected_lifetime: float | None = None
        self.lifetime_seen: float | None = None  # real seconds, once the service's clock is known
        self.clock_rate: float | None = None  # service seconds per real second (time scale)
        self._clock_base: tuple[float, float] | None = None  # (loop time, service Unix time)
        self._warned_lifetimes: set[float] = set()
        self.cable = Cable(self)  # every interaction's wait shares its one WebSocket

    async def close(self) -> None:
        """Close the cable (the service client is closing)."""
        await self.cable.close()

    @property
    def settings(self) -> ServiceSettings:
        return self._transport.settings

    @property
    def session(self) -> aiohttp.ClientSession:
        return self._transport.session

    def report_call(self, kind: CallKind, started: float, outcome: str) -> None:
        """A call made beside the transport (the cable handshake), for its observers."""
        self._transport.report_call(kind, started, outcome)

    def real_lifetime(self, started: float, record: Interaction) -> float | None:
        """How long ``record``'s interaction lives in real seconds, when that can be known.

        ``started``: the loop time its start was answered. A record's ``expires_at -
        created_at`` is in the service's clock, which a time-scaled simulator runs faster: the
        rate of that clock is learned from the ``created_at`` of interactions started at least
        :data:`CLOCK_BASELINE_S` apart. A lifetime unlike ``expected_lifetime`` is warned about,
        once per value (lifetimes within LIFETIME_TOLERANCE of each other are one value: the rate
        is measured, so it jitters) -- the agent's sales.interaction_lifetime set by hand for
        another service.
        """
        created, expires = record.created_at, record.expires_at
        if created is None or expires is None:
            return None
        lifetime = max(0.0, (expires - created).total_seconds())
        stamp = created.timestamp()
        if self._clock_base is None:
            self._clock_base = (started, stamp)
        elif started - self._clock_base[0] >= CLOCK_BASELINE_S:
            rate = (stamp - self._clock_base[1]) / (started - self._clock_base[0])
            if rate > 0:
                self.clock_rate = 1.0 if abs(rate - 1.0) <= CLOCK_RATE_TOLERANCE else rate
        if self.clock_rate is None:
            return lifetime  # the service's own word, until its clock is known
        real = lifetime / self.clock_rate
        self.lifetime_seen = real
        self._check_lifetime(real)
        return real

    def _check_lifetime(self, lifetime: float) -> None:
        expected = self.expected_lifetime
        if expected is None or abs(lifetime - expected) <= LIFETIME_TOLERANCE * expected:
            return
        # The rate is measured, so each record gives a slightly different real lifetime (3.59 s,
        # then 3.61 s): values within the tolerance of one already warned about are that value.
        if not any(
            abs(lifetime - warned) <= LIFETIME_TOLERANCE * warned
            for warned in self._warned_lifetimes
        ):
            self._warned_lifetimes.add(lifetime)
            _LOGGER.warning(
                "the service's terminal interactions live %.3g s (its clock runs %.3g times "
                "real time), but %.3g s is expected: set sales.interaction_lifetime to %.3g (a "
                "time-scaled simulator's READY line says it as interaction_lifetime_s)",
                lifetime, self.clock_rate, expected, lifetime,
            )  # fmt: skip

    async def list(self) -> list[Terminal]:
        """Every terminal with its capabilities (the authority on signature and printing)."""
        answer = await self._transport.request_model(
            TerminalList, "GET", _BASE, what="list terminals"
        )
        return answer.terminals

    async def connect(self, device_id: str) -> TerminalConnection:
        return await self._transport.request_model(
            TerminalConnection,
            "POST",
            f"{_device(device_id)}/connect",
            retry_safe=True,  # connecting a connected terminal changes nothing
            what=f"connect {device_id}",
        )

    async def disconnect(self, device_id: str) -> TerminalConnection:
        return await self._transport.request_model(
            TerminalConnection,
            "DELETE",
            f"{_device(device_id)}/disconnect",
            what=f"disconnect {device_id}",
        )

    async def ping(self, device_id: str) -> PingResult:
        return await self._transport.request_model(
            PingResult,
            "POST",
            f"{_device(device_id)}/ping",
            retry_safe=True,
            what=f"ping {device_id}",
        )

    async def read_card(
        self, device_id: str, amount: int, confirm_amount: bool = False
    ) -> InteractionHandle:
        """Ask the reader for a card; ``wait()`` gives its token (then charge it by payments)."""
        body = {"amount": require_cents(amount), "confirm_amount": confirm_amount}
        return await self._start(device_id, InteractionKind.READ_CARD, body, order_id=None)

    async def charge_card(
        self,
        device_id: str,
        amount: int,
        *,
        order_id: str | None = None,
        capture_signature: bool | None = None,
        print_receipt: bool | None = None,
        email: str | None = None,
    ) -> InteractionHandle:
        """Read, charge and optionally sign, print and mail in one interaction."""
        order_id = order_id or new_order_id()
        body: dict[str, Any] = {"amount": require_cents(amount), "order_id": order_id}
        for name, value in (
            ("capture_signature", capture_signature),
            ("print_receipt", print_receipt),
            ("email", email),
        ):
            if value is not None:
                body[name] = value
        return await self._start(device_id, InteractionKind.CHARGE_CARD, body, order_id=order_id)

    async def get_interaction(
        self, device_id: str, kind: InteractionKind | str, interaction_id: str
    ) -> Interaction:
        """The status endpoint: the final word on an interaction."""
        kind = InteractionKind(kind)
        what = f"{kind.value} {interaction_id} status"
        data = await self._transport.request(
            "GET",
            f"{_device(device_id)}/{kind.path}/{quote(interaction_id, safe='')}",
            what=what,
        )
        return parse_interaction(data, what=what, asked=(interaction_id, kind))

    async def cancel(self, device_id: str, interaction_id: str) -> Interaction | None:
        """Cancel a pending read-card (anything else: ``ConflictError`` not_cancellable).

        The cancelled record when the service sends it back.
        """
        what = f"cancel {interaction_id}"
        data = await self._transport.request(
            "DELETE", f"{_device(device_id)}/cancel/{quote(interaction_id, safe='')}", what=what
        )
        return parse_interaction(data, what=what) if sent_back(data, "interaction_id") else None

    async def print_receipt(self, device_id: str, trans_id: str, copies: int | None = None) -> Any:
        """Print on the reader; ``BadRequestError`` capability_unsupported when it cannot print."""
        body: dict[str, Any] = {"trans_id": trans_id}
        if copies is not None:
            body["copies"] = copies
        return await self._transport.request(
            "POST", f"{_device(device_id)}/print-receipt", json=body, what=f"print {trans_id}"
        )

    async def ws_token(self) -> str:
        """A fresh single-use WebSocket token (60 s)."""
        answer = await self._transport.request_model(
            WsToken, "POST", "/api/ws-token", retry_safe=True, what="WebSocket token"
        )
        return answer.token

    async def _start(
        self,
        device_id: str,
        kind: InteractionKind,
        body: dict[str, Any],
        *,
        order_id: str | None,
    ) -> InteractionHandle:
        accepted = await self._transport.request_model(
            InteractionAccepted,
            "POST",
            f"{_device(device_id)}/{kind.path}",
            json=body,
            retry_safe=False,  # a second POST would start a second interaction
            what=f"{kind._value_} on {device_id}",
        )
        return InteractionHandle(
            self,
            device_id=device_id,
            kind=kind,
            interaction_id=accepted.interaction_id,
            order_id=order_id,
        )

