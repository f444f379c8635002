"""Rolling back: the previous release runs, for real, on a journal this release wrote.

The previous release is the commit before this work (``PREVIOUS_RELEASE``), taken from git into its
own directory with its own virtualenv, built once by uv from the wheels ``./dev`` already fetched
and kept (``previous_release``). It reads every column of the sales table into its own record type,
so this release adds none (new facts go into new tables) and keeps the schema version: the rollback
in docs/operations.md holds. A journal of a *newer* schema is refused by this release before
anything is written."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.sales.journal import SCHEMA_VERSION, Journal, JournalTooNew
from kiosk_agent.sales.states import Step
from kiosk_agent.sales.unit import OwnUnit
from kiosk_agent.service.models import TransStatus
from tests.assembly.crash_driver import WarmDrivers
from tests.assembly.test_crash import TIME_SCALE, Driver, write_config
from tests.child_signals import send_signal

from .disk_helpers import ledger

PREVIOUS_RELEASE = "47add4f"  # main before this release's journal work
REPO = Path(__file__).resolve().parents[2]


def previous_release() -> Path:
    """The previous release's tree with its virtualenv, built once per lock and then reused.

    Built by uv (this virtualenv's) with this repository's lock as constraints: the versions
    ``./dev`` installed, whose wheels uv's cache holds already, so on a fresh clone it takes
    seconds, not pip's minute of downloads; kept under the per-user cache ``./dev`` uses for its
    tools (``KIOSK_RELEASES_DIR`` elsewhere), keyed by the release and the lock."""
    lock = REPO / "requirements-dev.lock"
    key = hashlib.sha256(lock.read_bytes()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kiosk-agent"
    root = Path(os.environ.get("KIOSK_RELEASES_DIR", cache / "releases"))
    tree = root / f"{PREVIOUS_RELEASE}-{key}"
    if (tree / ".built").exists():
        return tree
    archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS_RELEASE],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        pytest.skip(f"the previous release {PREVIOUS_RELEASE} is not in this repository's git")
    shutil.rmtree(tree, ignore_errors=True)  # a build cut short is made again
    tree.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    made = subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(tree / ".venv")],
                          capture_output=True, text=True, check=False)
    installed = made.returncode == 0 and subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(tree / ".venv" / "bin" / "python"),
         "-c", str(lock), str(tree)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if not installed or installed.returncode != 0:
        why = (installed.stderr if installed else made.stderr)[-500:]
        pytest.skip(f"cannot install the previous release: {why}")
    (tree / ".built").write_text(f"{PREVIOUS_RELEASE} {key}\n")
    return tree


@pytest.mark.slow(seconds=16)
async def test_the_previous_release_runs_on_a_journal_this_one_wrote(
    sim_factory: Any, drivers: WarmDrivers, tmp_path: Path
) -> None:
    previous = previous_release()
    sim = await sim_factory(time_scale=TIME_SCALE, seed=4, transactions=0)
    info = sim.ready_info()
    env = {**os.environ, "KIOSK_API_KEY": info["api_key"],
           "KIOSK_CLIENT_SECRET": info["client_secret"]}
    env.pop("PYTHONPATH", None)
    markers = tmp_path / "vended.txt"
    markers.touch()
    config = write_config(tmp_path, sim)
    # this release, as a process: one sale completed, one charged and killed before its vend
    # (forked from the test process's warm server, as test_crash.py's: not a server of its own)
    driver = Driver(drivers, config, markers, env)
    assert await driver.run("charge_card", 250, "vended", 99) == "done"
    assert await driver.run("charge_card", 300, "vended", 5) == "killed"
    killed = next(s for s in driver.started_sales if s not in markers.read_text())
    kept = json.loads((tmp_path / "journal.db.unit").read_text())
    order_id = OwnUnit(kept["unit_id"], key=kept["key"]).order_id(killed)  # sales/unit.py
    [row] = await ledger_of(sim, order_id)
    assert row.status is TransStatus.CAPTURED

    old = str(previous / ".venv" / "bin" / "python")
    listed = subprocess.run(
        [old, "-m", "kiosk_agent", "sales", "--config", str(config), "--format", "json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60, check=False,
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert {s["sale_id"] for s in json.loads(listed.stdout)} == driver.started_sales

    log = tmp_path / "previous.log"
    with log.open("w") as out:
        proc = await asyncio.create_subprocess_exec(
            old, "-m", "kiosk_agent", "run", "--config", str(config),
            stdout=out, stderr=out, env=env, cwd=tmp_path,
        )
    try:
        async with asyncio.timeout(60):
            while "recovery finished" not in log.read_text():
                assert proc.returncode is None, log.read_text()[-3000:]
                await asyncio.sleep(0.1)
        # the previous release finished this release's open sale: the money went back
        assert "recovery finished: 1 of 1 open sale(s)" in log.read_text()
        [row] = await ledger_of(sim, order_id)
        assert row.status is TransStatus.VOIDED
    finally:
        send_signal(proc, signal.SIGTERM)
        async with asyncio.timeout(30):
            code = await proc.wait()
    assert code == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()

    # and this release again, on what the previous one left
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    assert {s.sale_id for s in journal.query()} == driver.started_sales
    assert all(s.state.final for s in journal.query())
    assert journal.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    journal.close()


async def ledger_of(sim: Any, order_id: str) -> list[Any]:
    from kiosk_agent.cli.sim import settings_from_ready
    from kiosk_agent.service.client import ServiceClient

    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        return await ledger(service, order_id)


def test_a_journal_of_a_newer_schema_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.open()
    journal.db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    journal.close()
    before = path.read_bytes()
    with pytest.raises(JournalTooNew, match="newer release") as refused:
        Journal(path).open()
    assert str(path) in str(refused.value)
    assert "Nothing was written" in str(refused.value)
    assert path.read_bytes() == before
    assert not path.with_name("journal.db-wal").exists()


def test_a_row_with_columns_this_release_does_not_know_is_still_read(tmp_path: Path) -> None:
    from kiosk_agent.sales.journal import SaleRecord
    from kiosk_agent.sales.states import SaleState

    journal = Journal(tmp_path / "journal.db")
    journal.open()
    journal.db.execute("ALTER TABLE sales ADD COLUMN added_later TEXT")
    journal.create(SaleRecord(sale_id="s1", order_id="KAS1", source="t", flow="charge_card",
                              terminal="SIM-0001", amount_cents=100, state=SaleState.STARTED))
    record = journal.get("s1")
    assert record is not None
    assert record.amount_cents == 100
    journal.close()


def test_send_anchors_are_kept_beside_the_sales_table_and_moved_there_from_it(
    tmp_path: Path,
) -> None:
    """The previous release reads every column of ``sales``: the money call's send anchors
    (sent_at, sent_mono, sent_boot) live in ``sale_sends``; a journal a development build wrote
    with them as columns of ``sales`` has them moved there on open."""
    import sqlite3

    from kiosk_agent.sales.journal import SaleRecord
    from kiosk_agent.sales.states import SaleState

    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.open()
    sale = journal.create(SaleRecord(sale_id="s1", order_id="KAS1", source="t",
                                     flow="charge_card", terminal="SIM-0001",
                                     amount_cents=100, state=SaleState.STARTED))
    journal.db.execute("ALTER TABLE sales ADD COLUMN sent_at REAL")
    journal.db.execute("ALTER TABLE sales ADD COLUMN sent_mono REAL")
    journal.db.execute("ALTER TABLE sales ADD COLUMN sent_boot TEXT")
    journal.db.execute("UPDATE sales SET sent_at = 12.5, sent_mono = 3.0, sent_boot = 'b'")
    journal.close()

    journal = Journal(path)
    journal.open()
    columns = {r[1] for r in journal.db.execute("PRAGMA table_info(sales)")}
    assert not {"sent_at", "sent_mono", "sent_boot"} & columns
    record = journal.get(sale.sale_id)
    assert record is not None
    assert (record.sent_at, record.sent_mono, record.sent_boot) == (12.5, 3.0, "b")
    moved = journal.record(record, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING,
                           sent_at=20.0, sent_mono=4.0, sent_boot="c")
    again = journal.get(sale.sale_id)
    assert again is not None
    assert (again.sent_at, again.sent_boot) == (20.0, "c") == (moved.sent_at, moved.sent_boot)
    journal.close()
    plain = sqlite3.connect(path)
    assert [r[0] for r in plain.execute("SELECT sent_at FROM sale_sends")] == [20.0]
    plain.close()
