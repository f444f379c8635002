"""Against the simulator: key rotation under concurrency and a 429 storm the client rides out."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.errors import AuthenticationError


async def test_ten_calls_racing_an_expired_key_refresh_it_exactly_once(
    sim_factory: Any, sim_settings: Any, tmp_path: Path
) -> None:
    # A refreshed key lives one simulated hour: one real second at this scale.
    sim = await sim_factory(time_scale=3600)
    path = tmp_path / "credentials.json"
    settings = sim_settings.model_copy(
        update={"base_url": sim.base_url, "ws_url": sim.ws_url, "reporting_url": sim.base_url,
                "credentials_path": path}
    )  # fmt: skip
    async with ServiceClient(settings) as svc:
        first = await svc.keys.refresh()  # the seeded key never expires; its successor does
        assert json.loads(path.read_text())["api_key"] == first.api_key
        await asyncio.sleep(1.1)  # now the service refuses it
        results = await asyncio.gather(*(svc.terminal.list() for _ in range(10)))
        assert all(len(terminals) == 8 for terminals in results)
        assert svc.transport.keys.refresh_count == 2  # ours, then exactly one for the ten
        second = svc.keys.current
        assert second.api_key != first.api_key
        assert json.loads(path.read_text())["api_key"] == second.api_key

    # A restart uses the saved pair, and the spent refresh token of the first key is refused.
    async with ServiceClient(settings) as svc:
        assert svc.keys.current.api_key == second.api_key
    stale = settings.replace(
        credentials_path=None, api_key=first.api_key, refresh_token=first.refresh_token
    )
    await asyncio.sleep(1.1)
    async with ServiceClient(stale) as svc:
        with pytest.raises(AuthenticationError):
            await svc.terminal.list()


async def test_a_429_storm_is_ridden_out(sim_factory: Any, sim_settings: Any) -> None:
    sim = await sim_factory(rate_limit="10/1")  # bursts of 20, then 10 per second
    settings = sim_settings.model_copy(
        update={"base_url": sim.base_url, "ws_url": sim.ws_url, "reporting_url": sim.base_url}
    )
    async with ServiceClient(settings) as svc:
        started = time.monotonic()
        answers = await asyncio.gather(*(svc.terminal.ping("SIM-0003") for _ in range(45)))
        elapsed = time.monotonic() - started
        assert svc.transport.rate_limited_count > 0  # the storm happened
        assert all(answer.online for answer in answers)  # and every call got through
    assert elapsed < 10


async def test_oauth_token_is_cached_until_it_expires(sim_factory: Any, sim_settings: Any) -> None:
    sim = await sim_factory(time_scale=3600)  # a token lives one simulated hour: one real second
    settings = sim_settings.replace(
        base_url=sim.base_url, ws_url=sim.ws_url, reporting_url=sim.base_url
    )
    url_path = "/ords/sprint/api/3p/v1/transactions"
    async with ServiceClient(settings) as svc:
        url = svc.transport.reporting_url(url_path)
        for _ in range(3):
            await svc.transport.oauth_request("GET", url, params={"limit": 1})
        assert svc.transport.oauth.fetch_count == 1
        await asyncio.sleep(1.1)
        answer = await svc.transport.oauth_request("GET", url, params={"limit": 1})
        assert svc.transport.oauth.fetch_count == 2
    assert len(answer["items"]) == 1
