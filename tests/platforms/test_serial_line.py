"""serial_line: a device described by expressions and templates, here the virtual MDB controller.

The virtual controller speaks the MDB adapter's lines; configured with matching expressions the
generic serial_line platform sells through it over a real pty, no MDB code involved.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from kiosk_agent.core.sale import DispenseStatus, SaleState
from kiosk_agent.platforms.serial import SerialSettings
from kiosk_agent.platforms.serial_line import PLATFORM_SCHEMA, LineRules, SerialLineDevice
from kiosk_agent.platforms.virtual import VirtualController, VisitOutcome

from .vending_rig import CardDesk

MDB_AS_LINES = {
    "platform": "serial_line",
    "name": "vmc",
    "port": "/dev/null",
    "init": ["C,0", "C,1"],
    "vend_request": r"^c,STATUS,VEND,(?P<price>[\d.]+),(?P<product>\w+)$",
    "dispense_ok": r"^c,VEND,SUCCESS",
    "dispense_failed": r"^c,ERR,(?P<reason>VEND.*)$",
    "cancel": r"^c,STATUS,(INACTIVE|DISABLED)",
    "approve": "C,VEND,{amount}",
    "deny": "C,STOP",
    "vend_timeout": 0.5,
}


@pytest.fixture
async def device(controller: VirtualController) -> AsyncIterator[SerialLineDevice]:
    config = PLATFORM_SCHEMA(dict(MDB_AS_LINES))
    dev = SerialLineDevice(
        CardDesk(),
        SerialSettings(port=controller.port, reconnect_min=0.02, reconnect_max=0.2),
        LineRules.from_config(config),
        source="serial_line:vmc",
        vend_timeout=config["vend_timeout"],
    )
    await dev.start()
    await asyncio.wait_for(controller.wait_enabled(), 3)
    yield dev
    await dev.stop()


def desk(device: SerialLineDevice) -> CardDesk:
    assert isinstance(device.sales, CardDesk)
    return device.sales


async def test_vend_request_is_approved_with_the_template(
    device: SerialLineDevice, controller: VirtualController
) -> None:
    visit = await controller.customer("B1")

    assert visit.outcome is VisitOutcome.VENDED
    assert "C,VEND,3.25" in controller.received
    [final] = await desk(device).settled()
    assert final.state is SaleState.COMPLETED
    assert final.captured_cents == 325
    assert final.product == "B1"


async def test_decline_sends_the_deny_template(
    device: SerialLineDevice, controller: VirtualController
) -> None:
    visit = await controller.customer("D2")
    assert visit.outcome is VisitOutcome.DENIED
    [final] = await desk(device).settled()
    assert final.state is SaleState.DECLINED


async def test_dispense_failure_and_no_result(
    device: SerialLineDevice, controller: VirtualController
) -> None:
    failed = await controller.customer("A1", fail=True)
    silent = await controller.customer("A2", no_result=True)
    first, second = desk(device).sales
    assert failed.outcome is VisitOutcome.FAILED
    assert (await first.result()).state is SaleState.REVERSED
    assert first.outcome is not None
    assert first.outcome.detail == "dispense failed: VEND 3"
    assert silent.outcome is VisitOutcome.NO_RESULT
    assert (await asyncio.wait_for(second.result(), 2)).state is SaleState.REVERSED
    assert second.outcome is not None
    assert second.outcome.status is DispenseStatus.TIMEOUT


async def test_cancel_expression_cancels_the_waiting_sale(
    device: SerialLineDevice, controller: VirtualController
) -> None:
    desk(device).card_time = 1.0
    visit_task = asyncio.create_task(controller.customer("A1"))
    async with asyncio.timeout(2):
        while not desk(device).sales:
            await asyncio.sleep(0.005)
    controller.reset()
    assert (await visit_task).outcome is VisitOutcome.ABORTED
    final = await asyncio.wait_for(desk(device).sales[0].result(), 2)
    assert final.state is SaleState.CANCELLED


async def test_garbage_and_replug(device: SerialLineDevice, controller: VirtualController) -> None:
    unmatched = device.unmatched
    controller.send_raw(b"\xff\xfe\x00\nnothing we know\nc,STATUS,VEND,x.yz,A1\n")
    async with asyncio.timeout(2):
        while device.unmatched < unmatched + 2:
            await asyncio.sleep(0.005)
    controller.unplug()
    controller.plug()  # init lines are sent again on reconnect: C,0 / C,1 enables it
    await asyncio.wait_for(controller.wait_enabled(), 3)
    visit = await controller.customer("A1")
    assert visit.outcome is VisitOutcome.VENDED
    assert device.link.stats.reconnects == 1
    assert device.link.stats.dropped == 1


def test_schema_errors_name_the_problem() -> None:
    with pytest.raises(Exception, match=r"named group \(\?P<price>"):
        PLATFORM_SCHEMA({**MDB_AS_LINES, "vend_request": "^REQ (\\w+)$"})
    with pytest.raises(Exception, match="not a valid regular expression"):
        PLATFORM_SCHEMA({**MDB_AS_LINES, "dispense_ok": "(unclosed"})
    with pytest.raises(Exception, match=r"unknown template field \{card\}"):
        PLATFORM_SCHEMA({**MDB_AS_LINES, "approve": "VEND {card}"})


async def test_stopping_while_the_card_is_read_cancels_the_sale(
    device: SerialLineDevice, controller: VirtualController
) -> None:
    desk(device).card_time = 5.0
    visit_task = asyncio.create_task(controller.customer("A1", walk_away_after=1.0))
    async with asyncio.timeout(2):
        while not desk(device).sales:
            await asyncio.sleep(0.005)
    await asyncio.wait_for(device.stop(), 1.0)
    final = await asyncio.wait_for(desk(device).sales[0].result(), 1.0)
    assert final.state is SaleState.CANCELLED
    visit_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await visit_task
