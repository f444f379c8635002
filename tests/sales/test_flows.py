"""Every sale flow and outcome, through the real simulator over HTTP and WebSocket.

Card outcomes follow the simulator's cents: ..01 retry (B), ..02 declined (C), ..05 no card
(expires), ..07 device fault; anything else approved.
"""

from __future__ import annotations

import asyncio
import errno
import json
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.sales import journal as journal_module
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.journal import SaleRecord
from kiosk_agent.sales.model import (
    DispenseOutcome,
    DispenseStatus,
    Flow,
    JournalError,
    SaleEvent,
    SaleRequest,
    Selection,
)
from kiosk_agent.sales.runner import TerminalBusy
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service import cable as cable_module
from kiosk_agent.service.models import TransactionFilter, TransStatus
from kiosk_agent.sim import auth as sim_auth
from tests.assembly.agent_helpers import ScriptedDispenser
from tests.helpers import hearing, until
from tests.sales.test_journal import FailingCommits, new_sale
from tests.service.test_cable import sim_call


def request(cents: int, flow: Flow = Flow.CHARGE_CARD, **fields: Any) -> SaleRequest:
    fields.setdefault("source", "test:front")
    return SaleRequest(flow=flow, amount_cents=cents, **fields)


async def sell(agent: Agent, cents: int, dispenser: ScriptedDispenser, **fields: Any) -> SaleEvent:
    sale = await agent.sales.start(request(cents, **fields), dispenser)
    return await asyncio.wait_for(sale.result(), 10)


async def ledger(agent: Agent, order_id: str) -> list[Any]:
    """What the service itself recorded under an order id (its reporting interface)."""
    query = TransactionFilter(order_id=order_id)
    return [t async for t in agent.service.reporting.transactions(query)]


async def test_charge_card_approved_dispenses_and_keeps_the_money(agent: Agent) -> None:
    machine = ScriptedDispenser()
    event = await sell(agent, 250, machine)
    assert event.state is SaleState.COMPLETED
    assert event.captured_cents == 250
    assert machine.authorized == [250]
    sale = agent.journal.get(event.sale_id)
    assert sale is not None
    assert sale.trans_id
    [row] = await ledger(agent, sale.order_id)
    assert row.status in (TransStatus.CAPTURED, TransStatus.SETTLED)
    assert row.amount_cents == 250


async def test_charge_card_declined_denies_the_vend(agent: Agent) -> None:
    machine = ScriptedDispenser()
    event = await sell(agent, 302, machine)
    assert event.state is SaleState.DECLINED
    assert machine.authorized == []
    assert len(machine.denied) == 1


async def test_charge_card_retry_answer_is_asked_again_up_to_the_limit(agent: Agent) -> None:
    machine = ScriptedDispenser()
    event = await sell(agent, 401, machine)
    assert event.state is SaleState.DECLINED
    sale = agent.journal.get(event.sale_id)
    assert sale is not None
    assert sale.attempt == 3
    steps = [s.step for s in agent.journal.steps(event.sale_id)]
    assert steps.count("charge_card.request") == 3
    assert machine.authorized == []


async def test_no_card_presented_expires_and_fails(agent: Agent) -> None:
    machine = ScriptedDispenser()
    event = await sell(agent, 105, machine)
    assert event.state is SaleState.FAILED
    assert "no card" in event.message
    assert machine.denied


async def test_device_fault_fails_without_money(agent: Agent) -> None:
    machine = ScriptedDispenser()
    event = await sell(agent, 107, machine)
    assert event.state is SaleState.FAILED
    assert "fault" in event.message
    sale = agent.journal.get(event.sale_id)
    assert sale is not None
    assert await ledger(agent, sale.order_id) == []


async def test_charge_card_failed_dispense_gives_the_money_back(agent: Agent) -> None:
    machine = ScriptedDispenser(DispenseStatus.FAILED)
    event = await sell(agent, 250, machine)
    assert event.state is SaleState.REVERSED
    assert "voided" in event.message
    sale = agent.journal.get(event.sale_id)
    assert sale is not None
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.VOIDED


async def test_authorize_capture_captures_what_was_vended(agent: Agent) -> None:
    machine = ScriptedDispenser(vended_cents=175)
    event = await sell(agent, 300, machine, flow=Flow.AUTHORIZE_CAPTURE)
    assert event.state is SaleState.COMPLETED
    assert event.captured_cents == 175
    assert machine.authorized == [300]
    sale = agent.journal.get(event.sale_id)
    assert sale is not None
    assert sale.last_four
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.CAPTURED
    assert row.amount_cents == 175


@pytest.mark.parametrize(
    ("status", "delay"),
    [(DispenseStatus.FAILED, 0.0), (DispenseStatus.CANCELLED, 0.0), (DispenseStatus.VENDED, 5.0)],
    ids=["dispense-failed", "cancelled-at-machine", "vend-timeout"],
)
async def test_authorize_capture_voids_when_nothing_was_vended(
    agent_factory: Any, status: DispenseStatus, delay: float
) -> None:
    # the machine's delay and the vend timeout (2 s in the test config) pass on a FakeClock
    clock = FakeClock(wall=time.time())
    agent = await agent_factory(clock=clock)
    machine = ScriptedDispenser(status, delay=delay, clock=clock)
    event = await clock.run(sell(agent, 300, machine, flow=Flow.AUTHORIZE_CAPTURE))
    assert event.state is SaleState.REVERSED
    sale = agent.journal.get(event.sale_id)
    assert sale is not None
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.VOIDED


@pytest.mark.parametrize(
    ("trigger_timeout", "ends_at"), [(None, 2.0), (7.0, 7.0), (0.5, 0.5)],
    ids=["the-sales-section", "a-trigger-that-waits-longer", "a-trigger-that-waits-less"],
)
async def test_the_vend_timeout_is_the_triggers_own_else_the_sales_sections(
    agent_factory: Any, trigger_timeout: float | None, ends_at: float
) -> None:
    """One rule (SaleSettings.vend_timeout_for): the sale keeps the timer; a trigger's own
    vend_timeout overrides the sales section's (2 s in the test config) for its sales."""
    clock = FakeClock(wall=time.time())
    agent = await agent_factory(clock=clock)
    machine = ScriptedDispenser(DispenseStatus.VENDED, delay=60.0, clock=clock)
    started = clock.monotonic()
    event = await clock.run(sell(agent, 300, machine, flow=Flow.AUTHORIZE_CAPTURE,
                                 vend_timeout=trigger_timeout))
    assert event.state is SaleState.REVERSED
    sale = agent.journal.get(event.sale_id)
    assert sale is not None
    assert f"no vend result within {ends_at:g} s" in sale.message
    assert machine.gave_up_at is not None
    assert machine.gave_up_at - started == pytest.approx(
        ends_at, abs=0.5)


class ChoosingMachine(ScriptedDispenser):
    """Card first: a customer who chooses ``choice`` after ``choose_after`` seconds of the
    clock (None: only after 100 s, past any timeout under test), then a machine that vends as
    told."""

    def __init__(self, clock: FakeClock, choice: Selection, choose_after: float | None) -> None:
        super().__init__(DispenseStatus.VENDED, vended_cents=choice.amount_cents, clock=clock)
        self.choice, self.choose_after = choice, choose_after
        self.offered: list[int] = []

    async def choose(self, funds_cents: int) -> Selection | DispenseOutcome:
        self.offered.append(funds_cents)
        assert self.clock is not None
        try:
            await self.clock.sleep(100.0 if self.choose_after is None else self.choose_after)
        except asyncio.CancelledError:
            self.gave_up_at = self.clock.monotonic()
            raise
        return self.choice


async def _card_first(agent_factory: Any, machine_of: Any, **fields: Any) -> Any:
    clock = FakeClock(wall=time.time())
    agent = await agent_factory(clock=clock)
    machine = machine_of(clock)
    started = clock.monotonic()
    event = await clock.run(sell(agent, 500, machine, flow=Flow.AUTHORIZE_CAPTURE,
                                 chosen_at_machine=True, **fields), horizon=120.0)
    return agent, machine, event, (machine.gave_up_at or started) - started


@pytest.mark.parametrize(
    ("trigger_timeout", "ends_at"), [(None, 60.0), (5.0, 5.0)],
    ids=["the-sales-section", "the-triggers-own"],
)
async def test_card_first_the_sale_bounds_the_choice_and_tells_the_machine_no(
    agent_factory: Any, trigger_timeout: float | None, ends_at: float
) -> None:
    """The choice's timer is the sale's (SaleSettings.choice_timeout_for): nobody chooses, the
    sale stops waiting at the trigger's own time else sales.choice_timeout (60 s), denies, vends
    nothing and releases the hold."""
    agent, machine, event, waited = await _card_first(
        agent_factory, lambda clock: ChoosingMachine(clock, Selection("A1", 150), None),
        choice_timeout=trigger_timeout)
    assert machine.offered == [500]
    assert waited == pytest.approx(ends_at, abs=0.5)
    why = f"session timeout: nothing selected within {ends_at:g} s"
    assert machine.denied == [why]
    assert machine.authorized == []  # no vend
    assert event.state is SaleState.REVERSED
    assert why in event.message
    sale = agent.journal.get(event.sale_id)
    assert sale is not None
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.VOIDED


async def test_card_first_a_choice_the_card_does_not_cover_is_refused_by_the_sale(
    agent_factory: Any
) -> None:
    _, machine, event, _ = await _card_first(
        agent_factory, lambda clock: ChoosingMachine(clock, Selection("C3", 650), 2.0))
    assert machine.authorized == []
    assert machine.denied == ["selection C3 costs $6.50, above the $5.00 authorized"]
    assert event.state is SaleState.REVERSED


async def test_card_first_a_choice_in_time_is_vended_and_only_its_price_captured(
    agent_factory: Any
) -> None:
    _, machine, event, _ = await _card_first(
        agent_factory, lambda clock: ChoosingMachine(clock, Selection("B2", 275), 30.0))
    assert (machine.offered, machine.authorized, machine.denied) == ([500], [500], [])
    assert event.state is SaleState.COMPLETED
    assert event.captured_cents == 275


class ChoiceWitness(ChoosingMachine):
    """Card first, a machine that notes as it is told to vend what the journal holds on disk
    of the sale, what the bus has heard of it, and the commits' synchronous settings so far."""

    def __init__(self, agent: Agent, clock: FakeClock) -> None:
        super().__init__(clock, Selection("B2", 275), 1.0)
        self.agent = agent
        self.heard: list[str] = []
        self.said: list[str] = []
        self.at_the_vend: list[tuple[str, ...]] = []
        agent.events.listen(lambda event: self.heard.append(event.step))

    async def choose(self, funds_cents: int) -> Selection | DispenseOutcome:
        chosen = await super().choose(funds_cents)
        self.agent.journal.db.set_trace_callback(self.said.append)  # from the choice on
        return chosen

    async def dispense(self, authorized_cents: int) -> Any:
        self.agent.journal.db.set_trace_callback(None)
        self.at_the_vend.append((*(last_step_on_disk(self.agent) or ()), *self.heard[-1:]))
        return await super().dispense(authorized_cents)


async def test_card_first_the_choice_is_on_disk_before_its_vend_is_approved(
    agent_factory: Any
) -> None:
    """What recovery needs to listen for a card-first vend after a restart (the chosen product
    and price, and when it was approved) is committed before the machine is told to vend
    (C,VEND) and published after it, in a commit without an fsync of its own (a kill keeps it;
    the vend is heard only on the boot that approved it, which a power cut ends)."""
    clock = FakeClock(wall=time.time())
    agent = await agent_factory(clock=clock)
    machine = ChoiceWitness(agent, clock)
    event = await clock.run(sell(agent, 500, machine, flow=Flow.AUTHORIZE_CAPTURE,
                                 chosen_at_machine=True), horizon=120.0)
    assert (event.state, event.captured_cents, event.product) == (
        SaleState.COMPLETED, 275, "B2")
    # on disk as the machine is told to vend; the bus has heard the approval, not the choice
    assert machine.at_the_vend == [("dispensing", "dispense.chosen", "dispense.request")]
    assert [s for s in machine.said if "synchronous" in s or s == "COMMIT"] == [
        "PRAGMA synchronous=NORMAL", "COMMIT", "PRAGMA synchronous=FULL"]
    [chosen] = [s for s in agent.journal.steps(event.sale_id) if s.step == Step.DISPENSE_CHOSEN]
    assert chosen.detail["product"] == "B2"
    assert chosen.detail["cents"] == 275
    assert chosen.detail["mono"] == pytest.approx(clock.monotonic(), abs=5)
    journaled = [s.step for s in agent.journal.steps(event.sale_id)]
    assert machine.heard == journaled[:len(machine.heard)]  # heard in the journal's order


async def test_card_first_on_a_machine_that_offers_no_choice_vends_nothing(
    agent_factory: Any
) -> None:
    clock = FakeClock(wall=time.time())
    agent = await agent_factory(clock=clock)
    machine = ScriptedDispenser(clock=clock)
    event = await clock.run(sell(agent, 500, machine, flow=Flow.AUTHORIZE_CAPTURE,
                                 chosen_at_machine=True))
    assert machine.authorized == []
    assert machine.denied == ["test:front offers no choice at the machine"]
    assert event.state is SaleState.REVERSED


async def test_a_choice_at_the_machine_is_refused_on_a_flow_that_charges_up_front(
    agent: Agent
) -> None:
    """charge_card would take the most the customer may choose, whatever was then chosen: a
    request that says the price comes with the choice is refused at its start, by name."""
    machine = ScriptedDispenser()
    wrong = request(500, Flow.CHARGE_CARD, chosen_at_machine=True)
    with pytest.raises(ValueError, match=r"needs flow authorize_capture.*got charge_card"):
        await agent.sales.start(wrong, machine)
    assert agent.journal.query() == []
    assert machine.authorized == []


async def test_card_first_offers_are_paced_by_the_sale_slower_while_none_is_authorized(
    agent_factory: Any
) -> None:
    """The pause before a card-first trigger's next offer is the sale's (SaleRunner, on its
    clock, SaleSettings.offer_pause): 0.2 s, doubling for each offer in a row that got no
    authorization (a terminal busy or offline), at most 30 s; an authorized one sets it back."""
    clock = FakeClock(wall=time.time())
    agent = await agent_factory(clock=clock)

    async def paused(expected: float) -> bool:
        """A pause of ``expected`` s was armed on the sale's clock and ended then, not before."""
        began, before = clock.monotonic(), clock.pending()
        pausing = asyncio.create_task(agent.sales.pause_before_offer("test:front"))
        new = await asyncio.wait_for(_new_waits(clock, before), 5)
        assert began + expected == pytest.approx(min(new, key=lambda d: abs(d - began - expected)))
        await clock.advance(expected - 0.01)
        early = pausing.done()
        await clock.advance(0.01)
        await asyncio.wait_for(pausing, 5)
        return not early

    for expected in [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]:
        assert await paused(expected)
    machine = ChoosingMachine(clock, Selection("B2", 275), 1.0)
    event = await clock.run(sell(agent, 500, machine, flow=Flow.AUTHORIZE_CAPTURE,
                                 chosen_at_machine=True))
    assert event.state is SaleState.COMPLETED
    assert await paused(0.2)
    other = await agent.sales.start(request(500, Flow.AUTHORIZE_CAPTURE, chosen_at_machine=True,
                                            source="test:back"), ScriptedDispenser())
    await clock.run(other.result())
    assert await paused(0.4)  # another trigger's offer is not this one's


async def _new_waits(clock: FakeClock, before: list[float]) -> list[float]:
    """The waits armed on the clock since ``before`` (the agent's own sweeps are there too)."""
    while not (new := list((Counter(clock.pending()) - Counter(before)).elements())):
        await asyncio.sleep(0)
    return new


async def test_authorize_capture_declined(agent: Agent) -> None:
    event = await sell(agent, 302, ScriptedDispenser(), flow=Flow.AUTHORIZE_CAPTURE)
    assert event.state is SaleState.DECLINED


async def test_customer_cancel_during_card_read(agent: Agent) -> None:
    machine = ScriptedDispenser()
    sale = await agent.sales.start(request(105, Flow.AUTHORIZE_CAPTURE), machine)
    await asyncio.sleep(0.05)
    assert await agent.sales.cancel(sale.sale_id)
    event = await asyncio.wait_for(sale.result(), 10)
    assert event.state is SaleState.CANCELLED
    assert machine.authorized == []


async def test_a_busy_terminal_refuses_at_once_with_a_reason(agent: Agent) -> None:
    machine = ScriptedDispenser(delay=0.3)
    first = await agent.sales.start(request(250), machine)
    with pytest.raises(TerminalBusy) as caught:
        await agent.sales.start(request(250), ScriptedDispenser())
    assert first.sale_id in caught.value.reason
    other = await agent.sales.start(request(250, terminal="printer"), ScriptedDispenser())
    assert (await first.result()).state is SaleState.COMPLETED
    assert (await other.result()).state is SaleState.COMPLETED


async def test_enroll_vaults_the_card_and_starts_a_plan(agent: Agent) -> None:
    plan = {
        "name": "locker-monthly",
        "amount": "9.99",
        "rrule": "DTSTART:20270101T000000Z\nRRULE:FREQ=MONTHLY;INTERVAL=1",
    }
    event = await sell(
        agent,
        100,
        ScriptedDispenser(),
        flow=Flow.ENROLL,
        email="c@example.com",
        plan=plan,
        metadata={
            "name": "Pat",
            "phone": "5550100",
            "account_zip": "12345",
            "address1": "1 Main",
            "city": "Town",
            "region": "NY",
        },
    )
    assert event.state is SaleState.COMPLETED, event.message
    sale = agent.journal.get(event.sale_id)
    assert sale is not None
    assert sale.vault_uuid
    assert sale.plan_id
    created = await agent.service.plans.get(int(sale.plan_id))
    assert created.payment_account_uuid == sale.vault_uuid


async def test_receipt_printed_when_the_terminal_can_print(agent: Agent) -> None:
    event = await sell(agent, 250, ScriptedDispenser(), terminal="SIM-0007", email="c@example.com")
    assert event.state is SaleState.COMPLETED
    notes = [
        s.detail.get("note") for s in agent.journal.steps(event.sale_id) if s.step == "receipt"
    ]
    assert notes == ["receipt printed", "receipt mailed"]


async def test_receipts_are_published_as_notes_after_the_completion(agent: Agent) -> None:
    async with agent.events.subscribe() as queue:
        event = await sell(agent, 250, ScriptedDispenser(), terminal="SIM-0007")
        seen = []
        while not queue.empty():
            step = queue.get_nowait()
            if step.sale_id == event.sale_id:
                seen.append(step)
    completed = [e.step for e in seen if e.state is SaleState.COMPLETED]
    assert completed == ["completed", "receipt"]
    assert [e.message for e in seen if e.receipt] == ["receipt printed"]


async def test_every_step_is_published_in_order(agent: Agent) -> None:
    async with agent.events.subscribe() as queue:
        event = await sell(agent, 250, ScriptedDispenser())
        states = []
        while not queue.empty():
            seen = queue.get_nowait()
            if seen.sale_id == event.sale_id:
                states.append(seen.state)
    assert states[0] is SaleState.STARTED
    assert SaleState.CHARGING in states
    assert SaleState.DISPENSING in states
    assert states[-1] is SaleState.COMPLETED


async def test_no_card_token_or_key_in_the_journal_file(agent: Agent) -> None:
    event = await sell(agent, 300, ScriptedDispenser(), flow=Flow.AUTHORIZE_CAPTURE)
    await sell(agent, 250, ScriptedDispenser())
    sale = agent.journal.get(event.sale_id)
    assert sale is not None
    assert sale.interaction_id is not None
    read = await agent.service.terminal.get_interaction(
        sale.terminal, "read_card", sale.interaction_id
    )
    card = read.read_card_result
    assert card is not None
    secrets = [card.token, agent.service.settings.api_key.get_secret_value()]
    db = agent.journal.path
    raw = db.read_bytes() + db.with_name(db.name + "-wal").read_bytes()
    for secret in secrets:
        assert secret.encode() not in raw


class BrokenMachine(ScriptedDispenser):
    async def dispense(self, authorized_cents: int) -> Any:
        self.authorized.append(authorized_cents)
        raise OSError("the controller vanished")


async def test_a_dispenser_that_raises_counts_as_not_dispensed(agent: Agent) -> None:
    event = await sell(agent, 300, BrokenMachine(), flow=Flow.AUTHORIZE_CAPTURE)
    assert event.state is SaleState.REVERSED
    assert "the controller vanished" in event.message


async def test_a_receipt_failure_never_fails_a_paid_sale(agent_factory: Any) -> None:
    agent = await agent_factory("receipts: {print: always}\n")
    event = await sell(agent, 250, ScriptedDispenser())  # SIM-0001 cannot print
    assert event.state is SaleState.COMPLETED
    steps = agent.journal.steps(event.sale_id)
    [note] = [s.detail["note"] for s in steps if s.step == "receipt"]
    assert note.startswith("receipt not printed")
    record = agent.journal.get(event.sale_id)
    assert record is not None
    assert record.state is SaleState.COMPLETED


async def test_authorize_capture_retry_answers_use_a_new_order_id_each(agent: Agent) -> None:
    machine = ScriptedDispenser()
    event = await sell(agent, 401, machine, flow=Flow.AUTHORIZE_CAPTURE)
    assert event.state is SaleState.DECLINED
    sale = agent.journal.get(event.sale_id)
    assert sale is not None
    assert sale.attempt == 3
    for order_id in sale.all_order_ids():
        [row] = await ledger(agent, order_id)
        assert row.status is TransStatus.RETRY
    assert machine.authorized == []


async def test_an_offline_reader_is_said_to_be_offline_not_busy(agent: Agent) -> None:
    import aiohttp

    device = agent.settings.terminals and next(iter(agent.settings.terminals))
    base = agent.service.settings.base_url
    async with aiohttp.ClientSession() as http, http.post(
        f"{base}/sim/terminals/{device}/offline"
    ) as answer:
        assert answer.status == 200
    for flow in (Flow.CHARGE_CARD, Flow.AUTHORIZE_CAPTURE):
        event = await sell(agent, 250, ScriptedDispenser(), flow=flow)
        assert event.state is SaleState.FAILED
        assert event.message.startswith(f"terminal offline: {device} does not answer"), event
        assert "busy" not in event.message
        assert "409" not in event.message


class JournalWitness(ScriptedDispenser):
    """A machine that reads, at the vend, what the journal holds on disk for the sale."""

    def __init__(self, agent: Agent) -> None:
        super().__init__()
        self.agent = agent
        self.on_disk: list[tuple[str, str | None, str]] = []

    async def dispense(self, authorized_cents: int) -> Any:
        other = sqlite3.connect(self.agent.journal.path)  # only what a crash would leave
        try:
            self.on_disk.append(other.execute(
                "SELECT sales.state, sales.trans_id, (SELECT step FROM steps "
                "WHERE steps.sale_id = sales.sale_id ORDER BY id DESC LIMIT 1) FROM sales"
            ).fetchone())
        finally:
            other.close()
        return await super().dispense(authorized_cents)


# steps that share a commit: the new sale and its first request, the approval and the dispense
# request; in authorize_capture also the card read and the authorization's request
@pytest.mark.parametrize(("flow", "shared"), [(Flow.CHARGE_CARD, 2), (Flow.AUTHORIZE_CAPTURE, 3)])
async def test_the_approval_and_the_dispense_request_are_one_commit_before_the_vend(
    agent: Agent, flow: Flow, shared: int
) -> None:
    machine = JournalWitness(agent)
    await asyncio.wait_for(agent.settled.wait(), 30)  # start-up's own commits (the WAL) done
    commits: list[str] = []
    agent.journal.db.set_trace_callback(lambda sql: sql == "COMMIT" and commits.append(sql))
    event = await sell(agent, 250, machine, flow=flow)
    agent.journal.db.set_trace_callback(None)
    assert event.state is SaleState.COMPLETED
    [(state, trans_id, last_step)] = machine.on_disk
    assert (state, last_step) == ("dispensing", "dispense.request")
    assert trans_id  # the money's id is on disk before anything is vended
    steps = [s.step for s in agent.journal.steps(event.sale_id)]
    assert len(commits) == len(steps) - shared  # every step kept, some sharing a commit


class PublishWitness(ScriptedDispenser):
    """A machine that notes, as it is asked to vend (or, card first, to offer the funds), what
    the bus's listeners have heard of the sale and what the journal holds on disk."""

    def __init__(self, agent: Agent) -> None:
        super().__init__()
        self.agent = agent
        self.heard: list[str] = []
        self.at_the_machine: list[tuple[list[str], tuple[str, str] | None]] = []
        agent.events.listen(lambda event: self.heard.append(event.step))

    def note(self) -> None:
        self.at_the_machine.append((list(self.heard), last_step_on_disk(self.agent)))

    async def choose(self, funds_cents: int) -> Selection:
        self.note()
        return Selection("A1", funds_cents)

    async def dispense(self, authorized_cents: int) -> Any:
        self.note()
        return await super().dispense(authorized_cents)


# the money's approval and the dispense request: committed, then the machine is told (the
# vend's line, or card first the session's funds), then the bus hears them; in that order
@pytest.mark.parametrize(("flow", "approval", "chosen_at_machine"), [
    (Flow.CHARGE_CARD, "charge_card.approved", False),
    (Flow.AUTHORIZE_CAPTURE, "authorize.approved", False),
    (Flow.AUTHORIZE_CAPTURE, "authorize.approved", True),
])
async def test_the_machine_is_told_before_the_approval_is_published_and_after_its_commit(
    agent: Agent, flow: Flow, approval: str, chosen_at_machine: bool
) -> None:
    machine = PublishWitness(agent)
    event = await sell(agent, 250, machine, flow=flow, chosen_at_machine=chosen_at_machine)
    assert event.state is SaleState.COMPLETED
    heard_then, on_disk = machine.at_the_machine[0]
    assert on_disk == ("dispensing", "dispense.request")  # the commit came first
    journaled = [s.step for s in agent.journal.steps(event.sale_id)]
    assert heard_then == journaled[: journaled.index(approval)]  # neither heard yet
    # then heard, in the order the journal holds them, with nothing lost or doubled
    assert machine.heard == journaled


async def test_the_card_reaches_the_authorizations_commit_in_the_loop_turn_it_came_in(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the turns of the event loop, counted by a task that runs once in each
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    counter = asyncio.ensure_future(count_turns())
    card_at: list[int] = []
    real_read_card = agent.service.terminal.read_card

    async def witnessed_read_card(*args: Any, **kwargs: Any) -> Any:
        handle = await real_read_card(*args, **kwargs)
        real_wait = handle.wait

        async def wait(timeout: float | None = None) -> Any:
            interaction = await real_wait(timeout)
            card_at.append(turns)
            return interaction

        handle.wait = wait
        return handle

    monkeypatch.setattr(agent.service.terminal, "read_card", witnessed_read_card)
    commit_at: list[int] = []
    try:
        sale = await agent.sales.start(request(250, flow=Flow.AUTHORIZE_CAPTURE),
                                       ScriptedDispenser())
        agent.journal.db.set_trace_callback(
            lambda sql: sql == "COMMIT" and card_at and not commit_at and commit_at.append(turns)
        )
        event = await asyncio.wait_for(sale.result(), 10)
    finally:
        agent.journal.db.set_trace_callback(None)
        counter.cancel()
    assert event.state is SaleState.COMPLETED
    assert len(card_at) == 1
    # no turn given to the card read's cancel helper (the customer never asked to cancel)
    assert commit_at == card_at


async def test_a_card_read_nobody_cancels_makes_no_task_to_watch_for_a_cancel(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    made: list[str] = []  # the coroutines the card wait made tasks of

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        if ".wait_interaction." in coro.__qualname__:
            made.append(coro.__qualname__)
        return asyncio.Task(coro, loop=loop, **kwargs)

    asked: list[str] = []
    real_cancel = agent.service.terminal.cancel

    async def cancel(device_id: str, interaction_id: str) -> Any:
        asked.append(interaction_id)
        return await real_cancel(device_id, interaction_id)

    monkeypatch.setattr(agent.service.terminal, "cancel", cancel)
    loop.set_task_factory(factory)
    try:
        event = await sell(agent, 250, ScriptedDispenser(), flow=Flow.AUTHORIZE_CAPTURE)
        assert event.state is SaleState.COMPLETED
        assert made == []  # two loop turns in the window between the vend request and the approve
        assert asked == []
        # a cancel makes the one task that asks the terminal to end the read
        sale = await agent.sales.start(request(105, Flow.AUTHORIZE_CAPTURE), ScriptedDispenser())
        while agent.journal.get(sale.sale_id).interaction_id is None:  # type: ignore[union-attr]
            await asyncio.sleep(0.001)
        assert await agent.sales.cancel(sale.sale_id)
        event = await asyncio.wait_for(sale.result(), 10)
    finally:
        loop.set_task_factory(None)
    assert event.state is SaleState.CANCELLED
    assert len(made) == 1
    assert asked == [agent.journal.get(sale.sale_id).interaction_id]  # type: ignore[union-attr]


async def test_the_card_waits_unsubscribe_is_sent_once_no_terminal_is_held(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cable_module, "LEAVE_WAITS_FOR_CUSTOMER_S", 60.0)  # the release, not it
    # the cable's token lives 60 s of the simulator's clock, 1.2 s of real time at its scale 50:
    # on a starved loop the token was spent late, the upgrade refused (401) and the wait polled
    # with no cable to look at. The token's lifetime is not this test's subject.
    monkeypatch.setattr(sim_auth, "WS_TOKEN_LIFETIME", 3600.0 * 50)
    cable = agent.service.terminal.cable
    machine = ScriptedDispenser()
    vending, vended = asyncio.Event(), asyncio.Event()  # the terminal is held while it vends
    real_dispense = machine.dispense

    async def dispense(authorized_cents: int) -> DispenseOutcome:
        vending.set()
        await vended.wait()
        return await real_dispense(authorized_cents)

    machine.dispense = dispense  # type: ignore[method-assign]
    sale = await agent.sales.start(request(250, Flow.AUTHORIZE_CAPTURE), machine)
    await asyncio.wait_for(vending.wait(), 10)  # approved: the card wait is over
    connection = cable._connection
    assert connection is not None
    interaction_id = agent.journal.get(sale.sale_id).interaction_id  # type: ignore[union-attr]
    assert [json.loads(left)["channel"] for left in connection.leaving] == [
        f"terminal_job:{interaction_id}"
    ]  # not said on the way from the card to the approve
    vended.set()
    event = await asyncio.wait_for(sale.result(), 10)
    assert event.state is SaleState.COMPLETED
    await until(lambda: not connection.leaving)  # the terminal released: the frame goes


async def test_what_waits_for_no_terminal_held_is_called_once_the_terminal_is_released(
    agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    called: list[str] = []
    agent.sales.when_no_terminal_held(lambda: called.append("idle"))  # none held: at once
    assert called == ["idle"]
    machine = ScriptedDispenser(delay=0.2)
    sale = await agent.sales.start(request(250, Flow.AUTHORIZE_CAPTURE), machine)

    def broken() -> None:
        raise RuntimeError("a bug in a callback")

    agent.sales.when_no_terminal_held(broken)  # said, and never the release's own failure
    agent.sales.when_no_terminal_held(lambda: called.append("released"))
    assert called == ["idle"]  # the sale holds its terminal
    event = await asyncio.wait_for(sale.result(), 10)
    assert event.state is SaleState.COMPLETED
    assert called == ["idle", "released"]
    assert "work that waited for no terminal to be held failed" in caplog.text


@pytest.mark.parametrize("flow", [Flow.CHARGE_CARD, Flow.AUTHORIZE_CAPTURE])
async def test_a_sales_end_is_the_event_its_listeners_heard_made_once(
    agent: Agent, flow: Flow
) -> None:
    with hearing(agent) as heard:
        event = await sell(agent, 250, ScriptedDispenser(), flow=flow)
    ends = [e for e in heard if e.sale_id == event.sale_id and e.state.final]
    assert len(ends) == 1
    assert ends[0] is event  # the end as published, not a second event made alike
    assert event.step == "completed"


def last_step_on_disk(agent: Agent) -> tuple[str, str] | None:
    """The sale's state and last step as a crash would leave them (read by another connection)."""
    other = sqlite3.connect(agent.journal.path)
    try:
        row = other.execute(
            "SELECT sales.state, (SELECT step FROM steps WHERE steps.sale_id = sales.sale_id "
            "ORDER BY id DESC LIMIT 1) FROM sales"
        ).fetchone()
    finally:
        other.close()
    return None if row is None else (row[0], row[1])


# each flow's first call to the service, and the state and step it is journaled with
FIRST_CALLS = [
    (Flow.CHARGE_CARD, "charge_card", ("charging", "charge_card.request")),
    (Flow.AUTHORIZE_CAPTURE, "read_card", ("reading_card", "read_card.request")),
    (Flow.ENROLL, "read_card", ("reading_card", "read_card.request")),
]


@pytest.mark.parametrize(("flow", "call", "on_disk"), FIRST_CALLS)
async def test_a_new_sale_and_its_first_request_are_one_commit_before_the_call(
    agent: Agent, flow: Flow, call: str, on_disk: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    commits: list[str] = []
    sent: list[tuple[int, tuple[str, str] | None]] = []  # (commits so far, what is on disk)
    real_call = getattr(agent.service.terminal, call)

    async def witnessed(*args: Any, **kwargs: Any) -> Any:
        sent.append((len(commits), last_step_on_disk(agent)))
        return await real_call(*args, **kwargs)

    monkeypatch.setattr(agent.service.terminal, call, witnessed)
    await asyncio.wait_for(agent.settled.wait(), 30)  # start-up's own commits (the WAL) done
    agent.journal.db.set_trace_callback(lambda sql: sql == "COMMIT" and commits.append(sql))
    sale = await agent.sales.start(request(250, flow=flow), ScriptedDispenser())
    assert len(commits) == 1  # start() returns (the kiosk API answers 202) once it is on disk
    await asyncio.wait_for(sale.result(), 10)
    agent.journal.db.set_trace_callback(None)
    assert sent == [(1, on_disk)]
    steps = [s.step for s in agent.journal.steps(sale.sale_id)]
    assert steps[:2] == ["created", on_disk[1]]  # both rows kept


async def test_a_cable_dropped_mid_sale_loses_neither_the_sale_nor_the_next_one(
    agent: Agent,
) -> None:
    # the sale's socket closes right after confirming its subscription, before any record
    await sim_call(agent.service, "POST", "/sim/faults", {"fault": "ws_drop_after_confirm"})
    first = await sell(agent, 250, ScriptedDispenser())
    second = await sell(agent, 250, ScriptedDispenser())
    faults = await sim_call(agent.service, "GET", "/sim/faults")
    assert [e.state for e in (first, second)] == [SaleState.COMPLETED] * 2
    assert [f["hits"] for f in faults["faults"]] == [1]
    assert agent.service.terminal.cable.connects == 2  # reopened with a fresh token


async def test_the_capture_is_sent_and_its_request_heard_only_once_the_request_is_fsynced(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The confirmed vend's capture request waits to share another sale's fsync (back to back,
    # the next customer's sale is written a turn later); a lone sale's gets the journal's own,
    # on the loop, before the capture is sent and before the bus hears it.
    flushed: list[tuple[str, str] | None] = []  # what was on disk at each of the journal's own
    fdatasync = journal_module._fdatasync

    def witnessed_fsync(path: Path) -> None:
        flushed.append(last_step_on_disk(agent))
        fdatasync(path)

    monkeypatch.setattr(journal_module, "_fdatasync", witnessed_fsync)
    heard: list[str] = []
    agent.events.listen(lambda event: heard.append(event.step))
    sent: list[tuple[int, str]] = []  # (the journal's own fsyncs by then, the last step heard)
    capture = agent.service.payments.capture

    async def witnessed(*args: Any, **kwargs: Any) -> Any:
        sent.append((len(flushed), heard[-1]))
        return await capture(*args, **kwargs)

    monkeypatch.setattr(agent.service.payments, "capture", witnessed)
    event = await sell(agent, 300, ScriptedDispenser(vended_cents=300),
                       flow=Flow.AUTHORIZE_CAPTURE)
    assert event.state is SaleState.COMPLETED
    # none shared them: the request's own, and its completion's (committed without one)
    assert flushed == [("capturing", "capture.request"), ("completed", "completed")]
    assert sent == [(1, "capture.request")]  # durable, then heard, then sent


async def test_a_next_sales_commit_that_fails_while_a_capture_request_waits_sends_no_capture(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Back to back, the next customer's sale is written while the previous capture request
    # waits to share its fsync. That commit fails (a disk I/O error): the request is not
    # durable for it, nor for the journal's own fdatasync after it (the pages the failure lost
    # may be the request's), so no capture is sent until the sale is written again; then it
    # is captured once, as recovery would.
    journal = agent.journal
    fsynced = journal.fsynced
    failed: list[JournalError] = []

    def next_customers_sale_fails() -> None:
        real = journal.db
        journal._db = FailingCommits(real)  # type: ignore[assignment]
        try:
            journal.create(new_sale(99))
        except JournalError as err:
            failed.append(err)
        finally:
            journal._db = real

    async def shared_with_a_failing_commit() -> None:
        if not failed:
            asyncio.get_running_loop().call_soon(next_customers_sale_fails)
        await fsynced()

    monkeypatch.setattr(journal, "fsynced", shared_with_a_failing_commit)
    captures = captures_sent(agent, monkeypatch)
    event = await sell(agent, 300, ScriptedDispenser(vended_cents=300),
                       flow=Flow.AUTHORIZE_CAPTURE)
    assert failed
    assert event.unwritten
    assert event.state is SaleState.DISPENSING  # as last durable
    assert captures == []
    kept = await written_again_and_final(agent, event.sale_id)  # then captured once
    assert kept.state is SaleState.COMPLETED, kept.message
    assert len(captures) == 1
    assert journal.get("s99") is None  # the failed commit left nothing


def captures_sent(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The payments captures the agent sends from now on, by their first argument."""
    captures: list[str] = []
    capture = agent.service.payments.capture

    async def counted(*args: Any, **kwargs: Any) -> Any:
        captures.append(str(args[0]))
        return await capture(*args, **kwargs)

    monkeypatch.setattr(agent.service.payments, "capture", counted)
    return captures


async def written_again_and_final(agent: Agent, sale_id: str) -> SaleRecord:
    """The sale once the journal holds it in a final state (an unwritten sale is written again
    when the journal takes writes, then finished)."""
    async with asyncio.timeout(10):
        while (kept := agent.journal.get(sale_id)) is None or not kept.state.final:
            await asyncio.sleep(0.05)
    return kept


async def test_a_disk_that_fails_the_capture_requests_fsync_sends_no_capture_until_written(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # not durable, so not sent: the sale is kept as the journal should hold it, written again
    # once the journal takes writes, then captured as recovery would
    failed: list[Path] = []
    fdatasync = journal_module._fdatasync

    def failing_once(path: Path) -> None:
        if not failed:
            failed.append(path)
            raise OSError(errno.EIO, "Input/output error")
        fdatasync(path)

    monkeypatch.setattr(journal_module, "_fdatasync", failing_once)
    captures = captures_sent(agent, monkeypatch)
    event = await sell(agent, 300, ScriptedDispenser(vended_cents=300),
                       flow=Flow.AUTHORIZE_CAPTURE)
    assert event.unwritten
    assert event.state is SaleState.DISPENSING  # as last durable
    assert captures == []
    kept = await written_again_and_final(agent, event.sale_id)  # then captured once
    assert kept.state is SaleState.COMPLETED, kept.message
    assert len(captures) == 1
    steps = [s.step for s in agent.journal.steps(event.sale_id)]
    restored = steps.index("journal.restored")  # its own (not durable), then written again
    assert steps[restored - 1 : restored + 2] == [
        "capture.request", "journal.restored", "capture.request"]
    assert steps[-1] == "completed"


async def test_a_disk_that_fails_the_completions_fsync_keeps_the_sale_and_captures_it_once(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The completion is committed without an fsync of its own; the journal's own, before it is
    # announced, fails: not durable, so not announced. The sale is kept as the journal should
    # hold it, written again once the journal takes writes, and ends completed without a
    # second capture (the service holds the first)
    synced: list[Path] = []
    fdatasync = journal_module._fdatasync

    def failing_second(path: Path) -> None:
        synced.append(path)
        if len(synced) == 2:  # the capture request's own, then the completion's
            raise OSError(errno.EIO, "Input/output error")
        fdatasync(path)

    monkeypatch.setattr(journal_module, "_fdatasync", failing_second)
    captures = captures_sent(agent, monkeypatch)
    heard: list[str] = []
    agent.events.listen(lambda event: heard.append(event.step))
    event = await sell(agent, 300, ScriptedDispenser(vended_cents=300),
                       flow=Flow.AUTHORIZE_CAPTURE)
    assert event.unwritten
    assert event.state is SaleState.CAPTURING  # as last durable
    assert "completed" not in heard  # never announced before it is durable
    kept = await written_again_and_final(agent, event.sale_id)
    assert kept.state is SaleState.COMPLETED, kept.message
    assert len(captures) == 1
    [row] = [r async for r in agent.service.reporting.transactions(
        TransactionFilter(order_id=event.order_id))]
    assert row.status is TransStatus.CAPTURED


class WaitWitness(ChoosingMachine):
    """A machine that notes how many customers wait for an answer when it is told something."""

    def __init__(self, agent: Agent, clock: FakeClock, choice: Selection) -> None:
        super().__init__(clock, choice, 1.0)
        self.customers = agent.sales.context.customers
        self.told: list[tuple[str, int]] = []

    async def choose(self, funds_cents: int) -> Selection | DispenseOutcome:
        self.told.append(("C,START", self.customers.waiting()))
        return await super().choose(funds_cents)

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        self.told.append(("C,VEND", self.customers.waiting()))
        return await super().dispense(authorized_cents)


@pytest.mark.parametrize("card_first", [False, True], ids=["selection-first", "card-first"])
async def test_a_customer_waits_from_their_request_until_the_machine_is_told(
    agent_factory: Any, card_first: bool
) -> None:
    # What a released sale's capture waits for (sales/answers.py): selection first, from the
    # vend request on; card first, only once the card is tapped (an offer waiting for a card is
    # nobody's wait); never once the machine has its answer, nor after the sale.
    clock = FakeClock(wall=time.time())
    agent = await agent_factory(clock=clock)
    machine = WaitWitness(agent, clock, Selection("B2", 275))
    waiting_at: dict[str, int] = {}
    agent.events.listen(
        lambda event: waiting_at.setdefault(event.step, agent.sales.context.customers.waiting()))
    event = await clock.run(sell(agent, 500, machine, flow=Flow.AUTHORIZE_CAPTURE,
                                 chosen_at_machine=card_first))
    assert event.state is SaleState.COMPLETED
    assert waiting_at["read_card.accepted"] == (0 if card_first else 1)
    assert waiting_at["authorize.request"] == 1
    assert waiting_at["dispense.request"] == 0  # published after C,VEND
    assert machine.told == ([("C,START", 0)] if card_first else []) + [("C,VEND", 0)]
    assert agent.sales.context.customers.waiting() == 0


def note_posts_written(
    monkeypatch: pytest.MonkeyPatch, paths: Iterable[bytes], seen: list[tuple[str, Any]]
) -> None:
    """Each POST to one of ``paths`` noted in ``seen`` as ``("written", path)`` when its bytes
    are handed to the socket's transport (on the wire), in order with what else ``seen`` holds."""
    import asyncio.selector_events as selector_events

    real_write = selector_events._SelectorSocketTransport.write

    def write(transport: Any, data: Any) -> None:
        head = bytes(data[:60])
        for path in paths:
            if head.startswith(b"POST ") and path in head:
                seen.append(("written", path))
        real_write(transport, data)

    monkeypatch.setattr(selector_events._SelectorSocketTransport, "write", write)


@pytest.mark.parametrize(
    ("flow", "published_after"),
    [
        (Flow.AUTHORIZE_CAPTURE, {
            b"/read-card ": (Step.CREATED, Step.READ_CARD_REQUEST),
            b"/api/v1/charge ": (Step.READ_CARD_DONE, Step.AUTHORIZE_REQUEST),
        }),
        (Flow.CHARGE_CARD, {b"/charge-card ": (Step.CREATED, Step.CHARGE_CARD_REQUEST)}),
    ],
    ids=["authorize_capture", "charge_card"],
)
async def test_the_steps_a_request_leads_from_are_published_once_it_is_on_the_wire(
    agent: Agent, monkeypatch: pytest.MonkeyPatch, flow: Flow,
    published_after: dict[bytes, tuple[Step, ...]],
) -> None:
    # The sale with its first request, and the card read with the authorization's: each commit
    # before its request is sent; the bus's listeners (health, metrics, Home Assistant, the
    # streams) hear them once that request's bytes are written, two turns later, not in the
    # customer's wait before it. The journal holds them first either way.
    seen: list[tuple[str, Any]] = []  # what happened, in order: a request written, a step heard
    note_posts_written(monkeypatch, published_after, seen)
    stop = agent.events.listen(lambda event: seen.append(("heard", event.step)))
    try:
        event = await sell(agent, 250, ScriptedDispenser(), flow=flow)
    finally:
        stop()
    assert event.state is SaleState.COMPLETED
    for path, steps in published_after.items():
        written = seen.index(("written", path))
        for step in steps:
            assert seen.index(("heard", step)) > written, (path, step, seen)
    # heard in the order the journal holds them, none lost or doubled
    heard = [what for kind, what in seen if kind == "heard"]
    assert heard == [s.step for s in agent.journal.steps(event.sale_id)]


@pytest.mark.parametrize(
    ("flow", "made_after"),
    [
        (Flow.AUTHORIZE_CAPTURE, {
            b"/read-card ": (Step.CREATED, Step.READ_CARD_REQUEST),
            b"/api/v1/charge ": (Step.READ_CARD_DONE, Step.AUTHORIZE_REQUEST),
            b"dispense": (Step.AUTHORIZE_APPROVED, Step.DISPENSE_REQUEST),
        }),
        (Flow.CHARGE_CARD, {
            b"/charge-card ": (Step.CREATED, Step.CHARGE_CARD_REQUEST),
            b"dispense": (Step.CHARGE_CARD_APPROVED, Step.DISPENSE_REQUEST),
        }),
    ],
    ids=["authorize_capture", "charge_card"],
)
async def test_the_events_of_steps_published_after_a_send_are_made_after_it(
    agent: Agent, monkeypatch: pytest.MonkeyPatch, flow: Flow,
    made_after: dict[bytes, tuple[Step, ...]],
) -> None:
    # The steps a request leads from are published once it is on the wire, the approval with
    # the vend's request once the machine is told (the dispense called): their events are made
    # then too, not in the customer's wait before it (two a commit, i41-seg1). Each event is
    # made once: the one a listener hears is the one a sale's end returns.
    from kiosk_agent.sales import steps as steps_module

    seen: list[tuple[str, Any]] = []  # in order: a request written, an event made
    note_posts_written(monkeypatch, made_after, seen)
    real_event_of = steps_module.event_of

    def event_of(record: SaleRecord, step: Any = "", *, clock: Any) -> Any:
        seen.append(("made", step))
        return real_event_of(record, step, clock=clock)

    class Told(ScriptedDispenser):
        async def dispense(self, authorized_cents: int) -> DispenseOutcome:
            seen.append(("written", b"dispense"))  # the machine's approve, in the field
            return await super().dispense(authorized_cents)

    monkeypatch.setattr(steps_module, "event_of", event_of)
    with hearing(agent) as heard:
        event = await sell(agent, 250, Told(), flow=flow)
    assert event.state is SaleState.COMPLETED
    for path, steps in made_after.items():
        written = seen.index(("written", path))
        for step in steps:
            assert seen.index(("made", step)) > written, (path, step, seen)
    made = Counter(what for kind, what in seen if kind == "made")  # an event made late may
    assert made == Counter(e.step for e in heard)  # follow a later one's: one a step, none twice
    assert [e.step for e in heard] == [s.step for s in agent.journal.steps(event.sale_id)]
    assert heard[-1] is event  # the end returned is the one heard


@pytest.mark.parametrize("hidden", ["_enter_task", "_leave_task"])
async def test_a_sale_is_made_whole_where_asyncio_has_no_task_switch_to_lend(
    agent: Agent, monkeypatch: pytest.MonkeyPatch, hidden: str
) -> None:
    # The sale's first step is run by hand in the runner's turn (tasks.EagerStart) with
    # asyncio's private task switch; a Python without it sells as before, the first step a
    # loop turn later (the task's own): charged, vended and captured, its journal whole
    monkeypatch.delattr(asyncio.tasks, hidden)
    machine = ScriptedDispenser(vended_cents=175)
    event = await sell(agent, 300, machine, flow=Flow.AUTHORIZE_CAPTURE)
    assert (event.state, event.captured_cents, machine.authorized) == (
        SaleState.COMPLETED, 175, [300])
    sale = agent.journal.get(event.sale_id)
    assert sale is not None
    assert sale.state is SaleState.COMPLETED
    [row] = await ledger(agent, sale.order_id)
    assert (row.status, row.amount_cents) == (TransStatus.CAPTURED, 175)
