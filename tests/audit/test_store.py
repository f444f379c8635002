"""Reads stored beside the sales, compared with the journal's vends, and the stock they leave."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kiosk_agent.audit.books import figures_of
from kiosk_agent.audit.evadts import parse_audit, render_audit
from kiosk_agent.audit.ledger import column_stock, record_read
from kiosk_agent.audit.store import AuditStore
from kiosk_agent.sales.journal import Journal
from tests.audit.helpers import MACHINE, figures, unvended_sale, vended_sale

TEN = 1_764_324_000.0


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    opened = Journal(tmp_path / "journal.db")
    opened.open()
    yield opened
    opened.close()


@pytest.fixture
def store(journal: Journal) -> AuditStore:
    books = AuditStore(lambda: journal.db)
    books.open()
    return books


def test_the_tables_are_new_ones_the_previous_release_never_reads(
    journal: Journal, store: AuditStore
) -> None:
    tables = {r[0] for r in journal.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"audit_reads", "audit_comparisons", "audit_fills"} <= tables
    columns = [r[1] for r in journal.db.execute("PRAGMA table_info(sales)")]
    assert not any(c.startswith("audit") for c in columns)


def test_the_first_read_is_the_base_and_the_next_is_compared(
    journal: Journal, store: AuditStore
) -> None:
    first = record_read(store, figures((10, 1500)), at=TEN, clean=True, sources=[MACHINE])
    assert first.comparison is None
    vended_sale(journal, 150)
    vended_sale(journal, 150)
    second = record_read(store, figures((12, 1800)), at=TEN + 60, clean=True, sources=[MACHINE])
    assert second.comparison is not None
    assert second.comparison.verdict == "match"
    assert store.last_comparison() == second.comparison


def test_a_vend_the_agent_never_heard_of_is_caught(journal: Journal, store: AuditStore) -> None:
    record_read(store, figures((10, 1500)), at=TEN, clean=True, sources=[MACHINE])
    kept = vended_sale(journal, 150)
    given_back = unvended_sale(journal, 150)  # the power cut: money back, product out
    second = record_read(store, figures((12, 1800)), at=TEN + 60, clean=True, sources=[MACHINE])
    assert second.comparison is not None
    assert second.comparison.mismatch
    assert [s.sale_id for s in second.comparison.sales] == [kept.sale_id]
    assert given_back.sale_id not in second.comparison.text()


def test_only_the_machines_own_sales_count(journal: Journal, store: AuditStore) -> None:
    record_read(store, figures((10, 1500)), at=TEN, clean=True, sources=[MACHINE])
    vended_sale(journal, 150, source="kiosk_api:front")
    second = record_read(store, figures((10, 1500)), at=TEN + 60, clean=True, sources=[MACHINE])
    assert second.comparison is not None
    assert second.comparison.verdict == "match"


def test_a_read_taken_during_a_sale_is_stored_but_is_no_boundary(
    journal: Journal, store: AuditStore
) -> None:
    record_read(store, figures((10, 1500)), at=TEN, clean=True, sources=[MACHINE])
    vended_sale(journal, 150)
    during = record_read(store, figures((10, 1500)), at=TEN + 30, clean=False, sources=[MACHINE])
    assert during.comparison is None
    assert not during.read.clean
    vended_sale(journal, 150)
    after = record_read(store, figures((12, 1800)), at=TEN + 60, clean=True, sources=[MACHINE])
    assert after.comparison is not None
    assert after.comparison.verdict == "match"
    assert after.comparison.since == TEN


def test_each_read_keeps_its_changes_to_the_read_before(store: AuditStore) -> None:
    record_read(store, figures((1, 150), columns={"A1": (150, 1, 1)}), at=TEN, clean=True,
                sources=[MACHINE])
    second = record_read(store, figures((1, 150), columns={"A1": (175, 1, 1), "A2": (250, 0, 0)}),
                         at=TEN + 60, clean=True, sources=[MACHINE])
    stored = store.read(second.read.id)
    assert stored is not None
    assert [c.kind for c in stored.changes] == ["added", "price"]


def test_stock_counts_every_paid_vend_since_the_refill(store: AuditStore) -> None:
    planogram = {"A1": 10, "A2": 5}
    record_read(store, figures((0, 0), columns={"A1": (150, 2, 1), "A2": (250, 0, 0)}), at=TEN,
                clean=True, sources=[MACHINE])
    store.record_fill(["A1", "A2"], at=TEN + 1)
    record_read(store, figures((4, 700), columns={"A1": (150, 5, 2), "A2": (250, 4, 2)}),
                at=TEN + 60, clean=True, sources=[MACHINE])
    stock = {c.column: c for c in column_stock(store, planogram, low_at=1)}
    assert (stock["A1"].sold_since_fill, stock["A1"].estimate, stock["A1"].low) == (3, 7, False)
    assert (stock["A2"].sold_since_fill, stock["A2"].estimate, stock["A2"].low) == (4, 1, True)
    store.record_fill(["A2"], at=TEN + 61)
    refilled = {c.column: c for c in column_stock(store, planogram, low_at=1)}
    assert refilled["A2"].estimate == 5
    assert refilled["A1"].estimate == 7


def test_reads_are_pruned_with_the_sales_but_the_newest_stays(store: AuditStore) -> None:
    record_read(store, figures((1, 150)), at=TEN, clean=True, sources=[MACHINE])
    record_read(store, figures((2, 300)), at=TEN + 60, clean=True, sources=[MACHINE])
    assert store.prune(keep_days=30, now=TEN + 29 * 86400) == 0
    assert store.prune(keep_days=30, now=TEN + 31 * 86400) == 1
    assert [r.at for r in store.reads()] == [TEN + 60]


def test_the_raw_file_is_kept_as_read(store: AuditStore) -> None:
    raw = b"DXS*XYZ*VA*V0/6*1\r\nST*001*0001\r\n"
    done = record_read(store, figures((1, 150)), at=TEN, clean=True, sources=[MACHINE], raw=raw)
    assert store.raw(done.read.id) == raw


def _file(da2: tuple[str, ...], pa2: tuple[str, ...] = ("1", "150")) -> bytes:
    return render_audit([("ID1", "VM-1"), ("VA1", "150", "1"), ("DA2", *da2),
                         ("PA1", "A1", "150"), ("PA2", *pa2)])


def test_a_read_with_its_da2_counts_left_empty_is_stored_as_not_sent_and_not_compared(
    journal: Journal, store: AuditStore
) -> None:
    record_read(store, figures_of(parse_audit(_file(("1500", "10")))), at=TEN, clean=True,
                sources=[MACHINE])
    vended_sale(journal, 150)
    blank = figures_of(parse_audit(_file(("", "", "150", "1"), pa2=("", ""))))
    record_read(store, blank, at=TEN + 60, clean=True, sources=[MACHINE])
    stored = store.last_read()
    assert stored is not None
    assert stored.figures.cashless is not None
    assert stored.figures.cashless.since_init is None  # kept as not sent, through the JSON
    assert stored.figures == blank
    comparison = store.last_comparison()
    assert comparison is not None
    assert (comparison.verdict, comparison.cause, comparison.machine) == (
        "not_compared", "unsent", None
    )
    # nor is a column's stock made up from a PA2 whose counts were left empty
    [a1] = column_stock(store, {"A1": 10}, low_at=1)
    assert (a1.sold_since_fill, a1.estimate, a1.low, a1.sold_out) == (None, None, False, False)
