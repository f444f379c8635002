"""The shared fixtures other areas build on: a simulator and a connected service client."""

from __future__ import annotations

from typing import Any

from kiosk_agent.sim.server import SimOptions, SimServer


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


SEEDED = ("transactions", "deposits", "chargebacks", "adjustments")


def _seeded_tables(sim: SimServer) -> dict[str, list[dict[str, Any]]]:
    assert sim.ctx is not None
    return {table: sim.ctx.store.rows(f"SELECT * FROM {table} ORDER BY rowid")  # noqa: S608
            for table in SEEDED}


async def test_the_fixtures_simulators_hold_the_data_set_a_simulator_of_its_own_draws(
    sim_factory: Any,
) -> None:
    """sim_factory draws each data set once a worker (tests/conftest.py): every simulator it
    starts, the first and a later one, stores what a simulator started without it stores."""
    own = SimServer(SimOptions(port=0, time_scale=50, transactions=200, seed=1))
    await own.start()
    try:
        expected = _seeded_tables(own)
    finally:
        await own.stop()
    assert all(expected.values())
    first = await sim_factory(seed=1)
    first_tables = _seeded_tables(first)
    again = await sim_factory(seed=1)
    assert _seeded_tables(again) == first_tables == expected
    other = await sim_factory(seed=2)
    assert _seeded_tables(other)["transactions"] != expected["transactions"]
