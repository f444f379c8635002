"""Recovery's hold on a terminal after a restart, as every face reads it (sales/runner.py
``recovery_hold``): finishing an open sale's money has no deadline to tell; the refusal of a
new sale there names the hold, and health's snapshot carries it beside the availability."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.model import Flow, RecoveryHolds, SaleRequest, TerminalBusy
from kiosk_agent.sales.states import SaleState

from .test_recovery import leave_open


async def test_a_terminal_recovery_finishes_a_sale_on_is_held_with_no_deadline(
    agent_factory: Any, tmp_path: Path
) -> None:
    clock = FakeClock(wall=time.time())  # the charge's answer window passes on it
    leave_open(tmp_path, state=SaleState.CHARGING, flow=Flow.CHARGE_CARD.value,
               answer_by=clock.time() + 1)
    agent = await agent_factory(clock=clock)
    hold = agent.sales.recovery_hold("SIM-0001")
    assert hold is not None
    assert hold.until is None
    assert hold.reason == ("recovering: finishing sale crashed1, left open by the last stop "
                           "or crash")
    shown = {a.device_id: a for a in agent.health.snapshot().availability}
    assert (shown["SIM-0001"].recovering, shown["SIM-0001"].recovering_until) == (
        hold.reason, None)
    assert shown["SIM-0007"].recovering == ""  # the other terminal is not held
    with pytest.raises(RecoveryHolds) as refused:
        await agent.sales.start(SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=150),
                               None)  # type: ignore[arg-type]
    assert (refused.value.reason, refused.value.until) == (hold.reason, None)
    assert isinstance(refused.value, TerminalBusy)  # every platform's refusal, as before
    await clock.run(agent.recovery.wait())
    assert agent.sales.recovery_hold("SIM-0001") is None
    assert all((a.recovering, a.recovering_until) == ("", None)
               for a in agent.health.snapshot().availability)
