"""serial_line: a device described by expressions and templates, here the virtual MDB controller.

The virtual controller speaks the MDB adapter's lines; configured with matching expressions the
generic serial_line platform sells through it over a real pty, no MDB code involved.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.core.availability import short_reason
from kiosk_agent.platforms import mdb_protocol as wire
from kiosk_agent.platforms.serial import SerialSettings
from kiosk_agent.platforms.serial_line import PLATFORM_SCHEMA, LineRules, SerialLineDevice
from kiosk_agent.platforms.virtual import Status, VirtualController, VisitOutcome
from kiosk_agent.sales.model import DispenseStatus
from kiosk_agent.sales.states import SaleState

from ..helpers import sim_call, until
from .agent_rig import running_agent
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


async def test_the_next_request_starts_once_the_terminal_is_free_not_after_the_capture(
    device: SerialLineDevice, controller: VirtualController
) -> None:
    desk(device).capture_time = 0.3  # the payments API is slow to capture
    first = await controller.customer("A2")
    second = await controller.customer("A1")  # at once, while the first captures

    assert (first.outcome, second.outcome) == (VisitOutcome.VENDED, VisitOutcome.VENDED)
    assert not desk(device).sales[0].final.done()  # still capturing
    finals = await asyncio.wait_for(desk(device).settled(), 3)
    assert [f.captured_cents for f in finals] == [250, 150]
    assert device.outcomes["vended"] == 2


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


# -- out of service, like mdb: the real agent and simulator ---------------------------------------

QUICK_HEALTH = {"health": {"ping_interval": 1, "hold_off": 0.2, "recheck_interval": 0.1}}
OUT = "C,STOP,out of service: terminal offline"


def _following(controller: VirtualController) -> dict[str, Any]:
    """MDB as lines that also leave the bus while out of service and say why when denying."""
    return {**MDB_AS_LINES, "port": controller.port, "vend_timeout": 5,
            "deny": "C,STOP,{reason}", "out_of_service": "C,0", "in_service": "C,1"}


async def test_a_vend_request_while_out_of_service_starts_no_sale_and_is_denied_with_why(
    tmp_path: Path, sim: Any, sim_settings: Any, controller: VirtualController
) -> None:
    async with running_agent(
        tmp_path, sim_settings, [_following(controller)], sections=QUICK_HEALTH
    ) as agent:
        [platform] = agent.platforms
        await asyncio.wait_for(controller.wait_enabled(), 5)
        assert (await controller.customer("A2")).outcome is VisitOutcome.VENDED
        sold = len(list(agent.journal))

        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/offline")
        # the out_of_service line takes the reader off the bus, as the mdb platform does
        await until(lambda: controller.status is Status.INACTIVE, timeout=3)
        assert platform.status()["available"] is False
        assert platform.status()["unavailable_reason"] == "terminal offline"
        # a controller that did not hear it keeps asking: every request is denied, with why
        for _ in range(20):
            controller.send(wire.vend_request_line(150, "A1"))
        await until(lambda: controller.received.count(OUT) == 20)
        assert platform.status()["denied_out_of_service"] == 20
        assert len(list(agent.journal)) == sold  # no sale started

        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/online")
        await asyncio.wait_for(controller.wait_enabled(), 3)  # in_service: C,1
        assert (await controller.customer("A1")).outcome is VisitOutcome.VENDED
        assert len(list(agent.journal)) == sold + 1


async def test_a_sale_in_progress_ends_before_the_device_hears_out_of_service(
    device: SerialLineDevice, controller: VirtualController
) -> None:
    device.rules.out_of_service = "C,0"
    # the vend outlasts the test's steps by far, and the agent waits for it longer still: on a
    # loaded machine a 0.5 s dispense against a 0.5 s vend timeout ended the sale either way
    controller.options.dispense_time = 1.0
    device.vend_timeout = 10.0
    customer = asyncio.create_task(controller.customer("A2"))
    await until(lambda: "C,VEND,2.50" in controller.received)
    device.set_available(False, "service unreachable: timed out")
    assert "C,0" not in controller.received[controller.received.index("C,VEND,2.50"):]
    assert (await asyncio.wait_for(customer, 5)).outcome is VisitOutcome.VENDED
    await until(lambda: controller.status is Status.INACTIVE)  # told once the sale ended


def test_the_reason_on_the_wire_is_short_and_printable() -> None:
    assert short_reason("terminal offline") == "out of service: terminal offline"
    assert short_reason("service unreachable: ClientConnectorError: [Errno 111] ...; "
                        "terminal offline") == "out of service: service unreachable"
    assert short_reason("") == "out of service"
    key = "API key expired or refused and cannot be refreshed: HTTP 401"
    assert short_reason(key) == f"out of service: {key.split(':')[0]}"


@given(st.text(max_size=300))
def test_any_reason_gives_a_bounded_printable_line(reason: str) -> None:
    line = short_reason(reason)
    assert line.startswith("out of service")
    assert len(line) <= len("out of service: ") + 52
    assert all(" " <= c <= "~" for c in line)
