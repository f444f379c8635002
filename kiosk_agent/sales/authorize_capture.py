"""authorize_capture (vending): read the card, hold the price, vend, capture what was vended.

READING_CARD -> AUTHORIZING -> DISPENSING -> CAPTURING -> COMPLETED; a vend that failed, was
cancelled or timed out: REVERSING -> REVERSED (the hold is voided).
"""

from __future__ import annotations

import logging

from kiosk_agent.money import format_cents
from kiosk_agent.sales.live import SaleFlow, declined, outcome_detail
from kiosk_agent.sales.model import DispenseOutcome, DispenseStatus, SaleEvent, vend_refusal
from kiosk_agent.sales.states import AUTHORIZE_REPORTING, SaleState, Step
from kiosk_agent.sales.steps import unknown_outcome
from kiosk_agent.service.errors import OUTCOME_UNKNOWN, ServiceError
from kiosk_agent.service.models import ChargeRequest, ChargeResult, ChargeResultCode

_LOGGER = logging.getLogger(__name__)


class AuthorizeCaptureFlow(SaleFlow):
    """Hold the most the machine may vend, then capture only what it confirms."""

    reporting = AUTHORIZE_REPORTING

    def opening(self) -> None:
        self.ask_for_card()  # with the sale: one commit

    async def sell(self) -> SaleEvent:
        card, ended = await self.read_card()
        if ended is not None:
            return ended
        if self.request.chosen_at_machine:  # card first: tapped, the customer waits for C,START
            self.customer_waits()
        amount = self.record.amount_cents
        result: ChargeResult | None = None
        for attempt in range(1, self.settings.retries + 2):
            # what leads to the authorization and its intent: one commit, before it is sent;
            # published once its request is on the wire (the page is a turn behind the journal)
            with self.one_commit(announce_after_send=True):
                if attempt == 1:
                    self.card_read(card)
                else:
                    self.step(Step.AUTHORIZE_RETRY, attempt=attempt)
                order_id = self.record.attempt_order_id()
                self.step(
                    Step.AUTHORIZE_REQUEST,
                    SaleState.AUTHORIZING,
                    f"authorizing {format_cents(amount)}",
                    detail={"order_id": order_id, "amount_cents": amount},
                    **self.sending(),
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
            except OUTCOME_UNKNOWN as err:
                # the card was read: the terminal is done; the payments API decides the rest
                return await self._answer_lost(
                    unknown_outcome("authorization", err), terminal_done=True
                )
            except ServiceError as err:
                return await self._fail(SaleState.FAILED, Step.AUTHORIZE_REFUSED, f"refused: {err}")
            if result.result != ChargeResultCode.RETRY:
                break
            self.step(Step.AUTHORIZE_ANSWER, detail={"result": "B"})
        if result is None:
            raise RuntimeError("the authorization was never asked")
        if result.result == ChargeResultCode.RETRY:
            return await self._fail(
                SaleState.DECLINED, Step.AUTHORIZE_RETRIES, "retry limit reached"
            )
        if not result.approved:
            return await self._fail(SaleState.DECLINED, Step.AUTHORIZE_DECLINED, declined(result))
        cents = self.approved_for_vend(Step.AUTHORIZE_APPROVED, result, "vend up to")
        return await self._vend_authorized(cents)

    async def _vend_authorized(self, authorized: int) -> SaleEvent:
        if self.record.state is not SaleState.DISPENSING:  # cancelled once authorized: no vend
            await self._deny("cancelled")
            await self.release_terminal(may_complete=False)  # the void needs no terminal
            return await self.reverse("cancelled by the customer")
        price, product = self.record.amount_cents, self.request.product
        if self.request.chosen_at_machine:  # card first: the price comes with the choice
            chosen = await self._choose(authorized)
            if isinstance(chosen, DispenseOutcome):
                return await self._not_dispensed(chosen)
            price, product = chosen.amount_cents, chosen.product
        refused = vend_refusal(price, authorized, product)
        if refused:
            # a partial authorization, or a choice the card does not cover: no vend. Journaled
            # as the vend's end before the machine is told no, so that a kill during the
            # give-back leaves no approved vend unheard (recovery.unheard_vend would tell a
            # person it may have gone out; 2026-11-30, i41-review-money)
            self.step(Step.DISPENSE_RESULT, detail=outcome_detail(
                DispenseOutcome(DispenseStatus.CANCELLED, detail=refused)))
            await self._deny(refused)
            await self.release_terminal(may_complete=False)
            return await self.reverse(refused)
        if self.request.chosen_at_machine:
            self._chosen(product, price)
        outcome = await self._dispense(authorized)
        if not outcome.dispensed:
            return await self._not_dispensed(outcome, price, product)
        # the capture needs no terminal: the next customer may start (unless a receipt prints)
        await self.release_terminal(may_complete=True)
        vended = outcome.vended_cents or authorized
        if vended > authorized:
            # never capture more than authorized: capture what we may and say so
            _LOGGER.warning(
                "sale %s: vended %d above authorized %d", self.record.sale_id, vended, authorized
            )
            vended = authorized
        # capture() journals the confirmed vend (CAPTURING) before it calls the service
        return await self.capture(vended, outcome_detail(outcome))

    def _chosen(self, product: str | None, price: int) -> None:
        """Card first: the customer's choice, journaled before its vend is approved (C,VEND, in
        this turn), published at the next: what recovery needs to listen for that vend after a
        restart on this boot (sales/recovery.py), its price and when it was approved (this
        clock's monotonic time). Committed without an fsync of its own (``UNSYNCED_STEPS``): a
        kill keeps it; a power cut, which may lose it, ends the boot that could hear the vend."""
        named = self.named(product)  # the product as the journal keeps it (bounded)
        shown = named.get("product") or self.record.product
        vend = f"vend {shown} {format_cents(price)}" if shown else f"vend {format_cents(price)}"
        self.step_next_turn(
            Step.DISPENSE_CHOSEN, message=vend, **named,
            detail={"product": shown, "cents": price, "mono": self.clock.monotonic()})

    async def _not_dispensed(self, outcome: DispenseOutcome, price: int | None = None,
                             product: str | None = None) -> SaleEvent:
        self.not_dispensed(outcome, price or self.record.amount_cents, product,
                           **self.named(outcome.product))
        await self.release_terminal(may_complete=False)
        return await self.reverse(f"dispense {outcome.status.value} {outcome.detail}".strip())
