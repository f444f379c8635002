"""The mdb platform against the virtual vending machine controller, over a real pty."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.platforms import mdb_protocol as wire
from kiosk_agent.platforms.mdb import PLATFORM_SCHEMA, Mode
from kiosk_agent.platforms.serial import SerialLink
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.model import DispenseStatus
from kiosk_agent.sales.states import SaleState
from kiosk_agent.sim.machine import Status, VirtualController, VisitOutcome

from ..helpers import sim_call, until
from .agent_rig import running_agent
from .vending_rig import CardDesk, Machine, make_machine


async def test_selection_first_vend_is_approved_and_captured(machine: Machine) -> None:
    visit = await machine.controller.customer("A2")

    assert visit.outcome is VisitOutcome.VENDED
    assert visit.approved_cents == 250
    [final] = await machine.desk.settled()
    assert final.state is SaleState.COMPLETED
    assert final.captured_cents == 250
    assert final.product == "A2"
    assert "C,VEND,2.50" in machine.controller.received


async def test_declined_card_denies_the_vend(machine: Machine) -> None:
    visit = await machine.controller.customer("D2")  # 1.02: the card is declined

    assert visit.outcome is VisitOutcome.DENIED
    [final] = await machine.desk.settled()
    assert final.state is SaleState.DECLINED
    assert machine.controller.received[-1] == "C,STOP"


async def test_failed_dispense_gives_the_money_back(machine: Machine) -> None:
    visit = await machine.controller.customer("B1", fail=True)

    assert visit.outcome is VisitOutcome.FAILED
    [sale] = machine.desk.sales
    final = await sale.result()
    assert sale.outcome is not None
    assert sale.outcome.status is DispenseStatus.FAILED
    assert final.state is SaleState.REVERSED


async def test_customer_walking_away_cancels_the_sale(machine: Machine) -> None:
    machine.desk.card_time = 1.0  # nobody presents a card
    visit = await machine.controller.customer("A1", walk_away_after=0.1)

    assert visit.outcome is VisitOutcome.WALKED_AWAY
    [sale] = machine.desk.sales
    final = await asyncio.wait_for(sale.result(), 2)
    assert sale.cancelled
    assert final.state is SaleState.CANCELLED


async def test_no_vend_result_times_out_and_voids(machine: Machine) -> None:
    machine.device.options.vend_timeout = 0.5  # no result ever comes: the timeout is the claim
    visit = await machine.controller.customer("A1", no_result=True)
    assert visit.outcome is VisitOutcome.NO_RESULT

    [sale] = machine.desk.sales
    final = await asyncio.wait_for(sale.result(), 30)
    assert sale.outcome is not None
    assert sale.outcome.status is DispenseStatus.TIMEOUT
    assert final.state is SaleState.REVERSED


async def test_the_next_customer_is_served_while_a_walked_away_sale_cancels(
    machine: Machine,
) -> None:
    machine.desk.card_time = 1.0  # nobody presents a card
    machine.desk.cancel_time = 0.2  # and the terminal takes its time to cancel
    first = await machine.controller.customer("A1", walk_away_after=0.05)
    machine.desk.card_time = 0.005
    second = await machine.controller.customer("A2")  # at once, while the first cancels

    assert first.outcome is VisitOutcome.WALKED_AWAY
    assert second.outcome is VisitOutcome.VENDED
    first_final, second_final = await machine.desk.settled()
    assert first_final.state is SaleState.CANCELLED
    assert second_final.state is SaleState.COMPLETED
    assert second_final.captured_cents == 250


async def test_the_next_selection_starts_once_the_terminal_is_free_not_after_the_capture(
    machine: Machine,
) -> None:
    # The machine is done with the first customer once the vend result is in; the terminal is
    # free then too (the capture needs only the payments API), so the next customer's sale
    # starts while that capture is still under way.
    machine.desk.capture_time = 0.3
    first = await machine.controller.customer("A2")
    second = await machine.controller.customer("A1")  # at once, while the first captures

    assert first.outcome is VisitOutcome.VENDED
    assert second.outcome is VisitOutcome.VENDED
    assert not machine.desk.sales[0].final.done()  # still capturing
    first_final, second_final = await asyncio.wait_for(machine.desk.settled(), 3)
    assert first_final.captured_cents == 250
    assert second_final.captured_cents == 150
    assert machine.desk.refused == 0


async def test_a_selection_after_a_silent_vend_ends_it_unpaid_and_is_served(
    controller: VirtualController,
) -> None:
    # The controller never reports the first vend; its next vend request says that one is over.
    machine = await make_machine(controller, vend_timeout=30)
    try:
        first = await controller.customer("A1", no_result=True)
        second = await controller.customer("A2")

        assert first.outcome is VisitOutcome.NO_RESULT
        assert second.outcome is VisitOutcome.VENDED
        first_sale = machine.desk.sales[0]
        first_final, second_final = await asyncio.wait_for(machine.desk.settled(), 5)
        assert first_sale.outcome is not None
        assert first_sale.outcome.status is DispenseStatus.TIMEOUT
        assert first_final.state is SaleState.REVERSED  # never captured without a vend result
        assert second_final.state is SaleState.COMPLETED
        assert second_final.captured_cents == 250
    finally:
        await machine.device.stop()


async def test_controller_reset_while_card_is_read_cancels(machine: Machine) -> None:
    machine.desk.card_time = 1.0
    visit_task = asyncio.create_task(machine.controller.customer("A1"))
    await until(lambda: machine.desk.sales)
    machine.controller.reset()

    visit = await asyncio.wait_for(visit_task, 2)
    assert visit.outcome is VisitOutcome.ABORTED
    final = await asyncio.wait_for(machine.desk.sales[0].result(), 2)
    assert final.state is SaleState.CANCELLED

    machine.desk.card_time = 0.005  # the machine comes back and sells again
    again = await machine.controller.customer("A1")
    assert again.outcome is VisitOutcome.VENDED


async def test_controller_reset_while_vending_gives_the_money_back(
    machine: Machine,
) -> None:
    # a vend long enough for the reset to interrupt it (the controller notices when it ends), the
    # agent's vend timeout far beyond it: a loaded machine cannot end either before the reset
    machine.controller.options.dispense_time = 1.0
    machine.device.options.vend_timeout = 10.0
    visit_task = asyncio.create_task(machine.controller.customer("A2"))
    await until(lambda: "C,VEND,2.50" in machine.controller.received)
    machine.controller.reset()

    visit = await asyncio.wait_for(visit_task, 5)
    assert visit.outcome is VisitOutcome.ABORTED
    [sale] = machine.desk.sales
    final = await asyncio.wait_for(sale.result(), 2)
    assert sale.outcome is not None
    assert sale.outcome.status is DispenseStatus.CANCELLED
    assert "inactive mid-session" in sale.outcome.detail
    assert final.state is SaleState.REVERSED


async def test_controller_disabled_mid_session_aborts(machine: Machine) -> None:
    machine.desk.card_time = 1.0
    visit_task = asyncio.create_task(machine.controller.customer("A1"))
    await until(lambda: machine.desk.sales)
    machine.controller.disable()

    visit = await asyncio.wait_for(visit_task, 2)
    assert visit.outcome is VisitOutcome.ABORTED
    final = await asyncio.wait_for(machine.desk.sales[0].result(), 2)
    assert final.state is SaleState.CANCELLED


async def test_repeated_enable_is_tolerated_even_mid_session(machine: Machine) -> None:
    machine.controller.repeat_enable(5)
    machine.desk.card_time = 0.2
    visit_task = asyncio.create_task(machine.controller.customer("A1"))
    await until(lambda: machine.desk.sales)

    visit = await asyncio.wait_for(visit_task, 2)
    assert visit.outcome is VisitOutcome.VENDED
    [final] = await machine.desk.settled()
    assert final.state is SaleState.COMPLETED


async def test_garbage_and_partial_lines_are_dropped_not_fatal(
    machine: Machine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    machine.controller.send_raw(b"\x00\xff\xfe binary noise\n")
    machine.controller.send_raw(b"c,STATUS,VE" + b"X" * 600)  # an overlong run, no line end
    machine.controller.send_raw(b"\nc,STATUS,BOGUS\nhello there\n")
    await until(lambda: machine.device.stats.unknown_lines >= 2)

    assert machine.device.link.stats.dropped >= 2
    assert machine.device.link.connected
    visit = await machine.controller.customer("A1")
    assert visit.outcome is VisitOutcome.VENDED
    assert "unknown status 'BOGUS'" in caplog.text


async def test_unplug_and_replug_under_another_name(machine: Machine) -> None:
    first_name = machine.controller.pty_name
    machine.controller.unplug()
    await until(lambda: not machine.device.link.connected)
    await asyncio.sleep(0.1)  # a few failed reconnects while the adapter is away
    machine.controller.plug()
    await machine.ready()

    assert machine.controller.pty_name != first_name
    assert machine.link_states[-1] == "connected"
    assert "disconnected" in machine.link_states
    visit = await machine.controller.customer("A1")
    assert visit.outcome is VisitOutcome.VENDED
    assert machine.device.link.stats.reconnects == 1


async def test_unplug_mid_vend_is_not_captured(machine: Machine) -> None:
    machine.controller.options.dispense_time = 1.0  # the unplug comes mid-vend, whatever the load
    machine.device.options.vend_timeout = 1.5  # no result from an unplugged machine: given back
    visit_task = asyncio.create_task(machine.controller.customer("A2"))
    await until(lambda: "C,VEND,2.50" in machine.controller.received)
    machine.controller.unplug()

    visit = await asyncio.wait_for(visit_task, 5)
    assert visit.outcome is VisitOutcome.ABORTED
    final = await asyncio.wait_for(machine.desk.sales[0].result(), 3)
    assert final.state is SaleState.REVERSED


async def test_card_first_captures_only_the_chosen_price(controller: VirtualController) -> None:
    machine = await make_machine(controller, mode=Mode.CARD_FIRST, session_timeout=2.0)
    try:
        visit = await controller.card_first_customer("A1")
        assert visit.funds_cents == 500
        assert visit.outcome is VisitOutcome.VENDED
        final = await asyncio.wait_for(machine.desk.sales[0].result(), 2)
        assert final.state is SaleState.COMPLETED
        assert final.captured_cents == 150
        assert machine.desk.sales[0].request.amount_cents == 500
        assert "C,START,5.00" in controller.received
    finally:
        await machine.device.stop()


async def test_card_first_walk_away_and_session_timeout(controller: VirtualController) -> None:
    machine = await make_machine(controller, mode=Mode.CARD_FIRST, session_timeout=0.2)
    try:
        visit = await controller.card_first_customer(None)
        assert visit.outcome is VisitOutcome.WALKED_AWAY
        first = await asyncio.wait_for(machine.desk.sales[0].result(), 2)
        assert first.state is SaleState.REVERSED
        # Next session: nobody chooses within session_timeout; the agent closes it.
        await until(lambda: len(machine.desk.sales) >= 2)
        second = await asyncio.wait_for(machine.desk.sales[1].result(), 2)
        assert second.state is SaleState.REVERSED
        assert "session timeout" in (machine.desk.sales[1].outcome.detail or "")  # type: ignore[union-attr]
    finally:
        await machine.device.stop()


async def test_card_first_retries_a_busy_terminal_ever_more_slowly(
    controller: VirtualController,
) -> None:
    desk = CardDesk()
    desk.held_elsewhere = True
    machine = await make_machine(controller, mode=Mode.CARD_FIRST, desk=desk)
    try:
        await until(lambda: machine.desk.refused >= 3)
        first, second, third = machine.desk.refused_at[:3]
        # 0.2 s, then 0.4 s apart: not every 0.2 s (lower bounds: a busy machine only adds)
        assert second - first >= 0.19
        assert third - second >= 0.39
        assert "C,STOP" not in controller.received  # the machine was never offered anything
        machine.desk.held_elsewhere = False
        await until(lambda: machine.desk.sales, timeout=5)
        visit = await controller.card_first_customer("A2")
        assert visit.outcome is VisitOutcome.VENDED
    finally:
        await machine.device.stop()


async def test_vend_request_before_card_is_denied_in_card_first(
    controller: VirtualController,
) -> None:
    machine = await make_machine(controller, mode=Mode.CARD_FIRST)
    machine.desk.card_time = 5.0
    try:
        await until(lambda: machine.desk.sales)
        visit = await controller.customer("A1")
        assert visit.outcome is VisitOutcome.DENIED
    finally:
        await machine.device.stop()


async def test_stopping_while_the_card_is_read_cancels_the_sale(machine: Machine) -> None:
    machine.desk.card_time = 5.0
    visit_task = asyncio.create_task(machine.controller.customer("A1", walk_away_after=1.0))
    await until(lambda: machine.desk.sales)
    await asyncio.wait_for(machine.device.stop(), 1.0)

    final = await asyncio.wait_for(machine.desk.sales[0].result(), 1.0)
    assert final.state is SaleState.CANCELLED
    assert machine.device.link.state.value == "closed"
    visit_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await visit_task


async def _a_silence(clock: FakeClock) -> None:
    """One silence on the link's clock: time moves to the end of the watchdog's wait, and the
    test waits (in real time, as long as the loop needs) until the watchdog waits again, having
    done what the silence asked (nothing, a probe, or a drop)."""
    due = await clock.next_due(pauses_only=False)
    await clock.advance_to(due)
    await until(lambda: any(later > due for later in clock.pending()))


async def _probed(clock: FakeClock, link: SerialLink) -> None:
    """Silences until one sends a probe (one in which a line came sends none)."""
    await _a_silence(clock)
    while link.probe_sent_at != clock.monotonic():
        await _a_silence(clock)


async def _settled(machine: Machine) -> None:
    """The link has heard the controller's last line of the connect (enabled): from here on
    an idle controller says nothing unasked."""
    await until(lambda: machine.device.facts.controller is Status.ENABLED)


async def test_no_probe_while_a_sale_waits_on_its_card(controller: VirtualController) -> None:
    # Ten silences pass on the link's clock while the card is at the terminal; a probe then
    # would be answered "c,STATUS,ENABLED" (the controller's resting state), which reads as the
    # customer's session ending mid-sale. The link's clock is the test's: on the wall clock a
    # starved loop let the idle probe's answer come after a second silence, the link was
    # dropped as dead, and its reconnect (C,0) aborted the visit (1 of 376 runs, load 15-17).
    clock = FakeClock()
    desk = CardDesk()
    desk.card_held = asyncio.Event()
    machine = await make_machine(
        controller, desk=desk, link={"silence_timeout": 0.05, "probe": "C,STATUS"}, clock=clock
    )
    link = machine.device.link
    try:
        await _settled(machine)
        heard = link.stats.lines
        await _probed(clock, link)  # probed while idle
        await until(lambda: "C,STATUS" in controller.received)
        await until(lambda: link.stats.lines > heard)  # and answered
        visit = asyncio.ensure_future(controller.customer("A1"))
        await until(lambda: len(desk.sales) == 1)  # the sale waits on its card
        probes = controller.received.count("C,STATUS")
        for _ in range(10):
            await _a_silence(clock)
        assert link.probe_sent_at != clock.monotonic()
        desk.card_held.set()
        assert (await visit).outcome is VisitOutcome.VENDED
        assert controller.received.count("C,STATUS") == probes
        [final] = await desk.settled()
        assert final.state is SaleState.COMPLETED
        assert link.stats.reconnects == 0
    finally:
        await machine.device.stop()


@pytest.mark.parametrize(
    "repeats_vend",
    [
        pytest.param(False, id="answered-with-its-resting-ENABLED"),
        pytest.param(True, id="answered-with-the-pending-vend-request"),
    ],
)
async def test_a_probe_crossing_the_vend_request_does_not_end_the_sale(
    controller: VirtualController, repeats_vend: bool
) -> None:
    # The probe goes out just as the customer selects: the controller reads it after sending
    # its vend request and answers with its state from before (c,STATUS,ENABLED), or, on
    # adapters that answer with their state, with the vend request being served again.
    controller.options.status_repeats_vend = repeats_vend
    machine = await make_machine(controller, link={"silence_timeout": 30, "probe": "C,STATUS"})
    try:
        machine.device.link.send_probe()
        visit = await controller.customer("A1")
        assert visit.outcome is VisitOutcome.VENDED
        [final] = await machine.desk.settled()
        assert final.state is SaleState.COMPLETED
        assert "C,STATUS" in controller.received
        assert "C,STOP" not in controller.received  # not taken for a second selection
        assert machine.device.stats.denied == 0
    finally:
        await machine.device.stop()


async def test_quiet_controller_is_probed_not_dropped(controller: VirtualController) -> None:
    # Five silences on the link's clock, each probed and answered, however late the answer
    # comes in real time (on the wall clock a starved loop's answer came after the second
    # silence: the link was dropped, 1 of 209 runs at load 15-17).
    clock = FakeClock()
    machine = await make_machine(
        controller, link={"silence_timeout": 0.05, "probe": "C,STATUS"}, clock=clock
    )
    link = machine.device.link
    try:
        await _settled(machine)
        for probe in range(1, 6):
            heard = link.stats.lines
            await _probed(clock, link)
            await until(lambda n=probe: controller.received.count("C,STATUS") == n)
            await until(lambda h=heard: link.stats.lines > h)  # its answer, the one line since
        assert link.stats.reconnects == 0
        assert (await controller.customer("A1")).outcome is VisitOutcome.VENDED
    finally:
        await machine.device.stop()


def test_schema_names_the_wrong_field() -> None:
    config = PLATFORM_SCHEMA(
        {"platform": "mdb", "port": "/dev/ttyUSB0", "flow": "authorize_capture"}
    )
    assert config["address"] == 0x10
    assert config["mode"] == "selection_first"

    with pytest.raises(Exception, match="max_funds"):
        PLATFORM_SCHEMA({"platform": "mdb", "port": "/dev/x", "mode": "card_first",
                         "flow": "authorize_capture"})
    with pytest.raises(Exception, match="flow: authorize_capture"):
        PLATFORM_SCHEMA({"platform": "mdb", "port": "/dev/x", "mode": "card_first",
                         "max_funds": "5.00"})
    with pytest.raises(Exception, match="0x10 or 0x60"):
        PLATFORM_SCHEMA({"platform": "mdb", "port": "/dev/x", "address": "0x33"})


async def test_card_first_customer_leaves_when_no_session_comes(
    controller: VirtualController,
) -> None:
    visit = await controller.card_first_customer("A1", wait=0.05)  # no agent connected at all
    assert visit.outcome is VisitOutcome.WALKED_AWAY
    assert visit.funds_cents is None


# -- out of service, gracefully (the real agent and simulator) ------------------------------------

# Checks every second; out of service after 0.2 s of failing checks, re-checked every 0.1 s.
QUICK_HEALTH = {"health": {"ping_interval": 1, "hold_off": 0.2, "recheck_interval": 0.1}}


def _mdb_trigger(controller: VirtualController, **extra: Any) -> dict[str, Any]:
    return {"platform": "mdb", "name": "front", "port": controller.port, "vend_timeout": 5,
            **extra}


def _sales_started(agent: Agent) -> int:
    return len(list(agent.journal))


@contextlib.asynccontextmanager
async def _serving(
    tmp_path: Path, settings: Any, controller: VirtualController,
    trigger: dict[str, Any] | None = None, **health: Any
) -> AsyncIterator[Agent]:
    """The real agent with an mdb trigger on the machine (``trigger``: more of its options),
    quick checks; the reader enabled."""
    sections = {"health": {**QUICK_HEALTH["health"], **health}}
    async with running_agent(
        tmp_path, settings, [_mdb_trigger(controller, **(trigger or {}))], sections=sections
    ) as agent:
        await asyncio.wait_for(controller.wait_enabled(), 5)
        yield agent


async def test_the_reader_steps_aside_while_the_terminal_is_offline(
    tmp_path: Path, sim: Any, sim_settings: Any, controller: VirtualController
) -> None:
    async with _serving(tmp_path, sim_settings, controller) as agent:
        [platform] = agent.platforms
        assert (await controller.customer("A2")).outcome is VisitOutcome.VENDED

        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/offline")
        # the ping interval is 1 s: within it (and the hold-off) the reader leaves the bus
        await until(lambda: controller.status is Status.INACTIVE)
        assert controller.received[-1] == "C,0"
        state = agent.availability.state("front")
        assert (state.available, state.reason) == (False, "terminal offline")
        assert platform.status()["reader"] == "disabled"
        snapshot = agent.health.snapshot()
        assert "card payment unavailable on SIM-0001: terminal offline" in snapshot.problems
        [shown] = snapshot.availability
        assert (shown.available, shown.changes) == (False, 1)

        # The machine sells for cash now: a customer at it gets no card sale started.
        started = _sales_started(agent)
        waiting = asyncio.create_task(controller.customer("A1"))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        assert _sales_started(agent) == started

        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/online")
        # served once the reader is back (60 s: a guard; that it is back at the first good
        # check is tests/health/test_availability.py's, on its clock: a bound of 2 s here read
        # 2.8 s when the loop was starved)
        visit = await asyncio.wait_for(waiting, 60)
        assert visit.outcome is VisitOutcome.VENDED
        assert agent.availability.state("front").available
        assert [e.kind for e in agent.event_log.recent()] == ["in_service", "out_of_service"]
        assert agent.event_log.recent()[1].detail == {"reason": "terminal offline"}


async def test_a_sale_in_progress_ends_before_the_reader_steps_aside(
    tmp_path: Path, sim: Any, controller: VirtualController
) -> None:
    # few, quick retries: the unreachable service is noticed within a second or so
    settings = settings_from_ready(sim.ready_info(), max_retries=1, backoff_base=0.05)
    # a slow machine: the outage starts mid-vend. The drop (1.5 s) on the machine's own clock,
    # moved once the outage is seen: in real time a starved loop saw the outage after the
    # product was out (the customer done), and the agent's vend timeout is a minute for that
    controller.clock = machine_clock = FakeClock()
    controller.options.dispense_time = 1.5
    async with _serving(tmp_path, settings, controller, trigger={"vend_timeout": 60}) as agent:
        customer = asyncio.create_task(controller.customer("A2"))
        await until(lambda: "C,VEND,2.50" in controller.received)
        # the terminal list stops answering (the sale's own calls still work)
        await sim_call(sim, "POST", "/sim/faults",
                   {"path": "/api/terminal", "method": "GET", "fault": "unavailable",
                    "count": 1000})
        await until(lambda: not agent.availability.state().available)
        assert agent.availability.state().reason.startswith("service unreachable")
        assert not customer.done()  # the vend goes on: the reader has not left the bus
        assert "C,0" not in controller.received[controller.received.index("C,VEND,2.50"):]

        # the product drops: the machine's drop time passes on its clock
        await machine_clock.advance_to(await machine_clock.next_due(pauses_only=False,
                                                                    real_timeout=30))
        visit = await asyncio.wait_for(customer, 30)
        assert visit.outcome is VisitOutcome.VENDED
        # the sale ended: the reader steps aside after it, and its capture went through
        await until(lambda: controller.status is Status.INACTIVE)
        [record] = [r for r in agent.journal if r.product == "A2"]
        await until(lambda: agent.journal.get(record.sale_id).state is SaleState.COMPLETED)

        await sim_call(sim, "DELETE", "/sim/faults")
        await asyncio.wait_for(controller.wait_enabled(), 30)


async def test_an_unwritable_journal_takes_the_reader_off_the_bus(
    tmp_path: Path, sim_settings: Any, controller: VirtualController
) -> None:
    async with _serving(tmp_path, sim_settings, controller) as agent:
        agent.journal.db.execute("PRAGMA query_only = ON")  # every write now fails
        await until(lambda: controller.status is Status.INACTIVE)
        reason = agent.availability.state().reason
        assert reason.startswith("journal not writable:")
        assert agent.health.snapshot().journal.writable is False
        assert agent.event_log.unwritten == 1  # the event itself waits for a writable journal

        agent.journal.db.execute("PRAGMA query_only = OFF")
        await asyncio.wait_for(controller.wait_enabled(), 3)
        kinds = [(e.kind, e.id is not None) for e in agent.event_log.recent()]
        assert kinds == [("in_service", True), ("out_of_service", True)]


async def test_a_key_that_cannot_be_refreshed_starts_out_of_service(
    tmp_path: Path, sim: Any, controller: VirtualController
) -> None:
    info = {**sim.ready_info(), "api_key": "revoked-key", "refresh_token": None}
    settings = settings_from_ready(info)
    async with running_agent(
        tmp_path, settings, [_mdb_trigger(controller)], sections=QUICK_HEALTH
    ) as agent:
        await until(lambda: "API key" in agent.availability.state().reason, timeout=5)
        await until(lambda: controller.status is Status.INACTIVE)
        assert "C,1" not in controller.received  # never joined the bus
        assert any(p.startswith("API key refused") for p in agent.health.snapshot().problems)


async def test_a_service_that_never_answers_is_out_of_service_too(
    tmp_path: Path, sim: Any, controller: VirtualController
) -> None:
    settings = settings_from_ready(sim.ready_info(), max_retries=0)
    async with _serving(tmp_path, settings, controller, ping_timeout=0.5) as agent:
        # every terminal list now hangs 3 s, six times the check timeout
        await sim_call(sim, "POST", "/sim/faults", {"path": "/api/terminal", "method": "GET",
                                                  "fault": "delay", "delay_s": 3, "count": 1000})
        await until(lambda: controller.status is Status.INACTIVE, timeout=5)
        assert agent.availability.state().reason == "service unreachable: timed out"
        await sim_call(sim, "DELETE", "/sim/faults")
        await asyncio.wait_for(controller.wait_enabled(), 3)


async def test_a_controller_that_keeps_asking_while_out_of_service_starts_no_sale(
    tmp_path: Path, sim: Any, sim_settings: Any, controller: VirtualController
) -> None:
    async with _serving(tmp_path, sim_settings, controller) as agent:
        [platform] = agent.platforms
        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/offline")
        await until(lambda: controller.status is Status.INACTIVE)
        # a controller that did not hear C,0 (or ignores it) floods vend requests
        for _ in range(50):
            controller.send(wire.vend_request_line(150, "A1"))
        await until(lambda: platform.status()["denied_out_of_service"] == 50)
        await until(lambda: controller.received.count("C,STOP") == 50)
        assert list(agent.journal) == []
        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/online")
        await asyncio.wait_for(controller.wait_enabled(), 3)


async def test_card_first_opens_no_sale_while_out_of_service(
    tmp_path: Path, sim: Any, sim_settings: Any, controller: VirtualController
) -> None:
    # nobody chooses: an open session ends after 0.5 s (the simulator presents a card at once)
    trigger = _mdb_trigger(controller, mode="card_first", max_funds="5.00",
                           flow="authorize_capture", session_timeout=0.5)
    async with running_agent(tmp_path, sim_settings, [trigger], sections=QUICK_HEALTH) as agent:
        await until(lambda: len(list(agent.journal)) == 1)  # a sale waits for a card
        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/offline")
        # that sale ends (the read fails with the terminal, or the open session times out, never
        # cut short), then the reader steps aside
        await until(lambda: controller.status is Status.INACTIVE, timeout=5)
        await until(lambda: agent.journal.open_sales() == [])
        went_out = agent.event_log.recent(1)[0].at
        await asyncio.sleep(0.5)
        assert [r for r in agent.journal if r.created_at >= went_out] == []

        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/online")
        visit = await controller.card_first_customer("A1", wait=5)
        assert visit.outcome is VisitOutcome.VENDED


async def test_a_customers_session_end_logs_no_info_line_the_controllers_first_enable_does(
    controller: VirtualController, caplog: pytest.LogCaptureFixture
) -> None:
    # ENABLED after every customer is routine (the sale logs its own end): at INFO it was a
    # line a sale, some 0.15 ms on the way to the next customer; the controller's first enable
    # after the link came up is news, and stays at INFO
    caplog.set_level(logging.INFO, logger="kiosk_agent.platforms.mdb")
    machine = await make_machine(controller, vend_timeout=0.5)

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.name == "kiosk_agent.platforms.mdb" and r.levelno >= logging.INFO]

    try:
        # the setup's states, each said once: reset, configured, enabled
        started = ["mdb:test: controller INACTIVE", "mdb:test: controller DISABLED",
                   "mdb:test: controller enabled"]
        await until(lambda: said() == started)
        for product in ("A2", "A1", "B1"):
            assert (await machine.controller.customer(product)).outcome is VisitOutcome.VENDED
        finals = await asyncio.wait_for(machine.desk.settled(), 5)
        assert [f.state for f in finals] == [SaleState.COMPLETED] * 3
        assert said() == started  # nothing more for the three customers
    finally:
        await machine.device.stop()
