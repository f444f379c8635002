"""The audit's writes (a read, its comparison, a refill) are the agent's own writes on the
journal's connection, on the event loop: like a sale's, the events' and the health probe's, they
ask a build of an index (or a prune's batch) under way to give way, instead of waiting out its
scan with the whole event loop (i39-review2)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from kiosk_agent.audit.store import AuditStore
from kiosk_agent.sales.journal import _LATE_VEND_INDEX, Journal
from tests.audit.helpers import figures
from tests.sales.test_indexes_after_ready import BOTH, _indexes, _made_before, _write_lock_held


def test_an_audit_read_written_during_an_index_build_goes_first(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _made_before(path, 10, dropped=("steps_late_vend",))
    journal = Journal(path)
    journal.open()
    store = AuditStore(lambda: journal.db, gives_way=journal.prune_gives_way)
    store.open()
    aside = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    aside.execute("PRAGMA busy_timeout=5000")
    building, writing, looked = threading.Event(), threading.Event(), threading.Event()
    idle_asked: list[str] = []

    def scanning() -> int:
        if not building.is_set() and _write_lock_held(path):  # inside its scan
            building.set()
            writing.wait(10)
        return 0

    def idle() -> bool:
        idle_asked.append("idle?")
        if len(idle_asked) > 1:  # before a second run: once the read's side has looked
            looked.wait(10)
        return True

    aside.set_progress_handler(scanning, 1)
    seen_after_the_read: list[set[str]] = []

    def read() -> None:
        building.wait(10)
        writing.set()  # the build goes on from here, unless the read's ask ends it
        store.add_read(figures((3, 450)), at=1.0, step_mark=0, clean=True)
        seen_after_the_read.append(_indexes(path))
        looked.set()

    writer = threading.Thread(target=read)
    writer.start()
    try:
        assert journal.giving_way(aside, _LATE_VEND_INDEX, idle=idle, idle_wait=10.0) is True
    finally:
        writer.join(10)
        aside.close()
    assert not writer.is_alive()
    assert seen_after_the_read == [{"sales_no_selection"}]  # the read went first
    assert len(idle_asked) == 2  # the build ran again after it
    assert _indexes(path) == set(BOTH)
    assert store.last_read() is not None
    journal.close()
