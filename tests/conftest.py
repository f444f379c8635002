"""Shared fixtures: the service simulator, started for real on an ephemeral port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.settings import ServiceSettings
from kiosk_agent.sim.server import SimOptions, SimServer

# Property tests run on a busy 2-core CI machine: hypothesis's per-example deadline would make
# them flaky, so time bounds are asserted by the tests themselves, generously.
settings.register_profile(
    "kiosk", deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("kiosk")

SimFactory = Callable[..., Awaitable[SimServer]]


@pytest.fixture
async def sim_factory() -> AsyncIterator[SimFactory]:
    """Start simulators with any ``SimOptions`` (port 0, time_scale 50 unless given)."""
    started: list[SimServer] = []

    async def start(**options: Any) -> SimServer:
        options.setdefault("port", 0)
        options.setdefault("time_scale", 50)
        options.setdefault("transactions", 200)
        server = SimServer(SimOptions(**options))
        await server.start()
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        await server.stop()


@pytest.fixture
async def sim(sim_factory: SimFactory) -> SimServer:
    """A started in-process simulator: real HTTP on 127.0.0.1, time_scale 50, seed 1."""
    return await sim_factory(seed=1)


@pytest.fixture
def sim_settings(sim: SimServer) -> ServiceSettings:
    """``ServiceSettings`` for the ``sim`` fixture's merchant key."""
    return settings_from_ready(sim.ready_info())


@pytest.fixture
async def service(sim_settings: ServiceSettings) -> AsyncIterator[ServiceClient]:
    """A connected ``ServiceClient`` on ``sim``."""
    async with ServiceClient(sim_settings) as svc:
        yield svc


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first: spread over parallel workers (``./dev test`` runs several), each starts
    at once instead of last, so the run ends soon after the longest one."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
