"""The machine's audit reads, their comparisons and the refills, in the journal's database.

New tables of their own (``audit_reads``, ``audit_comparisons``, ``audit_fills``): the previous
release never reads them, so it still runs on a journal this one wrote (docs/operations.md,
"Rolling back"), as ``sales/events.py`` keeps ``agent_events``. Reads are kept as long as sales
are (:meth:`AuditStore.prune` takes the journal's retention).

Each read keeps the journal's last step id when it was taken (``step_mark``): the journal's
sales that vended between two reads are those whose vend step was written between the two
marks, an order no wall-clock step can change.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kiosk_agent.audit.books import Figures
from kiosk_agent.audit.reconcile import CardSale, Change, Comparison
from kiosk_agent.sales.journal import CHARGE_LOOKBACK_S, transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_reads (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    at        REAL NOT NULL,
    step_mark INTEGER NOT NULL,
    clean     INTEGER NOT NULL,
    machine   TEXT NOT NULL DEFAULT '',
    figures   TEXT NOT NULL,
    changes   TEXT NOT NULL DEFAULT '[]',
    raw       BLOB
);
CREATE INDEX IF NOT EXISTS audit_reads_at ON audit_reads(at);
CREATE TABLE IF NOT EXISTS audit_comparisons (
    read_id   INTEGER PRIMARY KEY,
    from_read INTEGER NOT NULL,
    verdict   TEXT NOT NULL,
    detail    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS audit_fills (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    at        REAL NOT NULL,
    column_id TEXT NOT NULL,
    read_id   INTEGER,
    by        TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS audit_fills_column ON audit_fills(column_id);
"""

# A step that journaled a vend the machine confirmed: its detail is the dispense outcome
# (``live.outcome_detail``), status "vended" (authorize_capture's capture.request, charge_card's
# completed step, or its attention when the charge answered above the price).
_VENDED = "json_extract(steps.detail, '$.status') = 'vended'"


@dataclass(frozen=True, slots=True)
class StoredRead:
    id: int
    at: float
    step_mark: int
    clean: bool
    figures: Figures
    changes: tuple[Change, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": self.at,
            "clean": self.clean,
            "figures": self.figures.as_dict(),
            "changes": [c.as_dict() for c in self.changes],
        }


@dataclass(frozen=True, slots=True)
class Fill:
    column: str
    at: float
    read_id: int | None  # the last read before the refill: sales are counted from it
    by: str = ""


class AuditStore:
    """The audit tables beside the sales, on the journal's open connection."""

    def __init__(
        self,
        db: Callable[[], sqlite3.Connection],
        gives_way: Callable[[], threading.Event | None] | None = None,
    ) -> None:
        self._db = db  # e.g. ``lambda: journal.db``
        # asked before each write, as the journal's own writes ask (Journal.prune_gives_way):
        # an index's build or a prune's batch under way rolls back, and the write does not wait
        # out its scan with the whole event loop; the write sets the event once it holds the lock
        self._gives_way = gives_way

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        way_taken = self._gives_way() if self._gives_way is not None else None
        with transaction(self._db()) as db:
            if way_taken is not None:
                way_taken.set()
            yield db

    def open(self) -> None:
        """Create the tables (idempotent); the journal must be open."""
        self._db().executescript(_SCHEMA)

    def exists(self) -> bool:
        """Whether the journal holds the audit tables (an agent with `dex:` has run on it)."""
        row = self._db().execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'audit_reads'"
        ).fetchone()
        return row is not None

    # -- reads -----------------------------------------------------------------------------------

    def step_mark(self) -> int:
        """The journal's last step id now: where a read taken now stands among the sales."""
        row = self._db().execute("SELECT COALESCE(MAX(id), 0) FROM steps").fetchone()
        return int(row[0])

    def add_read(
        self,
        figures: Figures,
        *,
        at: float,
        step_mark: int,
        clean: bool,
        changes: Sequence[Change] = (),
        raw: bytes | None = None,
    ) -> StoredRead:
        with self._write() as db:
            cursor = db.execute(
                "INSERT INTO audit_reads (at, step_mark, clean, machine, figures, changes, raw)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    at,
                    step_mark,
                    int(clean),
                    figures.machine,
                    json.dumps(figures.as_dict()),
                    json.dumps([c.as_dict() for c in changes]),
                    raw,
                ),
            )
        read_id = cursor.lastrowid
        if read_id is None:
            raise RuntimeError("the audit read was stored without a row id")
        return StoredRead(read_id, at, step_mark, clean, figures, tuple(changes))

    def reads(self, limit: int = 50, *, clean: bool | None = None,
              before: int | None = None) -> list[StoredRead]:
        """The newest reads first (only clean ones, or only those before a read id, if asked)."""
        where: list[str] = []
        args: list[Any] = []
        if clean is not None:
            where.append("clean = ?")
            args.append(int(clean))
        if before is not None:
            where.append("id < ?")
            args.append(before)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self._db().execute(
            "SELECT id, at, step_mark, clean, figures, changes FROM audit_reads"  # noqa: S608
            f"{clause} ORDER BY id DESC LIMIT ?",
            (*args, limit),
        )
        return [_read(row) for row in rows]

    def last_read(self) -> StoredRead | None:
        found = self.reads(1)
        return found[0] if found else None

    def raw(self, read_id: int) -> bytes | None:
        row = self._db().execute("SELECT raw FROM audit_reads WHERE id = ?", (read_id,)).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    # -- the journal's card sales ----------------------------------------------------------------

    def card_sales(self, sources: Iterable[str], after: int, until: int) -> list[CardSale]:
        """The sales of ``sources`` whose vend step was written after step ``after`` and at or
        before step ``until``, in the order of their vends."""
        return self._card_sales(sources, "first.id > ?", after, until)

    def card_sales_from(self, sources: Iterable[str], at: float, until: int) -> list[CardSale]:
        """The sales of ``sources`` whose vend step was written at or after the wall time
        ``at`` and at or before step ``until``: a stretch's sales before its first interval."""
        return self._card_sales(sources, "first.at >= ?", at, until)

    def _card_sales(
        self, sources: Iterable[str], start: str, after: float, until: int
    ) -> list[CardSale]:
        names = list(sources)
        if not names:
            return []
        marks = ", ".join("?" for _ in names)
        rows = self._db().execute(
            "SELECT sales.sale_id, sales.vended_cents, sales.product, sales.state,"  # noqa: S608
            " first.id, first.at FROM sales JOIN ("
            f" SELECT steps.sale_id, MIN(steps.id) AS id, steps.at FROM steps WHERE {_VENDED}"
            " GROUP BY steps.sale_id) AS first ON first.sale_id = sales.sale_id"
            f" WHERE sales.source IN ({marks}) AND {start} AND first.id <= ?"
            " ORDER BY first.id",
            (*names, after, until),
        )
        return [
            CardSale(
                sale_id=r[0], vended_cents=int(r[1]), product=r[2], state=r[3], vended_at=r[5]
            )
            for r in rows
        ]

    # -- comparisons -----------------------------------------------------------------------------

    def add_comparison(self, read_id: int, from_read: int, comparison: Comparison) -> None:
        with self._write() as db:
            db.execute(
                "INSERT OR REPLACE INTO audit_comparisons (read_id, from_read, verdict, detail)"
                " VALUES (?, ?, ?, ?)",
                (read_id, from_read, comparison.verdict, json.dumps(comparison.as_dict())),
            )

    def comparisons(self, limit: int = 50) -> list[Comparison]:
        rows = self._db().execute(
            "SELECT detail FROM audit_comparisons ORDER BY read_id DESC LIMIT ?", (limit,)
        )
        return [Comparison.of(json.loads(row[0])) for row in rows]

    def comparisons_since(self, at: float) -> list[Comparison]:
        """The comparisons of the intervals that ended at or after ``at`` (their read's time),
        oldest first: a stretch's story (a demo's run, ``kiosk-agent audit --since``)."""
        rows = self._db().execute(
            "SELECT audit_comparisons.detail FROM audit_comparisons JOIN audit_reads"
            " ON audit_reads.id = audit_comparisons.read_id WHERE audit_reads.at >= ?"
            " ORDER BY audit_comparisons.read_id",
            (at,),
        )
        return [Comparison.of(json.loads(row[0])) for row in rows]

    def first_base_since(self, at: float) -> StoredRead | None:
        """The read the first interval that ended at or after ``at`` was compared from."""
        row = self._db().execute(
            "SELECT audit_comparisons.from_read FROM audit_comparisons JOIN audit_reads"
            " ON audit_reads.id = audit_comparisons.read_id WHERE audit_reads.at >= ?"
            " ORDER BY audit_comparisons.read_id LIMIT 1",
            (at,),
        ).fetchone()
        return None if row is None else self.read(int(row[0]))

    def last_comparison(self) -> Comparison | None:
        found = self.comparisons(1)
        return found[0] if found else None

    # -- refills ---------------------------------------------------------------------------------

    def record_fill(self, columns: Iterable[str], *, at: float, by: str = "") -> list[Fill]:
        """A refill of ``columns`` now: their sales are counted from the last read before it."""
        last = self.last_read()
        read_id = last.id if last is not None else None
        fills = [Fill(column, at, read_id, by) for column in columns]
        with self._write() as db:
            db.executemany(
                "INSERT INTO audit_fills (at, column_id, read_id, by) VALUES (?, ?, ?, ?)",
                [(f.at, f.column, f.read_id, f.by) for f in fills],
            )
        return fills

    def last_fills(self) -> dict[str, Fill]:
        """Each column's latest refill."""
        rows = self._db().execute(
            "SELECT column_id, at, read_id, by FROM audit_fills WHERE id IN"
            " (SELECT MAX(id) FROM audit_fills GROUP BY column_id)"
        )
        return {r[0]: Fill(r[0], r[1], r[2], r[3]) for r in rows}

    def read(self, read_id: int) -> StoredRead | None:
        row = self._db().execute(
            "SELECT id, at, step_mark, clean, figures, changes FROM audit_reads WHERE id = ?",
            (read_id,),
        ).fetchone()
        return None if row is None else _read(row)

    def first_read_after(self, at: float) -> StoredRead | None:
        row = self._db().execute(
            "SELECT id, at, step_mark, clean, figures, changes FROM audit_reads WHERE at >= ?"
            " ORDER BY id LIMIT 1",
            (at,),
        ).fetchone()
        return None if row is None else _read(row)

    # -- housekeeping ----------------------------------------------------------------------------

    def prune(self, keep_days: int, now: float) -> int:
        """Reads older than the sales the journal keeps (its retention, never under the charge
        check's look-back and a day: ``Journal.prune``); the newest read always stays, as the
        base of the next comparison, with the fills that count from it."""
        cutoff = now - max(keep_days * 86400.0, CHARGE_LOOKBACK_S + 86400.0)
        with self._write() as db:
            newest = db.execute("SELECT COALESCE(MAX(id), 0) FROM audit_reads").fetchone()[0]
            gone = db.execute(
                "DELETE FROM audit_reads WHERE at < ? AND id != ?", (cutoff, newest)
            ).rowcount
            db.execute("DELETE FROM audit_comparisons WHERE read_id NOT IN"
                       " (SELECT id FROM audit_reads)")
            db.execute("DELETE FROM audit_fills WHERE at < ? AND id NOT IN"
                       " (SELECT MAX(id) FROM audit_fills GROUP BY column_id)", (cutoff,))
        return int(gone)


def _read(row: sqlite3.Row | tuple[Any, ...]) -> StoredRead:
    changes = tuple(
        Change(kind=c["kind"], text=c["text"], column=c.get("column", ""))
        for c in json.loads(row[5])
    )
    return StoredRead(
        id=int(row[0]),
        at=float(row[1]),
        step_mark=int(row[2]),
        clean=bool(row[3]),
        figures=Figures.of(json.loads(row[4])),
        changes=changes,
    )
