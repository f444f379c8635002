"""What the journal's connection keeps for the whole run (issue 33's idle memory): the statements
a start runs once are not kept prepared on it."""

from __future__ import annotations

import gc
import shutil
import sqlite3
from pathlib import Path

from kiosk_agent.sales.journal import CACHE_KIB, Journal


def prepared_statements(db: sqlite3.Connection) -> int:
    """The statements Python's sqlite3 keeps prepared on ``db``: its statement cache, an LRU
    the connection holds (CPython's; each entry holds SQLite's compiled program)."""
    caches = [r for r in gc.get_referents(db) if hasattr(r, "cache_info")]
    assert len(caches) == 1, "the connection's statement cache was not found"
    return int(caches[0].cache_info().currsize)


def test_a_new_journal_keeps_none_of_its_setups_statements(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    try:
        # the migration's 22 statements were kept on main (17 on a journal already made)
        assert prepared_statements(journal.db) == 0
        # the run's settings are on the connection the run writes with
        assert journal.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert journal.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert journal.db.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
        assert journal.db.execute("PRAGMA cache_size").fetchone()[0] == -CACHE_KIB
        assert journal.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert journal.db.row_factory is sqlite3.Row
    finally:
        journal.close()
    again = Journal(tmp_path / "journal.db")
    again.open()
    again.checkpoint_aside()  # the running agent's: SQLite's own checkpoints off
    again.close()
    again.open()  # as put_back opens it again
    try:
        assert prepared_statements(again.db) == 0
        assert again.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    finally:
        again.close()


def test_the_setups_close_leaves_the_wal_of_a_crashed_run_as_it_was(tmp_path: Path) -> None:
    """The setup's connection closes after the run's has read the file: SQLite checkpoints and
    deletes the WAL at the close of the file's last connection only, so the committed frames a
    crash left stay where they were (copied back when the agent checkpoints them, aside)."""
    made = Journal(tmp_path / "made.db")
    made.open()
    made.close()
    writer = sqlite3.connect(tmp_path / "made.db", isolation_level=None)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("PRAGMA foreign_keys=OFF")
    for n in range(40):
        writer.execute("INSERT INTO sale_sends (sale_id, sent_at) VALUES (?, 1.0)", (f"s{n}",))
    for side in ("", "-wal", "-shm"):  # the files as a killed process leaves them
        shutil.copy(tmp_path / f"made.db{side}", tmp_path / f"crashed.db{side}")
    writer.close()
    wal = tmp_path / "crashed.db-wal"
    left = wal.stat().st_size
    assert left > 40 * 4096
    journal = Journal(tmp_path / "crashed.db")
    journal.open()
    try:
        assert wal.stat().st_size == left
        assert journal.db.execute("SELECT count(*) FROM sale_sends").fetchone()[0] == 40
    finally:
        journal.close()
