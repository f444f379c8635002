"""A sale frees its terminal once what remains needs only the payments API (issue 20).

The simulator is made slow on the capture alone (``/sim/faults``, a ``delay`` on
``/api/v1/capture``): the capture is held by the service while the test starts, stops or
cancels sales on the same terminal, over real HTTP, with the journal on disk.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.sales import journal as journal_module
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.model import Flow, SaleRequest
from kiosk_agent.sales.runner import TerminalBusy
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.sales.steps import UNCONFIRMED
from kiosk_agent.service.models import TransStatus
from tests.assembly.agent_helpers import ScriptedDispenser
from tests.assembly.test_slow_service import arm, arm_cleared, held_by_the_service, ledger
from tests.helpers import until

SLOW_CAPTURE = 0.5  # seconds the service holds each capture before it processes it
# every wait's hang guard, not a bound: the agent, its simulator and the test share one starved
# loop on a loaded machine (10 s ran out for the late authorization's row, the loop stopped
# 390 ms of every 400)
WAIT_S = 60.0


def vend(cents: int = 300, terminal: str | None = None) -> SaleRequest:
    return SaleRequest(
        source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=cents, terminal=terminal
    )


async def slow_capture_agent(agent_factory: Any, sim_factory: Any) -> tuple[Any, Agent]:
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await agent_factory(sim=sim)
    await arm(sim, path="/api/v1/capture", fault="delay", delay_s=SLOW_CAPTURE, count=5)
    return sim, agent


def state_of(agent: Agent, sale_id: str) -> SaleState:
    record = agent.journal.get(sale_id)
    assert record is not None
    return record.state


async def test_the_next_sale_reads_its_card_while_the_last_capture_is_in_flight(
    agent_factory: Any, sim_factory: Any
) -> None:
    sim, agent = await slow_capture_agent(agent_factory, sim_factory)
    first = await agent.sales.start(vend(), ScriptedDispenser())
    await held_by_the_service(sim)  # the first sale's capture is with the service
    assert state_of(agent, first.sale_id) is SaleState.CAPTURING
    assert agent.sales.busy_reason("SIM-0001") is None
    await asyncio.wait_for(first.terminal_released(), 1)

    machine = ScriptedDispenser()
    second = await agent.sales.start(vend(), machine)
    reason = agent.sales.busy_reason("SIM-0001")
    assert reason is not None
    assert second.sale_id in reason  # only the sale holding it
    await asyncio.wait_for(machine.started.wait(), WAIT_S)  # card read, authorized, vending

    assert not first.task.done()  # its capture is still in flight
    assert {r.sale_id for r in agent.sales.running} == {first.sale_id, second.sale_id}
    ended = await asyncio.wait_for(asyncio.gather(first.result(), second.result()), WAIT_S)
    assert [e.state for e in ended] == [SaleState.COMPLETED, SaleState.COMPLETED]
    for sale in (first, second):
        [row] = await ledger(agent, sale.order_id)
        assert row.status is TransStatus.CAPTURED


async def test_a_capturing_sale_cannot_be_cancelled_and_completes(
    agent_factory: Any, sim_factory: Any
) -> None:
    # The goods are out: there is nothing left for the customer's cancel button to stop.
    sim, agent = await slow_capture_agent(agent_factory, sim_factory)
    sale = await agent.sales.start(vend(), ScriptedDispenser())
    await held_by_the_service(sim)

    assert await agent.sales.cancel(sale.sale_id) is False
    final = await asyncio.wait_for(sale.result(), WAIT_S)
    assert final.state is SaleState.COMPLETED
    assert final.captured_cents == 300
    steps = [s.step for s in agent.journal.steps(sale.sale_id)]
    assert Step.CANCEL_REQUESTED.value not in steps


async def test_stop_parks_a_capturing_and_a_reading_sale_and_the_next_start_ends_both(
    agent_factory: Any, sim_factory: Any
) -> None:
    # The capture is held by the service until the agent hangs up (``black_hole``), not for
    # SLOW_CAPTURE: a starved loop took longer than 0.5 s to reach the stop, the capture was
    # answered first and the sale completed instead of being parked. Nothing is committed, so
    # the next start finds the hold and captures it.
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await agent_factory(sim=sim)
    await arm(sim, path="/api/v1/capture", fault="black_hole")
    capturing = await agent.sales.start(vend(), ScriptedDispenser())
    await held_by_the_service(sim)
    reading = await agent.sales.start(vend(305), ScriptedDispenser())  # ..05: no card comes
    await until(lambda: agent.journal.get(reading.sale_id).interaction_id is not None)  # type: ignore[union-attr]

    await agent.sales.stop(grace=0.05)  # SIGTERM: neither may be left running
    assert capturing.task.done()
    assert reading.task.done()
    assert agent.sales.running == []
    for sale, state in ((capturing, SaleState.CAPTURING), (reading, SaleState.READING_CARD)):
        assert state_of(agent, sale.sale_id) is state
        assert agent.journal.steps(sale.sale_id)[-1].step == Step.PARKED.value
    await agent.stop()

    again = await agent_factory(sim=sim)
    ended = await asyncio.wait_for(again.recovery.wait(), WAIT_S)
    states = {e.sale_id: e.state for e in ended}
    assert states == {capturing.sale_id: SaleState.COMPLETED, reading.sale_id: SaleState.FAILED}
    [row] = await ledger(again, capturing.order_id)
    assert row.status is TransStatus.CAPTURED
    assert await ledger(again, reading.order_id) == []


async def test_a_receipt_printed_on_the_terminal_keeps_it_held_until_printed(
    agent_factory: Any, sim_factory: Any
) -> None:
    # "printer" (SIM-0007) prints receipts and receipts.print is auto: printing is a terminal
    # call, so the terminal is not free while the sale captures.
    sim, agent = await slow_capture_agent(agent_factory, sim_factory)
    sale = await agent.sales.start(vend(terminal="printer"), ScriptedDispenser())
    await held_by_the_service(sim)
    assert state_of(agent, sale.sale_id) is SaleState.CAPTURING

    with pytest.raises(TerminalBusy, match="is capturing"):
        await agent.sales.start(vend(terminal="printer"), ScriptedDispenser())
    assert not sale.released.is_set()
    final = await asyncio.wait_for(sale.result(), WAIT_S)
    assert final.state is SaleState.COMPLETED
    notes = [s.detail.get("note") for s in agent.journal.steps(sale.sale_id) if s.step == "receipt"]
    assert notes == ["receipt printed"]
    assert agent.sales.busy_reason("SIM-0007") is None


async def test_an_enrollment_frees_the_terminal_once_the_card_is_read(
    agent_factory: Any, sim_factory: Any
) -> None:
    # Saving the card is the vault's call, not the terminal's: the next customer may start.
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await agent_factory(sim=sim)
    await arm(sim, path="/api/v1/vault_payment_accounts", fault="delay", delay_s=SLOW_CAPTURE)
    customer = {"name": "Pat", "phone": "5550100", "account_zip": "12345", "address1": "1 Main",
                "city": "Town", "region": "NY"}
    enroll = SaleRequest(source="test", flow=Flow.ENROLL, amount_cents=100,
                         email="c@example.com", metadata=customer)
    saving = await agent.sales.start(enroll, ScriptedDispenser())
    await held_by_the_service(sim)
    assert state_of(agent, saving.sale_id) is SaleState.ENROLLING

    paying = await agent.sales.start(vend(), ScriptedDispenser())
    ended = await asyncio.wait_for(asyncio.gather(saving.result(), paying.result()), WAIT_S)
    assert [e.state for e in ended] == [SaleState.COMPLETED, SaleState.COMPLETED]


async def test_a_terminal_refused_by_two_stays_refused_until_both_let_go(agent: Agent) -> None:
    # Recovery may end a terminal's sales while one of them waits for the journal: recovery
    # letting go must not lift the refusal the unwritten sale still needs.
    agent.sales.block("SIM-0001", "recovering sale s1", by="recovery")
    agent.sales.block("SIM-0001", "sale s2 is not journaled yet", by="unwritten")
    agent.sales.unblock("SIM-0001", by="recovery")

    assert agent.sales.busy_reason("SIM-0001") == "sale s2 is not journaled yet"
    with pytest.raises(TerminalBusy, match="not journaled yet"):
        await agent.sales.start(vend(), ScriptedDispenser())
    agent.sales.unblock("SIM-0001", by="unwritten")
    assert agent.sales.busy_reason("SIM-0001") is None


async def lost_answer_agent(
    agent_factory: Any, sim_factory: Any, path: str
) -> tuple[Any, Agent, FakeClock]:
    """An agent that gives up on a money call after 2 s of its fake clock, and a simulator that
    holds the next call to ``path`` and commits it after that: its answer is lost, and
    reporting shows the charge only later (the sale is UNRESOLVED meanwhile)."""
    clock = FakeClock(wall=time.time())
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await agent_factory(sim=sim, timeout=2.0, answer_margin=3.0, clock=clock)
    # held until the test lets it go (``arm_cleared``), not for SLOW_CAPTURE of real time: on a
    # starved loop 0.5 s passed before the agent's 2 s did, the call was answered and the sale
    # completed (or reporting found the row at its first look)
    await arm(sim, path=path, fault="hold")
    return sim, agent, clock



async def test_a_sale_whose_authorization_answer_was_lost_frees_the_terminal(
    agent_factory: Any, sim_factory: Any
) -> None:
    # The card was read; only the payments API is left to say what became of the hold. The
    # next customer is served on the same terminal while reporting is asked, and the first sale
    # still ends with its late authorization voided.
    sim, agent, clock = await lost_answer_agent(agent_factory, sim_factory, "/api/v1/charge")
    machine = ScriptedDispenser()
    first = await agent.sales.start(vend(), machine)
    await held_by_the_service(sim)
    await clock.advance(2.0)  # the agent gives up: the answer is lost
    await clock.next_due()  # no row yet: the sale looks again later
    assert state_of(agent, first.sale_id) is SaleState.UNRESOLVED
    await asyncio.wait_for(first.terminal_released(), 1)
    assert machine.denied == [UNCONFIRMED]  # told before the terminal was given up
    assert agent.sales.busy_reason("SIM-0001") is None

    next_machine = ScriptedDispenser()
    second = await agent.sales.start(vend(250), next_machine)
    served = await asyncio.wait_for(second.result(), WAIT_S)
    assert served.state is SaleState.COMPLETED, served.message
    assert next_machine.authorized == [250]
    assert state_of(agent, first.sale_id) is SaleState.UNRESOLVED  # still being found out

    await arm_cleared(sim)  # the service commits the held call, its answer going to nobody
    async with asyncio.timeout(WAIT_S):
        while not await ledger(agent, first.order_id):  # the late authorization
            await asyncio.sleep(0.01)
    ended = await clock.run(first.result())
    assert ended.state is SaleState.REVERSED, ended.message
    assert machine.authorized == []  # nothing vended on an unconfirmed payment
    [held] = await ledger(agent, first.order_id)
    assert held.status is TransStatus.VOIDED
    [paid] = await ledger(agent, second.order_id)
    assert paid.status is TransStatus.CAPTURED
    assert paid.amount_cents == 250
    steps = [s.step for s in agent.journal.steps(first.sale_id)]
    assert steps.index("authorize.waiting") < steps.index("authorize.found")


async def test_a_sale_whose_charge_card_answer_was_lost_keeps_the_terminal_until_found(
    agent_factory: Any, sim_factory: Any
) -> None:
    # The charge-card may have started: the terminal may still be taking the card, so it stays
    # held while reporting has no charge. Once the charge is found the interaction is over: the
    # terminal is free while the money goes back.
    sim, agent, clock = await lost_answer_agent(
        agent_factory, sim_factory, "/api/terminal/SIM-0001/charge-card"
    )
    machine = ScriptedDispenser()
    request = SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=300)
    first = await agent.sales.start(request, machine)
    await held_by_the_service(sim)
    await clock.advance(2.0)
    await clock.next_due()
    assert state_of(agent, first.sale_id) is SaleState.UNRESOLVED
    assert not first.released.is_set()
    with pytest.raises(TerminalBusy, match=first.sale_id):
        await agent.sales.start(vend(), ScriptedDispenser())

    await arm_cleared(sim)  # the service commits the held call, its answer going to nobody
    async with asyncio.timeout(WAIT_S):
        while not await ledger(agent, first.order_id):  # the terminal charged the card
            await asyncio.sleep(0.01)
    await arm(sim, path="/api/v1/void-or-refund", fault="delay", delay_s=SLOW_CAPTURE)
    reversing = asyncio.create_task(clock.run(first.result()))
    await held_by_the_service(sim)  # the money is on its way back
    assert first.released.is_set()
    assert state_of(agent, first.sale_id) is SaleState.REVERSING
    second = await agent.sales.start(vend(250), ScriptedDispenser())
    served, ended = await asyncio.wait_for(asyncio.gather(second.result(), reversing), WAIT_S)
    assert served.state is SaleState.COMPLETED, served.message
    assert ended.state is SaleState.REVERSED, ended.message
    [charged] = await ledger(agent, first.order_id)
    assert charged.status is TransStatus.VOIDED


# -- a released sale's capture waits for the next customer's answer (issue 33, i36-defer) ----


def captures_sent_at(agent: Agent, clock: FakeClock) -> list[float]:
    """When (the sale clock) each capture is sent from now on."""
    sent: list[float] = []
    capture = agent.service.payments.capture

    async def timed(*args: Any, **kwargs: Any) -> Any:
        sent.append(clock.monotonic())
        return await capture(*args, **kwargs)

    agent.service.payments.capture = timed  # type: ignore[method-assign]
    return sent


async def capture_waits_behind_a_waiting_customer(
    agent_factory: Any, sim_factory: Any
) -> tuple[FakeClock, Agent, Any, Any, list[float]]:
    """Back to back: the first customer's vend confirmed, the terminal released, the next
    customer's sale starts (a card that never comes, ..05: a customer who keeps waiting for
    the machine's answer). The first sale's confirmed vend is on disk; its capture waits."""
    clock = FakeClock(wall=time.time())
    sim = await sim_factory(time_scale=30, transactions=0)  # the read lives 6 s, not 0.6
    agent = await agent_factory(sim=sim, clock=clock)
    sent = captures_sent_at(agent, clock)
    first = await agent.sales.start(vend(), ScriptedDispenser(vended_cents=300))
    await asyncio.wait_for(first.terminal_released(), WAIT_S)
    second = await agent.sales.start(vend(305), ScriptedDispenser())
    await until(lambda: state_of(agent, first.sale_id) is SaleState.CAPTURING)
    # the capture's wait is armed on the sale clock: a second from the request on disk
    await until(lambda: clock.monotonic() + 1.0 in clock.pending())
    return clock, agent, first, second, sent


async def test_a_released_sales_capture_and_its_completion_wait_a_second_each_at_most(
    agent_factory: Any, sim_factory: Any
) -> None:
    # A customer waiting for the machine's answer comes before back-office work, for a second
    # at most: a stream of customers never starves a capture.
    clock, agent, first, second, sent = await capture_waits_behind_a_waiting_customer(
        agent_factory, sim_factory)
    said = ends_said(agent, first.sale_id)
    began = clock.monotonic()
    await clock.advance(0.99)
    for _ in range(20):  # turns of the loop: nothing else would send it
        await asyncio.sleep(0)
    assert sent == []
    assert state_of(agent, first.sale_id) is SaleState.CAPTURING
    await clock.advance(0.01)
    await until(lambda: sent != [])
    assert sent == [pytest.approx(began + 1.0)]
    # answered while the customer still waits: its completion is committed (no fsync of its
    # own) and its announcement waits, a second at most; the service holds the capture
    await until(lambda: clock.monotonic() + 1.0 in clock.pending())
    assert state_of(agent, first.sale_id) is SaleState.COMPLETED
    assert said == []
    assert not first.task.done()
    [row] = await ledger(agent, first.order_id)
    assert row.status is TransStatus.CAPTURED
    await clock.advance(1.0)
    final = await asyncio.wait_for(first.result(), WAIT_S)
    assert final.state is SaleState.COMPLETED
    assert said == [SaleState.COMPLETED]
    assert not second.task.done()  # the customer still waits: ended at the bound, not after
    await agent.sales.cancel(second.sale_id)
    assert (await asyncio.wait_for(second.result(), WAIT_S)).state is SaleState.CANCELLED
    [row] = await ledger(agent, first.order_id)
    assert row.status is TransStatus.CAPTURED


def ends_said(agent: Agent, sale_id: str) -> list[SaleState]:
    """The final states published for ``sale_id`` from now on."""
    said: list[SaleState] = []
    agent.events.listen(
        lambda e: said.append(e.state) if e.sale_id == sale_id and e.state.final else None
    )
    return said


async def test_a_completion_answered_while_a_customer_waits_shares_that_customers_fsync(
    agent_factory: Any, sim_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Back to back: the previous customer's completion is committed without an fsync of its
    # own; the waiting customer's next commit (fsynced) makes it durable, and it is announced
    # once that customer is answered: no fsync of the journal's own, none of its commit.
    clock, agent, first, second, sent = await capture_waits_behind_a_waiting_customer(
        agent_factory, sim_factory)
    said = ends_said(agent, first.sale_id)
    fdatasyncs: list[str] = []
    monkeypatch.setattr(journal_module, "_fdatasync", fdatasyncs.append)
    await clock.advance(1.0)  # the capture goes at its bound
    await until(lambda: state_of(agent, first.sale_id) is SaleState.COMPLETED)
    assert agent.journal._fsync_owed  # committed, not fsynced
    assert said == []
    assert await agent.sales.cancel(second.sale_id)  # an fsynced commit, then answered
    final = await asyncio.wait_for(first.result(), WAIT_S)
    assert final.state is SaleState.COMPLETED
    assert said == [SaleState.COMPLETED]
    assert (await asyncio.wait_for(second.result(), WAIT_S)).state is SaleState.CANCELLED
    assert fdatasyncs == []
    assert len(sent) == 1


async def test_a_waiting_capture_is_sent_as_soon_as_the_waiting_customer_is_answered(
    agent_factory: Any, sim_factory: Any
) -> None:
    clock, agent, first, second, sent = await capture_waits_behind_a_waiting_customer(
        agent_factory, sim_factory)
    began = clock.monotonic()
    assert await agent.sales.cancel(second.sale_id)  # the machine is told no: answered
    final = await asyncio.wait_for(first.result(), WAIT_S)
    assert final.state is SaleState.COMPLETED
    assert sent == [began]  # the sale clock never moved: not the bound
    assert (await asyncio.wait_for(second.result(), WAIT_S)).state is SaleState.CANCELLED


async def test_a_stop_sends_the_waiting_captures_at_once_and_once(
    agent_factory: Any, sim_factory: Any
) -> None:
    # SIGTERM: the drain hears every sale to its end; a waiting capture is sent then, not
    # left to the bound, not dropped, not sent twice.
    clock, agent, first, second, sent = await capture_waits_behind_a_waiting_customer(
        agent_factory, sim_factory)
    began = clock.monotonic()
    agent.sales.close()
    final = await asyncio.wait_for(first.result(), WAIT_S)
    assert final.state is SaleState.COMPLETED
    assert sent == [began]
    agent.sales.cancel_unpaid()
    await asyncio.wait_for(second.result(), WAIT_S)
    [row] = await ledger(agent, first.order_id)
    assert row.status is TransStatus.CAPTURED
    assert len(sent) == 1


async def test_a_stop_announces_a_completion_waiting_for_a_customer_at_once_and_durable(
    agent_factory: Any, sim_factory: Any
) -> None:
    # SIGTERM while the completion (committed, no fsync of its own) waits for the customer:
    # it is fsynced and announced then, not left to the bound, once.
    clock, agent, first, second, sent = await capture_waits_behind_a_waiting_customer(
        agent_factory, sim_factory)
    said = ends_said(agent, first.sale_id)
    await clock.advance(1.0)  # the capture goes at its bound
    await until(lambda: state_of(agent, first.sale_id) is SaleState.COMPLETED)
    stopped_at = clock.monotonic()
    agent.sales.close()
    final = await asyncio.wait_for(first.result(), WAIT_S)
    assert final.state is SaleState.COMPLETED
    assert said == [SaleState.COMPLETED]
    assert clock.monotonic() == stopped_at  # at once, not at the bound
    assert not agent.journal._fsync_owed  # durable before announced
    agent.sales.cancel_unpaid()
    await asyncio.wait_for(second.result(), WAIT_S)
    assert len(sent) == 1


async def test_a_lone_customers_capture_is_not_delayed(agent_factory: Any) -> None:
    # Nobody else waits for an answer: the capture goes as soon as its request is on disk, the
    # sale clock never moved (a wait for the bound would never end: this clock moves only when
    # told to).
    clock = FakeClock(wall=time.time())
    agent = await agent_factory(clock=clock)
    sent = captures_sent_at(agent, clock)
    began = clock.monotonic()
    sale = await agent.sales.start(vend(), ScriptedDispenser(vended_cents=300))
    final = await asyncio.wait_for(sale.result(), WAIT_S)
    assert final.state is SaleState.COMPLETED
    assert sent == [began]
    assert agent.sales.context.customers.waiting() == 0


async def test_a_held_completion_waits_for_customers_at_both_terminals_and_fsyncs_with_theirs(
    agent_factory: Any, sim_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An attack on 38fac9e with two terminals: the first customer's completion (committed, no
    # fsync of its own) waits while customers wait at both terminals. The first answered
    # (cancelled: an fsynced commit) makes it durable, but another still waits: not announced
    # yet. Announced once the last is answered, before the bound; no fdatasync of its own.
    clock = FakeClock(wall=time.time())
    sim = await sim_factory(time_scale=30, transactions=0)  # the read lives 6 s, not 0.6
    agent = await agent_factory(sim=sim, clock=clock)
    sent = captures_sent_at(agent, clock)
    first = await agent.sales.start(vend(), ScriptedDispenser(vended_cents=300))
    await asyncio.wait_for(first.terminal_released(), WAIT_S)
    here = await agent.sales.start(vend(305), ScriptedDispenser())  # a card that never comes
    there = await agent.sales.start(vend(305, "SIM-0007"), ScriptedDispenser())
    await until(lambda: state_of(agent, first.sale_id) is SaleState.CAPTURING)
    await until(lambda: clock.monotonic() + 1.0 in clock.pending())
    said = ends_said(agent, first.sale_id)
    fdatasyncs: list[str] = []
    monkeypatch.setattr(journal_module, "_fdatasync", fdatasyncs.append)
    await clock.advance(1.0)  # the capture goes at its bound
    await until(lambda: state_of(agent, first.sale_id) is SaleState.COMPLETED)
    assert agent.journal._fsync_owed
    began = clock.monotonic()
    assert await agent.sales.cancel(there.sale_id)  # one answered: its commit is fsynced
    assert (await asyncio.wait_for(there.result(), WAIT_S)).state is SaleState.CANCELLED
    assert not agent.journal._fsync_owed  # durable now, with the cancel's commit
    for _ in range(20):
        await asyncio.sleep(0)
    assert said == []  # a customer still waits at the other terminal
    assert await agent.sales.cancel(here.sale_id)
    final = await asyncio.wait_for(first.result(), WAIT_S)
    assert final.state is SaleState.COMPLETED
    assert said == [SaleState.COMPLETED]
    assert clock.monotonic() == began  # before the bound
    assert (await asyncio.wait_for(here.result(), WAIT_S)).state is SaleState.CANCELLED
    assert fdatasyncs == []
    assert len(sent) == 1
    [row] = await ledger(agent, first.order_id)
    assert row.status is TransStatus.CAPTURED


async def test_work_that_waits_for_a_sales_release_runs_in_the_call_that_releases_it(
    agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    # a platform follows its sale past the release without a task waiting meanwhile
    sale = await agent.sales.start(vend(300), ScriptedDispenser())
    heard: list[tuple[str, bool]] = []

    def broken() -> None:
        raise RuntimeError("a platform's bug")

    sale.when_released(lambda: heard.append(("first", sale.released.is_set())))
    sale.when_released(broken)
    sale.when_released(lambda: heard.append(("second", sale.released.is_set())))
    assert heard == []  # the card is still to be read
    event = await asyncio.wait_for(sale.result(), WAIT_S)
    assert event.state is SaleState.COMPLETED
    assert heard == [("first", True), ("second", True)]  # once each, the broken one logged
    assert "work that waited for its release failed" in caplog.text
    sale.when_released(lambda: heard.append(("late", True)))  # released already: at once
    assert heard[-1] == ("late", True)


async def test_the_next_sales_ids_are_made_at_the_last_ones_release_not_in_the_vend_requests_turn(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a uuid, the order id's keyed tag and the log's card-number check: made when a sale lets
    # its terminal go (its machine answered), for the next customer, not in the turn that reads
    # that customer's vend request
    from kiosk_agent.sales import runner

    made: list[tuple[str, str]] = []
    real_new_ids = runner.new_ids

    def counted(unit: Any) -> tuple[str, str]:
        made.append(real_new_ids(unit))
        return made[-1]

    monkeypatch.setattr(runner, "new_ids", counted)
    first = await agent.sales.start(vend(), ScriptedDispenser())
    assert [sale_id for sale_id, _ in made] == [first.sale_id]  # none were made ahead yet
    await asyncio.wait_for(first.terminal_released(), WAIT_S)
    assert len(made) == 2  # the next customer's, at the release
    second = await agent.sales.start(vend(), ScriptedDispenser())
    assert len(made) == 2  # its start made none
    assert (second.sale_id, second.order_id) == made[1]
    assert agent.sales.context.unit.made_here(second.order_id)
    await asyncio.wait_for(first.result(), WAIT_S)
    await asyncio.wait_for(second.result(), WAIT_S)
    # an adoption changes the unit in place: ids made ahead for the unit it was are not used
    unit = agent.sales.context.unit
    assert len(made) == 3
    monkeypatch.setattr(unit, "id", "ABCDEF0042")
    third = await agent.sales.start(vend(), ScriptedDispenser())
    assert len(made) == 4
    assert third.sale_id != made[2][0]
    assert third.order_id.startswith("KAABCDEF0042-")
    assert unit.made_here(third.order_id)
    await asyncio.wait_for(third.result(), WAIT_S)
