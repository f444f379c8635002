"""``max_price`` held by the sale runner, whatever the platform: triggers that share a source.

Two triggers of one platform left unnamed (a copied trigger) send their requests under the
same source (``virtual:vending``): the runner cannot tell them apart, so it holds that source
to the lower of their ``max_price``; the higher one would sell the cheaper machine above its own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.sales.model import Flow, PriceAboveMaximum, SaleRequest
from kiosk_agent.sales.runner import TriggerLimits
from kiosk_agent.sim.machine import VisitOutcome

from ..assembly.agent_helpers import ScriptedDispenser
from ..platforms.agent_rig import running_agent


def _virtual(max_price: str, **more: Any) -> dict[str, Any]:
    return {
        "platform": "virtual",
        "customers": False,
        "max_price": max_price,
        "products": {"A1": "1.50"},
        "max_funds": "2.00",
        "dispense_time": 0.01,
        **more,
    }


@pytest.mark.parametrize("order", ["low first", "low last"])
async def test_two_unnamed_triggers_of_one_platform_are_held_to_the_lower_max_price(
    tmp_path: Path, sim_settings: Any, order: str
) -> None:
    triggers = [_virtual("2.00"), _virtual("9.00", max_funds="9.00")]
    if order == "low last":
        triggers.reverse()
    async with running_agent(tmp_path, sim_settings, triggers) as agent:
        machines: list[Any] = agent.platforms
        low = next(p for p in machines if p.device.options.max_funds_cents == 200)
        controller = low.controller
        controller.options.products["Z9"] = 325  # the $2.00 machine asks for more
        await asyncio.wait_for(controller.wait_enabled(), 5)

        visit = await controller.customer("Z9")

        assert visit.outcome is VisitOutcome.DENIED
        assert agent.journal.query() == []  # nothing journaled, nothing charged
        above = SaleRequest(source=low.name, flow=Flow.CHARGE_CARD, amount_cents=201)
        with pytest.raises(PriceAboveMaximum, match=r"\$2.01 is above this machine's max_price"):
            await agent.sales.start(above, ScriptedDispenser())
        assert agent.journal.query() == []


def test_a_source_named_twice_keeps_the_lower_limit() -> None:
    limits = TriggerLimits()
    limits.add("mdb", "front", 500)
    limits.add("mdb", "front", 900)
    limits.add("mdb", None, 300)
    limits.add("mdb", None, 800)
    assert limits.of("mdb:front") == 500
    assert limits.of("mdb:mdb") == 300
    assert limits.of("gpio:gpio") is None
