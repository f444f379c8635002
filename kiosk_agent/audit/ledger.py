"""What the unit does with a read once it has one: stored with its changes, compared with the
journal, and what each column has left (the faces read it from here).

The one place a read becomes journal rows: the scheduler (``audit/component.py``) and any
command that reads a machine call :func:`record_read`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kiosk_agent.audit.books import Figures
from kiosk_agent.audit.reconcile import (
    Comparison,
    Intervals,
    Side,
    books_restarted,
    changes,
    compare,
)
from kiosk_agent.audit.store import AuditStore, StoredRead


@dataclass(frozen=True, slots=True)
class Recorded:
    read: StoredRead
    comparison: Comparison | None  # None: nothing to compare with (the first clean read)


def record_read(
    store: AuditStore,
    figures: Figures,
    *,
    at: float,
    clean: bool,
    sources: Iterable[str],
    raw: bytes | None = None,
    currency: str = "USD",
    new_books: str = "",
) -> Recorded:
    """Store one read with its changes to the read before, and, when it is clean, compare the
    interval since the last clean read with the journal's card sales of ``sources``.
    ``new_books``: why the machine's books are known to have started again since that read
    (the agent's own virtual machine, made with each run): that interval is a reset of them."""
    mark = store.step_mark()
    before = store.last_read()
    found = changes(before.figures, figures) if before is not None else []
    base = store.reads(1, clean=True)
    read = store.add_read(figures, at=at, step_mark=mark, clean=clean, changes=found, raw=raw)
    if not clean or not base:
        return Recorded(read, None)
    previous = base[0]
    sales = store.card_sales(sources, previous.step_mark, read.step_mark)
    comparison = compare(
        Side(previous.at, previous.figures), Side(read.at, figures), sales,
        currency=figures.currency or currency,
    )
    if new_books and comparison.verdict != "books_reset":
        comparison = books_restarted(comparison, new_books)
    store.add_comparison(read.id, previous.id, comparison)
    return Recorded(read, comparison)


# -- what each column has left -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ColumnStock:
    column: str
    name: str
    price: int | None
    capacity: int | None  # from the planogram; None: not in it
    sold_since_fill: int | None  # None: no read yet since the counting began
    estimate: int | None  # capacity - sold, at least 0; None without a capacity or sales known
    low: bool
    sold_out: bool
    filled_at: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "name": self.name,
            "price": self.price,
            "capacity": self.capacity,
            "sold_since_fill": self.sold_since_fill,
            "estimate": self.estimate,
            "low": self.low,
            "sold_out": self.sold_out,
            "filled_at": self.filled_at,
        }


def column_stock(
    store: AuditStore, planogram: Mapping[str, int], low_at: int
) -> list[ColumnStock]:
    """Per column (the planogram's and the last read's): paid vends (PA2, cash and card) since
    its last refill, counted from the last read before the refill (or from the first read ever
    when it was never filled), and the stock left by the planogram's capacity."""
    latest = store.last_read()
    fills = store.last_fills()
    names = sorted(set(planogram) | set(latest.figures.columns if latest else ()))
    out: list[ColumnStock] = []
    first = store.first_read_after(float("-inf"))
    for name in names:
        fill = fills.get(name)
        base = _base_read(store, fill.read_id if fill else None, fill, first)
        sold = _sold(base, latest, name)
        capacity = planogram.get(name)
        column = latest.figures.columns.get(name) if latest else None
        # the last read has the column but no PA2 counts (none, or left empty): what is left is
        # not known (no 0 sold made up)
        unsent = column is not None and sold is None
        estimate = None if capacity is None or unsent else max(0, capacity - (sold or 0))
        out.append(
            ColumnStock(
                column=name,
                name=column.name if column else "",
                price=column.price if column else None,
                capacity=capacity,
                sold_since_fill=sold,
                estimate=estimate,
                low=estimate is not None and estimate <= low_at,
                sold_out=estimate == 0,
                filled_at=fill.at if fill else None,
            )
        )
    return out


def _base_read(
    store: AuditStore, read_id: int | None, fill: Any, first: StoredRead | None
) -> StoredRead | None:
    if read_id is not None:
        return store.read(read_id)
    if fill is not None:  # filled before any read: counted from the first read after it
        return store.first_read_after(fill.at)
    return first


def _sold(base: StoredRead | None, latest: StoredRead | None, name: str) -> int | None:
    if base is None or latest is None:
        return None
    old, new = base.figures.columns.get(name), latest.figures.columns.get(name)
    if new is None or new.paid is None or new.paid.since_init is None:
        return None  # no PA2, or its since-initialisation counts left empty: not known
    now = new.paid.since_init.count
    if old is None or old.paid is None:
        return 0 if base.id == latest.id else now
    if old.paid.since_init is None:
        return None
    sold = now - old.paid.since_init.count
    return sold if sold >= 0 else now  # re-initialised: from zero


def audit_report(
    store: AuditStore, planogram: Mapping[str, int], low_at: int, *, since: float,
    machine: str = "", comparisons: int = 10, currency: str = "USD",
    sources: Iterable[str] = (),
) -> dict[str, Any]:
    """What every face shows (``kiosk-agent audit``, ``GET /api/audit``, the demo's end): the
    last read, each column's stock, the latest comparisons with the journal, and every interval
    that ended since ``since`` with their sums (``intervals``, ``in_all``); and the journal's
    card sales of ``sources`` since ``since`` that no interval holds (vended before the first
    one's read: a first read that met a sale is no boundary)."""
    last = store.last_read()
    found = store.comparisons(comparisons)
    base = store.first_base_since(since) or last
    before = store.card_sales_from(sources, since, base.step_mark) if base is not None else []
    stretch = Intervals(since, tuple(store.comparisons_since(since)),
                        (last.figures.currency if last else "") or currency, tuple(before))
    return {
        "machine": machine,
        "last_read": None if last is None else {
            "at": last.at, "clean": last.clean, "machine": last.figures.machine,
            "changes": [c.as_dict() for c in last.changes],
        },
        "columns": [c.as_dict() for c in column_stock(store, planogram, low_at)],
        "comparisons": [c.as_dict() for c in found],
        "mismatch": next((c.text() for c in found[:1] if c.mismatch), ""),
        "since": since,
        "intervals": [c.as_dict() for c in stretch.comparisons],
        "in_all": stretch.as_dict(),
    }
