"""Each platform during the agent's drain (Agent.drain), with the real Agent on the simulator:
new customers are refused, the sale already dispensing is heard to its end, and one whose
result does not come by ``sales.stop_timeout`` (on the agent's FakeClock) is parked.

The signals that start a drain, in a real process, are tests/cli/test_agent_drain.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.platforms import mdb_protocol as wire
from kiosk_agent.platforms.gpio import PLATFORM_SCHEMA as GPIO_SCHEMA
from kiosk_agent.platforms.gpio import setup_with_chip
from kiosk_agent.platforms.kiosk_api import KioskApi
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock, FakeClock
from kiosk_agent.sales.journal import Journal
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.sim.machine import Status, VirtualController, VisitOutcome

from ..helpers import until
from .agent_rig import running_agent
from .test_gpio import FakeChip
from .test_serial_line import _following

TOKEN = "kiosk-app-token-0123456789"
KIOSK = {"platform": "kiosk_api", "name": "screen", "token": "!secret kiosk_token", "port": 0,
         "products": {"coffee": "2.50"}, "confirm_dispense": True, "vend_timeout": 60}


async def _call(api: KioskApi, method: str, path: str, body: Any = None) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as session, session.request(
        method, f"http://127.0.0.1:{api.port}/api/v1{path}", json=body,
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as response:
        return response.status, await response.json(), response.headers


KioskSale = tuple[Any, KioskApi, str]  # (the Agent, its kiosk API, the sale id)


@pytest.fixture
def kiosk_dispensing(
    tmp_path: Path, sim_settings: Any
) -> Callable[..., contextlib.AbstractAsyncContextManager[KioskSale]]:
    """``async with kiosk_dispensing(sales, clock=...) as (agent, api, sale)``: the real Agent
    behind a kiosk app (over HTTP), one coffee bought and at `dispensing`, the app's
    confirmation not sent yet."""

    @contextlib.asynccontextmanager
    async def start(sales: dict[str, Any], clock: Clock = SYSTEM_CLOCK) -> AsyncIterator[KioskSale]:
        async with running_agent(tmp_path, sim_settings, [KIOSK], sales=sales, clock=clock,
                                 secrets={"kiosk_token": TOKEN}) as agent:
            [api] = agent.platforms
            assert isinstance(api, KioskApi)
            status, body, _ = await _call(api, "POST", "/sales", {"product": "coffee"})
            assert status == 202, body
            sale = body["sale_id"]
            await until(lambda: agent.journal.get(sale).state is SaleState.DISPENSING, timeout=10)
            yield agent, api, sale

    return start


async def test_a_kiosk_app_confirming_during_the_drain_is_heard_while_new_sales_get_503(
    kiosk_dispensing: Any,
) -> None:
    sales = {"vend_timeout": 60, "stop_timeout": 20}
    async with kiosk_dispensing(sales) as (agent, api, sale):
        draining = asyncio.create_task(agent.drain())
        await until(lambda: agent.sales.stopping)
        health = agent.health.snapshot()
        assert re.fullmatch(r"stopping \(draining 1 sale, until \d\d:\d\d:\d\dZ\)",
                            health.stopping), health.stopping
        assert health.problems[0] == health.stopping
        status, body, headers = await _call(api, "POST", "/sales", {"product": "coffee"})
        assert (status, body["error"], body["field"]) == (503, "stopping", None), body
        assert 0 < body["until"] - time.time() <= 20
        assert 1 <= int(headers["Retry-After"]) <= 20
        status, body, _ = await _call(api, "GET", "/status")
        assert body["card_payment"]["available"] is False
        assert body["card_payment"]["reason"].startswith("the agent is stopping")
        assert body["refused_stopping"] == 1
        status, body, _ = await _call(api, "POST", f"/sales/{sale}/dispensed",
                                      {"status": "vended"})
        assert status == 202, body
        await asyncio.wait_for(draining, 10)  # the drain ends with its last sale
        record = agent.journal.get(sale)
        assert (record.state, record.captured_cents, record.reversed_cents) == (
            SaleState.COMPLETED, 250, 0)
        assert [r.sale_id for r in agent.journal.query()] == [sale]  # the 503 journaled nothing


async def test_a_kiosk_sale_unconfirmed_at_the_deadline_is_parked_not_given_back(
    tmp_path: Path, kiosk_dispensing: Any
) -> None:
    clock = FakeClock(wall=time.time())
    sales = {"vend_timeout": 600, "stop_timeout": 30}
    async with kiosk_dispensing(sales, clock=clock) as (agent, _api, sale):
        stopping = asyncio.create_task(agent.stop())
        await until(lambda: agent.sales.stopping)
        await clock.advance(29.0)
        await asyncio.sleep(0.05)
        assert not stopping.done()  # still heard at 29 s
        await clock.advance(1.5)
        await asyncio.wait_for(stopping, 10)
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    try:
        record = journal.get(sale)
        steps = [s.step for s in journal.steps(sale)]
    finally:
        journal.close()
    assert record is not None
    # parked where it stood: the next start decides (a dispense never confirmed: given back)
    assert record.state is SaleState.DISPENSING
    assert steps[-1] == Step.PARKED.value
    assert Step.DISPENSE_RESULT.value not in steps


async def test_a_gpio_product_seen_falling_during_the_drain_is_sold_and_presses_are_refused(
    tmp_path: Path, sim_settings: Any
) -> None:
    chip = FakeChip()
    config = GPIO_SCHEMA({
        "platform": "gpio", "name": "coffee", "flow": "authorize_capture",
        "sensor_timeout": 30, "available_output": 25,
        "buttons": [{"line": 17, "product": "espresso", "price": "2.50", "relay": 22,
                     "pulse": 0.02},
                    {"line": 18, "product": "latte", "price": "3.20", "relay": 23,
                     "pulse": 0.02, "sensor": 27}]})  # fmt: skip
    sales = {"vend_timeout": 60, "stop_timeout": 20}
    async with running_agent(tmp_path, sim_settings, [], sales=sales) as agent:
        platform = await setup_with_chip(agent, config, chip)
        try:
            chip.press(18)
            await until(lambda: (23, False) in chip.relay_log, timeout=10)  # pulsed: watching
            [latte] = [r.sale_id for r in agent.journal.query()]
            draining = asyncio.create_task(agent.drain())
            await until(lambda: chip.relays[25] is False)  # the lamp: no cards now
            chip.edge(27)  # the latte falls past the sensor after the drain began
            await asyncio.wait_for(draining, 10)
            chip.press(17)  # drained, not stopped yet: the kiosk takes no new customer
            await until(lambda: platform.status()["refused_presses"] == 1)
            record = agent.journal.get(latte)
            assert (record.state, record.captured_cents) == (SaleState.COMPLETED, 320)
            assert len(agent.journal.query()) == 1  # the press started no sale
        finally:
            await platform.stop()


async def test_a_serial_line_vend_ending_during_the_drain_is_sold_and_the_device_hears_out(
    tmp_path: Path, sim_settings: Any, controller: VirtualController
) -> None:
    # the vend outlasts the drain's start: the product drops on the machine's clock, moved by
    # the test once the drain has begun (1 s of the wall clock was not always enough at load)
    controller.clock = FakeClock()
    sales = {"vend_timeout": 60, "stop_timeout": 20}
    trigger = {**_following(controller), "vend_timeout": 30}
    async with running_agent(tmp_path, sim_settings, [trigger], sales=sales) as agent:
        await asyncio.wait_for(controller.wait_enabled(), 5)
        customer = asyncio.create_task(controller.customer("A2"))
        await until(lambda: "C,VEND,2.50" in controller.received, timeout=10)
        [sale] = [r.sale_id for r in agent.journal.query()]
        draining = asyncio.create_task(agent.drain())
        await until(lambda: agent.sales.stopping)
        heard = len(controller.received)
        await controller.clock.advance_to(await controller.clock.next_due(pauses_only=False))
        assert (await asyncio.wait_for(customer, 10)).outcome is VisitOutcome.VENDED
        await asyncio.wait_for(draining, 10)
        await until(lambda: "C,0" in controller.received[heard:])  # out: after the vend
        controller.send(wire.vend_request_line(150, "A1"))  # a controller that did not hear
        await until(lambda: any(line.startswith("C,STOP,out of service: the agent is stopping")
                                for line in controller.received[heard:]))
        record = agent.journal.get(sale)
        assert (record.state, record.captured_cents) == (SaleState.COMPLETED, 250)
        assert len(agent.journal.query()) == 1


async def test_an_mdb_reader_leaves_the_bus_at_once_when_no_session_is_open(
    tmp_path: Path, sim_settings: Any, controller: VirtualController
) -> None:
    trigger = {"platform": "mdb", "name": "front", "port": controller.port, "vend_timeout": 5}
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        [platform] = agent.platforms
        await asyncio.wait_for(controller.wait_enabled(), 5)
        await agent.drain()  # no sale running: over at once, the platforms not stopped yet
        await until(lambda: controller.status is Status.INACTIVE)  # C,0: cashless off the bus
        heard = len(controller.received)
        controller.send(wire.vend_request_line(150, "A1"))  # a controller that did not hear
        await until(lambda: "C,STOP" in controller.received[heard:])
        assert platform.status()["denied_out_of_service"] == 1
        assert agent.journal.query() == []
