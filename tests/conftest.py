"""Shared fixtures: the service simulator, started for real on an ephemeral port."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from kiosk_agent.sim.server import SimOptions, SimServer

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


def _service_client_module() -> Any:
    if importlib.util.find_spec("kiosk_agent.service.client") is None:
        pytest.skip("kiosk_agent.service.client is not written yet")
    return importlib.import_module("kiosk_agent.service.client")


@pytest.fixture
def sim_settings(sim: SimServer) -> Any:
    """``ServiceSettings`` for the ``sim`` fixture's merchant key."""
    client = _service_client_module()
    info = sim.ready_info()
    return client.ServiceSettings(
        base_url=info["base_url"],
        reporting_url=info["reporting_url"],
        ws_url=info["ws_url"],
        api_key=info["api_key"],
        mid=info["mid"],
        refresh_token=info["refresh_token"],
        isv=False,
        client_id=info["client_id"],
        client_secret=info["client_secret"],
        credentials_path=None,
    )


@pytest.fixture
async def service(sim_settings: Any) -> AsyncIterator[Any]:
    """A connected ``ServiceClient`` on ``sim``."""
    client = _service_client_module()
    async with client.ServiceClient(sim_settings) as svc:
        yield svc
