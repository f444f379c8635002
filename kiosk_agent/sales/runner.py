"""The sale runner: one sale at a time holds a terminal, each in the flow its trigger asked for.

A platform hands it a :class:`~kiosk_agent.sales.model.SaleRequest` and a dispenser; the runner
refuses at once what cannot start (a busy or unknown terminal, an amount that is no integer
above zero, a price above the trigger's ``max_price``), journals the new sale, and runs it.

A sale holds its terminal until what remains of it needs no terminal call
(``SaleFlow.release_terminal``: the dispense outcome is known and no receipt will be printed
there); the capture or the money given back then goes on while the next customer's sale
starts. The runner keeps knowing every live sale until it ends, released or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import sqlite3
import uuid
from collections.abc import Callable
from typing import Any

from kiosk_agent.data_class import data_class
from kiosk_agent.moments import display_clock
from kiosk_agent.money import format_cents
from kiosk_agent.sales.journal import JournalError, SaleMoved, SaleRecord
from kiosk_agent.sales.journal_records import HeldStep
from kiosk_agent.sales.late_vends import LateVendWatch
from kiosk_agent.sales.live import SaleFlow, outcome_detail
from kiosk_agent.sales.model import STOPPING as STOPPING  # re-exported: where callers look
from kiosk_agent.sales.model import AgentStopping as AgentStopping
from kiosk_agent.sales.model import (
    BadAmount,
    DispenseOutcome,
    Dispenser,
    DispenseStatus,
    Flow,
    PriceAboveMaximum,
    RecoveryHolds,
    SaleEvent,
    SaleRequest,
    TerminalBusy,
)
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.sales.steps import SaleContext, SaleSteps, event_of
from kiosk_agent.sales.unit import OwnUnit
from kiosk_agent.tasks import EagerStart

_LOGGER = logging.getLogger(__name__)

# each flow's live sale, imported once a trigger names it (`SaleRunner.prepare_flow`, at the
# agent's assembly) or a sale runs it: an agent whose triggers never name a flow does not load
# it (docs/architecture.md, "Idle memory: tenth round")
_FLOWS: dict[Flow, type[SaleFlow]] = {}


def flow_class(flow: Flow) -> type[SaleFlow]:
    """The live sale of ``flow``, its module imported on first use."""
    found = _FLOWS.get(flow)
    if found is not None:
        return found
    if flow is Flow.CHARGE_CARD:
        from kiosk_agent.sales.charge_card import ChargeCardFlow

        found = ChargeCardFlow
    elif flow is Flow.AUTHORIZE_CAPTURE:
        from kiosk_agent.sales.authorize_capture import AuthorizeCaptureFlow

        found = AuthorizeCaptureFlow
    elif flow is Flow.ENROLL:
        from kiosk_agent.sales.enroll import EnrollFlow

        found = EnrollFlow
    else:  # a flow added to the table of states without its live sale here
        raise ValueError(f"no live sale for flow {flow!r}")
    _FLOWS[flow] = found
    return found


# 13 digits in a row, or across the order id's dash (the unit id's last digits, then the sale
# part's first): what the log's safety net (redact.py) reads as a card number when they pass the
# Luhn check. A uuid4's hex holds such a run in some 4 % of draws and a tenth of those pass:
# about one sale in 250 was logged with its id masked, and a person grepping the log for it
# found none of its lines.
_CARD_LIKE = re.compile(r"\d(?:-?\d){12}")


def new_ids(unit: OwnUnit) -> tuple[str, str]:
    """A sale id and the order_id sent to the service, both made here, before any call; the
    order id carries the unit's id (sales/unit.py): whose charge it is, without the journal.
    Neither holds 13 digits in a row, a dash aside (drawn again: some 4 % of draws), so the log
    never masks them as a card number."""
    while True:
        sale_id = uuid.uuid4().hex
        order_id = unit.order_id(sale_id)
        if _CARD_LIKE.search(sale_id) is None and _CARD_LIKE.search(order_id) is None:
            return sale_id, order_id


@data_class(slots=True)
class Sale:
    """A running sale, as returned to the platform that started it."""

    sale_id: str
    order_id: str
    terminal: str
    task: asyncio.Task[SaleEvent]
    # set once the sale no longer holds its terminal (released, or ended)
    released: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    # called once, as ``released`` is set (when_released)
    _on_release: list[Callable[[], None]] = dataclasses.field(default_factory=list)

    def when_released(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the terminal is released (at once if it is), in the call that
        releases it: a platform that follows its sale past the release makes no task that waits
        meanwhile (one made in the customer's vend -> approve window, and a step of it)."""
        if self.released.is_set():
            callback()
        else:
            self._on_release.append(callback)

    def _released(self) -> None:
        self.released.set()
        callbacks, self._on_release = self._on_release, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # never a silent death, and never the release's own
                _LOGGER.exception("sale %s: work that waited for its release failed",
                                  self.sale_id)

    async def result(self) -> SaleEvent:
        """The final event of the sale."""
        return await asyncio.shield(self.task)

    async def terminal_released(self) -> None:
        """Until the terminal is free for the next sale: what remains of this one (a capture,
        money given back) needs only the payments API, or the sale has ended."""
        await self.released.wait()


@data_class(slots=True)
class RestartVend:
    """A vend the last stop or crash left in flight, while recovery listens for how it ended
    (this boot, until its deadline: sales/recovery.py): the one record of that hearing, read by
    recovery (its deadline, its price, health's line) and by the trigger's platform (whether to
    hold its setup back, where to say what the machine said)."""

    due: float  # the sale clock's monotonic time: the vend's approval plus its vend timeout
    cents: int  # the price the vend was approved for (asked, or chosen at the machine)
    terminal: str  # it takes no new sale meanwhile (recovery holds it; health says so)
    # what the machine said (restart_vend_heard), or None once recovery stops listening
    heard: asyncio.Future[DispenseOutcome | None]


@data_class(frozen=True, slots=True)
class RecoveryHold:
    """Recovery holds a terminal after a restart (a sale the last stop or crash left open that
    held it): new sales on it are refused until recovery lets it go. What every face says of
    it (health, the status page, ``kiosk-agent health``, Home Assistant, the kiosk API)."""

    terminal: str
    reason: str  # for people: what recovery does there, and until when when that is known
    # Unix time: the end of the vend timeout while recovery listens for a vend that sale left
    # in flight; None while it finishes an open sale's money (no deadline to tell). Read from
    # the deadline on the monotonic clock when the hold is read: a step of the wall clock (NTP
    # at boot) moves the time shown, never what is left (2026-11-30, i41-review-money)
    until: float | None
    left: float | None = None  # seconds until then, on the monotonic clock (Retry-After)


def restart_hearing_text(sale_id: str, until: float) -> str:
    """The words of a terminal held while recovery listens for a vend a restart left."""
    return (f"recovering: listening for the vend result of sale {sale_id[:8]}, left in flight "
            f"by the last stop or crash, until {display_clock(until)}")


class TriggerLimits:
    """Each trigger's ``max_price`` from its configuration, found by the ``source`` its
    requests carry (``platform:name``). A trigger configured without a name covers its
    platform's sources that no named trigger has (the platform names it by its own default)."""

    def __init__(self) -> None:
        self._named: dict[str, int] = {}  # "platform:name" -> cents
        self._unnamed: dict[str, int] = {}  # "platform" -> cents

    def add(self, platform: str, name: str | None, max_cents: int) -> None:
        # Two unnamed triggers of one platform (a copied trigger) send under one source: it
        # cannot be told which machine asks, so the lower bound holds for both.
        limits, key = (self._named, f"{platform}:{name}") if name else (self._unnamed, platform)
        limits[key] = min(max_cents, limits.get(key, max_cents))

    def of(self, source: str) -> int | None:
        """The most a request from ``source`` may ask for; None: no trigger of that name."""
        if source in self._named:
            return self._named[source]
        return self._unnamed.get(source.partition(":")[0])


class SaleRunner:
    """Starts sales, one at a time holding each terminal, and keeps track of them until they
    end (a released sale still captures or gives money back beside the next one)."""

    def __init__(self, context: SaleContext) -> None:
        self.context = context
        self.journal = context.journal
        self.settings = context.settings
        self._holding: dict[str, SaleFlow] = {}  # device_id -> the sale holding that terminal
        self._when_none_held: list[Callable[[], None]] = []  # when_no_terminal_held()
        self._live: dict[str, tuple[SaleFlow, Sale]] = {}  # sale_id -> every sale not ended
        # device_id -> who refuses its new sales (recovery, the unwritten sales) -> why
        self._blocked: dict[str, dict[str, str]] = {}
        # told when recovery takes or lets go of a terminal (the agent: health.problem_changed,
        # so every face hears it at once: recovery_hold)
        self.on_recovery_hold: Callable[[], None] | None = None
        self._stopping = False
        # the drain's end on the monotonic clock, once closed (stopping_until: as Unix time)
        self._stop_due: float | None = None
        self.limits = TriggerLimits()
        # card first, per trigger: offers in a row that got no authorization (the offer pace)
        self._unanswered: dict[str, int] = {}
        self._answered: set[str] = set()  # triggers whose last offer was authorized
        # products the machine reported after their sale gave up waiting: to a person
        self.late_vends = LateVendWatch(context.journal, context.clock)
        # trigger -> (sale id, product) of its sales the last stop or crash left dispensing,
        # oldest first (Recovery.start fills it before the triggers start)
        self._left_dispensing: dict[str, list[tuple[str, str | None]]] = {}
        # sale id -> a vend the last stop or crash left, while recovery listens for it
        # (Recovery.start: this boot, its vend timeout not passed): the trigger's platform holds
        # its setup meanwhile and says what the machine said (restart_vend_heard)
        self._restart_vends: dict[str, RestartVend] = {}
        self._vend_timeouts: dict[str, float] = {}  # "platform:name" or "platform" -> seconds
        # platforms whose machine starts anew with each agent (``virtual``): nothing of a vend
        # the last run left can be heard after a restart
        self._machine_starts_anew: set[str] = set()
        # the next sale's ids, made when a sale lets its terminal go (after its machine was
        # answered), for the unit (id, tag key) they were made for: not in a customer's window
        self._ids_ahead: tuple[str, str, str, str] | None = None

    def left_dispensing(self, source: str) -> list[tuple[str, str | None]]:
        """The sales of trigger ``source`` left dispensing by the last stop or crash (recovery
        gives their money back): a vend success the machine reports after this start is one of
        theirs, a late vend (platforms/base.py ``LateVends``)."""
        return list(self._left_dispensing.get(source, ()))

    def was_dispensing(self, record: SaleRecord) -> None:
        """Recovery found ``record`` left dispensing (:meth:`left_dispensing`)."""
        self._left_dispensing.setdefault(record.source, []).append(
            (record.sale_id, record.product))

    def trigger_vend_timeout(self, platform: str, name: str | None, seconds: float) -> None:
        """A trigger's own ``vend_timeout`` from its configuration (found as ``limits`` finds
        ``max_price``): how long recovery listens for a vend the last stop or crash left."""
        self._vend_timeouts[f"{platform}:{name}" if name else platform] = seconds

    def vend_timeout_of(self, source: str) -> float:
        """The vend timeout of trigger ``source``'s sales: its own, else ``sales.vend_timeout``."""
        own = self._vend_timeouts.get(source, self._vend_timeouts.get(source.partition(":")[0]))
        return self.settings.vend_timeout if own is None else own

    def machine_starts_anew(self, platform: str) -> None:
        """``platform``'s machine is made with the agent (the demo's simulated one): a vend the
        last run left dispensing ended with that run, and recovery does not listen for it."""
        self._machine_starts_anew.add(platform)

    def hears_after_restart(self, source: str) -> bool:
        """Whether trigger ``source``'s machine outlives the agent, so it may still say how a
        vend the last run left ended (:meth:`machine_starts_anew`)."""
        return source.partition(":")[0] not in self._machine_starts_anew

    def listen_after_restart(
        self, sale_id: str, *, due: float, cents: int, terminal: str
    ) -> RestartVend:
        """Recovery listens for how ``sale_id``'s vend ended (left dispensing by the last stop
        or crash) until ``due``: its future gets what the machine says
        (:meth:`restart_vend_heard`), or None once recovery stops listening
        (:meth:`stop_listening`)."""
        vend = RestartVend(due, cents, terminal, asyncio.get_running_loop().create_future())
        self._restart_vends[sale_id] = vend
        return vend

    def restart_vend(self, sale_id: str) -> RestartVend | None:
        """The vend of ``sale_id`` recovery listens for (heard already, or not yet); None once
        it stopped listening, or never did."""
        return self._restart_vends.get(sale_id)

    @property
    def restart_vends(self) -> dict[str, RestartVend]:
        """Every vend recovery still listens for, by sale id (health's line)."""
        return {sale_id: vend for sale_id, vend in self._restart_vends.items()
                if not vend.heard.done()}

    def listening_after_restart(
        self, sale_id: str | None
    ) -> asyncio.Future[DispenseOutcome | None] | None:
        """The future recovery listens on for ``sale_id``'s vend, while it does (a platform
        holds back the setup that would end the controller's session until it is done)."""
        vend = self._restart_vends.get(sale_id) if sale_id is not None else None
        return vend.heard if vend is not None and not vend.heard.done() else None

    def restart_vend_heard(self, sale_id: str, outcome: DispenseOutcome) -> bool:
        """The machine said how a vend the last stop or crash left ended, while recovery still
        listens: recovery settles the sale on it (captured, or given back), whenever it comes
        to that sale. False when nobody listens any more (then a success is a late vend:
        platforms/base.py ``LateVends``)."""
        future = self.listening_after_restart(sale_id)
        if future is None:
            return False
        future.set_result(outcome)
        return True

    def stop_listening(self, sale_id: str) -> bool:
        """Recovery is done listening for ``sale_id``'s vend (heard, or its deadline passed);
        whether it was listening."""
        vend = self._restart_vends.pop(sale_id, None)
        if vend is None:
            return False
        if not vend.heard.done():
            vend.heard.set_result(None)
        return True

    def late_vend(self, sale_id: str, product: str | None, source: str) -> None:
        """The machine reported ``sale_id``'s vend after the sale gave up waiting for it
        (platforms/base.py ``LateVends``): journaled on the sale and shown in health until a
        person acknowledges it (sales/late_vends.py). No money moves on it."""
        self.late_vends.heard(sale_id, product, source)

    def late_vend_failed(self, sale_id: str, source: str, why: str) -> None:
        """The machine said ``sale_id``'s vend failed after the sale gave up on it
        (platforms/base.py ``LateVends.failed``): the maybe a person was told of is closed on
        the sale (sales/late_vends.py ``LateVendWatch.not_vended``). No money moves on it."""
        self.late_vends.not_vended(sale_id, source, why)

    def prepare_flow(self, flow: Flow) -> None:
        """A trigger's flow from its configuration: its module is imported now, at the start,
        not in its first customer's window."""
        flow_class(flow)

    def limit_trigger(self, platform: str, name: str | None, max_cents: int) -> None:
        """A trigger's ``max_price`` from its configuration: every request it sends is held to
        it here, whatever its platform passes (or forgets to)."""
        self.limits.add(platform, name, max_cents)

    @property
    def stopping(self) -> bool:
        """Closed to new sales: the agent drains or has stopped."""
        return self._stopping

    def busy_reason(self, device_id: str) -> str | None:
        if self._stopping:
            return STOPPING
        blocked = self._blocked.get(device_id)
        if blocked:
            return next(iter(blocked.values()))
        flow = self._holding.get(device_id)
        if flow is not None:
            return f"sale {flow.record.sale_id} is {flow.record.state.value}"
        return None

    def recovery_hold(self, device_id: str) -> RecoveryHold | None:
        """How recovery holds ``device_id`` now (None: it does not): listening for a vend the
        last stop or crash left on it (until that vend's timeout), or finishing a sale left
        open on it. Read by health's snapshot and by a refused start (the kiosk API's 409)."""
        blocked = self._blocked.get(device_id)
        reason = blocked.get("recovery") if blocked else None
        if reason is None:
            return None
        listened = [(vend.due, sale_id) for sale_id, vend in self._restart_vends.items()
                    if vend.terminal == device_id and not vend.heard.done()]
        if listened:
            due, sale_id = max(listened)
            clock = self.context.clock
            left = max(0.0, due - clock.monotonic())
            until = clock.time() + left  # the wall clock's now, not the hearing's start's
            return RecoveryHold(device_id, restart_hearing_text(sale_id, until), until, left)
        sale = reason.removeprefix("recovering ")
        return RecoveryHold(device_id, f"recovering: finishing {sale}, left open by the last "
                            "stop or crash", None)

    def recovery_holds(self) -> dict[str, RecoveryHold]:
        """:meth:`recovery_hold` of every terminal recovery holds now (health's snapshot)."""
        return {device_id: hold for device_id in self._blocked
                if (hold := self.recovery_hold(device_id)) is not None}

    def _refusal(self, device_id: str, reason: str) -> TerminalBusy:
        """Why a start on a busy terminal is refused: recovery's hold says what it does and
        until when (a kiosk app shows "one moment"), any other as before."""
        blocked = self._blocked.get(device_id)
        hold = self.recovery_hold(device_id)
        if hold is None or blocked is None or reason != blocked.get("recovery"):
            return TerminalBusy(device_id, reason)
        return RecoveryHolds(device_id, hold.reason, hold.until, hold.left)

    def block(self, device_id: str, reason: str, by: str) -> None:
        """Refuse new sales on a terminal (``by`` recovery finishing an old sale on it, say)."""
        self._blocked.setdefault(device_id, {})[by] = reason
        if by == "recovery" and self.on_recovery_hold is not None:
            self.on_recovery_hold()

    def unblock(self, device_id: str, by: str) -> None:
        """``by`` no longer refuses the terminal's sales; another may still (each its own)."""
        blocked = self._blocked.get(device_id, {})
        held = blocked.pop(by, None) is not None
        if not blocked:
            self._blocked.pop(device_id, None)
        if held and by == "recovery" and self.on_recovery_hold is not None:
            self.on_recovery_hold()

    async def start(self, request: SaleRequest, dispenser: Dispenser) -> Sale:
        """Journal a new sale and start its flow; TerminalBusy at once if the terminal is taken."""
        device = self.settings.resolve_terminal(request.terminal)
        if self._stopping:
            raise AgentStopping(device, self.stopping_until, self.stopping_left)
        reason = self.busy_reason(device)
        if reason is not None:
            raise self._refusal(device, reason)
        if isinstance(request.amount_cents, bool) or not isinstance(request.amount_cents, int):
            raise TypeError(f"amount_cents must be integer cents, got {request.amount_cents!r}")
        if request.amount_cents <= 0:
            # enroll too: the terminal shows an amount while it reads the card
            raise BadAmount(f"a sale needs an amount above zero, got {request.amount_cents}")
        self._check_max_price(request)
        if request.chosen_at_machine and request.flow is not Flow.AUTHORIZE_CAPTURE:
            # charge_card would take the most the customer may choose, whatever was chosen
            raise ValueError(f"a choice at the machine needs flow authorize_capture (only the"
                             f" chosen price is captured), got {request.flow.value}")
        if not self.context.unit.confirmed:  # platforms step aside first (availability)
            raise TerminalBusy(device, self.context.unit.refusal())
        sale_id, order_id = self._new_ids()
        record = SaleRecord(
            sale_id=sale_id,
            order_id=order_id,
            source=request.source,
            flow=request.flow._value_,
            terminal=device,
            amount_cents=request.amount_cents,
            state=SaleState.STARTED,
            product=request.product,
            currency=self.settings.currency,
        )
        flow = flow_class(request.flow)(record, request, dispenser, self.context)
        flow.machine_outlives = self.hears_after_restart(request.source)
        opened: dict[str, Any] = {"source": request.source, "product": request.product}
        if request.flow is Flow.AUTHORIZE_CAPTURE and not request.product:
            # whether its dispense.request approves a vend, where nothing else in the journal
            # says (recovery.approved_by_request): card first, only the customer's choice does
            opened["chosen_at_machine"] = request.chosen_at_machine
        flow.open(opened)
        self._holding[device] = flow
        if not request.chosen_at_machine:  # a vend request: the customer waits from now on
            flow.customer_waits()
        # The sale's task runs its first step here, in this turn, once the runner keeps it: the
        # flow's first request (the read-card's) is handed to the HTTP client before start
        # returns, and on the wire a turn later; a task's first step a turn later took one more
        # turn of the customer's wait, behind whatever the loop had queued meanwhile.
        starting = EagerStart(self._run(device, flow), name=f"sale-{sale_id}")
        sale = Sale(sale_id, order_id, device, starting.task)
        self._live[sale_id] = (flow, sale)
        flow.on_release = lambda: self._release(device, sale_id)
        starting.first_step()
        return sale

    def _new_ids(self) -> tuple[str, str]:
        """A new sale's ids: those made ahead, if made for the unit as it is now (an adoption
        changes it in place), else made now (``new_ids``)."""
        unit, ahead = self.context.unit, self._ids_ahead
        self._ids_ahead = None
        if ahead is not None and ahead[0] == unit.id and ahead[1] == unit.key:
            return ahead[2], ahead[3]
        return new_ids(unit)

    def _make_ids_ahead(self) -> None:
        """The next sale's ids, made while nobody waits on them: a uuid, the order id's keyed
        tag and the log's card-number check were some 0.06 ms of the vend request's turn."""
        unit = self.context.unit
        if self._ids_ahead is None and unit.confirmed and not self._stopping:
            sale_id, order_id = new_ids(unit)
            self._ids_ahead = (unit.id, unit.key, sale_id, order_id)

    def _release(self, device: str, sale_id: str) -> None:
        """The sale needs its terminal no more: the next sale may start on it."""
        live = self._live.get(sale_id)
        if live is None:
            return  # ended already
        flow, sale = live
        if self._holding.get(device) is flow:
            del self._holding[device]
            if not self._holding:
                self._no_terminal_held()
        sale._released()
        self._make_ids_ahead()  # its machine is answered: the next customer's, before they come

    def when_no_terminal_held(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once no sale holds a terminal (at once if none does), in the call
        that releases the last one: work that can wait a moment (the cable's unsubscribe
        frames) then needs no task or loop turn while a customer waits for an answer. Wider than
        ``SaleContext.customers`` (sales/answers.py: a customer awaiting the machine's answer),
        which a capture and a due checkpoint wait on: a held terminal also covers a card-first
        offer's wait and a vend."""
        if not self._holding:
            callback()
        else:
            self._when_none_held.append(callback)

    def _no_terminal_held(self) -> None:
        callbacks, self._when_none_held = self._when_none_held, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # never a silent death, and never the release's own
                _LOGGER.exception("work that waited for no terminal to be held failed")

    def _check_max_price(self, request: SaleRequest) -> None:
        """The lower of the trigger's configured ``max_price`` and the request's own bound."""
        bounds = [b for b in (self.limits.of(request.source), request.max_cents) if b is not None]
        if bounds and request.amount_cents > min(bounds):
            raise PriceAboveMaximum(
                f"{format_cents(request.amount_cents)} is above this machine's max_price"
                f" {format_cents(min(bounds))}"
            )

    async def _run(self, device: str, flow: SaleFlow) -> SaleEvent:
        try:
            ended = await flow.run()
            if flow.maybe_told is not None:
                # the dispenser raised, or the vend timed out: the product may have gone out, its
                # money went back; the note was journaled with the dispense.result
                # (SaleFlow.not_dispensed): said in the log and told to health
                self.late_vends.noted(ended.sale_id, flow.maybe_told)
            return ended
        except asyncio.CancelledError:
            raise
        except Exception as err:
            keep = self.context.on_unwritten
            if isinstance(err, JournalError) and flow.unwritten is not None and keep is not None:
                return await _strand(flow, err, keep)
            if isinstance(err, SaleMoved):
                return await _as_the_journal_has_it(flow, err)
            # A bug must not leave money taken: reverse what was charged, else attention.
            _LOGGER.exception("sale %s: flow error", flow.record.sale_id)
            try:
                return await _rescue(flow, err)
            except SaleMoved as moved:
                return await _as_the_journal_has_it(flow, moved)
            except Exception:  # the journal itself fails: recovery finishes it on next start
                _LOGGER.exception("sale %s: cannot end the sale", flow.record.sale_id)
                return _not_written(flow, f"error: {err}; not journaled: the next start "
                                          "finishes it")
        finally:
            self._offer_ended(flow)
            flow.customer_answered()
            self._release(device, flow.record.sale_id)
            del self._live[flow.record.sale_id]

    async def pause_before_offer(self, source: str) -> None:
        """Card first: ``source`` keeps a sale waiting for a card; after one ends (or is refused
        at its start) it offers the next after this pause, on the sale's clock. A terminal that
        keeps failing (busy, offline) is asked ever more slowly (SaleSettings.offer_pause); an
        authorized offer sets the pace back."""
        if source in self._answered:
            self._answered.discard(source)
            self._unanswered[source] = 0
        unanswered = self._unanswered.get(source, 0)
        self._unanswered[source] = unanswered + 1
        await self.context.clock.sleep(self.settings.offer_pause(unanswered))

    def _offer_ended(self, flow: SaleFlow) -> None:
        if flow.request.chosen_at_machine and flow.record.authorized_cents > 0:
            self._answered.add(flow.request.source)

    async def cancel(self, sale_id: str) -> bool:
        """Ask a running sale to stop: before payment it ends CANCELLED, after it is reversed.

        False for a sale past the customer's part (its dispense outcome known: it only captures
        or gives the money back) or just ended (a receipt is being printed): nothing to stop."""
        live = self._live.get(sale_id)
        if live is None:
            return False
        flow, sale = live
        if flow.record.state.final or sale.released.is_set():
            return False
        flow.cancelled.set()
        flow.journal.record(flow.record, Step.CANCEL_REQUESTED)
        return True

    def idle(self) -> bool:
        """No sale is live: housekeeping may take the journal (the prune, in its thread: a
        dict's truth is read whole under the GIL, where listing it could see it change)."""
        return not self._live

    @property
    def running(self) -> list[SaleRecord]:
        """Every live sale, those holding a terminal and those only capturing or giving back."""
        return [flow.record for flow, _ in self._live.values()]

    def close(self, until: float | None = None) -> None:
        """Refuse every new sale from now on: the first thing a stop does. ``until``: when the
        drain ends (Unix time), told to whoever is refused; kept on the monotonic clock, so a
        step of the wall clock meanwhile moves no deadline (:attr:`stopping_left`)."""
        self._stopping = True
        self.context.customers.stop()  # the drain sends the waiting captures at once
        if until is not None:
            clock = self.context.clock
            self._stop_due = clock.monotonic() + (until - clock.time())

    @property
    def stopping_left(self) -> float | None:
        """Seconds until the drain's end on the monotonic clock (None: not closed with one)."""
        if self._stop_due is None:
            return None
        return max(0.0, self._stop_due - self.context.clock.monotonic())

    @property
    def stopping_until(self) -> float | None:
        """The drain's end as Unix time, read now from :attr:`stopping_left` (a kiosk app's
        ``until``; 2026-11-30, i41-review-money: fixed on the wall clock at the stop, so a step
        of the clock showed it hours off)."""
        left = self.stopping_left
        return None if left is None else self.context.clock.time() + left

    def cancel_unpaid(self) -> list[str]:
        """Ask every sale whose customer has not paid yet (still waiting for the card) to end:
        a stopping machine serves nobody new. A sale past the card goes on. The ids asked."""
        waiting = [
            sale_id for sale_id, (flow, _) in self._live.items()
            if flow.record.state in (SaleState.STARTED, SaleState.READING_CARD)
            and not flow.cancelled.is_set()
        ]  # fmt: skip
        return [sale_id for sale_id in waiting if self._ask_to_cancel(sale_id)]

    def _ask_to_cancel(self, sale_id: str) -> bool:
        live = self._live.get(sale_id)
        if live is None:
            return False
        flow, sale = live
        if flow.record.state.final or sale.released.is_set():
            return False
        flow.cancelled.set()
        flow.journal.record(flow.record, Step.CANCEL_REQUESTED)
        return True

    async def drain(self, seconds: float, interrupt: asyncio.Event | None = None) -> int:
        """Until every live sale has ended, ``seconds`` have passed on the sale clock, or
        ``interrupt`` is set (a second stopping signal): the sales keep running meanwhile, a
        dispense heard to its end. The number of sales still live."""
        clock = self.context.clock
        deadline = clock.monotonic() + seconds
        while self._live and not (interrupt is not None and interrupt.is_set()):
            left = deadline - clock.monotonic()
            if left <= 0:
                break
            waits: set[asyncio.Future[Any]] = {sale.task for _, sale in self._live.values()}
            stop = asyncio.ensure_future(interrupt.wait()) if interrupt is not None else None
            try:
                with contextlib.suppress(TimeoutError):
                    await clock.wait_for(
                        asyncio.wait(waits | ({stop} if stop else set()),
                                     return_when=asyncio.FIRST_COMPLETED),
                        left,
                    )
            finally:
                if stop is not None:
                    stop.cancel()
        return len(self._live)

    async def stop(self, grace: float | None = None) -> None:
        """Refuse new sales, let running ones finish (up to ``grace``, else ``stop_timeout``),
        then park the rest: each journals a ``parked`` step where it stands, and the next
        start's recovery finishes it."""
        self.close()
        wait = self.settings.stop_timeout if grace is None else grace
        if wait > 0:
            await self.drain(wait)
        tasks = [sale.task for _, sale in self._live.values()]  # the capturing ones too
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


# The machine's end held with a sale whose vend's approval could not be journaled (``_strand``):
# recovery reads it back to say what happened, not "interrupted" (a crash's words).
VEND_DENIED_UNWRITTEN = "denied: journal not writable"


async def _strand(
    flow: SaleFlow, err: JournalError, keep: Callable[[SaleSteps], None]
) -> SaleEvent:
    """A step could not be written: no further call is made for this sale until the journal
    holds it. The machine is told not to vend; the sale is handed to whoever keeps unwritten
    sales (it writes the sale once it can, then finishes it like recovery would)."""
    _LOGGER.error("sale %s: %s; kept in memory until the journal takes writes",
                  flow.record.sale_id, err)
    with contextlib.suppress(Exception):
        await flow._deny("journal not writable")
    if flow.unwritten is None:
        raise RuntimeError("a sale not journaled without its unwritten record")
    if flow.unwritten.state is SaleState.DISPENSING and not any(
        held.step is Step.DISPENSE_RESULT for held in flow.held
    ):
        # the step that failed (dispense.request, card first dispense.chosen) is journaled
        # before the vend it approves, so no vend of this sale was approved, and the machine
        # was just told no: its end is known. Held with the sale, so that the journal, once
        # back, does not read a vend left in flight (recovery told a person it "may have
        # dispensed": 2026-11-30, i42-newcomer, an MDB card-first sale on a full disk)
        denied = DispenseOutcome(DispenseStatus.CANCELLED, detail=VEND_DENIED_UNWRITTEN)
        flow.held = [*flow.held, HeldStep(Step.DISPENSE_RESULT, None, outcome_detail(denied))]
    why = f"not journaled yet ({err}); finished once the journal is back"
    flow.unwritten = dataclasses.replace(flow.unwritten, message=why)
    keep(flow)
    # published as what the journal holds, said not written (people and apps see it held)
    return _not_written(flow, why)


def _not_written(flow: SaleFlow, why: str) -> SaleEvent:
    """The event of a step that could not be written: its own kind (``SaleEvent.unwritten``),
    carrying the sale as the journal last took it, never a state the journal does not hold."""
    held = dataclasses.replace(flow.record, message=why)
    event = event_of(held, Step.JOURNAL_UNWRITTEN, clock=flow.clock)
    flow.publish_event(event)
    return event


async def _as_the_journal_has_it(flow: SaleFlow, moved: SaleMoved) -> SaleEvent:
    """Another writer (a tech's shell on the same file) decided the sale first: its decision
    stands, as recovery leaves it. No further call or vend for it; what is published (the page,
    the kiosk app, Home Assistant) is the journal's record, not this flow's guess."""
    _LOGGER.warning("sale %s: left as the journal has it: %s", flow.record.sale_id, moved)
    await flow._deny("the sale was decided elsewhere")  # a machine still waiting: no vend
    try:
        held = flow.journal.get(flow.record.sale_id)
        gone = "not in the journal any more"
    except (JournalError, sqlite3.Error) as err:  # failing now too: recovery reads it next start
        held, gone = None, f"the journal cannot be read ({err})"
    if held is None:  # nothing the journal holds to publish: said not written
        return _not_written(flow, f"{gone}: {moved}")
    flow.record = held
    event = event_of(held, clock=flow.clock)
    flow.publish_event(event)
    return event


async def _rescue(flow: SaleFlow, err: Exception) -> SaleEvent:
    record = flow.record
    if record.state.final:  # the sale had ended; what failed came after (and changes nothing)
        return event_of(record, clock=flow.clock)
    with contextlib.suppress(Exception):
        await flow._deny("internal error")
    if record.trans_id is not None and record.state in (
        SaleState.CHARGING,
        SaleState.AUTHORIZING,
        SaleState.DISPENSING,
    ):
        try:
            return await flow.reverse(f"internal error: {err}")
        except Exception:
            _LOGGER.exception("sale %s: reversing after an error failed", record.sale_id)
    state = (
        SaleState.FAILED
        if record.trans_id is None and record.state in (SaleState.STARTED, SaleState.READING_CARD)
        else SaleState.ATTENTION
    )
    return flow.finish(state, Step.ERROR, f"internal error: {type(err).__name__}: {err}")
