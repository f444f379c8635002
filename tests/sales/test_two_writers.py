"""Another writer on the journal while recovery runs: its decision stands, recovery goes on."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.journal import Journal
from kiosk_agent.sales.states import Flow, SaleState, Step
from tests.sales import test_wall_steps as wall
from tests.sales.test_wall_steps import Factory, left_sending, record_of, steps_of, until, window_of

# the real agent on a FakeClock, and its simulator
agent_on = wall.agent_on
sim = wall.sim


async def test_a_sale_another_writer_decided_during_recovery_is_left_as_it_is(
    agent_on: Factory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    flow = Flow.CHARGE_CARD
    window = await window_of(flow, agent_on, tmp_path)
    clock = FakeClock()
    left_sending(tmp_path, clock, flow, window)
    agent = await agent_on(clock)

    async def waiting() -> bool:  # recovery asks reporting until the charge's deadline
        return record_of(agent, "crashed1").state is SaleState.UNRESOLVED

    await until(waiting)
    # meanwhile someone else (another process on the file) decides the sale
    other = Journal(agent.journal.path)
    other.open()
    seen = other.get("crashed1")
    assert seen is not None
    other.record(seen, Step.RECOVERY_REVERSED, SaleState.REVERSED, message="given back by hand")
    other.close()

    caplog.set_level(logging.WARNING)
    assert await clock.run(agent.recovery.wait()) == []  # nothing of it ended by this agent
    assert agent.recovery.state == "done"
    assert record_of(agent, "crashed1").state is SaleState.REVERSED
    assert steps_of(agent, "crashed1")[-1] == Step.RECOVERY_REVERSED
    assert "crashed1: left as the journal has it: sale crashed1 is reversed now" in caplog.text
    assert agent.sales.busy_reason("SIM-0001") is None  # the terminal sells again
