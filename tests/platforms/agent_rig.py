"""The real Agent, built from a YAML configuration, on the in-process simulator."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from kiosk_agent.app import build_agent
from kiosk_agent.assembly.agent import Agent
from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.cli.virtual import simulated_machines
from kiosk_agent.config.load import load_config
from kiosk_agent.health.model import LinkHealth
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock, FakeClock
from kiosk_agent.service.settings import ServiceSettings
from kiosk_agent.sim.machine import VirtualController

from ..helpers import sim_call


async def losing_authorization_answers(sim_factory: Any) -> tuple[Any, ServiceSettings, FakeClock]:
    """A simulator that holds every authorization until the test commits it (``arm_cleared``),
    the agent's service settings (a call is given up after 2 s) and its FakeClock: an
    authorization's answer is lost when the test moves the clock on. (A ``delay`` of 0.5 s of
    real time ran out first on a starved loop: the call was answered before the agent's 2 s
    passed on its clock, and the sale went on as an approval.)"""
    sim = await sim_factory(time_scale=300, transactions=0)
    await sim_call(sim, "POST", "/sim/faults", {"path": "/api/v1/charge", "fault": "hold"})
    return sim, settings_from_ready(sim.ready_info(), timeout=2.0), FakeClock(wall=time.time())


@contextlib.asynccontextmanager
async def running_agent(
    tmp_path: Path, settings: Any, triggers: list[dict[str, Any]], *, time_scale: float = 50,
    sales: dict[str, Any] | None = None, secrets: dict[str, str] | None = None,
    sections: dict[str, Any] | None = None, clock: Clock = SYSTEM_CLOCK,
    listen_resolve: Any = None,
) -> AsyncIterator[Agent]:
    """Values written ``"!secret NAME"`` become real ``!secret`` tags, with ``secrets`` beside.

    ``sections``: more top-level sections (``health``, ``upstream``, ...); ``clock``: the
    agent's (a FakeClock that the test moves); ``listen_resolve``: the look-up of its local
    servers' host names (the agent's ``listen_resolve``)."""
    document = {
        "service": {"simulator": {"time_scale": time_scale}},
        "terminals": [{"device_id": "SIM-0001", "name": "front"}],
        "journal": {"path": str(tmp_path / "journal.db")},
        "receipts": {"print": "never", "email": False},
        "sales": sales or {"vend_timeout": 5.0},
        "triggers": triggers,
        **(sections or {}),
    }
    path = tmp_path / "agent.yaml"
    text = re.sub(r"'(!secret \w+)'", r"\1", yaml.safe_dump(document))
    path.write_text(text)
    if secrets:
        secrets_path = tmp_path / "secrets.yaml"
        secrets_path.write_text(yaml.safe_dump(secrets))
        secrets_path.chmod(0o600)
    agent = build_agent(load_config(path), settings, systemd=False, clock=clock,
                        machines=simulated_machines)
    agent.listen_resolve = listen_resolve
    await agent.start()
    try:
        # every start reads the journal's file whole before money moves on it (the terminals
        # wait out of service meanwhile): a test's customer comes once it is read, as a real one
        await asyncio.wait_for(agent.journal_guard.file_intact(), 60)
        yield agent
    finally:
        await agent.stop()


def front(controller: VirtualController, **more: Any) -> dict[str, Any]:
    """The MDB trigger ``front`` on ``controller``, authorize then capture; ``more`` beside."""
    return {"platform": "mdb", "name": "front", "port": controller.port,
            "flow": "authorize_capture", **more}


def front_link(agent: Agent) -> LinkHealth:
    """The trigger ``front``'s link as the agent's health shows it now."""
    return next(lk for lk in agent.health.snapshot().links if lk.name == "mdb:front")


async def vend_asked(controller: VirtualController) -> None:
    """Until the controller has heard the agent approve B1's vend at $3.25 (its ``C,VEND``)."""
    async with asyncio.timeout(5):
        while "C,VEND,3.25" not in controller.received:
            await asyncio.sleep(0.005)


async def until_final(agent: Agent, sale_id: str) -> None:
    """Until the journal holds the sale ended."""
    while (record := agent.journal.get(sale_id)) is None or not record.state.final:
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def stopped_on_failure(agent: Agent, clock: FakeClock) -> AsyncIterator[None]:
    """A failed test leaves sales waiting on the FakeClock, and the agent's stop gives them a
    grace on it: move the clock until they are parked, so the failure is reported at once."""
    try:
        yield
    except BaseException:
        stopping = asyncio.ensure_future(agent.sales.stop())
        while not stopping.done():
            await clock.advance(1.0)
            await asyncio.sleep(0.01)
        raise
