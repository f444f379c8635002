"""Each platform hands its trigger's own ``vend_timeout`` to the sale (``SaleRequest``), and
none when it sets none: the sale keeps the one timer (SaleSettings.vend_timeout_for, tested in
tests/sales/test_flows.py). Driven at the trigger seam with a recording runner: no port, no
chip, no HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kiosk_agent.platforms import mdb_protocol as wire
from kiosk_agent.platforms.gpio import Button, GpioKiosk
from kiosk_agent.platforms.mdb import MdbCashless, MdbOptions, Mode
from kiosk_agent.platforms.serial import SerialSettings
from kiosk_agent.platforms.serial_line import PLATFORM_SCHEMA as LINE_SCHEMA
from kiosk_agent.platforms.serial_line import LineRules, SerialLineDevice
from kiosk_agent.sales.model import SaleRequest, TerminalBusy


class RecordingRunner:
    """``agent.sales`` that keeps each request and refuses it (the terminal is busy)."""

    def __init__(self) -> None:
        self.requests: list[SaleRequest] = []
        self.running: list[Any] = []

    async def start(self, request: SaleRequest, dispenser: Any) -> Any:
        self.requests.append(request)
        raise TerminalBusy("SIM-0001", "recording only")

    async def cancel(self, sale_id: str) -> None:
        return None

    async def pause_before_offer(self, source: str) -> None:
        await asyncio.Event().wait()  # one offer is all these tests look at

    async def next_request(self) -> SaleRequest:
        async with asyncio.timeout(2):
            while not self.requests:
                await asyncio.sleep(0)
        return self.requests[0]


@pytest.mark.parametrize("vend_timeout", [None, 7.5])
async def test_mdb_selection_first_hands_its_vend_timeout_to_the_sale(
    vend_timeout: float | None,
) -> None:
    sales = RecordingRunner()
    device = MdbCashless(sales, SerialSettings(port="/dev/null"),
                         MdbOptions(source="mdb:front", vend_timeout=vend_timeout))
    device.handle_line(wire.vend_request_line(150, "A1"))
    request = await sales.next_request()
    assert (request.vend_timeout, request.choice_timeout) == (vend_timeout, None)
    assert not request.chosen_at_machine
    await device.stop()


async def test_mdb_card_first_hands_its_time_to_choose_to_the_sale() -> None:
    sales = RecordingRunner()
    options = MdbOptions(source="mdb:lobby", mode=Mode.CARD_FIRST, max_funds_cents=500,
                         vend_timeout=20.0, session_timeout=45.0)
    device = MdbCashless(sales, SerialSettings(port="/dev/null"), options)
    device.handle_line(wire.status_line(wire.ControllerStatus.ENABLED))
    request = await sales.next_request()
    assert (request.amount_cents, request.vend_timeout, request.choice_timeout) == (500, 20.0, 45.0)
    assert request.chosen_at_machine
    await device.stop()


@pytest.mark.parametrize("extra", [{}, {"vend_timeout": 12}])
async def test_serial_line_hands_its_vend_timeout_to_the_sale(extra: dict[str, Any]) -> None:
    config = LINE_SCHEMA({"platform": "serial_line", "port": "/dev/null",
                          "vend_request": r"^REQ (?P<product>\w+) (?P<price>\d+\.\d\d)$",
                          "dispense_ok": "^DONE", "approve": "OPEN {product}", **extra})
    sales = RecordingRunner()
    device = SerialLineDevice(sales, SerialSettings(port="/dev/null"),
                              LineRules.from_config(config), source="serial_line:locker",
                              vend_timeout=config.get("vend_timeout"))
    device.handle_line("REQ A1 2.50")
    assert (await sales.next_request()).vend_timeout == extra.get("vend_timeout")
    await device.stop()


@pytest.mark.parametrize("vend_timeout", [None, 9.0])
async def test_gpio_hands_its_vend_timeout_to_the_sale(vend_timeout: float | None) -> None:
    sales = RecordingRunner()
    button = Button(line=17, product="espresso", price_cents=250, relay=22, pulse=0.1)
    kiosk = GpioKiosk(sales, chip=None, buttons=[button], source="gpio:coffee",  # type: ignore[arg-type]
                      vend_timeout=vend_timeout)
    await kiosk._sell(button)
    assert (await sales.next_request()).vend_timeout == vend_timeout


@pytest.mark.parametrize("extra", [{}, {"vend_timeout": 90}])
def test_kiosk_api_hands_its_vend_timeout_to_the_sale(extra: dict[str, Any]) -> None:
    from types import SimpleNamespace

    from kiosk_agent.platforms.kiosk_api import PLATFORM_SCHEMA as KIOSK_SCHEMA
    from kiosk_agent.platforms.kiosk_api import KioskApi

    config = KIOSK_SCHEMA({"platform": "kiosk_api", "token": "t" * 32,
                           "products": {"coffee": "2.50"}, **extra})
    api = KioskApi(SimpleNamespace(), config)
    request = api._sale_request({"product": "coffee"})
    assert (request.amount_cents, request.vend_timeout) == (250, extra.get("vend_timeout"))
