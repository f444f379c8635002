"""The steps table's schema edit (AUTOINCREMENT dropped on open, journal.py's
``_steps_without_autoincrement``) attacked as the field will meet it: once on every unit's
journal, years of sales, SD cards, power cuts, a tech's shell beside it, a rollback after it.

What is promised: the journal opens, ``PRAGMA integrity_check`` says ok, every sale and step is
there, and a step's id is never one given before (the audit's step marks and the late-vend read
take ids for places in time)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from kiosk_agent.audit.store import AuditStore
from kiosk_agent.sales.journal import Journal, SaleRecord, integrity
from kiosk_agent.sales.states import SaleState, Step
from tests.helpers import walk_to
from tests.sales.test_journal_pages import _journal_made_before, new_sale


def _steps(path: Path) -> list[tuple[int, str, str]]:
    db = sqlite3.connect(path)
    try:
        return [tuple(r) for r in db.execute("SELECT id, sale_id, step FROM steps ORDER BY id")]
    finally:
        db.close()


def _seq(path: Path) -> int | None:
    db = sqlite3.connect(path)
    try:
        row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'steps'").fetchone()
        return None if row is None else int(row[0])
    finally:
        db.close()


def _pruned_as_the_previous_release_did(path: Path, *sale_ids: str) -> None:
    """The previous release's prune: every finished sale older than the retention, the one
    that holds the newest step too (a unit that sold nothing for ``keep_days``), the same two
    DELETEs; AUTOINCREMENT's sqlite_sequence keeps the highest id it gave."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        marks = ", ".join("?" for _ in sale_ids)
        db.execute("BEGIN IMMEDIATE")
        db.execute(f"DELETE FROM steps WHERE sale_id IN ({marks})", sale_ids)  # noqa: S608
        db.execute(f"DELETE FROM sales WHERE sale_id IN ({marks})", sale_ids)  # noqa: S608
        db.execute("COMMIT")
    finally:
        db.close()


def _vended(journal: Journal, n: int) -> SaleRecord:
    sale = walk_to(journal, journal.create(new_sale(n)), SaleState.DISPENSING)
    return journal.record(sale, Step.DISPENSE_RESULT, SaleState.COMPLETED,
                          {"status": "vended"}, vended_cents=250)


def test_ids_the_previous_release_gave_and_pruned_are_not_given_again(tmp_path: Path) -> None:
    """The previous release pruned the sales that held its newest steps: their ids are gone
    from the table but not from sqlite_sequence, and AUTOINCREMENT would never give them
    again. The edit must not let the next step take one of them."""
    path = tmp_path / "journal.db"
    _journal_made_before(path, 3)
    given = _seq(path)
    assert given is not None
    previous = sqlite3.connect(path, isolation_level=None)  # an audit read: the previous
    audit = AuditStore(lambda: previous)  # release's, on its journal as it made it
    audit.open()
    mark = audit.step_mark()
    previous.close()
    assert mark == given
    _pruned_as_the_previous_release_did(path, "s2", "s3")
    assert max(i for i, _, _ in _steps(path)) < given
    journal = Journal(path)
    journal.open()
    try:
        _vended(journal, 9)
        ids = [i for i, sale, _ in _steps(path) if sale == "s9"]
        assert min(ids) > given, f"ids {ids} given again (the previous release gave to {given})"
        # the audit's next read counts the sale vended since its last mark
        audit = AuditStore(lambda: journal.db)
        assert [s.sale_id for s in audit.card_sales(["virtual:front"], mark,
                                                    audit.step_mark())] == ["s9"]
    finally:
        journal.close()
    assert integrity(path) == []
    # that step is now the highest id ever given: the next open drops the keyword
    assert _seq(path) == max(i for i, _, _ in _steps(path))
    again = Journal(path)
    again.open()
    try:
        assert "AUTOINCREMENT" not in str(again.db.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'steps'").fetchone()[0]).upper()
        newest = max(i for i, _, _ in _steps(path))
        again.create(new_sale(10))
        assert [i for i, sale, _ in _steps(path) if sale == "s10"] == [newest + 1]
    finally:
        again.close()
    assert integrity(path) == []


def test_a_journal_whose_every_sale_was_pruned_keeps_its_ids_above_the_last_given(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    _journal_made_before(path, 2)
    given = _seq(path)
    _pruned_as_the_previous_release_did(path, "s1", "s2")
    assert _steps(path) == []
    journal = Journal(path)
    journal.open()
    try:
        journal.create(new_sale(3))
    finally:
        journal.close()
    assert _steps(path) == [(given + 1, "s3", "created")]
