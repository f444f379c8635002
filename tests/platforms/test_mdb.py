"""The mdb platform against the virtual vending machine controller, over a real pty."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from kiosk_agent.core.sale import DispenseStatus, SaleState
from kiosk_agent.platforms.mdb import PLATFORM_SCHEMA, Mode
from kiosk_agent.platforms.virtual import VirtualController, VisitOutcome

from ..helpers import until
from .vending_rig import CardDesk, Machine, make_machine


async def test_selection_first_vend_is_approved_and_captured(machine: Machine) -> None:
    visit = await machine.controller.customer("A2")

    assert visit.outcome is VisitOutcome.VENDED
    assert visit.approved_cents == 250
    [final] = await machine.desk.settled()
    assert final.state is SaleState.COMPLETED
    assert final.captured_cents == 250
    assert final.product == "A2"
    assert "C,VEND,2.50" in machine.controller.received


async def test_declined_card_denies_the_vend(machine: Machine) -> None:
    visit = await machine.controller.customer("D2")  # 1.02: the card is declined

    assert visit.outcome is VisitOutcome.DENIED
    [final] = await machine.desk.settled()
    assert final.state is SaleState.DECLINED
    assert machine.controller.received[-1] == "C,STOP"


async def test_failed_dispense_gives_the_money_back(machine: Machine) -> None:
    visit = await machine.controller.customer("B1", fail=True)

    assert visit.outcome is VisitOutcome.FAILED
    [sale] = machine.desk.sales
    final = await sale.result()
    assert sale.outcome is not None
    assert sale.outcome.status is DispenseStatus.FAILED
    assert final.state is SaleState.REVERSED


async def test_customer_walking_away_cancels_the_sale(machine: Machine) -> None:
    machine.desk.card_time = 1.0  # nobody presents a card
    visit = await machine.controller.customer("A1", walk_away_after=0.1)

    assert visit.outcome is VisitOutcome.WALKED_AWAY
    [sale] = machine.desk.sales
    final = await asyncio.wait_for(sale.result(), 2)
    assert sale.cancelled
    assert final.state is SaleState.CANCELLED


async def test_no_vend_result_times_out_and_voids(machine: Machine) -> None:
    visit = await machine.controller.customer("A1", no_result=True)
    assert visit.outcome is VisitOutcome.NO_RESULT

    [sale] = machine.desk.sales
    final = await asyncio.wait_for(sale.result(), 3)
    assert sale.outcome is not None
    assert sale.outcome.status is DispenseStatus.TIMEOUT
    assert final.state is SaleState.REVERSED


async def test_controller_reset_while_card_is_read_cancels(machine: Machine) -> None:
    machine.desk.card_time = 1.0
    visit_task = asyncio.create_task(machine.controller.customer("A1"))
    await until(lambda: machine.desk.sales)
    machine.controller.reset()

    visit = await asyncio.wait_for(visit_task, 2)
    assert visit.outcome is VisitOutcome.ABORTED
    final = await asyncio.wait_for(machine.desk.sales[0].result(), 2)
    assert final.state is SaleState.CANCELLED

    machine.desk.card_time = 0.005  # the machine comes back and sells again
    again = await machine.controller.customer("A1")
    assert again.outcome is VisitOutcome.VENDED


async def test_controller_reset_while_vending_gives_the_money_back(
    machine: Machine,
) -> None:
    machine.controller.options.dispense_time = 0.3
    visit_task = asyncio.create_task(machine.controller.customer("A2"))
    await until(lambda: "C,VEND,2.50" in machine.controller.received)
    machine.controller.reset()

    visit = await asyncio.wait_for(visit_task, 2)
    assert visit.outcome is VisitOutcome.ABORTED
    [sale] = machine.desk.sales
    final = await asyncio.wait_for(sale.result(), 2)
    assert sale.outcome is not None
    assert sale.outcome.status is DispenseStatus.CANCELLED
    assert "inactive mid-session" in sale.outcome.detail
    assert final.state is SaleState.REVERSED


async def test_controller_disabled_mid_session_aborts(machine: Machine) -> None:
    machine.desk.card_time = 1.0
    visit_task = asyncio.create_task(machine.controller.customer("A1"))
    await until(lambda: machine.desk.sales)
    machine.controller.disable()

    visit = await asyncio.wait_for(visit_task, 2)
    assert visit.outcome is VisitOutcome.ABORTED
    final = await asyncio.wait_for(machine.desk.sales[0].result(), 2)
    assert final.state is SaleState.CANCELLED


async def test_repeated_enable_is_tolerated_even_mid_session(machine: Machine) -> None:
    machine.controller.repeat_enable(5)
    machine.desk.card_time = 0.2
    visit_task = asyncio.create_task(machine.controller.customer("A1"))
    await until(lambda: machine.desk.sales)

    visit = await asyncio.wait_for(visit_task, 2)
    assert visit.outcome is VisitOutcome.VENDED
    [final] = await machine.desk.settled()
    assert final.state is SaleState.COMPLETED


async def test_garbage_and_partial_lines_are_dropped_not_fatal(
    machine: Machine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    machine.controller.send_raw(b"\x00\xff\xfe binary noise\n")
    machine.controller.send_raw(b"c,STATUS,VE" + b"X" * 600)  # an overlong run, no line end
    machine.controller.send_raw(b"\nc,STATUS,BOGUS\nhello there\n")
    await until(lambda: machine.device.stats.unknown_lines >= 2)

    assert machine.device.link.stats.dropped >= 2
    assert machine.device.link.connected
    visit = await machine.controller.customer("A1")
    assert visit.outcome is VisitOutcome.VENDED
    assert "unknown status 'BOGUS'" in caplog.text


async def test_unplug_and_replug_under_another_name(machine: Machine) -> None:
    first_name = machine.controller.pty_name
    machine.controller.unplug()
    await until(lambda: not machine.device.link.connected)
    await asyncio.sleep(0.1)  # a few failed reconnects while the adapter is away
    machine.controller.plug()
    await machine.ready()

    assert machine.controller.pty_name != first_name
    assert machine.link_states[-1] == "connected"
    assert "disconnected" in machine.link_states
    visit = await machine.controller.customer("A1")
    assert visit.outcome is VisitOutcome.VENDED
    assert machine.device.link.stats.reconnects == 1


async def test_unplug_mid_vend_is_not_captured(machine: Machine) -> None:
    machine.controller.options.dispense_time = 0.2
    visit_task = asyncio.create_task(machine.controller.customer("A2"))
    await until(lambda: "C,VEND,2.50" in machine.controller.received)
    machine.controller.unplug()

    visit = await asyncio.wait_for(visit_task, 2)
    assert visit.outcome is VisitOutcome.ABORTED
    final = await asyncio.wait_for(machine.desk.sales[0].result(), 3)
    assert final.state is SaleState.REVERSED


async def test_card_first_captures_only_the_chosen_price(controller: VirtualController) -> None:
    machine = await make_machine(controller, mode=Mode.CARD_FIRST, session_timeout=2.0)
    try:
        visit = await controller.card_first_customer("A1")
        assert visit.funds_cents == 500
        assert visit.outcome is VisitOutcome.VENDED
        final = await asyncio.wait_for(machine.desk.sales[0].result(), 2)
        assert final.state is SaleState.COMPLETED
        assert final.captured_cents == 150
        assert machine.desk.sales[0].request.amount_cents == 500
        assert "C,START,5.00" in controller.received
    finally:
        await machine.device.stop()


async def test_card_first_walk_away_and_session_timeout(controller: VirtualController) -> None:
    machine = await make_machine(controller, mode=Mode.CARD_FIRST, session_timeout=0.2)
    try:
        visit = await controller.card_first_customer(None)
        assert visit.outcome is VisitOutcome.WALKED_AWAY
        first = await asyncio.wait_for(machine.desk.sales[0].result(), 2)
        assert first.state is SaleState.REVERSED
        # Next session: nobody chooses within session_timeout; the agent closes it.
        await until(lambda: len(machine.desk.sales) >= 2)
        second = await asyncio.wait_for(machine.desk.sales[1].result(), 2)
        assert second.state is SaleState.REVERSED
        assert "session timeout" in (machine.desk.sales[1].outcome.detail or "")  # type: ignore[union-attr]
    finally:
        await machine.device.stop()


async def test_card_first_retries_a_busy_terminal_ever_more_slowly(
    controller: VirtualController,
) -> None:
    desk = CardDesk()
    desk.held_elsewhere = True
    machine = await make_machine(controller, mode=Mode.CARD_FIRST, desk=desk)
    try:
        await asyncio.sleep(1.0)
        assert 2 <= machine.desk.refused <= 4  # after 0.2, 0.4, 0.8 s: not every 0.2 s
        assert "C,STOP" not in controller.received  # the machine was never offered anything
        machine.desk.held_elsewhere = False
        await until(lambda: machine.desk.sales, timeout=5)
        visit = await controller.card_first_customer("A2")
        assert visit.outcome is VisitOutcome.VENDED
    finally:
        await machine.device.stop()


async def test_vend_request_before_card_is_denied_in_card_first(
    controller: VirtualController,
) -> None:
    machine = await make_machine(controller, mode=Mode.CARD_FIRST)
    machine.desk.card_time = 5.0
    try:
        await until(lambda: machine.desk.sales)
        visit = await controller.customer("A1")
        assert visit.outcome is VisitOutcome.DENIED
    finally:
        await machine.device.stop()


async def test_stopping_while_the_card_is_read_cancels_the_sale(machine: Machine) -> None:
    machine.desk.card_time = 5.0
    visit_task = asyncio.create_task(machine.controller.customer("A1", walk_away_after=1.0))
    await until(lambda: machine.desk.sales)
    await asyncio.wait_for(machine.device.stop(), 1.0)

    final = await asyncio.wait_for(machine.desk.sales[0].result(), 1.0)
    assert final.state is SaleState.CANCELLED
    assert machine.device.link.state.value == "closed"
    visit_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await visit_task


async def test_quiet_controller_is_probed_not_dropped(controller: VirtualController) -> None:
    machine = await make_machine(controller, link={"silence_timeout": 0.05, "probe": "C,STATUS"})
    try:
        await asyncio.sleep(0.3)
        assert "C,STATUS" in controller.received
        assert machine.device.link.stats.reconnects == 0
        assert (await controller.customer("A1")).outcome is VisitOutcome.VENDED
    finally:
        await machine.device.stop()


def test_schema_names_the_wrong_field() -> None:
    config = PLATFORM_SCHEMA(
        {"platform": "mdb", "port": "/dev/ttyUSB0", "flow": "authorize_capture"}
    )
    assert config["address"] == 0x10
    assert config["mode"] == "selection_first"

    with pytest.raises(Exception, match="max_funds"):
        PLATFORM_SCHEMA({"platform": "mdb", "port": "/dev/x", "mode": "card_first",
                         "flow": "authorize_capture"})
    with pytest.raises(Exception, match="flow: authorize_capture"):
        PLATFORM_SCHEMA({"platform": "mdb", "port": "/dev/x", "mode": "card_first",
                         "max_funds": "5.00"})
    with pytest.raises(Exception, match="0x10 or 0x60"):
        PLATFORM_SCHEMA({"platform": "mdb", "port": "/dev/x", "address": "0x33"})


async def test_card_first_customer_leaves_when_no_session_comes(
    controller: VirtualController,
) -> None:
    visit = await controller.card_first_customer("A1", wait=0.05)  # no agent connected at all
    assert visit.outcome is VisitOutcome.WALKED_AWAY
    assert visit.funds_cents is None
