"""What every platform needs from the agent, and the one way a platform starts a sale.

Platforms depend on the agent only through these small protocols (``agent.sales``,
``agent.events``, ``agent.health``), so a protocol layer can be driven by the real ``Agent`` or by
anything else with the same shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from kiosk_agent.core.events import EventBus
from kiosk_agent.core.sale import Dispenser, SaleEvent, SaleRequest

_LOGGER = logging.getLogger(__name__)


class SaleHandle(Protocol):
    @property
    def sale_id(self) -> str: ...

    async def result(self) -> SaleEvent: ...


class SaleStarter(Protocol):
    """``agent.sales``: start a sale for a trigger; cancel it while it waits for a card."""

    async def start(self, request: SaleRequest, dispenser: Dispenser) -> Any: ...

    async def cancel(self, sale_id: str) -> Any: ...


class LinkReporter(Protocol):
    def report_link(self, name: str, state: str, detail: str = "") -> None: ...


class AgentLike(Protocol):
    @property
    def sales(self) -> Any: ...

    @property
    def events(self) -> EventBus[SaleEvent]: ...

    @property
    def health(self) -> Any: ...


def instance_name(config: dict[str, Any], default: str) -> str:
    """The trigger's name for logs, health and ``SaleRequest.source`` (``mdb:front``)."""
    return f"{config['platform']}:{config.get('name') or default}"


def link_reporter(agent: Any, name: str) -> Callable[[Any, str], None]:
    """A SerialLink state callback that tells the agent's health, if it has one."""
    health = getattr(agent, "health", None)

    def report(state: Any, detail: str) -> None:
        if health is not None:
            health.report_link(name, str(getattr(state, "value", state)), detail)

    return report


def describe_start_failure(err: BaseException) -> str:
    """Why a sale could not start (busy terminal, agent stopping), for logs and the machine."""
    text = str(err) or type(err).__name__
    return f"{type(err).__name__}: {text}"
