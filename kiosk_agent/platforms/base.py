"""What every platform needs from the agent, and the helpers they share.

Platforms reach the agent only through ``agent.sales`` (start and cancel sales), ``agent.events``
and ``agent.health``; ``SaleStarter`` is that first contract, so a protocol layer can be driven by
the real ``SaleRunner`` or by anything else of the same shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from kiosk_agent.sales.model import Dispenser, SaleRequest
from kiosk_agent.sales.states import SaleState

_LOGGER = logging.getLogger(__name__)

class LiveSale(Protocol):
    """A sale not ended yet, as the journal holds it (``SaleRecord`` fits)."""

    @property
    def sale_id(self) -> str: ...

    @property
    def source(self) -> str: ...

    @property
    def state(self) -> SaleState: ...


class SaleStarter(Protocol):
    """``agent.sales``: start a sale for a trigger; cancel it while it waits for a card; the
    sales not ended yet."""

    async def start(self, request: SaleRequest, dispenser: Dispenser) -> Any: ...

    async def cancel(self, sale_id: str) -> Any: ...

    @property
    def running(self) -> Sequence[LiveSale]: ...


def open_sales(sales: SaleStarter, source: str) -> dict[str, str]:
    """The trigger's sales that have not ended, each id with its state as journaled.

    A sale goes on after the machine is done with its customer (capturing, giving the money
    back, finding out a lost answer): a status shows these beside the machine's own state, so
    that "no session" never reads as "nothing going on"."""
    return {sale.sale_id: sale.state.value for sale in sales.running if sale.source == source}


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


async def start_sale(sales: SaleStarter, request: SaleRequest, dispenser: Dispenser) -> Any:
    """Start a trigger's sale; None when refused at once (busy terminal, agent stopping).

    A refusal is logged and the machine hears no through ``dispenser.deny``.
    """
    try:
        return await sales.start(request, dispenser)
    except Exception as err:  # noqa: BLE001 - whatever the reason, the machine must hear no
        why = describe_start_failure(err)
        _LOGGER.warning("%s: sale not started: %s", request.source, why)
        await dispenser.deny(why)
        return None


async def request_cancel(sales: SaleStarter, sale_id: str, source: str) -> None:
    """Ask the runner to cancel a sale; one that ended meanwhile is only logged."""
    try:
        await sales.cancel(sale_id)
    except Exception as err:  # noqa: BLE001 - the sale may have ended meanwhile
        _LOGGER.warning("%s: could not cancel sale %s: %s", source, sale_id, err)


class Device(Protocol):
    """What a platform drives: a named device with its own stop and health status."""

    name: str

    async def stop(self) -> None: ...

    def status(self) -> dict[str, Any]: ...


DeviceT = TypeVar("DeviceT", bound=Device)


class DevicePlatform(Generic[DeviceT]):
    """The platform instance the agent keeps for one device (the ``PlatformInstance`` contract)."""

    def __init__(self, device: DeviceT) -> None:
        self.device = device
        self.name = device.name

    async def stop(self) -> None:
        await self.device.stop()

    def status(self) -> dict[str, Any]:
        return self.device.status()
