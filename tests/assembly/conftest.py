"""Fixtures for the agent's tests: a real Agent on the real simulator, and scripted dispensers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.app import build_agent
from kiosk_agent.assembly.agent import Agent
from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.cli.virtual import simulated_machines
from kiosk_agent.config.load import load_config
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock, FakeClock

from .agent_helpers import BACKOFF, REQUEST_TIMEOUT, TIME_SCALE, write_config
from .crash_driver import SharedDrivers, WarmDrivers

AgentFactory = Callable[..., Awaitable[Agent]]


@pytest.fixture
async def drivers() -> AsyncIterator[WarmDrivers]:
    """The crash drivers' server (``crash_driver.py serve``), the test process's one: each
    driver a process of its own, forked with the agent already imported."""
    server = await asyncio.to_thread(SharedDrivers.shared)
    try:
        yield server
    finally:
        await server.release()  # a driver the test left running ends with it


@pytest.fixture
async def agent_factory(sim_factory: Any, tmp_path: Path) -> AsyncIterator[AgentFactory]:
    """Start Agents on one simulator (time scale TIME_SCALE), stopped at the end."""
    agents: list[Agent] = []
    sims: list[Any] = []

    async def make(
        extra: str = "",
        sim: Any = None,
        directory: Path | None = None,
        answer_margin: float = 0.5,
        clock: Clock = SYSTEM_CLOCK,
        time_scale: float = TIME_SCALE,  # the agent's view of the simulator's (its lifetimes)
        **tuning: Any,
    ) -> Agent:
        if sim is None:
            if not sims:
                sims.append(await sim_factory(time_scale=TIME_SCALE, seed=1, transactions=0))
            sim = sims[0]
        config = load_config(
            write_config(directory or tmp_path, extra, time_scale, answer_margin=answer_margin)
        )
        # a short request timeout: a money call's deadline (timeout + answer_margin) stays short
        tuning.setdefault("timeout", REQUEST_TIMEOUT)
        for name, value in BACKOFF.items():
            tuning.setdefault(name, value)
        settings = settings_from_ready(sim.ready_info(), **tuning)
        agent = build_agent(config, settings, systemd=False, clock=clock,
                            machines=simulated_machines)
        await agent.start()
        agents.append(agent)
        return agent

    yield make
    for agent in reversed(agents):
        if agent.started:
            stopping = agent.stop()
            # on a FakeClock, a sale still running ends its pauses (and the stop its grace) there
            fake = agent.clock if isinstance(agent.clock, FakeClock) else None
            await (fake.run(stopping, real_timeout=15) if fake is not None else stopping)


@pytest.fixture
async def agent(agent_factory: AgentFactory) -> Agent:
    return await agent_factory()
