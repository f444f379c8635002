"""The real agent process's wall clock steps (libfaketime) while a charge-card's answer is slow.

``kiosk-agent run`` runs as its own process under libfaketime (forked from a warm interpreter
that preloaded it, ``warm_under_faketime``); the kiosk app's API starts a sale;
the simulator (in this process, so its ledger can be read) takes the charge-card late. NTP then
steps the agent's wall clock, three days forward or two hours back. Before the one clock, the
forward step ended the sale ``charge_card.none`` at once and left a captured charge for a machine
that vended nothing; the backward step kept the terminal busy for two hours.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import os
import shutil
import signal
import tempfile
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.sales.settings import SaleSettings
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import TransactionFilter, TransStatus
from kiosk_agent.sim.faults import faults_of
from tests.assembly.crash_driver import WarmCommand, WarmCommands, _free_port
from tests.child_signals import stop
from tests.faketime import SteppedClock
from tests.helpers import service_yaml

TIME_SCALE = 300  # the simulator's: a card in 5 ms, an interaction lives 0.6 s
TIMEOUT = 1.0  # the agent gives a money call up after this long (service.timeout, T)
MARGIN = 1.5  # the service may commit that long after (sales.answer_margin, M)
LIFETIME = 180 / TIME_SCALE
KIOSK_TOKEN = "clock-step-kiosk-token-0123456789"
SLACK = 2.0  # a busy machine's scheduling, on top of the documented bound


def bound() -> float:
    """The documented bound of a charge-card into a silent service (docs/architecture.md)."""
    settings = SaleSettings(
        mid="m", terminals={"SIM-0001": ""}, request_timeout=TIMEOUT, answer_margin=MARGIN,
        interaction_lifetime=LIFETIME,
    )  # fmt: skip
    return settings.silence_bound("charge_card")


@functools.cache
def warm_under_faketime() -> tuple[WarmCommands, SteppedClock]:
    """The warm server this file's agents are forked from (one a test process), libfaketime
    preloaded there with the one offset file, set true again at each agent's start: an agent
    costs its start, not a cold interpreter's 1.2 s of imports. Blocks while it starts."""
    directory = Path(tempfile.mkdtemp(prefix="kiosk-clock-step-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    clock = SteppedClock(directory / "faketime")
    server = WarmCommands(env={**os.environ, **clock.env()})
    atexit.register(server.close)
    return server, clock


class AgentProcess:
    """``kiosk-agent run`` in its own process, its wall clock on a libfaketime offset file."""

    def __init__(self, workdir: Path, info: dict[str, Any], clock: SteppedClock) -> None:
        self.workdir = workdir
        self.clock = clock
        clock.step(0.0)  # true again: the agent before stepped it
        self.port = _free_port()
        (workdir / "config.yaml").write_text(
            service_yaml(info, TIMEOUT)
            + textwrap.dedent(
                f"""\
                terminals: [{{device_id: SIM-0001}}]
                journal: {{path: journal.db}}
                sales: {{interaction_lifetime: {LIFETIME}, answer_margin: {MARGIN}}}
                triggers:
                  - {{platform: kiosk_api, name: screen, token: !env_var KIOSK_TOKEN,
                      port: {self.port}, products: {{A1: "2.50"}}}}
                """
            )
        )
        self.env = {
            **os.environ,
            **self.clock.env(),
            "KIOSK_API_KEY": info["api_key"],
            "KIOSK_CLIENT_SECRET": info["client_secret"],
            "KIOSK_TOKEN": KIOSK_TOKEN,
        }
        self.proc: WarmCommand | None = None
        self.url = f"http://127.0.0.1:{self.port}/api/v1"

    async def start(self, http: aiohttp.ClientSession, server: WarmCommands) -> None:
        log = self.workdir / "agent.log"
        argv = ["run", "--config", str(self.workdir / "config.yaml")]
        self.proc = await asyncio.to_thread(server.start, argv, self.env, log, stdout=log)
        async with asyncio.timeout(30):
            while await self.status(http) is None:
                assert self.proc.returncode is None, self.log_tail()
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            await stop(self.proc, signal.SIGTERM, within=15)

    def log_tail(self) -> str:
        return (self.workdir / "agent.log").read_text(errors="replace")[-3000:]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {KIOSK_TOKEN}"}

    async def status(self, http: aiohttp.ClientSession) -> dict[str, Any] | None:
        try:
            async with http.get(f"{self.url}/status", headers=self.headers) as answer:
                return dict(await answer.json()) if answer.status == 200 else None
        except aiohttp.ClientError:
            return None

    async def sell(self, http: aiohttp.ClientSession) -> tuple[int, dict[str, Any]]:
        body = {"product": "A1", "flow": "charge_card"}
        async with http.post(f"{self.url}/sales", json=body, headers=self.headers) as answer:
            return answer.status, dict(await answer.json())

    async def sale(self, http: aiohttp.ClientSession, sale_id: str) -> dict[str, Any]:
        async with http.get(f"{self.url}/sales/{sale_id}", headers=self.headers) as answer:
            assert answer.status == 200, await answer.text()
            return dict(await answer.json())


@pytest.fixture
async def agent_process(
    sim_factory: Any, tmp_path: Path
) -> AsyncIterator[tuple[Any, AgentProcess, aiohttp.ClientSession]]:
    sim = await sim_factory(time_scale=TIME_SCALE, seed=3, transactions=0)
    server, clock = await asyncio.to_thread(warm_under_faketime)
    agent = AgentProcess(tmp_path, sim.ready_info(), clock)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        await agent.start(http, server)
        try:
            yield sim, agent, http
        finally:
            await agent.stop()


async def arm(sim: Any, http: aiohttp.ClientSession, **fault: Any) -> None:
    async with http.post(f"{sim.base_url}/sim/faults", json=fault) as answer:
        assert answer.status == 200, await answer.text()


async def ledger(sim: Any, order_id: str) -> list[Any]:
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        query = TransactionFilter(order_id=order_id)
        return [row async for row in service.reporting.transactions(query)]


async def until_ended(
    agent: AgentProcess, http: aiohttp.ClientSession, sale_id: str, within: float
) -> dict[str, Any]:
    async with asyncio.timeout(within):
        while True:
            sale = await agent.sale(http, sale_id)
            if sale.get("final"):
                return sale
            await asyncio.sleep(0.05)


DAY = 86_400.0


@pytest.mark.parametrize(
    ("offset", "fault", "ends"),
    [
        # committed 1.8 s after it arrives: after the agent gave up (T = 1 s), inside the window
        # in which the service may still commit it (T + M = 2.5 s): found and given back
        (3 * DAY, "delay", "reversed"),
        (-2 * 3600.0, "delay", "reversed"),
        # refused before anything was processed: no charge, believed only after the window
        (3 * DAY, "server_error", "failed"),
        (-2 * 3600.0, "server_error", "failed"),
    ],
)
async def test_a_wall_step_while_the_service_commits_late_leaves_no_charge_and_no_stuck_sale(
    agent_process: tuple[Any, AgentProcess, aiohttp.ClientSession],
    offset: float,
    fault: str,
    ends: str,
) -> None:
    sim, agent, http = agent_process
    faults = faults_of(sim.ctx)
    assert faults is not None
    await arm(sim, http, path="/api/terminal/SIM-0001/charge-card", fault=fault, delay_s=1.8)
    # before the kiosk API is asked: the agent sends the charge-card after this, so the time
    # from here bounds its own wait from below (taken after the 202, the agent's send could
    # come first, and a wait of exactly the window read 2 ms short on a busy machine)
    sent = time.monotonic()
    status, sale = await agent.sell(http)
    assert status == 202, sale
    async with asyncio.timeout(10):
        while not faults.armed[-1].hits:
            await asyncio.sleep(0.01)
    agent.clock.step(offset)  # NTP steps the unit's wall clock, the call still out
    ended = await until_ended(agent, http, sale["sale_id"], bound() + SLACK + 5)
    took = time.monotonic() - sent
    assert ended["state"] == ends, ended
    assert took <= bound() + SLACK  # the sale ended within its bound
    if ends == "failed":  # "no charge" believed only once the service could no longer charge
        assert took >= bound() - TIMEOUT  # the answer window: silence_bound - T
    rows = await ledger(sim, sale["order_id"])
    # no charge kept for a machine that vended nothing
    assert [row.status for row in rows] == ([TransStatus.VOIDED] if ends == "reversed" else [])
    status, after = await agent.sell(http)  # the reader takes the next customer
    assert status == 202, after
