"""A stop drains: each stopping signal sent to a real `kiosk-agent run` mid-dispense.

The kiosk app (over real HTTP) and an MDB adapter (over a real pty) are played by the test; the
simulator's ledger says what happened to the money. A result that comes after the signal and
before ``sales.stop_timeout`` is heard: the sale is sold and captured, nothing given back. One
that comes later finds the sale parked, and the next start finishes it: it listens for the
vend's result until the vend's own deadline (its approval plus the trigger's ``vend_timeout``,
short here), captures a success said meanwhile, and gives the money back at that deadline if
nothing is said (rule 13). A second signal ends the wait as the deadline would have.

Which stop signal starts the drain does not matter to it (``StopSignals`` sets one event for
each); that each of them, in a real process, stops the agent mid-dispense with its own exit code
is tests/cli/test_agent_signals.py's. Here the kiosk app's drain is started by SIGINT, the MDB's
by SIGQUIT, the deadlines by SIGTERM and SIGHUP, a second signal by SIGINT: every stop signal
drains a real process once, and the storms mix them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.cli.contract import IGNORED_SIGNALS, STOP_SIGNALS

from ..helpers import until
from ..platforms.vending_rig import LineDevice
from .agent_process import (
    LISTENING,
    AgentProcess,
    given_back_at_its_deadline,
    money_agrees,
    sale_reaches,
    states,
    steps_of,
)
from .kiosk_app_rig import TOKEN, App, configured, kiosk_app


class DrainRig:
    """The simulator, a real agent on it (a kiosk app's or an MDB adapter's) with a sale caught
    at `dispensing`, and the next start that finishes what the drain parked. Every process and
    pty it made is closed when the test ends."""

    def __init__(
        self, sim_factory: Any, tmp_path: Path, session: aiohttp.ClientSession
    ) -> None:
        self._sim_factory = sim_factory
        self.dir = tmp_path
        self.session = session
        self.journal = tmp_path / "journal.db"
        self.sim: Any = None
        self.processes: list[AgentProcess] = []
        self.adapter: LineDevice | None = None

    async def kiosk_dispensing(
        self, stop_timeout: float, seed: int = 3, vend_timeout: float = 60
    ) -> tuple[AgentProcess, App, str]:
        """The agent behind a kiosk app, its coffee sale at `dispensing` (the app has not
        confirmed it yet)."""
        agent = await self._agent(kiosk_app(vend_timeout), stop_timeout, seed)
        await agent.wait_ready()
        sale = await self.app_of(agent).buy_coffee()
        await sale_reaches(self.journal, sale, "dispensing")
        return agent, self.app_of(agent), sale

    def app_of(self, agent: AgentProcess) -> App:
        """The kiosk app of ``agent``, on the port it logged (each start has its own)."""
        found = re.search(r"kiosk API on 127\.0\.0\.1:(\d+)", agent.text())
        assert found, agent.text()[-3000:]
        return App(self.session, int(found.group(1)))

    async def mdb_vending(
        self, stop_timeout: float, vend_timeout: float = 60
    ) -> tuple[AgentProcess, LineDevice, str]:
        """The agent on an MDB adapter (a pty the test plays), a $2.50 vend approved: the
        controller is dropping the product."""
        self.adapter = LineDevice()
        machine = vending_machine(self.adapter.port, vend_timeout)
        agent = await self._agent(machine, stop_timeout, seed=3)
        return agent, self.adapter, await approved_vend(self.adapter, self.journal)

    async def next_start(self, log: str = "again.log") -> AgentProcess:
        """The next start (its own log), ready: it may still be listening for a parked vend."""
        assert self.processes
        again = AgentProcess(self.processes[0].config, self.sim, log=log)
        again.env["KIOSK_APP_TOKEN"] = TOKEN
        self.processes.append(again)
        await again.start()
        await again.wait_ready()
        return again

    async def next_start_ends(
        self, sale: str, ends: set[str], again: AgentProcess | None = None
    ) -> AgentProcess:
        """The next start (or ``again``, started already) recovers ``sale`` to one of ``ends``,
        then stops cleanly on SIGTERM."""
        again = again or await self.next_start()
        async with asyncio.timeout(30):  # recovery finishes what the drain left open
            while states(self.journal)[sale] not in ends:
                await asyncio.sleep(0.05)
        again.send(signal.SIGTERM)
        assert await again.exit_code() == 0, again.text()[-3000:]
        return again

    async def _agent(self, trigger: str, stop_timeout: float, seed: int) -> AgentProcess:
        self.sim = await self._sim_factory(time_scale=50, seed=seed, transactions=0)
        config = configured(self.dir, self.sim, self.journal, trigger, stop_timeout)
        agent = AgentProcess(config, self.sim)
        agent.env["KIOSK_APP_TOKEN"] = TOKEN
        self.processes.append(agent)
        return await agent.start()

    async def close(self) -> None:
        for process in self.processes:
            await process.close()
        if self.adapter is not None:
            self.adapter.close()


@pytest.fixture
async def rig(sim_factory: Any, tmp_path: Path) -> AsyncIterator[DrainRig]:
    async with aiohttp.ClientSession() as session:
        made = DrainRig(sim_factory, tmp_path, session)
        try:
            yield made
        finally:
            await made.close()


@pytest.mark.slow(seconds=12)
async def test_a_kiosk_app_confirming_after_the_signal_is_heard_and_the_sale_is_sold(
    rig: DrainRig,
) -> None:
    agent, app, sale = await rig.kiosk_dispensing(stop_timeout=20)
    agent.send(signal.SIGINT)
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
    assert await agent.exit_code() == STOP_SIGNALS[signal.SIGINT], agent.text()[-3000:]
    assert states(rig.journal) == {sale: "completed"}, agent.text()[-3000:]
    await money_agrees(rig.sim, rig.journal)  # captured $2.50, nothing voided or refunded


@pytest.mark.slow(seconds=15)
async def test_a_dispense_unheard_by_the_deadline_is_parked_and_finished_by_the_next_start(
    rig: DrainRig,
) -> None:
    agent, _app, sale = await rig.kiosk_dispensing(stop_timeout=0.5, vend_timeout=8)
    agent.send(signal.SIGTERM)
    assert await agent.exit_code() == 0, agent.text()[-3000:]
    assert "sales.stop_timeout (0.5 s) has passed; 1 sale(s) still running are parked" in (
        agent.text()
    )
    assert states(rig.journal) == {sale: "dispensing"}  # parked where it stood
    assert "parked" in _steps(rig.journal, sale)
    again = await rig.next_start()
    await again.wait_for_log(f"sale {sale}: {LISTENING}")  # the app may still confirm it
    await rig.next_start_ends(sale, {"reversed"}, again)
    # never confirmed: the money goes back at the vend's own deadline, 8 s from its approval
    given_back_at_its_deadline(rig.journal, sale, vend_timeout=8)
    await money_agrees(rig.sim, rig.journal)


@pytest.mark.slow(seconds=15)
async def test_a_second_signal_ends_the_drain_as_its_deadline_would_have(rig: DrainRig) -> None:
    agent, _app, sale = await rig.kiosk_dispensing(stop_timeout=300, vend_timeout=10)
    agent.send(signal.SIGTERM)
    await agent.wait_for_log("stopping: stopping (draining 1 sale")
    agent.send(signal.SIGINT)
    # the first signal's exit code; long before the 300 s drain would have ended
    assert await agent.exit_code(within=30) == 0, agent.text()[-3000:]
    assert "a second stopping signal ended the drain; 1 sale(s) still running are parked" in (
        agent.text()
    )
    assert states(rig.journal) == {sale: "dispensing"}
    # the coffee came out after all: the app tells the next start, which still listens for it
    # (the vend's deadline, 10 s from its approval, has not passed): sold, not given back
    again = await rig.next_start()
    await again.wait_for_log(f"sale {sale}: {LISTENING}")
    status, body, _ = await rig.app_of(again).call(
        "POST", f"/sales/{sale}/dispensed", {"status": "vended"})
    assert status == 202, body
    await rig.next_start_ends(sale, {"completed"}, again)
    await money_agrees(rig.sim, rig.journal)  # captured $2.50, nothing voided or refunded


def _steps(journal: Path, sale_id: str) -> list[str]:
    import sqlite3

    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT step FROM steps WHERE sale_id = ? ORDER BY id", (sale_id,))
        return [step for (step,) in rows]
    finally:
        db.close()


def vending_machine(port: str, vend_timeout: float = 60) -> str:
    """An MDB adapter on a pty the test plays; the agent approves and waits for the result."""
    return f"""\
triggers:
  - platform: mdb
    name: front
    port: {port}
    vend_timeout: {vend_timeout}
    max_price: "5.00"
"""


async def approved_vend(adapter: LineDevice, journal: Path) -> str:
    await until(lambda: "C,1" in adapter.heard, timeout=20)
    adapter.write(b"c,STATUS,VEND,2.50,12\n")
    await until(lambda: "C,VEND,2.50" in adapter.heard, timeout=20)
    [sale] = states(journal)
    return sale


@pytest.mark.slow(seconds=12)
async def test_an_mdb_vend_succeeding_after_the_signal_is_heard_and_the_sale_is_sold(
    rig: DrainRig,
) -> None:
    agent, adapter, sale = await rig.mdb_vending(stop_timeout=20)
    agent.send(signal.SIGQUIT)
    await agent.wait_for_log("stopping: stopping (draining 1 sale")
    adapter.write(b"c,VEND,SUCCESS\n")  # the product came out after the signal
    assert await agent.exit_code() == STOP_SIGNALS[signal.SIGQUIT], agent.text()[-3000:]
    assert states(rig.journal) == {sale: "completed"}, agent.text()[-3000:]
    await money_agrees(rig.sim, rig.journal)


@pytest.mark.slow(seconds=15)
@pytest.mark.parametrize("controller_says", [None, "c,VEND,SUCCESS", "c,ERR,VEND 3"])
async def test_an_mdb_vend_unheard_by_the_deadline_is_parked_then_settled_by_the_next_start(
    controller_says: str | None, rig: DrainRig,
) -> None:
    """The drain parks the vend; the next start, on the same adapter, listens for it until the
    vend's own deadline with the setup held back (its C,0 would end the controller's session).
    The controller's success said meanwhile is captured, its failure given back; silence gives
    the money back at that deadline. The setup follows the hearing."""
    agent, adapter, sale = await rig.mdb_vending(stop_timeout=0.5, vend_timeout=8)
    agent.send(signal.SIGHUP)
    assert await agent.exit_code() == STOP_SIGNALS[signal.SIGHUP], agent.text()[-3000:]
    assert states(rig.journal) == {sale: "dispensing"}
    stopped = len(adapter.heard)
    again = await rig.next_start()
    await again.wait_for_log("listening for its result before the setup")
    assert "C,0" not in adapter.heard[stopped:]  # the controller's session is left alone
    if controller_says is not None:
        adapter.write(controller_says.encode() + b"\n")
    await until(lambda: "C,1" in adapter.heard[stopped:])  # set up once recovery is done
    if controller_says == "c,VEND,SUCCESS":
        await rig.next_start_ends(sale, {"completed"}, again)
    else:
        await rig.next_start_ends(sale, {"reversed"}, again)
    if controller_says is None:
        given_back_at_its_deadline(rig.journal, sale, vend_timeout=8)
    else:  # settled on what the controller said after the restart, not on the deadline
        said = "vend success" if "SUCCESS" in controller_says else "vend failed"
        settled = f"for sale {sale}, left dispensing by the last stop or crash: recovery settles"
        assert f"mdb:front: {said}" in again.text(), again.text()[-3000:]
        assert again.says(settled), again.text()[-3000:]
    await money_agrees(rig.sim, rig.journal)


async def test_after_the_drained_session_the_mdb_reader_leaves_the_bus(rig: DrainRig) -> None:
    """The customer's session is never cut short by the stop; once it has ended the reader
    steps off the bus (C,0), so the controller offers cashless to nobody else."""
    agent, adapter, sale = await rig.mdb_vending(stop_timeout=20)
    agent.send(signal.SIGTERM)
    await agent.wait_for_log("stopping: stopping (draining 1 sale")
    heard = len(adapter.heard)
    adapter.write(b"c,VEND,SUCCESS\n")
    await sale_reaches(rig.journal, sale, "completed")
    assert await agent.exit_code() == 0, agent.text()[-3000:]
    assert "C,0" in adapter.heard[heard:]  # the reader left the bus once the session ended
    assert len(states(rig.journal)) == 1
    await money_agrees(rig.sim, rig.journal)


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_storm_of_signals_mid_dispense_strands_no_money(seed: int, rig: DrainRig) -> None:
    """A tech's shell (or a broken supervisor) sends any signals, stop and ignored ones mixed,
    a few milliseconds apart, while the coffee drops; the app confirms somewhere among them.
    Whatever the order: the exit code is the first stop signal's, no sale is left open once
    the next start is through, and the ledger holds exactly what the journal says."""
    rng = random.Random(seed)
    storm = rng.choices([*STOP_SIGNALS, *IGNORED_SIGNALS[:6]], k=8)
    first_stop = next(s for s in storm if s in STOP_SIGNALS)
    confirm_at = rng.randrange(len(storm) + 1)
    # a vend timeout of 10 s: longer than the drain, and how long the next start listens
    agent, app, sale = await rig.kiosk_dispensing(stop_timeout=5, seed=seed, vend_timeout=10)
    for n, signum in enumerate(storm):
        if n == confirm_at:
            await _confirm_if_heard(app, sale)
        with contextlib.suppress(ProcessLookupError):  # drained and gone already
            agent.send(signum)
        await asyncio.sleep(rng.uniform(0, 0.05))
    if confirm_at == len(storm):
        await _confirm_if_heard(app, sale)
    assert await agent.exit_code() == STOP_SIGNALS[first_stop], agent.text()[-3000:]
    parked = states(rig.journal)[sale]
    assert parked in {"completed", "dispensing"}, agent.text()[-3000:]
    again = await rig.next_start()
    if parked == "completed":
        await rig.next_start_ends(sale, {"completed"}, again)
    else:  # unconfirmed when it stopped: listened for to its deadline, then given back
        await again.wait_for_log(f"sale {sale}: {LISTENING}")
        await rig.next_start_ends(sale, {"reversed"}, again)
        given_back_at_its_deadline(rig.journal, sale, vend_timeout=10)
    await money_agrees(rig.sim, rig.journal)


async def _confirm_if_heard(app: App, sale: str) -> None:
    """The app says the coffee came out; the agent may have stopped listening already."""
    with contextlib.suppress(aiohttp.ClientError):
        await app.call("POST", f"/sales/{sale}/dispensed", {"status": "vended"})


@pytest.mark.slow(seconds=15)
async def test_a_stop_while_the_next_start_listens_ends_at_once_and_the_third_listens_on(
    rig: DrainRig,
) -> None:
    """A stop during the restart's hearing is not held by it: the agent ends with 0 at once,
    the sale still dispensing (nothing said to the controller), and the start after listens to
    the same deadline, the vend's own, then gives the money back."""
    agent, adapter, sale = await rig.mdb_vending(stop_timeout=0.5, vend_timeout=8)
    agent.send(signal.SIGHUP)
    assert await agent.exit_code() == STOP_SIGNALS[signal.SIGHUP], agent.text()[-3000:]
    stopped = len(adapter.heard)
    again = await rig.next_start()
    await again.wait_for_log(f"sale {sale}: {LISTENING}")
    again.send(signal.SIGTERM)
    assert await again.exit_code() == 0, again.text()[-3000:]
    approved = [at for at, step in steps_of(rig.journal, sale) if step == "dispense.request"][-1]
    assert time.time() < approved + 8, "the stop waited for the hearing's deadline"
    assert states(rig.journal) == {sale: "dispensing"}, again.text()[-3000:]
    assert adapter.heard[stopped:] == [], adapter.heard[stopped:]  # no setup, no C,0
    third = await rig.next_start(log="third.log")
    await third.wait_for_log(f"sale {sale}: {LISTENING}")
    await rig.next_start_ends(sale, {"reversed"}, third)
    given_back_at_its_deadline(rig.journal, sale, vend_timeout=8)
    await money_agrees(rig.sim, rig.journal)
