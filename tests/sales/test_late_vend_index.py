"""The late-vend index on a journal made before it: built after ready, never on the way to it.

Its build is a scan of every step (200,000 sales: docs/journal.md); ``Journal.open`` makes it
only on a journal with no steps yet, and otherwise leaves it to the agent after READY=1 (a
worker thread, ``Journal.build_indexes``). Meanwhile the late-vend read looks among the
steps written since the journal opened: a journal without the index holds no late vend from
before, but for a start that died within its build, whose late vends show once it is built.
Real SQLite files throughout.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.late_vends import LateVendWatch
from kiosk_agent.sales.model import Flow
from kiosk_agent.sales.states import SaleState, Step

from ..helpers import walk_to
from ..platforms.agent_rig import running_agent
from .test_journal import statements_of


def _reversed(journal: Journal, n: int) -> SaleRecord:
    record = journal.create(SaleRecord(
        sale_id=f"sale{n:04d}", order_id=f"KASALE{n:04d}", source="mdb:front",
        flow=Flow.AUTHORIZE_CAPTURE.value, terminal="SIM-0001", amount_cents=150,
        state=SaleState.STARTED,
    ))  # fmt: skip
    return walk_to(journal, record, SaleState.REVERSED)  # type: ignore[no-any-return]


def _made_before_the_index(path: Path, sales: int, late: int | None = None) -> None:
    """A journal of ``sales`` given-back sales as a release before the index left it (the
    index dropped); ``late``: that sale's late vend journaled before it, as by a start that
    died within the build."""
    journal = Journal(path)
    journal.open()
    for n in range(sales):
        record = _reversed(journal, n)
        if n == late:
            journal.record(record, Step.LATE_VEND, detail={"product": "B1", "source": "mdb:front"})
    journal.close()
    db = sqlite3.connect(path)
    db.execute("DROP INDEX steps_late_vend")
    db.commit()
    db.close()


def _has_index(path: Path) -> bool:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'steps_late_vend'"
                          ).fetchone() is not None
    finally:
        db.close()


def _plan(journal: Journal, since: float) -> list[str]:
    statements = statements_of(journal, lambda: journal.late_vend_steps(since))
    [sql] = [s for s in statements if "late.vend" in s]
    return [str(row[3]) for row in journal.db.execute(f"EXPLAIN QUERY PLAN {sql}")]


def test_a_new_journal_has_the_index_at_open(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    assert journal.late_vend_after is None
    assert _has_index(tmp_path / "journal.db")
    assert journal.build_indexes() == []  # nothing left to do
    journal.close()


def test_open_leaves_the_build_and_the_read_looks_at_this_starts_steps(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _made_before_the_index(path, 40)
    journal = Journal(path)
    journal.open()
    steps = sqlite3.connect(path).execute("SELECT count(*), max(id) FROM steps").fetchone()
    assert steps[0] > 40
    assert journal.late_vend_after == steps[1]  # the last step at open
    assert not _has_index(path)  # open did not scan the steps
    # meanwhile: the steps written since the open, by their ids, not a scan of them all
    assert _plan(journal, 0.0) == ["SEARCH steps USING INTEGER PRIMARY KEY (rowid>?)",
                                   "USE TEMP B-TREE FOR ORDER BY"]
    record = _reversed(journal, 99)
    journal.record(record, Step.LATE_VEND, detail={"product": "A1", "source": "mdb:front"})
    watch = LateVendWatch(journal, journal.clock)
    assert "sale0099" in (watch.problem() or "")
    assert journal.build_indexes() == ["steps_late_vend"]
    assert journal.late_vend_after is None
    assert _has_index(path)
    assert _plan(journal, 0.0) == ["SEARCH steps USING INDEX steps_late_vend (at>?)"]
    assert "sale0099" in (watch.problem() or "")
    journal.close()


async def test_the_agent_builds_it_after_ready(tmp_path: Path, sim_settings: Any) -> None:
    """Through the real agent: open left the index (above), the agent builds it with what
    READY=1 does not wait for; the late vend of a start that died within the build is shown
    from then on."""
    path = tmp_path / "journal.db"
    _made_before_the_index(path, 30, late=7)
    async with running_agent(tmp_path, sim_settings, []) as agent:
        await agent.settled.wait()
        assert _has_index(path)
        assert agent.journal.late_vend_after is None
        [problem] = [p for p in agent.health.snapshot().problems
                     if "dispensed after the sale gave up" in p]
        assert "sale0007" in problem
        assert "B1" in problem
