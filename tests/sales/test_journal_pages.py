"""The pages a commit of the journal writes: each a WAL frame, written and fsynced before the call
the step announces (a vend window's three fsynced commits, bench/hardware.py). Counted from the
WAL itself: the WAL index's header says how many frames the file holds, each frame's header the
page it carries; ``dbstat`` says which table or index that page belongs to."""

from __future__ import annotations

import sqlite3
import struct
import time
from pathlib import Path

import pytest

from kiosk_agent.sales import journal as journal_module
from kiosk_agent.sales.journal import Journal, SaleRecord, integrity
from kiosk_agent.sales.states import SaleState, Step
from tests.helpers import walk_to

# the steps table as the journal made it before 2026-11-30 (schema version 2 all the same)
_STEPS_BEFORE = """CREATE TABLE IF NOT EXISTS steps (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,"""
_STEPS_NOW = """CREATE TABLE IF NOT EXISTS steps (
    id       INTEGER PRIMARY KEY,"""


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    opened = Journal(tmp_path / "journal.db")
    opened.open()
    yield opened
    opened.close()


def new_sale(n: int) -> SaleRecord:
    return SaleRecord(
        sale_id=f"s{n}", order_id=f"KA{n:06d}", source="virtual:front", flow="charge_card",
        terminal="SIM-0001", amount_cents=250, state=SaleState.STARTED,
    )


def frames(path: Path) -> int:
    """The WAL's frames now (``mxFrame`` of the WAL index's header, in the -shm file)."""
    header = path.with_name(path.name + "-shm").read_bytes()[:48]
    return int(struct.unpack_from("=I", header, 16)[0])


def pages_written(journal: Journal, since: int) -> list[str]:
    """The table or index of each page the WAL's frames after ``since`` carry, in order."""
    page_size = int(journal.db.execute("PRAGMA page_size").fetchone()[0])
    names = dict(journal.db.execute("SELECT pageno, name FROM dbstat"))
    wal = journal.path.with_name(journal.path.name + "-wal").read_bytes()
    written = []
    for frame in range(since, frames(journal.path)):
        offset = 32 + frame * (24 + page_size)
        written.append(names.get(struct.unpack_from(">I", wal, offset)[0], "?"))
    return written


def test_a_step_that_keeps_the_state_writes_the_page_of_each_btree_it_changes_and_no_other(
    journal: Journal,
) -> None:
    """bench/hardware.py's floor commit (and the card read's accepted step): the sale's row, the
    step and its place in the steps' index. AUTOINCREMENT wrote a page more in every commit of a
    step (its row of sqlite_sequence), and the UPDATE that named the state though it kept it one
    more (the row's entry in sales_state_created, rewritten to the same value)."""
    sale = journal.create(new_sale(1))
    sale = journal.record(sale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
    for _ in range(3):
        before = frames(journal.path)
        sale = journal.record(sale, Step.CHARGE_CARD_ANSWER)
        assert sorted(pages_written(journal, before)) == ["sales", "steps", "steps_sale"]
    before = frames(journal.path)  # two such steps in one batch: the same three pages
    with journal.batch():
        sale = journal.record(sale, Step.CHARGE_CARD_ANSWER)
        sale = journal.record(sale, Step.CHARGE_CARD_ANSWER)
    assert sorted(pages_written(journal, before)) == ["sales", "steps", "steps_sale"]
    assert journal.get("s1").state is SaleState.CHARGING


def test_a_step_that_moves_the_state_writes_its_place_in_the_states_index(
    journal: Journal,
) -> None:
    sale = journal.create(new_sale(1))
    before = frames(journal.path)
    sale = journal.record(sale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
    assert sorted(pages_written(journal, before)) == [
        "sales", "sales_state_created", "steps", "steps_sale"
    ]
    before = frames(journal.path)
    with journal.batch():  # kept, then moved: the batch's one UPDATE sets the state
        sale = journal.record(sale, Step.CHARGE_CARD_ANSWER)
        sale = journal.record(sale, Step.CHARGE_CARD_DECLINED, SaleState.DECLINED, message="no")
    assert "sales_state_created" in pages_written(journal, before)
    assert journal.get("s1").state is SaleState.DECLINED
    assert [s.sale_id for s in journal.query(states=[SaleState.DECLINED])] == ["s1"]
    assert journal.open_sales() == []


def test_a_sale_created_writes_no_page_of_sqlite_sequence(journal: Journal) -> None:
    before = frames(journal.path)
    journal.create(new_sale(1))
    written = pages_written(journal, before)
    assert "sqlite_sequence" not in written
    assert sorted(set(written)) == sorted(written)  # one page of each


def _journal_made_before(path: Path, steps: int) -> None:
    """A journal as the release before this one made it: its steps table AUTOINCREMENT."""
    made = Journal(path)
    made.open()
    for n in range(1, steps + 1):
        walk_to(made, made.create(new_sale(n)), SaleState.COMPLETED)
    made.close()
    db = sqlite3.connect(path, isolation_level=None)
    # the same rows in a table made by the previous release's own statement
    [made_before] = [s for s in journal_module._SCHEMA.split(";") if _STEPS_NOW in s]
    db.execute("ALTER TABLE steps RENAME TO steps_now")
    db.execute(made_before.replace(_STEPS_NOW, _STEPS_BEFORE))
    db.execute("INSERT INTO steps SELECT * FROM steps_now")
    db.execute("DROP TABLE steps_now")
    db.execute("CREATE INDEX IF NOT EXISTS steps_sale ON steps(sale_id)")
    db.execute(journal_module._LATE_VEND_INDEX)
    db.close()


def test_a_journal_made_with_autoincrement_loses_it_on_open_its_steps_and_ids_kept(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    _journal_made_before(path, 3)
    db = sqlite3.connect(path)
    before = db.execute("SELECT id, sale_id, step FROM steps ORDER BY id").fetchall()
    assert db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'steps'").fetchone() == (
        before[-1][0],
    )
    db.close()
    journal = Journal(path)
    journal.open()
    try:
        made = str(journal.db.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'steps'").fetchone()[0])
        assert "AUTOINCREMENT" not in made.upper()
        assert "INTEGER PRIMARY KEY" in made
        assert journal.db.execute(
            "SELECT COUNT(*) FROM sqlite_sequence WHERE name = 'steps'").fetchone()[0] == 0
        assert [tuple(r) for r in journal.db.execute(
            "SELECT id, sale_id, step FROM steps ORDER BY id")] == before
        # the next step's id follows the last one's, and its commit writes no sequence page
        sale = journal.create(new_sale(9))
        mark = frames(journal.path)
        journal.record(sale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
        assert "sqlite_sequence" not in pages_written(journal, mark)
        assert [s.step for s in journal.steps("s9")] == ["created", "charge_card.request"]
        ids = [r[0] for r in journal.db.execute("SELECT id FROM steps WHERE sale_id = 's9'")]
        assert ids == [before[-1][0] + 1, before[-1][0] + 2]
        assert int(journal.db.execute("PRAGMA user_version").fetchone()[0]) == 2
    finally:
        journal.close()
    assert integrity(path) == []
    # opened again: nothing left to change
    again = Journal(path)
    again.open()
    again.close()
    assert integrity(path) == []


def test_the_previous_release_runs_on_the_journal_without_autoincrement(tmp_path: Path) -> None:
    """Its open runs its own schema (every statement IF NOT EXISTS) and writes steps as before:
    the table it finds is the same on disk; only where a new id comes from changed."""
    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.open()
    walk_to(journal, journal.create(new_sale(1)), SaleState.COMPLETED)
    last = int(journal.db.execute("SELECT max(id) FROM steps").fetchone()[0])
    journal.close()
    previous = sqlite3.connect(path, isolation_level=None)
    previous.executescript(journal_module._SCHEMA.replace(_STEPS_NOW, _STEPS_BEFORE))
    previous.execute(
        "INSERT INTO steps (sale_id, at, step, state, detail) VALUES ('s1', 1.0, 'note', "
        "'completed', '{}')"
    )
    assert previous.execute("SELECT max(id) FROM steps").fetchone()[0] == last + 1
    previous.close()
    assert integrity(path) == []


def test_prune_keeps_the_sale_of_the_newest_step_so_no_step_id_is_given_twice(
    journal: Journal,
) -> None:
    """A step's id is the highest one + 1: had the prune deleted every old sale, the next step
    would take an id given before (the audit's marks and the late-vend read take ids for places
    in time). Here every sale is old: all go but the one the newest step belongs to."""
    for n in range(1, 5):
        walk_to(journal, journal.create(new_sale(n)), SaleState.COMPLETED)
    newest = int(journal.db.execute("SELECT max(id) FROM steps").fetchone()[0])
    assert journal.prune(keep_days=1, now=time.time() + 30 * 86400) == 3
    assert [s.sale_id for s in journal.query()] == ["s4"]
    journal.create(new_sale(5))
    assert int(journal.db.execute("SELECT max(id) FROM steps").fetchone()[0]) == newest + 1
    # once another sale holds the newest step, the one that held it goes too
    assert journal.prune(keep_days=1, now=time.time() + 30 * 86400) == 1
    assert [s.sale_id for s in journal.query()] == ["s5"]


class _Defensive:
    """A connection whose SQLite refuses to edit the schema's text (SQLITE_DBCONFIG_DEFENSIVE,
    which a build may set): every other statement goes through."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    @property
    def in_transaction(self) -> bool:
        return self.db.in_transaction

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if sql.startswith("UPDATE sqlite_master"):
            raise sqlite3.OperationalError("table sqlite_master may not be modified")
        return self.db.execute(sql, *args)


def test_a_sqlite_that_refuses_the_edit_leaves_the_steps_table_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _journal_made_before(path, 1)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    journal_module._steps_without_autoincrement(_Defensive(db))  # type: ignore[arg-type]
    db.execute("COMMIT")
    assert "AUTOINCREMENT" in db.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'steps'").fetchone()[0]
    assert db.execute("SELECT COUNT(*) FROM sqlite_sequence WHERE name = 'steps'").fetchone() == (
        1,)
    assert db.execute("PRAGMA writable_schema").fetchone() == (0,)
    db.close()
    journal = Journal(path)  # then opened where SQLite allows it: migrated, taking steps
    journal.open()
    try:
        walk_to(journal, journal.create(new_sale(2)), SaleState.COMPLETED)
    finally:
        journal.close()
    assert integrity(path) == []
