"""NTP steps the wall clock, by hours or days, either way, at any moment of a sale.

The agent runs on a FakeClock (every wait of the sale code goes through it), against the real
simulator over HTTP. The properties, in a run and across a restart:

- a sale is never judged "no charge" before its answer window has passed in real time;
- no bound grows: a lost answer ends within its bound and the terminal is free after it;
- a charge the service committed inside the window is found and given back, never left.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.app import build_agent
from kiosk_agent.assembly.agent import Agent
from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.config.load import load_config
from kiosk_agent.moments import day_of, day_start
from kiosk_agent.sales.attention import LATE_CHARGE_HANDOVER_S
from kiosk_agent.sales.audit import HELD_SUFFIX
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.model import Flow, SaleEvent, SaleRequest
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import TransactionFilter, TransStatus
from kiosk_agent.sim.faults import faults_of
from tests.assembly.agent_helpers import (
    REQUEST_TIMEOUT,
    TIME_SCALE,
    ScriptedDispenser,
    write_config,
)
from tests.assembly.test_slow_service import arm_cleared
from tests.helpers import walk_to
from tests.sales.test_audit import _charge as charge_no_sale_holds
from tests.sales.test_recovery import authorize

HOUR = 3600.0
DAY = 24 * HOUR
# NTP's steps: days or hours, either way (tests/sales/test_clock.py covers any size)
STEPS = [3 * DAY, 2 * HOUR, -2 * HOUR, -3 * DAY]
# one forward and one backward step where each case runs a whole sale
FORWARD_AND_BACK = [3 * DAY, -2 * HOUR]
# far beyond any sale's pauses: a run never jumps to the attention sweeper's own pause
SWEEP_EVERY = 86_400

Factory = Callable[..., Awaitable[Agent]]


@pytest.fixture
async def sim(sim_factory: Any) -> Any:
    return await sim_factory(time_scale=TIME_SCALE, seed=1, transactions=0)


@pytest.fixture
async def agent_on(sim: Any, tmp_path: Path) -> AsyncIterator[Factory]:
    """Agents on a given clock, all on ``tmp_path``'s journal (a restart is a second one)."""
    agents: list[tuple[Agent, FakeClock]] = []

    async def make(clock: FakeClock) -> Agent:
        path = write_config(tmp_path)
        text = path.read_text().replace("sales: {", f"sales: {{attention_recheck: {SWEEP_EVERY}, ")
        path.write_text(text)
        config = load_config(path)
        settings = settings_from_ready(sim.ready_info(), timeout=REQUEST_TIMEOUT)
        agent = build_agent(config, settings, systemd=False, clock=clock)
        await agent.start()
        agents.append((agent, clock))
        return agent

    yield make
    for agent, clock in reversed(agents):
        if agent.started:  # a sale still running ends its pauses on the clock
            await clock.run(agent.stop(), real_timeout=10)


async def arm(sim: Any, **fault: Any) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{sim.base_url}/sim/faults", json=fault) as answer,
    ):
        assert answer.status == 200, await answer.text()


async def ledger(agent: Agent, order_id: str) -> list[Any]:
    query = TransactionFilter(order_id=order_id)
    return [t async for t in agent.service.reporting.transactions(query)]


async def until(condition: Callable[[], Awaitable[bool]], real_timeout: float = 10.0) -> None:
    async with asyncio.timeout(real_timeout):
        while not await condition():
            await asyncio.sleep(0.01)


def record_of(agent: Agent, sale_id: str) -> SaleRecord:
    record = agent.journal.get(sale_id)
    assert record is not None
    return record


def steps_of(agent: Agent, sale_id: str) -> list[str]:
    return [s.step for s in agent.journal.steps(sale_id)]


async def money_call_out(agent: Agent, clock: FakeClock, sale_id: str, state: SaleState) -> None:
    """Until the sale's money call is at the service (its bound is pending on the clock)."""

    async def out() -> bool:
        out = [d for d in clock.pending() if d < clock.monotonic() + 3600]
        return record_of(agent, sale_id).state is state and bool(out)

    await until(out)


async def at_the_service(sim: Any) -> None:
    """Until the armed fault holds the money call: the service has it and will commit it."""
    faults = faults_of(sim.ctx)
    assert faults is not None

    async def arrived() -> bool:
        return faults.armed[-1].hits >= 1

    await until(arrived)
    await asyncio.sleep(0.05)  # its body, sent with its headers, is read before the delay


def request_step(flow: Flow) -> str:
    return Step.CHARGE_CARD_REQUEST if flow is Flow.CHARGE_CARD else Step.AUTHORIZE_REQUEST


def charge_path(flow: Flow) -> str:
    return "/api/terminal/SIM-0001/charge-card" if flow is Flow.CHARGE_CARD else "/api/v1/charge"


def state_of_send(flow: Flow) -> SaleState:
    return SaleState.CHARGING if flow is Flow.CHARGE_CARD else SaleState.AUTHORIZING


# -- in a run ------------------------------------------------------------------------------------


@pytest.mark.parametrize("flow", [Flow.CHARGE_CARD, Flow.AUTHORIZE_CAPTURE])
@pytest.mark.parametrize("step", FORWARD_AND_BACK)
@pytest.mark.parametrize("when", ["before the send", "while the call is out", "while looking"])
async def test_a_late_commit_inside_the_window_is_found_and_given_back(
    agent_on: Factory, sim: Any, flow: Flow, step: float, when: str
) -> None:
    # The service commits the money call after the agent gave up on it, well inside the window.
    # It holds the call until the test commits it: a 'delay' of 0.3 s of real time ran out
    # first on a starved loop, the call was answered, and no give-up came to look at.
    clock = FakeClock()
    agent = await agent_on(clock)
    await arm(sim, path=charge_path(flow), fault="hold")
    if when == "before the send":
        clock.step_wall(step)
    machine = ScriptedDispenser()
    sale = await agent.sales.start(SaleRequest("test", flow, 300, terminal="SIM-0001"), machine)
    await money_call_out(agent, clock, sale.sale_id, state_of_send(flow))
    await at_the_service(sim)
    if when == "while the call is out":
        clock.step_wall(step)
    await clock.advance(agent.settings.request_timeout)  # the agent gives up: a lost answer
    await clock.next_due()  # it looked in reporting (nothing yet) and pauses
    assert record_of(agent, sale.sale_id).state is SaleState.UNRESOLVED
    if when == "while looking":
        clock.step_wall(step)

    async def committed() -> bool:
        return bool(await ledger(agent, sale.order_id))

    await arm_cleared(sim)  # the service commits it now, its answer going to nobody
    await until(committed)  # inside the window: no fake time passed since the give-up
    event = await clock.run(sale.result())
    assert event.state is SaleState.REVERSED, event.message
    assert machine.authorized == []  # nothing vended on an unconfirmed payment
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.VOIDED  # no charge left for a machine that vended nothing
    assert not any(s.endswith(".none") for s in steps_of(agent, sale.sale_id))


async def test_a_money_call_is_bounded_from_the_send_its_intent_journaled(
    agent_on: Factory, sim: Any
) -> None:
    # charge_card journals its first request with the sale, in start(); the call goes out when
    # the sale's task runs. Time that passes between counts against the call's bound, so the
    # deadline journaled with the intent (from sent_mono) is the one that holds.
    clock = FakeClock()
    agent = await agent_on(clock)
    await arm(sim, path=charge_path(Flow.CHARGE_CARD), fault="delay", delay_s=0.3)
    machine = ScriptedDispenser()
    sale = await agent.sales.start(SaleRequest("test", Flow.CHARGE_CARD, 300), machine)
    sent_mono = record_of(agent, sale.sale_id).sent_mono
    assert sent_mono is not None
    await clock.advance(2.0)  # before the sale's task first runs
    await money_call_out(agent, clock, sale.sale_id, SaleState.CHARGING)
    assert sent_mono + agent.settings.request_timeout in clock.pending()
    event = await clock.run(sale.result())
    assert event.state is SaleState.COMPLETED, event.message


@pytest.mark.parametrize("flow", [Flow.CHARGE_CARD, Flow.AUTHORIZE_CAPTURE])
@pytest.mark.parametrize("step", FORWARD_AND_BACK)
@pytest.mark.parametrize("at_pause", [0, 1, 3])
async def test_no_charge_is_judged_after_the_window_and_within_the_bound(
    agent_on: Factory, sim: Any, flow: Flow, step: float, at_pause: int
) -> None:
    clock = FakeClock()
    agent = await agent_on(clock)
    await arm(sim, path=charge_path(flow), fault="server_error")  # nothing was processed

    def step_the_wall(pause: int) -> None:
        if pause == at_pause:
            clock.step_wall(step)

    machine = ScriptedDispenser()
    sale = await agent.sales.start(SaleRequest("test", flow, 300, terminal="SIM-0001"), machine)
    event = await clock.run(sale.result(), on_pause=step_the_wall)
    ended = clock.monotonic()
    record = record_of(agent, sale.sale_id)
    assert event.state is SaleState.FAILED, event.message
    assert steps_of(agent, sale.sale_id)[-1].endswith(".none")
    assert record.sent_mono is not None
    elapsed = ended - record.sent_mono  # real time, as the fake clock counts it
    assert elapsed >= agent.settings.answer_window(flow)  # never judged early
    assert elapsed <= agent.settings.silence_bound(flow)  # and the bound did not grow
    assert agent.sales.busy_reason("SIM-0001") is None  # the reader takes the next customer
    assert machine.denied == ["payment could not be confirmed"]
    assert await ledger(agent, sale.order_id) == []


# -- across a restart ----------------------------------------------------------------------------


def left_sending(
    tmp_path: Path, clock: FakeClock, flow: Flow, window: float, **fields: Any
) -> SaleRecord:
    """The journal as an agent killed just after sending a money call leaves it."""
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    try:
        record = journal.create(
            SaleRecord(
                sale_id="crashed1",
                order_id="KACRASHED1",
                source="test",
                flow=flow.value,
                terminal="SIM-0001",
                amount_cents=300,
                state=SaleState.STARTED,
            )
        )
        sent = clock.time()
        return walk_to(
            journal,
            record,
            state_of_send(flow),
            request_step(flow),
            answer_by=sent + window,
            sent_at=sent,
            sent_mono=clock.monotonic(),
            sent_boot=clock.boot_id(),
            **fields,
        )
    finally:
        journal.close()


async def window_of(flow: Flow, agent_on: Factory, tmp_path: Path) -> float:
    probe = await agent_on(FakeClock())  # the settings of the agents in this test
    await asyncio.wait_for(probe.stop(), 10)
    (tmp_path / "journal.db").unlink()
    return probe.settings.answer_window(flow)


@pytest.mark.parametrize("flow", [Flow.CHARGE_CARD, Flow.AUTHORIZE_CAPTURE])
@pytest.mark.parametrize("step", FORWARD_AND_BACK)
@pytest.mark.parametrize("reboot", [False, True])
@pytest.mark.parametrize("down_for", [3.0])  # the sale's window is ~6 s in these tests
async def test_recovery_judges_no_charge_only_after_the_window_and_within_one_more(
    agent_on: Factory, tmp_path: Path, flow: Flow, step: float, reboot: bool, down_for: float
) -> None:
    window = await window_of(flow, agent_on, tmp_path)
    clock = FakeClock()
    record = left_sending(tmp_path, clock, flow, window)
    assert record.sent_mono is not None
    # the agent is down for ``down_for`` real seconds; the wall steps meanwhile
    if reboot:
        uptime = down_for / 2  # the reboot took half of it
        clock.reboot("fake-boot-2", wall=clock.time() + down_for + step, uptime=uptime)
    else:
        await clock.advance(down_for)
        clock.step_wall(step)
    restarted_at = clock.since_boot() if reboot else clock.monotonic()
    agent = await agent_on(clock)
    [event] = await clock.run(agent.recovery.wait())
    assert event.state is SaleState.FAILED, event.message
    assert steps_of(agent, "crashed1")[-1] == Step.RECOVERY_NONE
    waited = (clock.since_boot() if reboot else clock.monotonic()) - (restarted_at or 0.0)
    real_elapsed = down_for + waited
    assert real_elapsed >= window - 1e-6  # never judged before the window is over
    assert waited <= window + 1e-6  # at most one full window after the restart
    if not reboot:  # the same boot: the exact rest of the window
        assert waited == pytest.approx(window - down_for)
    assert agent.sales.busy_reason("SIM-0001") is None


@pytest.mark.parametrize("step", FORWARD_AND_BACK)
@pytest.mark.parametrize("reboot", [False, True])
async def test_a_charge_committed_while_the_agent_was_down_is_given_back(
    agent_on: Factory, tmp_path: Path, step: float, reboot: bool
) -> None:
    flow = Flow.AUTHORIZE_CAPTURE
    window = await window_of(flow, agent_on, tmp_path)
    clock = FakeClock()
    left_sending(tmp_path, clock, flow, window)
    if reboot:
        clock.reboot("fake-boot-2", wall=clock.time() + 1 + step, uptime=0.5)
    else:
        await clock.advance(1)
        clock.step_wall(step)
    agent = await agent_on(clock)
    await clock.next_due()  # recovery looked in reporting (no row yet) and pauses
    assert record_of(agent, "crashed1").state is SaleState.UNRESOLVED
    await authorize(agent.service, "KACRASHED1", capture=False)  # the late approval
    [event] = await clock.run(agent.recovery.wait())
    assert event.state is SaleState.REVERSED, event.message
    [row] = await ledger(agent, "KACRASHED1")
    assert row.status is TransStatus.VOIDED


@pytest.mark.parametrize(("step", "at_pause"), [(3 * DAY, 0), (-3 * DAY, 3)])
async def test_recovery_polls_a_pending_charge_card_on_the_monotonic_clock(
    agent_on: Factory, sim: Any, tmp_path: Path, step: float, at_pause: int
) -> None:
    flow = Flow.CHARGE_CARD
    window = await window_of(flow, agent_on, tmp_path)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        # nobody taps a card for ..05: the interaction stays pending until it expires
        handle = await service.terminal.charge_card("SIM-0001", 305, order_id="KACRASHED1")
    clock = FakeClock()
    left_sending(
        tmp_path, clock, flow, window,
        interaction_id=handle.interaction_id, interaction_kind="charge_card",
    )  # fmt: skip
    await clock.advance(1)
    agent = await agent_on(clock)

    def step_the_wall(pause: int) -> None:
        if pause == at_pause:
            clock.step_wall(step)

    [event] = await clock.run(agent.recovery.wait(), on_pause=step_the_wall)
    waited = clock.monotonic() - 1_001.0  # since the restart (the send was at 1000)
    assert event.state is SaleState.FAILED, event.message
    assert waited <= window  # within the window, whatever the wall did
    if steps_of(agent, "crashed1")[-1] == Step.RECOVERY_NONE:  # judged by reporting
        assert 1 + waited >= window - 1e-6
    assert await ledger(agent, "KACRASHED1") == []
    assert agent.sales.busy_reason("SIM-0001") is None


@pytest.mark.parametrize("step", [3 * DAY, -3 * DAY])
async def test_a_wall_step_during_the_card_wait_changes_nothing(
    agent_on: Factory, sim: Any, step: float
) -> None:
    clock = FakeClock()
    agent = await agent_on(clock)
    machine = ScriptedDispenser()
    sale = await agent.sales.start(
        SaleRequest("test", Flow.CHARGE_CARD, 305, terminal="SIM-0001"), machine  # no card
    )
    await money_call_out(agent, clock, sale.sale_id, SaleState.CHARGING)
    clock.step_wall(step)
    event = await clock.run(sale.result())
    assert event.state is SaleState.FAILED
    assert steps_of(agent, sale.sale_id)[-1] == Step.CHARGE_CARD_EXPIRED  # the terminal said so
    assert await ledger(agent, sale.order_id) == []


# -- the late-charge net -------------------------------------------------------------------------


async def no_charge_sale(agent: Agent, clock: FakeClock, sim: Any) -> SaleEvent:
    await agent.attention.stop()  # the test sweeps by itself
    await arm(sim, path="/api/v1/charge", fault="server_error")
    sale = await agent.sales.start(
        SaleRequest("test", Flow.AUTHORIZE_CAPTURE, 300, terminal="SIM-0001"), ScriptedDispenser()
    )
    event = await clock.run(sale.result())
    assert event.state is SaleState.FAILED
    return event


@pytest.mark.parametrize("step", [30 * DAY, *STEPS, -30 * DAY])
async def test_the_late_charge_net_covers_a_no_charge_sale_for_a_full_day_of_real_time(
    agent_on: Factory, sim: Any, step: float
) -> None:
    clock = FakeClock()
    agent = await agent_on(clock)
    event = await no_charge_sale(agent, clock, sim)
    clock.step_wall(step)
    await clock.advance(DAY - HOUR)  # a slow service commits it almost a day later
    await authorize(agent.service, event.order_id, capture=False)
    [given_back] = await agent.attention.sweep()
    assert given_back.state is SaleState.REVERSED
    assert agent.attention.stats.late_charges == 1
    [row] = await ledger(agent, event.order_id)
    assert row.status is TransStatus.VOIDED


@pytest.mark.parametrize("step", [-30 * DAY, 0.0, 30 * DAY])
async def test_the_net_lets_go_after_a_day_of_real_time_whatever_the_wall_says(
    agent_on: Factory, sim: Any, step: float
) -> None:
    clock = FakeClock()
    agent = await agent_on(clock)
    event = await no_charge_sale(agent, clock, sim)
    clock.step_wall(step)
    await clock.advance(DAY + HOUR)
    await authorize(agent.service, event.order_id, capture=False)
    assert await agent.attention.sweep() == []  # past the net's day: the charge check's (below)


@pytest.mark.parametrize("step", [30 * DAY, -30 * DAY])
async def test_after_a_reboot_the_net_still_covers_the_sales_of_the_last_boot(
    agent_on: Factory, sim: Any, tmp_path: Path, step: float
) -> None:
    clock = FakeClock()
    first = await agent_on(clock)
    event = await no_charge_sale(first, clock, sim)
    await asyncio.wait_for(first.stop(), 10)
    clock.reboot("fake-boot-2", wall=clock.time() + HOUR + step, uptime=60)
    agent = await agent_on(clock)
    await clock.advance(HOUR)
    await authorize(agent.service, event.order_id, capture=False)
    [given_back] = await agent.attention.sweep()
    assert given_back.state is SaleState.REVERSED


async def test_a_500_is_said_as_the_services_answer_not_as_an_answer_lost(
    agent_on: Factory, sim: Any
) -> None:
    """Before: an HTTP 500 to the authorization was called "the authorization's answer was
    lost"."""
    clock = FakeClock()
    agent = await agent_on(clock)
    event = await no_charge_sale(agent, clock, sim)
    assert event.message.startswith("the service answered 500 to the authorization"), (
        event.message
    )
    assert "answer was lost" not in event.message


async def test_a_late_charge_the_net_let_go_of_is_given_back_by_the_charge_check(
    agent_on: Factory, sim: Any
) -> None:
    # The net covers a sale that ended "no charge" for a day of real time; the charge check
    # leaves such a sale to it. A charge the net never saw (reporting down all day, the agent
    # stopped longer than a day on the same boot) was then left to nobody: every check took it
    # as accounted for, the customer charged for goods the machine was told not to give, and
    # no person told. Once the net has let go, the check gives it back under a sale of its
    # own, as any charge held under a sale that ended with no money moved; the sale stays
    # as it ended. (The wall clock is the service's: its charges are in the check's window.)
    clock = FakeClock(wall=time.time())
    agent = await agent_on(clock)
    await agent.journal_guard.first_check()
    await agent.journal_guard.stop()  # the test checks by itself
    event = await no_charge_sale(agent, clock, sim)
    charged = await charge_no_sale_holds(agent, event.order_id, 300, capture=False)
    audit = agent.journal_guard.audit

    await clock.advance(DAY - HOUR)
    inside = await audit.check(settled=False)
    assert inside.ok, inside.error
    assert inside.unaccounted == []  # the net's, while it watches
    await clock.advance(HOUR + LATE_CHARGE_HANDOVER_S + 1)
    assert await agent.attention.sweep() == []  # the net let go
    after = await audit.check(settled=False)

    assert after.unaccounted == [charged]
    held = agent.journal.by_order_id(event.order_id + HELD_SUFFIX)
    assert held is not None
    assert held.state is SaleState.REVERSED, held.message
    assert record_of(agent, event.sale_id).state is SaleState.FAILED
    [row] = await ledger(agent, event.order_id)
    assert row.status is TransStatus.VOIDED


# -- what people see of the day ------------------------------------------------------------------


async def test_sales_today_is_the_journals_day_on_the_agents_clock_whichever_way_it_steps(
    agent_on: Factory, sim: Any
) -> None:
    """"Sales today" (health: the page, `health`, the heartbeat, Home Assistant) read its day
    from time.time() while the sales' created_at, Journal.today and the page's "not sales
    today" read the agent's clock; a wall clock stepped back over midnight (NTP correcting one
    that ran ahead) zeroed the day's figures while the journal holds that day's sales, and one
    stepped forward again onto a day of sales zeroed them too. Each read is compared with the
    journal's own rows: the completed sales created on the clock's UTC day."""
    midnight = day_start(dt.date(2026, 3, 8))  # New York's clocks spring forward: UTC does not
    clock = FakeClock(wall=midnight - 600)
    agent = await agent_on(clock)

    def journals_day() -> tuple[int, int]:
        day = day_of(clock.time())
        done = [r for r in agent.journal.query(states=[SaleState.COMPLETED])
                if day_of(r.created_at) == day]
        return len(done), sum(r.captured_cents for r in done)

    def shown() -> tuple[int, int]:
        sales = agent.health.snapshot().sales
        assert sales.day_started_at == day_start(day_of(clock.time()))
        return sales.today_count, sales.today_amount_cents

    async def sell(cents: int) -> None:
        request = SaleRequest("test", Flow.CHARGE_CARD, cents, terminal="SIM-0001")
        sale = await agent.sales.start(request, ScriptedDispenser())
        event = await clock.run(sale.result())
        assert event.state is SaleState.COMPLETED, event.message

    await sell(300)
    assert shown() == journals_day() == (1, 300)
    clock.step_wall(1200)  # 00:10 the next day
    assert shown() == journals_day() == (0, 0)
    await sell(250)
    assert shown() == journals_day() == (1, 250)
    clock.step_wall(-1200)  # NTP steps it back: 23:50 the day before
    assert shown() == journals_day() == (1, 300)
    await sell(180)
    assert shown() == journals_day() == (2, 480)
    # the day changes with no read of it between: a sale's end is the first to see it
    clock.step_wall(1200)
    await sell(120)
    assert shown() == journals_day() == (2, 370)
    clock.step_wall(-1200)
    await sell(110)
    assert shown() == journals_day() == (3, 590)
    assert agent.journal.today(clock.time()) == journals_day()
