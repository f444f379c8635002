"""The agent as the cashless device of a vending machine controller, through an MDB adapter.

``MdbCashless`` turns the adapter's lines (``mdb_protocol``) into sales: a vend request starts a
sale whose ``Dispenser`` approves (``C,VEND``) or denies (``C,STOP``) and then waits for the
controller's vend result. Two modes:

- selection first: the customer chooses, the controller asks for the price, the card pays it;
- card first: the agent keeps a sale waiting for a card for ``max_funds``; once authorized it opens
  a session (``C,START,<funds>``), the customer chooses, and only the chosen price is captured.

Anything that ends a session without a confirmed vend (cancel, controller reset or disable, the
adapter back before the vend was approved, no vend result in time) returns an outcome that is
not ``VENDED``, so the flow gives the money back. An adapter back mid-vend does not end the vend:
the controller may still say how it ended, on the new link (its setup waits until it is over).
Nor does a reader disabled mid-vend (the controller leaves MDB's vend state only by the vend's
result; a reset, ``INACTIVE``, does end it), nor a restart of the agent on the same boot
(recovery listens until the vend timeout, the setup held back meanwhile).

Out of service (``health.availability``): while the terminal cannot take cards the cashless slave
is off the bus (``C,0``), so the machine shows cashless unavailable and sells for cash; it joins
again (``C,1``) once the terminal is usable. A session in progress is never cut short: the
reader steps aside when it ends.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import field
from typing import Any

from kiosk_agent.config.load import schema_built_on_read
from kiosk_agent.data_class import data_class
from kiosk_agent.health.availability import follow_availability
from kiosk_agent.platforms import mdb_protocol as wire
from kiosk_agent.platforms import mdb_schema
from kiosk_agent.platforms.base import (
    DevicePlatform,
    Dispenser,
    LateVends,
    SaleStarter,
    instance_name,
    link_reporter,
    open_sales,
    request_cancel,
    start_sale,
)

# the schema is plain voluptuous, in a module of its own: checking a configuration loads none of
# this module (config.registry.platform_checks); re-exported, as a platform module provides it
from kiosk_agent.platforms.mdb_schema import ADDRESS as ADDRESS
from kiosk_agent.platforms.mdb_schema import NO_MAX_FUNDS as NO_MAX_FUNDS
from kiosk_agent.platforms.mdb_schema import Mode as Mode
from kiosk_agent.platforms.mdb_schema import check_modes as check_modes
from kiosk_agent.platforms.serial import (
    SerialLink,
    SerialSettings,
    StateHandler,
)
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sales.model import (
    DispenseOutcome,
    DispenseStatus,
    Flow,
    SaleRequest,
    Selection,
)
from kiosk_agent.tasks import FirstStep, TaskSet

_LOGGER = logging.getLogger(__name__)

# An adapter answers a probe well within this (seconds); a later status line is news of its own.
PROBE_ANSWER_WINDOW = 2.0


@data_class(slots=True)
class LinkFacts:
    """What the adapter link has said since it connected: facts of the link, kept beside the
    session's phase table, not in it (they outlive a session and come before one)."""

    controller: wire.ControllerStatus | None = None  # its last status line; None: none yet
    # the controller's own session is open: a vend request or IDLE since its last ENABLED
    controller_session_open: bool = False
    # what the adapter was last told: on the bus (C,1), off it (C,0); None: not told yet
    reader_enabled: bool | None = None


READER_SAYS = {True: "enabled", False: "disabled", None: "unknown"}  # status()["reader"]


@data_class(slots=True)
class MdbOptions:
    source: str = "mdb"
    mode: Mode = Mode.SELECTION_FIRST
    flow: Flow = Flow.AUTHORIZE_CAPTURE
    terminal: str | None = None
    address: int = ADDRESS
    unit: wire.AmountUnit = wire.AmountUnit.DOLLARS
    max_funds_cents: int = NO_MAX_FUNDS
    max_price_cents: int | None = None
    vend_timeout: float | None = None  # None: sales.vend_timeout
    session_timeout: float | None = None  # card first, None: sales.choice_timeout

    @classmethod
    def from_config(cls, config: dict[str, Any], source: str) -> MdbOptions:
        return cls(
            source=source,
            mode=Mode(config["mode"]),
            flow=Flow(config["flow"]),
            terminal=config.get("terminal"),
            address=config["address"],
            unit=wire.AmountUnit(config["amount_unit"]),
            max_funds_cents=config.get("max_funds", NO_MAX_FUNDS),
            max_price_cents=config["max_price"],
            vend_timeout=config.get("vend_timeout"),
            session_timeout=config.get("session_timeout"),
        )


@data_class(slots=True)
class MdbStats:
    vend_requests: int = 0
    sales_started: int = 0
    approved: int = 0
    denied: int = 0
    vended: int = 0
    vend_failed: int = 0
    cancelled: int = 0
    timeouts: int = 0
    unknown_lines: int = 0
    last_unknown: str = ""
    denied_out_of_service: int = 0  # vend requests that came while the reader was stepping aside
    disabled: int = 0  # times the reader left the bus (out of service)
    outcomes: Counter[str] = field(default_factory=Counter)  # dispense status -> count


class Phase(enum.StrEnum):
    """Where one cashless session is, as the machine sees it (``status()["session"]``)."""

    # selection first: the controller asked for it once the last customer was served, while
    # that sale still held the terminal; its sale starts when the terminal is released
    QUEUED = "queued"
    AUTHORIZING = "authorizing"  # the sale reads the card / authorizes; the machine waits
    SELECTING = "selecting"  # card first: the session is open, the customer chooses
    VENDING = "vending"  # approved: the machine vends and will report it
    ABORTED = "aborted"  # the controller ended the session before a vend; the sale is told
    ENDED = "ended"  # the dispense outcome is known


# Each phase's allowed next phases; every other move is refused by ``MdbSession.move_to``.
PHASES: Mapping[Phase, frozenset[Phase]] = {
    Phase.QUEUED: frozenset({Phase.AUTHORIZING, Phase.ENDED}),  # ended: dropped before its sale
    Phase.AUTHORIZING: frozenset({Phase.SELECTING, Phase.VENDING, Phase.ABORTED, Phase.ENDED}),
    Phase.SELECTING: frozenset({Phase.VENDING, Phase.ABORTED, Phase.ENDED}),
    Phase.VENDING: frozenset({Phase.ENDED}),  # an abort mid-vend ends it: not dispensed
    Phase.ABORTED: frozenset({Phase.ENDED}),
    Phase.ENDED: frozenset(),
}


class PhaseRefused(Exception):
    """A session move the table does not allow: it was not made."""

    def __init__(self, source: str, current: Phase, wanted: Phase) -> None:
        allowed = ", ".join(p.value for p in sorted(PHASES[current])) or "none: it has ended"
        super().__init__(
            f"{source}: MDB session {current.value} -> {wanted.value} refused (allowed: {allowed})"
        )
        self.current = current
        self.wanted = wanted


class MdbSession(Dispenser):
    """One customer's session on the machine; the sale runner's ``Dispenser`` for it.

    It reports what the controller says (a selection, a vend result, an abort) and tells the
    machine what the sale decided; the sale keeps the timers. Card first, the sale asks for the
    customer's choice (``choose``), bounded by its choice timeout (``session_timeout`` is this
    trigger's own), and decides on it."""

    def __init__(
        self, device: MdbCashless, request: SaleRequest, *, behind: MdbSession | None = None
    ) -> None:
        super().__init__(request)
        self.device = device
        # queued behind a session the machine is done with, whose sale still holds the terminal
        self.behind = behind
        self.phase = Phase.AUTHORIZING if behind is None else Phase.QUEUED
        self.began_at = device.link.now()  # the link's clock: probes are timed on it
        self.abort_reason = ""  # what the controller did, once ABORTED
        self.selection: asyncio.Future[wire.VendRequested] = (
            asyncio.get_running_loop().create_future()
        )

    def move_to(self, phase: Phase) -> None:
        """The one setter of the phase: a move the table does not allow is refused."""
        if phase not in PHASES[self.phase]:
            raise PhaseRefused(self.device.name, self.phase, phase)
        self.phase = phase

    # -- Dispenser ---------------------------------------------------------------------------

    async def choose(self, funds_cents: int) -> Selection | DispenseOutcome:
        """Card first: offer the funds (``C,START``) and report the customer's choice. No timer:
        the sale bounds the choice and denies (``C,STOP``) when nobody chose in time."""
        if self.ended:  # denied already: the first end is the outcome
            return self.result.result()
        if self.phase is Phase.ABORTED:
            return self.end(DispenseStatus.CANCELLED, self.abort_reason)
        self.move_to(Phase.SELECTING)
        self.device.send(wire.start_session(funds_cents, self.device.options.unit))
        choice = await asyncio.shield(self.selection)
        if self.aborted:  # the controller ended the session instead
            return self.end(DispenseStatus.CANCELLED, self.abort_reason)
        self.vend_cents, self.product = choice.amount_cents, choice.product
        return Selection(choice.product, choice.amount_cents)

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        """Approve the vend (selection first: the price asked; card first: the choice)."""
        if self.ended:  # denied already: the first end is the outcome, no vend out of turn
            return self.result.result()
        if self.phase is Phase.ABORTED:
            return self.end(DispenseStatus.CANCELLED, self.abort_reason)
        if self.device.options.mode is Mode.CARD_FIRST and self.phase is not Phase.SELECTING:
            return self.end(DispenseStatus.CANCELLED, "no session opened: nothing chosen")
        return await self._vend()

    async def deny(self, reason: str) -> None:
        if self.phase is Phase.ENDED:
            return
        if self.machine_waiting:
            self.device.stats.denied += 1
            self.device.send(wire.deny_vend())
            _LOGGER.info("%s: vend denied (%s)", self.device.options.source, reason)
        self.end(DispenseStatus.CANCELLED, f"denied: {reason}")

    @property
    def aborted(self) -> bool:
        return self.phase is Phase.ABORTED

    @property
    def machine_waiting(self) -> bool:
        """Whether the controller waits for our answer (else a C,STOP would be out of turn)."""
        if self.phase is Phase.ABORTED:
            return False  # the controller already ended this session
        if self.device.options.mode is Mode.CARD_FIRST:
            return self.phase is Phase.SELECTING  # before C,START the machine knows nothing
        return True

    # -- steps -------------------------------------------------------------------------------

    async def _vend(self) -> DispenseOutcome:
        self.move_to(Phase.VENDING)
        self.device.gave_up_on = None  # a result from now on is this vend's
        self.device.late.restart_sale = None
        self.device.stats.approved += 1
        if not self.device.send(wire.approve_vend(self.vend_cents, self.device.options.unit)):
            return self.end(DispenseStatus.CANCELLED, "adapter not connected: vend not approved")
        return await self.wait()

    # -- driven by the adapter's lines -------------------------------------------------------

    def on_selection(self, request: wire.VendRequested) -> bool:
        if self.phase is not Phase.SELECTING or self.selection.done():
            return False
        self.selection.set_result(request)
        return True

    def selected(self, request: wire.VendRequested) -> bool:
        """Whether ``request`` is this session's selection, already being served."""
        return (request.product, request.amount_cents) == (self.product, self.vend_cents)

    def on_vend_result(self, status: DispenseStatus, detail: str) -> bool:
        if self.phase is not Phase.VENDING:
            return False
        self.end(status, detail)
        return True

    def abort(self, reason: str) -> None:
        """The controller ended the session (reset, disable, cancel, lost adapter)."""
        if self.phase in (Phase.ENDED, Phase.ABORTED):
            return
        if self.phase is Phase.QUEUED:  # no sale yet: nothing to tell, nothing was sold
            self.end(DispenseStatus.CANCELLED, reason)
            return
        self.abort_reason = reason
        if self.phase is Phase.VENDING:  # approved (C,VEND sent): its result may still come
            self.end(DispenseStatus.CANCELLED, reason, unheard=True)
            return
        was = self.phase
        self.move_to(Phase.ABORTED)
        if was is Phase.AUTHORIZING:
            self.device.cancel_sale(self)
        elif not self.selection.done():
            self.selection.set_result(wire.VendRequested(0, ""))

    def ended_as(self, outcome: DispenseOutcome) -> None:
        never_sold = self.phase is Phase.QUEUED  # dropped before its sale: not an outcome
        vending = self.phase is Phase.VENDING
        # ended mid-vend with no result (the controller inactive or reset, the agent stopping):
        # the machine may still say the vend succeeded, as after the vend timeout
        unheard = vending and outcome.status is DispenseStatus.CANCELLED
        self.move_to(Phase.ENDED)
        if vending:
            self.device.vend_over()
        if never_sold:
            return
        self.device.stats.outcomes[outcome.status.value] += 1
        if outcome.status is DispenseStatus.TIMEOUT:
            self.device.stats.timeouts += 1
            self.device.gave_up_on = self  # the machine may still say how its vend ended
            self.device.late.gave_up(self)
        elif unheard:
            self.device.gave_up_on = self
            self.device.late.keep(self.sale_id, self.product)


class MdbCashless:
    """The cashless device: one adapter link, at most one session at a time."""

    def __init__(
        self,
        sales: SaleStarter,
        settings: SerialSettings,
        options: MdbOptions,
        *,
        on_link_state: StateHandler | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.sales = sales
        self.options = options
        self.name = options.source
        self.stats = MdbStats()
        self.facts = LinkFacts()  # the link's; the customer's session is its Phase
        self.session: MdbSession | None = None
        # the last session whose sale stopped waiting for the vend result (vend timeout)
        self.gave_up_on: MdbSession | None = None
        self.late = LateVends(self.name, sales)
        self._tasks = TaskSet()
        # What the agent tells the device (facts from outside, not a session's state): it is
        # stopping (the drain), and whether its terminal can take cards (health's availability).
        self._stopping = False
        # the link came back mid-vend: its setup (C,0, C,1) waits for the vend to end
        self._setup_after_vend = False
        self.available = True
        self.unavailable_reason = ""
        self.unfollow: Callable[[], None] | None = None
        self.link = SerialLink(
            options.source,
            settings,
            self.handle_line,
            on_state=on_link_state,
            on_connected=self._on_connected,
            clock=clock,
        )
        # a probe answered mid-sale ("c,STATUS,ENABLED") would read as the session's end
        self.link.busy = lambda: self.session is not None

    async def start(self) -> None:
        self._stopping = False
        await self.link.start()

    async def stop(self) -> None:
        self._stopping = True
        if self.unfollow is not None:
            self.unfollow()
        # A vend in flight was heard during the agent's drain (Agent.drain), which parked its
        # sale if the result had not come by the drain's end: nothing is waited for here.
        session = self.session
        if session is not None:
            waiting_for_card = session.phase is Phase.AUTHORIZING
            self._end_session("agent stopping")
            if waiting_for_card and session.sale_id is not None:
                # here, before the tasks are cancelled
                await request_cancel(self.sales, session.sale_id, self.name)
        await self._tasks.cancel_all()
        await self.link.stop()

    def status(self) -> dict[str, Any]:
        return {
            "link": self.link.status(),
            "controller": self.facts.controller.value if self.facts.controller else None,
            "mode": self.options.mode.value,
            # the machine's MDB session; a sale may go on after it (open_sales)
            "session": self.session.phase.value if self.session else None,
            "open_sales": open_sales(self.sales, self.name),
            "vend_requests": self.stats.vend_requests,
            "approved": self.stats.approved,
            "denied": self.stats.denied,
            "outcomes": dict(self.stats.outcomes),
            "unknown_lines": self.stats.unknown_lines,
            "available": self.available,
            "unavailable_reason": self.unavailable_reason,
            "reader": READER_SAYS[self.facts.reader_enabled],
            # out of service, but a sale is still on: the reader steps aside when it ends
            "steps_aside_after_sale": not self.available and self.facts.reader_enabled is True,
            "denied_out_of_service": self.stats.denied_out_of_service,
            **self.late.status(),
        }

    # -- out of service ------------------------------------------------------------------------

    def set_available(self, available: bool, reason: str = "") -> None:
        """The terminal can (or cannot) take cards: join or leave the bus, after any sale."""
        self.available, self.unavailable_reason = available, reason
        self._apply_availability()

    def _apply_availability(self) -> None:
        if self.session is not None or self._stopping:
            return  # never cut a sale short: _run_sale applies it when the sale ends
        if self.facts.reader_enabled is None or self.facts.reader_enabled == self.available:
            return  # not connected yet (setup sends the right state), or already so
        if self.available:
            if self.send(wire.enable_reader()):
                self.facts.reader_enabled = True
                _LOGGER.info("%s: back in service: reader enabled", self.name)
        else:
            if self.send(wire.disable_reader()):
                self.facts.reader_enabled = False
                self.stats.disabled += 1
                _LOGGER.warning(
                    "%s: out of service: reader disabled (%s)", self.name, self.unavailable_reason
                )

    def send(self, line: str) -> bool:
        return self.link.write_line(line)

    # -- lines from the adapter ----------------------------------------------------------------

    def handle_line(self, line: str) -> None:
        try:
            message = wire.parse_adapter_line(line, self.options.unit)
        except wire.ProtocolError as err:
            self.stats.unknown_lines += 1
            self.stats.last_unknown = line[:80]
            self.link.noise("ignored_line", "%s: ignored line: %s", self.name, err)
            return
        match message:
            case wire.StatusChanged():
                self._on_status(message)
            case wire.VendRequested():
                self._on_vend_request(message)
            case wire.VendSucceeded():
                self._on_vend_result(DispenseStatus.VENDED, "vend success")
            case wire.VendFailed():
                self._on_vend_result(DispenseStatus.FAILED, f"vend failed ({message.code})")
            case wire.AdapterError():
                self._on_adapter_error(message)
            case wire.Chatter():
                _LOGGER.debug("%s: %s", self.name, message.line)

    def _on_status(self, message: wire.StatusChanged) -> None:
        status = message.status
        previous, self.facts.controller = self.facts.controller, status
        session = self.session
        if (status is wire.ControllerStatus.DISABLED and session is not None
                and session.phase is Phase.VENDING):
            # MDB's vend state is left only by the vend's result (the controller sends no other
            # command in it), and a reader disable resets nothing: the controller may still
            # report this vend. Heard until the vend timeout, as a link back mid-vend is
            # (docs/platforms.md, the MDB notes); a reset (INACTIVE) still ends it.
            _LOGGER.warning("%s: controller disabled the reader mid-vend: still waiting for "
                            "the vend result", self.name)
            return
        if status in (wire.ControllerStatus.INACTIVE, wire.ControllerStatus.DISABLED):
            self.facts.controller_session_open = False
            _LOGGER.info("%s: controller %s", self.name, status.value)
            if session is not None:
                _LOGGER.warning("%s: controller %s mid-session", self.name, status.value)
                self._end_session(f"controller {status.value.lower()} mid-session")
            elif status is wire.ControllerStatus.INACTIVE:  # a reset ends a vend left in flight
                self.late.restart_result(DispenseStatus.CANCELLED, "controller inactive (reset)")
        elif status is wire.ControllerStatus.IDLE:
            self.facts.controller_session_open = True
        elif status is wire.ControllerStatus.ENABLED:
            if self._answers_probe(session):
                # the controller's resting state, from before the session: not its end
                _LOGGER.debug("%s: probe answered ENABLED as the session began", self.name)
                return
            if not self.facts.controller_session_open and previous is status:
                # Some controllers repeat ENABLED while nothing happens: not a session end.
                _LOGGER.debug("%s: controller enabled again (repeat)", self.name)
            elif self.facts.controller_session_open:
                # a session's end, after every customer: routine (the sale logs its own end at
                # INFO); a line at INFO per sale cost some 0.15 ms on the way to the next one
                _LOGGER.debug("%s: controller enabled (session over)", self.name)
            else:
                _LOGGER.info("%s: controller enabled", self.name)
            ended = self.facts.controller_session_open
            self.facts.controller_session_open = False
            if session is not None and ended:  # a queued selection's session is over too
                self._end_session("session ended by the controller")
            elif session is None:
                self._maybe_start_card_first()

    def _answers_probe(self, session: MdbSession | None) -> bool:
        """Whether a status line inside ``session`` is the answer to a probe that crossed its start.

        busy() keeps probes out of a session, but one sent just before the customer selected is
        answered inside it, with the controller's state from before: that answer ends nothing.
        """
        if session is None:
            return False
        return self.link.take_probe_answer(before=session.began_at, within=PROBE_ANSWER_WINDOW)

    def _on_vend_request(self, message: wire.VendRequested) -> None:
        self.stats.vend_requests += 1
        self.facts.controller_session_open = True
        session = self.session
        if session is None:
            # A controller asks for the next vend only once the last one is over: a vend the
            # last stop or crash left, which recovery still listens for, ended unheard (its
            # money goes back now, not at its deadline; as a session's lost result does below)
            self.late.restart_result(DispenseStatus.TIMEOUT,
                                     "no vend result before the next selection")
        if session is None and not self.available:
            # The controller asked before it heard us leave the bus: no sale can start now.
            # (a refusal summary: a controller that keeps asking must not flood the log)
            self.link.noise(
                "out_of_service",
                "%s: vend request for %s while out of service: denied (%s)",
                self.name,
                message.product,
                self.unavailable_reason,
            )
            self.stats.denied += 1
            self.stats.denied_out_of_service += 1
            self.send(wire.deny_vend())
            return
        if session is not None:
            if session.on_selection(message):
                return
            if session.selected(message) and self._answers_probe(session):
                # an adapter that answers a probe with its state repeats the pending selection
                _LOGGER.debug("%s: probe answered with the pending selection", self.name)
                return
            if session.phase is Phase.VENDING and self.options.mode is Mode.SELECTION_FIRST:
                # A controller asks for the next vend only once the last one is over: that
                # one's result was lost. Not dispensed, as at the vend timeout, only sooner.
                session.on_vend_result(
                    DispenseStatus.TIMEOUT, "no vend result before the next selection"
                )
            over = session.phase in (Phase.ENDED, Phase.ABORTED, Phase.QUEUED)
            if over and self.options.mode is Mode.SELECTION_FIRST:
                # The machine is done with the last customer (served, or gone: the controller
                # ended the session); that sale still holds the terminal (its card read being
                # cancelled, say). Next in line: started once the terminal is released. A
                # newer request replaces one already queued (that customer chose again).
                behind = session
                if session.phase is Phase.QUEUED and session.behind is not None:
                    behind = session.behind
                    session.abort("replaced by the next selection")
                self.session = MdbSession(self, self._selection_request(message), behind=behind)
                return
            self.link.noise(
                "vend_during_session",
                "%s: vend request for %s during a session (%s): denied",
                self.name,
                message.product,
                session.phase.value,
            )
            self.stats.denied += 1
            self.send(wire.deny_vend())
            return
        if self.options.mode is Mode.CARD_FIRST:
            self.link.noise(
                "vend_before_card",
                "%s: vend request before any card (card-first): denied",
                self.name,
            )
            self.stats.denied += 1
            self.send(wire.deny_vend())
            return
        self._begin_selection(message)

    def _begin_selection(self, message: wire.VendRequested) -> None:
        self._begin(MdbSession(self, self._selection_request(message)))

    def _selection_request(self, message: wire.VendRequested) -> SaleRequest:
        return SaleRequest(
            source=self.options.source,
            flow=self.options.flow,
            amount_cents=message.amount_cents,
            product=message.product,
            terminal=self.options.terminal,
            max_cents=self.options.max_price_cents,
            vend_timeout=self.options.vend_timeout,
        )

    def _on_vend_result(self, status: DispenseStatus, detail: str) -> None:
        if self.session is not None and self.session.on_vend_result(status, detail):
            return
        if self.session is None and self.late.restart_result(status, detail):
            return  # the vend the last stop or crash left: recovery listened for it
        # MDB names no sale in a result: a success now is the last given-up vend's, if any (a
        # vend the last stop or crash left, before any of this start's)
        late = self.gave_up_on
        late_sale = late.sale_id if late is not None else self.late.restart_sale
        if self.late.result(late_sale, status, detail):
            return  # its late success, or its failure (the maybe a person was told of closed)
        self.link.noise(
            "result_without_vend", "%s: %s with no vend pending: ignored", self.name, detail
        )

    def _on_adapter_error(self, message: wire.AdapterError) -> None:
        self.link.noise("adapter_error", "%s: adapter error %s", self.name, message.text)
        session = self.session
        if session is not None and session.phase is Phase.SELECTING:
            session.abort(f"adapter refused the session: {message.text}")

    async def _on_connected(self) -> None:
        self.facts = LinkFacts()  # a new connection: nothing heard on it yet
        session = self.session
        if session is not None and session.phase is Phase.VENDING:
            # The link came back mid-vend (a USB glitch): the controller may still be vending
            # and say how it ended on this link, and the setup's C,0 would end its session.
            # The vend keeps waiting (its vend timeout); the setup comes once it is over. A
            # controller that did lose the session says so (INACTIVE, a reset): that ends it.
            _LOGGER.warning("%s: adapter back mid-vend: still waiting for the vend result",
                            self.name)
            self._setup_after_vend = True
            return
        if session is not None:
            self._end_session("adapter reconnected")
        elif self.late.hold_until_restart_heard(self.vend_over):
            # The agent restarted mid-vend: the controller may still say how the vend the
            # last stop or crash left ended (recovery listens until its vend timeout), and the
            # setup's C,0 would end its session. The setup comes once recovery is done.
            _LOGGER.warning("%s: a vend was in flight at the last stop or crash: listening for "
                            "its result before the setup", self.name)
            self._setup_after_vend = True
            return
        self._setup()

    def _setup(self) -> None:
        self._setup_after_vend = False
        for line in wire.setup_commands(self.options.address, enable=self.available):
            self.send(line)
        self.facts.reader_enabled = self.available

    def vend_over(self) -> None:
        """A vend ended (its result, an abort, its vend timeout, or recovery done listening for
        the one the last stop or crash left): a setup the link's return held back is sent now,
        unless another customer's session is open (its C,0 would end that session: then it
        comes when that session is over, :meth:`_session_over`)."""
        session = self.session
        if session is not None and session.phase is not Phase.ENDED:
            return
        if self._setup_after_vend and self.link.connected and not self._stopping:
            self._setup()

    # -- sales -------------------------------------------------------------------------------

    def _maybe_start_card_first(self) -> None:
        if (
            self.options.mode is Mode.CARD_FIRST
            and self.session is None
            and not self._stopping
            and self.available
            and self.facts.controller is wire.ControllerStatus.ENABLED
        ):
            request = SaleRequest(
                source=self.options.source,
                flow=self.options.flow,
                amount_cents=self.options.max_funds_cents,
                terminal=self.options.terminal,
                max_cents=self.options.max_price_cents,
                vend_timeout=self.options.vend_timeout,
                chosen_at_machine=True,
                choice_timeout=self.options.session_timeout,
            )
            self._begin(MdbSession(self, request))

    def _begin(self, session: MdbSession) -> None:
        if session.phase is Phase.QUEUED:
            session.move_to(Phase.AUTHORIZING)
            session.behind = None  # the sale before it let the terminal go
        self.session = session
        # The sale starts here, in the turn that heard the customer (the runner journals it and
        # makes its task without a wait); a task of the line's own took a loop turn of the
        # customer's wait first. A starter that does wait goes on in the task below.
        starting = FirstStep(start_sale(self.sales, session.request, session))
        sale = starting.result() if starting.ended_well else None
        if sale is not None:
            self._started(session, sale)
            when_released = getattr(sale, "when_released", None)
            if callable(when_released):
                # what follows the sale starts at its release: no task, nor a step of one, in
                # the customer's window (the runner's Sale; a stand-in without it gets the task)
                when_released(lambda: self._follow_released(session, sale))
                return
        self._tasks.spawn(
            self._following(session, lambda: self._run_sale(session, starting)),
            name=f"{self.name}:sale",
        )

    def _started(self, session: MdbSession, sale: Any) -> None:
        self.stats.sales_started += 1
        session.sale_id = sale.sale_id
        if session.phase is Phase.ABORTED:  # while the card was read: cancel it now
            self.cancel_sale(session)

    def _follow_released(self, session: MdbSession, sale: Any) -> None:
        if self._stopping:  # stop() ended the session and the platform's tasks already
            self._session_over(session)
            return
        self._tasks.spawn(
            self._following(session, lambda: self._after_release(session, sale)),
            name=f"{self.name}:sale",
        )

    async def _run_sale(self, session: MdbSession, starting: FirstStep[Any]) -> None:
        was_done = starting.done
        sale = await starting
        if sale is None:
            return
        if not was_done:
            self._started(session, sale)
        # The terminal is free once the dispense outcome is known (the capture, or the money
        # given back, needs only the payments API): the next customer need not wait for it.
        await sale.terminal_released()
        await self._after_release(session, sale)

    async def _after_release(self, session: MdbSession, sale: Any) -> None:
        if not session.result.done():
            # Released by the sale's end without dispensing (declined, card error): the
            # machine must know before the next session opens.
            final = await sale.result()
            await session.deny(final.message or final.state.value)
        self._session_over(session)
        final = await sale.result()
        # DEBUG: the flow logs each sale's end once, at INFO (run logged every sale twice)
        _LOGGER.debug(
            "%s: sale %s %s (%s)", self.name, final.sale_id, final.state.value, final.message
        )

    async def _following(
        self, session: MdbSession, work: Callable[[], Coroutine[Any, Any, None]]
    ) -> None:
        """The platform's side of a sale, to its end: the session over, the next offer. ``work``
        is made here: a task cancelled before its first step leaves no coroutine unawaited."""
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except Exception:
            _LOGGER.exception("%s: sale task failed", self.name)
            await session.deny("internal error")
        finally:
            self._session_over(session)
            if self.options.mode is Mode.CARD_FIRST and not self._stopping:
                # the sale's pace: a terminal that keeps failing is asked ever more slowly
                await self.sales.pause_before_offer(self.name)
                self._maybe_start_card_first()

    def _session_over(self, session: MdbSession) -> None:
        """The machine and the terminal are done with ``session``'s customer: the selection
        queued behind it starts, and the reader steps aside if it was asked to (once)."""
        current = self.session
        if current is None or session not in (current, current.behind):
            return  # already over (the terminal was released before the sale ended)
        self.session = None
        if current is not session:  # queued behind it
            if self._stopping:
                current.abort("agent stopping")
            elif self.available:
                self._begin(current)
            else:
                current.abort("out of service")
                self.stats.denied += 1
                self.stats.denied_out_of_service += 1
                self.send(wire.deny_vend())
        if self.session is None:
            self.vend_over()  # a setup held back while this session was open
        self._apply_availability()  # the reader steps aside now if it was asked to

    def _end_session(self, reason: str) -> None:
        """The controller (or the agent) ended the machine's session: its sale is told; a
        selection still queued is dropped, and the sale before it keeps the terminal."""
        session = self.session
        if session is None:
            return
        if session.phase is Phase.QUEUED:
            session.abort(reason)
            self.session = session.behind
            return
        session.abort(reason)

    def cancel_sale(self, session: MdbSession) -> None:
        if session.sale_id is None or self._stopping:
            return  # not started yet: _run_sale cancels once it has the id; stop() cancels itself
        self._tasks.spawn(request_cancel(self.sales, session.sale_id, self.name))


class MdbPlatform(DevicePlatform[MdbCashless]):
    """The platform instance the agent keeps for a ``platform: mdb`` trigger."""


async def async_setup_platform(agent: Any, config: dict[str, Any]) -> MdbPlatform:
    source = instance_name(config, "mdb")
    device = MdbCashless(
        agent.sales,
        SerialSettings.from_config(config),
        MdbOptions.from_config(config, source),
        on_link_state=link_reporter(agent, source),
        clock=agent.clock,
    )
    device.unfollow = follow_availability(agent, config.get("terminal"), device.set_available)
    await device.start()
    return MdbPlatform(device)


__getattr__ = schema_built_on_read(__name__, lambda: mdb_schema.PLATFORM_SCHEMA)
