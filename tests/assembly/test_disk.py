"""The journal's disk fails under the real agent: a small tmpfs filled mid-sale and while idle,
the file system turned read-only under the open journal. Each test ends by comparing the
simulator's ledger with the journal: no charge is left held that the journal does not end.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.sales.journal import Journal
from kiosk_agent.sales.model import Flow, SaleEvent, SaleRequest
from kiosk_agent.sales.owner import JournalLock
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.models import TransStatus
from tests.platforms.agent_rig import running_agent

from .agent_helpers import ScriptedDispenser
from .disk_helpers import ext4_disk, fill, free, ledger, shut_down, small_disk

TOKEN = "kiosk-app-token-0123456789"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_disk(tmp_path / "disk") as directory:
        yield directory


@pytest.fixture
async def agent(disk: Path, sim_settings: Any) -> AsyncIterator[Agent]:
    """The agent with its journal (and config) on the small disk, a kiosk API in front."""
    trigger = {"platform": "kiosk_api", "name": "screen", "token": "!secret kiosk_token",
               "port": 0, "products": {"coffee": "2.50"}}
    async with running_agent(
        disk, sim_settings, [trigger], secrets={"kiosk_token": TOKEN},
        sections={"health": {"hold_off": 5.0, "recheck_interval": 0.2, "ping_interval": 60}},
    ) as running:
        yield running


async def until(condition: Any, within: float = 10.0) -> float:
    """Seconds until ``condition()`` holds (fails the test past ``within``)."""
    began = time.monotonic()
    async with asyncio.timeout(within):
        while not condition():
            await asyncio.sleep(0.02)
    return time.monotonic() - began


async def fill_at(agent: Agent, step: str, disk: Path) -> None:
    """Fill the disk the moment the journal has written ``step`` (before its call answers)."""
    async with agent.events.subscribe() as queue:
        while True:
            event: SaleEvent = await queue.get()
            if event.step == step:
                fill(disk)
                return


async def post_sale(port: int) -> tuple[int, str, Any]:
    async with aiohttp.ClientSession() as session, session.post(
        f"http://127.0.0.1:{port}/api/v1/sales", json={"product": "coffee"},
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as response:
        return response.status, response.content_type, await response.json()


async def test_a_disk_filled_mid_sale_gives_the_charge_back_once_space_returns(
    agent: Agent, disk: Path
) -> None:
    filler = asyncio.create_task(fill_at(agent, "charge_card.accepted", disk))
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=250), ScriptedDispenser()
    )
    held = await asyncio.wait_for(sale.result(), 10)
    await filler
    # the card was charged; its step could not be written: held in memory, said so (its own
    # kind of event), with the state the journal holds
    assert held.unwritten
    assert held.step == "journal.unwritten"
    assert held.state is SaleState.CHARGING
    assert "not journaled yet" in held.message
    [row] = await ledger(agent.service, sale.order_id)
    assert row.status is TransStatus.CAPTURED
    on_disk = agent.journal.get(sale.sale_id)
    assert on_disk is not None
    assert on_disk.state is SaleState.CHARGING
    journal = agent.health.snapshot().journal
    assert journal.writable is False
    assert "database or disk is full" in journal.detail
    assert journal.unwritten_sales == [sale.sale_id]
    assert not agent.availability.state("SIM-0001").available
    assert agent.sales.busy_reason("SIM-0001") == f"sale {sale.sale_id} is not journaled yet"

    free(disk)
    took = await until(lambda: not agent.unwritten.sale_ids)
    assert took < 3.0  # retried every 0.5 s: no restart, no person
    record = agent.journal.get(sale.sale_id)
    assert record is not None
    assert record.state is SaleState.REVERSED
    [row] = await ledger(agent.service, sale.order_id)
    assert row.status is TransStatus.VOIDED  # the ledger agrees with the journal
    await until(lambda: agent.availability.state("SIM-0001").available)
    assert agent.health.snapshot().journal.writable is True


async def test_a_disk_full_while_idle_refuses_sales_with_503_json_then_comes_back(
    agent: Agent, disk: Path
) -> None:
    [api] = agent.platforms
    port = api.port  # type: ignore[attr-defined]
    fill(disk)
    # nothing is written while idle: the full file system is noticed and the journal probed
    took = await until(lambda: agent.health.snapshot().journal.writable is False, within=3)
    assert took < 1.5
    assert "journal not writable" in agent.availability.state("SIM-0001").reason
    status, kind, body = await post_sale(port)
    assert (status, kind, body["error"]) == (503, "application/json", "out_of_service")
    assert "journal not writable" in body["reason"]
    assert agent.journal.query() == []


    free(disk)
    await until(lambda: agent.availability.state("SIM-0001").available, within=5)
    status, _, started = await post_sale(port)
    assert status == 202
    record = agent.journal.by_order_id(started["order_id"])
    assert record is not None
    await until(lambda: agent.journal.get(record.sale_id).state.final)  # type: ignore[union-attr]
    ended = agent.journal.get(record.sale_id)
    assert ended is not None
    assert ended.state is SaleState.COMPLETED
    [row] = await ledger(agent.service, started["order_id"])
    assert row.status is TransStatus.CAPTURED
    assert row.amount_cents == ended.captured_cents


async def test_a_file_system_that_dies_under_the_open_journal_has_the_agent_restarted(
    tmp_path: Path, sim_settings: Any
) -> None:
    """ext4 on a loop device, shut down under the open journal (every write fails, as when a
    disk dies or an ext4 error turns it read-only: the kernel refuses a plain read-only
    remount while the journal's files are open for writing). A sale charged meanwhile is kept;
    the agent withholds the watchdog (systemd restarts it); on the file system back, recovery
    gives the charge back."""
    trigger = {"platform": "kiosk_api", "name": "screen", "token": "!secret kiosk_token",
               "port": 0, "products": {"coffee": "2.50"}}
    options: dict[str, Any] = {
        "secrets": {"kiosk_token": TOKEN},
        "sales": {"vend_timeout": 5.0, "unwritten_restart_after": 1.0},
        "sections": {"health": {"recheck_interval": 0.2, "ping_interval": 60}},
    }
    with ext4_disk(tmp_path / "ext4") as (disk, remount_fresh):
        async with running_agent(disk, sim_settings, [trigger], **options) as agent:
            [api] = agent.platforms
            breaker = asyncio.create_task(shut_down_at(agent, "charge_card.accepted", disk))
            sale = await agent.sales.start(
                SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=250),
                ScriptedDispenser(),
            )
            held = await asyncio.wait_for(sale.result(), 10)
            await breaker
            assert held.unwritten
            assert held.state is SaleState.CHARGING
            assert agent.health.snapshot().journal.writable is False
            status, kind, body = await post_sale(api.port)  # type: ignore[attr-defined]
            assert (status, kind, body["error"]) == (503, "application/json", "out_of_service")
            # nothing cures a dead file system in-process: the watchdog is withheld
            await until(lambda: not agent.health.alive(), within=5)
            assert "restart" in agent.health.snapshot().problems[0]
            [row] = await ledger(agent.service, sale.order_id)
            assert row.status is TransStatus.CAPTURED
        remount_fresh()  # what a restart after fsck finds: the journal as last synced
        async with running_agent(disk, sim_settings, [trigger], **options) as second:
            await asyncio.wait_for(second.recovery.wait(), 15)
            record = second.journal.get(sale.sale_id)
            assert record is not None
            assert record.state is SaleState.REVERSED
            [row] = await ledger(second.service, sale.order_id)
            assert row.status is TransStatus.VOIDED


async def shut_down_at(agent: Agent, step: str, disk: Path) -> None:
    async with agent.events.subscribe() as queue:
        while (await queue.get()).step != step:
            pass
    shut_down(disk)


async def test_a_sale_request_whose_own_write_fails_gets_503_json_at_once(
    agent: Agent, disk: Path
) -> None:
    [api] = agent.platforms
    agent.journal.db.execute("PRAGMA query_only=ON")  # writes fail; the file system looks fine
    status, kind, body = await post_sale(api.port)  # type: ignore[attr-defined]
    assert (status, kind, body["error"]) == (503, "application/json", "out_of_service")
    assert "journal not writable" in body["reason"]
    # from this path too: health names the journal, the terminal is out of service at once
    assert agent.health.snapshot().journal.writable is False
    assert "journal not writable" in agent.availability.state("SIM-0001").reason
    agent.journal.db.execute("PRAGMA query_only=OFF")
    await until(lambda: agent.availability.state("SIM-0001").available, within=5)


async def test_an_agent_started_on_a_full_or_read_only_disk_waits_for_it(
    disk: Path, sim_factory: Any, tmp_path: Path
) -> None:
    """`kiosk-agent run` on a journal whose disk is full (or read-only) exited 1 ("disk I/O
    error"): systemd's restarts, ten in five minutes, then left the unit down for good, not back
    by itself once space returned. It now waits for the disk, says why, starts as soon as the
    journal opens, and a stop signal meanwhile ends it cleanly."""
    from tests.cli.agent_process import AgentProcess, write_config

    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    config = write_config(tmp_path / "conf", sim, disk / "journal.db")
    first = await AgentProcess(config, sim, "first.log").start()
    try:  # a journal in use, cleanly closed (its WAL gone): opening it must write
        await first.wait_ready()
        first.send(signal.SIGTERM)
        assert await first.exit_code() == 0
    finally:
        await first.close()
    fill(disk)
    waiting = await AgentProcess(config, sim, "waiting.log").start()
    try:
        await waiting.wait_for_log("waiting for it to take writes before anything starts")
        assert "is full" in waiting.text()
        free(disk)
        await waiting.wait_ready()  # within a second or so of the space back
        waiting.send(signal.SIGTERM)
        assert await waiting.exit_code() == 0
    finally:
        await waiting.close()
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    stopped = await AgentProcess(config, sim, "stopped.log").start()
    try:
        await stopped.wait_for_log("waiting for it to take writes before anything starts")
        assert "is read-only" in stopped.text()
        stopped.send(signal.SIGTERM)  # a tech gives up: a clean stop, not a hang
        assert await stopped.exit_code(within=5) == 0
        assert "ready in" not in stopped.text()
    finally:
        await stopped.close()
        subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)


async def test_an_agent_started_on_a_disk_without_inodes_waits_for_one(
    sim_factory: Any, tmp_path: Path
) -> None:
    """Blocks free but no inode left: the journal's WAL cannot be made ("unable to open
    database file"), and the start exited instead of waiting as for a full disk."""
    from tests.cli.agent_process import AgentProcess, write_config

    with small_disk(tmp_path / "disk", "8m", "nr_inodes=40") as disk:
        sim = await sim_factory(time_scale=50, seed=3, transactions=0)
        config = write_config(tmp_path / "conf", sim, disk / "journal.db")
        journal = Journal(disk / "journal.db")
        journal.open()
        journal.close()
        with JournalLock(disk / "journal.db"):  # its lock file, as a run leaves it
            pass
        fillers = 0
        with contextlib.suppress(OSError):
            while True:
                (disk / f"filler{fillers}").touch()
                fillers += 1
        agent = await AgentProcess(config, sim).start()
        try:
            await agent.wait_for_log("has no inodes left")
            for n in range(fillers):
                (disk / f"filler{n}").unlink()
            await agent.wait_ready()
            agent.send(signal.SIGTERM)
            assert await agent.exit_code() == 0
        finally:
            await agent.close()
