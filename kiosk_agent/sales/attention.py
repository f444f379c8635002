"""Sales in ATTENTION: looked at again on a schedule, ended by themselves once the service's
records say what happened, or resolved by a person, who is journaled with their reason.

ATTENTION means the agent could not decide (reporting was down, a capture failed twice, a void
was refused). The truth usually becomes known later, so the sweeper asks reporting again:

- no charge under any of the sale's order ids, after its money call's deadline: FAILED;
- a charge already given back: REVERSED;
- a charge or authorization still holding money: captured when the machine confirmed the vend
  (``vended_cents``), else voided or refunded;
- reporting still cannot say: left for the next sweep.

A sweep moves money for a sale at most ``MAX_RETRIES`` times; after that only what reporting
shows is written down, and a person decides with ``kiosk-agent sales resolve``.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING

from kiosk_agent.data_class import data_class
from kiosk_agent.money import format_cents
from kiosk_agent.sales.clock import Anchor, Clock, elapsed_at_least
from kiosk_agent.sales.journal import Journal, JournalError, SaleMoved, SaleRecord
from kiosk_agent.sales.model import REFUNDED_NOTHING, REST_REFUSED, Flow, SaleEvent
from kiosk_agent.sales.settings import ATTENTION_RECHECK
from kiosk_agent.sales.states import NO_CHARGE_STEPS, SaleState, Step
from kiosk_agent.sales.steps import (
    RESOLVE,
    SWEEP_MONEY_RETRIES,
    SaleContext,
    SaleSteps,
    event_of,
    nothing_captured,
)
from kiosk_agent.service.errors import ServiceError
from kiosk_agent.tasks import BackgroundTask

if TYPE_CHECKING:
    from kiosk_agent.sales.reconcile import TransactionLookup

_LOGGER = logging.getLogger(__name__)

MAX_RETRIES = SWEEP_MONEY_RETRIES  # money calls a sweep may make for one sale, in all



# A sale that ended "no charge was made" after a lost answer is looked at again for this long:
# a service slower than its answer margin may still have charged.
LATE_CHARGE_WINDOW = 24 * 3600.0
# ... and the charge check takes over this long after the net let go (a charge the net never
# saw is then given back as any held under a sale that ended with no money moved): never both
# at once, whatever a sweep's lookups took.
LATE_CHARGE_HANDOVER_S = 3600.0


def late_charge_watched(clock: Clock, record: SaleRecord, extra: float = 0.0) -> bool:
    """Whether the sale's money call was sent less than ``LATE_CHARGE_WINDOW`` (+ ``extra``)
    ago in real time, or may have been: measured on the monotonic clock within a boot; after a
    reboot, at least as long as this boot has run, or (wall time) less than the window ago, so
    a step of the wall clock either way never drops a sale early."""
    window = LATE_CHARGE_WINDOW + extra
    sent = Anchor(record.sent_at or record.created_at, record.sent_mono, record.sent_boot)
    if elapsed_at_least(clock, sent) < window:
        return True
    return not sent.same_boot(clock) and clock.time() - sent.wall < window

# What a sweep meets in the field and tries again at the next one: the service failing or
# unreachable, the journal's disk. Anything else is a bug.
_OUTSIDE_FAULTS = (ServiceError, JournalError, sqlite3.Error)
# the steps _seen acts on: a sale into attention, or ended (out of it, or never in it)
_ATTENTION_OR_ENDED = frozenset(s for s in SaleState if s is SaleState.ATTENTION or s.final)


@data_class(slots=True)
class SweepStats:
    sweeps: int = 0
    ended: int = 0  # ATTENTION sales the sweeper ended by itself
    late_charges: int = 0  # charges found after their sale ended "no charge", given back
    errors: int = 0
    # of those, the ones no outside fault explains (not the service, not the disk): bugs,
    # counted in health's unexpected errors too
    unexpected: int = 0
    last_sweep_at: float | None = None
    last_error: str = ""


class AttentionSweeper:
    """Re-examines ATTENTION sales every ``interval`` seconds against reporting."""

    def __init__(self, context: SaleContext, interval: float = ATTENTION_RECHECK) -> None:
        self.context = context
        self.journal = context.journal
        self.interval = interval
        self.clock = context.clock
        self.stats = SweepStats()
        self._loop = BackgroundTask(self._run, "attention-sweeper")
        self.outside = OutsideResolutions(context, on_error=self._count_error)

    def start(self) -> None:
        self._loop.start()
        self.outside.start()

    async def stop(self) -> None:
        self.outside.stop()
        await self._loop.stop()

    async def _run(self) -> None:
        while True:  # not at once: on start, recovery goes first
            # an attention message written meanwhile says when the agent acts again
            self.context.recheck.next_at = self.clock.time() + self.interval
            await self.clock.sleep(self.interval)
            await self.sweep()

    async def sweep(self) -> list[SaleEvent]:
        """One pass over the ATTENTION sales; each one's error is counted, never fatal."""
        self.stats.sweeps += 1
        self.stats.last_sweep_at = self.clock.time()  # for display
        ended: list[SaleEvent] = []
        try:
            sales = self.journal.attention_sales()
        except (sqlite3.Error, JournalError) as err:  # a failing disk: health shows it too
            self._count_error(f"cannot read the journal: {err}")
            return ended
        for record in self._own(sales):
            try:
                event = await self.recheck(SaleSteps(record, self.context))
            except SaleMoved as err:  # a person resolved it (another process) as it was decided
                _LOGGER.info("sale %s: left alone: %s", record.sale_id, err)
                continue
            except Exception as err:
                _LOGGER.exception("sale %s: attention recheck failed", record.sale_id)
                self._count_error(f"sale {record.sale_id}: {type(err).__name__}: {err}", err)
                continue
            if event is not None and event.state is not SaleState.ATTENTION:
                self.stats.ended += 1
                ended.append(event)
        ended += await self._late_charges()
        return ended

    async def _late_charges(self) -> list[SaleEvent]:
        """Sales that ended "no charge was made" (a lost answer, reporting empty by the
        deadline): a service that committed later than ``answer_margin`` shows the charge now,
        and it is given back."""
        try:
            failed = self.journal.ended_by_steps(SaleState.FAILED, NO_CHARGE_STEPS)
        except (sqlite3.Error, JournalError) as err:
            self._count_error(f"cannot read the journal: {err}")
            return []
        suspects = [
            r for r in self._own(failed)
            if r.flow != Flow.ENROLL and r.trans_id is None and self._still_watched(r)
        ]
        given_back: list[SaleEvent] = []
        for record in suspects:
            steps = SaleSteps(record, self.context)
            try:
                lookup = await steps.reconciler.find_charge(record.all_order_ids())
                if not lookup.approved:
                    continue
                _LOGGER.warning(
                    "sale %s: a charge appeared after the sale ended with none; giving it back",
                    record.sale_id,
                )
                # found and reopened in one write (REVERSING): a crash before the void leaves
                # an open sale that recovery gives back, not a FAILED one holding money
                steps.charge_found(
                    Step.LATE_FOUND,
                    lookup.trans_id,
                    lookup.amount_cents,
                    state=SaleState.REVERSING,
                    refunded_before=lookup.refunded_before_cents,
                )
                given_back.append(
                    await steps.reverse("a charge the service made after the sale had ended")
                )
                self.stats.late_charges += 1
            except Exception as err:
                _LOGGER.exception("sale %s: late charge check failed", record.sale_id)
                self._count_error(f"sale {record.sale_id}: {type(err).__name__}: {err}", err)
        return given_back

    def _own(self, sales: list[SaleRecord]) -> list[SaleRecord]:
        """Only this unit's sales (sales/unit.py): another unit's money is never moved here."""
        unit = self.context.unit
        return [r for r in sales if unit.owns_sale(r.order_id)]

    def _still_watched(self, record: SaleRecord) -> bool:
        return late_charge_watched(self.clock, record)

    def _count_error(self, text: str, err: Exception | None = None) -> None:
        self.stats.errors += 1
        self.stats.last_error = text
        if err is not None and not isinstance(err, _OUTSIDE_FAULTS):
            self.stats.unexpected += 1

    async def recheck(self, steps: SaleSteps) -> SaleEvent | None:
        """Ask the service what became of one ATTENTION sale; its new end, or None."""
        record = steps.record
        if record.flow == Flow.ENROLL:
            return None  # reporting knows charges, not vaults or plans: a person decides
        retries, to_a_person = _money_retries(self.journal, record.sale_id)
        # a charge the check put to a person (it could not place it, or found too many to give
        # back unasked) is theirs: only what reporting shows is written, no money moved
        # (2026-11-30, i42-money-attack: the next sweep voided it, "money held without a
        # confirmed vend", under words saying the agent gives none back)
        may_move_money = retries < MAX_RETRIES and not to_a_person
        if record.trans_id is None:
            return await self._no_trans_id(steps, may_move_money)
        return await self._with_trans_id(steps, record.trans_id, may_move_money)

    async def _no_trans_id(self, steps: SaleSteps, may_move_money: bool) -> SaleEvent | None:
        # "no charge" counts only from a lookup sent after the deadline
        deadline = steps.answer_deadline()
        asked_at = self.clock.monotonic()
        lookup = await steps.reconciler.find_charge(steps.record.all_order_ids())
        if lookup.unknown and lookup.why and self._still_attention(steps):
            return self._undecided(steps, lookup.why)
        if lookup.unknown or not self._still_attention(steps):
            return None
        if lookup.approved:
            if not may_move_money:
                return None
            found = {"found": "charge", "trans_id": lookup.trans_id}
            steps.step(Step.ATTENTION_RECHECK, detail=found, if_state=SaleState.ATTENTION)
            steps.charge_found(Step.ATTENTION_FOUND, lookup.trans_id, lookup.amount_cents,
                               refunded_before=lookup.refunded_before_cents)
            return await steps.reverse("a charge found later in reporting, not vended")
        if lookup.reversed:
            return await steps.found_given_back(
                Step.ATTENTION_DONE, Step.ATTENTION_FOUND, lookup, "already given back",
                if_state=SaleState.ATTENTION,
            )
        if asked_at < deadline:
            return None  # the service may still answer the money call
        return steps.finish(
            SaleState.FAILED,
            Step.ATTENTION_DONE,
            "no charge was made (checked in reporting later)",
            if_state=SaleState.ATTENTION,
        )

    async def _with_trans_id(
        self, steps: SaleSteps, trans_id: str, may_move_money: bool
    ) -> SaleEvent | None:
        record = steps.record
        lookup = await steps.reconciler.transaction_state(trans_id)
        if not lookup.known or not self._still_attention(steps):
            return None
        if REST_REFUSED in record.message:
            return None  # the service refused the rest the agent named: a person decides
        if lookup.reversed:
            refunded = lookup.refunded
            if refunded and lookup.amount_cents == 0 and REFUNDED_NOTHING in record.message:
                return None  # said already: a person decides
            return steps.given_back_found(
                Step.ATTENTION_DONE, Step.ATTENTION_FOUND, "given back (found in reporting)",
                lookup, if_state=SaleState.ATTENTION,
            )
        vended = record.vended_cents
        if lookup.partly_refunded:
            return await self._partly_refunded(steps, lookup, may_move_money)
        if lookup.captured and vended:
            # what the capture asked: the vend (a charge-card's: its price, taken at once)
            asked = record.amount_cents if record.flow == Flow.CHARGE_CARD else vended
            # reporting naming no amount: the vend's; 0 is a figure (nothing taken)
            taken = vended if lookup.amount_cents is None else lookup.amount_cents
            if taken == 0:
                return self._captured_nothing(steps, vended)
            if taken > max(vended, asked):
                return None  # taken above what was asked: a person decides (the sale says so)
            return steps.finish(
                SaleState.COMPLETED,
                Step.ATTENTION_DONE,
                f"paid {format_cents(taken)} (found captured)",
                captured_cents=taken,
                if_state=SaleState.ATTENTION,
            )
        if not (lookup.captured or lookup.authorized) or not may_move_money:
            return None
        action = "capture" if lookup.authorized and vended else "reverse"
        steps.step(Step.ATTENTION_RECHECK, detail={"found": "held", "action": action},
                   if_state=SaleState.ATTENTION)
        if action == "capture":
            return await steps.capture(vended)
        return await steps.reverse("money held without a confirmed vend (found in reporting)")


    async def _partly_refunded(
        self, steps: SaleSteps, lookup: TransactionLookup, may_move_money: bool
    ) -> SaleEvent | None:
        """The sale's charge, reporting shows, partly refunded (by a person at the portal,
        say) while the sale waited here. Not vended, the rest is the customer's, still held:
        given back as the sale says it will be, what was refunded before journaled with it
        as when such a charge is found (``charge_found``). Vended, it was earned, and the
        refund is the merchant's own decision: nothing is moved. Refunds whose rows do not sum
        to more than nothing and less than the charge prove nothing: a person decides.
        (2026-11-30: neither held nor given back to the sweep, it stayed, the rest held, under
        words saying the agent would give it back.)"""
        charge = lookup.amount_cents
        before = sum(lookup.refunds_cents)
        # no refunds' rows sum to nothing: refused by 0 < before
        if steps.record.vended_cents or not may_move_money or not charge or not 0 < before < charge:
            return None
        steps.step(Step.ATTENTION_RECHECK, detail={"found": "partly refunded",
                                                  "action": "reverse"},
                   if_state=SaleState.ATTENTION, captured_cents=charge, reversed_cents=before)
        return await steps.reverse("money held without a confirmed vend (found in reporting)")

    def _undecided(self, steps: SaleSteps, why: str) -> SaleEvent | None:
        """What reporting shows, the agent cannot act on (a charge in a status it does not
        know): the sale says so, a person decides (written once; a later sweep finding the same
        writes nothing). Before, only the log said it, and the sale kept whatever message it
        had (none in a journal another tool wrote)."""
        if why in steps.record.message:
            return None
        return steps.finish(
            SaleState.ATTENTION, Step.ATTENTION_FOUND,
            f"{why}: the agent moves no money on it and asks again "
            f"{self.context.recheck.when()}; a person decides ({RESOLVE})",
            if_state=SaleState.ATTENTION,
        )

    def _captured_nothing(self, steps: SaleSteps, vended: int) -> SaleEvent | None:
        """Reporting shows the dispensed sale's capture made for $0.00: it stays for a person,
        its words saying so (written once: a later sweep finding the same writes nothing)."""
        words = nothing_captured(vended, self.context.recheck.when())
        record = steps.record
        if record.captured_cents == 0 and record.message.startswith(words.split(";")[0]):
            return None
        return steps.finish(SaleState.ATTENTION, Step.ATTENTION_FOUND, words,
                            captured_cents=0, if_state=SaleState.ATTENTION)

    def _still_attention(self, steps: SaleSteps) -> bool:
        """Whether nobody resolved the sale while reporting was asked (then: leave it be).

        Another process (``kiosk-agent sales resolve``) may still resolve it after this read:
        every write of the sweeper's that decides or moves money is therefore made only
        ``if_state=ATTENTION`` (checked in its transaction), and :class:`SaleMoved` leaves the
        sale to the person."""
        current = self.journal.get(steps.record.sale_id)
        if current is None or current.state is not SaleState.ATTENTION:
            return False
        steps.record = current
        return True


class OutsideResolutions:
    """ATTENTION sales resolved by another process (``kiosk-agent sales resolve`` beside the
    running agent) are published on the agent's bus, as the admin API's own resolutions are:
    health, the metrics, the status page and ``kiosk-agent events`` learn of them at the next
    :meth:`watch` (the agent's one watch of its journal, every second) instead of showing the
    sale in attention until the next start.

    A look costs one ``PRAGMA data_version`` while nobody else wrote the journal."""

    def __init__(
        self, context: SaleContext, on_error: Callable[[str, Exception], None] | None = None
    ) -> None:
        self.journal = context.journal
        self.events = context.events
        self._on_error = on_error  # the sweeper's count: a bug here is shown in health too
        self._attention: set[str] = set()  # the sales this agent last knew in ATTENTION
        self._version: int | None = None
        self._stop_listening: Callable[[], None] | None = None

    def start(self) -> None:
        self._stop_listening = self.events.listen(self._seen, kinds=_ATTENTION_OR_ENDED)
        try:
            self._version = self.journal.outside_writes()
            self._attention = {r.sale_id for r in self.journal.attention_sales()}
        except (sqlite3.Error, JournalError) as err:  # a failing disk: the next look reads it
            _LOGGER.warning("cannot read the sales in attention: %s", err)

    def stop(self) -> None:
        if self._stop_listening is not None:
            self._stop_listening()
            self._stop_listening = None

    def follow(self, sale_ids: list[str]) -> None:
        """Open sales a person may end too (another unit's: ``unit.others_open``)."""
        self._attention.update(sale_ids)

    def _seen(self, event: SaleEvent) -> None:
        if event.state is SaleState.ATTENTION:
            self._attention.add(event.sale_id)
        elif event.state.final:
            self._attention.discard(event.sale_id)

    def watch(self) -> None:
        """One :meth:`look` while started; a failing disk is the journal guard's to show, a bug
        is logged, counted and shown in health, and the next watch looks again."""
        if self._stop_listening is None:
            return
        try:
            self.look()
        except (sqlite3.Error, JournalError) as err:
            _LOGGER.debug("outside resolutions: cannot read the journal: %s", err)
        except Exception as err:
            _LOGGER.exception("outside resolutions: the look failed")
            if self._on_error is not None:
                self._on_error(f"outside resolutions: {type(err).__name__}: {err}", err)

    def look(self) -> list[SaleEvent]:
        """Publish the sales another process took out of ATTENTION since the last look."""
        version = self.journal.outside_writes()
        if version == self._version:
            return []
        published: list[SaleEvent] = []
        for sale_id in sorted(self._attention):
            record = self.journal.get(sale_id)
            if record is not None and (record.state is SaleState.ATTENTION
                                       or not record.state.final):
                continue  # still waiting for a person (another unit's: still open)
            self._attention.discard(sale_id)
            if record is not None:
                event = event_of(record, Step.ATTENTION_RESOLVED, clock=self.journal.clock)
                self.events.publish(event)
                published.append(event)
        self._version = version  # only once read whole: a failed look is tried again
        return published


def _money_retries(journal: Journal, sale_id: str) -> tuple[int, bool]:
    """The money calls sweeps made for the sale, and whether the charge check put it to a
    person (``audit.undecided``): then no sweep moves its money."""
    steps = [step.step for step in journal.steps(sale_id)]
    return steps.count(Step.ATTENTION_RECHECK), Step.AUDIT_UNDECIDED in steps
