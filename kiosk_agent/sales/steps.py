"""One sale's steps, shared by the live flows and by recovery: journal first, then act.

Every step is written to the journal (and published) *before* the call it announces, so after
any crash the journal says what might have happened; a lost answer is settled by asking
reporting by ``order_id`` until the money call's deadline, never by sending again; money goes
back (void or refund) whenever a dispense is not confirmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from kiosk_agent.bus import EventBus
from kiosk_agent.data_class import data_class, maker_from
from kiosk_agent.moments import display_clock
from kiosk_agent.money import format_cents
from kiosk_agent.redact import redact
from kiosk_agent.sales.answers import WaitingCustomers
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sales.deadlines import AnswerDeadlines
from kiosk_agent.sales.journal import HeldStep, Journal, JournalError, SaleMoved, SaleRecord
from kiosk_agent.sales.lost_reads import LostReads
from kiosk_agent.sales.model import (
    CAPTURED_NOTHING,
    REFUNDED_NOTHING,
    REST_REFUSED,
    Flow,
    SaleEvent,
)
from kiosk_agent.sales.settings import SaleSettings
from kiosk_agent.sales.states import REQUEST_STEPS, ReportingSteps, SaleState, Step
from kiosk_agent.sales.unit import OwnUnit
from kiosk_agent.service.errors import (
    OUTCOME_UNKNOWN,
    BadRequestError,
    InvalidResponseError,
    RateLimitedError,
    ServerError,
    ServiceError,
    ServiceUnreachableError,
)
from kiosk_agent.service.models import (
    ChargeResult,
    Interaction,
    InteractionKind,
    VoidOrRefundResult,
)
from kiosk_agent.service.trans_ids import trans_key

if TYPE_CHECKING:
    from kiosk_agent.sales.reconcile import ChargeLookup, Reconciler, TransactionLookup
    from kiosk_agent.service.client import ServiceClient


_LOGGER = logging.getLogger(__name__)
# what the machine hears when a money call's answer is lost: nothing vends until reporting says
UNCONFIRMED = "payment could not be confirmed"

T = TypeVar("T")

# a void or refund that may have worked: reporting is asked before a second try
_REVERSE_UNCLEAR: tuple[type[ServiceError], ...] = (BadRequestError, *OUTCOME_UNKNOWN)
_FOUND_CAPTURED = "captured (found in reporting)"
SWEEP_MONEY_RETRIES = 3  # money calls the attention sweeper may make for one sale, in all
RESOLVE = "`kiosk-agent sales resolve`"


def unknown_outcome(call: str, err: ServiceError) -> str:
    """A money call whose outcome is unknown, said as what happened: a 5xx is the service's
    answer, not an answer lost."""
    if isinstance(err, ServerError):
        return f"the service answered {err.status or '5xx'} to the {call} ({err})"
    if isinstance(err, InvalidResponseError):
        return f"the {call}'s answer could not be read ({err})"
    return f"the {call}'s answer was lost ({err})"


def agent_user(unit: OwnUnit) -> str:
    """The name the agent gives itself on each void and refund it sends (the service's
    ``user_identifier``, "user that initiated the activity"), so that a give-back found later
    in reporting tells the agent's from a person's: ``kiosk-agent <unit id>``."""
    return f"kiosk-agent {unit.id}"


def given_back_by(by: str | None, unit: OwnUnit) -> str:
    """Who gave money back, in a sale's words, as reporting names them (``user_identifier``
    of the refund's row, or of the voided row): `` by the agent`` when it names this unit's
    agent; another name quoted, said not the agent's; nothing named, said so and no more: the
    agent names itself on every give-back it sends, but a service that keeps no name on a
    voided row would name no one for the agent's own either. "" when reporting shows no such
    row."""
    if by is None:
        return ""
    if by == agent_user(unit):
        return " by the agent"
    shown = _person_named(by)
    if not shown:
        return ", reporting names no one who gave it back"
    return f" by {shown!r} (not the agent)"


def refund_of(by: str, unit: OwnUnit) -> str:
    """Whose one refund among several was, after its amount: `` (the agent's)``, `` ('jane')``,
    `` (no one named)``."""
    if by == agent_user(unit):
        return " (the agent's)"
    shown = _person_named(by)
    return f" ({shown!r})" if shown else " (no one named)"


def _person_named(by: str) -> str:
    """A name reporting gives who gave money back, as a sale's words show it: printable, at
    most 64 characters, redacted ("" when nothing of it is left)."""
    return redact("".join(c for c in by.strip() if c.isprintable())[:64])


def give_back_failed(err: ServiceError) -> str:
    """Why a void or refund gave nothing back that the agent knows of, as what happened: a
    429 is the service asking to wait and a 5xx its failure, a lost or unreadable answer no
    answer; only a 4xx that is not a 429 is the request refused."""
    call = "void or refund"
    if isinstance(err, RateLimitedError):
        wait = f", asking to wait {err.retry_after:g} s" if err.retry_after else ""
        return f"the service rate-limited the {call} (429{wait}): nothing was given back"
    if isinstance(err, OUTCOME_UNKNOWN):
        return unknown_outcome(call, err) + ", and reporting does not show it given back"
    return f"the service refused the {call} ({err})"


class Recheck:
    """When the attention sweeper next looks at the sales in attention (it says so before
    each wait): an attention message says when the agent acts again."""

    def __init__(self) -> None:
        self.next_at: float | None = None

    def when(self) -> str:
        if self.next_at is None:
            return "at its next look"
        return f"at {display_clock(self.next_at)}"


class NotOurs(Exception):
    """Money this unit cannot prove its own was about to be moved: refused, nothing sent."""

    def __init__(self, record: SaleRecord, unit: OwnUnit) -> None:
        super().__init__(f"sale {record.sale_id} (order id {record.order_id}) is not provably "
                         f"unit {unit.id}'s: its money is not moved")


@data_class(frozen=True, slots=True)
class SaleContext:
    """What every sale needs, whether it runs live or is recovered: one per agent."""

    service: ServiceClient
    journal: Journal
    events: EventBus[SaleEvent]
    settings: SaleSettings
    # whether a terminal prints receipts (from the service's terminal list)
    capabilities: Callable[[str], Awaitable[bool]] | None = None
    # every wait and deadline of every sale (tests give a FakeClock)
    clock: Clock = SYSTEM_CLOCK
    # a sale whose step could not be journaled: kept and finished once the journal takes writes
    on_unwritten: Callable[[SaleSteps], None] | None = None
    # whose money this agent may move (sales/unit.py): its id is in every order id it makes
    unit: OwnUnit = field(default_factory=OwnUnit.fresh)
    deadlines: AnswerDeadlines = field(init=False)
    # terminals a card read whose answer was lost may still hold (sales/lost_reads.py)
    lost_reads: LostReads = field(init=False)
    # when the attention sweeper looks next (sales/attention.py sets it)
    recheck: Recheck = field(init=False)
    # the sales whose customer waits for the machine's answer: a capture waits for them
    customers: WaitingCustomers = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "deadlines", AnswerDeadlines(self.clock))
        object.__setattr__(self, "lost_reads", LostReads(self.clock))
        object.__setattr__(self, "recheck", Recheck())
        object.__setattr__(self, "customers", WaitingCustomers(self.clock))


class CancelRequest(asyncio.Event):
    """A sale's cancel request: an :class:`asyncio.Event` that also calls back at once whoever
    listens (:meth:`when_set`), so that a wait a cancel may end needs no task of its own
    watching it (a task made and stopped on every card read, two loop turns, in the window
    between the vend request and the approve)."""

    def __init__(self) -> None:
        super().__init__()
        self._listeners: list[Callable[[], None]] = []

    def set(self) -> None:
        if self.is_set():
            return
        super().set()
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener()

    def when_set(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` once when the request is set (now, if it is); returns the way to
        stop listening."""
        if self.is_set():
            listener()
            return _nothing
        self._listeners.append(listener)

        def forget() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return forget


def _nothing() -> None:
    """Nothing to forget."""


class SaleSteps:
    """One sale's journal-then-act helpers, shared by the flows and by recovery."""

    def __init__(self, record: SaleRecord, context: SaleContext) -> None:
        self.record = record
        self.context = context
        self.service = context.service
        self.journal = context.journal
        self.events = context.events
        self.settings = context.settings
        self.clock = context.clock
        # The sale as the journal should hold it, once a step could not be written: that first
        # failed step applied (later steps made no call: each would have been written first).
        self.unwritten: SaleRecord | None = None
        # the steps that took it there, in order: Journal.restore replays them through the table
        self.held: list[HeldStep] = []
        # inside one_commit() (or durable_then_announced()): its steps so far
        self._batch: list[_Taken] | None = None
        # inside one_commit(): its steps' announcements, published after it
        self._held: list[_Announcement] | None = None
        # published at the loop's next turn (one_commit(announce_next_turn=True)); any later
        # event of the sale joins them, so its events stay in order
        self._next_turn: list[SaleEvent | _Announcement] | None = None
        self._announced: _Announcement | None = None  # the last step journaled
        # inside durable_then_announced(): the log lines of the sale's end, said once durable
        self._ends_held: list[Callable[[], None]] | None = None

    @property
    def device(self) -> str:
        return self.record.terminal

    @functools.cached_property
    def reconciler(self) -> Reconciler:
        """Reporting asked about this sale's charges: made, and its module imported, at the first
        lookup (a lost answer, an unclear give-back or capture, recovery, the attention sweep);
        a sale that hears its answers never asks."""
        from kiosk_agent.sales.reconcile import Reconciler

        return Reconciler(self.service, self.settings.mid)

    # -- journal and events ----------------------------------------------------------------------

    def step(
        self,
        name: Step,
        state: SaleState | None = None,
        message: str | None = None,
        detail: Mapping[str, Any] | None = None,
        **changes: Any,
    ) -> SaleRecord:
        """Journal one step (durably), then publish it."""
        if message is not None:
            changes["message"] = message
        # what memory keeps of it for Journal.restore, a HeldStep only once a write failed (a
        # frozen record's __init__ a step was 2 us of the vend window's Python, six times)
        taken: _Taken = (name, state, detail, changes)
        try:
            self.record = self.journal.record(self.record, name, state, detail, **changes)
        except JournalError:
            if self.unwritten is None:
                self.unwritten = dataclasses.replace(
                    self.record, state=state or self.record.state,
                    updated_at=self.clock.time(), **changes,
                )
                # a batch's writes roll back too
                self.held = _held_steps([*(self._batch or ()), taken])
            raise
        if self._batch is not None:
            self._batch.append(taken)
        self._announce(name)
        return self.record

    @property
    def announced(self) -> SaleEvent | None:
        """The event of the last step journaled (the one published, made once)."""
        announced = self._announced
        return None if announced is None else announced.event(self.clock)

    def _announce(self, name: Step) -> None:
        """Publish a journaled step; inside one_commit(), once the commit holds it. Its event is
        made when it is published (or asked for): a step published after its request is sent
        makes its event after the send, not in the customer's wait before it."""
        announced = self._announced = _Announcement(self.record, name)
        if self._held is not None:
            self._held.append(announced)
        else:
            self.publish_event(announced.event(self.clock))

    def one_commit(
        self, *, announce_next_turn: bool = False, announce_after_send: bool = False
    ) -> _OneCommit:
        """The steps inside are journaled in one commit (``Journal.batch``: synchronous code
        only), then published; for steps with nothing between them the journal must hold first.

        ``announce_next_turn``: published at the event loop's next turn instead, so that what
        the caller does next in this turn (the vend's line to the machine) goes first: the
        bus's listeners (health, metrics, Home Assistant, the streams) are nobody's wait.
        ``announce_after_send``: published two turns later, so that the request the caller
        hands the HTTP client next in this turn is on the wire first (aiohttp writes a body in a
        task of its own, a turn after it is handed over, on Python 3.11).
        """
        return _OneCommit(self, 2 if announce_after_send else 1 if announce_next_turn else 0)

    @contextlib.contextmanager
    def told_in_one_commit(
        self, told: Mapping[str, Any] | None, *, told_last: bool = False
    ) -> Iterator[None]:
        """The steps inside and ``told`` (a ``late.vend`` note: a vend that may have been made
        unheard) journaled in one commit, the note first (``told_last``: after them), so that
        no kill leaves the sale's give-back, or its end, without the note (2026-11-30: one
        killed after ``reverse.request`` was finished untold). No note: the steps alone, each
        its own commit, as without this."""
        if told is None:
            yield
            return
        with self.one_commit():
            if not told_last:
                self.step(Step.LATE_VEND, detail=told)
            yield
            if told_last:
                self.step(Step.LATE_VEND, detail=told)

    async def step_fsync_shared(
        self,
        name: Step,
        state: SaleState | None = None,
        message: str | None = None,
        detail: Mapping[str, Any] | None = None,
        **changes: Any,
    ) -> SaleRecord:
        """:meth:`step`, durable by the fsync of another sale's commit made in the same turn of
        the event loop, else by the journal's own at the next turn (``Journal.fsynced``); only
        then published, and its call made. Back to back, the confirmed vend's capture request
        and the next customer's sale are written in one turn: one fsync for both.

        A disk that fails that fsync fails the step as a failed commit does: not durable, so no
        call; the sale is kept as the journal should hold it and written again (the runner's
        unwritten sales), and the unit goes out of service."""
        return await self.durable_then_announced(
            lambda: self.step(name, state, message, detail, **changes)
        )

    async def durable_then_announced(
        self, write: Callable[[], T], meanwhile: Callable[[], Awaitable[None]] | None = None
    ) -> T:
        """``write``'s one step (synchronous) committed without an fsync of its own; then
        ``meanwhile`` awaited (a wait in which another sale's fsynced commit makes it durable
        for free), then :meth:`Journal.fsynced`; only then is it published, and a sale it ends
        logged. A kill before keeps it (the OS holds the WAL); a power cut loses it, as it
        would a write not made yet. A failed fsync fails it as :meth:`step_fsync_shared` says."""
        before = self.record
        self._held, self._batch, self._ends_held = [], [], []
        try:
            with self.journal.fsync_shared():
                written = write()
        finally:
            held, taken, ends = self._held, self._batch, self._ends_held
            self._held, self._batch, self._ends_held = None, None, None
        if meanwhile is not None:
            await meanwhile()
        try:
            await self.journal.fsynced()
        except JournalError:
            if self.unwritten is None:
                self.unwritten, self.record = self.record, before
                self.held = _held_steps(taken or ())
            raise
        for announced in held or ():
            self.publish_event(announced.event(self.clock))
        for log_end in ends or ():
            log_end()
        return written

    def publish(self, step: Step | Literal[""] = "") -> SaleEvent:
        event = event_of(self.record, step, clock=self.clock)
        self.publish_event(event)
        return event

    def publish_event(self, event: SaleEvent) -> None:
        """Publish one of the sale's events, after any of its own still waiting to be."""
        if self._next_turn is not None:  # behind the sale's events still to be published
            self._next_turn.append(event)
        else:
            self.events.publish(event)

    def step_next_turn(
        self,
        name: Step,
        state: SaleState | None = None,
        message: str | None = None,
        detail: Mapping[str, Any] | None = None,
        **changes: Any,
    ) -> SaleRecord:
        """:meth:`step`, its own commit, published at the loop's next turn (as
        ``one_commit(announce_next_turn=True)``): the vend's line the caller writes next in
        this turn goes first. Not inside :meth:`one_commit` (its steps are held for it)."""
        if self._held is not None:
            raise RuntimeError("step_next_turn inside one_commit: the batch holds its steps")
        self._held = []
        try:
            written = self.step(name, state, message, detail, **changes)
        finally:
            held, self._held = self._held, None
        self._publish_next_turn(held)
        return written

    def _publish_next_turn(self, events: list[_Announcement], turns: int = 1) -> None:
        """``events`` published ``turns`` (1 or 2) turns of the loop from now, with any of the
        sale's published meanwhile after them (in order); joining events already waiting, they
        go when those go. Each event is made then, not now."""
        if self._next_turn is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # the steps alone (bench/sale_steps.py): nothing sent meanwhile
                for announced in events:
                    self.events.publish(announced.event(self.clock))
                return
            self._next_turn = []
            if turns == 1:
                loop.call_soon(self._publish_waiting)
            else:  # a turn's hop first: what is queued in this turn (a body writer) goes before
                loop.call_soon(loop.call_soon, self._publish_waiting)
        self._next_turn.extend(events)

    def _publish_waiting(self) -> None:
        events, self._next_turn = self._next_turn or [], None
        for waiting in events:
            self.events.publish(
                waiting.event(self.clock) if isinstance(waiting, _Announcement) else waiting
            )

    def charge_found(
        self,
        name: Step,
        trans_id: str | None,
        cents: int | None,
        detail: Mapping[str, Any] | None = None,
        state: SaleState | None = None,
        refunded_before: int = 0,
    ) -> int:
        """Journal a charge that holds money: from its answer, or found after a lost one.

        A charge-card captures at once, an authorization only holds; an answer without an
        amount holds the sale's price. Returns the cents held. ``refunded_before``: of a charge
        found partly refunded, what was given back before the agent looked (journaled as given
        back: the sale holds the rest, and its give-back says both).
        """
        cents = self.record.amount_cents if cents is None else cents
        fields = self._charge_fields(trans_id, cents)
        if refunded_before:  # refunded: captured, whatever the flow asked
            fields.update(captured_cents=cents, reversed_cents=refunded_before)
        self.step(name, state, detail=detail, **fields)
        return cents - refunded_before

    def _charge_fields(self, trans_id: str | None, cents: int) -> dict[str, Any]:
        """The journal fields of a charge made: a charge-card captures at once."""
        held: dict[str, Any] = {"trans_id": trans_id, "authorized_cents": cents}
        if self.record.flow == Flow.CHARGE_CARD:
            held["captured_cents"] = cents
        return held

    async def found_given_back(
        self, name: Step, undecided: Step, lookup: ChargeLookup, why: str, **changes: Any
    ) -> SaleEvent:
        """End on a charge reporting shows already voided or refunded (a give-back the journal
        never heard of): the sale holds that charge and its give-back as the service does, so
        what people see says money was taken and given back, not "nothing charged". Its end is
        :meth:`given_back`'s: a void releases the whole hold (a voided row reading $0.00 too);
        a refund of $0.00 gave nothing back, and a person decides (``undecided``)."""
        if lookup.trans_id is None:
            event = self.finish(SaleState.REVERSED, name, why, **changes)
        else:
            back = await self.reconciler.transaction_state(lookup.trans_id)
            cents = lookup.amount_cents
            # the charge as it asked: reporting's figure, else (none, or a $0.00 row) the price
            held = cents or self.record.amount_cents
            changes.update(self._charge_fields(lookup.trans_id, held))
            event = self.given_back(
                name, undecided, why, back.reverse_trans_id or lookup.trans_id, cents,
                voided=not lookup.refunded, held=held, by=back.given_back_by, **changes,
            )
        await self._deny(why)
        return event

    def finish(
        self,
        state: SaleState,
        name: Step,
        message: str,
        detail: Mapping[str, Any] | None = None,
        **changes: Any,
    ) -> SaleEvent:
        self.step(name, state, message, detail, **changes)
        log = _LOGGER.warning if state is SaleState.ATTENTION else _LOGGER.info
        sale_id = self.record.sale_id
        if self._ends_held is not None:  # said once durable, with its announcement
            self._ends_held.append(lambda: log("sale %s %s: %s", sale_id, state, message))
        else:
            log("sale %s %s: %s", sale_id, state, message)  # a StrEnum: %s is its text
        ended = self.announced  # the end as published: one event, not a second made alike
        if ended is None:  # step() announced it, or raised
            raise RuntimeError("a sale ended without announcing its end")
        return ended

    async def _deny(self, reason: str) -> None:
        """Tell the machine not to vend; recovery has no machine to tell (SaleFlow does)."""

    async def _fail(self, state: SaleState, name: Step, message: str) -> SaleEvent:
        """End a sale in which no money stays taken, and tell the machine."""
        event = self.finish(state, name, message)
        await self._deny(message)
        return event

    async def settle_by_reporting(self, why: str, steps: ReportingSteps) -> SaleEvent:
        """Whether a charge was made is unknown (a lost answer, a crash): reporting decides.

        The machine is told not to vend first: whatever reporting says, nothing is dispensed on
        an unconfirmed payment. Then reporting is asked by order_id until the money call's
        deadline (``answer_by``, written when it was sent): a charge found is given back; "no
        charge" is believed only from a lookup sent once the service can no longer make one.
        Meanwhile the sale is UNRESOLVED. The deadline and every pause are on the monotonic
        clock: a wall-clock step neither shortens nor stretches the wait. ``steps`` names what is
        journaled (charge_card, authorize or recovery ``.waiting|unknown|found|reversed|none``);
        when reporting cannot say after the deadline, a person decides (ATTENTION; the attention
        sweeper keeps looking), nothing is guessed.
        """
        await self._deny(UNCONFIRMED)
        deadline = self.answer_deadline()
        pause = self.settings.lookup_pause(self.record.flow)
        clock = self.clock
        while True:
            asked = clock.monotonic()  # reporting may answer what it knew when asked, not later
            lookup = await self.reconciler.find_charge(self.record.all_order_ids())
            if lookup.approved:
                self.charge_found(steps.found, lookup.trans_id, lookup.amount_cents,
                                  refunded_before=lookup.refunded_before_cents)
                return await self.reverse(f"{why}; the charge was found in reporting, not vended")
            if lookup.reversed:
                return await self.found_given_back(
                    steps.reversed, steps.unknown, lookup, f"{why}; already given back"
                )
            if lookup.unknown and clock.monotonic() >= deadline:
                return self.finish(
                    SaleState.ATTENTION,
                    steps.unknown,
                    f"{why}; reporting cannot say whether money was taken: the agent asks "
                    f"again {self.context.recheck.when()} and gives back or keeps what it finds, "
                    f"else a person decides ({RESOLVE})",
                )
            if not lookup.unknown and asked >= deadline:
                # "no charge" counts only from a lookup sent after the deadline: a slow answer
                # to an earlier one may predate a charge the service made before the deadline
                return await self._fail(
                    SaleState.FAILED, steps.none, f"{why}; no charge was made"
                )
            if self.record.state is not SaleState.UNRESOLVED:
                self.step(
                    steps.waiting,
                    SaleState.UNRESOLVED,
                    f"{why}; no charge in reporting yet, looking again until the service can no "
                    "longer answer",
                    detail={"answer_in_s": round(max(0.0, deadline - clock.monotonic()), 3)},
                )
            await clock.sleep(min(pause, max(0.0, deadline - clock.monotonic())))

    async def money_call(self, call: Awaitable[T]) -> T:
        """A call that may move money, bounded as a whole (retries and 429 waits included) so
        that its journaled deadline holds; giving up is a lost answer, never a retry.

        The bound runs from the send its request step journaled (``sent_mono``), not from now:
        the deadline written with the intent counts from there (the commit, and a loop turn
        when the intent was journaled with the sale, come between)."""
        budget = self.settings.request_timeout
        if self.record.sent_mono is not None:
            budget -= max(0.0, self.clock.monotonic() - self.record.sent_mono)
        try:
            return await self.clock.wait_for(call, budget)
        except TimeoutError as err:
            raise ServiceUnreachableError(
                f"no answer within {self.settings.request_timeout:g} s; outcome unknown"
            ) from err

    def answer_deadline(self) -> float:
        """When the sale's last money call can no longer be answered, on the monotonic clock
        (re-anchored from what the journal kept with the call: see sales/deadlines.py)."""
        window = self.settings.answer_window(self.record.flow)
        return self.context.deadlines.due(self.record, window, self._last_send)

    def _last_send(self) -> float:
        # a journal written before answer_by existed: the last request step's time says
        sent = self.record.created_at
        for step in self.journal.steps(self.record.sale_id):
            if step.step in REQUEST_STEPS:
                sent = step.at
        return sent

    def sending(self) -> dict[str, Any]:
        """The journal fields of a money call sent now: its deadline and its anchor."""
        return self.context.deadlines.sent(self.settings.answer_window(self.record.flow))

    # -- waiting for a card ----------------------------------------------------------------------

    async def wait_interaction(
        self, handle: Any, kind: InteractionKind, cancelled: CancelRequest | None = None
    ) -> Interaction | None:
        """The interaction's final record; None when it could not be learned in time.

        A cancel request during a read-card cancels it on the terminal and waits for the end.
        """
        # The sale's own task waits for the card: its end wakes the flow in one loop turn (a
        # task of its own raced against the cancel by asyncio.wait took three, on the path from
        # the card to the vend). A cancel asks the terminal to end the read, which ends the wait:
        # the task that asks is made by the cancel itself, so a read nobody cancels makes none.
        asked = False  # the terminal was asked to cancel: that call is heard to its end
        canceller: asyncio.Task[None] | None = None

        async def cancel_read() -> None:
            nonlocal asked
            interaction_id = self.record.interaction_id
            if interaction_id:
                asked = True
                with contextlib.suppress(ServiceError):  # the read's own end decides
                    await self.service.terminal.cancel(self.device, interaction_id)

        def on_cancel() -> None:  # in the canceller's call: the terminal is asked a turn later
            nonlocal canceller
            canceller = asyncio.ensure_future(cancel_read())

        forget = (
            cancelled.when_set(on_cancel)
            if cancelled is not None and kind is InteractionKind.READ_CARD
            else None
        )
        try:
            interaction: Interaction = await self.clock.wait_for(
                handle.wait(), self.settings.card_wait
            )
            return interaction
        except (TimeoutError, ServiceError) as err:
            _LOGGER.info("sale %s: waiting for the card ended: %s", self.record.sale_id, err)
            return await self.interaction_status(kind)
        finally:
            if forget is not None:
                forget()
            if canceller is not None:
                # a read that ended first is not cancelled after it (nor a cancel cut short);
                # one never asked holds nothing: told to stop, not waited for
                if asked:
                    await canceller
                else:
                    canceller.cancel()

    async def interaction_status(self, kind: InteractionKind) -> Interaction | None:
        if self.record.interaction_id is None:
            return None
        try:
            return await self.service.terminal.get_interaction(
                self.device, kind, self.record.interaction_id
            )
        except ServiceError as err:
            _LOGGER.warning("sale %s: interaction status unknown: %s", self.record.sale_id, err)
            return None

    # -- money back ------------------------------------------------------------------------------

    async def reverse(self, why: str, told: Mapping[str, Any] | None = None) -> SaleEvent:
        """Give the money back (void, or refund once settled) and end the sale REVERSED.

        Written to the journal before the call; an error is checked against reporting before a
        second try, because voiding twice is refused and a lost answer may have worked.
        ``told``: a ``late.vend`` note (a vend that may have been made unheard: recovery's)
        journaled in the same commit as the decision (:meth:`told_in_one_commit`).
        """
        trans_id = self.record.trans_id
        if trans_id is None:
            unknown = (f"{why}; no trans_id: the agent looks for the charge in reporting "
                       f"{self.context.recheck.when()} and gives it back, else a person decides "
                       f"({RESOLVE})")
            with self.told_in_one_commit(told):
                return self.finish(SaleState.ATTENTION, Step.REVERSE_UNKNOWN, unknown)
        self.require_own()
        rest = self._rest_to_name()
        detail: dict[str, Any] = {"trans_id": trans_id}
        if rest is not None:
            detail["amount_cents"] = rest
        with self.told_in_one_commit(told, told_last=True):
            self.step(Step.REVERSE_REQUEST, SaleState.REVERSING, why, detail=detail)
        for attempt in (1, 2):
            try:
                result = await self.service.payments.void_or_refund(
                    trans_id, rest, user_identifier=agent_user(self.context.unit))
            except _REVERSE_UNCLEAR as err:
                lookup = await self.reconciler.transaction_state(trans_id)
                if rest is not None and isinstance(err, BadRequestError):
                    refused = self._rest_refused(why, trans_id, rest, err, lookup, attempt)
                    if refused is not None:
                        return refused
                if lookup.reversed:
                    return self.given_back_found(Step.REVERSE_DONE, Step.REVERSE_FAILED, why,
                                                 lookup, sent=True)
                if attempt == 2 or (isinstance(err, BadRequestError) and not lookup.known):
                    return self.finish(
                        SaleState.ATTENTION, Step.REVERSE_FAILED, self._not_given_back(why, err)
                    )
                continue
            except ServiceError as err:
                return self.finish(
                    SaleState.ATTENTION, Step.REVERSE_FAILED, self._not_given_back(why, err)
                )
            if self._gave_back_all(result, trans_id):
                return self._reversed(why, result.trans_id, result.amount, voided=result.voided)
            return await self._give_back_unclear(why, trans_id, result)
        raise AssertionError("unreachable")  # pragma: no cover

    def _rest_to_name(self) -> int | None:
        """The amount the give-back names: the rest of a charge partly refunded before (the
        interface leaves a missing amount after a partial refund unsaid; a service reading it
        as the original would refund more than the rest, or refuse). None for a charge nothing
        was given back of: the call gives back its whole, a void the whole hold, as proven."""
        if self.record.reversed_cents <= 0:
            return None
        return self._held_cents or None

    def _rest_refused(
        self, why: str, trans_id: str, rest: int, err: ServiceError, lookup: TransactionLookup,
        attempt: int,
    ) -> SaleEvent | None:
        """A 400 to the give-back naming the rest: the service would not give back that much
        (a person refunded meanwhile, say). Nothing more moves; a person decides, told what the
        agent asked and what reporting shows, in amounts. Reporting showing the charge given
        back whole, where an earlier give-back of the agent's may have made it (a second try,
        or one sent before a restart), is read as any give-back found (None), and so is a
        reporting that cannot say: only a charge still partly refunded proves none of the
        agent's was made (one made gave back all that was left)."""
        if (attempt > 1 or self._sent_before()) and not (
                lookup.partly_refunded and lookup.refunds_cents):
            return None
        charge = self.record.captured_cents or self.record.authorized_cents
        before = self.record.reversed_cents
        asked = (f"{REST_REFUSED} {format_cents(rest)}, the rest of the {format_cents(charge)} "
                 f"charge {trans_id} after {format_cents(before)} refunded before "
                 f"({give_back_failed(err)})")
        refunds = lookup.refunds_cents
        each = ", ".join(format_cents(c) for c in refunds)
        if lookup.reversed:
            unit = self.context.unit
            whose = [refund_of(by, unit) for by in lookup.refunds_by] if len(
                lookup.refunds_by) == len(refunds) else [""] * len(refunds)
            named = ", ".join(f"{format_cents(c)}{who}" for c, who in zip(refunds, whose,
                                                                         strict=True))
            none_ours = " (the agent's)" not in whose  # the journal says none was sent before
            found = (f"reporting shows it {'refunded' if lookup.refunded else 'voided'}"
                     + (f" by refunds of {named}"
                        + (", none of them the agent's" if none_ours else "")
                        if refunds else given_back_by(lookup.given_back_by, unit)))
        elif lookup.partly_refunded and refunds and lookup.amount_cents:
            found = (f"reporting shows {format_cents(sum(refunds))} of it refunded in all "
                     f"({each}), {format_cents(max(0, lookup.amount_cents - sum(refunds)))} "
                     "left on it")
        else:
            found = "reporting does not say what it holds now"
        return self.finish(
            SaleState.ATTENTION, Step.REVERSE_FAILED,
            f"{why}; {asked}; {found}: the agent moves no more money on it; a person decides "
            f"({RESOLVE})",
        )

    def _sent_before(self) -> bool:
        """Whether the sale's journal holds a give-back sent before this one's."""
        sent = [s for s in self.journal.steps(self.record.sale_id)
                if s.step == Step.REVERSE_REQUEST]
        return len(sent) > 1

    def _gave_back_all(self, result: VoidOrRefundResult, trans_id: str) -> bool:
        """Whether a 200 to the void says what was asked: approved, the whole hold given back,
        a void of this very transaction (a refund has a trans id of its own), of the sale's
        order and the unit's merchant."""
        voided_this = result.voided and trans_key(result.trans_id) == trans_key(trans_id)
        held = self._held_cents  # 0: a journal that never knew the amount takes the answer's
        return (result.result == "A" and (voided_this or result.refunded)
                and result.amount == (held or result.amount) and self._names_this_sale(result))

    def _names_this_sale(self, result: VoidOrRefundResult) -> bool:
        """Whether a give-back's answer is of this sale's charge: its order id one the sale
        sent and its merchant the unit's (an empty one names nothing). A refund has a trans id
        of its own, so these are all that tie it to the sale."""
        return result.order_id in ("", *self.record.all_order_ids()) and result.mid in (
            "", self.service.settings.mid)

    async def _give_back_unclear(
        self, why: str, trans_id: str, result: VoidOrRefundResult
    ) -> SaleEvent:
        """A 200 to the void that says something else (not approved, less given back, another
        transaction): the service may have given it all back, or nothing. Reporting decides;
        unproven, the sale is not called reversed while the money may still be held."""
        lookup = await self.reconciler.transaction_state(trans_id)
        if lookup.reversed:
            return self.given_back_found(Step.REVERSE_DONE, Step.REVERSE_FAILED, why, lookup,
                                         sent=True)
        answered = (f"{result.result} {result.resp_text}: {format_cents(result.amount)} "
                    f"of {result.trans_id}")
        return self.finish(
            SaleState.ATTENTION,
            Step.REVERSE_FAILED,
            f"{why}; the give-back was answered {answered}, and reporting does not show "
            f"{trans_id} given back; {format_cents(self._held_cents)} is still held: "
            f"{self._retried()}",
        )

    def _not_given_back(self, why: str, err: ServiceError) -> str:
        """A sale's words when its give-back failed: what happened, the money still held, and
        who gives it back when."""
        return (f"{why}; {give_back_failed(err)}; {format_cents(self._held_cents)} is still "
                f"held: {self._retried()}")

    def require_own(self) -> None:
        """The last guard before money moves: every caller picks only this unit's sales
        (sales/unit.py); one that did not is a bug, refused before anything is written."""
        if not self.context.unit.owns_sale(self.record.order_id):
            raise NotOurs(self.record, self.context.unit)
    def _retried(self) -> str:
        """Who acts next on a sale left in attention, and when."""
        return (f"the agent tries again {self.context.recheck.when()} to give it back (up to "
                f"{SWEEP_MONEY_RETRIES} times), then a person decides ({RESOLVE})")

    @property
    def _held_cents(self) -> int:
        """What the sale's charge still holds: all of it, or the rest of one found partly
        refunded (its refunds before the agent looked are journaled as given back)."""
        held = self.record.captured_cents or self.record.authorized_cents
        return max(0, held - self.record.reversed_cents)

    def _reversed(
        self, why: str, reverse_trans_id: str | None, cents: int | None, voided: bool = True
    ) -> SaleEvent:
        return self.given_back(Step.REVERSE_DONE, Step.REVERSE_FAILED, why, reverse_trans_id,
                               cents, voided)

    def given_back_found(
        self, done: Step, undecided: Step, why: str, lookup: TransactionLookup,
        sent: bool = False, **changes: Any,
    ) -> SaleEvent:
        """The end of a sale whose charge reporting shows given back: the charge's row names
        the charge's whole amount, of which the agent gave back what was not refunded before
        (journaled with the charge: see :meth:`charge_found`). A void of it (reporting shows
        the charge voided, its row the whole amount) released the rest too, never more
        (2026-11-30: read as the whole charge on top of the part refunded before). ``sent``:
        the agent's give-back was sent in this call, and a refund by it ended the charge's."""
        cents = lookup.amount_cents
        before = self.record.reversed_cents
        refunds = lookup.refunds_cents
        if (lookup.refunded and (before or sent) and cents and len(refunds) > 1
                and sum(refunds) == cents):
            # the service's own rows, whole: the latest refund ended the charge's refunds (the
            # agent's), the others were a person's before it, some maybe while the agent's was
            # on its way (2026-11-30: said as the journal had them when it looked)
            held = refunds[-1]
            return self.given_back(done, undecided, why, lookup.reverse_trans_id, held,
                                   voided=False, held=held, before=cents - held,
                                   by=lookup.given_back_by, **changes)
        if cents is not None and before:
            cents = max(0, cents - before)
        return self.given_back(done, undecided, why, lookup.reverse_trans_id, cents,
                               voided=not lookup.refunded, by=lookup.given_back_by,
                               whose=None if before else self._each_refunds_maker(lookup),
                               **changes)

    def _each_refunds_maker(self, lookup: TransactionLookup) -> str | None:
        """Who made each refund, where reporting shows the charge refunded by several whose
        rows name different makers: `` by refunds of $1.00 ('jane'), $2.00 (the agent's)``, so
        that the latest's maker is not said for all of them (2026-11-30, i41-review-money: "$3.00
        refunded by the agent", $1.00 of it a person's). None where one maker (or none) is named
        for them all: said as one (:func:`given_back_by`)."""
        refunds, makers = lookup.refunds_cents, lookup.refunds_by
        if not lookup.refunded or len(refunds) < 2 or len(makers) != len(refunds) or len(
                set(makers)) < 2:
            return None
        unit = self.context.unit
        return " by refunds of " + ", ".join(
            f"{format_cents(c)}{refund_of(by, unit)}" for c, by in zip(refunds, makers,
                                                                      strict=True))

    def given_back(
        self, done: Step, undecided: Step, why: str, reverse_trans_id: str | None,
        cents: int | None, voided: bool, held: int | None = None, before: int | None = None,
        by: str | None = None, whose: str | None = None, **changes: Any,
    ) -> SaleEvent:
        """The end of a sale whose give-back an answer or reporting shows made, for ``cents``
        (None: no figure named, the money held). A void releases the whole hold: a voided row
        reporting shows as $0.00 still gave back all the sale held, said so. A refund of $0.00
        gives nothing back: the agent cannot tell the money went back and refunds nothing
        again on its own; a person decides (``undecided``), told what reporting shows.
        ``held``: the money the charge held, where the journal does not hold it yet (a charge
        found given back). ``before``: what had been refunded before the agent's give-back,
        where reporting's rows say it otherwise than the journal (with ``held``, the rest).
        ``by``: who gave it back, as reporting names them (a give-back found there, not one
        the agent heard answered): said beside the amount (:func:`given_back_by`); ``whose``,
        where given, said instead (each of several refunds' makers)."""
        if before is None:
            before = 0 if held is not None else self.record.reversed_cents
        held = self._held_cents if held is None else held
        if cents == 0 and not voided:
            return self.finish(
                SaleState.ATTENTION, undecided,
                refunded_nothing(why, changes.get("trans_id", self.record.trans_id), held),
                **changes,
            )
        if cents is None or (cents == 0 and voided):
            amount = held
            shown = "" if cents is None else (
                f" (a void releases the whole hold; reporting shows {format_cents(0)} on the "
                "voided row)")
        else:
            amount, shown = cents, ""
        how = ("voided" if voided else "refunded") + (
            given_back_by(by, self.context.unit) if whose is None else whose)
        if not voided and not self.record.captured_cents and "captured_cents" not in changes:
            # a refund gives back a capture: the charge was taken, whatever the flow asked
            # (2026-11-30: a charge found refunded read "$3.00 hold released", captured 0,
            # where the service held it settled and refunded)
            changes["captured_cents"] = before + held
        if before:  # a charge found partly refunded: the agent gave back the rest
            shown += (f", the rest of the {format_cents(before + held)} charge: "
                      f"{format_cents(before)} of it had been refunded before")
        return self.finish(
            SaleState.REVERSED,
            done,
            f"{why}; {format_cents(amount)} {how}{shown}",
            reverse_trans_id=reverse_trans_id,
            reversed_cents=before + amount,
            **changes,
        )

    def named(self, chosen: object) -> dict[str, Any]:
        """The journal fields of the product a card-first machine names only with the
        customer's choice (the sale takes it, vended or not): a session someone chose in is a
        sale on every face (sales.kinds)."""
        return {"product": str(chosen)[:100]} if chosen and not self.record.product else {}

    async def capture(self, cents: int, vend: Mapping[str, Any] | None = None) -> SaleEvent:
        """Capture the vended amount of an authorization (journaled first, reconciled on error).

        The confirmed vend is on disk as early as before; the capture itself is back-office work:
        sent once no other customer waits for their machine's answer, a second at most
        (sales/answers.py). A kill in that wait leaves CAPTURING for recovery to settle. Its
        completion shares another commit's fsync (:meth:`durable_then_announced`)."""
        trans_id = self.record.trans_id
        if trans_id is None:
            raise RuntimeError(f"sale {self.record.sale_id}: a capture without a transaction id")
        self.require_own()
        named = self.named((vend or {}).get("product"))
        await self.step_fsync_shared(
            Step.CAPTURE_REQUEST,
            SaleState.CAPTURING,
            detail={"trans_id": trans_id, "cents": cents, **(vend or {})},
            vended_cents=cents,
            **named,
        )
        customers = self.context.customers
        await customers.none_waiting()
        try:
            result = await self.service.payments.capture(trans_id, amount=cents)
        except ServiceError as err:
            return await self._capture_unclear(trans_id, cents, err)
        if not _completes(result, cents):  # checked in reporting or attention: own fsync
            await customers.none_waiting()
            return await self._capture_answered(result, cents)
        # its completion is back-office work too: committed in this turn without an fsync of
        # its own (a customer waiting meanwhile fsyncs it with their next commit), announced
        # and logged once no customer waits and it is durable. A kill meanwhile keeps it; a
        # power cut leaves CAPTURING, and recovery finds the capture in reporting
        return await self.durable_then_announced(
            lambda: self._captured(result, cents), customers.none_waiting
        )

    async def _capture_unclear(self, trans_id: str, cents: int, err: ServiceError) -> SaleEvent:
        """The capture answered an error: reporting says whether it went through (a lost answer
        may have worked); an authorization still open after a server error is captured again."""
        lookup = await self.reconciler.transaction_state(trans_id)
        if lookup.captured:
            return self.found_captured(lookup.amount_cents, cents)
        if not (isinstance(err, (ServerError, ServiceUnreachableError)) and lookup.authorized):
            return self.finish(
                SaleState.ATTENTION,
                Step.CAPTURE_FAILED,
                f"dispensed, but the capture failed ({err}); the agent asks reporting again "
                f"{self.context.recheck.when()} and captures the authorization if it still "
                f"holds, else a person decides ({RESOLVE})",
            )
        try:
            result = await self.service.payments.capture(trans_id, amount=cents)
        except ServiceError as again:
            lookup = await self.reconciler.transaction_state(trans_id)
            if lookup.captured:
                return self.found_captured(lookup.amount_cents, cents)
            return self.finish(
                SaleState.ATTENTION,
                Step.CAPTURE_FAILED,
                f"dispensed, but the capture failed twice ({again}); the agent retries the "
                f"capture {self.context.recheck.when()} (up to {SWEEP_MONEY_RETRIES} times), "
                f"then a person ({RESOLVE})",
            )
        return await self._capture_answered(result, cents)

    async def _capture_answered(self, result: ChargeResult, cents: int) -> SaleEvent:
        """A capture's answer that says less than was asked (declined, or fewer cents taken) is
        checked in reporting first: a capture the service made is what every face shows, not
        the answer's figure (the customer paid what reporting holds)."""
        trans_id = self.record.trans_id
        if trans_id is None or (result.approved and _taken(result, cents) >= cents):
            return self._captured(result, cents)
        lookup = await self.reconciler.transaction_state(trans_id)
        if lookup.captured:
            return self.found_captured(lookup.amount_cents, cents)
        return self._captured(result, cents)

    def _captured(self, result: ChargeResult, cents: int) -> SaleEvent:
        if not result.approved:
            return self.finish(
                SaleState.ATTENTION,
                Step.CAPTURE_REFUSED,
                f"dispensed, but the capture answered {result.result}: {result.resp_text}; the "
                f"agent asks reporting again {self.context.recheck.when()}, then a person "
                f"({RESOLVE})",
            )
        taken = _taken(result, cents)
        if not taken:  # an approval of nothing: no capture to call paid, as a refusal
            return self.finish(
                SaleState.ATTENTION,
                Step.CAPTURE_REFUSED,
                f"dispensed, but the capture answered approved for {format_cents(0)} and "
                f"reporting shows none; the agent asks reporting again "
                f"{self.context.recheck.when()}, then a person ({RESOLVE})",
            )
        if taken > cents:
            return self.captured_above("the capture answered", taken, cents)
        return self._completed(taken, "captured")

    def found_captured(self, taken: int | None, cents: int) -> SaleEvent:
        """The end of a sale whose capture of ``cents`` reporting shows made: paid what it
        took, unless that is nothing or above what was asked. ``taken`` None is reporting
        naming no amount (the capture as asked); 0 is a figure: nothing taken."""
        if taken == 0:
            return self.captured_nothing(cents, Step.CAPTURE_REFUSED)
        taken = cents if taken is None else taken
        if taken > cents:
            return self.captured_above("reporting shows captured", taken, cents)
        return self._completed(taken, _FOUND_CAPTURED)

    def captured_nothing(self, cents: int, name: Step) -> SaleEvent:
        """Reporting shows the capture of a dispensed product made for $0.00: not paid, not
        a figure missing either; the agent asks reporting again, then a person decides (it
        never captures a second time on its own)."""
        return self.finish(
            SaleState.ATTENTION,
            name,
            nothing_captured(cents, self.context.recheck.when()),
            captured_cents=0,
        )

    def captured_above(self, who: str, taken: int, cents: int) -> SaleEvent:
        """The service took more than the capture asked (a wrong unit, its fault): not a sale
        to call paid, whoever says so (its answer or reporting); held for a person."""
        return self.finish(
            SaleState.ATTENTION,
            Step.CAPTURE_ABOVE,
            f"dispensed, but {who} {format_cents(taken)} for the {format_cents(cents)} asked;"
            f" a person decides ({RESOLVE})",
            captured_cents=taken,
        )

    def _completed(self, cents: int, how: str) -> SaleEvent:
        return self.finish(
            SaleState.COMPLETED,
            Step.COMPLETED,
            f"paid {format_cents(cents)} ({how})",
            captured_cents=cents,
        )


def refunded_nothing(why: str, trans_id: str | None, held: int) -> str:
    """The words of a sale whose refund reporting shows made for $0.00."""
    return (f"{why}; reporting shows {trans_id} {REFUNDED_NOTHING}: a refund of "
            f"nothing gives nothing back, so the {format_cents(held)} may still be held; the "
            f"agent refunds nothing again on its own: a person decides ({RESOLVE})")


def nothing_captured(cents: int, when: str) -> str:
    """The words of a dispensed sale whose capture reporting shows made for $0.00."""
    return (f"dispensed, but {CAPTURED_NOTHING} for the "
            f"{format_cents(cents)} asked: the product went out unpaid; the agent asks "
            f"reporting again {when}, then a person decides ({RESOLVE})")


def _completes(result: ChargeResult, cents: int) -> bool:
    """Whether a capture's answer completes the sale as it stands: approved, for the amount
    asked (fewer cents are checked in reporting first: ``SaleSteps._capture_answered``)."""
    return result.approved and _taken(result, cents) == cents


def _taken(result: ChargeResult, cents: int) -> int:
    """The cents a capture's answer says it took: those asked when it names none; a 0 it names
    is 0 (nothing taken), not a missing figure."""
    return cents if result.amount is None else result.amount


# a step as SaleSteps.step took it: its name, state, detail and changes (HeldStep's fields)
_Taken = tuple[Step, SaleState | None, Mapping[str, Any] | None, dict[str, Any]]


def _held_steps(taken: Iterable[_Taken]) -> list[HeldStep]:
    """The steps memory holds for Journal.restore, once their write failed."""
    return [HeldStep(*step) for step in taken]


class _OneCommit:
    """:meth:`SaleSteps.one_commit` while its ``with`` runs: a class, not a generator context
    manager (contextlib's helper, its ``__enter__`` and ``__exit__`` and two generator
    resumptions around each of the vend window's three commits)."""

    __slots__ = ("_batch", "_before", "_steps", "_turns")

    def __init__(self, steps: SaleSteps, turns: int) -> None:
        self._steps = steps
        self._turns = turns  # 0: published at the commit; 1 or 2: that many turns later

    def __enter__(self) -> None:
        steps = self._steps
        steps._held, steps._batch = [], []
        self._before = steps.record
        self._batch = steps.journal.batch()
        try:
            self._batch.__enter__()
        except BaseException as err:
            self._ended(err)
            raise

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: object
    ) -> None:
        try:
            self._batch.__exit__(kind, err, tb)  # commits, or rolls back what raised
        except BaseException as failed:  # the commit failed
            self._ended(failed)
            raise
        if err is not None:  # raised inside: it goes on
            self._ended(err)
            return
        steps = self._steps
        held = steps._held or []
        steps._held, steps._batch = None, None
        if self._turns:
            steps._publish_next_turn(held, self._turns)
            return
        for announced in held:
            steps.publish_event(announced.event(steps.clock))

    def _ended(self, err: BaseException) -> None:
        """Nothing of the batch is on disk: a failed write keeps the sale in memory. A sale
        another writer moved is found at the batch's end (``Journal.batch``), after its steps
        were taken in memory: the sale is again as the journal last took it (as when its first
        step raised), theirs to decide, nothing kept to write again."""
        steps = self._steps
        if isinstance(err, JournalError):
            if steps.unwritten is None:
                steps.unwritten = steps.record  # the commit failed: memory holds every step
                steps.held = _held_steps(steps._batch or ())
            steps.record = self._before  # what the journal holds: the batch rolled back whole
        elif isinstance(err, SaleMoved):
            steps.record = self._before
        steps._held, steps._batch = None, None


class _Announcement:
    """A journaled step to publish, its event made once, when first asked for: inside
    ``one_commit(announce_after_send=True)`` that is two turns later, after the request the
    steps lead to is on the wire (two events a vend window's commit, some 3 us each, were made
    before the read-card and the charge were handed over). The record is frozen: the event made
    later is the one made at the step."""

    __slots__ = ("_event", "record", "step")

    def __init__(self, record: SaleRecord, step: Step) -> None:
        self.record, self.step = record, step
        self._event: SaleEvent | None = None

    def event(self, clock: Clock) -> SaleEvent:
        event = self._event
        if event is None:
            event = self._event = event_of(self.record, self.step, clock=clock)
        return event


def event_of(record: SaleRecord, step: Step | Literal[""] = "", *, clock: Clock) -> SaleEvent:
    """The event of a journaled record, dated by its last write (else by ``clock`` now)."""
    return _event_from(record, record.updated_at or clock.time(), step)


# every field but the date and the step read off the record (a frozen __init__ with keywords
# was a quarter of a step's Python: 7.4 us an event against 2.7)
_event_from = maker_from(
    SaleEvent,
    [f.name for f in dataclasses.fields(SaleEvent) if f.name not in ("at", "step")],
    ("at", "step"),
)
