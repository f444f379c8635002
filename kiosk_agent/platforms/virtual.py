"""``platform: virtual``: a whole vending machine with no hardware, for the demo and the tests.

A thin driver: the simulated machine (controller and MDB adapter on a pty,
``kiosk_agent/sim/machine.py``) comes from the factory the CLI gives the agent (``Agent.machines``:
nothing below the CLI imports ``kiosk_agent.sim``), and the agent's ``mdb`` platform drives it
through its port, as it would a real adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from kiosk_agent.config.load import schema_built_on_read
from kiosk_agent.config.registry import CannotStart
from kiosk_agent.health.availability import follow_availability

# the schema is plain voluptuous, in a module of its own: checking a configuration loads none of
# this module (config.registry.platform_checks); re-exported, as a platform module provides it
from kiosk_agent.platforms import virtual_schema
from kiosk_agent.platforms.base import instance_name, link_reporter
from kiosk_agent.platforms.mdb import MdbCashless, MdbOptions, Mode
from kiosk_agent.platforms.serial import SerialSettings
from kiosk_agent.sales.model import Flow
from kiosk_agent.tasks import cancel_and_wait


class SimulatedMachine(Protocol):
    """What the driver uses of the simulated machine (``sim.machine.VirtualController``)."""

    @property
    def port(self) -> str: ...

    async def start(self) -> None: ...

    async def random_customers(
        self,
        *,
        card_first: bool,
        gap: tuple[float, float],
        fail_rate: float,
        walk_away_rate: float,
        cash_rate: float,
    ) -> None: ...

    def close(self) -> None: ...

    async def stop(self) -> None: ...

    def stock_columns(
        self, capacity: Mapping[str, int],
        before_refill: Callable[[], Awaitable[None]] | None = None,
    ) -> None: ...

    def tally(self) -> Mapping[str, int]: ...


class MachineFactory(Protocol):
    """Makes a simulated machine, not started (``sim.machine.make_machine``)."""

    def __call__(
        self, *, products: dict[str, int], dispense_time: float, dex: bool, seed: int | None
    ) -> SimulatedMachine: ...


NO_MACHINES = (
    "no simulated machine to run here: `kiosk-agent run` and `kiosk-agent demo` give the agent"
    " one (Agent.machines); a real machine is an `mdb` trigger"
)


class VirtualPlatform:
    """A simulated machine plus the agent's cashless device on it: a whole vending machine."""

    def __init__(self, name: str, controller: SimulatedMachine, device: MdbCashless) -> None:
        self.name = name
        self.controller = controller
        self.device = device
        self._customers: asyncio.Task[None] | None = None

    def start_customers(
        self,
        *,
        card_first: bool,
        gap: tuple[float, float],
        fail_rate: float,
        walk_away_rate: float,
        cash_rate: float,
    ) -> None:
        self._customers = asyncio.create_task(self.controller.random_customers(
            card_first=card_first, gap=gap, fail_rate=fail_rate, walk_away_rate=walk_away_rate,
            cash_rate=cash_rate,
        ))

    def drain(self) -> None:
        """The agent stops: no new customer comes; the one in a session finishes it."""
        self.controller.close()

    async def stop(self) -> None:
        if self._customers is not None:
            # The customer at the machine finishes (a vend in flight is heard to its end).
            self.controller.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._customers), 10.0)
            await cancel_and_wait(self._customers)
        await self.device.stop()
        await self.controller.stop()

    def status(self) -> dict[str, Any]:
        return {**self.device.status(), "virtual": dict(self.controller.tally())}


async def async_setup_platform(agent: Any, config: dict[str, Any]) -> VirtualPlatform:
    source = instance_name(config, "vending")
    machines: MachineFactory | None = getattr(agent, "machines", None)
    if machines is None:
        raise CannotStart(f"{source}: {NO_MACHINES}")
    mode = Mode(config["mode"])
    controller = machines(
        products=config["products"], dispense_time=config["dispense_time"], dex=config["dex"],
        seed=config.get("seed"),
    )
    await controller.start()
    planogram = _planogram_of(agent, source)
    if planogram:  # its columns hold what the `dex:` section reading it says they hold
        controller.stock_columns(planogram, _tech_refills(agent))
    options = MdbOptions(
        source=source,
        mode=mode,
        flow=Flow(config["flow"]),
        terminal=config.get("terminal"),
        max_funds_cents=config["max_funds"],
        vend_timeout=config.get("vend_timeout"),
    )
    device = MdbCashless(
        agent.sales,
        SerialSettings(port=controller.port, reconnect_max=2.0),
        options,
        on_link_state=link_reporter(agent, source),
        clock=agent.clock,
    )
    device.unfollow = follow_availability(agent, config.get("terminal"), device.set_available)
    await device.start()
    platform = VirtualPlatform(source, controller, device)
    if config["customers"]:
        platform.start_customers(
            card_first=mode is Mode.CARD_FIRST,
            gap=(config["gap"][0], config["gap"][1]),
            fail_rate=config["fail_rate"],
            walk_away_rate=config["walk_away_rate"],
            cash_rate=config["cash_rate"],
        )
    return platform


def _planogram_of(agent: Any, source: str) -> Mapping[str, int]:
    """The capacity per column of the `dex:` section that reads this machine (``port:
    virtual:NAME``), or nothing."""
    config = getattr(agent, "config", None)
    dex = config.get("dex") if config is not None else None
    if not dex or str(dex.get("port", "")) not in (source, source.removeprefix("virtual:")):
        return {}
    return dict(dex.get("planogram") or {})


def _tech_refills(agent: Any) -> Callable[[], Awaitable[None]]:
    """What the virtual machine's tech does before filling every column: read the machine's
    books, then record the refill (``kiosk-agent audit fill --all``), as docs/audit.md asks."""

    async def refill() -> None:
        books = next((c for c in agent.components if type(c).__name__ == "AuditReads"), None)
        if books is None:
            return
        await books.read_between_sales()
        books.store.record_fill(books.settings.planogram, at=agent.clock.time(),
                                by="the virtual machine's tech")

    return refill


__getattr__ = schema_built_on_read(__name__, lambda: virtual_schema.PLATFORM_SCHEMA)
