"""Finding out what really happened to a charge, from the service's own records.

Used after a lost answer (by the flows) and after a crash (by recovery): a charge is never sent
again blind. Reporting is asked by the locally made ``order_id`` (or by ``trans_id``); when
reporting cannot answer, the lookup says *unknown* and the caller marks the sale for attention
rather than guessing. Only a row that is what was asked about counts (its order id or trans id,
this unit's merchant): an answer that disagrees with its question (a filter dropped, a next
page's link that lost it) never makes another sale's charge this one's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from kiosk_agent.data_class import data_class
from kiosk_agent.money import format_cents
from kiosk_agent.service.errors import ServiceError
from kiosk_agent.service.models.statuses import TransStatus
from kiosk_agent.service.trans_ids import trans_key

if TYPE_CHECKING:
    from kiosk_agent.service.client import ServiceClient
    from kiosk_agent.service.models.reporting import Transaction, TransactionFilter

# The reporting models are imported at the first lookup (after a lost answer, or in recovery),
# not with every agent: a sale that hears its answers never needs them.

_LOGGER = logging.getLogger(__name__)

# Rows that mean money was taken and is still held (trans_status_id: one contract, TransStatus).
_HELD = frozenset({TransStatus.AUTHORIZED, TransStatus.CAPTURED, TransStatus.SETTLED})
_REVERSED = frozenset({TransStatus.VOIDED, TransStatus.REFUNDED})
# A charge partly refunded (PARTIALLY_REFUNDED) still holds the rest: found under a sale's order
# id, it is a charge that holds money, given back as any other (2026-11-29, i39-money: "no
# charge was made", and the rest stayed on the customer's card).
_PARTLY_HELD = TransStatus.PARTIALLY_REFUNDED
# Rows under a sale's order id that hold none of its money: a give-back's own row (REFUND),
# a declined charge, a "retry" answer. A status the agent does not know is none of these, nor
# proof of no charge: the lookup says unknown, and a person decides.
_NONE_HELD = frozenset({TransStatus.REFUND, TransStatus.DECLINED, TransStatus.RETRY})


@data_class(frozen=True, slots=True)
class ChargeLookup:
    """What reporting knows about the charges made under a sale's order ids."""

    unknown: bool = False  # reporting could not be asked: decide nothing
    approved: bool = False  # a charge holding money exists
    trans_id: str | None = None
    amount_cents: int | None = None
    # a charge existed and was already given back (``trans_id``/``amount_cents`` name it)
    reversed: bool = False
    refunded: bool = False  # given back by a refund (its status), not a void
    # of a charge found partly refunded: what its refunds' rows show given back before the
    # agent looked (the rest, ``amount_cents`` less this, is what it still holds)
    refunded_before_cents: int = 0
    # unknown because of what reporting shows, not because it could not be asked: what a
    # person reads to act on (a row in a status the agent does not know), else empty
    why: str = ""


@data_class(frozen=True, slots=True)
class TransactionLookup:
    """What reporting knows about one transaction."""

    known: bool = False
    authorized: bool = False  # authorized, not captured
    captured: bool = False  # captured or settled
    reversed: bool = False  # voided or refunded
    # refunded, by its status (not by whether its refund's row was found: a refund's row
    # reporting does not show, or names the charge otherwise, is still a refund, not a void)
    refunded: bool = False
    # partly refunded (PARTIALLY_REFUNDED): the rest still held, what its refunds gave back
    # in ``refunds_cents``
    partly_refunded: bool = False
    reverse_trans_id: str | None = None
    amount_cents: int | None = None
    # of a refunded or partly refunded charge: its refunds' own rows' amounts, the latest
    # (``reverse_trans_id``'s) last; empty when reporting shows none, or one it cannot read
    refunds_cents: tuple[int, ...] = ()
    # who gave it back, as the service names them (``user_identifier``): of the latest
    # refund's own row, or of the voided row; "" when that row names no one, None when no
    # such row was found (a refund's row reporting does not show). The agent names itself
    # on each of its give-backs (sales/steps.py ``agent_user``)
    given_back_by: str | None = None
    # who made each of ``refunds_cents``, as its row names them ("" when it names no one)
    refunds_by: tuple[str, ...] = ()


class Reconciler:
    def __init__(self, service: ServiceClient, mid: str) -> None:
        self.service = service
        self.mid = mid

    async def _rows(self, query: TransactionFilter) -> list[Transaction] | None:
        try:
            return [row async for row in self.service.reporting.transactions(query)]
        except ServiceError as err:
            _LOGGER.warning("reporting lookup failed: %s", err)
            return None

    def _asked(
        self, rows: list[Transaction], asked: str, *, key: Callable[[Transaction], str | None],
        same: Callable[[str | None], str | None] = lambda value: value,
    ) -> list[Transaction]:
        """The rows that are what was asked about (the ``key`` of each is ``asked``, both
        compared as ``same`` writes them), of this unit's merchant when a row names one; the
        others, whatever reporting answered, are left out and said in the log."""
        wanted = same(asked)
        kept = [r for r in rows
                if same(key(r)) == wanted and (not r.mid or not self.mid or r.mid == self.mid)]
        if len(kept) != len(rows):
            _LOGGER.warning("reporting answered %d row(s) that are not %s: left out",
                            len(rows) - len(kept), asked)
        return kept

    async def find_charge(self, order_ids: list[str]) -> ChargeLookup:
        """The charge made under any of ``order_ids``, if one holds money.

        What reporting knows now: a caller that must wait out a money call's deadline asks
        again until then (``SaleSteps.settle_by_reporting``).
        """
        from kiosk_agent.service.models.reporting import TransactionFilter

        given_back: Transaction | None = None
        undecided = False
        why = ""
        for order_id in order_ids:
            rows = await self._rows(TransactionFilter(order_id=order_id))
            if rows is None:
                return ChargeLookup(unknown=True)
            for row in self._asked(rows, order_id, key=lambda r: r.order_id):
                status = row.status
                if status in _NONE_HELD:
                    continue
                if status is None or not (status in _HELD or status in _REVERSED
                                          or status is _PARTLY_HELD):
                    _LOGGER.warning("reporting shows %s under %s in status %r, which the agent "
                                    "does not know: it decides nothing on it",
                                    row.trans_id, order_id, row.trans_status_id)
                    undecided = True
                    why = why or (f"reporting shows {row.trans_id} under the sale's order id "
                                  f"{order_id} in status {row.trans_status_id!r}, which the "
                                  "agent does not know")
                elif not _readable(row):
                    undecided = True
                elif status in _REVERSED:
                    given_back = given_back or row
                elif status is _PARTLY_HELD:  # the rest still held: what was refunded?
                    before, odd = await self._refunded_before(row)
                    if before is None:
                        undecided = True
                        why = why or odd
                        continue
                    return ChargeLookup(approved=True, trans_id=row.trans_id,
                                        amount_cents=row.amount_cents,
                                        refunded_before_cents=before)
                else:  # held
                    return ChargeLookup(
                        approved=True, trans_id=row.trans_id, amount_cents=row.amount_cents
                    )
        if undecided:
            return ChargeLookup(unknown=True, why=why)
        if given_back is None:
            return ChargeLookup()
        return ChargeLookup(
            reversed=True, trans_id=given_back.trans_id, amount_cents=given_back.amount_cents,
            refunded=given_back.status is TransStatus.REFUNDED,
        )

    async def _refunded_before(self, charge: Transaction) -> tuple[int | None, str]:
        """What a partly refunded charge's refunds gave back, by their own rows (REFUND, naming
        it in ``related_trans_id``): more than nothing and less than the charge, else (or when
        reporting cannot say, or a row naming it is in a status the agent does not know) None,
        and nothing is decided on it; with it, what a person reads to act on (empty when
        reporting could not be asked). The agent's message says
        what it gave back and what it found given back before, each in exact amounts
        (2026-11-30: it said "$3.00 refunded" where it gave back the $2.00 left)."""
        from kiosk_agent.service.models.reporting import TransactionFilter

        rows = await self._rows(TransactionFilter(related_trans_id=charge.trans_id))
        if rows is None:
            return None, ""
        related = self._asked(rows, charge.trans_id, key=lambda r: r.related_trans_id,
                              same=trans_key)
        odd = [r for r in related if r.status is None]
        if odd:  # a give-back, or not: what the charge still holds cannot be told
            _LOGGER.warning("reporting shows %s, naming %s, in status %r, which the agent does "
                            "not know: it decides nothing on %s", odd[0].trans_id,
                            charge.trans_id, odd[0].trans_status_id, charge.trans_id)
            return None, (f"reporting shows {odd[0].trans_id}, naming the sale's charge "
                          f"{charge.trans_id} (partly refunded), in status "
                          f"{odd[0].trans_status_id!r}, which the agent does not know")
        refunds = [r for r in related if r.status is TransStatus.REFUND]
        if not all(_readable(r) for r in refunds):
            return None, (f"reporting shows a refund of the sale's charge {charge.trans_id} "
                          "for a figure the agent cannot read")
        before = sum(r.amount_cents for r in refunds)
        if 0 < before < charge.amount_cents:
            return before, ""
        _LOGGER.warning("reporting shows %s (%s) partly refunded, and its refunds' rows give "
                        "back %d cents of it: the agent decides nothing on it",
                        charge.trans_id, charge.amount, before)
        return None, (f"reporting shows the sale's charge {charge.trans_id} "
                      f"({format_cents(charge.amount_cents)}) partly refunded, and its refunds' "
                      f"rows give back {format_cents(before)} of it")

    async def transaction_state(self, trans_id: str) -> TransactionLookup:
        from kiosk_agent.service.models.reporting import TransactionFilter

        rows = await self._rows(TransactionFilter(trans_id=trans_id))
        row = next(iter(self._asked(rows or [], trans_id, key=lambda r: r.trans_id,
                                    same=trans_key)), None)
        if row is None or not _readable(row):
            return TransactionLookup()
        status = row.status
        reverse_id = None
        refunds: tuple[int, ...] = ()
        refunds_by: tuple[str, ...] = ()
        by = (row.user_identifier or "") if status is TransStatus.VOIDED else None
        if status in _REVERSED or status is _PARTLY_HELD:
            related = await self._rows(TransactionFilter(related_trans_id=trans_id)) or []
            back = self._asked(related, trans_id, key=lambda r: r.related_trans_id,
                               same=trans_key)
            own = _refunds_in_order(back)
            # the give-back that ended the charge's refunds: its latest refund's row (the others
            # a person's before it), else the latest row naming it (2026-11-30: the first row
            # found named a person's $1.00 refund as the agent's)
            last = (own or _in_order(back))[-1] if back else None
            reverse_id = last.trans_id if last is not None else trans_id
            if last is not None and status is not TransStatus.VOIDED:
                by = last.user_identifier or ""
            if all(r.status is not None and r.amount_cents >= 0 for r in back):
                refunds = tuple(r.amount_cents for r in own)
                refunds_by = tuple(r.user_identifier or "" for r in own)
        return TransactionLookup(
            known=True,
            authorized=status is TransStatus.AUTHORIZED,
            captured=status in (TransStatus.CAPTURED, TransStatus.SETTLED),
            reversed=status in _REVERSED,
            refunded=status is TransStatus.REFUNDED,
            partly_refunded=status is _PARTLY_HELD,
            reverse_trans_id=reverse_id,
            amount_cents=row.amount_cents,
            refunds_cents=refunds,
            given_back_by=by,
            refunds_by=refunds_by,
        )


def _refunds_in_order(rows: list[Transaction]) -> list[Transaction]:
    """A charge's refunds' own rows, the earliest first (by ``trans_date``, then as listed).
    Once a refund gives back all that was left no other can be made, so the agent's, when it
    ended the charge, is the last."""
    return _in_order([r for r in rows if r.status is TransStatus.REFUND])


def _in_order(rows: list[Transaction]) -> list[Transaction]:
    """``rows`` the earliest first: by ``trans_date`` (none: first), then as reporting lists
    them."""
    return [row for _, row in sorted(
        enumerate(rows), key=lambda n_row: (n_row[1].trans_at or float("-inf"), n_row[0]))]


def _readable(row: Transaction) -> bool:
    """Whether a charge's figure is one the agent can act on. A negative amount (a sign the
    interface never speaks of) is not a payment, a hold or a give-back of any size: the lookup
    decides nothing on it, and a person does (2026-11-29, i39-money: a capture reporting showed
    for -$1.75 ended its sale "dispensed and captured", -175 in the day's takings)."""
    if row.amount_cents >= 0:
        return True
    _LOGGER.warning("reporting shows %s for %s: not a figure the agent acts on",
                    row.trans_id, row.amount)
    return False
