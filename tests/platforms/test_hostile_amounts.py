"""The attack review's amounts, tried on the running agent: none moves money or stops a sale.

Each line here was once charged (``1e2`` as $100.00, ``1_0.00`` as $10.00, Arabic-Indic digits,
``99999999`` as $99,999,999.00) or froze the agent (``1e999990``). Now a wire amount has one
strict grammar (``kiosk_agent.money.parse_wire_amount``) and every trigger a ``max_price``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.config.load import check_config
from kiosk_agent.platforms.mdb import MdbPlatform
from kiosk_agent.sales.model import Flow, PriceAboveMaximum, SaleRequest
from kiosk_agent.sales.states import SaleState
from kiosk_agent.sim.machine import VirtualController, VisitOutcome

from ..assembly.agent_helpers import ScriptedDispenser
from ..helpers import until
from .agent_rig import running_agent

ATTACK_LINES = [
    "c,STATUS,VEND,1e2,A1",
    "c,STATUS,VEND,1_0.00,A1",
    "c,STATUS,VEND,\u0662.\u0665\u0660,A1",  # Arabic-Indic 2.50
    "c,STATUS,VEND,99999999,A1",
    "c,STATUS,VEND,1e999990,A1",
    "c,STATUS,VEND,+2.50,A1",
    "c,STATUS,VEND,2.50 ,A1",
    "c,STATUS,VEND,2.50,A1,A2",
    "c,STATUS,VEND,0x10,A1",
]


def _mdb(controller: VirtualController, **options: Any) -> dict[str, Any]:
    return {"platform": "mdb", "name": "front", "port": controller.port,
            "flow": "authorize_capture", "vend_timeout": 5, **options}


async def test_hostile_vend_lines_move_no_money(
    tmp_path: Path, sim_settings: Any, controller: VirtualController,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    async with running_agent(tmp_path, sim_settings, [_mdb(controller)]) as agent:
        [platform] = agent.platforms
        assert isinstance(platform, MdbPlatform)
        await asyncio.wait_for(controller.wait_enabled(), 5)
        for line in ATTACK_LINES:
            controller.send_raw(line.encode() + b"\n")
        # non-ASCII input is dropped by the link itself, the rest by the protocol
        refused = lambda: (  # noqa: E731
            platform.device.stats.unknown_lines + platform.device.link.stats.dropped
        )
        await until(lambda: refused() >= len(ATTACK_LINES))

        assert agent.journal.query() == []
        assert "bad amount" in caplog.text
        # the agent is not frozen and still sells at the right price
        visit = await controller.customer("A2")
        assert visit.outcome is VisitOutcome.VENDED
        assert visit.approved_cents == 250
        [sale] = agent.journal.query()
        await until(lambda: agent.journal.get(sale.sale_id).state.final)
        assert agent.journal.get(sale.sale_id).captured_cents == 250


async def test_a_price_above_max_price_is_denied_with_one_clear_line(
    tmp_path: Path, sim_settings: Any, controller: VirtualController,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    controller.options.products["Z9"] = 15_000  # $150.00, above the $100.00 default
    async with running_agent(tmp_path, sim_settings, [_mdb(controller)]) as agent:
        await asyncio.wait_for(controller.wait_enabled(), 5)
        visit = await controller.customer("Z9")

        assert visit.outcome is VisitOutcome.DENIED
        assert controller.received[-1] == "C,STOP"
        assert agent.journal.query() == []
        refusals = [r for r in caplog.records if "max_price" in r.getMessage()]
        assert len(refusals) == 1
        assert "$150.00 is above this machine's max_price $100.00" in refusals[0].getMessage()


async def test_max_price_is_per_machine(
    tmp_path: Path, sim_settings: Any, controller: VirtualController
) -> None:
    controller.options.products["Z9"] = 15_000
    trigger = _mdb(controller, max_price="200.00")
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        await asyncio.wait_for(controller.wait_enabled(), 5)
        visit = await controller.customer("Z9")

        assert visit.outcome is VisitOutcome.VENDED
        [sale] = agent.journal.query()
        await until(lambda: agent.journal.get(sale.sale_id).state is SaleState.COMPLETED)


async def test_serial_line_prices_take_the_same_grammar_and_max_price(
    tmp_path: Path, sim_settings: Any, controller: VirtualController
) -> None:
    trigger = {
        "platform": "serial_line", "name": "vmc", "port": controller.port,
        "init": ["C,0", "C,1"],
        # a loose expression on purpose: the amount grammar, not the regex, is the guard
        "vend_request": r"^c,STATUS,VEND,(?P<price>[^,]+),(?P<product>\w+)$",
        "dispense_ok": r"^c,VEND,SUCCESS", "dispense_failed": r"^c,ERR,(?P<reason>VEND.*)$",
        "approve": "C,VEND,{amount}", "deny": "C,STOP", "max_price": "5.00",
    }
    controller.options.products["Z9"] = 600  # $6.00: a valid amount above this max_price
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        [platform] = agent.platforms
        await asyncio.wait_for(controller.wait_enabled(), 5)
        device = platform.device
        for line in ATTACK_LINES:
            controller.send_raw(line.encode() + b"\n")
        await until(lambda: device.unmatched + device.link.stats.dropped >= len(ATTACK_LINES) - 1)
        assert agent.journal.query() == []

        visit = await controller.customer("Z9")
        assert visit.outcome is VisitOutcome.DENIED
        assert agent.journal.query() == []
        visit = await controller.customer("A2")
        assert visit.outcome is VisitOutcome.VENDED


async def test_the_virtual_platform_is_held_to_its_max_price_by_the_runner(
    tmp_path: Path, sim_settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``platform: virtual`` passes no bound of its own: the runner holds it to its config's
    ``max_price`` (an unnamed trigger: its source is named by the platform's default)."""
    caplog.set_level(logging.WARNING)
    trigger = {"platform": "virtual", "customers": False, "max_price": "2.00",
               "products": {"A1": "1.50"}, "max_funds": "2.00", "dispense_time": 0.01}
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        [platform] = agent.platforms
        controller = platform.controller  # type: ignore[attr-defined]
        controller.options.products["Z9"] = 325  # the machine sells more than it was told
        await asyncio.wait_for(controller.wait_enabled(), 5)

        visit = await controller.customer("Z9")
        assert visit.outcome is VisitOutcome.DENIED
        assert agent.journal.query() == []
        assert "$3.25 is above this machine's max_price $2.00" in caplog.text

        visit = await controller.customer("A1")  # within it: sold as ever
        assert visit.outcome is VisitOutcome.VENDED
        [sale] = agent.journal.query()
        await until(lambda: agent.journal.get(sale.sale_id).state is SaleState.COMPLETED)


async def test_a_request_naming_a_trigger_is_held_to_that_triggers_max_price(
    tmp_path: Path, sim_settings: Any, controller: VirtualController
) -> None:
    """Whatever the request carries itself: here none, from code that skips the platform."""
    triggers = [_mdb(controller, max_price="2.00")]
    async with running_agent(tmp_path, sim_settings, triggers) as agent:
        machine = ScriptedDispenser()
        above = SaleRequest(source="mdb:front", flow=Flow.CHARGE_CARD, amount_cents=250)
        with pytest.raises(PriceAboveMaximum, match=r"\$2.50 is above this machine's max_price"):
            await agent.sales.start(above, machine)
        assert agent.journal.query() == []
        # another source has no trigger of that name: only its own bound applies
        other = SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=250)
        sale = await agent.sales.start(other, machine)
        assert (await sale.result()).state is SaleState.COMPLETED


def test_a_virtual_product_above_max_price_is_a_configuration_mistake(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "service: {simulator: {}}\nterminals: [{device_id: SIM-0001}]\n"
        "triggers:\n"
        "  - platform: virtual\n"
        "    max_price: '2.00'\n"
        "    max_funds: '2.00'\n"
        "    products: {A1: '1.50', Z9: '3.25'}\n"
    )
    [mistake] = [str(error) for error in check_config(path)]
    assert "triggers[0].products.Z9" in mistake
    assert "$3.25 is above max_price $2.00" in mistake


async def test_a_free_selection_in_a_card_first_session_is_charged_nothing(
    tmp_path: Path, sim_settings: Any, controller: VirtualController
) -> None:
    """A controller selling an item at 0.00 inside a card-first session: nothing is charged.
    The $0.00 vend was approved and its "vended 0 cents" read as "the whole authorization":
    the customer paid max_funds for a free item."""
    controller.options.products["F0"] = 0
    trigger = _mdb(controller, mode="card_first", max_funds="5.00", session_timeout=5)
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        visit = await controller.card_first_customer("F0", wait=10)

        [sale, *_] = agent.journal.query()
        await until(lambda: agent.journal.get(sale.sale_id).state.final)
        final = agent.journal.get(sale.sale_id)
        assert final.captured_cents == 0
        assert final.state is SaleState.REVERSED
        assert "0.00" in final.message
        assert visit.outcome is VisitOutcome.DENIED
