"""Charges the journal cannot account for: found in reporting, given back or put to a person.

The journal is the agent's account of every charge; a journal that lost writes (its WAL
deleted, truncated, damaged and moved aside, a step that never reached the disk) may no longer
hold a charge the service still holds. So the agent asks reporting for its own recent charges
(the ones made on its terminals, under the order ids it makes: ``KA`` and 18 hex digits, with
``-N`` for a retried attempt) that still hold money (authorized or captured), and compares:

- a charge of a sale the journal holds, open or ended with money moved: accounted for;
- a charge of no sale at all: unaccounted. It is journaled as a new sale (``created``, then
  ``audit.found`` charging) and given back (void, or refund once settled), like any dispense
  that cannot be confirmed;
- a charge held under a sale the journal ended with no money moved (failed, declined,
  cancelled): the journal lost what moved it (a WAL deleted after the charge's step, say). That
  sale stays as it ended (final, the transition table), and the charge is given back under a
  sale of its own (order id suffixed ``-held``), as for a charge of no sale at all. The sales
  that ended on "no charge" after a lost answer are left to the late-charge net, whose own.

More than ``max_give_back`` unaccounted charges in one check smell of a wholesale mismatch (a
journal from another unit, a terminal shared with another agent): then none is given back and
each is put to a person (``attention``) instead.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field

from kiosk_agent.sales.journal import CHARGE_LOOKBACK_S, SaleRecord
from kiosk_agent.sales.model import Flow, SaleEvent
from kiosk_agent.sales.runner import new_ids
from kiosk_agent.sales.states import NO_CHARGE_STEPS, SaleState, Step
from kiosk_agent.sales.steps import SaleContext, SaleSteps
from kiosk_agent.service.errors import ServiceError
from kiosk_agent.service.models import Transaction, TransactionFilter, TransStatus

_LOGGER = logging.getLogger(__name__)

# The order ids this agent makes (flows.new_ids), with a retried attempt's suffix.
ORDER_ID = re.compile(r"^(KA[0-9A-F]{18})(?:-(\d+))?$")
_UNSETTLED = (TransStatus.AUTHORIZED, TransStatus.CAPTURED)
_HOLDING = (*_UNSETTLED, TransStatus.SETTLED)
# Ended sales that say no money moved: a charge held under one is unaccounted.
_NO_MONEY = frozenset({SaleState.FAILED, SaleState.DECLINED, SaleState.CANCELLED})
AUDIT_SOURCE = "audit"
# The order id of the sale that gives back a charge held under an ended no-money sale.
HELD_SUFFIX = "-held"


@dataclass(slots=True)
class AuditResult:
    """One check: how many charges reporting showed, and what became of the unaccounted."""

    at: float
    seen: int = 0
    unaccounted: list[str] = field(default_factory=list)  # trans ids
    events: list[SaleEvent] = field(default_factory=list)
    error: str = ""  # reporting could not be asked: nothing was decided

    @property
    def ok(self) -> bool:
        return not self.error

    def as_dict(self) -> dict[str, object]:
        return {
            "at": self.at,
            "seen": self.seen,
            "unaccounted": len(self.unaccounted),
            "ended": {e.sale_id: e.state.value for e in self.events},
            "error": self.error,
        }


class ChargeAudit:
    """Compares reporting's recent charges on this unit's terminals with the journal."""

    def __init__(
        self,
        context: SaleContext,
        *,
        lookback: float = CHARGE_LOOKBACK_S,
        max_give_back: int = 5,
    ) -> None:
        self.context = context
        self.journal = context.journal
        self.settings = context.settings
        self.lookback = lookback
        self.max_give_back = max_give_back
        self.last: AuditResult | None = None
        self.given_back = 0
        # ended sales (no money moved, says the journal) whose charge reporting still holds
        self.held_under_ended: set[str] = set()

    async def check(self, running: Collection[str] = (), settled: bool = True) -> AuditResult:
        """One comparison; ``running``: sale ids in flight now (their charges are accounted).

        ``settled`` False asks only for the charges not yet settled (authorized, captured): a
        few rows a terminal, where the settled are every charge it ever made (reporting cannot
        be asked for a date range), thousands a year on a busy machine."""
        result = AuditResult(at=time.time())
        try:
            held = await self._held_charges(settled)
        except ServiceError as err:
            result.error = f"reporting could not be asked: {err}"
            _LOGGER.warning("charge check: %s", result.error)
            self.last = result
            return result
        result.seen = len(held)
        found = [(row, record) for row in held if (record := self._unaccounted(row, running))]
        give_back = len(found) <= self.max_give_back
        for row, record in found:
            result.unaccounted.append(row.trans_id)
            event = await self._settle(row, record, give_back, len(found))
            result.events.append(event)
        if found:
            _LOGGER.warning("charge check: %d charge(s) the journal did not hold: %s",
                            len(found), ", ".join(f"{e.sale_id} {e.state.value}"
                                                  for e in result.events))
        self.last = result
        return result

    async def _held_charges(self, settled: bool) -> list[Transaction]:
        rows: dict[str, Transaction] = {}
        newest = 0.0  # the service's latest charge on these terminals: real time, at most now
        for device in self.settings.terminals:
            async for row in self._terminal_rows(device, settled):
                if row.trans_date is not None:
                    newest = max(newest, row.trans_date.timestamp())
                if row.status in _HOLDING and ORDER_ID.match(row.order_id or ""):
                    rows[row.trans_id] = row
        # The window ends now by this unit's clock, or at the service's latest charge when that
        # is later: a clock not yet set by NTP (a Pi booted from a new card: its image's date,
        # or 1970) would stretch it over the terminals' whole history, and every charge of a
        # sale made before this journal (pruned, or on the card replaced) would look lost.
        since = max(time.time(), newest) - self.lookback
        return [
            row for row in rows.values()
            if row.trans_date is None or row.trans_date.timestamp() >= since
        ]  # fmt: skip

    async def _terminal_rows(self, device: str, settled: bool) -> AsyncIterator[Transaction]:
        """The terminal's rows that may hold money. With the settled: one query, the statuses
        picked by the caller (``q`` is equalities only; a query for each status was three round
        trips, and the answer is the terminal's whole history either way). Without: one query
        for each status not yet settled, each answer small."""
        mid, reporting = self.settings.mid, self.context.service.reporting
        if settled:
            async for row in reporting.transactions(
                TransactionFilter(mid=mid, terminal_id=device)
            ):
                yield row
            return
        for status in _UNSETTLED:
            query = TransactionFilter(mid=mid, terminal_id=device, trans_status_id=status)
            async for row in reporting.transactions(query):
                yield row

    def _unaccounted(self, row: Transaction, running: Collection[str]) -> SaleRecord | None:
        """The sale to settle it under (a new one), or None: accounted for, or not ours to
        move (a sale the journal ended with no money moved is final; the late-charge net and
        people look at those, and the check says so in its result)."""
        match = ORDER_ID.match(row.order_id or "")
        assert match is not None
        record = self.journal.by_order_id(match.group(1))
        if record is None:
            return self._new_record(row, match.group(1), int(match.group(2) or 1))
        if record.sale_id in running or record.state not in _NO_MONEY:
            return None
        steps = self.journal.steps(record.sale_id)
        if steps and steps[-1].step in NO_CHARGE_STEPS:
            return None  # the late-charge net's: it reopens the sale itself
        held = f"{match.group(1)}{HELD_SUFFIX}"
        if self.journal.by_order_id(held) is not None:
            return None  # given back (or being given back) under its own sale already
        self.held_under_ended.add(record.sale_id)
        return self._new_record(row, held, 1)

    def _new_record(self, row: Transaction, order_id: str, attempt: int) -> SaleRecord:
        device = row.terminal_id or next(iter(self.settings.terminals), "")
        sale_id, _ = new_ids()
        # a charge-card sale whatever the charge was: voiding an authorization or a capture is
        # the same call, and the table lets a charge-card sale go STARTED > CHARGING > back
        return SaleRecord(
            sale_id=sale_id,
            order_id=order_id,
            source=AUDIT_SOURCE,
            flow=Flow.CHARGE_CARD.value,
            terminal=device,
            amount_cents=row.amount_cents,
            state=SaleState.STARTED,
            attempt=attempt,
            currency=self.settings.currency,
            message="a charge in reporting the journal did not hold",
        )

    async def _settle(
        self, row: Transaction, record: SaleRecord, give_back: bool, found: int
    ) -> SaleEvent:
        detail = {"trans_id": row.trans_id, "order_id": row.order_id,
                  "status": row.status.name if row.status else None}
        record = self.journal.create(record, detail)
        steps = SaleSteps(record, self.context)
        cents = row.amount_cents
        steps.step(Step.AUDIT_FOUND, SaleState.CHARGING, detail=detail, trans_id=row.trans_id,
                   authorized_cents=cents, captured_cents=cents)
        if not give_back:
            return steps.finish(
                SaleState.ATTENTION, Step.AUDIT_UNDECIDED,
                f"a charge the journal did not hold ({found} such in one check: too many to "
                "give back unasked); a person decides now (`kiosk-agent sales resolve`)",
            )
        event = await steps.reverse("a charge the journal did not hold; not known dispensed")
        if event.state is SaleState.REVERSED:
            self.given_back += 1
        return event
