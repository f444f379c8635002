"""A product the machine reports dispensed after its sale gave up waiting reaches a person.

On every platform, through the real agent (simulator over HTTP, ptys, SQLite): the sale gets a
``late.vend`` step naming the product, health shows a problem naming the sale and the product
(DEGRADED: the status page, the heartbeat and Home Assistant show it) until a person
acknowledges it (``kiosk-agent sales late-vends --ack``) or 24 hours pass, and no money moves
on it (the give-back stands: no capture after it). The GPIO and kiosk-API cases are in their
platform's late-vend test (test_gpio.py, test_kiosk_api.py), checked by :func:`told_to_a_person`.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.cli import main
from kiosk_agent.moments import display_clock, display_time, timestamp
from kiosk_agent.platforms.mdb_protocol import VEND_SUCCESS_LINE
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock, FakeClock
from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.late_vends import LATE_VEND_SHOWN, LateVendWatch
from kiosk_agent.sales.model import Flow
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.models import TransactionFilter, TransStatus
from kiosk_agent.sim.machine import VirtualController, VisitOutcome

from ..helpers import until, walk_to
from .agent_rig import running_agent, vend_asked
from .test_serial_line import MDB_AS_LINES


async def told_to_a_person(agent: Any, sale_id: str, product: str) -> None:
    """The late vend of ``sale_id`` (given back) is journaled on it and shown in health until
    acknowledged; its money stays given back, nothing captured. A restart's hearing that ended
    in silence noted a maybe first (the agent stopped mid-vend), and so did every give-back of
    a vend no result was heard of (a vend timeout, a drop sensor's window, a controller reset
    mid-vend: 2026-11-30): the late vend the test is about (heard, or a dispenser's error) is
    the one after them, the sale's last, what every face shows."""

    def lates() -> list[Any]:
        return [s for s in agent.journal.steps(sale_id) if s.step == Step.LATE_VEND]

    def restarts_maybe(step: Any) -> bool:
        unsure = str(step.detail.get("unsure") or "")
        return bool(unsure) and not unsure.startswith("dispenser error")

    await until(lambda: bool(lates()) and not restarts_maybe(lates()[-1]))
    *before, late = lates()
    assert all(restarts_maybe(s) for s in before), before
    assert late.detail["product"] == product
    record = agent.journal.get(sale_id)
    assert record is not None
    assert record.state is SaleState.REVERSED, record.message
    assert record.captured_cents == 0 or record.flow == Flow.CHARGE_CARD
    query = TransactionFilter(order_id=record.order_id)
    rows = [t async for t in agent.service.reporting.transactions(query)]
    assert [r.status for r in rows] in ([TransStatus.VOIDED], [])  # no capture after it
    snapshot = agent.health.snapshot()
    # a vend heard is counted as dispensed, a dispenser's error as maybe: both unpaid
    [problem] = [p for p in snapshot.problems if "unpaid (the money went back)" in p]
    assert sale_id[:8] in problem, problem
    assert product in problem, problem
    assert "kiosk-agent sales late-vends --ack" in problem
    assert snapshot.status != "ok"
    assert _unacknowledged_on_metrics(agent) == 1  # /metrics counts what the journal holds
    assert agent.sales.late_vends.acknowledge(sale_id[:8], by="test") == [sale_id]
    assert not [p for p in agent.health.snapshot().problems if "the money went back" in p]
    assert _unacknowledged_on_metrics(agent) == 0
    assert [s.detail for s in agent.journal.steps(sale_id)
            if s.step == Step.LATE_VEND_SEEN] == [{"by": "test"}]


def _unacknowledged_on_metrics(agent: Any) -> float:
    """``kiosk_agent_late_vends_unacknowledged`` as /metrics' collector gives it."""
    from kiosk_agent.admin.metrics import AgentCollector

    [family] = [f for f in AgentCollector(agent, lambda name: None).collect()
                if f.name == "kiosk_agent_late_vends_unacknowledged"]
    [sample] = family.samples
    return float(sample.value)


_MACHINES = {
    "mdb": {"platform": "mdb", "name": "front", "flow": "authorize_capture"},
    "serial_line": {**MDB_AS_LINES, "flow": "authorize_capture"},
}


async def _dropping(machine_clock: FakeClock) -> None:
    """Until the machine is dropping a product, on its own clock: the test says when it has
    dropped (``advance``), however long the agent takes in real time meanwhile."""
    await machine_clock.next_due(pauses_only=False, real_timeout=30)


async def _vend_timeout_waits(clock: FakeClock, seconds: float) -> None:
    """Until the sale waits for its vend result on the agent's clock (its vend timeout due
    ``seconds`` from now): moving the clock before that would move it past nothing."""
    due = clock.monotonic() + seconds
    await until(lambda: any(abs(at - due) < 1e-6 for at in clock.pending()))


async def _given_back_at_its_vend_timeout(
    agent: Any, controller: VirtualController, clock: FakeClock, seconds: float,
    fail: bool = False,
) -> tuple[asyncio.Task[Any], SaleRecord]:
    """A customer's B1 approved, the machine dropping it (on its own clock, not moved), while
    the sale's vend timeout (``seconds`` on the agent's ``clock``) passes: the money goes back.
    The customer's visit (``fail``: the drop ends in a failure, when the test moves the
    machine's clock) and the sale as it ended."""
    await asyncio.wait_for(controller.wait_enabled(), 5)
    visit = asyncio.create_task(controller.customer("B1", fail=fail))
    await _dropping(controller.clock)
    [record] = agent.journal.query()
    await until(lambda: agent.journal.get(record.sale_id).state is SaleState.DISPENSING)
    await _vend_timeout_waits(clock, seconds)
    await clock.advance(seconds)  # the vend timeout: the money goes back
    await until(lambda: agent.journal.get(record.sale_id).state.final)
    ended = agent.journal.get(record.sale_id)
    assert ended is not None
    return visit, ended


async def _dropped(machine_clock: FakeClock) -> None:
    """The product being dropped is out (the machine's drop time passed on its clock)."""
    await machine_clock.advance_to(await machine_clock.next_due(pauses_only=False,
                                                                real_timeout=30))


def _ended_as_heard(agent: Any, sale_id: str, fails: bool) -> SaleRecord:
    """The sale ended on the vend result the controller said (B1, 3.25): a failure given back,
    a success captured; nothing is a late vend. The sale's record."""
    final = agent.journal.get(sale_id)
    assert final is not None
    if fails:
        assert (final.state, final.captured_cents) == (SaleState.REVERSED, 0), final.message
    else:
        assert (final.state, final.captured_cents) == (SaleState.COMPLETED, 325), final.message
    assert not [s for s in agent.journal.steps(sale_id) if s.step == Step.LATE_VEND]
    return final


async def _visit_and_sale_end_as_heard(
    agent: Any, visit: asyncio.Task[Any], sale_id: str, fails: bool
) -> None:
    """The customer's visit ends as the controller said (failed or vended), and the sale ends
    on it (:func:`_ended_as_heard`)."""
    expected = VisitOutcome.FAILED if fails else VisitOutcome.VENDED
    assert (await asyncio.wait_for(visit, 10)).outcome is expected
    await until(lambda: agent.journal.get(sale_id).state.final)
    _ended_as_heard(agent, sale_id, fails)


@pytest.mark.parametrize("kind", _MACHINES)
async def test_a_vend_success_after_the_vend_timeout_reaches_a_person(
    tmp_path: Path, sim_settings: Any, controller: VirtualController, kind: str
) -> None:
    """The machine takes longer to drop the B1 than the sale waits (its vend timeout): the
    sale gives the money back, then the machine says VEND,SUCCESS. The vend timeout runs on the
    agent's clock and the drop on the machine's, each moved by the test in that order."""
    trigger = {**_MACHINES[kind], "port": controller.port, "vend_timeout": 0.5}
    clock, controller.clock = FakeClock(), FakeClock()
    async with running_agent(tmp_path, sim_settings, [trigger], clock=clock) as agent:
        visit, record = await _given_back_at_its_vend_timeout(agent, controller, clock, 0.5)
        assert record.state is SaleState.REVERSED
        await _dropped(controller.clock)  # then the B1 comes out after all
        assert (await asyncio.wait_for(visit, 10)).outcome is VisitOutcome.VENDED
        await told_to_a_person(agent, record.sale_id, "B1")


def _reversed_sale(journal: Journal, sale_id: str, product: str | None = None) -> SaleRecord:
    record = journal.create(SaleRecord(
        sale_id=sale_id, order_id=f"KA{sale_id.upper()}", source="mdb:front",
        flow=Flow.AUTHORIZE_CAPTURE.value, terminal="SIM-0001", amount_cents=150,
        state=SaleState.STARTED, product=product,
    ))  # fmt: skip
    return walk_to(journal, record, SaleState.REVERSED)  # type: ignore[no-any-return]


async def test_a_late_vend_stops_being_a_problem_after_its_time(tmp_path: Path) -> None:
    """Unacknowledged, a late vend is a problem for LATE_VEND_SHOWN, then no more; a restart
    (a new watch on the same journal) shows it as before."""
    clock = FakeClock()
    journal = Journal(tmp_path / "journal.db", clock=clock)
    journal.open()
    _reversed_sale(journal, "late0001")
    watch = LateVendWatch(journal, clock)
    watch.heard("late0001", "A1", "mdb:front")
    [heard] = [s.at for s in journal.steps("late0001") if s.step == Step.LATE_VEND]
    assert f"A1 on mdb:front, {display_clock(heard)})" in (watch.problem() or "")  # today
    await clock.advance(LATE_VEND_SHOWN - 1)
    # the next day, a time of day alone would read as today's: the date is said
    assert f"A1 on mdb:front, {display_time(heard)})" in (
        LateVendWatch(journal, clock).problem() or "")
    await clock.advance(2)
    assert watch.problem() is None
    journal.close()


async def test_an_acknowledgement_from_another_process_or_the_24_hours_end_is_told(
    tmp_path: Path,
) -> None:
    """Health reads the late vends at each snapshot, but the heartbeat (Home Assistant) hears
    of a change only when told: the agent's look each second (its journal watch) tells health
    when the late vends shown changed under it (`sales late-vends --ack` in another process,
    the 24 hours passed), once; nothing when they did not."""
    clock = FakeClock()
    journal = Journal(tmp_path / "journal.db", clock=clock)
    journal.open()
    _reversed_sale(journal, "late0004")
    told: list[int] = []
    watch = LateVendWatch(journal, clock, on_change=lambda: told.append(1))
    watch.heard("late0004", "D1", "mdb:front")
    assert told == [1]  # at once, as before
    watch.look()
    assert told == [1]  # nothing changed since: not told twice
    LateVendWatch(journal, clock).acknowledge("late0004", by="cli (tech)")  # another process
    watch.look()
    assert told == [1, 1]
    watch.look()
    assert told == [1, 1]
    _reversed_sale(journal, "late0005")
    watch.heard("late0005", "D2", "mdb:front")
    await clock.advance(LATE_VEND_SHOWN + 1)
    watch.look()  # its 24 hours are over: no longer shown
    assert told == [1, 1, 1, 1]
    assert watch.problem() is None
    journal.close()


def test_sales_late_vends_lists_and_acknowledges(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kiosk-agent sales late-vends` lists what health shows (exit 1 while any); `--ack`
    journals the person's acknowledgement, and the problem is gone for the agent too."""
    (tmp_path / "config.yaml").write_text(
        "service: {simulator: {time_scale: 300}}\n"
        "terminals: [{device_id: SIM-0001, name: front}]\njournal: {path: journal.db}\n"
    )
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    _reversed_sale(journal, "late0002")
    LateVendWatch(journal, journal.clock).heard("late0002", "B1", "serial_line:vmc")
    journal.close()
    config = str(tmp_path / "config.yaml")
    assert main(["sales", "late-vends", "-c", config, "--json"]) == 1
    [listed] = json.loads(capsys.readouterr().out)["late_vends"]
    assert (listed["sale_id"], listed["product"]) == ("late0002", "B1")
    assert main(["sales", "late-vends", "-c", config, "--ack", "late00"]) == 0
    assert "late0002" in capsys.readouterr().out
    assert main(["sales", "late-vends", "-c", config]) == 0
    assert "0 late vends not acknowledged" in capsys.readouterr().out
    assert main(["sales", "late-vends", "-c", config, "--ack", "all"]) == 1  # none left


@pytest.mark.parametrize("kind", _MACHINES)
async def test_a_vend_success_after_the_controller_ended_the_vend_reaches_a_person(
    tmp_path: Path, sim_settings: Any, controller: VirtualController, kind: str
) -> None:
    """An attack on "a dispense it can no longer hear about is taken as not made": the
    controller goes inactive mid-vend (a power blip), the sale gives the money back at once,
    and then the machine says VEND,SUCCESS after all (the product was dropping). Before, that
    success was a line "with no vend pending" (ignored): the product went out unpaid and no
    person heard of it. It is a late vend like one after the vend timeout: journaled on the
    sale, in health until acknowledged, no money moved."""
    trigger = {**_MACHINES[kind], "port": controller.port, "vend_timeout": 5}
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        await asyncio.wait_for(controller.wait_enabled(), 5)
        controller.options.dispense_time = 0.3
        visit = asyncio.create_task(controller.customer("B1"))
        await vend_asked(controller)
        controller.reset()
        assert (await visit).outcome is VisitOutcome.ABORTED
        [record] = agent.journal.query()
        await until(lambda: agent.journal.get(record.sale_id).state.final)
        assert agent.journal.get(record.sale_id).state is SaleState.REVERSED
        await asyncio.wait_for(controller.wait_enabled(), 5)
        controller.send(VEND_SUCCESS_LINE)
        await told_to_a_person(agent, record.sale_id, "B1")


async def _stopped_mid_vend(
    tmp_path: Path, sim_settings: Any, controller: VirtualController, trigger: dict[str, Any],
    customer: Any, clock: Clock = SYSTEM_CLOCK,
) -> tuple[asyncio.Task[Any], SaleRecord]:
    """``customer`` (a visit not yet started) asks for B1; once its sale is dispensing the agent
    stops (SIGTERM's drain runs out: the sale is parked dispensing) while the controller goes on
    vending. The visit's task and the sale, as the journal holds it. ``clock``: the agent's."""
    async with running_agent(tmp_path, sim_settings, [trigger], clock=clock) as first:
        await asyncio.wait_for(controller.wait_enabled(), 5)
        visit = asyncio.create_task(customer)
        await vend_asked(controller)
        [record] = first.journal.query()
        await until(lambda: first.journal.get(record.sale_id).state is SaleState.DISPENSING)
        # parked where it stands (a drain on an injected clock would wait for the test to move it)
        await first.sales.stop(grace=0.05 if clock is SYSTEM_CLOCK else 0)
    return visit, record


@pytest.mark.parametrize("kind", _MACHINES)
@pytest.mark.parametrize("fails", [False, True], ids=["success", "failure"])
async def test_a_restart_mid_dispense_still_hears_the_vend_result(
    tmp_path: Path, sim_settings: Any, controller: VirtualController, kind: str, fails: bool
) -> None:
    """Standing rule 13 (never give up a dispense while it can still hear its result): the
    agent restarts mid-vend on the same boot while the controller goes on vending over the same
    adapter. The new start's recovery listens for the vend until its vend timeout, with the
    adapter's setup held back (``C,0`` would end the controller's session): the controller's
    VEND,SUCCESS is captured, its failure given back; nothing is a late vend. Before, recovery
    gave the money back at once and the success became a product gone out unpaid."""
    trigger = {**_MACHINES[kind], "port": controller.port, "vend_timeout": 30}
    controller.options.dispense_time = 3600.0  # the machine is still dropping it
    visit, record = await _stopped_mid_vend(tmp_path, sim_settings, controller, trigger,
                                            controller.customer("B1", fail=fails))
    sent = len(controller.received)
    async with running_agent(tmp_path, sim_settings, [trigger]) as second:
        [platform] = second.platforms
        await until(lambda: platform.device.link.connected)
        await asyncio.sleep(0.2)  # a setup sent on connect would be in by now
        assert second.journal.get(record.sale_id).state is SaleState.DISPENSING
        assert "C,0" not in controller.received[sent:]  # held back while recovery listens
        controller.send("c,ERR,VEND 3" if fails else VEND_SUCCESS_LINE)
        await asyncio.wait_for(second.recovery.wait(), 30)
        final = _ended_as_heard(second, record.sale_id, fails)
        query = TransactionFilter(order_id=final.order_id)
        rows = [t async for t in second.service.reporting.transactions(query)]
        assert [r.status for r in rows] == (
            [TransStatus.VOIDED] if fails else [TransStatus.CAPTURED]), rows
        # the adapter is set up once recovery is done listening
        await until(lambda: "C,1" in controller.received[sent:])
    visit.cancel()  # the machine would drop its product for an hour


async def test_health_says_while_recovery_listens_and_the_terminal_takes_no_sale(
    tmp_path: Path, sim_settings: Any, controller: VirtualController
) -> None:
    """While recovery listens for the vend a restart left (mdb, up to its vend timeout), the
    terminal refuses every customer (TerminalBusy: recovery holds it). Before, health read
    "ok" with the terminal available and no problem: the page, the CLI and Home Assistant
    showed a unit ready to sell. Now a problem names the sale, its terminal and the time left,
    until the hearing ends (here by the controller's VEND,SUCCESS: captured)."""
    trigger = {**_MACHINES["mdb"], "port": controller.port, "vend_timeout": 30}
    controller.options.dispense_time = 3600.0  # the machine is still dropping it
    visit, record = await _stopped_mid_vend(tmp_path, sim_settings, controller, trigger,
                                            controller.customer("B1"))
    async with running_agent(tmp_path, sim_settings, [trigger]) as second:
        [platform] = second.platforms
        await until(lambda: platform.device.link.connected)
        snapshot = second.health.snapshot()
        [problem] = [p for p in snapshot.problems if "recovery listens" in p]
        assert record.sale_id[:8] in problem, problem
        assert "SIM-0001" in problem, problem
        assert "no new sale" in problem, problem
        assert snapshot.status != "ok"
        controller.send(VEND_SUCCESS_LINE)
        await asyncio.wait_for(second.recovery.wait(), 30)
        final = second.journal.get(record.sale_id)
        assert final is not None
        assert (final.state, final.captured_cents) == (SaleState.COMPLETED, 325), final.message
        assert not [p for p in second.health.snapshot().problems if "recovery listens" in p]
    visit.cancel()  # the machine would drop its product for an hour


async def test_a_new_selection_while_recovery_listens_ends_the_hearing_and_no_setup_cuts_it(
    tmp_path: Path, sim_settings: Any, controller: VirtualController
) -> None:
    """An attack on the restart's hearing (mdb): while recovery listens for the vend the last
    stop left, the controller opens a new customer's session (A2). A controller asks for the
    next vend only once the last one is over, so the hearing ends there: the old sale's money
    goes back now, saying why, not at the hearing's deadline. The new customer is refused
    (recovery still holds the terminal while it gives that money back), and the setup held
    back for the hearing waits until no session is open (its ``C,0`` would reset the
    controller in the middle of one); the customer's next try sells. Before, the hearing ran on
    to its deadline whatever the controller did.

    The restart and both customers well within the vend timeout (the hearing's end is read on
    the real clock), and each customer waits for its answer, however slow the machine. Starved
    (the test process stopped 390 ms of every 400) the second try was never answered: the first
    try's denied visit said ENABLED after the setup's C,0, its C,1's enable sequence then said
    ENABLED again after the selection, and the agent took the session for over (its sale
    cancelled, the customer left waiting): the virtual controller now lets a customer step up
    only once its enable sequence is over."""
    vend_timeout = 120.0
    trigger = {**_MACHINES["mdb"], "port": controller.port, "vend_timeout": vend_timeout}
    controller.options.dispense_time = 3600.0  # the first vend never says how it ended
    controller.options.patience = 60.0  # a guard: each customer is answered, however slowly
    loop = asyncio.get_running_loop()
    visit, old = await _stopped_mid_vend(tmp_path, sim_settings, controller, trigger,
                                         controller.customer("B1", no_result=True))
    left_at = loop.time()  # the old vend was approved before this: its hearing ends by then
    visit.cancel()  # that customer is gone; the controller stays enabled
    sent = len(controller.received)
    async with running_agent(tmp_path, sim_settings, [trigger]) as second:
        [platform] = second.platforms
        await until(lambda: platform.device.link.connected)
        assert second.journal.get(old.sale_id).state is SaleState.DISPENSING
        assert "C,0" not in controller.received[sent:]  # held back while recovery listens
        controller.options.dispense_time = 0.3
        tried = await asyncio.wait_for(controller.customer("A2"), 90)
        assert tried.outcome is VisitOutcome.DENIED  # not ABORTED: no C,0 inside it
        await asyncio.wait_for(second.recovery.wait(), 30)
        settled = second.journal.get(old.sale_id)
        assert settled is not None
        assert settled.state is SaleState.REVERSED, settled.message
        assert "next selection" in settled.message, settled.message
        assert loop.time() < left_at + vend_timeout  # ended by the selection, not its deadline
        # the setup comes once no session is open; then the customer's next try sells
        await until(lambda: "C,1" in controller.received[sent:])
        await asyncio.sleep(2 * controller.options.enable_delay + 0.2)  # its enable sequence
        await asyncio.wait_for(controller.wait_enabled(), 30)
        again = await asyncio.wait_for(controller.customer("A2"), 90)
        assert again.outcome is VisitOutcome.VENDED, controller.received[sent:]
        [new] = [r for r in second.journal.query() if r.sale_id != old.sale_id]
        await until(lambda: second.journal.get(new.sale_id).state.final)
        final = second.journal.get(new.sale_id)
        assert (final.product, final.state, final.captured_cents) == (
            "A2", SaleState.COMPLETED, 250), final.message


# card first: the agent offers up to $5.00 (C,START), the customer chooses, the sale vends that
_CARD_FIRST = {"platform": "mdb", "name": "front", "flow": "authorize_capture",
               "mode": "card_first", "max_funds": "5.00", "session_timeout": 30}


@pytest.mark.parametrize("fails", [False, True], ids=["success", "failure"])
async def test_a_restart_mid_card_first_vend_still_hears_the_vend_result_at_the_chosen_price(
    tmp_path: Path, sim_settings: Any, controller: VirtualController, fails: bool
) -> None:
    """Standing rule 13 for a card-first sale (mdb: the card is read first, the customer then
    chooses B1, $3.25 of the $5.00 held): the agent stops mid-vend and restarts on the same boot
    (one injected clock: the vend's deadline never passes by itself) while the controller goes
    on vending. Recovery listens, the setup held back, and settles on what the controller says:
    a success captures the chosen $3.25 (not the $5.00 held), a failure gives the money back;
    nothing is a late vend. Before, the chosen price was not journaled: recovery gave the money
    back at once and the success became a product gone out unpaid."""
    trigger = {**_CARD_FIRST, "port": controller.port, "vend_timeout": 30}
    clock, controller.clock = FakeClock(), FakeClock()
    async with running_agent(tmp_path, sim_settings, [trigger], clock=clock) as first:
        await asyncio.wait_for(controller.wait_enabled(), 5)
        visit = asyncio.create_task(controller.card_first_customer("B1", fail=fails))
        await _dropping(controller.clock)  # C,VEND,3.25 approved: the machine drops it
        [record] = [r for r in first.journal.query() if r.state is SaleState.DISPENSING]
        await first.sales.stop(grace=0)  # parked where it stands
    assert "C,VEND,3.25" in controller.received
    sent = len(controller.received)
    async with running_agent(tmp_path, sim_settings, [trigger], clock=clock) as second:
        [platform] = second.platforms
        await until(lambda: platform.device.link.connected)
        assert second.sales.listening_after_restart(record.sale_id) is not None
        await asyncio.sleep(0.2)  # a setup sent on connect would be in by now
        assert second.journal.get(record.sale_id).state is SaleState.DISPENSING
        assert "C,0" not in controller.received[sent:]  # held back while recovery listens
        await _dropped(controller.clock)  # the result, said to the new start
        await asyncio.wait_for(second.recovery.wait(), 30)
        final = _ended_as_heard(second, record.sale_id, fails)
        assert final.product == "B1"
        query = TransactionFilter(order_id=final.order_id)
        rows = [t async for t in second.service.reporting.transactions(query)]
        assert [(r.status, r.amount_cents) for r in rows] == (
            [(TransStatus.VOIDED, 500)] if fails else [(TransStatus.CAPTURED, 325)]), rows
        await until(lambda: "C,1" in controller.received[sent:])  # set up once it is over
        expected = VisitOutcome.FAILED if fails else VisitOutcome.VENDED
        assert (await asyncio.wait_for(visit, 10)).outcome is expected
        await second.sales.stop(grace=0)  # the next card-first offer waits on the clock


@pytest.mark.parametrize("kind", _MACHINES)
async def test_a_vend_success_after_a_restart_mid_dispense_reaches_a_person(
    tmp_path: Path, sim_settings: Any, controller: VirtualController, kind: str
) -> None:
    """An attack on "a dispense it can no longer hear about is taken as not made": the agent
    stops mid-dispense; the next start's recovery listens until the vend timeout, hears
    nothing, gives the money back and sets the adapter up; then the machine says VEND,SUCCESS
    (the product was dropping all along). Before, the new process knew no given-up vend: the
    success was a line with no vend pending, ignored, and nobody heard of the product gone out
    unpaid. Both starts run on one injected clock (the same boot) that the test moves past the
    hearing's deadline once recovery listens: on the real clock a starved machine's second
    start came after the deadline, and recovery gave the money back without listening."""
    trigger = {**_MACHINES[kind], "port": controller.port, "vend_timeout": 2.0}
    controller.options.dispense_time = 3600.0  # the machine is still dropping it
    clock = FakeClock()
    visit, record = await _stopped_mid_vend(tmp_path, sim_settings, controller, trigger,
                                            controller.customer("B1"), clock=clock)
    sent = len(controller.received)
    async with running_agent(tmp_path, sim_settings, [trigger], clock=clock) as second:
        await until(lambda: second.sales.listening_after_restart(record.sale_id) is not None)
        vend = second.sales.restart_vend(record.sale_id)
        assert vend is not None
        assert vend.due == pytest.approx(clock.monotonic() + 2.0)  # none of its 2 s gone yet
        await until(lambda: vend.due in clock.pending())  # recovery waits on its deadline
        assert "C,0" not in controller.received[sent:]  # held back while recovery listens
        await clock.advance_to(vend.due)  # nothing heard by the deadline: the hearing ends
        await asyncio.wait_for(second.recovery.wait(), 30)
        final = second.journal.get(record.sale_id)
        assert final is not None
        assert final.state is SaleState.REVERSED
        assert "vend timeout after the restart" in final.message, final.message
        await until(lambda: [lk.state for lk in second.health.snapshot().links] == ["connected"])
        await until(lambda: "C,1" in controller.received[sent:])  # set up once it is over
        controller.send(VEND_SUCCESS_LINE)
        await told_to_a_person(second, record.sale_id, "B1")
    visit.cancel()  # the machine would drop its product for an hour


def test_a_late_vended_sale_says_so_in_the_sales_list_show_and_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sale of a late vend reads "reversed": the sales table, `sales show` and the CSV/JSON
    export must each show the product that went out anyway, as the journal's late.vend step
    holds it (and who acknowledged it), not only `sales late-vends`."""
    (tmp_path / "config.yaml").write_text(
        "service: {simulator: {time_scale: 300}}\n"
        "terminals: [{device_id: SIM-0001, name: front}]\njournal: {path: journal.db}\n"
    )
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    _reversed_sale(journal, "late0003", "C4")  # chosen, so a sale (not a session)
    _reversed_sale(journal, "plain003", "C5")
    LateVendWatch(journal, journal.clock).heard("late0003", "C4", "mdb:front")
    [late] = [s for s in journal.steps("late0003") if s.step == Step.LATE_VEND]
    journal.close()
    config = str(tmp_path / "config.yaml")

    assert main(["sales", "-c", config]) == 0
    rows = {line.split()[2]: line for line in capsys.readouterr().out.splitlines()[1:-1]}
    assert "late vend: C4 dispensed" in rows["KALATE0003"], rows
    assert "late vend" not in rows["KAPLAIN003"], rows

    assert main(["sales", "show", "-c", config, "late0003"]) == 0
    [line] = [s for s in capsys.readouterr().out.splitlines() if "late.vend " in s]
    assert "product=C4 source=mdb:front" in line, line

    assert main(["sales", "-c", config, "--format", "csv"]) == 0
    exported = {r["sale_id"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert exported["late0003"]["late_vend"] == timestamp(late.at)
    assert exported["plain003"]["late_vend"] == ""
    assert main(["sales", "-c", config, "--format", "json"]) == 0
    as_json = {r["sale_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert as_json["late0003"]["late_vend"] == timestamp(late.at)

    # acknowledged, the sale still says its product went out (the note is history), and who saw
    assert main(["sales", "late-vends", "-c", config, "--ack", "late0003"]) == 0
    capsys.readouterr()
    assert main(["sales", "show", "-c", config, "late0003"]) == 0
    [seen] = [s for s in capsys.readouterr().out.splitlines() if "late.vend.seen" in s]
    assert "by=cli (" in seen, seen
    assert main(["sales", "-c", config]) == 0
    assert "late vend: C4 dispensed" in capsys.readouterr().out


async def _link_glitched_mid_vend(
    agent: Any, controller: VirtualController, customer: Any
) -> tuple[asyncio.Task[Any], SaleRecord, int]:
    """``customer`` (a visit not yet started) asks for B1; once the sale is dispensing, the
    adapter's link drops and comes back (:meth:`VirtualController.glitch`). The visit's task,
    the sale, and how many lines the controller had heard before the glitch."""
    await asyncio.wait_for(controller.wait_enabled(), 5)
    visit = asyncio.create_task(customer)
    await vend_asked(controller)
    [record] = agent.journal.query()
    await until(lambda: agent.journal.get(record.sale_id).state is SaleState.DISPENSING)
    sent = len(controller.received)
    controller.glitch()
    [platform] = agent.platforms
    await until(lambda: platform.device.link.stats.reconnects == 1)
    return visit, record, sent


@pytest.mark.parametrize("kind", _MACHINES)
@pytest.mark.parametrize("fails", [False, True], ids=["success", "failure"])
async def test_a_link_back_mid_vend_still_hears_the_vend_result(
    tmp_path: Path, sim_settings: Any, controller: VirtualController, kind: str, fails: bool
) -> None:
    """Standing rule 13 (never give up a dispense while it can still hear its result): the
    adapter's USB link drops and comes back mid-vend (the pty closed and a new one opened) while
    the controller goes on vending. The sale keeps waiting on the new link: the controller's
    VEND,SUCCESS is captured, its failure given back; nothing is a late vend. Before, the
    reconnect gave the money back at once (mdb) or its init lines (C,0) ended the controller's
    session mid-vend (serial_line): the product went out unpaid."""
    trigger = {**_MACHINES[kind], "port": controller.port, "vend_timeout": 30}
    controller.clock = FakeClock()  # the drop ends when the test says: once the link is back
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        visit, record, sent = await _link_glitched_mid_vend(
            agent, controller, controller.customer("B1", fail=fails))
        [platform] = agent.platforms
        await until(lambda: platform.device.link.connected)
        assert agent.journal.get(record.sale_id).state is SaleState.DISPENSING
        await _dropped(controller.clock)  # the result, said on the new link
        await _visit_and_sale_end_as_heard(agent, visit, record.sale_id, fails)
        # the adapter is set up again once the vend is over, not in the middle of it
        await until(lambda: "C,1" in controller.received[sent:])
        await asyncio.wait_for(controller.wait_enabled(), 5)
        next_visit = asyncio.create_task(controller.customer("A1"))
        await _dropped(controller.clock)
        assert (await asyncio.wait_for(next_visit, 10)).outcome is VisitOutcome.VENDED


@pytest.mark.parametrize("kind", _MACHINES)
async def test_a_link_back_mid_vend_with_nothing_heard_gives_back_at_the_vend_timeout(
    tmp_path: Path, sim_settings: Any, controller: VirtualController, kind: str
) -> None:
    """The link comes back mid-vend and the controller says nothing: the sale still waits on
    the new link (dispensing after the reconnect, the setup held back), gives the money back at
    its vend timeout, then sets the adapter up; a success heard after that is a late vend. The
    vend timeout runs on the agent's clock: however long the link takes to come back in real
    time, the sale is still waiting on it."""
    trigger = {**_MACHINES[kind], "port": controller.port, "vend_timeout": 1.5}
    clock = FakeClock()
    async with running_agent(tmp_path, sim_settings, [trigger], clock=clock) as agent:
        controller.options.dispense_time = 0.05
        visit, record, sent = await _link_glitched_mid_vend(
            agent, controller, controller.customer("B1", no_result=True))
        [platform] = agent.platforms
        await until(lambda: platform.device.link.connected)
        assert (await asyncio.wait_for(visit, 10)).outcome is VisitOutcome.NO_RESULT
        assert agent.journal.get(record.sale_id).state is SaleState.DISPENSING
        assert "C,0" not in controller.received[sent:]  # held back while it waits
        await _vend_timeout_waits(clock, 1.5)
        await clock.advance(1.5)  # the vend timeout, nothing heard: the money goes back
        await until(lambda: agent.journal.get(record.sale_id).state.final)
        assert agent.journal.get(record.sale_id).state is SaleState.REVERSED
        await until(lambda: "C,1" in controller.received[sent:])  # set up once it is over
        controller.send(VEND_SUCCESS_LINE)
        await told_to_a_person(agent, record.sale_id, "B1")


@pytest.mark.parametrize("fails", [False, True], ids=["success", "failure"])
async def test_a_controller_that_disables_the_reader_mid_vend_is_still_heard(
    tmp_path: Path, sim_settings: Any, controller: VirtualController, fails: bool
) -> None:
    """Standing rule 13: the controller disables the reader (``c,STATUS,DISABLED``) while the
    approved vend is dropping. MDB's vend state is one the controller leaves only by its vend
    result (docs/platforms.md, the MDB notes), and a reader disable does not reset it (unlike
    ``INACTIVE``): the sale keeps waiting until its vend timeout and settles on what it hears,
    a success captured, a failure given back; nothing is a late vend. Before, the disable gave
    the money back at once and the success became a product gone out unpaid."""
    trigger = {**_MACHINES["mdb"], "port": controller.port, "vend_timeout": 30}
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        await asyncio.wait_for(controller.wait_enabled(), 5)
        controller.options.dispense_time = 1.0  # still dropping when the disable comes
        visit = asyncio.create_task(controller.customer("B1", fail=fails))
        await vend_asked(controller)
        [record] = agent.journal.query()
        await until(lambda: agent.journal.get(record.sale_id).state is SaleState.DISPENSING)
        controller.send("c,STATUS,DISABLED")
        [platform] = agent.platforms
        await until(lambda: platform.device.status()["controller"] == "DISABLED")
        assert agent.journal.get(record.sale_id).state is SaleState.DISPENSING
        await _visit_and_sale_end_as_heard(agent, visit, record.sale_id, fails)
