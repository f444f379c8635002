"""What every platform needs from the agent, and the helpers they share.

Platforms reach the agent only through ``agent.sales`` (start and cancel sales), ``agent.events``
and ``agent.health``; ``SaleStarter`` is that first contract, so a protocol layer can be driven by
the real ``SaleRunner`` or by anything else of the same shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from kiosk_agent.core.sale import Dispenser, SaleRequest


class SaleStarter(Protocol):
    """``agent.sales``: start a sale for a trigger; cancel it while it waits for a card."""

    async def start(self, request: SaleRequest, dispenser: Dispenser) -> Any: ...

    async def cancel(self, sale_id: str) -> Any: ...


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
    return f"{type(err).__name__}: {err or type(err).__name__}"
