"""Another writer on the journal while recovery runs: its decision stands, recovery goes on."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.journal import Journal
from kiosk_agent.sales.model import SaleEvent, SaleRequest
from kiosk_agent.sales.states import Flow, SaleState, Step
from tests.assembly.agent_helpers import ScriptedDispenser
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


class DecidedByHandMeanwhile(ScriptedDispenser):
    """A vend during which someone else (a tech's shell on the same file) settles the sale."""

    def __init__(self, journal_path: Path) -> None:
        super().__init__()
        self.journal_path = journal_path

    async def dispense(self, authorized_cents: int) -> Any:
        outcome = await super().dispense(authorized_cents)
        other = Journal(self.journal_path)
        other.open()
        [seen] = other.open_sales()
        other.record(seen, Step.COMPLETED, SaleState.COMPLETED, message="settled by hand")
        other.close()
        return outcome


async def test_a_live_sale_another_writer_decided_is_shown_as_the_journal_has_it(
    agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    """The flow's next write finds the sale moved: nothing more is done to it, and what is
    published (the page, the kiosk app, Home Assistant) is the journal's state, not a guess."""
    seen: list[SaleEvent] = []
    agent.events.listen(seen.append)
    sale = await agent.sales.start(
        SaleRequest(source="test:front", flow=Flow.CHARGE_CARD, amount_cents=250),
        DecidedByHandMeanwhile(agent.journal.path),
    )
    event = await asyncio.wait_for(sale.result(), 10)
    held = agent.journal.get(event.sale_id)
    assert held is not None
    assert (held.state, held.message) == (SaleState.COMPLETED, "settled by hand")
    assert (event.state, event.message) == (held.state, held.message)
    assert seen[-1].state is SaleState.COMPLETED
    assert [s.step for s in agent.journal.steps(event.sale_id)][-1] == Step.COMPLETED
    assert "left as the journal has it" in caplog.text
    assert agent.sales.busy_reason("SIM-0001") is None  # the terminal sells again


async def test_a_moved_sale_whose_journal_cannot_be_read_is_said_unwritten_not_an_error(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreadable(sale_id: str) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    class ThenUnreadable(DecidedByHandMeanwhile):
        async def dispense(self, authorized_cents: int) -> Any:
            outcome = await super().dispense(authorized_cents)
            monkeypatch.setattr(agent.journal, "get", unreadable)
            return outcome

    sale = await agent.sales.start(
        SaleRequest(source="test:front", flow=Flow.CHARGE_CARD, amount_cents=250),
        ThenUnreadable(agent.journal.path),
    )
    event = await asyncio.wait_for(sale.result(), 10)
    # no made-up state ("attention" was published, which no journal held): the kind that says
    # the sale's step is not in the journal, with the state this writer last journaled
    assert event.unwritten
    assert event.state is SaleState.DISPENSING
    assert "the journal cannot be read (disk I/O error)" in event.message
