"""Assemble an Agent from a configuration: platforms from the registry, components for the
sections present (admin, webhooks, upstream), systemd notify.

Also the one place that chooses the service a configuration names (:func:`configured_service`:
the embedded simulator, started for as long as it is used, or the real service) and assembles
an agent for a command (:func:`agent_for`: the journal claimed first). ``run``, ``demo``,
``doctor`` and the service commands all come here. Nothing here imports the simulator: the
command line passes the factory that makes one (``cli.embedded.embedded_simulator``), used only when
a configuration embeds one.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kiosk_agent.assembly.agent import Agent, ComponentFactory, service_settings_from_config
from kiosk_agent.assembly.systemd import SystemdLifecycle
from kiosk_agent.config.load import SECTION_OWNERS, Config, load_config
from kiosk_agent.config.registry import setup_function
from kiosk_agent.data_class import data_class
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sales.owner import JournalLock
from kiosk_agent.service.settings import ServiceSettings

if TYPE_CHECKING:
    from kiosk_agent.platforms.virtual import MachineFactory

class EmbeddedSimulator(Protocol):
    """The simulator a configuration embeds (``service: {simulator: ...}``), as seen here."""

    @property
    def base_url(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def ready_info(self) -> dict[str, Any]: ...


# From the ``simulator:`` section's settings (time_scale, seed, transactions) to a simulator.
SimulatorFactory = Callable[[dict[str, Any]], EmbeddedSimulator]


class NoSimulator(Exception):
    """A configuration embeds a simulator where none can be made."""

# section -> "module:Class", each built as ``Class(agent, conf)``: config's one table of sections
COMPONENTS: dict[str, str] = {
    section: owner.component for section, owner in SECTION_OWNERS.items() if owner.component
}


def component_factory(section: str) -> ComponentFactory:
    module_name, class_name = COMPONENTS[section].split(":")
    factory: ComponentFactory = getattr(importlib.import_module(module_name), class_name)
    return factory


def build_agent(
    config: Config,
    service_settings: ServiceSettings | None = None,
    *,
    systemd: bool = True,
    owner: JournalLock | None = None,
    clock: Clock = SYSTEM_CLOCK,
    machines: MachineFactory | None = None,
) -> Agent:
    """An Agent wired with the configured triggers and components (not started); ``machines``
    makes the simulated machines of its ``virtual`` triggers (the CLI gives it)."""
    settings = service_settings or service_settings_from_config(config)
    agent: Agent
    lifecycle = (
        # Fed while the agent itself works: a network outage or an offline reader is DOWN in
        # health but a restart would not cure it, so it must not starve the watchdog.
        SystemdLifecycle(
            is_healthy=lambda: agent.health.alive(),
            status_text=lambda: agent.health.summary(),
        )
        if systemd
        else None
    )
    agent = Agent(
        config, settings, systemd=lifecycle, owner=owner, clock=clock, machines=machines
    )
    for trigger in config.triggers:
        agent.add_platform(setup_function(trigger["platform"]), trigger)
    for section in COMPONENTS:
        if section in config.data:
            agent.add_component(component_factory(section), config[section])
    return agent


def load_agent(
    path: str | Path, service_settings: ServiceSettings | None = None, **kw: Any
) -> Agent:
    """Load, validate and wire a configuration file (raises ConfigInvalid with every mistake)."""
    return build_agent(load_config(path), service_settings, **kw)


@data_class(frozen=True, slots=True)
class ConfiguredService:
    """The service a configuration names: how to reach it, and the embedded simulator that
    plays it (None for a real service)."""

    settings: ServiceSettings
    simulator: EmbeddedSimulator | None = None


@contextlib.asynccontextmanager
async def configured_service(
    config: Config, simulator: SimulatorFactory | None = None
) -> AsyncIterator[ConfiguredService]:
    """The configuration's service: ``service: {simulator: ...}`` starts the embedded simulator
    (made by ``simulator``) for as long as the block runs (its state ends with it); otherwise
    the configured service's settings (:func:`service_settings_from_config`). The one place this
    choice is made."""
    simulator_conf = config["service"].get("simulator")
    if simulator_conf is None:
        yield ConfiguredService(service_settings_from_config(config))
        return
    if simulator is None:
        raise NoSimulator(
            f"{config.path}: service.simulator: this caller cannot start an embedded simulator"
        )
    sim = simulator(simulator_conf)
    await sim.start()
    try:
        yield ConfiguredService(service_settings_from_config(config, sim.ready_info()), sim)
    finally:
        await sim.stop()


@contextlib.asynccontextmanager
async def agent_for(
    config: Config,
    *,
    systemd: bool = True,
    simulator: SimulatorFactory | None = None,
    machines: MachineFactory | None = None,
    owner: JournalLock | None = None,
) -> AsyncIterator[tuple[Agent, ConfiguredService]]:
    """An agent for ``config``, wired and not started, with the service it uses.

    The journal is claimed first: while another agent owns it this raises
    :class:`~kiosk_agent.sales.owner.JournalOwned` before anything is read, started or written
    (not even the embedded simulator); ``owner``, when given, is that claim already taken.
    When the block ends the agent is stopped (a running sale finished or parked), the simulator
    stopped and the journal let go."""
    owner = owner or JournalLock(config.resolve(config["journal"]["path"]))
    owner.acquire()  # taking it again while held is a no-op
    try:
        async with configured_service(config, simulator) as service:
            agent = build_agent(
                config, service.settings, systemd=systemd, owner=owner, machines=machines
            )
            try:
                yield agent, service
            finally:
                if agent.started:
                    await agent.stop()
    finally:
        owner.release()
