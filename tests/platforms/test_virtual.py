"""``platform: virtual`` is a thin driver: its machine comes from the factory the CLI gives the
agent, and without one it refuses to start, saying why (no traceback, nothing imported)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kiosk_agent.config.registry import CannotStart
from kiosk_agent.platforms.virtual import NO_MACHINES, PLATFORM_SCHEMA, async_setup_platform


async def test_without_the_clis_machines_a_virtual_trigger_refuses_to_start() -> None:
    agent = SimpleNamespace(machines=None)
    config = PLATFORM_SCHEMA({"platform": "virtual", "name": "snacks"})
    with pytest.raises(CannotStart, match="virtual:snacks: no simulated machine") as refused:
        await async_setup_platform(agent, config)
    assert NO_MACHINES in str(refused.value)


async def test_the_trigger_asks_the_factory_for_its_machine() -> None:
    """What the trigger configures reaches the factory; a machine that cannot open its port
    stops the setup there (the CLI's factory raises OSError for a pty it cannot open)."""
    asked: list[dict[str, object]] = []

    class Unopenable:
        port = ""

        async def start(self) -> None:
            raise OSError("no pty left")

    def machines(**spec: object) -> Unopenable:
        asked.append(spec)
        return Unopenable()

    config = PLATFORM_SCHEMA({"platform": "virtual", "name": "snacks", "products": {"A1": "1.25"},
                              "dispense_time": 0.1, "seed": 3})
    with pytest.raises(OSError, match="no pty left"):
        await async_setup_platform(SimpleNamespace(machines=machines), config)
    assert asked == [{"products": {"A1": 125}, "dispense_time": 0.1, "dex": False, "seed": 3}]
