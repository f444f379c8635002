"""A sale facing a black hole (a service that accepts the connection and never answers) ends
clearly, with its money reconciled, within the bound the docs state (issue 12).

Each test arms the simulator's ``black_hole`` fault (``/sim/faults``) over real HTTP. A
black-holed request never reaches the simulator's handler: nothing is committed, so reporting
must end up showing no money held without a vend. The bounds are the ones
``SaleSettings.silence_bound`` computes (docs/architecture.md, "Timeouts"): 2T + M from the money
call's send, plus 1.1 L for a charge-card; T alone for a read-card start.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock, FakeClock
from kiosk_agent.sales.journal import SaleRecord
from kiosk_agent.sales.model import DispenseStatus, Flow, SaleRequest
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.models import TransStatus
from kiosk_agent.sim.faults import faults_of

from .agent_helpers import ScriptedDispenser
from .test_slow_service import arm, held_by_the_service, ledger

T = 2.0  # the service timeout in these tests
M = 0.5  # sales.answer_margin
SLACK = 1.5  # scheduling, journal writes and the lookups that answer at once
HELD = {TransStatus.AUTHORIZED, TransStatus.CAPTURED, TransStatus.SETTLED}
WHOLE_SERVICE = {"path": "/*", "method": "*", "fault": "black_hole", "share": 1}


async def clear_faults(sim: Any) -> None:
    async with aiohttp.ClientSession() as http, http.delete(f"{sim.base_url}/sim/faults") as r:
        assert r.status == 200, await r.text()


async def black_hole_agent(
    agent_factory: Any, sim_factory: Any, clock: Clock = SYSTEM_CLOCK
) -> tuple[Any, Agent]:
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await agent_factory(sim=sim, timeout=T, answer_margin=M, clock=clock)
    assert agent.settings.request_timeout == T
    assert agent.settings.answer_margin == M
    return sim, agent


async def sell(agent: Agent, flow: Flow, machine: ScriptedDispenser) -> tuple[Any, SaleRecord]:
    """One sale to its end; the end must come well before the test's own patience runs out."""
    sale = await agent.sales.start(SaleRequest(source="test", flow=flow, amount_cents=300), machine)
    await asyncio.wait_for(sale.result(), 30)
    record = agent.journal.get(sale.sale_id)
    assert record is not None
    assert record.state.final, record.state
    assert record.finished_at is not None
    return sale, record


def sent_at(agent: Agent, record: SaleRecord, step: str) -> float:
    [at] = [s.at for s in agent.journal.steps(record.sale_id) if s.step == step]
    return at


async def no_money_held_without_a_vend(agent: Agent, order_id: str) -> None:
    rows = await ledger(agent, order_id)
    assert [row for row in rows if row.status in HELD] == []


async def test_a_black_holed_authorization_fails_at_its_deadline_with_no_charge(
    agent_factory: Any, sim_factory: Any
) -> None:
    # on a FakeClock: the agent's T passes when the black hole holds the call, the rest of the
    # deadline in pauses between lookups (milliseconds of real time)
    clock = FakeClock(wall=time.time())
    sim, agent = await black_hole_agent(agent_factory, sim_factory, clock)
    await arm(sim, path="/api/v1/charge", fault="black_hole")
    machine = ScriptedDispenser()
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=300), machine
    )
    await held_by_the_service(sim)
    await clock.advance(T)  # the money call's bound: the black hole never answers
    await clock.run(sale.result())
    record = agent.journal.get(sale.sale_id)
    assert record is not None
    assert record.finished_at is not None
    sent = sent_at(agent, record, "authorize.request")
    assert record.state is SaleState.FAILED, record.message
    assert record.message is not None
    assert f"no answer within {T:g} s" in record.message
    assert "no charge was made" in record.message
    # "no charge" believed only after the deadline journaled with the call, and soon after it
    assert record.answer_by is not None
    assert abs(record.answer_by - (sent + T + M)) < 0.05
    assert record.answer_by <= record.finished_at < record.answer_by + SLACK
    assert agent.settings.silence_bound(Flow.AUTHORIZE_CAPTURE) == 2 * T + M
    assert record.finished_at - sent <= agent.settings.silence_bound(Flow.AUTHORIZE_CAPTURE)
    assert machine.authorized == []
    assert machine.denied == ["payment could not be confirmed"]
    await no_money_held_without_a_vend(agent, sale.order_id)
    assert await ledger(agent, sale.order_id) == []  # the black hole committed nothing


async def test_a_black_holed_charge_card_start_fails_after_the_interaction_could_end(
    agent_factory: Any, sim_factory: Any
) -> None:
    sim, agent = await black_hole_agent(agent_factory, sim_factory)
    await arm(sim, path="/api/terminal/SIM-0001/charge-card", fault="black_hole")
    machine = ScriptedDispenser()
    sale, record = await sell(agent, Flow.CHARGE_CARD, machine)
    sent = sent_at(agent, record, "charge_card.request")
    lifetime = agent.settings.interaction_lifetime
    assert record.state is SaleState.FAILED, record.message
    assert record.message is not None
    assert "the charge's answer was lost" in record.message
    assert "no charge was made" in record.message
    assert record.interaction_id is None  # the terminal never heard of it
    assert record.answer_by is not None
    assert abs(record.answer_by - (sent + T + M + 1.1 * lifetime)) < 0.05
    assert record.answer_by <= record.finished_at < record.answer_by + SLACK
    bound = agent.settings.silence_bound(Flow.CHARGE_CARD)
    assert bound == 2 * T + M + 1.1 * lifetime
    assert record.finished_at - sent <= bound
    assert machine.authorized == []
    assert machine.denied == ["payment could not be confirmed"]
    assert await ledger(agent, sale.order_id) == []


async def test_a_capture_lost_in_a_black_hole_is_found_open_and_captured_again(
    agent_factory: Any, sim_factory: Any
) -> None:
    sim, agent = await black_hole_agent(agent_factory, sim_factory)
    await arm(sim, path="/api/v1/capture", fault="black_hole")
    machine = ScriptedDispenser(DispenseStatus.VENDED, vended_cents=250)
    sale, record = await sell(agent, Flow.AUTHORIZE_CAPTURE, machine)
    sent = sent_at(agent, record, "capture.request")
    assert record.state is SaleState.COMPLETED, record.message
    assert record.captured_cents == 250
    # one silent capture (T), reporting shows the authorization still open, captured again
    assert record.finished_at - sent < T + SLACK
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.CAPTURED
    assert row.amount_cents == 250


async def test_a_capture_that_stays_in_a_black_hole_is_left_to_a_person_vended(
    agent_factory: Any, sim_factory: Any
) -> None:
    sim, agent = await black_hole_agent(agent_factory, sim_factory)
    await arm(sim, path="/api/v1/capture", fault="black_hole", count=2)
    machine = ScriptedDispenser(DispenseStatus.VENDED, vended_cents=250)
    sale, record = await sell(agent, Flow.AUTHORIZE_CAPTURE, machine)
    sent = sent_at(agent, record, "capture.request")
    assert record.state is SaleState.ATTENTION, record.message
    assert record.message is not None
    assert "the capture failed twice" in record.message
    assert record.vended_cents == 250  # what the attention sweeper will capture
    assert record.finished_at - sent < 2 * T + SLACK  # two silent captures, lookups at once
    assert machine.authorized == [300]  # the vend was confirmed: this money has its goods
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.AUTHORIZED
    # who acts next and when, as the sweeper will: before, "a person must capture"
    next_look = time.strftime("%H:%M:%SZ", time.gmtime(agent.attention.context.recheck.next_at))
    assert f"the agent retries the capture at {next_look} (up to 3 times), then a person" in (
        record.message
    )
    [ended] = await agent.attention.sweep()  # that look, now
    assert (ended.state, ended.captured_cents) == (SaleState.COMPLETED, 250)


async def test_a_whole_service_black_hole_ends_a_charge_card_for_a_person(
    agent_factory: Any, sim_factory: Any
) -> None:
    sim, agent = await black_hole_agent(agent_factory, sim_factory)
    await arm(sim, **WHOLE_SERVICE)
    machine = ScriptedDispenser()
    sale, record = await sell(agent, Flow.CHARGE_CARD, machine)
    sent = sent_at(agent, record, "charge_card.request")
    # reporting is silent too: nothing is guessed, a person (and the attention sweeper) decides
    assert record.state is SaleState.ATTENTION, record.message
    assert record.message is not None
    assert "reporting cannot say whether money was taken" in record.message
    assert record.answer_by is not None
    assert record.finished_at >= record.answer_by
    assert record.finished_at - sent <= agent.settings.silence_bound(Flow.CHARGE_CARD) + 0.2
    assert machine.authorized == []
    assert machine.denied == ["payment could not be confirmed"]
    await clear_faults(sim)
    assert await ledger(agent, sale.order_id) == []


async def test_a_whole_service_black_hole_fails_a_card_read_within_the_timeout(
    agent_factory: Any, sim_factory: Any
) -> None:
    sim, agent = await black_hole_agent(agent_factory, sim_factory)
    await arm(sim, **WHOLE_SERVICE)
    machine = ScriptedDispenser()
    started = time.time()
    sale, record = await sell(agent, Flow.AUTHORIZE_CAPTURE, machine)
    assert record.state is SaleState.FAILED, record.message
    assert record.message is not None
    assert record.message.startswith("card read: ")
    assert f"no answer within {T:g} s" in record.message
    assert record.finished_at - started < T + SLACK
    assert machine.denied == [record.message]
    await clear_faults(sim)
    assert await ledger(agent, sale.order_id) == []


async def test_no_charge_is_believed_from_a_lookup_sent_before_the_deadline(
    agent_factory: Any, sim_factory: Any
) -> None:
    # The authorization is committed after the agent gave up (T = 2 s) and inside its 3 s
    # deadline (T + M with M = 1). Reporting answers each lookup late: the lookup sent at 2 s
    # looked before the commit and answers "no row" after the deadline has passed. That answer
    # must not end the sale FAILED while the service holds the money: only a lookup sent after
    # the deadline may say none. On a FakeClock, the test holds each moment in place; the
    # service holds the authorization until the test commits it (a 'delay' of 0.3 s of real
    # time ran out first on a starved loop: answered, the sale never looked in reporting).
    clock = FakeClock(wall=time.time())
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await agent_factory(sim=sim, timeout=T, answer_margin=1.0, clock=clock)
    await arm(sim, path="/api/v1/charge", fault="hold")
    await arm(
        sim, path="/ords/sprint/api/3p/v1/*", method="GET", fault="slow_answer", delay_s=0.5,
        share=1,
    )  # fmt: skip
    faults = faults_of(sim.ctx)
    assert faults is not None
    charge, lookups = faults.armed[-2:]
    machine = ScriptedDispenser()
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=300), machine
    )
    async with asyncio.timeout(60):  # a hang's guard, as below
        while not charge.hits:  # the service holds the authorization
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    await clock.advance(T)  # the agent gives up at 2 s and looks in reporting
    async with asyncio.timeout(60):
        while not lookups.hits:  # reporting has looked (no row yet) and answers in 0.5 s
            await asyncio.sleep(0.01)
    async with aiohttp.ClientSession() as http, http.delete(
        f"{sim.base_url}/sim/faults/{charge.id}"
    ) as released:
        assert released.status == 200, await released.text()  # the service commits it now
    async with asyncio.timeout(60):
        while not sim.ctx.ledger.count():  # committed, at 2 s on the agent's clock
            await asyncio.sleep(0.01)
    await clock.advance(1.5)  # past the deadline while that first "no row" is on its way
    await clock.run(sale.result())
    record = agent.journal.get(sale.sale_id)
    assert record is not None
    assert record.state is SaleState.REVERSED, record.message
    assert machine.authorized == []
    await clear_faults(sim)
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.VOIDED
