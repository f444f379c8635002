"""A stop drains: each stopping signal sent to a real `kiosk-agent run` mid-dispense.

The kiosk app (over real HTTP) and an MDB adapter (over a real pty) are played by the test; the
simulator's ledger says what happened to the money. A result that comes after the signal and
before ``sales.stop_timeout`` is heard: the sale is sold and captured, nothing given back. One
that comes later finds the sale parked, and the next start finishes it (the money goes back).
A second signal ends the wait as the deadline would have.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.cli.contract import IGNORED_SIGNALS, STOP_SIGNALS

from ..helpers import until
from ..platforms.vending_rig import LineDevice
from .agent_process import AgentProcess, money_agrees, sale_reaches, states, write_config

TOKEN = "kiosk-app-token-0123456789"


def configured(directory: Path, sim: Any, journal: Path, trigger: str, stop_timeout: float) -> Path:
    """The process helpers' configuration, with the trigger and a drain of ``stop_timeout``."""
    path = write_config(directory, sim, journal, trigger)
    text = path.read_text()
    path.write_text(
        text.replace("sales: {", f"sales: {{stop_timeout: {stop_timeout}, vend_timeout: 60, ")
    )
    return path


def kiosk_app() -> str:
    """A touchscreen kiosk whose app confirms each dispense (POST .../dispensed)."""
    return """\
triggers:
  - platform: kiosk_api
    name: screen
    token: !env_var KIOSK_APP_TOKEN
    port: 0
    confirm_dispense: true
    vend_timeout: 60
    products: {coffee: "2.50"}
"""


class App:
    """The kiosk app's side of the API, on the port the agent logged."""

    def __init__(self, session: aiohttp.ClientSession, port: int) -> None:
        self.session = session
        self.base = f"http://127.0.0.1:{port}/api/v1"

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any, Any]:
        async with self.session.request(
            method, self.base + path, json=body, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as response:
            return response.status, await response.json(), response.headers

    async def buy_coffee(self) -> str:
        status, body, _ = await self.call("POST", "/sales", {"product": "coffee"})
        assert status == 202, body
        return str(body["sale_id"])


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def started_kiosk(
    tmp_path: Path, sim: Any, session: aiohttp.ClientSession, stop_timeout: float
) -> tuple[AgentProcess, App, Path]:
    journal = tmp_path / "journal.db"
    agent = AgentProcess(configured(tmp_path, sim, journal, kiosk_app(), stop_timeout), sim)
    agent.env["KIOSK_APP_TOKEN"] = TOKEN
    await agent.start()
    await agent.wait_ready()
    found = re.search(r"kiosk API on 127\.0\.0\.1:(\d+)", agent.text())
    assert found, agent.text()[-3000:]
    return agent, App(session, int(found.group(1))), journal


@pytest.mark.slow(seconds=12)
@pytest.mark.parametrize("signum", list(STOP_SIGNALS), ids=lambda s: s.name)
async def test_a_kiosk_app_confirming_after_the_signal_is_heard_and_the_sale_is_sold(
    signum: signal.Signals, sim_factory: Any, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    agent, app, journal = await started_kiosk(tmp_path, sim, session, stop_timeout=20)
    try:
        sale = await app.buy_coffee()
        await sale_reaches(journal, sale, "dispensing")
        agent.send(signum)
        await agent.wait_for_log("stopping: stopping (draining 1 sale, until ")
        # a new customer is refused at once, said so, with when to ask again
        status, body, headers = await app.call("POST", "/sales", {"product": "coffee"})
        assert (status, body["error"]) == (503, "stopping"), body
        assert "the agent is stopping" in body["message"]
        assert 1 <= int(headers["Retry-After"]) <= 20
        assert (await app.call("GET", f"/sales/{sale}"))[0] == 200  # reads still answered
        # the coffee came out after the signal: the app says so, and it is heard
        status, body, _ = await app.call("POST", f"/sales/{sale}/dispensed", {"status": "vended"})
        assert status == 202, body
        assert await agent.exit_code() == STOP_SIGNALS[signum], agent.text()[-3000:]
    finally:
        await agent.close()
    assert states(journal) == {sale: "completed"}, agent.text()[-3000:]
    await money_agrees(sim, journal)  # captured $2.50, nothing voided or refunded


@pytest.mark.slow(seconds=15)
async def test_a_dispense_unheard_by_the_deadline_is_parked_and_finished_by_the_next_start(
    sim_factory: Any, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    agent, app, journal = await started_kiosk(tmp_path, sim, session, stop_timeout=0.5)
    try:
        sale = await app.buy_coffee()
        await sale_reaches(journal, sale, "dispensing")
        agent.send(signal.SIGTERM)
        assert await agent.exit_code() == 0, agent.text()[-3000:]
    finally:
        await agent.close()
    assert "sales.stop_timeout (0.5 s) has passed; 1 sale(s) still running are parked" in (
        agent.text()
    )
    assert states(journal) == {sale: "dispensing"}  # parked where it stood
    assert "parked" in _steps(journal, sale)
    again = AgentProcess(agent.config, sim, log="again.log")
    again.env["KIOSK_APP_TOKEN"] = TOKEN
    try:
        await again.start()
        await sale_reaches(journal, sale, "reversed")  # not confirmed: the money goes back
        again.send(signal.SIGTERM)
        assert await again.exit_code() == 0, again.text()[-3000:]
    finally:
        await again.close()
    await money_agrees(sim, journal)


@pytest.mark.slow(seconds=15)
async def test_a_second_signal_ends_the_drain_as_its_deadline_would_have(
    sim_factory: Any, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    agent, app, journal = await started_kiosk(tmp_path, sim, session, stop_timeout=300)
    try:
        sale = await app.buy_coffee()
        await sale_reaches(journal, sale, "dispensing")
        agent.send(signal.SIGTERM)
        await agent.wait_for_log("stopping: stopping (draining 1 sale")
        agent.send(signal.SIGINT)
        # the first signal's exit code; long before the 300 s drain would have ended
        assert await agent.exit_code(within=30) == 0, agent.text()[-3000:]
    finally:
        await agent.close()
    assert "a second stopping signal ended the drain; 1 sale(s) still running are parked" in (
        agent.text()
    )
    assert states(journal) == {sale: "dispensing"}
    again = AgentProcess(agent.config, sim, log="again.log")
    again.env["KIOSK_APP_TOKEN"] = TOKEN
    try:
        await again.start()
        await sale_reaches(journal, sale, "reversed")
        again.send(signal.SIGTERM)
        assert await again.exit_code() == 0, again.text()[-3000:]
    finally:
        await again.close()
    await money_agrees(sim, journal)


def _steps(journal: Path, sale_id: str) -> list[str]:
    import sqlite3

    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT step FROM steps WHERE sale_id = ? ORDER BY id", (sale_id,))
        return [step for (step,) in rows]
    finally:
        db.close()


def vending_machine(port: str) -> str:
    """An MDB adapter on a pty the test plays; the agent approves and waits for the result."""
    return f"""\
triggers:
  - platform: mdb
    name: front
    port: {port}
    vend_timeout: 60
    max_price: "5.00"
"""


async def approved_vend(adapter: LineDevice, journal: Path) -> str:
    await until(lambda: "C,1" in adapter.heard, timeout=20)
    adapter.write(b"c,STATUS,VEND,2.50,12\n")
    await until(lambda: "C,VEND,2.50" in adapter.heard, timeout=20)
    [sale] = states(journal)
    return sale


@pytest.mark.slow(seconds=12)
@pytest.mark.parametrize("signum", list(STOP_SIGNALS), ids=lambda s: s.name)
async def test_an_mdb_vend_succeeding_after_the_signal_is_heard_and_the_sale_is_sold(
    signum: signal.Signals, sim_factory: Any, tmp_path: Path
) -> None:
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    adapter = LineDevice()
    journal = tmp_path / "journal.db"
    agent = AgentProcess(configured(tmp_path, sim, journal, vending_machine(adapter.port), 20), sim)
    try:
        await agent.start()
        sale = await approved_vend(adapter, journal)
        agent.send(signum)
        await agent.wait_for_log("stopping: stopping (draining 1 sale")
        adapter.write(b"c,VEND,SUCCESS\n")  # the product came out after the signal
        assert await agent.exit_code() == STOP_SIGNALS[signum], agent.text()[-3000:]
    finally:
        await agent.close()
        adapter.close()
    assert states(journal) == {sale: "completed"}, agent.text()[-3000:]
    await money_agrees(sim, journal)


@pytest.mark.slow(seconds=15)
async def test_an_mdb_vend_unheard_by_the_deadline_is_parked_then_given_back_on_start(
    sim_factory: Any, tmp_path: Path
) -> None:
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    adapter = LineDevice()
    journal = tmp_path / "journal.db"
    config = configured(tmp_path, sim, journal, vending_machine(adapter.port), 0.5)
    agent = AgentProcess(config, sim)
    again = AgentProcess(config, sim, log="again.log")
    try:
        await agent.start()
        sale = await approved_vend(adapter, journal)
        agent.send(signal.SIGHUP)
        assert await agent.exit_code() == STOP_SIGNALS[signal.SIGHUP], agent.text()[-3000:]
        assert states(journal) == {sale: "dispensing"}
        adapter.write(b"c,VEND,SUCCESS\n")  # too late: nobody hears it
        await again.start()
        await sale_reaches(journal, sale, "reversed")
        again.send(signal.SIGTERM)
        assert await again.exit_code() == 0, again.text()[-3000:]
    finally:
        await agent.close()
        await again.close()
        adapter.close()
    await money_agrees(sim, journal)


async def test_after_the_drained_session_the_mdb_reader_leaves_the_bus(
    sim_factory: Any, tmp_path: Path
) -> None:
    """The customer's session is never cut short by the stop; once it has ended the reader
    steps off the bus (C,0), so the controller offers cashless to nobody else."""
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    adapter = LineDevice()
    journal = tmp_path / "journal.db"
    agent = AgentProcess(configured(tmp_path, sim, journal, vending_machine(adapter.port), 20), sim)
    try:
        await agent.start()
        sale = await approved_vend(adapter, journal)
        agent.send(signal.SIGTERM)
        await agent.wait_for_log("stopping: stopping (draining 1 sale")
        heard = len(adapter.heard)
        adapter.write(b"c,VEND,SUCCESS\n")
        await sale_reaches(journal, sale, "completed")
        assert await agent.exit_code() == 0, agent.text()[-3000:]
        assert "C,0" in adapter.heard[heard:]  # the reader left the bus once the session ended
    finally:
        await agent.close()
        adapter.close()
    assert len(states(journal)) == 1
    await money_agrees(sim, journal)


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_storm_of_signals_mid_dispense_strands_no_money(
    seed: int, sim_factory: Any, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    """A tech's shell (or a broken supervisor) sends any signals, stop and ignored ones mixed,
    a few milliseconds apart, while the coffee drops; the app confirms somewhere among them.
    Whatever the order: the exit code is the first stop signal's, no sale is left open once
    the next start is through, and the ledger holds exactly what the journal says."""
    rng = random.Random(seed)
    sim = await sim_factory(time_scale=50, seed=seed, transactions=0)
    agent, app, journal = await started_kiosk(tmp_path, sim, session, stop_timeout=5)
    storm = rng.choices([*STOP_SIGNALS, *IGNORED_SIGNALS[:6]], k=8)
    first_stop = next(s for s in storm if s in STOP_SIGNALS)
    confirm_at = rng.randrange(len(storm) + 1)
    try:
        sale = await app.buy_coffee()
        await sale_reaches(journal, sale, "dispensing")
        for n, signum in enumerate(storm):
            if n == confirm_at:
                await _confirm_if_heard(app, sale)
            with contextlib.suppress(ProcessLookupError):  # drained and gone already
                agent.send(signum)
            await asyncio.sleep(rng.uniform(0, 0.05))
        if confirm_at == len(storm):
            await _confirm_if_heard(app, sale)
        assert await agent.exit_code() == STOP_SIGNALS[first_stop], agent.text()[-3000:]
    finally:
        await agent.close()
    assert states(journal)[sale] in {"completed", "dispensing"}, agent.text()[-3000:]
    again = AgentProcess(agent.config, sim, log="again.log")
    again.env["KIOSK_APP_TOKEN"] = TOKEN
    try:
        await again.start()
        await again.wait_ready()
        async with asyncio.timeout(30):  # recovery finishes what the storm left open
            while states(journal)[sale] not in {"completed", "reversed"}:
                await asyncio.sleep(0.05)
        again.send(signal.SIGTERM)
        assert await again.exit_code() == 0, again.text()[-3000:]
    finally:
        await again.close()
    assert states(journal)[sale] in {"completed", "reversed"}
    await money_agrees(sim, journal)


async def _confirm_if_heard(app: App, sale: str) -> None:
    """The app says the coffee came out; the agent may have stopped listening already."""
    with contextlib.suppress(aiohttp.ClientError):
        await app.call("POST", f"/sales/{sale}/dispensed", {"status": "vended"})
