"""The glue every platform shares: the dispenser, starting and cancelling a trigger's sale, the
instance."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kiosk_agent.platforms.base import (
    WAIT_GIVEN_UP,
    DevicePlatform,
    Dispenser,
    request_cancel,
    start_sale,
)
from kiosk_agent.sales.model import DispenseOutcome, DispenseStatus, Flow, SaleRequest
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


class Door(Dispenser):
    """The smallest platform: approves by opening, then waits for the machine's word."""

    def __init__(self, request: SaleRequest) -> None:
        super().__init__(request)
        self.ends: list[DispenseOutcome] = []

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        return await self.wait()

    async def deny(self, reason: str) -> None:
        self.end(DispenseStatus.CANCELLED, f"denied: {reason}")

    def ended_as(self, outcome: DispenseOutcome) -> None:
        self.ends.append(outcome)


def door(cents: int = 250) -> Door:
    return Door(SaleRequest("door:front", Flow.CHARGE_CARD, cents, product="A1"))


async def test_the_first_end_is_the_outcome_and_a_late_one_changes_nothing() -> None:
    machine = door()
    waiting = asyncio.create_task(machine.dispense(250))
    await asyncio.sleep(0)
    vended = machine.end(DispenseStatus.VENDED, "vend success")
    late = machine.end(DispenseStatus.CANCELLED, "controller reset")  # after the vend: no news
    assert await waiting == vended == late
    assert (vended.vended_cents, vended.product) == (250, "A1")
    assert machine.ends == [vended]  # the platform heard it once


@pytest.mark.parametrize("status", [DispenseStatus.FAILED, DispenseStatus.CANCELLED,
                                    DispenseStatus.TIMEOUT])
async def test_only_a_vend_takes_money(status: DispenseStatus) -> None:
    machine = door()
    assert machine.end(status, "no").vended_cents == 0


async def test_the_sale_giving_up_the_wait_ends_the_dispense_as_not_vended() -> None:
    """The platform keeps no timer: the sale's vend timeout cancels the wait, and the dispense
    ends then, so that a result coming after it is one with no vend pending."""
    machine = door()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(machine.dispense(250), 0.01)
    assert machine.ended
    assert machine.result.result().status is DispenseStatus.TIMEOUT
    assert machine.result.result().detail == WAIT_GIVEN_UP
    assert machine.end(DispenseStatus.VENDED, "too late").status is DispenseStatus.TIMEOUT


async def test_a_denial_before_the_dispense_is_its_outcome() -> None:
    machine = door()
    await machine.deny("declined")
    assert (await machine.dispense(250)).detail == "denied: declined"


def test_every_platform_dispenser_is_the_one_base() -> None:
    from kiosk_agent.platforms import gpio, kiosk_api, mdb, serial_line

    for kind in (gpio._Drop, kiosk_api.AppDispenser, mdb.MdbSession, serial_line.Vend):
        assert issubclass(kind, Dispenser), kind
        assert ("result" not in vars(kind) and "wait" not in vars(kind)) or kind is gpio._Drop
