"""The shared fixtures other areas build on: a simulator and a connected service client."""

from __future__ import annotations

from typing import Any

from kiosk_agent.sim.server import SimServer


async def test_sim_settings_point_at_the_sim(sim: SimServer, sim_settings: Any) -> None:
    assert sim_settings.base_url == sim.base_url
    assert sim_settings.mid == "999000000001"
    assert sim_settings.api_key.get_secret_value() == "sim_api_key"


async def test_service_client_lists_the_simulated_terminals(service: Any) -> None:
    terminals = await service.terminal.list()
    assert [t.device_id for t in terminals][:2] == ["SIM-0001", "SIM-0002"]


async def test_sim_factory_takes_options(sim_factory: Any) -> None:
    sim = await sim_factory(time_scale=1000, seed=3, transactions=10)
    assert sim.ctx is not None
    assert sim.ctx.clock.time_scale == 1000
    assert sim.port > 0
