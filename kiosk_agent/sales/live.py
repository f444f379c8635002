"""A live sale: the customer at the machine, the platform's dispenser, the card, the receipt.

Every flow follows one rule: write the step to the journal, *then* make the call the step
announces. So after any crash the journal says what might have happened, and recovery (or the
flow itself, after a lost answer) finds out what did by ``order_id`` before anything is sent
again. Money only stays taken when the dispenser confirmed the goods came out; anything else
ends with a void or a refund, and the sale says so. One module per flow:

``charge_card``        CHARGING -> (A) DISPENSING -> COMPLETED | REVERSING -> REVERSED
                       (B: ask again up to ``retries``; C: DECLINED; fault/expiry: FAILED)
``authorize_capture``  READING_CARD -> AUTHORIZING -> DISPENSING -> CAPTURING -> COMPLETED
                       (vend failed, cancelled or timed out: REVERSING -> REVERSED)
``enroll``             READING_CARD -> ENROLLING -> COMPLETED

(every move allowed is in ``states.TRANSITIONS``; the journal refuses any other).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from kiosk_agent.money import format_cents
from kiosk_agent.sales.clock import wait_at_most
from kiosk_agent.sales.journal import SaleRecord
from kiosk_agent.sales.late_vends import maybe_note
from kiosk_agent.sales.model import (
    ChoosingDispenser,
    DispenseOutcome,
    Dispenser,
    DispenseStatus,
    SaleEvent,
    SaleRequest,
    Selection,
    unheard_end,
)
from kiosk_agent.sales.receipts import prints_on_terminal, send_receipts
from kiosk_agent.sales.states import ReportingSteps, SaleState, Step
from kiosk_agent.sales.steps import UNCONFIRMED, CancelRequest, SaleContext, SaleSteps, event_of
from kiosk_agent.service.errors import (
    ConflictError,
    ServerError,
    ServiceError,
    ServiceUnreachableError,
    conflict_words,
)
from kiosk_agent.service.models import ChargeResult, InteractionKind, InteractionStatus

_LOGGER = logging.getLogger(__name__)


class SaleFlow(SaleSteps):
    """A live sale: the request, the platform's dispenser, and the customer's cancel button.

    Each flow is a subclass that says how it sells (:meth:`sell`)."""

    # the reporting steps of the flow's money call, when its answer is lost
    reporting: ClassVar[ReportingSteps | None] = None
    # whether a completed sale gets receipts (a payment does; saving a card does not)
    receipts: ClassVar[bool] = True

    def __init__(
        self, record: SaleRecord, request: SaleRequest, dispenser: Dispenser, context: SaleContext
    ) -> None:
        super().__init__(record, context)
        self.request = request
        self.dispenser = dispenser
        self.cancelled = CancelRequest()  # the runner's cancel sets it
        self._denied = False
        # the runner's: the terminal is free for the next sale (called once, by release_terminal)
        self.on_release: Callable[[], None] | None = None
        self._printing: bool | None = None  # whether a receipt is printed on the terminal
        self._waited = False  # whether the wait for a terminal held by a lost read was said
        # why the dispense may have happened though the dispenser gave no outcome (it raised:
        # a relay may have fired first); the runner tells a person once the money is back
        self.dispense_unsure = ""
        # whether the machine outlives the agent (SaleRunner.hears_after_restart): a vend the
        # sale gave up on may go out after the agent stops; the demo's ``virtual`` dies with it
        self.machine_outlives = True
        # the maybe (``late.vend`` with ``unsure``) this sale journaled with its dispense.result:
        # the runner tells health once the sale ended (LateVendWatch.noted)
        self.maybe_told: dict[str, Any] | None = None

    def open(self, detail: Mapping[str, Any]) -> None:
        """Journal the new sale together with its flow's first step, in one commit.

        Nothing happens between the two that the journal must hold first: the step's call is
        made once the flow runs, after the commit. A crash before the commit leaves no sale, as
        a crash just before the sale was created did (no call was made, nobody was told its id:
        the kiosk API answers 202 after this). Both are published once that call's request is
        on the wire (the runner runs the flow's first step in this turn, to that request).
        """
        with self.one_commit(announce_after_send=True):
            self.record = self.journal.create(self.record, detail)
            self._announce(Step.CREATED)
            self.opening()

    def opening(self) -> None:
        """The flow's first step, journaled with the sale itself (none by default)."""

    async def sell(self) -> SaleEvent:
        """The flow itself, from STARTED to its end; the sale's final event."""
        raise NotImplementedError

    async def run(self) -> SaleEvent:
        try:
            event = await self.sell()
        except asyncio.CancelledError:
            # The agent is stopping: the sale is parked where the journal says; recovery on the
            # next start finishes it. (A sale that had just ended needs no note.)
            if not self.record.state.final:
                self.journal.record(self.record, Step.PARKED, detail={"reason": "agent stopping"})
            raise
        if event.state is SaleState.COMPLETED and self.receipts:
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
        self.customer_answered()

    def customer_waits(self) -> None:
        """The customer now waits for the machine's answer: captures of other sales wait."""
        self.context.customers.waits(self.record.sale_id)

    def customer_answered(self) -> None:
        """The machine is told (approve or deny written), or the customer waits no more."""
        self.context.customers.answered(self.record.sale_id)

    async def release_terminal(self, *, may_complete: bool) -> None:
        """What remains of the sale needs no terminal call: the next customer's sale may start
        on it while this one captures or gives the money back (or saves a card).

        Called by the flows once the dispense outcome is known. A sale that may still complete
        (``may_complete``) keeps the terminal when its receipt will be printed there: printing is
        a terminal call. Money given back gets no receipt. The sale's end releases it anyway."""
        if may_complete and await self._prints_receipt():
            return
        self.customer_answered()  # the outcome is known: nobody waits on this sale
        release, self.on_release = self.on_release, None
        if release is not None:
            release()

    async def _prints_receipt(self) -> bool:
        """Whether this sale, once completed, prints its receipt on the terminal (asked once)."""
        if not self.receipts:
            return False
        if self._printing is None:
            try:
                self._printing = await prints_on_terminal(
                    self.device, self.settings.receipts, self.context.capabilities
                )
            except Exception:  # unknown: the terminal stays held; the receipt asks again
                _LOGGER.exception("sale %s: whether a receipt prints is unknown",
                                  self.record.sale_id)
                return True
        return self._printing

    def approved_for_vend(self, step: Step, result: ChargeResult, vend_text: str) -> int:
        """The money's approval and the dispense request it pays for follow each other: one
        commit, before the vend (no request when the customer cancelled meanwhile). The cents
        approved. Both are published at the loop's next turn: the machine's approve (C,VEND;
        card first, C,START) is written in this one, after the commit, before them."""
        with self.one_commit(announce_next_turn=True):
            held = self.charge_found(
                step, result.trans_id, result.amount, {"trans_id": result.trans_id}
            )
            # an answer above the price asked (the wrong unit, a service's fault) pays for the
            # price asked, no more: the machine vends and the capture takes at most that
            cents = min(held, self.record.amount_cents)
            if held > cents:
                _LOGGER.warning("sale %s: the service answered %s for the %s asked",
                                self.record.sale_id, format_cents(held), format_cents(cents))
            if not self.cancelled.is_set():
                vend = f"{vend_text} {format_cents(cents)}"
                self.step(Step.DISPENSE_REQUEST, SaleState.DISPENSING, vend)
        return cents

    async def _choose(self, funds_cents: int) -> Selection | DispenseOutcome:
        """Card first: the customer's choice at the machine, within the sale's choice timeout.
        Nobody chose in time: the machine is told no (it closes the session)."""
        chooser = self.dispenser
        if not isinstance(chooser, ChoosingDispenser):
            why = f"{self.request.source} offers no choice at the machine"
            await self._deny(why)
            return DispenseOutcome(DispenseStatus.CANCELLED, detail=why)
        bound = self.settings.choice_timeout_for(self.request)
        # C,START is written at the call's first step (the wake of a waiting capture comes a
        # turn later); the customer waits again once they chose
        self.customer_answered()
        try:
            chosen = await self.clock.wait_for(chooser.choose(funds_cents), bound)
            if isinstance(chosen, Selection):
                self.customer_waits()
            return chosen
        except TimeoutError:
            why = f"session timeout: nothing selected within {bound:g} s"
        except Exception as err:
            _LOGGER.exception("sale %s: the dispenser raised", self.record.sale_id)
            why = f"dispenser error: {err}"
        await self._deny(why)
        return DispenseOutcome(DispenseStatus.CANCELLED, detail=why)

    async def _dispense(self, authorized_cents: int) -> DispenseOutcome:
        """Let the machine vend; an exception or no answer within the vend timeout is TIMEOUT."""
        bound = self.settings.vend_timeout_for(self.request)
        # the approve (C,VEND) is written at the call's first step, before it waits: a capture
        # woken here runs a turn later, after it
        self.customer_answered()
        try:
            # an outcome known at once (an app that does not confirm) arms no vend timer
            return await wait_at_most(self.clock, self.dispenser.dispense(authorized_cents), bound)
        except TimeoutError:
            why = f"no vend result within {bound:g} s"
            return DispenseOutcome(DispenseStatus.TIMEOUT, detail=why)
        except Exception as err:
            _LOGGER.exception("sale %s: the dispenser raised", self.record.sale_id)
            self.dispense_unsure = f"dispenser error: {err}"
            return DispenseOutcome(DispenseStatus.TIMEOUT, detail=self.dispense_unsure)

    async def _answer_lost(self, why: str, *, terminal_done: bool) -> SaleEvent:
        """How the charge or authorization ended is unknown: find out by order_id first.

        Reporting may take minutes to say (UNRESOLVED). ``terminal_done``: no terminal
        interaction of the sale can still be live (the lost call was the payments API's, after
        the card was read), so once the machine is told not to vend the terminal is free for the
        next customer. A lost charge-card keeps it: the terminal may still be taking the card,
        until the charge is found (:meth:`reverse`) or the sale ends. Such a sale never
        completes, so no receipt will print there."""
        steps = self.reporting
        if steps is None:  # a flow without a money call never loses its answer
            raise RuntimeError("a lost answer in a flow without a money call")
        if steps.lost is None:
            raise RuntimeError("a lost answer in a flow with no step for it")
        self.step(steps.lost, detail={"why": why})
        if terminal_done:
            await self._deny(UNCONFIRMED)  # first: the platforms end the customer's session on it
            await self.release_terminal(may_complete=False)
        return await self.settle_by_reporting(why, steps)

    def not_dispensed(self, outcome: DispenseOutcome, price: int, product: str | None,
                      **changes: Any) -> None:
        """The vend not made, as the machine (or its timeout) said: ``dispense.result``. A
        dispenser that raised (``dispense_unsure``) may have moved the machine first, and a vend
        the sale gave up waiting for (its vend timeout: ``UNHEARD_ENDS``) may still be made
        after the agent stops listening (killed, stopped): a person is told (a maybe late vend)
        in the same commit, before the give-back, so that no kill between them leaves a product
        out unpaid untold (2026-11-30: the runner journaled the raise's once the sale had ended,
        after the give-back's commits; a timeout's was told to nobody, only a success heard
        while the agent lived). A failure the machine said, a vend never sent (the link down),
        a vend never approved, or a machine that dies with the agent (``virtual``): not told."""
        why = self.dispense_unsure or (
            outcome.detail or "no vend result within its vend timeout"
            if unheard_end(outcome.status, outcome.unheard) and self.machine_outlives
            and self.record.state is SaleState.DISPENSING else "")
        if not why:
            self.step(Step.DISPENSE_RESULT, detail=outcome_detail(outcome), **changes)
            return
        self.maybe_told = maybe_note(product, self.request.source, why, price)
        with self.told_in_one_commit(self.maybe_told, told_last=True):
            self.step(Step.DISPENSE_RESULT, detail=outcome_detail(outcome), **changes)

    async def reverse(self, why: str, told: Mapping[str, Any] | None = None) -> SaleEvent:
        """Give the money back; that needs no terminal, and money given back gets no receipt.

        The flows release before they reverse; a charge found in reporting after a lost answer
        releases here: the charge-card interaction that made it is over."""
        await self.release_terminal(may_complete=False)
        return await super().reverse(why, told)

    async def read_card(self) -> tuple[Any, SaleEvent | None]:
        """Read a card into a token (kept only in memory); or the sale's end.

        The request is journaled with the sale (:meth:`ask_for_card`, the read-card flows'
        opening step). The read is journaled by the caller (:meth:`card_read`), in one commit with
        the step it leads to: nothing happens between them that the journal must hold first, and
        a crash before that commit leaves the sale reading a card, as a crash just after the read
        did.
        """
        amount = self.record.amount_cents
        if self.record.state is SaleState.STARTED:  # not opened with the sale: journal it first
            self.ask_for_card()
        while True:
            try:
                handle = await self.service.terminal.read_card(self.device, amount)
                self.context.lost_reads.ended(self.device)
                break
            except ConflictError as err:
                if await self.held_by_lost_read(err):
                    continue
                return None, await self.busy(err, Step.READ_CARD_BUSY, Step.READ_CARD_CANCELLED)
            except ServiceError as err:
                why = f"card read: {err}"
                if isinstance(err, (ServerError, ServiceUnreachableError)):
                    # the read may have started, waiting for a card we cannot fetch
                    lifetime = self.settings.interaction_lifetime
                    self.context.lost_reads.lost(self.device, lifetime)
                    why += (f"; {self.device} may wait for a card up to {lifetime:.0f} s more "
                            "(the next sale waits for it)")
                # a read-card moves no money: a lost answer needs no reconciliation
                return None, await self._fail(SaleState.FAILED, Step.READ_CARD_ERROR, why)
        self.step(
            Step.READ_CARD_ACCEPTED,
            interaction_id=handle.interaction_id,
            interaction_kind=InteractionKind.READ_CARD.value,
        )
        interaction = await self.wait_interaction(handle, InteractionKind.READ_CARD, self.cancelled)
        if interaction is None or interaction.status == InteractionStatus.PENDING:
            return None, await self._fail(
                SaleState.FAILED, Step.READ_CARD_TIMEOUT, "no card in time"
            )
        if interaction.status == InteractionStatus.CANCELLED or self.cancelled.is_set():
            return None, await self._fail(
                SaleState.CANCELLED, Step.READ_CARD_CANCELLED, "cancelled"
            )
        if interaction.status == InteractionStatus.EXPIRED:
            return None, await self._fail(
                SaleState.FAILED, Step.READ_CARD_EXPIRED, "no card was presented"
            )
        card = interaction.read_card_result
        if card is None:
            return None, await self._fail(SaleState.FAILED, Step.READ_CARD_FAULT, interaction.fault)
        return card, None

    async def held_by_lost_read(self, err: ConflictError) -> bool:
        """Whether to ask the terminal again: it answered busy while a card read whose answer
        was lost may still hold it (sales/lost_reads.py); that read ends by its lifetime, or
        at once when a card is tapped on it, and moves no money. Waits a pause first (the
        customer's cancel ends it). The wait is journaled once, so the page, the command line
        and the machine's app show why the customer waits."""
        left = self.context.lost_reads.left(self.device)
        if err.error != "terminal_busy" or left is None or self.cancelled.is_set():
            return False
        if not self._waited:
            self._waited = True
            self.step(
                Step.TERMINAL_WAIT,
                message=f"waiting for {self.device}: a card read whose answer was lost may hold "
                f"it up to {left:.0f} s more (a card presented now ends it; then present it "
                "again)",
                detail={"left_s": round(left, 3)},
            )
        pause = min(left, max(0.01, min(1.0, self.settings.interaction_lifetime / 60)))
        with contextlib.suppress(TimeoutError):
            await self.clock.wait_for(self.cancelled.wait(), pause)
        return not self.cancelled.is_set()

    async def busy(self, err: ConflictError, busy: Step, cancelled: Step) -> SaleEvent:
        """The terminal refused to start (409): the sale fails, or ends cancelled when the
        customer cancelled while it waited for the terminal."""
        if self.cancelled.is_set():
            return await self._fail(SaleState.CANCELLED, cancelled, "cancelled")
        return await self._fail(SaleState.FAILED, busy, conflict_words(err, self.device))

    def ask_for_card(self) -> None:
        """Journal the read-card request (before it is sent)."""
        self.step(
            Step.READ_CARD_REQUEST, SaleState.READING_CARD, f"present a card on {self.device}"
        )

    def card_read(self, card: Any) -> None:
        """Journal the card read (its brand and last four, never the token)."""
        self.step(
            Step.READ_CARD_DONE,
            card_brand=None if card.card_brand_id is None else str(card.card_brand_id),
            last_four=card.last_four,
        )

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
            self._printing,
        )
        for note in notes:
            # journaled, then published as a note on the completed sale (the demo shows it)
            noted = self.journal.record(self.record, Step.RECEIPT, detail={"note": note})
            event = event_of(noted, Step.RECEIPT, clock=self.clock)
            self.publish_event(dataclasses.replace(event, message=note))


def declined(result: ChargeResult) -> str:
    return f"declined ({result.resp_text or 'C'})"


def outcome_detail(outcome: DispenseOutcome) -> dict[str, Any]:
    detail = {
        "status": outcome.status._value_,
        "vended_cents": outcome.vended_cents,
        "product": outcome.product,
        "detail": outcome.detail,
    }
    if outcome.unheard:  # only where the platform said so (UnheardOutcome): no bytes elsewhere
        detail["unheard"] = True
    return detail
