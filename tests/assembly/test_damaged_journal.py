"""A journal damaged between runs: the agent (a real process) charges a card and is SIGKILLed
before the dispense; the journal is then damaged one way or another; the next start must name
it (path, what to do) and give the charge back before it takes a customer: reporting holds
the charge, the journal no longer does.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.assembly.agent import Agent, service_settings_from_config
from kiosk_agent.config.load import load_config
from kiosk_agent.sales.states import SaleState
from kiosk_agent.sales.unit import OwnUnit
from kiosk_agent.service.models import TransStatus
from tests.assembly.crash_driver import WarmDrivers
from tests.assembly.test_crash import TIME_SCALE, Driver, write_config

from .disk_helpers import ledger


def keys_in_the_environment(sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    info = sim.ready_info()
    monkeypatch.setenv("KIOSK_API_KEY", info["api_key"])
    monkeypatch.setenv("KIOSK_CLIENT_SECRET", info["client_secret"])


@pytest.fixture
async def configured(sim_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The agent's configuration on a simulator of its own, its keys in the environment."""
    sim = await sim_factory(time_scale=TIME_SCALE, seed=3, transactions=0)
    keys_in_the_environment(sim, monkeypatch)
    return write_config(tmp_path, sim)


def checkpointed(path: Path) -> None:
    """Move everything the WAL holds into the database file (as a clean stop would)."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def delete_wal(path: Path) -> None:
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


def truncate(path: Path) -> None:
    checkpointed(path)
    delete_wal(path)
    path.write_bytes(b"")


def overwrite_a_page(path: Path) -> None:
    checkpointed(path)
    delete_wal(path)
    with path.open("r+b") as f:
        f.seek(4096)  # page 2: a table's b-tree
        f.write(bytes(range(256)) * 16)


DAMAGE = {"wal_deleted": delete_wal, "truncated": truncate, "page_overwritten": overwrite_a_page}


@pytest.mark.parametrize("damage", list(DAMAGE))
async def test_a_charge_the_damaged_journal_lost_is_given_back_before_any_customer(
    damage: str, sim_factory: Any, drivers: WarmDrivers, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = await sim_factory(time_scale=TIME_SCALE, seed=3, transactions=0)
    keys_in_the_environment(sim, monkeypatch)
    markers = tmp_path / "vended.txt"
    markers.touch()
    config_path = write_config(tmp_path, sim)
    driver = Driver(drivers, config_path, markers, dict(os.environ))
    # charged, then killed as the dispense is journaled: the service holds the money
    assert await driver.run("charge_card", 250, "vended", 5) == "killed"
    assert driver.steps[-1] == "dispense.request"
    [sale_id] = driver.started_sales
    # the unit's id, kept beside the journal: whatever the damage, its charges are known as its own
    kept = json.loads((tmp_path / "journal.db.unit").read_text())
    order_id = OwnUnit(kept["unit_id"], key=kept["key"]).order_id(sale_id)
    journal_path = tmp_path / "journal.db"
    DAMAGE[damage](journal_path)

    config = load_config(config_path)
    agent = Agent(config, service_settings_from_config(config))
    await agent.start()
    try:
        await asyncio.wait_for(agent.journal_guard.first_check(), 20)
        notice = agent.health.snapshot().journal.notice
        assert damage == "wal_deleted" or str(journal_path) in notice
        if damage == "page_overwritten":
            assert "damaged" in notice
            [kept] = tmp_path.glob("journal.db.damaged-*Z")
            assert str(kept) in notice  # kept for a person, and said where
        elif damage == "wal_deleted":
            # The agent had settled: the WAL's growth after READY=1 checkpointed the database,
            # so it reads as whole minus the steps since. Nothing in the file can tell; the
            # charge check before any customer is what finds the charge those steps held.
            assert notice == ""
        else:
            assert "in-use" in notice  # the marker said a journal was in use here
        # the charge is found in reporting and given back: the ledger agrees with the journal
        record = agent.journal.by_order_id(order_id)
        assert record is not None
        assert record.state is SaleState.REVERSED
        rows = await ledger(agent.service, order_id)
        assert [r.status for r in rows if r.trans_id == record.trans_id] == [TransStatus.VOIDED]
        assert agent.availability.state("SIM-0001").available
    finally:
        await agent.stop()


async def test_doctor_names_each_damage(tmp_path: Path) -> None:
    from kiosk_agent.sales.journal import Journal
    from kiosk_agent.sales.journal_doctor import check_journal_file
    from kiosk_agent.verdicts import Report, Verdict

    live = tmp_path / "live" / "journal.db"
    journal = Journal(live)
    journal.open()  # left open, as by a process that was killed: its writes are in the WAL
    report = Report()
    check_journal_file(report, live)
    assert report.checks[-1].verdict is Verdict.PASS
    assert "integrity ok" in report.checks[-1].detail
    for name, damage in DAMAGE.items():
        path = tmp_path / name / "journal.db"
        path.parent.mkdir()
        for part in (live, journal.marker, *live.parent.glob("journal.db-*")):
            (path.parent / part.name).write_bytes(part.read_bytes())
        damage(path)
        report = Report()
        check_journal_file(report, path)
        [check] = report.checks
        assert check.verdict is Verdict.FAIL, (name, check)
        assert str(path) in check.detail
        assert check.fix
    journal.close()


async def test_a_journal_removed_under_the_running_agent_is_written_back(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """Removed while the agent ran, the journal took every later step into a file nobody could
    open again, health said ok; the next start found it lost and voided the vended sales'
    captures (the customer kept the product and the money)."""
    from tests.assembly.agent_helpers import ScriptedDispenser
    from tests.assembly.test_agent import charge

    sim = await sim_factory(time_scale=TIME_SCALE, seed=3, transactions=0)
    agent = await agent_factory(sim=sim)
    journal_path = tmp_path / "journal.db"
    journal_path.unlink()
    sale = await agent.sales.start(charge(250), ScriptedDispenser())
    assert (await sale.result()).state is SaleState.COMPLETED
    async with asyncio.timeout(5):  # written back within a second or so
        while not journal_path.exists():
            await asyncio.sleep(0.05)
    later = await agent.sales.start(charge(260), ScriptedDispenser())
    assert (await later.result()).state is SaleState.COMPLETED
    await agent.stop()
    again = await agent_factory(sim=sim)
    checked = await asyncio.wait_for(again.journal_guard.first_check(), 20)
    assert again.health.snapshot().journal.notice == ""
    assert checked is not None
    assert checked.unaccounted == []
    for made in (sale, later):
        record = again.journal.get(made.sale_id)
        assert record is not None
        assert record.state is SaleState.COMPLETED
        rows = await ledger(again.service, record.order_id)
        assert [r.status for r in rows] == [TransStatus.CAPTURED]


def overwrite_the_steps(path: Path) -> None:
    """Damage the steps' table alone: the bulk of a year's journal, which the start reads
    none of (sales/journal_inspect.BULK)."""
    checkpointed(path)
    delete_wal(path)
    db = sqlite3.connect(path)
    root, page = db.execute(
        "SELECT rootpage, (SELECT page_size FROM pragma_page_size) FROM sqlite_master "
        "WHERE name = 'steps'"
    ).fetchone()
    db.close()
    with path.open("r+b") as f:
        f.seek((root - 1) * page)
        f.write(bytes(range(256)) * (page // 256))


def a_journal_with_an_open_sale(path: Path) -> None:
    from kiosk_agent.sales.journal import Journal, SaleRecord

    journal = Journal(path)
    journal.open()
    journal.create(SaleRecord("s1", "KA000000000000000001", "virtual:front", "charge_card",
                              "SIM-0001", 250, SaleState.STARTED))
    journal.close()


def test_before_open_the_start_reads_all_but_the_steps_and_whole_once_told(
    tmp_path: Path,
) -> None:
    from kiosk_agent.sales.journal_inspect import damage_note, inspect_journal

    path = tmp_path / "journal.db"
    a_journal_with_an_open_sale(path)
    overwrite_the_steps(path)
    assert inspect_journal(path, whole=False) is None  # read after it opens, in a thread
    found = inspect_journal(path, move_damaged=False)
    assert found is not None
    assert found.kind == "damaged"
    damage_note(path).write_text("found by the last run\n")
    found = inspect_journal(path, whole=False)  # the note: read whole, and moved aside
    assert found is not None
    assert found.kept_at is not None
    assert found.kept_at.exists()
    assert not path.exists()
    assert not damage_note(path).exists()


async def test_steps_found_damaged_after_open_move_no_money_and_the_restart_moves_them_aside(
    configured: Path, tmp_path: Path
) -> None:
    from kiosk_agent.sales.journal_guard import FILE_COMPONENT, damage_note

    config = load_config(configured)
    path = tmp_path / "journal.db"
    a_journal_with_an_open_sale(path)
    overwrite_the_steps(path)

    agent = Agent(config, service_settings_from_config(config))
    await agent.start()
    try:
        assert not await asyncio.wait_for(agent.journal_guard.file_intact(), 20)
        health = agent.health.snapshot()
        assert "damaged" in health.journal.notice
        assert str(path) in health.journal.notice
        assert not agent.health.alive()  # the watchdog is withheld: systemd restarts it
        assert any(p.startswith(FILE_COMPONENT) for p in health.problems)
        assert not agent.availability.state("SIM-0001").available
        assert damage_note(path).exists()
        # no money moved on it: the open sale is left as it was, no charge check was made
        assert agent.recovery.state == "running"
        assert agent.recovery.recovered == 0
        assert agent.journal_guard.audit.given_back == 0
    finally:
        await agent.stop()

    again = Agent(config, service_settings_from_config(config))
    await again.start()
    try:
        await asyncio.wait_for(again.journal_guard.first_check(), 20)
        notice = again.health.snapshot().journal.notice
        [kept] = tmp_path.glob("journal.db.damaged-*Z")
        assert str(kept) in notice
        assert await again.journal_guard.file_intact()
        assert again.availability.state("SIM-0001").available
    finally:
        await again.stop()


async def test_the_start_is_ready_before_the_whole_read_and_takes_no_customer_until_it(
    configured: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole-file read after the open (a second of a core for a year of sales) is off the
    path to READY=1, never off the path to a customer: held here until the test lets it go."""
    import threading

    from kiosk_agent.sales import journal_guard

    config = load_config(configured)
    a_journal_with_an_open_sale(tmp_path / "journal.db")
    let_go = threading.Event()
    whole_reads: list[bool] = []
    real = journal_guard.integrity

    def held(path: Path, *, quick: bool = False, but: Any = ()) -> list[str]:
        if not but:  # the whole read, in its worker thread
            whole_reads.append(let_go.wait(timeout=30))
        return real(path, quick=quick, but=but)

    monkeypatch.setattr(journal_guard, "integrity", held)
    agent = Agent(config, service_settings_from_config(config))
    try:
        await asyncio.wait_for(agent.start(), 20)  # ready, the read still held
        assert agent.started
        state = agent.availability.state("SIM-0001")
        assert not state.available
        assert "reading its file whole" in state.reason
        assert agent.health.snapshot().journal.file_checking
        assert agent.recovery.recovered == 0  # the open sale waits for the verdict
        let_go.set()
        assert await asyncio.wait_for(agent.journal_guard.file_intact(), 20)
        await asyncio.wait_for(agent.recovery.wait(), 20)
        assert agent.recovery.recovered == 1
        assert agent.availability.state("SIM-0001").available
        assert whole_reads == [True]
    finally:
        let_go.set()
        await agent.stop()


async def test_the_look_begun_ahead_of_the_agents_import_is_the_one_its_start_takes(
    configured: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kiosk-agent run` begins the look at the file (all but the steps) in a thread of its own
    once it holds the journal, before it imports the agent (a year of sales: 0.3 s of a second
    core); the start takes that verdict, here a damaged file moved aside, and does not read the
    file again before it opens it."""
    import threading

    from kiosk_agent.sales import journal_inspect

    config = load_config(configured)
    path = tmp_path / "journal.db"
    a_journal_with_an_open_sale(path)
    overwrite_a_page(path)  # the sales' own b-tree: what the start reads
    looks: list[tuple[str, tuple[str, ...]]] = []
    real = journal_inspect.integrity

    def recorded(path: Path, *, quick: bool = False, but: Any = ()) -> list[str]:
        looks.append((threading.current_thread().name, tuple(but)))
        return real(path, quick=quick, but=but)

    monkeypatch.setattr(journal_inspect, "integrity", recorded)
    journal_inspect.inspect_ahead(path)
    agent = Agent(config, service_settings_from_config(config))
    await agent.start()
    try:
        assert looks == [("journal-inspect", journal_inspect.BULK)]
        notice = agent.health.snapshot().journal.notice
        [kept] = tmp_path.glob("journal.db.damaged-*Z")
        assert "damaged" in notice
        assert str(kept) in notice
        assert journal_inspect.taken_ahead(path) is None  # taken once
        await asyncio.wait_for(agent.journal_guard.first_check(), 20)
        assert await agent.journal_guard.file_intact()  # the new journal, read whole
    finally:
        await agent.stop()


async def test_a_stop_waits_for_the_whole_read_before_it_closes_the_journal(
    configured: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole-file read's worker thread reads the journal on a connection of its own: a stop
    that closed the journal and let its claim go while that thread still read it left a
    second agent (a restart in the same process, the tests' agents one after another on one
    path) to open the file beside a reader of the first. The stop waits for it, as for the
    prune's, the index's and the checkpoint's threads."""
    import threading

    from kiosk_agent.sales import journal_guard

    config = load_config(configured)
    let_go = threading.Event()
    closed_while_reading: list[bool] = []
    real = journal_guard.integrity

    def held(path: Path, *, quick: bool = False, but: Any = ()) -> list[str]:
        if but:
            return real(path, quick=quick, but=but)
        let_go.wait(timeout=30)
        found = real(path, quick=quick, but=but)
        closed_while_reading.append(agent.journal._db is None or not agent.owner.held)
        return found

    monkeypatch.setattr(journal_guard, "integrity", held)
    agent = Agent(config, service_settings_from_config(config))
    await asyncio.wait_for(agent.start(), 20)  # ready, the whole read held
    stopping = asyncio.ensure_future(agent.stop())
    try:
        # a hang's guard, not the claim: without the wait the stop ends here, long before
        await asyncio.wait({stopping}, timeout=2)
    finally:
        let_go.set()
    await asyncio.wait_for(stopping, 30)
    assert closed_while_reading == [False]
    assert agent.journal._db is None  # and then it closed
