"""charge_card: one terminal call reads the card and charges it; the machine then vends.

CHARGING -> (A) DISPENSING -> COMPLETED, or REVERSING -> REVERSED when the vend is not
confirmed; a B answer asks again up to ``retries`` times; C: DECLINED; fault or expiry: FAILED;
a lost answer: reporting decides (UNRESOLVED until the charge's deadline).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from kiosk_agent.money import format_cents
from kiosk_agent.sales.live import SaleFlow, declined, outcome_detail
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import CHARGE_CARD_REPORTING, SaleState, Step
from kiosk_agent.sales.steps import RESOLVE, unknown_outcome
from kiosk_agent.service.errors import (
    OUTCOME_UNKNOWN,
    ConflictError,
    InvalidResponseError,
    ServiceError,
)
from kiosk_agent.service.models import (
    ChargeResult,
    ChargeResultCode,
    Interaction,
    InteractionKind,
    InteractionStatus,
)
from kiosk_agent.service.parsing import charge_card_result

if TYPE_CHECKING:
    from kiosk_agent.service.cable import InteractionHandle

# a price as the steps' messages show it ("$2.50"), made once for a kiosk's few prices, not twice
# a sale (two Python calls each); typed: True is refused as cents, never taken for a cached 1
_shown = functools.lru_cache(maxsize=256, typed=True)(format_cents)


class ChargeCardFlow(SaleFlow):
    """Charge first (captured at once), then dispense; money back if the vend fails."""

    reporting = CHARGE_CARD_REPORTING

    def opening(self) -> None:
        self._ask_to_charge()  # the first attempt's request, with the sale: one commit

    def _ask_to_charge(self) -> None:
        """Journal this attempt's charge-card request (its intent and deadline) before it goes."""
        amount = self.record.amount_cents
        self.step(
            Step.CHARGE_CARD_REQUEST,
            SaleState.CHARGING,
            f"asking for {_shown(amount)} on {self.device}",
            detail={"order_id": self.record.attempt_order_id(), "amount_cents": amount},
            **self.sending(),
        )

    async def sell(self) -> SaleEvent:
        amount = self.record.amount_cents
        for attempt in range(1, self.settings.retries + 2):
            if attempt > 1:
                self.step(Step.CHARGE_CARD_RETRY, attempt=attempt, interaction_id=None)
            if attempt > 1 or self.record.state is SaleState.STARTED:  # else opened with it
                self._ask_to_charge()
            order_id = self.record.attempt_order_id()
            try:
                handle = await self._send_charge(amount, order_id)
            except ConflictError as err:
                return await self.busy(err, Step.CHARGE_CARD_BUSY, Step.CHARGE_CARD_CANCELLED)
            except OUTCOME_UNKNOWN as err:
                # the interaction may have started: the terminal may be taking the card
                return await self._answer_lost(
                    unknown_outcome("charge", err), terminal_done=False
                )
            except ServiceError as err:
                return await self._fail(
                    SaleState.FAILED, Step.CHARGE_CARD_REFUSED, f"refused: {err}"
                )
            self.step(
                Step.CHARGE_CARD_ACCEPTED,
                interaction_id=handle.interaction_id,
                interaction_kind=InteractionKind.CHARGE_CARD._value_,
            )
            interaction = await self.wait_interaction(handle, InteractionKind.CHARGE_CARD)
            if interaction is None or not interaction.finished:
                # the terminal went quiet: reporting by order_id says whether it charged
                return await self._answer_lost(
                    "the terminal never said how the charge ended", terminal_done=False
                )
            ended = await self._charge_ended(interaction, order_id)
            if ended is not None:
                return ended
        return await self._fail(
            SaleState.DECLINED,
            Step.CHARGE_CARD_RETRIES,
            f"the card asked to retry {self.settings.retries + 1} times; giving up",
        )

    async def _send_charge(self, amount: int, order_id: str) -> InteractionHandle:
        """Send this attempt's charge-card; a terminal held by a lost card read is waited for
        and asked again (a 409 started nothing: the same order id, a fresh deadline)."""
        while True:
            try:
                handle = await self.money_call(
                    self.service.terminal.charge_card(self.device, amount, order_id=order_id)
                )
                self.context.lost_reads.ended(self.device)
                return handle
            except ConflictError as err:
                if not await self.held_by_lost_read(err):
                    raise
            self._ask_to_charge()

    async def _charge_ended(self, interaction: Interaction, order_id: str) -> SaleEvent | None:
        """The end of one charge-card attempt; None means ask again (a B answer)."""
        status = interaction.status
        if status == InteractionStatus.SUCCEEDED:
            try:
                result = charge_card_result(
                    interaction, order_id, mid=self.service.settings.mid,
                    currency=self.record.currency,
                )
            except InvalidResponseError as err:
                # charged, maybe, but not as asked: the interaction is over, reporting says
                return await self._answer_lost(unknown_outcome("charge", err), terminal_done=True)
            if result is None:
                return self.finish(
                    SaleState.ATTENTION, Step.CHARGE_CARD_UNKNOWN,
                    "the charge succeeded with no result: the agent looks for it in reporting "
                    f"{self.context.recheck.when()}, else a person decides ({RESOLVE})",
                )  # fmt: skip
            return await self._charged(result)
        if status == InteractionStatus.EXPIRED:
            return await self._fail(
                SaleState.FAILED, Step.CHARGE_CARD_EXPIRED, "no card was presented"
            )
        if status == InteractionStatus.CANCELLED:
            return await self._fail(SaleState.CANCELLED, Step.CHARGE_CARD_CANCELLED, "cancelled")
        return await self._fail(SaleState.FAILED, Step.CHARGE_CARD_FAULT, interaction.fault)

    async def _charged(self, result: ChargeResult) -> SaleEvent | None:
        if result.result == ChargeResultCode.RETRY:
            self.step(Step.CHARGE_CARD_ANSWER, detail={"result": "B"})
            return None
        if result.result != ChargeResultCode.APPROVED:
            return await self._fail(
                SaleState.DECLINED, Step.CHARGE_CARD_DECLINED, declined(result)
            )
        cents = self.approved_for_vend(Step.CHARGE_CARD_APPROVED, result, "vending up to")
        return await self._dispense_paid(cents)

    async def _dispense_paid(self, cents: int) -> SaleEvent:
        """Money is taken (charge_card): the dispense is confirmed or the money goes back."""
        if self.record.state is not SaleState.DISPENSING:  # cancelled once paid: no vend
            await self._deny("cancelled")
            await self.release_terminal(may_complete=False)  # the refund needs no terminal
            return await self.reverse("cancelled by the customer after paying")
        outcome = await self._dispense(cents)
        charged, asked = self.record.captured_cents, self.record.amount_cents
        if outcome.dispensed and charged > asked:
            # the service's answer says it took more than asked (a wrong unit, its fault): not
            # a sale to call paid; held until reporting says what was charged, or a person
            ended = self.finish(
                SaleState.ATTENTION,
                Step.DISPENSE_RESULT,
                f"dispensed, but the charge answered {format_cents(charged)} for the"
                f" {format_cents(asked)} asked; a person decides ({RESOLVE})",
                vended_cents=min(outcome.vended_cents or cents, cents),
                detail=outcome_detail(outcome),
            )
            await self.release_terminal(may_complete=False)
            return ended
        if outcome.dispensed:
            # the confirmation and the end are one write: no window where the journal knows the
            # goods came out but still looks like an unconfirmed dispense
            ended = self.finish(
                SaleState.COMPLETED,
                Step.COMPLETED,
                f"paid {_shown(cents)} and dispensed",
                vended_cents=outcome.vended_cents or cents,
                detail=outcome_detail(outcome),
            )
            await self.release_terminal(may_complete=True)  # a mailed receipt needs no terminal
            return ended
        self.not_dispensed(outcome, cents, self.request.product)
        await self.release_terminal(may_complete=False)
        return await self.reverse(f"dispense {outcome.status.value} {outcome.detail}".strip())
