"""The glue every platform shares: starting and cancelling a trigger's sale, the instance."""

from __future__ import annotations

from typing import Any

import pytest

from kiosk_agent.platforms.base import DevicePlatform, request_cancel, start_sale
from kiosk_agent.sales.model import DispenseOutcome, Flow, SaleRequest
from kiosk_agent.sales.runner import TerminalBusy


class RefusingRunner:
    """``agent.sales`` with its terminal taken: every start and cancel is refused."""

    async def start(self, request: SaleRequest, dispenser: Any) -> Any:
        raise TerminalBusy("SIM-0001", "sale 1 is charging")

    async def cancel(self, sale_id: str) -> Any:
        raise KeyError(sale_id)


class Machine:
    name = "mdb:front"

    def __init__(self) -> None:
        self.denied: list[str] = []
        self.stopped = False

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        raise AssertionError("a refused sale never dispenses")

    async def deny(self, reason: str) -> None:
        self.denied.append(reason)

    async def stop(self) -> None:
        self.stopped = True

    def status(self) -> dict[str, Any]:
        return {"link": "connected"}


async def test_a_refused_sale_is_logged_and_the_machine_hears_no(
    caplog: pytest.LogCaptureFixture,
) -> None:
    machine = Machine()
    request = SaleRequest(source="mdb:front", flow=Flow.CHARGE_CARD, amount_cents=150)
    assert await start_sale(RefusingRunner(), request, machine) is None
    assert machine.denied == ["TerminalBusy: terminal SIM-0001 is busy: sale 1 is charging"]
    assert "mdb:front: sale not started: TerminalBusy" in caplog.text


async def test_a_cancel_for_a_sale_that_ended_meanwhile_is_only_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    await request_cancel(RefusingRunner(), "gone", "serial_line:locker")
    assert "serial_line:locker: could not cancel sale gone" in caplog.text


async def test_the_platform_instance_speaks_for_its_device() -> None:
    machine = Machine()
    platform = DevicePlatform(machine)
    assert platform.name == "mdb:front"
    assert platform.status() == {"link": "connected"}
    await platform.stop()
    assert machine.stopped
