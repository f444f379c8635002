"""The sale flows: small explicit state machines, the same code for every platform.

Every flow follows one rule: write the step to the journal, *then* make the call the step
announces. So after any crash the journal says what might have happened, and recovery (or the
flow itself, after a lost answer) finds out what did by ``order_id`` before anything is sent
again. Money only stays taken when the dispenser confirmed the goods came out; anything else
ends with a void or a refund, and the sale says so.

``charge_card``        CHARGING -> (A) DISPENSING -> COMPLETED | REVERSING -> REVERSED
                       (B: ask again up to ``retries``; C: DECLINED; fault/expiry: FAILED)
``authorize_capture``  READING_CARD -> AUTHORIZING -> DISPENSING -> CAPTURING -> COMPLETED
                       (vend failed, cancelled or timed out: REVERSING -> REVERSED)
``enroll``             READING_CARD -> ENROLLING -> COMPLETED
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from kiosk_agent.bus import EventBus
from kiosk_agent.money import cents_to_decimal, format_cents, parse_price
from kiosk_agent.sales.journal import Journal, JournalError, SaleRecord
from kiosk_agent.sales.model import (
    RECEIPT_STEP,
    DispenseOutcome,
    Dispenser,
    DispenseStatus,
    Flow,
    PriceAboveMaximum,
    SaleEvent,
    SaleRequest,
)
from kiosk_agent.sales.receipts import ReceiptSettings, send_receipts
from kiosk_agent.sales.reconcile import Reconciler
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.errors import (
    BadRequestError,
    ConflictError,
    ServerError,
    ServiceError,
    ServiceUnreachableError,
)
from kiosk_agent.service.models import (
    ChargeRequest,
    ChargeResult,
    ChargeResultCode,
    Interaction,
    InteractionKind,
    InteractionStatus,
    VaultAccountRequest,
)

if TYPE_CHECKING:
    from kiosk_agent.service.client import ServiceClient

_LOGGER = logging.getLogger(__name__)

T = TypeVar("T")

_FOUND_CAPTURED = "captured (found in reporting)"

# A read-card or charge-card interaction lives this long on the service (choices.md).
INTERACTION_LIFETIME = 180.0


class TerminalBusy(Exception):
    """A trigger arrived for a terminal that is already taking a sale; refused at once."""

    def __init__(self, terminal: str, reason: str) -> None:
        self.terminal = terminal
        self.reason = reason
        super().__init__(f"terminal {terminal} is busy: {reason}")


class UnknownTerminal(ValueError):
    """A sale named a terminal the configuration does not have."""


@dataclass(frozen=True, slots=True)
class SaleSettings:
    """How the flows behave; from the ``sales``, ``receipts`` and ``terminals`` sections."""

    mid: str
    terminals: Mapping[str, str]  # device_id -> name
    retries: int = 2
    card_timeout: float = 200.0
    vend_timeout: float = 60.0
    currency: str = "USD"
    # the service's clock: a simulator with a time scale shortens the interaction lifetime
    interaction_lifetime: float = INTERACTION_LIFETIME
    stop_timeout: float = 30.0
    # one money call (a charge-card request, an authorization) is given up after this long
    request_timeout: float = 30.0
    # how long the service may still commit a call after the agent gave up on it
    answer_margin: float = 10.0
    receipts: ReceiptSettings = field(default_factory=ReceiptSettings)

    @property
    def default_terminal(self) -> str:
        return next(iter(self.terminals))

    def resolve_terminal(self, wanted: str | None) -> str:
        """A device_id from a device_id, a configured terminal name, or None (the default)."""
        if wanted is None:
            return self.default_terminal
        if wanted in self.terminals:
            return wanted
        for device_id, name in self.terminals.items():
            if name == wanted:
                return device_id
        known = ", ".join(f"{d} ({n})" if n else d for d, n in self.terminals.items())
        raise UnknownTerminal(f"unknown terminal {wanted!r}; configured: {known}")

    def answer_window(self, flow: str) -> float:
        """Seconds from sending a money call until the service can no longer make it charge.

        The agent gives up on the call after ``request_timeout``; the service may still finish
        what it received for ``answer_margin`` more. A charge-card may also charge until its
        interaction expires. Until this has passed, "no charge in reporting" proves nothing.
        """
        window = self.request_timeout + self.answer_margin
        if flow == Flow.CHARGE_CARD:
            window += self.interaction_lifetime * 1.1
        return window

    def silence_bound(self, flow: str) -> float:
        """Seconds from sending a money call into a silent service until the sale has ended.

        The call's answer window (:meth:`answer_window`), then one last reporting lookup, which
        the service client gives up on after ``request_timeout`` (the service timeout T):
        2T + M, plus 1.1 x the interaction lifetime for a charge-card. docs/architecture.md
        has the table.
        """
        return self.answer_window(flow) + self.request_timeout

    def answer_by(self, flow: str, sent: float | None = None) -> float:
        """The deadline of a money call sent at ``sent`` (Unix time; default now)."""
        return (time.time() if sent is None else sent) + self.answer_window(flow)

    def lookup_pause(self, flow: str) -> float:
        """How often to look again in reporting while a money call may still be answered."""
        return min(5.0, max(0.2, self.answer_window(flow) / 20))

    @property
    def card_wait(self) -> float:
        """How long to wait for a card: the interaction's own lifetime and a margin, at most."""
        return min(self.card_timeout, self.interaction_lifetime * 1.1 + 5.0)


def new_ids() -> tuple[str, str]:
    """A sale id and the order_id sent to the service, both made here, before any call."""
    sale_id = uuid.uuid4().hex
    return sale_id, f"KA{sale_id[:18].upper()}"


@dataclass(frozen=True, slots=True)
class SaleContext:
    """What every sale needs, whether it runs live or is recovered: one per agent."""

    service: ServiceClient
    journal: Journal
    events: EventBus[SaleEvent]
    settings: SaleSettings
    # whether a terminal prints receipts (from the service's terminal list)
    capabilities: Callable[[str], Awaitable[bool]] | None = None
    # a sale whose step could not be journaled: kept and finished once the journal takes writes
    on_unwritten: Callable[[SaleSteps], None] | None = None


class SaleSteps:
    """One sale's journal-then-act helpers, shared by the flows and by recovery."""

    def __init__(self, record: SaleRecord, context: SaleContext) -> None:
        self.record = record
        self.context = context
        self.service = context.service
        self.journal = context.journal
        self.events = context.events
        self.settings = context.settings
        self.reconciler = Reconciler(context.service, context.settings.mid)
        # The sale as the journal should hold it, once a step could not be written: that first
        # failed step applied (later steps made no call: each would have been written first).
        self.unwritten: SaleRecord | None = None

    @property
    def device(self) -> str:
        return self.record.terminal

    # -- journal and events ----------------------------------------------------------------------

    def step(
        self,
        name: str,
        state: SaleState | None = None,
        message: str | None = None,
        detail: Mapping[str, Any] | None = None,
        **changes: Any,
    ) -> SaleRecord:
        """Journal one step (durably), then publish it."""
        if message is not None:
            changes["message"] = message
        try:
            self.record = self.journal.record(self.record, name, state, detail, **changes)
        except JournalError:
            if self.unwritten is None:
                self.unwritten = dataclasses.replace(
                    self.record, state=state or self.record.state, updated_at=time.time(),
                    **changes,
                )
            raise
        self.publish(name)
        return self.record

    def publish(self, step: str = "") -> SaleEvent:
        event = event_of(self.record, step)
        self.events.publish(event)
        return event

    def charge_found(
        self,
        name: str,
        trans_id: str | None,
        cents: int | None,
        detail: Mapping[str, Any] | None = None,
    ) -> int:
        """Journal a charge that holds money: from its answer, or found after a lost one.

        A charge-card captures at once, an authorization only holds; an answer without an
        amount holds the sale's price. Returns the cents held.
        """
        cents = cents or self.record.amount_cents
        held: dict[str, Any] = {"trans_id": trans_id, "authorized_cents": cents}
        if self.record.flow == Flow.CHARGE_CARD:
            held["captured_cents"] = cents
        self.step(name, detail=detail, **held)
        return cents

    def finish(
        self,
        state: SaleState,
        name: str,
        message: str,
        detail: Mapping[str, Any] | None = None,
        **changes: Any,
    ) -> SaleEvent:
        self.step(name, state, message, detail, **changes)
        log = _LOGGER.warning if state is SaleState.ATTENTION else _LOGGER.info
        log("sale %s %s: %s", self.record.sale_id, state.value, message)
        return event_of(self.record, name)

    async def _deny(self, reason: str) -> None:
        """Tell the machine not to vend; recovery has no machine to tell (SaleFlow does)."""

    async def _fail(self, state: SaleState, name: str, message: str) -> SaleEvent:
        """End a sale in which no money stays taken, and tell the machine."""
        event = self.finish(state, name, message)
        await self._deny(message)
        return event

    async def settle_by_reporting(self, why: str, kind: str) -> SaleEvent:
        """Whether a charge was made is unknown (a lost answer, a crash): reporting decides.

        The machine is told not to vend first: whatever reporting says, nothing is dispensed on
        an unconfirmed payment. Then reporting is asked by order_id until the money call's
        deadline (``answer_by``, written when it was sent): a charge found is given back; "no
        charge" is believed only from a lookup sent once the service can no longer make one.
        Meanwhile the sale is UNRESOLVED. Steps are named
        ``<kind>.waiting|unknown|found|reversed|none``; when reporting cannot say after the
        deadline, a person decides (ATTENTION; the attention sweeper keeps looking), nothing is
        guessed.
        """
        await self._deny("payment could not be confirmed")
        deadline = self.answer_deadline()
        pause = self.settings.lookup_pause(self.record.flow)
        while True:
            asked = time.time()  # reporting may answer what it knew when asked, not later
            lookup = await self.reconciler.find_charge(self.record.all_order_ids())
            if lookup.approved:
                self.charge_found(f"{kind}.found", lookup.trans_id, lookup.amount_cents)
                return await self.reverse(f"{why}; the charge was found in reporting, not vended")
            if lookup.reversed:
                given_back = f"{why}; already given back"
                return await self._fail(SaleState.REVERSED, f"{kind}.reversed", given_back)
            if lookup.unknown and time.time() >= deadline:
                return self.finish(
                    SaleState.ATTENTION,
                    f"{kind}.unknown",
                    f"{why}; reporting cannot say whether money was taken",
                )
            if not lookup.unknown and asked >= deadline:
                # "no charge" counts only from a lookup sent after the deadline: a slow answer
                # to an earlier one may predate a charge the service made before the deadline
                return await self._fail(
                    SaleState.FAILED, f"{kind}.none", f"{why}; no charge was made"
                )
            if self.record.state is not SaleState.UNRESOLVED:
                self.step(
                    f"{kind}.waiting",
                    SaleState.UNRESOLVED,
                    f"{why}; no charge in reporting yet, looking again until the service can no "
                    "longer answer",
                    detail={"answer_by": round(deadline, 3)},
                )
            await asyncio.sleep(min(pause, max(0.0, deadline - time.time())))

    async def money_call(self, call: Awaitable[T]) -> T:
        """A call that may move money, bounded as a whole (retries and 429 waits included) so
        that its journaled deadline holds; giving up is a lost answer, never a retry."""
        try:
            return await asyncio.wait_for(call, self.settings.request_timeout)
        except TimeoutError as err:
            raise ServiceUnreachableError(
                f"no answer within {self.settings.request_timeout:g} s; outcome unknown"
            ) from err

    def answer_deadline(self) -> float:
        """When the sale's last money call can no longer be answered (journaled with it)."""
        if self.record.answer_by is not None:
            return self.record.answer_by
        # a journal written before answer_by existed: the last request step's time says
        sent = self.record.created_at
        for step in self.journal.steps(self.record.sale_id):
            if step.step in ("charge_card.request", "authorize.request"):
                sent = step.at
        return self.settings.answer_by(self.record.flow, sent)

    # -- waiting for a card ----------------------------------------------------------------------

    async def wait_interaction(
        self, handle: Any, kind: InteractionKind, cancelled: asyncio.Event | None = None
    ) -> Interaction | None:
        """The interaction's final record; None when it could not be learned in time.

        A cancel request during a read-card cancels it on the terminal and waits for the end.
        """
        wait = asyncio.ensure_future(handle.wait(timeout=self.settings.card_wait))
        cancel_wait = asyncio.ensure_future(cancelled.wait()) if cancelled is not None else None
        try:
            waiting = {wait} | ({cancel_wait} if cancel_wait else set())
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            interaction_id = self.record.interaction_id
            if wait not in done and kind is InteractionKind.READ_CARD and interaction_id:
                with contextlib.suppress(ServiceError):
                    await self.service.terminal.cancel(self.device, interaction_id)
            interaction: Interaction = await wait
            return interaction
        except (TimeoutError, ServiceError) as err:
            _LOGGER.info("sale %s: waiting for the card ended: %s", self.record.sale_id, err)
            return await self.interaction_status(kind)
        finally:
            if cancel_wait is not None:
                cancel_wait.cancel()
            if not wait.done():
                wait.cancel()

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

    async def reverse(self, why: str) -> SaleEvent:
        """Give the money back (void, or refund once settled) and end the sale REVERSED.

        Written to the journal before the call; an error is checked against reporting before a
        second try, because voiding twice is refused and a lost answer may have worked.
        """
        trans_id = self.record.trans_id
        if trans_id is None:
            return self.finish(SaleState.ATTENTION, "reverse.unknown", f"{why}; no trans_id")
        self.step("reverse.request", SaleState.REVERSING, why, detail={"trans_id": trans_id})
        for attempt in (1, 2):
            try:
                result = await self.service.payments.void_or_refund(trans_id)
            except (BadRequestError, ServerError, ServiceUnreachableError) as err:
                lookup = await self.reconciler.transaction_state(trans_id)
                if lookup.reversed:
                    refunded = lookup.reverse_trans_id not in (None, trans_id)
                    return self._reversed(
                        why, lookup.reverse_trans_id, lookup.amount_cents, voided=not refunded
                    )
                if attempt == 2 or (isinstance(err, BadRequestError) and not lookup.known):
                    return self.finish(
                        SaleState.ATTENTION,
                        "reverse.failed",
                        f"{why}; giving the money back failed ({err}); a person must refund "
                        f"{format_cents(self._held_cents)}",
                    )
                continue
            except ServiceError as err:
                return self.finish(
                    SaleState.ATTENTION, "reverse.failed", f"{why}; void or refund refused: {err}"
                )
            return self._reversed(why, result.trans_id, result.amount, voided=result.voided)
        raise AssertionError("unreachable")  # pragma: no cover

    @property
    def _held_cents(self) -> int:
        return self.record.captured_cents or self.record.authorized_cents

    def _reversed(
        self, why: str, reverse_trans_id: str | None, cents: int | None, voided: bool = True
    ) -> SaleEvent:
        amount = cents or self.record.captured_cents or self.record.authorized_cents
        how = "voided" if voided else "refunded"
        return self.finish(
            SaleState.REVERSED,
            "reverse.done",
            f"{why}; {format_cents(amount)} {how}",
            reverse_trans_id=reverse_trans_id,
            reversed_cents=amount,
        )

    async def capture(self, cents: int, vend: Mapping[str, Any] | None = None) -> SaleEvent:
        """Capture the vended amount of an authorization (journaled first, reconciled on error)."""
        trans_id = self.record.trans_id
        assert trans_id is not None
        self.step(
            "capture.request",
            SaleState.CAPTURING,
            detail={"trans_id": trans_id, "cents": cents, **(vend or {})},
            vended_cents=cents,
        )
        try:
            result = await self.service.payments.capture(trans_id, amount=cents)
        except ServiceError as err:
            return await self._capture_unclear(trans_id, cents, err)
        return self._captured(result, cents)

    async def _capture_unclear(self, trans_id: str, cents: int, err: ServiceError) -> SaleEvent:
        """The capture answered an error: reporting says whether it went through (a lost answer
        may have worked); an authorization still open after a server error is captured again."""
        lookup = await self.reconciler.transaction_state(trans_id)
        if lookup.captured:
            return self._completed(lookup.amount_cents or cents, _FOUND_CAPTURED)
        if not (isinstance(err, (ServerError, ServiceUnreachableError)) and lookup.authorized):
            return self.finish(
                SaleState.ATTENTION,
                "capture.failed",
                f"dispensed, but the capture failed ({err}); a person must look",
            )
        try:
            result = await self.service.payments.capture(trans_id, amount=cents)
        except ServiceError as again:
            lookup = await self.reconciler.transaction_state(trans_id)
            if lookup.captured:
                return self._completed(lookup.amount_cents or cents, _FOUND_CAPTURED)
            return self.finish(
                SaleState.ATTENTION,
                "capture.failed",
                f"dispensed, but the capture failed twice ({again}); a person must capture",
            )
        return self._captured(result, cents)

    def _captured(self, result: ChargeResult, cents: int) -> SaleEvent:
        if not result.approved:
            return self.finish(
                SaleState.ATTENTION,
                "capture.refused",
                f"dispensed, but the capture answered {result.result}: {result.resp_text}",
            )
        return self._completed(result.amount or cents, "captured")

    def _completed(self, cents: int, how: str) -> SaleEvent:
        return self.finish(
            SaleState.COMPLETED,
            "completed",
            f"paid {format_cents(cents)} ({how})",
            captured_cents=cents,
        )


def event_of(record: SaleRecord, step: str = "") -> SaleEvent:
    return SaleEvent(
        sale_id=record.sale_id,
        order_id=record.order_id,
        source=record.source,
        state=record.state,
        amount_cents=record.amount_cents,
        captured_cents=record.captured_cents,
        product=record.product,
        terminal=record.terminal,
        message=record.message,
        at=record.updated_at or time.time(),
        step=step,
    )


class SaleFlow(SaleSteps):
    """A live sale: the request, the platform's dispenser, and the customer's cancel button."""

    def __init__(
        self, record: SaleRecord, request: SaleRequest, dispenser: Dispenser, context: SaleContext
    ) -> None:
        super().__init__(record, context)
        self.request = request
        self.dispenser = dispenser
        self.cancelled = asyncio.Event()
        self._denied = False

    async def run(self) -> SaleEvent:
        try:
            flow = Flow(self.record.flow)
            if flow is Flow.CHARGE_CARD:
                event = await self.charge_card()
            elif flow is Flow.AUTHORIZE_CAPTURE:
                event = await self.authorize_capture()
            else:
                event = await self.enroll()
        except asyncio.CancelledError:
            # The agent is stopping: the sale is parked where the journal says; recovery on the
            # next start finishes it.
            self.journal.record(self.record, "parked", detail={"reason": "agent stopping"})
            raise
        if event.state is SaleState.COMPLETED and self.record.flow != Flow.ENROLL:
            try:
                await self._receipts()
            except Exception:  # a receipt never fails a paid sale
                _LOGGER.exception("sale %s: receipt error", self.record.sale_id)
        return event

    async def _deny(self, reason: str) -> None:
        if self._denied:
            return  # the machine heard it once (a lost answer denies before reporting decides)
        self._denied = True
        try:
            await self.dispenser.deny(reason)
        except Exception:  # the contract says deny never raises; a broken platform must not
            _LOGGER.exception("sale %s: the dispenser failed to deny", self.record.sale_id)

    async def _dispense(self, authorized_cents: int) -> DispenseOutcome:
        """Let the machine vend; an exception or no answer within the vend timeout is TIMEOUT."""
        try:
            return await asyncio.wait_for(
                self.dispenser.dispense(authorized_cents), self.settings.vend_timeout
            )
        except TimeoutError:
            return DispenseOutcome(DispenseStatus.TIMEOUT, detail="no vend result in time")
        except Exception as err:
            _LOGGER.exception("sale %s: the dispenser raised", self.record.sale_id)
            return DispenseOutcome(DispenseStatus.TIMEOUT, detail=f"dispenser error: {err}")

    # -- charge_card -----------------------------------------------------------------------------

    async def charge_card(self) -> SaleEvent:
        amount = self.record.amount_cents
        for attempt in range(1, self.settings.retries + 2):
            if attempt > 1:
                self.step("charge_card.retry", attempt=attempt, interaction_id=None)
            order_id = self.record.attempt_order_id()
            self.step(
                "charge_card.request",
                SaleState.CHARGING,
                f"asking for {format_cents(amount)} on {self.device}",
                detail={"order_id": order_id, "amount_cents": amount},
                answer_by=self.settings.answer_by(self.record.flow),
            )
            try:
                handle = await self.money_call(
                    self.service.terminal.charge_card(self.device, amount, order_id=order_id)
                )
            except ConflictError as err:
                return await self._fail(
                    SaleState.FAILED, "charge_card.busy", f"terminal busy: {err}"
                )
            except (ServerError, ServiceUnreachableError) as err:
                return await self._answer_lost(f"the charge's answer was lost ({err})")
            except ServiceError as err:
                return await self._fail(SaleState.FAILED, "charge_card.refused", f"refused: {err}")
            self.step(
                "charge_card.accepted",
                interaction_id=handle.interaction_id,
                interaction_kind=InteractionKind.CHARGE_CARD.value,
            )
            interaction = await self.wait_interaction(handle, InteractionKind.CHARGE_CARD)
            if interaction is None or not interaction.finished:
                # the terminal went quiet: reporting by order_id says whether it charged
                return await self._answer_lost("the terminal never said how the charge ended")
            ended = await self._charge_ended(interaction)
            if ended is not None:
                return ended
        return await self._fail(
            SaleState.DECLINED,
            "charge_card.retries",
            f"the card asked to retry {self.settings.retries + 1} times; giving up",
        )

    async def _charge_ended(self, interaction: Interaction) -> SaleEvent | None:
        """The end of one charge-card attempt; None means ask again (a B answer)."""
        status = interaction.status
        if status == InteractionStatus.SUCCEEDED:
            result = interaction.charge_result
            if result is None:
                return self.finish(SaleState.ATTENTION, "charge_card.unknown", "no charge result")
            return await self._charged(result)
        if status == InteractionStatus.EXPIRED:
            return await self._fail(
                SaleState.FAILED, "charge_card.expired", "no card was presented"
            )
        if status == InteractionStatus.CANCELLED:
            return await self._fail(SaleState.CANCELLED, "charge_card.cancelled", "cancelled")
        return await self._fail(SaleState.FAILED, "charge_card.fault", interaction.fault)

    async def _charged(self, result: ChargeResult) -> SaleEvent | None:
        if result.result == ChargeResultCode.RETRY:
            self.step("charge_card.answer", detail={"result": "B"})
            return None
        if result.result != ChargeResultCode.APPROVED:
            return await self._fail(SaleState.DECLINED, "charge_card.declined", _declined(result))
        cents = self.charge_found(
            "charge_card.approved", result.trans_id, result.amount, {"trans_id": result.trans_id}
        )
        return await self._dispense_paid(cents)

    async def _answer_lost(self, why: str) -> SaleEvent:
        """How the charge or authorization ended is unknown: find out by order_id first."""
        kind = "charge_card" if self.record.flow == Flow.CHARGE_CARD else "authorize"
        self.step(f"{kind}.lost", detail={"why": why})
        return await self.settle_by_reporting(why, kind)

    async def _dispense_paid(self, cents: int) -> SaleEvent:
        """Money is taken (charge_card): the dispense is confirmed or the money goes back."""
        if self.cancelled.is_set():
            await self._deny("cancelled")
            return await self.reverse("cancelled by the customer after paying")
        self.step("dispense.request", SaleState.DISPENSING, f"vending up to {format_cents(cents)}")
        outcome = await self._dispense(cents)
        if outcome.dispensed:
            # the confirmation and the end are one write: no window where the journal knows the
            # goods came out but still looks like an unconfirmed dispense
            return self.finish(
                SaleState.COMPLETED,
                "completed",
                f"paid {format_cents(cents)} and dispensed",
                vended_cents=outcome.vended_cents or cents,
                detail=_outcome_detail(outcome),
            )
        self.step("dispense.result", detail=_outcome_detail(outcome))
        return await self.reverse(f"dispense {outcome.status.value} {outcome.detail}".strip())

    # -- authorize_capture -----------------------------------------------------------------------

    async def read_card(self) -> tuple[Any, SaleEvent | None]:
        """Read a card into a token (kept only in memory); or the sale's end."""
        amount = self.record.amount_cents
        self.step("read_card.request", SaleState.READING_CARD, f"present a card on {self.device}")
        try:
            handle = await self.service.terminal.read_card(self.device, amount)
        except ConflictError as err:
            return None, await self._fail(
                SaleState.FAILED, "read_card.busy", f"terminal busy: {err}"
            )
        except ServiceError as err:
            # a read-card moves no money: a lost answer needs no reconciliation
            return None, await self._fail(SaleState.FAILED, "read_card.error", f"card read: {err}")
        self.step(
            "read_card.accepted",
            interaction_id=handle.interaction_id,
            interaction_kind=InteractionKind.READ_CARD.value,
        )
        interaction = await self.wait_interaction(handle, InteractionKind.READ_CARD, self.cancelled)
        if interaction is None or interaction.status == InteractionStatus.PENDING:
            return None, await self._fail(SaleState.FAILED, "read_card.timeout", "no card in time")
        if interaction.status == InteractionStatus.CANCELLED or self.cancelled.is_set():
            return None, await self._fail(SaleState.CANCELLED, "read_card.cancelled", "cancelled")
        if interaction.status == InteractionStatus.EXPIRED:
            return None, await self._fail(
                SaleState.FAILED, "read_card.expired", "no card was presented"
            )
        card = interaction.read_card_result
        if card is None:
            return None, await self._fail(SaleState.FAILED, "read_card.fault", interaction.fault)
        self.step(
            "read_card.done",
            card_brand=None if card.card_brand_id is None else str(card.card_brand_id),
            last_four=card.last_four,
        )
        return card, None

    async def authorize_capture(self) -> SaleEvent:
        card, ended = await self.read_card()
        if ended is not None:
            return ended
        amount = self.record.amount_cents
        result: ChargeResult | None = None
        for attempt in range(1, self.settings.retries + 2):
            if attempt > 1:
                self.step("authorize.retry", attempt=attempt)
            order_id = self.record.attempt_order_id()
            self.step(
                "authorize.request",
                SaleState.AUTHORIZING,
                f"authorizing {format_cents(amount)}",
                detail={"order_id": order_id, "amount_cents": amount},
                answer_by=self.settings.answer_by(self.record.flow),
            )
            request = ChargeRequest(
                mid=self.settings.mid,
                amount=amount,
                account_token=card.token,
                expiration=card.expiration,
                currency=self.settings.currency,
                capture=False,
                order_id=order_id,
                terminal_id=self.device,
            )
            try:
                result = await self.money_call(self.service.payments.charge(request))
            except (ServerError, ServiceUnreachableError) as err:
                return await self._answer_lost(f"the authorization's answer was lost ({err})")
            except ServiceError as err:
                return await self._fail(SaleState.FAILED, "authorize.refused", f"refused: {err}")
            if result.result != ChargeResultCode.RETRY:
                break
            self.step("authorize.answer", detail={"result": "B"})
        assert result is not None
        if result.result == ChargeResultCode.RETRY:
            return await self._fail(SaleState.DECLINED, "authorize.retries", "retry limit reached")
        if not result.approved:
            return await self._fail(SaleState.DECLINED, "authorize.declined", _declined(result))
        cents = self.charge_found(
            "authorize.approved", result.trans_id, result.amount, {"trans_id": result.trans_id}
        )
        return await self._vend_authorized(cents)

    async def _vend_authorized(self, authorized: int) -> SaleEvent:
        if self.cancelled.is_set():
            await self._deny("cancelled")
            return await self.reverse("cancelled by the customer")
        self.step(
            "dispense.request", SaleState.DISPENSING, f"vend up to {format_cents(authorized)}"
        )
        outcome = await self._dispense(authorized)
        if not outcome.dispensed:
            self.step("dispense.result", detail=_outcome_detail(outcome))
            return await self.reverse(f"dispense {outcome.status.value} {outcome.detail}".strip())
        vended = outcome.vended_cents or authorized
        if vended > authorized:
            # never capture more than authorized: capture what we may and say so
            _LOGGER.warning(
                "sale %s: vended %d above authorized %d", self.record.sale_id, vended, authorized
            )
            vended = authorized
        # capture() journals the confirmed vend (CAPTURING) before it calls the service
        return await self.capture(vended, _outcome_detail(outcome))

    # -- enroll ----------------------------------------------------------------------------------

    async def enroll(self) -> SaleEvent:
        card, ended = await self.read_card()
        if ended is not None:
            return ended
        self.step("vault.request", SaleState.ENROLLING, "saving the card")
        try:
            account = await self.service.vault.create(_vault_request(card, self.request))
        except ServiceError as err:
            return self.finish(
                SaleState.ATTENTION
                if isinstance(err, (ServerError, ServiceUnreachableError))
                else SaleState.FAILED,
                "vault.failed",
                f"saving the card failed: {err}",
            )
        self.step("vault.done", vault_uuid=account.uuid, last_four=account.last_four)
        plan = self.request.plan
        if plan:
            self.step("plan.request", detail={"name": plan.get("name", "")})
            try:
                plan_id = await self.service.plans.create(**_plan_fields(plan, account.uuid))
            except ServiceError as err:
                return self.finish(
                    SaleState.ATTENTION,
                    "plan.failed",
                    f"the card was saved but the billing plan failed: {err}",
                )
            self.step("plan.done", plan_id=str(plan_id))
        return self.finish(
            SaleState.COMPLETED, "completed", "card saved" + (" with a plan" if plan else "")
        )

    # -- receipts --------------------------------------------------------------------------------

    async def _receipts(self) -> None:
        trans_id = self.record.trans_id
        if trans_id is None:
            return
        notes = await send_receipts(
            self.service,
            self.device,
            trans_id,
            self.request.email,
            self.settings.receipts,
            self.context.capabilities,
        )
        for note in notes:
            # journaled, then published as a note on the completed sale (the demo shows it)
            noted = self.journal.record(self.record, RECEIPT_STEP, detail={"note": note})
            self.events.publish(dataclasses.replace(event_of(noted, RECEIPT_STEP), message=note))


def _declined(result: ChargeResult) -> str:
    return f"declined ({result.resp_text or 'C'})"


def _outcome_detail(outcome: DispenseOutcome) -> dict[str, Any]:
    return {
        "status": outcome.status.value,
        "vended_cents": outcome.vended_cents,
        "product": outcome.product,
        "detail": outcome.detail,
    }


def _vault_request(card: Any, request: SaleRequest) -> VaultAccountRequest:
    """The vault body: the card token (in memory only) and what the kiosk asked of the customer."""
    info = request.metadata
    return VaultAccountRequest(
        account_token=card.token,
        expiration=card.expiration,
        name=info.get("name", "Kiosk customer"),
        email=request.email or info.get("email", ""),
        phone=info.get("phone", ""),
        account_zip=info.get("account_zip", ""),
        address1=info.get("address1", ""),
        city=info.get("city", ""),
        region=info.get("region", ""),
        country=info.get("country", "US"),
    )


def _plan_fields(plan: Mapping[str, str], account_uuid: str) -> dict[str, Any]:
    """A billing plan from an enroll request: ``name``, ``amount`` ("12.50"), ``rrule``."""
    return {
        "name": plan.get("name") or f"kiosk-{account_uuid[:8]}",
        "description": plan.get("description", "kiosk enrollment"),
        "payment_account_uuid": account_uuid,
        "amount": cents_to_decimal(parse_price(plan["amount"])),
        "rrule_pattern": plan["rrule"],
    }


@dataclass(slots=True)
class Sale:
    """A running sale, as returned to the platform that started it."""

    sale_id: str
    order_id: str
    terminal: str
    task: asyncio.Task[SaleEvent]

    async def result(self) -> SaleEvent:
        """The final event of the sale."""
        return await asyncio.shield(self.task)


class SaleRunner:
    """Starts sales, one at a time per terminal, and keeps track of them."""

    def __init__(self, context: SaleContext) -> None:
        self.context = context
        self.journal = context.journal
        self.settings = context.settings
        self._running: dict[str, SaleFlow] = {}  # device_id -> the sale on it
        self._tasks: dict[str, Sale] = {}  # sale_id -> sale
        self._blocked: dict[str, str] = {}  # device_id -> why (recovery, stopping)
        self._stopping = False

    def busy_reason(self, device_id: str) -> str | None:
        if self._stopping:
            return "the agent is stopping"
        if device_id in self._blocked:
            return self._blocked[device_id]
        flow = self._running.get(device_id)
        if flow is not None:
            return f"sale {flow.record.sale_id} is {flow.record.state.value}"
        return None

    def block(self, device_id: str, reason: str) -> None:
        """Refuse new sales on a terminal (recovery is finishing an old sale on it)."""
        self._blocked[device_id] = reason

    def unblock(self, device_id: str) -> None:
        self._blocked.pop(device_id, None)

    async def start(self, request: SaleRequest, dispenser: Dispenser) -> Sale:
        """Journal a new sale and start its flow; TerminalBusy at once if the terminal is taken."""
        device = self.settings.resolve_terminal(request.terminal)
        reason = self.busy_reason(device)
        if reason is not None:
            raise TerminalBusy(device, reason)
        if isinstance(request.amount_cents, bool) or not isinstance(request.amount_cents, int):
            raise TypeError(f"amount_cents must be integer cents, got {request.amount_cents!r}")
        if request.amount_cents <= 0:
            # enroll too: the terminal shows an amount while it reads the card
            raise ValueError(f"a sale needs an amount above zero, got {request.amount_cents}")
        if request.max_cents is not None and request.amount_cents > request.max_cents:
            raise PriceAboveMaximum(
                f"{format_cents(request.amount_cents)} is above this machine's max_price"
                f" {format_cents(request.max_cents)}"
            )
        sale_id, order_id = new_ids()
        record = SaleRecord(
            sale_id=sale_id,
            order_id=order_id,
            source=request.source,
            flow=request.flow.value,
            terminal=device,
            amount_cents=request.amount_cents,
            state=SaleState.STARTED,
            product=request.product,
            currency=self.settings.currency,
        )
        record = self.journal.create(record, {"source": request.source, "product": request.product})
        flow = SaleFlow(record, request, dispenser, self.context)
        flow.publish("created")
        self._running[device] = flow
        task = asyncio.create_task(self._run(device, flow), name=f"sale-{sale_id}")
        sale = Sale(sale_id, order_id, device, task)
        self._tasks[sale_id] = sale
        return sale

    async def _run(self, device: str, flow: SaleFlow) -> SaleEvent:
        try:
            return await flow.run()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            keep = self.context.on_unwritten
            if isinstance(err, JournalError) and flow.unwritten is not None and keep is not None:
                return await _strand(flow, err, keep)
            # A bug must not leave money taken: reverse what was charged, else attention.
            _LOGGER.exception("sale %s: flow error", flow.record.sale_id)
            try:
                return await _rescue(flow, err)
            except Exception:  # the journal itself fails: recovery finishes it on next start
                _LOGGER.exception("sale %s: cannot end the sale", flow.record.sale_id)
                ended = dataclasses.replace(
                    flow.record, state=SaleState.ATTENTION, message=f"error: {err}"
                )
                event = event_of(ended, "error")
                flow.events.publish(event)
                return event
        finally:
            if self._running.get(device) is flow:
                del self._running[device]
            self._tasks.pop(flow.record.sale_id, None)

    async def cancel(self, sale_id: str) -> bool:
        """Ask a running sale to stop: before payment it ends CANCELLED, after it is reversed."""
        for flow in self._running.values():
            if flow.record.sale_id == sale_id:
                flow.cancelled.set()
                flow.journal.record(flow.record, "cancel.requested")
                return True
        return False

    @property
    def running(self) -> list[SaleRecord]:
        return [flow.record for flow in self._running.values()]

    def close(self) -> None:
        """Refuse every new sale from now on: the first thing a stop does."""
        self._stopping = True

    async def stop(self, grace: float | None = None) -> None:
        """Refuse new sales, let running ones finish, then park the rest (journaled)."""
        self.close()
        tasks = [sale.task for sale in self._tasks.values()]
        if not tasks:
            return
        wait = self.settings.stop_timeout if grace is None else grace
        _done, pending = await asyncio.wait(tasks, timeout=wait)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


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
    assert flow.unwritten is not None
    flow.record = dataclasses.replace(
        flow.unwritten, message=f"not journaled yet ({err}); finished once the journal is back"
    )
    keep(flow)
    # shown as attention (people and apps see it held) until the journal holds it and it ends
    event = event_of(dataclasses.replace(flow.record, state=SaleState.ATTENTION),
                     "journal.unwritten")
    flow.events.publish(event)
    return event


async def _rescue(flow: SaleFlow, err: Exception) -> SaleEvent:
    record = flow.record
    if record.state.final:  # the sale had ended; what failed came after (and changes nothing)
        return event_of(record)
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
    return flow.finish(state, "error", f"internal error: {type(err).__name__}: {err}")
