"""Money stays right when the service answers late, loses answers or fails (issue 9's faults).

Each test arms the simulator's fault injection (``/sim/faults``) over real HTTP, or leaves the
journal as a crash at the worst moment would, and checks the money in the simulator's reporting.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.model import DispenseStatus, Flow, SaleRequest
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.models import TransactionFilter, TransStatus
from kiosk_agent.sim.faults import faults_of
from tests.sales.test_recovery import authorize, leave_open

from .agent_helpers import ScriptedDispenser


async def arm(sim: Any, **fault: Any) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sim.base_url}/sim/faults", json=fault) as answer,
    ):
        assert answer.status == 200, await answer.text()


async def arm_cleared(sim: Any) -> None:
    """Every fault deleted: a call a ``hold`` keeps is committed now."""
    async with (
        aiohttp.ClientSession() as http,
        http.delete(f"{sim.base_url}/sim/faults") as answer,
    ):
        assert answer.status == 200, await answer.text()


async def held_by_the_service(sim: Any) -> None:
    """Until the armed fault holds a call: the service has it (and commits it later)."""
    faults = faults_of(sim.ctx)
    assert faults is not None
    async with asyncio.timeout(60):  # a hang's guard: a card read and a call, starved, took 10 s
        while not faults.armed[-1].hits:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # its body, sent with its headers, is read before the delay


async def ledger(agent: Agent, order_id: str) -> list[Any]:
    query = TransactionFilter(order_id=order_id)
    return [t async for t in agent.service.reporting.transactions(query)]


async def test_an_authorization_answered_after_the_agent_gave_up_is_voided(
    agent_factory: Any, sim_factory: Any
) -> None:
    # The agent gives up after 2 s; the service commits the authorization after that, inside
    # 2 s + answer_margin (3 s). "No row yet" must not be taken for "no charge" until then.
    # On a FakeClock: the agent's 2 s pass when the test says, while the service holds the call
    # until the test commits it (``hold``): a 0.3 s ``delay`` of real time ran out first on a
    # starved loop (the test process stopped 390 ms of every 400): the sale was answered.
    clock = FakeClock(wall=time.time())
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await agent_factory(sim=sim, timeout=2.0, answer_margin=3.0, clock=clock)
    await arm(sim, path="/api/v1/charge", fault="hold")
    machine = ScriptedDispenser()
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=300), machine
    )
    await held_by_the_service(sim)
    await clock.advance(2.0)  # the agent gives up: the answer is lost
    await clock.next_due()  # reporting had no row yet: the sale waits for the deadline
    record = agent.journal.get(sale.sale_id)
    assert record is not None
    assert record.state is SaleState.UNRESOLVED
    await arm_cleared(sim)  # the service commits it now, its answer going to nobody
    async with asyncio.timeout(60):  # a hang's guard
        while not await ledger(agent, sale.order_id):  # the late commit, still inside 5 s
            await asyncio.sleep(0.01)
    event = await clock.run(sale.result())
    assert event.state is SaleState.REVERSED, event.message
    assert machine.authorized == []  # nothing was vended on an unconfirmed payment
    assert machine.denied
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.VOIDED
    steps = [s.step for s in agent.journal.steps(sale.sale_id)]
    assert "authorize.waiting" in steps
    assert "authorize.found" in steps


async def test_a_lost_authorization_is_believed_uncharged_only_after_its_deadline(
    agent_factory: Any, sim_factory: Any
) -> None:
    clock = FakeClock(wall=time.time())
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await agent_factory(sim=sim, clock=clock)
    await arm(sim, path="/api/v1/charge", fault="server_error")  # a 500, nothing processed
    machine = ScriptedDispenser()
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=300), machine
    )
    event = await clock.run(sale.result())
    record = agent.journal.get(sale.sale_id)
    assert record is not None
    assert record.answer_by is not None
    assert event.state is SaleState.FAILED
    assert record.finished_at is not None
    assert record.finished_at >= record.answer_by
    assert record.sent_mono is not None  # the wait is measured on the monotonic clock
    window = agent.settings.answer_window(Flow.AUTHORIZE_CAPTURE)
    assert window <= clock.monotonic() - record.sent_mono <= window + 1
    states = [s.state for s in agent.journal.steps(sale.sale_id)]
    assert SaleState.UNRESOLVED in states
    assert machine.denied == ["payment could not be confirmed"]  # once, before the lookups
    assert await ledger(agent, sale.order_id) == []


async def test_an_authorization_approved_after_the_restart_is_voided_by_recovery(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    # Killed just after sending the authorization; the service approves it after the restart.
    leave_open(tmp_path, state=SaleState.AUTHORIZING, answer_by=time.time() + 4)
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await agent_factory(sim=sim)
    while (record := agent.journal.get("crashed1")) is None or record.state not in (
        SaleState.UNRESOLVED,
        *[s for s in SaleState if s.final],
    ):
        await asyncio.sleep(0.02)
    assert record.state is SaleState.UNRESOLVED  # no row yet proves nothing
    await authorize(agent.service, "KACRASHED1", capture=False)  # the late approval
    [event] = await asyncio.wait_for(agent.recovery.wait(), 15)
    assert event.state is SaleState.REVERSED, event.message
    [row] = await ledger(agent, "KACRASHED1")
    assert row.status is TransStatus.VOIDED


async def test_restarts_never_push_a_charges_deadline_back(
    agent_factory: Any, tmp_path: Path
) -> None:
    # A crash loop shorter than the charge's window: each start recovers the sale again, and
    # each must wait only until the deadline journaled with the charge (a journal written before
    # the send was anchored: answer_by alone).
    clock = FakeClock(wall=time.time())
    answer_by = clock.time() + 3
    leave_open(
        tmp_path, state=SaleState.CHARGING, flow=Flow.CHARGE_CARD.value, answer_by=answer_by
    )
    for _ in range(4):
        agent = await agent_factory(clock=clock)
        await clock.advance(0.4)
        await agent.stop()
    agent = await agent_factory(clock=clock)
    [event] = await clock.run(agent.recovery.wait())
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.answer_by == answer_by
    assert event.state is SaleState.FAILED
    assert record.finished_at is not None
    assert answer_by <= record.finished_at < answer_by + 2.0
    assert agent.sales.busy_reason("SIM-0001") is None


async def test_a_capture_whose_retry_lost_its_answer_is_found_captured(
    agent_factory: Any, sim_factory: Any
) -> None:
    # The capture answers 500; its retry goes through but the answer is lost.
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await agent_factory(sim=sim)
    await arm(sim, path="/api/v1/capture", fault="server_error")
    await arm(sim, path="/api/v1/capture", fault="drop_answer")
    machine = ScriptedDispenser(DispenseStatus.VENDED, vended_cents=250)
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=300), machine
    )
    event = await asyncio.wait_for(sale.result(), 20)
    assert event.state is SaleState.COMPLETED, event.message
    assert event.captured_cents == 250
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.CAPTURED
    assert row.amount_cents == 250
