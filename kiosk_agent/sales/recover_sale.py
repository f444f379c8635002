"""One open sale driven to an end, by what its journal's last step says might have happened
and what the service says did (the rules: sales/recovery.py). Imported by
``Recovery.recover`` for the first open sale a start finds, or a sale whose step could not be
written: a start that finds none, most of them, never loads it (docs/architecture.md, "Idle
memory: tenth round")."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from kiosk_agent.sales.journal import SaleRecord
from kiosk_agent.sales.model import Flow, SaleEvent
from kiosk_agent.sales.states import RECOVERY_REPORTING, SaleState, Step
from kiosk_agent.sales.steps import RESOLVE, SaleContext, SaleSteps
from kiosk_agent.service.errors import InvalidResponseError, ServiceError
from kiosk_agent.service.models import (
    ChargeResultCode,
    Interaction,
    InteractionKind,
    InteractionStatus,
)
from kiosk_agent.service.parsing import charge_card_result


class HeldOrNone(Protocol):
    """:meth:`SaleRecoverer._held_or_none`: the money held given back (or found not taken),
    ``told`` (a maybe late vend) journaled with the give-back's decision."""

    def __call__(self, steps: SaleSteps, why: str, *,
                 told: Mapping[str, Any] | None = None) -> Awaitable[SaleEvent]: ...


# Recovery's listening for a vend a restart left in flight, given the way to settle without it
Dispensing = Callable[[SaleSteps, HeldOrNone], Awaitable[SaleEvent]]
# a sale's maybe late vend still to be told (its note's detail), or None (Recovery._unheard)
Unheard = Callable[[SaleRecord], dict[str, Any] | None]
# told once its note is journaled (LateVendWatch.noted: the log line, health)
Told = Callable[[str, Mapping[str, Any]], None]


_LOGGER = logging.getLogger("kiosk_agent.sales.recovery")  # its lines, as before the move

# A sale whose money call never left because its request step could not be journaled: ended
# at once, where it waited the call's answer window (17 s on a unit, its reader held out).
UNSENT_WHY = ("the {} was never sent: the journal could not write its request (disk full or "
              "read-only); no money moved")


class SaleRecoverer:
    """Drives open sales to an end on one sale context (the service, settings and clock)."""

    def __init__(self, context: SaleContext, dispensing: Dispensing, unheard: Unheard,
                 told: Told) -> None:
        self.context = context
        self.dispensing = dispensing  # a sale left dispensing: Recovery listens for its vend
        self.unheard = unheard
        self.told = told

    async def recover(self, steps: SaleSteps, *, unsent: bool = False) -> SaleEvent:
        """Drive one open sale to an end. ``unsent``: its money call (``authorize.request``,
        ``charge_card.request``) was journaled only from memory once the journal took writes
        again, and no earlier one was on disk: it never left (a call is sent only once its step
        is on disk), so no charge can exist and none is waited for."""
        record = steps.record
        steps.step(Step.RECOVERY_START, detail={"state": record.state.value})
        state = record.state
        if (unsent and state in (SaleState.AUTHORIZING, SaleState.CHARGING)
                and record.trans_id is None):
            call = "authorization" if state is SaleState.AUTHORIZING else "charge"
            return steps.finish(SaleState.FAILED, Step.RECOVERY_DONE, UNSENT_WHY.format(call))
        if state is SaleState.STARTED:
            return steps.finish(
                SaleState.FAILED, Step.RECOVERY_DONE, "interrupted before any payment"
            )
        if state is SaleState.READING_CARD:
            await self._cancel_read(steps)
            return steps.finish(
                SaleState.FAILED,
                Step.RECOVERY_DONE,
                "interrupted while reading the card; no money moved",
            )
        if state is SaleState.ENROLLING:
            return steps.finish(
                SaleState.ATTENTION,
                Step.RECOVERY_UNDECIDED,
                "interrupted while saving the card; the vault or plan may exist",
            )
        if state is SaleState.CHARGING or (
            state is SaleState.UNRESOLVED and record.flow == Flow.CHARGE_CARD
        ):
            return await self._charging(steps)
        if state is SaleState.UNRESOLVED:
            return await self._held_or_none(steps, "the authorization's answer was lost")
        if state is SaleState.AUTHORIZING:
            return await self._held_or_none(steps, "interrupted during the authorization")
        if state is SaleState.DISPENSING:
            return await self.dispensing(steps, self._held_or_none)
        if state is SaleState.CAPTURING:
            return await self._capturing(steps)
        if state is SaleState.REVERSING:
            return await self._reversing(steps)
        return steps.finish(SaleState.ATTENTION, Step.RECOVERY_UNDECIDED, f"unknown state {state}")

    async def _cancel_read(self, steps: SaleSteps) -> None:
        if steps.record.interaction_id is None:
            # sent, its answer never heard: the read may still wait for a card (lost_reads.py)
            self.context.lost_reads.lost(steps.device, self.context.settings.interaction_lifetime)
            return
        try:
            await self.context.service.terminal.cancel(steps.device, steps.record.interaction_id)
        except ServiceError as err:
            _LOGGER.info("sale %s: read-card not cancelled: %s", steps.record.sale_id, err)

    async def _charging(self, steps: SaleSteps) -> SaleEvent:
        """A charge-card was (maybe) sent: its interaction, then reporting, say what happened."""
        record = steps.record
        if record.trans_id is not None:
            return await steps.reverse("interrupted after the charge, before the dispense")
        if record.interaction_id is not None and record.flow == Flow.CHARGE_CARD:
            interaction = await self._final_interaction(steps)
            if interaction is not None:
                return await self._charge_interaction_ended(steps, interaction)
        # reporting is asked until the charge's journaled deadline: a charge-card still running
        # on the terminal may yet charge
        return await self._held_or_none(steps, "interrupted while the charge was sent")

    async def _final_interaction(self, steps: SaleSteps) -> Interaction | None:
        """The interaction's final record, polling while it is pending, until the charge's
        journaled deadline (monotonic, re-anchored across a restart: sales/deadlines.py)."""
        deadline = steps.answer_deadline()
        clock = self.context.clock
        pause = max(0.1, min(2.0, self.context.settings.interaction_lifetime / 100))
        while True:
            interaction = await steps.interaction_status(InteractionKind.CHARGE_CARD)
            if interaction is None:
                return None
            if interaction.finished or clock.monotonic() > deadline:
                return interaction if interaction.finished else None
            await clock.sleep(min(pause, max(0.0, deadline - clock.monotonic())))

    async def _charge_interaction_ended(
        self, steps: SaleSteps, interaction: Interaction
    ) -> SaleEvent:
        if interaction.status == InteractionStatus.SUCCEEDED:
            try:
                result = charge_card_result(
                    interaction, steps.record.attempt_order_id(),
                    mid=self.context.service.settings.mid, currency=steps.record.currency,
                )
            except InvalidResponseError as err:
                # charged, maybe, but not as asked: the sale's own order id in reporting says
                return await self._held_or_none(steps, f"the charge's result: {err}")
            if result is not None and result.result == ChargeResultCode.APPROVED:
                steps.charge_found(Step.RECOVERY_CHARGED, result.trans_id, result.amount)
                return await steps.reverse("charged while the agent was down; not dispensed")
            if result is not None and result.result == ChargeResultCode.DECLINED:
                return steps.finish(SaleState.DECLINED, Step.RECOVERY_DONE, "the card was declined")
            return steps.finish(
                SaleState.FAILED,
                Step.RECOVERY_DONE,
                "the card asked to retry; the customer is gone",
            )
        if interaction.status == InteractionStatus.CANCELLED:
            return steps.finish(
                SaleState.CANCELLED, Step.RECOVERY_DONE, "cancelled on the terminal"
            )
        return steps.finish(
            SaleState.FAILED,
            Step.RECOVERY_DONE,
            f"the charge ended {interaction.status}; no money moved",
        )

    async def _held_or_none(self, steps: SaleSteps, why: str, *,
                            told: Mapping[str, Any] | None = None) -> SaleEvent:
        """Money may be held: reverse it when reporting shows it, FAILED when it shows none
        (once the money call's deadline has passed). ``told``: a maybe late vend, journaled in
        the give-back's first commit (a sale with no charge id: before reporting is asked)."""
        if steps.record.trans_id is not None:
            return await steps.reverse(why, told)
        if told is not None:
            steps.step(Step.LATE_VEND, detail=told)
        return await steps.settle_by_reporting(why, RECOVERY_REPORTING)

    async def _capturing(self, steps: SaleSteps) -> SaleEvent:
        """The dispense was confirmed; the capture was (maybe) sent: make sure it happened."""
        record = steps.record
        if record.trans_id is None:
            raise RuntimeError(f"sale {record.sale_id}: no transaction id to look up")
        lookup = await steps.reconciler.transaction_state(record.trans_id)
        asked = record.vended_cents or record.authorized_cents
        # reporting naming no amount is the capture as asked; 0 is a figure: nothing taken
        taken = asked if lookup.amount_cents is None else lookup.amount_cents
        if lookup.captured and taken == 0:
            return steps.captured_nothing(asked, Step.RECOVERY_UNDECIDED)
        if lookup.captured and taken > asked:
            return steps.captured_above("reporting shows captured", taken, asked)
        if lookup.captured:
            return steps.finish(
                SaleState.COMPLETED,
                Step.RECOVERY_DONE,
                "dispensed and captured before the interruption",
                captured_cents=taken,
            )
        if lookup.authorized:
            return await steps.capture(record.vended_cents or record.authorized_cents)
        return steps.finish(
            SaleState.ATTENTION,
            Step.RECOVERY_UNDECIDED,
            "dispensed, but reporting shows the authorization neither open nor captured "
            "(unreachable, or not there yet); the agent asks reporting again "
            f"{steps.context.recheck.when()} and captures it if it is open, else a person "
            f"decides ({RESOLVE})",
        )

    async def _reversing(self, steps: SaleSteps) -> SaleEvent:
        """A give-back interrupted: finished once. A vend its journal says was approved and
        never heard end (``unheard_vend``) is told to a person in the commit that ends it, by
        whichever path the give-back was decided (recovery's own writes the note with its
        request; a journal of an earlier release, or a flow's error, may hold none)."""
        record = steps.record
        if record.trans_id is None:
            raise RuntimeError(f"sale {record.sale_id}: no transaction id to look up")
        lookup = await steps.reconciler.transaction_state(record.trans_id)
        told = self.unheard(steps.record)
        if lookup.reversed:
            # the charge's row names its whole amount: of a charge found partly refunded, the
            # agent gave back only the rest (2026-11-30: reversed 400 cents of a $3.00 charge)
            with steps.told_in_one_commit(told):
                ended = steps.given_back_found(
                    Step.RECOVERY_DONE, Step.RECOVERY_UNDECIDED, f"{record.message}; given back",
                    lookup,
                )
        else:
            ended = await steps.reverse(
                record.message or "interrupted while giving the money back", told)
        if told is not None:
            self.told(record.sale_id, told)
        return ended
