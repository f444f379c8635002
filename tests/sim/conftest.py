"""Fixtures of the simulator's own tests: a plain aiohttp client speaking to the real server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from kiosk_agent.sim.server import SimServer

from .sim_api import Api


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def api(sim: SimServer, http: aiohttp.ClientSession) -> Api:
    """The merchant's API key against the ``sim`` fixture."""
    return Api(http, sim.base_url, "sim_api_key")
