"""Charges the journal cannot account for: found in reporting, given back or put to a person.

The journal is the agent's account of every charge; a journal that lost writes (its WAL
deleted, truncated, damaged and moved aside, a step that never reached the disk) may no longer
hold a charge the service still holds. So the agent asks reporting for its own recent charges
(the ones made on its terminals, under order ids provably its own: sales/unit.py) that still
hold money (authorized or captured), and compares:

- a charge of a sale the journal holds, open or ended with money moved: accounted for;
- a charge of no sale at all: unaccounted. It is journaled as a new sale (``created``, then
  ``audit.found`` charging) and given back (void, or refund once settled), like any dispense
  that cannot be confirmed; the machine may have vended it, so a person is told as of every
  other maybe (a ``late.vend`` note in the give-back's commit: ``lost_sale_note``) unless the
  journal proves no vend for it (``_no_vend_journaled``);
- a charge held under a sale the journal ended with no money moved (failed, declined,
  cancelled): the journal lost what moved it (a WAL deleted after the charge's step, say). That
  sale stays as it ended (final, the transition table), and the charge is given back under a
  sale of its own (order id suffixed ``-held``), as for a charge of no sale at all. The sales
  that ended on "no charge" after a lost answer are left to the late-charge net while it
  watches them (a day of real time, and an hour's handover after it); a charge it never saw
  is then given back here.

Only charges provably this unit's are compared (sales/unit.py): an order id carrying its unit
id, or one of the older form (no unit id) that the journal holds. Every other charge on its
terminals is another program's or unit's (a reader shared, a cloned SD card, an older journal's
charge it cannot place): counted, shown (:class:`ForeignCharges`), never reversed and never put
in attention as its own.

More than ``max_give_back`` unaccounted charges of its own in one check smell of a wholesale
mismatch: then none is given back and each is put to a person (``attention``) instead.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import field, replace
from typing import Any

from kiosk_agent.data_class import data_class
from kiosk_agent.moments import display_time
from kiosk_agent.money import CURRENCY, format_cents
from kiosk_agent.sales.attention import LATE_CHARGE_HANDOVER_S, late_charge_watched
from kiosk_agent.sales.clock import next_turn
from kiosk_agent.sales.journal import CHARGE_LOOKBACK_S, SaleRecord
from kiosk_agent.sales.journal_reads import OrderState
from kiosk_agent.sales.journal_records import Later
from kiosk_agent.sales.late_vends import maybe_note
from kiosk_agent.sales.model import Flow, SaleEvent
from kiosk_agent.sales.runner import new_ids
from kiosk_agent.sales.settings import CHARGE_CHECK_MAX_GIVE_BACK
from kiosk_agent.sales.states import NO_CHARGE_STEPS, SaleState, Step
from kiosk_agent.sales.steps import SaleContext, SaleSteps, agent_user, event_of, given_back_by
from kiosk_agent.sales.unit import split_order_id
from kiosk_agent.service.errors import ServiceError
from kiosk_agent.service.models import Transaction, TransactionFilter, TransStatus
from kiosk_agent.service.trans_ids import trans_key
from kiosk_agent.tasks import read_ahead

_LOGGER = logging.getLogger(__name__)

_UNSETTLED = (TransStatus.AUTHORIZED, TransStatus.CAPTURED)
_HOLDING = (*_UNSETTLED, TransStatus.SETTLED)
# what counts as a charge of another program or unit: money taken, whatever became of it since
_CHARGES = frozenset({*_HOLDING, TransStatus.VOIDED, TransStatus.REFUNDED,
                      TransStatus.PARTIALLY_REFUNDED})
# A terminal stays shown as shared until no charge of another program or unit, dated within
# this long of the latest seen, remains (the service's dates; docs/journal.md).
FOREIGN_QUIET_S = 24 * 3600.0
_FOREIGN_NAMED = 3  # order ids named in the problem
_SHOWN_MAX = 40  # characters of another program's order id shown
# Reporting's rows decided at a time: one read of the journal for their order ids, then the
# event loop's turn (a page of 500 held it 0.2 s: sales waited)
CHUNK_ROWS = 50
# Reporting's rows a page, for the check's own reads (the client's default is 500): a page of
# 500 models and its text held 2.6 MB at once, one read ahead beside it, and the heap the agent
# grew to for it stayed after the check (docs/architecture.md, "The charge check's step")
CHECK_PAGE_SIZE = 100
# ... but the start's first check, which the triggers wait for, reads the client's own pages
# (None: its DEFAULT_PAGE_SIZE, 500): a start after a busy stretch (20,000 captured charges not
# yet settled) asked 200 pages of 100, each a round trip the start waited for (some 10 s over
# the internet, against its 5 s bound). Its heap is the start's, grown once
# (docs/architecture.md, "Start-up: sixth round")
START_CHECK_PAGE_SIZE: int | None = None
# ... and the triggers wait for it only while it has read at most this many of reporting's rows
# (a page of the client's): a unit's day of unsettled charges, a few hundred, is compared before
# the first customer as ever; a busy day's thousands (20,000: 40 pages, each a round trip, and
# some 45 us of a core a row here, held a second start 4.8 s before READY=1) are read on while
# the unit sells, as the settled are and every later check is (docs/journal.md)
START_WAIT_ROWS = 500
# The unsettled charges' queries (two a terminal, a few rows each) this many in flight together,
# within the client's rate limit: one after the other, the start's first check waited for sixteen
# round trips on eight terminals before the triggers started (a second or more over the
# internet). Each in flight holds a connection of its own (HTTP/1.1): a TLS handshake each on a
# small computer's core, so a few, not all
UNSETTLED_AHEAD = 4
# Ended sales that say no money moved: a charge held under one is unaccounted.
_NO_MONEY = frozenset({SaleState.FAILED, SaleState.DECLINED, SaleState.CANCELLED})
AUDIT_SOURCE = "audit"
# The ends a sale's own flow writes on an answer that approves no vend: the service declined
# the charge, or reporting showed none after a lost answer (not recovery's: a sale recovery
# ended may have lost its later steps with the journal, a vend among them)
_FLOW_NO_VEND_ENDS = frozenset({Step.CHARGE_CARD_DECLINED, Step.AUTHORIZE_DECLINED,
                                Step.CHARGE_CARD_NONE, Step.AUTHORIZE_NONE})
# a vend asked of the machine (selection first) or chosen (card first)
_VEND_ASKED = frozenset({Step.DISPENSE_REQUEST, Step.DISPENSE_CHOSEN})
# The order id of the sale that gives back a charge held under an ended no-money sale.
HELD_SUFFIX = "-held"


@data_class(frozen=True, slots=True)
class ForeignCharge:
    """A charge on one of the unit's terminals that is not provably its own."""

    terminal: str
    order_id: str
    at: float  # the service's date of the charge (Unix seconds)


class ForeignCharges:
    """The charges of another program or unit seen on the unit's terminals: shown as a problem
    a terminal until none dated within ``quiet`` of the latest seen remains."""

    def __init__(self, quiet: float = FOREIGN_QUIET_S) -> None:
        self.quiet = quiet
        self.counted = 0  # distinct such charges seen since start (a metric's counter)
        self.cleared = ""  # what the last clear said
        self._seen: dict[str, ForeignCharge] = {}

    def saw(self, rows: Collection[tuple[str, Transaction]], now: float) -> None:
        """``rows``: (the terminal asked about, its row) for each charge not this unit's."""
        before = self.terminals()
        for device, row in rows:
            at = row.trans_at
            at = now if at is None else at
            if at < now - self.quiet:
                continue
            if row.trans_id not in self._seen:
                self.counted += 1
            self._seen[row.trans_id] = ForeignCharge(device, _shown(row.order_id), at)
        latest = {t: max(c.at for c in self._seen.values() if c.terminal == t) for t in before}
        self._seen = {k: c for k, c in self._seen.items() if c.at >= now - self.quiet}
        for terminal in sorted(before - self.terminals()):
            self.cleared = (
                f"{terminal} is no longer charged by another program or unit: none for "
                f"{self.quiet / 3600:g} h (the last at {_when(latest[terminal])})"
            )
            _LOGGER.warning("charge check: %s", self.cleared)

    def terminals(self) -> set[str]:
        return {c.terminal for c in self._seen.values()}

    def lines(self) -> list[str]:
        """One problem a terminal, for people: how many, since when, a few order ids."""
        said = []
        for terminal in sorted(self.terminals()):
            charges = sorted((c for c in self._seen.values() if c.terminal == terminal),
                             key=lambda c: c.at)
            named = ", ".join(c.order_id or "(none)" for c in charges[-_FOREIGN_NAMED:])
            said.append(
                f"{terminal} is also charged by another program or unit: {len(charges)} "
                f"charge(s) since {_when(charges[0].at)}, order ids {named}; none is this "
                "unit's to give back"
            )
        return said


def _shown(order_id: str | None) -> str:
    """Another program's order id, safe to show anywhere: printable ASCII, at most 40."""
    text = "".join(c if " " <= c <= "~" else "?" for c in (order_id or "")[:_SHOWN_MAX])
    return text + ("..." if len(order_id or "") > _SHOWN_MAX else "")


def _when(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%MZ")


@data_class(slots=True)
class AuditResult:
    """One check: how many charges reporting showed, and what became of the unaccounted."""

    at: float
    seen: int = 0
    unaccounted: list[str] = field(default_factory=list)  # trans ids
    events: list[SaleEvent] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)  # trans ids of others' charges
    error: str = ""  # reporting could not be asked: nothing was decided
    # not made because the unit is not confirmed (error: its refusal): the unit's problem says so
    by_unit: bool = False
    # completed sales whose charge this check found given back by others since (sale ids noted)
    later: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.error

    def as_dict(self) -> dict[str, object]:
        return {
            "at": self.at,
            "seen": self.seen,
            "unaccounted": len(self.unaccounted),
            "foreign": len(self.foreign),
            "ended": {e.sale_id: e.state.value for e in self.events},
            "later": len(self.later),
            "error": self.error,
        }


class ChargeAudit:
    """Compares reporting's recent charges on this unit's terminals with the journal."""

    def __init__(
        self,
        context: SaleContext,
        *,
        lookback: float = CHARGE_LOOKBACK_S,
        max_give_back: int = CHARGE_CHECK_MAX_GIVE_BACK,
        foreign_quiet: float = FOREIGN_QUIET_S,
        now: Callable[[], float] | None = None,
        told: Callable[[str, Mapping[str, Any]], None] | None = None,
    ) -> None:
        self.context = context
        # told of each charge given back whose vend may have been made (its sale lost with the
        # journal's part that held it): the late vends' watch (``LateVendWatch.noted``)
        self.told = told
        self.journal = context.journal
        self.settings = context.settings
        self.unit = context.unit
        self.lookback = lookback
        self.max_give_back = max_give_back
        self._now = now or context.clock.time  # wall time: the window's end
        self.last: AuditResult | None = None
        self.given_back = 0
        self.foreign = ForeignCharges(foreign_quiet)
        # waited for before a charge is journaled or given back: False when the journal's file
        # is found damaged (core/journal_guard.py reads it whole after it opened)
        self.before_money: Callable[[], Awaitable[bool]] | None = None
        # a check's charges under the attempt's own order id of a sale ended with money moved
        # under another trans id (trans id -> that sale): given back only once reporting shows
        # the sale's own charge under that order id too (_own_charge_shown)
        self._unproven: dict[str, SaleRecord] = {}
        # a check's charges of no sale the journal holds (trans ids): on a unit whose machine
        # has no hardware id (``OwnUnit.copyable``) put to a person, not given back
        self._unheld: set[str] = set()
        # a check's charges under an order id of the unit's that it never sent (``-held``, a
        # suffix of a form it never writes, an attempt past a sale's last): trans id -> why
        self._unmade: dict[str, str] = {}
        # the completed sales' charges found given back by others after the sale ended, in the
        # check that reads the terminals' whole history (``LaterGiveBacks``)
        self._later = LaterGiveBacks()

    async def check(
        self, running: Collection[str] = (), settled: bool = True, *,
        page_size: int | None = CHECK_PAGE_SIZE,
        long: Callable[[], None] | None = None,
    ) -> AuditResult:
        """One comparison; ``running``: sale ids in flight now (their charges are accounted).

        ``settled`` False asks only for the charges not yet settled (authorized, captured): a
        few rows a terminal, where the settled are every charge it ever made (reporting cannot
        be asked for a date range), thousands a year on a busy machine. ``page_size``:
        reporting's rows a page (``START_CHECK_PAGE_SIZE`` for the start's first check; None:
        the client's own). ``long``: called once the check has read more than
        ``START_WAIT_ROWS`` rows (it goes on reading them all)."""
        result = AuditResult(at=self._now())
        if not self.unit.confirmed:  # a cloned journal: nothing here is provably its own
            result.error = self.unit.refusal()
            result.by_unit = True
            self.last = result
            return result
        try:
            held, foreign, seen = await self._held_charges(settled, running, page_size, long)
        except ServiceError as err:
            result.error = f"reporting could not be asked: {err}"
            _LOGGER.warning("charge check: %s", result.error)
            self.last = result
            return result
        result.seen = seen
        result.foreign = [row.trans_id for row in foreign]
        if self._later.charges and (self.before_money is None or await self.before_money()):
            # a note, no money; but nothing is written on a journal's file found damaged
            result.later = self._note_later(self._later)
        self._unproven, self._unheld, self._unmade = {}, set(), {}
        found = [(row, record) for row in held if (record := self._unaccounted(row, running))]
        if found and self.before_money is not None and not await self.before_money():
            result.error = "the journal's file is damaged: nothing is given back on it"
            self.last = result
            return result
        give_back = len(found) <= self.max_give_back
        taken: set[str] = set()
        for row, record in found:
            undecided = ""
            sale = self._unproven.get(row.trans_id)
            unmade = self._unmade.get(row.trans_id)
            if unmade is not None:
                undecided = unmade
            elif sale is not None:
                try:
                    shown = await self._own_charge_shown(row, sale)
                except ServiceError as err:  # neither given back nor told: the next check asks
                    _LOGGER.warning("charge check: %s not looked at now: reporting could not "
                                    "be asked for its order id's charges (%s)", row.trans_id, err)
                    continue
                if not shown:
                    undecided = _unproven_words(sale)
            elif row.trans_id in self._unheld and self.unit.copyable:
                undecided = _copyable_words(self.unit.id)
            result.unaccounted.append(row.trans_id)
            record = self._order_id_of_its_own(row, record, taken)
            no_vend = self._no_vend_journaled(row)
            event = await self._settle(row, record, give_back, len(found), undecided, no_vend)
            result.events.append(event)
        if found:
            _LOGGER.warning("charge check: %d charge(s) the journal did not hold: %s",
                            len(found), ", ".join(f"{e.sale_id} {e.state.value}"
                                                  for e in result.events))
        self.last = result
        return result

    async def _held_charges(
        self, settled: bool, running: Collection[str], page_size: int | None,
        long: Callable[[], None] | None = None,
    ) -> tuple[list[Transaction], list[Transaction], int]:
        """This unit's charges that hold money and the journal may not account for, the
        charges of others, in the window; and how many of this unit's holding money the
        window has (accounted or not).

        Read as it streams: a row of this unit's that the journal plainly accounts for (nearly
        every one) is counted and let go, so a check's memory is one page of reporting's, not
        every charge of the window (a week of a busy machine's, a model each: a 15-minute check
        over 14,000 of them grew the agent by 25 MB, kept after)."""
        rows: dict[str, Transaction] = {}
        later = LaterGiveBacks()
        self._later = later
        if settled:  # the whole read: with it, the chargebacks (one collection, a few rows)
            later.chargebacks = await self._chargebacks(page_size)
        accounted = _Accounted(self._now() - self.lookback)
        asked: dict[str, str] = {}  # trans id -> the terminal it was asked under
        newest = 0.0  # the service's latest charge on these terminals: real time, at most now
        newest_own = 0.0  # ... of this unit's own (its id and tag, or its journal's sales)
        rows_read = 0  # reporting's rows this check has read (``long`` past START_WAIT_ROWS)
        async for device, chunk in self._chunks(settled, page_size):
            rows_read += len(chunk)
            if long is not None and rows_read > START_WAIT_ROWS:
                long()
                long = None
            splits = [split_order_id(row.order_id) for row in chunk]
            sales = self.journal.order_states(parts[0] for parts in splits if parts is not None)
            for row, parts in zip(chunk, splits, strict=True):
                base = None if parts is None else parts[0]
                at = _date_of(row)
                if at is not None:
                    newest = max(newest, at)
                status = row.status
                sale = None if base is None else sales.get(base)
                if (sale is not None and sale.state is SaleState.COMPLETED and status is not None
                        and (status in _LATER or (later.chargebacks and status in _HOLDING))):
                    later.saw(row, sale, status)
                if status not in _CHARGES:
                    continue
                mine = self._held_by_journal(base, sale) or self._provably_ours(row.order_id)
                if mine and at is not None:
                    newest_own = max(newest_own, at)
                if mine and status not in _HOLDING:
                    continue  # this unit's, holding nothing: never looked at again
                if mine and parts is not None and _plainly_accounted(sale, running, row):
                    accounted.add(row.trans_id, at)
                    continue
                rows[row.trans_id] = row
                asked[row.trans_id] = device
            # a chunk's rows at a time: a year's settled charges (thousands of rows) held the
            # event loop a page at a time, 0.2 s and more on a slow machine, sales waiting
            await next_turn()
        # The window ends now by this unit's clock, or at the service's latest charge when that
        # is later: a clock not yet set by NTP (a Pi booted from a new card: its image's date,
        # or 1970) would stretch it over the terminals' whole history, and every charge of a
        # sale made before this journal (pruned, or on the card replaced) would look lost.
        # The latest of the unit's own charges, where it has any: one charge of another's that
        # the service dated ahead (its clock off) moved the window past the unit's own lost
        # charge, never given back nor told (2026-11-30, i42-money-attack)
        start = max(self._now(), newest_own or newest) - self.lookback
        recent = [row for row in rows.values() if _in_window(_date_of(row), start)]
        ours = [row for row in recent if self._provably_ours(row.order_id)]
        foreign = [row for row in recent if not self._provably_ours(row.order_id)]
        self.foreign.saw([(asked[row.trans_id], row) for row in foreign], start + self.lookback)
        held = [row for row in ours if row.status in _HOLDING]
        return held, foreign, len(held) + accounted.count(start)

    def _note_later(self, later: LaterGiveBacks) -> list[str]:
        """Journal on each of the agent's own completed sales what the service holds now of its
        charge where someone else voided or refunded it after the sale ended (found by its
        trans id, a refund's row by the ``related_trans_id`` naming it: never by amount or
        time), once a change: a note (``service.later``) and the sale's ``later_*`` fields. No
        money moves: it is not the agent's move. The sale ids noted."""
        noted = []
        before = self.journal.later_noted(later.charges)
        for sale_id, (order, charge) in later.charges.items():
            parts = split_order_id(charge.order_id)
            if parts is None or not self._held_by_journal(parts[0], order):
                continue
            now = later.held(charge, agent_user(self.unit))
            if now is None:
                continue
            cents, status, by, dated, refunds = now
            if before.get(sale_id) == (cents, status, by):
                continue  # noted already: a note a change, not a check (one read for them all)
            record = self.journal.get(sale_id)
            if record is None or record.state is not SaleState.COMPLETED:
                continue
            at = self._now() if dated is None else dated  # undated: when the check found it
            words = later_words(cents, status, given_back_by(by, self.unit), record.currency)
            noted_record = self.journal.record(
                record, Step.SERVICE_LATER,
                detail={"trans_id": charge.trans_id, "status": status, "cents": cents,
                        "by": by, "dated_by_service": dated is not None, "refunds": refunds,
                        "message": words},
                later=Later(cents, status, by, at),
            )
            noted.append(sale_id)
            # announced as its own kind (SaleEvent.given_back_later), after its commit, in the
            # note's words (the event stream's replay of the step reads the same)
            self.context.events.publish(replace(
                event_of(noted_record, Step.SERVICE_LATER, clock=self.context.clock),
                message=words))
            _LOGGER.warning("charge check: sale %s: its charge %s was %s at the service after "
                            "the sale completed (%d cents given back by someone else); noted, "
                            "no money moved by the agent", sale_id, charge.trans_id, status,
                            cents)
        return noted

    async def _chargebacks(self, page_size: int | None) -> dict[str, list[ChargebackSeen]]:
        """Reporting's chargebacks of this unit's merchant, by the trans id each names (as
        :func:`trans_key` compares them): a few a year, read whole with the terminals' history
        (their status moves on: open, then won or lost)."""
        from kiosk_agent.service.models.reports import ChargebackFilter

        query = ChargebackFilter(mid=self.settings.mid)
        found: dict[str, list[ChargebackSeen]] = {}
        async for case in self.context.service.reporting.chargebacks(query, page_size=page_size):
            if not case.trans_id or (case.mid and case.mid != self.settings.mid):
                continue
            at = case.chargeback_date
            found.setdefault(trans_key(case.trans_id), []).append(ChargebackSeen(
                str(case.chargeback_id), case.amount_cents, str(case.status or ""),
                case.case_number or "", None if at is None else (
                    at if at.tzinfo else at.replace(tzinfo=dt.UTC)).timestamp()))
        return found

    def _held_by_journal(self, base: str | None, sale: OrderState | None) -> bool:
        """Provably this unit's as :meth:`_provably_ours` says, for a row whose sale the journal
        holds (``sale``, read by its order id's ``base``: nearly every row): a sale of the
        journal that is this unit's, without computing the order id's tag (an HMAC a row, a
        fifth of a check's CPU over 20,000 rows). Its base carries the tag the journal's own
        sale was made with."""
        return sale is not None and base is not None and self.unit.owns_sale(base)

    def _provably_ours(self, order_id: str | None) -> bool:
        """Its order id carries this unit's id and tag; or the journal holds the sale and it
        is this unit's (its id, or the older form while the unit keeps the journal's first
        id). Else: another's, never moved."""
        if self.unit.made_here(order_id):
            return True
        parts = split_order_id(order_id)
        if parts is None or not self.unit.owns_sale(parts[0]):
            return False
        return self.journal.by_order_id(parts[0]) is not None

    async def _chunks(
        self, settled: bool, page_size: int | None
    ) -> AsyncIterator[tuple[str, list[Transaction]]]:
        """Each terminal's rows (:meth:`_terminal_rows`), ``CHUNK_ROWS`` at a time, in the
        terminals' order."""
        rows = (
            ((device, row) for device in self.settings.terminals
             async for row in self._terminal_rows(device, page_size))
            if settled
            else read_ahead(
                [(device, self._unsettled_rows(device, status, page_size))
                 for device in self.settings.terminals for status in _UNSETTLED],
                UNSETTLED_AHEAD,
            )
        )
        chunk: list[Transaction] = []
        at = ""
        async for device, row in rows:
            if chunk and (device != at or len(chunk) == CHUNK_ROWS):
                yield at, chunk
                chunk = []
            at = device
            chunk.append(row)
        if chunk:
            yield at, chunk

    def _terminal_rows(self, device: str, page_size: int | None) -> AsyncIterator[Transaction]:
        """The terminal's whole history: one query, the statuses that may hold money picked by
        the caller (``q`` is equalities only; a query for each status was three round trips,
        and the answer is the terminal's whole history either way). Read one terminal at a
        time: thousands of rows a year, a page of them in memory."""
        reporting = self.context.service.reporting
        query = TransactionFilter(mid=self.settings.mid, terminal_id=device)
        return reporting.transactions(query, page_size=page_size)

    def _unsettled_rows(
        self, device: str, status: TransStatus, page_size: int | None
    ) -> AsyncIterator[Transaction]:
        """The terminal's charges in one status not yet settled: a query each, a few rows."""
        query = TransactionFilter(mid=self.settings.mid, terminal_id=device, trans_status_id=status)
        return self.context.service.reporting.transactions(query, page_size=page_size)

    def _unaccounted(self, row: Transaction, running: Collection[str]) -> SaleRecord | None:
        """The sale to settle it under (a new one), or None: accounted for, or not ours to
        move (a sale the journal ended with no money moved is final; the late-charge net and
        people look at those, and the check says so in its result)."""
        parts = split_order_id(row.order_id)
        if parts is None:
            raise RuntimeError("an order id of ours that does not split")
        base, suffix = parts
        record = self.journal.by_order_id(base)
        if record is not None and record.source == AUDIT_SOURCE:
            record = None  # a give-back took the order id of a sale the journal lost
        # An order id the unit never sent is put to a person: the tag is the sale's, the
        # suffix anyone's (2026-11-30, i42-money-attack: a charge under a paid sale's order id
        # with -5 was voided as its double charge). It never charges under -held nor writes an
        # attempt as -1, -0 or -02; and each attempt is journaled before it goes, so a sale
        # that ended with money moved (on disk after its every attempt: a journal that lost
        # writes lost its latest) sent none past its last. One that ended with none moved may
        # have lost what moved it, its attempts too: given back below.
        if not _sent_form(suffix):
            self._unmade[row.trans_id] = _unmade_words(row, "a suffix it never writes")
        elif (record is not None and _accounts_for(record, running)
              and row.order_id not in record.all_order_ids()):
            self._unmade[row.trans_id] = _unmade_words(
                row, f"its sale {record.sale_id} made {record.attempt} attempt(s) under "
                f"{record.order_id}, each journaled before it went")
        if record is not None:
            if _accounts_for(record, running) and not _not_its_charge(
                record.state, record.trans_id, row
            ):
                return None
            if (_accounts_for(record, running) and record.state.final
                    and _attempt_of(suffix) == record.attempt):
                # the sale's own attempt charged again, or its own charge written otherwise
                # than a normalised comparison sees: not given back unless proven another's
                self._unproven[row.trans_id] = record
            steps = self.journal.steps(record.sale_id)
            if steps and steps[-1].step in NO_CHARGE_STEPS and late_charge_watched(
                self.context.clock, record, LATE_CHARGE_HANDOVER_S
            ):
                return None  # the late-charge net's while it watches: it reopens the sale itself
        if self._given_back(base, row.trans_id):
            return None
        if record is None:
            self._unheld.add(row.trans_id)
            return self._new_record(row, base, _attempt_of(suffix))
        return self._new_record(row, f"{base}{HELD_SUFFIX}", 1)

    def _given_back(self, base: str, trans_id: str) -> bool:
        """A give-back sale of the check's own under ``base``'s order ids (``base`` itself,
        ``-held``, ``-N``: a few, read by the order id's index) holds this very charge: given
        back, being given back, or put to a person. Another charge of the same order ids is
        not accounted for by it: once it was, a retry found in a later check than its attempt
        was kept, the customer charged twice and no person told."""
        return any(sale.source == AUDIT_SOURCE and sale.trans_id == trans_id
                   for sale in self.journal.under_order_base(base))

    def _order_id_of_its_own(
        self, row: Transaction, record: SaleRecord, taken: set[str]
    ) -> SaleRecord:
        """``record`` under an order id no sale has: two charges of one sale's order ids (an
        attempt and its retry, both holding) are each given back under a sale of their own.
        Under one order id, the second's write broke the journal's unique order id: the check
        failed as a disk that takes no writes, and that charge was never given back. The
        candidates are the unit's own forms, so the sale stays provably its own."""
        parts = split_order_id(record.order_id)
        base = record.order_id if parts is None else parts[0]
        candidates = [record.order_id, row.order_id or "", f"{base}{HELD_SUFFIX}",
                      *(f"{base}-{n}" for n in range(2, 100))]
        for order_id in candidates:
            if order_id and order_id not in taken and self.journal.by_order_id(order_id) is None:
                taken.add(order_id)
                if order_id == record.order_id:
                    return record
                return replace(record, order_id=order_id, attempt=1)
        raise RuntimeError(f"no order id left for a charge under {base}")  # pragma: no cover

    def _new_record(self, row: Transaction, order_id: str, attempt: int) -> SaleRecord:
        device = row.terminal_id or next(iter(self.settings.terminals), "")
        sale_id, _ = new_ids(self.unit)
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

    async def _own_charge_shown(self, row: Transaction, sale: SaleRecord) -> bool:
        """Whether reporting shows ``sale``'s own charge (its trans id, compared as
        :func:`trans_key` does) under ``row``'s order id, in any status: then ``row`` is
        another charge of that order id, provably not the customer's payment for the sale."""
        if sale.trans_id is None:
            return False
        own = trans_key(sale.trans_id)
        query = TransactionFilter(mid=self.settings.mid, order_id=row.order_id)
        async for other in self.context.service.reporting.transactions(query):
            if other.order_id == row.order_id and trans_key(other.trans_id) == own:
                return True
        return False

    def _no_vend_journaled(self, row: Transaction) -> str:
        """Words when the journal holds the sale of ``row``'s order id and it proves no vend
        for this charge: the sale ended with money moved under a charge of its own (this one is
        a second), or ended by its own flow on an answer that approves no vend (the service
        declined it, or reporting showed no charge after a lost answer), no vend asked for or
        chosen: the charge is given back with nothing to tell. "" otherwise: the journal lost
        the sale, or what moved it (an end of recovery's after a lost WAL), and the machine may
        have vended it. A journal that lost writes lost their latest: a sale's own end on disk
        has all its steps before it."""
        parts = split_order_id(row.order_id)
        sale = self.journal.by_order_id(parts[0]) if parts is not None else None
        if sale is None or sale.source == AUDIT_SOURCE:
            return ""
        if sale.state.final and sale.state is not SaleState.ATTENTION and (
                sale.state not in _NO_MONEY):
            # ended with its own charge (``_not_its_charge``): this one is another, and a sale
            # vends at most once (a maybe of its own vend is told on it)
            return (f"its sale {sale.sale_id} ended {sale.state.value} with its own charge: this "
                    "is another, and a sale vends at most once: nothing more went out")
        steps = [s for s in self.journal.steps(sale.sale_id)
                 if s.step not in (Step.LATE_VEND, Step.LATE_VEND_SEEN)]
        if not steps or steps[-1].step not in _FLOW_NO_VEND_ENDS or any(
                s.step in _VEND_ASKED for s in steps):
            return ""
        return (f"its sale {sale.sale_id} ended {sale.state.value} on {steps[-1].step}, "
                "no vend asked for: nothing went out")

    async def _settle(
        self, row: Transaction, record: SaleRecord, give_back: bool, found: int,
        undecided: str = "", no_vend: str = "",
    ) -> SaleEvent:
        detail = {"trans_id": row.trans_id, "order_id": row.order_id,
                  "status": row.status.name if row.status else None}
        record = self.journal.create(record, detail)
        steps = SaleSteps(record, self.context)
        cents = row.amount_cents
        steps.step(Step.AUDIT_FOUND, SaleState.CHARGING, detail=detail, trans_id=row.trans_id,
                   authorized_cents=cents, captured_cents=cents)
        if undecided:
            return steps.finish(SaleState.ATTENTION, Step.AUDIT_UNDECIDED, undecided)
        if not give_back:
            return steps.finish(
                SaleState.ATTENTION, Step.AUDIT_UNDECIDED,
                f"a charge the journal did not hold ({found} such in one check: too many to "
                "give back unasked); a person decides now (`kiosk-agent sales resolve`)",
            )
        if no_vend:
            event = await steps.reverse(f"a charge the journal did not hold; {no_vend}")
            if event.state is SaleState.REVERSED:
                self.given_back += 1
            return event
        # the journal lost the sale that made this charge: the machine may have vended it, so
        # a person is told in the very commit of the give-back, as every other maybe is
        told = lost_sale_note(row, record.terminal, self.settings.currency)
        event = await steps.reverse(
            "a charge the journal did not hold; the journal lost its sale, or what moved it, so "
            "the agent cannot say whether the product went out (told to a person)",
            told=told,
        )
        if self.told is not None:
            self.told(record.sale_id, told)
        if event.state is SaleState.REVERSED:
            self.given_back += 1
        return event


# the start of a maybe's words (``late.vend``'s ``unsure``) for a charge whose sale was lost:
# health's kind of it (sales/late_vends.py ``_why``)
LOST_SALE = "the journal lost its sale"


def lost_sale_note(row: Transaction, terminal: str, currency: str = CURRENCY) -> dict[str, Any]:
    """The ``late.vend`` maybe note of a charge of the unit's own whose sale the journal no
    longer holds (a WAL lost, a journal damaged or replaced): what the agent knows of it, the
    amount, the service's time of the charge, the terminal and the order id's sale part (no
    card data: reporting's row gives none here). The product is unknown: its sale is lost."""
    parts = split_order_id(row.order_id)
    sale_part = parts[0] if parts is not None else _shown(row.order_id)
    when = "at a time reporting did not give" if row.trans_at is None else (
        display_time(row.trans_at))
    why = (f"{LOST_SALE}: {format_cents(row.amount_cents, currency)} charged {when} on "
           f"{terminal}, order {sale_part}; the machine may have vended it")
    note = maybe_note(None, terminal, why, row.amount_cents)
    note.update({"terminal": terminal, "order": sale_part, "charged_at": row.trans_at})
    return note


_LATER = frozenset({TransStatus.VOIDED, TransStatus.REFUNDED, TransStatus.PARTIALLY_REFUNDED,
                    TransStatus.REFUND})
_LATER_NAMES = {TransStatus.VOIDED: "voided", TransStatus.REFUNDED: "refunded",
                TransStatus.PARTIALLY_REFUNDED: "partly_refunded"}


@data_class(frozen=True, slots=True)
class ChargebackSeen:
    """One chargeback of reporting's, as the charge check keeps it (not its card's fields)."""

    id: str
    cents: int
    status: str  # OPEN, WON, LOST (ChargebackStatus), or as reporting wrote it
    case: str
    at: float | None  # the service's date of it


# A chargeback's status -> the sale's later status, and whether its amount is taken back from
# the merchant (open: held back while disputed; lost: for good; won: given back to it)
_CHARGEBACK = {"OPEN": ("chargeback_open", True), "LOST": ("chargeback_lost", True),
               "WON": ("chargeback_won", False)}
_Held = tuple[int, str, str, float | None, list[str]]


class LaterGiveBacks:
    """What one check that reads the terminals' whole history saw of the completed sales'
    charges given back since: each such sale's charge row (voided, refunded, partly refunded,
    or charged back: matched by its trans id to the one the journal holds), the refunds' own
    rows naming it (``related_trans_id``) and reporting's chargebacks naming it (its
    ``trans_id``). Kept only for those: a few, where the history is thousands."""

    def __init__(self) -> None:
        self.charges: dict[str, tuple[OrderState, Transaction]] = {}
        self.refunds: dict[str, list[Transaction]] = {}
        self.chargebacks: dict[str, list[ChargebackSeen]] = {}

    def saw(self, row: Transaction, sale: OrderState, status: TransStatus) -> None:
        if sale.trans_id is None or sale.source == AUDIT_SOURCE:
            return
        own = trans_key(sale.trans_id)
        if status is TransStatus.REFUND:
            if row.related_trans_id and trans_key(row.related_trans_id) == own:
                self.refunds.setdefault(own, []).append(row)
        elif trans_key(row.trans_id) == own and (status in _LATER_NAMES
                                                 or own in self.chargebacks):
            self.charges[sale.sale_id] = (sale, row)

    def held(self, charge: Transaction, agent: str) -> _Held | None:
        """Given back by others, as reporting shows it now: (cents, status, who, the service's
        date of the latest refund's row or chargeback (None for a void alone: reporting dates
        none), the refunds' and chargebacks' ids); None when it shows no figure the agent can
        read (a negative amount, a charge partly refunded with no refund's row naming it, a
        chargeback in a status it does not know)."""
        status = charge.status
        if status is None or charge.amount_cents < 0:
            return None
        key = trans_key(charge.trans_id)
        parts: list[_Held] = []
        if status in _LATER_NAMES:
            given = self._given_back(charge, status, key, agent)
            if given is None:
                return None
            parts.append(given)
        for case in self.chargebacks.get(key, []):
            known = _CHARGEBACK.get(case.status.upper())
            if known is None or case.cents < 0:
                return None
            name, taken = known
            parts.append((case.cents if taken else 0, name, f"chargeback case {case.case}",
                          case.at, [case.id]))
        if not parts:
            return None
        dates = [p[3] for p in parts if p[3] is not None]
        return (sum(p[0] for p in parts), ", ".join(dict.fromkeys(p[1] for p in parts)),
                ", ".join(dict.fromkeys(p[2] for p in parts if p[2])),
                max(dates) if dates else None, [i for p in parts for i in p[4]])

    def _given_back(
        self, charge: Transaction, status: TransStatus, key: str, agent: str
    ) -> _Held | None:
        """A void's or refunds' part of :meth:`held`."""
        if status is TransStatus.VOIDED:  # no row of its own: the voided row names who, no date
            if (charge.user_identifier or "") == agent:
                return None  # the agent's own give-back, never another's: not said as one
            return (charge.amount_cents, _LATER_NAMES[status], charge.user_identifier or "",
                    None, [])
        shown = self.refunds.get(key, [])
        rows = [r for r in shown if (r.user_identifier or "") != agent]
        if any(r.amount_cents < 0 for r in rows) or (shown and not rows):
            return None  # a figure it cannot read; or the agent's own refunds, not others'
        if not rows:
            if status is not TransStatus.REFUNDED:
                return None
            # refunded whole by its status, its refund's row not shown: the charge's figure
            return (charge.amount_cents, _LATER_NAMES[status], "", None, [])
        rows.sort(key=lambda r: r.trans_at or 0.0)
        makers = list(dict.fromkeys(r.user_identifier or "" for r in rows))
        dates = [r.trans_at for r in rows if r.trans_at is not None]
        return (sum(r.amount_cents for r in rows), _LATER_NAMES[status], ", ".join(makers),
                max(dates) if dates else None, [r.trans_id for r in rows])


def later_words(cents: int, status: str, who: str, currency: str = CURRENCY) -> str:
    """A later give-back in a sale's words (``who``: :func:`given_back_by`'s): ``$1.00
    refunded at the service after the sale completed by 'jane' (not the agent); the agent
    moved no money on it``."""
    how = ", ".join({"voided": "voided", "refunded": "refunded",
                     "partly_refunded": "refunded (part of it)",
                     "chargeback_open": "charged back (disputed, open)",
                     "chargeback_lost": "charged back (lost)",
                     "chargeback_won": "charged back and won back"}.get(part, part)
                    for part in status.split(", "))
    return (f"{format_cents(cents, currency)} {how} at the service after the sale completed"
            f"{who}; the agent moved no money on it")


class _Accounted:
    """The charges of this unit's the journal accounts for, counted and let go: 16 bytes each
    (a hash of its trans id, its date), where a dict of trans id to date held some 120 (1.5 MB
    over a week of a busy machine's, kept in Python's arenas after the check). Those dated
    before ``earliest`` (the window's earliest start) are not kept at all."""

    def __init__(self, earliest: float) -> None:
        self.earliest = earliest
        self._ids = array("q")
        self._dates = array("d")  # NaN: no date (always in the window)

    def add(self, trans_id: str, at: float | None) -> None:
        if at is not None and at < self.earliest:
            return  # before any start the window may have
        self._ids.append(hash(trans_id))
        self._dates.append(math.nan if at is None else at)

    def count(self, start: float) -> int:
        """How many distinct ones are in the window from ``start`` (a row reporting repeats
        across pages is counted once)."""
        return len({key for key, at in zip(self._ids, self._dates, strict=True)
                    if math.isnan(at) or at >= start})


def _accounts_for(record: SaleRecord, running: Collection[str]) -> bool:
    """A sale of the journal that accounts for a charge under its order id: in flight now, or
    in any state but an end where no money moved."""
    return record.sale_id in running or record.state not in _NO_MONEY


def _plainly_accounted(
    sale: OrderState | None, running: Collection[str], row: Transaction
) -> bool:
    """The journal holds this charge's sale (``sale``: read by the base of the row's order
    id), in flight or ended with money moved and the charge its own: nothing to
    decide (``_unaccounted`` says None for it too). A give-back sale under that order id
    accounts only for the charge it gives back: decided by :meth:`ChargeAudit._unaccounted`,
    by trans id."""
    if sale is None or sale.source == AUDIT_SOURCE:
        return False
    if sale.sale_id in running:
        return True
    return sale.state not in _NO_MONEY and not _not_its_charge(sale.state, sale.trans_id, row)


def _unproven_words(sale: SaleRecord) -> str:
    return (f"a charge held under the order id of sale {sale.sale_id} (ended "
            f"{sale.state.value} with its charge {sale.trans_id}): reporting does not show "
            "that charge under the order id, so the agent cannot tell which of them is the "
            "customer's payment and gives none back; a person decides now "
            "(`kiosk-agent sales resolve`)")


def _sent_form(suffix: str) -> bool:
    """Whether an order id's suffix is one the unit sends: none (the first attempt), or a
    retried attempt's ``-N``, N from 2, written plainly (``-held`` names a give-back sale,
    never a charge)."""
    return not suffix or (suffix.isdigit() and suffix == str(int(suffix)) and int(suffix) >= 2)


def _unmade_words(row: Transaction, why: str) -> str:
    return (f"a charge under order id {row.order_id}, which this unit never sent ({why}): "
            "maybe another program's that copied the unit's order ids; the agent cannot prove "
            "it its own and gives none back; a person decides now (`kiosk-agent sales resolve`)")


def _copyable_words(unit_id: str) -> str:
    return (f"a charge under this unit's id ({unit_id}) of a sale the journal does not hold: the "
            "journal was made on a machine with no hardware id (no serial number, no physical "
            "network interface), where a copy of its card on another such machine would charge "
            "under the same id, so the agent cannot prove it its own (its journal lost, or a "
            "cloned card's twin) and gives none back; a person decides now "
            "(`kiosk-agent sales resolve`)")


def _not_its_charge(state: SaleState, trans_id: str | None, row: Transaction) -> bool:
    """A charge under one of the order ids of a sale that ended with money moved under another
    charge (its ``trans_id``): no money of the sale's. Under an earlier attempt's order id,
    that attempt was answered "retry" (else the sale had not asked again); under the sale's
    own attempt, the order id was charged again (a request replayed past the service's
    duplicate check: the agent sends each attempt once). Either way a service that charged it
    charged the customer twice, for no vend the agent heard (2026-11-29, i38-money: the
    second case was counted the sale's, and kept). An open sale (recovery's, the sweeper's:
    ``attention``) may still take it for its own."""
    return (state.final and state is not SaleState.ATTENTION and trans_id is not None
            and trans_key(row.trans_id) != trans_key(trans_id))


def _attempt_of(suffix: str) -> int:
    return int(suffix) if suffix.isdigit() else 1


def _date_of(row: Transaction) -> float | None:
    return row.trans_at


def _in_window(at: float | None, start: float) -> bool:
    """A charge with no date is always in the window (it cannot be shown to be older)."""
    return at is None or at >= start
