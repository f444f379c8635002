"""The audit's writes (a read, its comparison, a refill) are the agent's own writes on the
journal's connection, on the event loop: like a sale's, the events' and the health probe's, they
ask a build of an index (or a prune's batch) under way to give way, instead of waiting out its
scan with the whole event loop (i39-review2)."""

from __future__ import annotations

from pathlib import Path

from kiosk_agent.audit.store import AuditStore
from kiosk_agent.sales.journal import Journal
from tests.audit.helpers import figures
from tests.sales.test_indexes_after_ready import BOTH, _held_mid_scan, _indexes, _made_before


def test_an_audit_read_written_during_an_index_build_goes_first(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _made_before(path, 10, dropped=("steps_late_vend",))
    journal = Journal(path)
    journal.open()
    store = AuditStore(lambda: journal.db, gives_way=journal.prune_gives_way)
    store.open()
    held = _held_mid_scan(journal, path, lambda: store.add_read(
        figures((3, 450)), at=1.0, step_mark=0, clean=True))
    assert held.built is True
    assert not held.writer_alive
    assert held.seen_after_the_write == [{"sales_no_selection"}]  # the read went first
    assert held.idle_asked == 2  # the build ran again after it
    assert _indexes(path) == set(BOTH)
    assert store.last_read() is not None
    journal.close()
