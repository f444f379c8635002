"""The partial indexes a journal made before them gains after ready, giving way to the sales.

``sales_no_selection`` and ``steps_late_vend`` came after journals were in use. Each build is one
scan of its table inside the journal's write lock (on bench/journal.py's 200,000 sales: 23 ms of
a core for the first, 100 ms for the second, and a sale's write begun meanwhile waited 130 ms
with the whole event loop). ``Journal.open`` builds neither on a journal that has rows for it;
the agent builds them after READY=1 in a worker thread (``Journal.build_indexes``), each begun
when no sale runs and rolled back at the word of one of the agent's own writes, as a batch of
the prune is. Real SQLite files throughout; no timing is asserted.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiosk_agent.sales.events import EventLog
from kiosk_agent.sales.journal import _LATE_VEND_INDEX, Journal, SaleRecord
from kiosk_agent.sales.kinds import SaleKind
from kiosk_agent.sales.model import Flow
from kiosk_agent.sales.states import SaleState

from ..helpers import walk_to
from ..platforms.agent_rig import running_agent
from .test_journal import plans_of

BOTH = ("sales_no_selection", "steps_late_vend")


def _session(journal: Journal, n: int, product: str | None = None) -> SaleRecord:
    """A card-first session given back: with no product, one of no selection (sales.kinds)."""
    record = journal.create(SaleRecord(
        sale_id=f"sale{n:04d}", order_id=f"KASALE{n:04d}", source="mdb:front",
        flow=Flow.AUTHORIZE_CAPTURE.value, terminal="SIM-0001", amount_cents=150,
        state=SaleState.STARTED, product=product,
    ))  # fmt: skip
    return walk_to(journal, record, SaleState.REVERSED)  # type: ignore[no-any-return]


def _made_before(path: Path, sessions: int, *, dropped: tuple[str, ...] = BOTH) -> None:
    """A journal of ``sessions`` card sessions (every third one with a product: a sale) as a
    release before the ``dropped`` indexes left it."""
    journal = Journal(path)
    journal.open()
    for n in range(sessions):
        _session(journal, n, product="A1" if n % 3 == 0 else None)
    journal.close()
    db = sqlite3.connect(path)
    for name in dropped:
        db.execute(f"DROP INDEX {name}")
    db.commit()
    db.close()


def _indexes(path: Path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {str(r[0]) for r in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND name IN (?, ?)", BOTH)}
    finally:
        db.close()


def _write_lock_held(path: Path) -> bool:
    """Another connection holds the journal's write lock (a write cannot begin now)."""
    db = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError:
        return True
    finally:
        db.close()
    return False


@dataclass
class _Held:
    """What ``_held_mid_scan`` saw: giving_way's answer, the writer's thread still running after
    its join, the indexes there once the write was done, and how many times idle() was asked."""

    built: bool
    writer_alive: bool
    seen_after_the_write: list[set[str]]
    idle_asked: int


def _held_mid_scan(journal: Journal, path: Path, write: Callable[[], object]) -> _Held:
    """``steps_late_vend`` built by ``journal.giving_way`` on an aside connection whose progress
    handler holds the build inside its scan (the write lock taken) until ``write``, on a thread
    of its own, is about to run; the build's second run waits (in idle()) until the write's
    side has looked at the indexes."""
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
        if len(idle_asked) > 1:  # before a second run: once the write's side has looked
            looked.wait(10)
        return True

    aside.set_progress_handler(scanning, 1)
    seen_after_the_write: list[set[str]] = []

    def writes() -> None:
        building.wait(10)
        writing.set()  # the build goes on from here, unless the write's ask ends it
        write()
        seen_after_the_write.append(_indexes(path))
        looked.set()

    writer = threading.Thread(target=writes)
    writer.start()
    try:
        built = journal.giving_way(aside, _LATE_VEND_INDEX, idle=idle, idle_wait=10.0)
    finally:
        writer.join(10)
        aside.close()
    return _Held(built, writer.is_alive(), seen_after_the_write, len(idle_asked))


def test_a_new_journal_has_both_at_open(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    assert journal.indexes_to_build == ()
    assert _indexes(tmp_path / "journal.db") == set(BOTH)
    assert journal.build_indexes() == []  # nothing left to do
    journal.close()


def test_open_leaves_the_no_selection_index_and_the_counts_read_the_rows_meanwhile(
    tmp_path: Path,
) -> None:
    """Open built it on the way to ready (a scan of every sale); now it is left for after, and
    the counts every face shows are the same without it, then from it."""
    path = tmp_path / "journal.db"
    _made_before(path, 30, dropped=("sales_no_selection",))
    journal = Journal(path)
    journal.open()
    assert journal.indexes_to_build == ("sales_no_selection",)
    assert _indexes(path) == {"steps_late_vend"}  # open did not scan the sales
    assert journal.late_vend_after is None  # that one is there
    counts = (journal.count(kind=SaleKind.NO_SELECTION), journal.count(kind=SaleKind.SALE))
    assert counts == (20, 10)
    assert "sales_no_selection" not in " ".join(
        plans_of(journal, lambda: journal.count(kind=SaleKind.NO_SELECTION)))
    assert journal.build_indexes() == ["sales_no_selection"]
    assert journal.indexes_to_build == ()
    assert _indexes(path) == set(BOTH)
    assert "SEARCH sales USING INDEX sales_no_selection (created_at>?)" in plans_of(
        journal, lambda: journal.count(since=0.0, kind=SaleKind.NO_SELECTION))
    assert (journal.count(kind=SaleKind.NO_SELECTION), journal.count(kind=SaleKind.SALE)) == counts
    journal.close()


def test_a_build_gives_way_to_a_write_begun_during_it(tmp_path: Path) -> None:
    """A sale's write begun while an index is built: the build rolls back at its word, the
    write goes first (it commits while the index is still not there), the build runs again
    after. The build is held inside its scan, the write lock taken (SQLite's progress handler,
    on the build's thread), until the write has asked, so the two meet every run, whatever the
    machine."""
    path = tmp_path / "journal.db"
    _made_before(path, 10, dropped=("steps_late_vend",))
    journal = Journal(path)
    journal.open()
    aside = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    aside.execute("PRAGMA busy_timeout=5000")
    building = threading.Event()
    asked = threading.Event()

    def scanning() -> int:
        if not building.is_set() and _write_lock_held(path):  # inside its scan
            building.set()
            asked.wait(10)  # the write asked it to give way
        return 0

    aside.set_progress_handler(scanning, 1)
    seen_by_the_write: list[set[str]] = []

    def sale() -> None:
        building.wait(10)
        way_taken = journal.prune_gives_way  # what every write of the agent asks first

        def asking() -> Any:
            got = way_taken()
            asked.set()
            return got

        journal.prune_gives_way = asking  # type: ignore[method-assign]
        try:
            with journal.batch():  # one transaction: one ask
                journal.create(SaleRecord(
                    sale_id="sale0099", order_id="KASALE0099", source="kiosk_api:screen",
                    flow=Flow.CHARGE_CARD.value, terminal="SIM-0001", amount_cents=250,
                    state=SaleState.STARTED,
                ))  # fmt: skip
                # holding the write lock: the build rolled back, its index is not there
                seen_by_the_write.append({str(r[0]) for r in journal.db.execute(
                    "SELECT name FROM sqlite_master WHERE name = 'steps_late_vend'")})
        finally:
            del journal.prune_gives_way

    writer = threading.Thread(target=sale)
    writer.start()
    try:
        assert journal.giving_way(aside, _LATE_VEND_INDEX) is True
    finally:
        writer.join(10)
        aside.close()
    assert not writer.is_alive()
    assert seen_by_the_write == [set()]  # its sale went first
    assert _indexes(path) == set(BOTH)  # built after it
    assert journal.get("sale0099") is not None
    journal.close()


def test_a_build_waits_for_no_sale_running_and_a_stop_ends_the_wait(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _made_before(path, 5)
    journal = Journal(path)
    journal.open()
    assert journal.indexes_to_build == BOTH
    looks: list[str] = []

    def idle() -> bool:
        looks.append("idle?")
        return False  # a sale always running

    def stopping() -> bool:
        return len(looks) >= 3

    assert journal.build_indexes(idle=idle, idle_wait=60.0, stopping=stopping,
                                 sleep=lambda s: None) == []
    assert journal.indexes_to_build == BOTH  # the next start builds them
    assert _indexes(path) == set()
    assert journal.late_vend_after is not None
    assert journal.build_indexes() == list(BOTH)
    assert journal.late_vend_after is None
    journal.close()


async def test_the_agent_builds_both_after_ready(tmp_path: Path, sim_settings: Any) -> None:
    path = tmp_path / "journal.db"
    _made_before(path, 12)
    async with running_agent(tmp_path, sim_settings, []) as agent:
        await agent.settled.wait()
        assert _indexes(path) == set(BOTH)
        assert agent.journal.indexes_to_build == ()
        assert agent.journal.count(kind=SaleKind.NO_SELECTION) == 8


def test_the_health_checks_journal_probe_gives_way_too(tmp_path: Path) -> None:
    """The health checker's probe of the journal (one committed write, each round, on the event
    loop) and the agent's events ask as a sale's writes do: a build under way rolls back and
    the probe commits before the index is there. The build is held inside its scan until the
    probe is about to write, and its second run waits until the probe's side has looked."""
    path = tmp_path / "journal.db"
    _made_before(path, 10, dropped=("steps_late_vend",))
    journal = Journal(path)
    journal.open()
    events = EventLog(lambda: journal.db, journal.clock, gives_way=journal.prune_gives_way)
    events.open()
    held = _held_mid_scan(journal, path, events.probe)
    assert held.built is True
    assert not held.writer_alive
    assert held.seen_after_the_write == [{"sales_no_selection"}]  # the probe went first
    assert held.idle_asked == 2  # the build ran again after it
    assert _indexes(path) == set(BOTH)
    journal.close()
