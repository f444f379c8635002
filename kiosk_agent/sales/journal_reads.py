"""The journal's reads: a sale, its steps, the lists the faces show, today's figures.

Every read the status page, the admin API and the commands make is a lookup in one of the
journal's indexes, never a walk through every sale (docs/journal.md, "Tables"). A mixin of
:class:`~kiosk_agent.sales.journal.Journal`, over its open connection.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from kiosk_agent.moments import day_bounds
from kiosk_agent.sales.clock import Clock
from kiosk_agent.sales.journal_records import (
    _SELECT_SALES,
    LATER_COLUMNS,
    LATER_TABLE,
    Later,
    SaleRecord,
    StepRecord,
    _record,
    replaced,
)
from kiosk_agent.sales.kinds import SaleKind, kind_sql
from kiosk_agent.sales.states import SaleState, Step

# named as a list, not as "not final": an IN list is looked up in the state's index, a NOT IN
# scans every sale of the journal (200,000 in a busy unit's year)
_OPEN_STATES = tuple(s.value for s in SaleState if not s.final)
_ORDER_STATES = (
    "SELECT order_id, sale_id, state, source, attempt, trans_id FROM sales WHERE order_id IN")
_STATE_OF = {state.value: state for state in SaleState}  # a dict's look, not the enum's call
# GLOB's wildcards, each made a class of itself: a sale id's prefix is matched as typed
_GLOB_LITERAL = str.maketrans({"*": "[*]", "?": "[?]", "[": "[[]"})
_IN_LIST_MAX = 500  # values bound in one statement (SQLite's limit: 999 in older builds)
# An order id's suffixes ('-2', '-held') follow its base after this character; the next one
# ('.') ends the range of the order id's index that holds the base and every suffixed form
_SUFFIX_MARK = "-"
_AFTER_SUFFIX_MARK = chr(ord(_SUFFIX_MARK) + 1)


class OrderState(NamedTuple):
    """What :meth:`JournalReads.order_states` says of the sale under one order id."""

    sale_id: str
    state: SaleState
    source: str
    attempt: int  # its last attempt's: the order id suffixed -N
    trans_id: str | None  # the charge it holds, once known


class SaleNotFound(LookupError):
    """No sale by that id, id prefix or order_id, or a prefix of several."""


class JournalReads:
    """The reads of an open journal (its ``db``, its ``clock`` dating today)."""

    clock: Clock
    # While the late-vend index is built after ready (Journal.build_indexes): the last
    # step's id at open; the late vends are read among the steps written since (None: indexed)
    late_vend_after: int | None = None

    @property
    def db(self) -> sqlite3.Connection:
        raise NotImplementedError

    # -- reads -----------------------------------------------------------------------------------

    def get(self, sale_id: str) -> SaleRecord | None:
        row = self.db.execute(f"{_SELECT_SALES} WHERE sales.sale_id = ?", (sale_id,)).fetchone()
        return None if row is None else self._with_later([_record(row)])[0]

    def by_order_id(self, order_id: str) -> SaleRecord | None:
        row = self.db.execute(f"{_SELECT_SALES} WHERE order_id = ?", (order_id,)).fetchone()
        return None if row is None else self._with_later([_record(row)])[0]

    def _with_later(
        self, records: list[SaleRecord], noted: dict[str, tuple[Any, ...]] | None = None
    ) -> list[SaleRecord]:
        """``records`` with what is noted of each completed one given back at the service
        after it (``sale_later``: a few sales a year, read here for these in one query, or
        from ``noted``, the whole table read once for an export's pages; never joined into
        every read). A journal this release has not migrated yet, read beside an older agent,
        has no such table: nothing noted."""
        if noted is None:
            done = [r.sale_id for r in records if r.state is SaleState.COMPLETED]
            if not done:
                return records
            try:
                noted = self._later_rows(done, LATER_COLUMNS)
            except sqlite3.OperationalError:  # no such table (an older journal, read only)
                return records
        if not noted:
            return records
        return [replaced(r, later=Later(*noted[r.sale_id])) if r.sale_id in noted else r
                for r in records]

    def _every_later(self) -> dict[str, tuple[Any, ...]]:
        """The whole ``sale_later`` table (a few rows a year), for :meth:`pages`."""
        try:
            return {sale_id: tuple(rest) for sale_id, *rest in self.db.execute(
                f"SELECT sale_id, {', '.join(LATER_COLUMNS)} FROM {LATER_TABLE}")}  # noqa: S608
        except sqlite3.OperationalError:  # no such table (an older journal, read only)
            return {}

    def _later_rows(
        self, sale_ids: Iterable[str], columns: tuple[str, ...]
    ) -> dict[str, tuple[Any, ...]]:
        wanted = list(dict.fromkeys(sale_ids))
        found: dict[str, tuple[Any, ...]] = {}
        names = ", ".join(columns)
        for start in range(0, len(wanted), _IN_LIST_MAX):
            part = wanted[start:start + _IN_LIST_MAX]
            marks = ", ".join("?" for _ in part)
            for sale_id, *noted in self.db.execute(
                f"SELECT sale_id, {names} FROM {LATER_TABLE} "  # noqa: S608 - module's names
                f"WHERE sale_id IN ({marks})", part
            ):
                found[sale_id] = tuple(noted)
        return found

    def order_states(self, order_ids: Iterable[str]) -> dict[str, OrderState]:
        """The sale id, state, source, attempt and trans id of each of ``order_ids`` the journal
        holds, in one
        read of the order id's index a few hundred at a time: the charge check decides a page
        of reporting's rows by them (a read and a record a row was most of its time)."""
        wanted = list(dict.fromkeys(order_ids))
        found: dict[str, OrderState] = {}
        for start in range(0, len(wanted), _IN_LIST_MAX):
            part = wanted[start:start + _IN_LIST_MAX]
            marks = ", ".join("?" for _ in part)
            query = f"{_ORDER_STATES} ({marks})"  # placeholders only: the ids are bound
            for order_id, sale_id, state, source, attempt, trans_id in self.db.execute(
                query, part
            ):
                found[order_id] = OrderState(sale_id, _STATE_OF[state], source, attempt, trans_id)
        return found

    def later_noted(self, sale_ids: Iterable[str]) -> dict[str, tuple[Any, ...]]:
        """What is noted of each of ``sale_ids`` as given back at the service after it
        completed (``later_cents``, ``later_status``, ``later_by``), those that have a note: one
        read a few hundred at a time, so the charge check compares without reading each sale."""
        return self._later_rows(sale_ids, LATER_COLUMNS[:3])

    def under_order_base(self, base: str) -> list[SaleRecord]:
        """The sales under order id ``base`` and its suffixed forms (``base-2``,
        ``base-held``): one range of the order id's index, a few rows, never a walk through
        every sale."""
        rows = self.db.execute(
            f"{_SELECT_SALES} WHERE order_id >= ? AND order_id < ?",
            (base, f"{base}{_AFTER_SUFFIX_MARK}"),
        )
        return [record for record in map(_record, rows)
                if record.order_id == base or record.order_id.startswith(base + _SUFFIX_MARK)]

    def with_id_prefix(self, prefix: str, limit: int = 2) -> list[SaleRecord]:
        """Sales whose id starts with ``prefix`` (as people copy ids from a list), at most
        ``limit``: two say the prefix is not unique."""
        if not prefix:
            return []
        # GLOB, case-sensitive like the ids, is looked up in the id's index (substr() read
        # every sale); its wildcards in the prefix (*, ?, [) are each read as itself ([*])
        rows = self.db.execute(
            f"{_SELECT_SALES} WHERE sales.sale_id GLOB ? LIMIT ?",
            (f"{prefix.translate(_GLOB_LITERAL)}*", limit),
        )
        return self._with_later([_record(r) for r in rows])

    def find(self, wanted: str) -> SaleRecord:
        """A sale named by its order_id, its whole id, or a unique prefix of its id (as the
        CLI prints them); else :class:`SaleNotFound`, saying which."""
        record = self.by_order_id(wanted) or self.get(wanted)
        if record is not None:
            return record
        matches = self.with_id_prefix(wanted)
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise SaleNotFound(f"{wanted!r} names {len(matches)} sales; give more of the sale id")
        raise SaleNotFound(f"no sale {wanted!r} in the journal")

    def open_sales(self) -> list[SaleRecord]:
        """Sales not in a final state: what a crash left behind (or what is running now)."""
        marks = ", ".join("?" for _ in _OPEN_STATES)
        rows = self.db.execute(
            f"{_SELECT_SALES} WHERE state IN ({marks}) ORDER BY created_at", _OPEN_STATES
        )
        return [_record(r) for r in rows]

    def ended_by_steps(self, state: SaleState, last_steps: Iterable[Step]) -> list[SaleRecord]:
        """Every sale in ``state`` whose last step is one of ``last_steps``, whatever its date:
        the caller measures how long ago on the monotonic clock (a stepped wall clock cannot
        be trusted to say)."""
        return self.query(states=[state], last_steps=last_steps)

    def outside_writes(self) -> int:
        """SQLite's ``data_version``: it changes when another connection commits to the
        journal (another process: ``kiosk-agent sales resolve`` while the agent runs), never
        for this connection's own writes."""
        return int(self.db.execute("PRAGMA data_version").fetchone()[0])

    def attention_sales(self) -> list[SaleRecord]:
        return self.query(states=[SaleState.ATTENTION])

    def query(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        states: list[SaleState] | None = None,
        last_steps: Iterable[Step] | None = None,
        limit: int | None = None,
        kind: SaleKind | None = None,
        older_than: tuple[float, int] | None = None,
    ) -> list[SaleRecord]:
        """Sales newest first, filtered by creation time, state, the name of their last step
        and their kind (sales.kinds; None: every row), all in one query; ``older_than``: only
        those after that place in the order (:meth:`place`: a page's cursor)."""
        where, args = _filters(since, until, states, last_steps, kind, older_than)
        sql = f"{_SELECT_SALES}{where} ORDER BY created_at DESC, sales.rowid DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return self._with_later([_record(r) for r in self.db.execute(sql, args)])

    def pages(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        states: list[SaleState] | None = None,
        limit: int | None = None,
        size: int = 500,
        kind: SaleKind | None = None,
        older_than: tuple[float, int] | None = None,
    ) -> Iterator[list[SaleRecord]]:
        """:meth:`query`'s sales a page of ``size`` at a time, in its order, each page read
        when asked for: an export of a year of sales from the event loop lets the loop run
        between pages (one query of 100,000 sales held it for 2 s). Pages follow the last
        sale seen (its time and rowid), so a sale made meanwhile neither repeats nor shifts
        them; ``older_than``: from that place in the order on (:meth:`place`)."""
        where, args = _filters(since, until, states, None, kind)
        later = self._every_later()
        after = older_than
        left = limit
        while left is None or left > 0:
            clause, page_args = where, list(args)
            if after is not None:
                clause += " AND " if clause else " WHERE "
                clause += "(created_at < ? OR (created_at = ? AND sales.rowid < ?))"
                page_args += [after[0], after[0], after[1]]
            wanted = size if left is None else min(size, left)
            sql = (
                _SELECT_SALES.replace("SELECT sales.*", "SELECT sales.rowid AS page_rowid, sales.*")
                + f"{clause} ORDER BY created_at DESC, sales.rowid DESC LIMIT ?"
            )
            rows = self.db.execute(sql, [*page_args, wanted]).fetchall()
            if not rows:
                return
            yield self._with_later([_record(r) for r in rows], later)
            after = (rows[-1]["created_at"], rows[-1]["page_rowid"])
            if left is not None:
                left -= len(rows)
            if len(rows) < wanted:
                return

    def place(self, sale_id: str) -> tuple[float, int] | None:
        """A sale's place in the order every listing reads (newest first, ties by rowid), or
        None: the cursor of a page that ends with it."""
        row = self.db.execute(
            "SELECT created_at, rowid FROM sales WHERE sale_id = ?", (sale_id,)
        ).fetchone()
        return None if row is None else (float(row[0]), int(row[1]))

    def count(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        states: list[SaleState] | None = None,
        kind: SaleKind | None = None,
        older_than: tuple[float, int] | None = None,
    ) -> int:
        """How many sales :meth:`query` would give without a limit."""
        if kind is SaleKind.SALE:
            # both counts read an index (the sessions' is partial); NOT read every row: 0.24 s
            # for 200,000 sales
            return self.count(
                since=since, until=until, states=states, older_than=older_than
            ) - self.count(since=since, until=until, states=states, older_than=older_than,
                           kind=SaleKind.NO_SELECTION)
        where, args = _filters(since, until, states, None, kind, older_than)
        # the clause is ours; every value travels as an argument
        sql = f"SELECT COUNT(*) FROM sales{where}"  # noqa: S608
        return int(self.db.execute(sql, args).fetchone()[0])

    def last_trans_id(self) -> str | None:
        """The newest completed sale's transaction (a receipt to test-print), if any."""
        row = self.db.execute(
            "SELECT trans_id FROM sales WHERE state = ? AND trans_id IS NOT NULL AND trans_id != ''"
            " ORDER BY created_at DESC, rowid DESC LIMIT 1",
            (SaleState.COMPLETED.value,),
        ).fetchone()
        return None if row is None else str(row[0])

    def steps(self, sale_id: str) -> list[StepRecord]:
        rows = self.db.execute(
            "SELECT * FROM steps WHERE sale_id = ? ORDER BY id", (sale_id,)
        ).fetchall()
        return [
            StepRecord(
                r["sale_id"], r["at"], r["step"], SaleState(r["state"]), json.loads(r["detail"])
            )
            for r in rows
        ]

    def late_vend_steps(self, since: float) -> list[StepRecord]:
        """The ``late.vend`` and ``late.vend.seen`` steps journaled at ``since`` or later, in
        time order (sales/late_vends.py), from their own partial index. While that index is
        built (the first start on a journal made before it), among the steps written since the
        journal opened: a journal without the index holds none from before, but for a start
        that died within its build (those are read once it is built)."""
        after = self.late_vend_after
        if after is not None:
            rows = self.db.execute(
                "SELECT * FROM steps WHERE id > ? AND step IN ('late.vend', 'late.vend.seen') "
                "AND at >= ? ORDER BY at", (after, since)
            ).fetchall()
        else:
            rows = self.db.execute(
                "SELECT * FROM steps WHERE step IN ('late.vend', 'late.vend.seen') AND at >= ? "
                "ORDER BY at", (since,)
            ).fetchall()
        return [
            StepRecord(
                r["sale_id"], r["at"], r["step"], SaleState(r["state"]), json.loads(r["detail"])
            )
            for r in rows
        ]

    def steps_since(self, at: float, limit: int) -> list[StepRecord]:
        """The steps journaled at ``at`` or later, in their order, at most ``limit`` (a live
        view catching up after it lost its connection)."""
        rows = self.db.execute(
            "SELECT * FROM steps WHERE at >= ? ORDER BY id LIMIT ?", (at, limit)
        ).fetchall()
        return [
            StepRecord(
                r["sale_id"], r["at"], r["step"], SaleState(r["state"]), json.loads(r["detail"])
            )
            for r in rows
        ]

    def today(self, now: float | None = None) -> tuple[int, int]:
        """(count, cents) of today's completed sales: those created on its UTC day, by the one
        rule of days (kiosk_agent.moments), as ``sales --since today --until today`` lists them
        (none of a later day's: a wall clock stepped back over midnight)."""
        midnight, next_midnight = day_bounds(now if now is not None else self.clock.time())
        row = self.db.execute(
            # by the time it was created (its index); "+state" keeps the planner off the
            # state's index, which would read every completed sale of the journal
            "SELECT COUNT(*), COALESCE(SUM(captured_cents), 0) FROM sales "
            "WHERE created_at >= ? AND created_at < ? AND +state = ?",
            (midnight, next_midnight, SaleState.COMPLETED.value),
        ).fetchone()
        return int(row[0]), int(row[1])

    def given_back_today(self, now: float | None = None) -> tuple[int, int]:
        """(count, cents) of what others gave back at the service, later, of today's completed
        sales (the sales :meth:`today` counts, the same day's rule): the sum of their
        ``sale_later`` notes' cents where above 0, as the export's ``given_back_by_others``
        sums over ``sales --since today --until today``. The day's completed sales are read by
        their index, as :meth:`today` reads them, each one's note by its key: 12-32 us of CPU on
        200,000 sales with 200 notes, where reading the notes first cost 400-420 us (their
        number grows with the years, the day's sales do not)."""
        midnight, next_midnight = day_bounds(now if now is not None else self.clock.time())
        row = self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(l.later_cents), 0) "  # noqa: S608 - its own name
            f"FROM {LATER_TABLE} AS l "
            "JOIN sales AS s ON s.sale_id = l.sale_id "
            "WHERE l.later_cents > 0 AND s.created_at >= ? AND s.created_at < ? "
            "AND s.state = ?",
            (midnight, next_midnight, SaleState.COMPLETED.value),
        ).fetchone()
        return int(row[0]), int(row[1])

    def __iter__(self) -> Iterator[SaleRecord]:
        return iter(self.query())



def _filters(
    since: float | None,
    until: float | None,
    states: list[SaleState] | None,
    last_steps: Iterable[Step] | None,
    kind: SaleKind | None = None,
    older_than: tuple[float, int] | None = None,
) -> tuple[str, list[Any]]:
    """The WHERE clause (with its leading space, or empty) and its arguments of a sales query;
    ``older_than``: a sale's place in the order (:meth:`JournalReads.place`), the sales after it."""
    where: list[str] = []
    args: list[Any] = []
    if older_than is not None:
        where.append("(created_at < ? OR (created_at = ? AND sales.rowid < ?))")
        args += [older_than[0], older_than[0], older_than[1]]
    if since is not None:
        where.append("created_at >= ?")
        args.append(since)
    if until is not None:
        where.append("created_at < ?")
        args.append(until)
    if states:
        where.append(f"state IN ({', '.join('?' for _ in states)})")
        args.extend(s.value for s in states)
    steps = sorted(last_steps or ())
    if steps:
        marks = ", ".join("?" for _ in steps)
        last = "SELECT step FROM steps WHERE steps.sale_id = sales.sale_id ORDER BY id DESC"
        where.append(f"({last} LIMIT 1) IN ({marks})")
        args.extend(steps)
    if condition := kind_sql(kind):
        where.append(condition)
    return (" WHERE " + " AND ".join(where) if where else ""), args


