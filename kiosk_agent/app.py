"""Assemble an Agent from a configuration: platforms from the registry, components for the
sections present (admin, webhooks, upstream), systemd notify. Everything but the simulator is
imported here; ``kiosk-agent run`` starts the simulator itself when the config asks for it.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from kiosk_agent.core.agent import Agent, ComponentFactory, service_settings_from_config
from kiosk_agent.core.config import Config, load_config
from kiosk_agent.core.registry import setup_function
from kiosk_agent.core.systemd import SystemdLifecycle
from kiosk_agent.service.settings import ServiceSettings

# section -> (module, class): each built as ``Factory(agent, conf)``.
COMPONENTS: dict[str, tuple[str, str]] = {
    "admin": ("kiosk_agent.admin.server", "AdminServer"),
    "webhooks": ("kiosk_agent.admin.webhooks", "WebhookReceiver"),
    "upstream": ("kiosk_agent.fleet.component", "Upstream"),
}


def component_factory(section: str) -> ComponentFactory:
    module_name, class_name = COMPONENTS[section]
    factory: ComponentFactory = getattr(importlib.import_module(module_name), class_name)
    return factory


def build_agent(
    config: Config,
    service_settings: ServiceSettings | None = None,
    *,
    systemd: bool = True,
) -> Agent:
    """An Agent wired with the configured triggers and components (not started)."""
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
    agent = Agent(config, settings, systemd=lifecycle)
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
