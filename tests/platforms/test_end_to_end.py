"""The platforms with the real Agent and the simulator: real HTTP, WebSocket, SQLite and ptys."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.platforms.mdb import MdbPlatform
from kiosk_agent.platforms.virtual import VirtualPlatform
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import SaleState
from kiosk_agent.sim.machine import VirtualController, VisitOutcome
from tests.assembly.test_slow_service import arm_cleared, held_by_the_service, ledger

from ..helpers import sim_call, until
from .agent_rig import (
    front,
    front_link,
    losing_authorization_answers,
    running_agent,
    stopped_on_failure,
    until_final,
    vend_asked,
)
from .test_serial_line import MDB_AS_LINES

GUARD_S = 60.0  # a hang's guard in real time, never a bound (a starved loop takes 10-20 s)


async def _final_events(
    agent: Any, count: int, timeout: float = 10.0, *, stall: float | None = None
) -> list[SaleEvent]:
    """The first ``count`` final events. Within ``timeout`` in all; or, with ``stall``, as long
    as each event comes within ``stall`` of the one before (a hang fails, a slow machine not)."""
    finals: list[SaleEvent] = []
    async with agent.events.subscribe() as queue, asyncio.timeout(None if stall else timeout):
        while len(finals) < count:
            event = await asyncio.wait_for(queue.get(), stall)
            if event.state.final:
                finals.append(event)
    return finals


async def test_mdb_sales_through_the_agent(
    tmp_path: Path, sim_settings: Any, controller: VirtualController
) -> None:
    trigger = {
        "platform": "mdb",
        "name": "front",
        "port": controller.port,
        "flow": "authorize_capture",
        "vend_timeout": 5,
    }
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        [platform] = agent.platforms
        assert isinstance(platform, MdbPlatform)
        await asyncio.wait_for(controller.wait_enabled(), 5)
        collector = asyncio.create_task(_final_events(agent, 3))
        vended = await controller.customer("A2")
        declined = await controller.customer("D2")  # ..02 cents: the simulator declines
        failed = await controller.customer("B1", fail=True)
        # in the customers' order: a capture waits while the next customer waits for an answer
        completed, refused, reversed_ = sorted(await collector, key=lambda e: e.created_at)

        assert vended.outcome is VisitOutcome.VENDED
        assert completed.state is SaleState.COMPLETED
        assert completed.captured_cents == 250
        assert completed.source == "mdb:front"
        assert declined.outcome is VisitOutcome.DENIED
        assert refused.state is SaleState.DECLINED
        assert failed.outcome is VisitOutcome.FAILED
        assert reversed_.state is SaleState.REVERSED
        snapshot = agent.health.snapshot()
        [link] = [lk for lk in snapshot.links if lk.name == "mdb:front"]
        assert link.state == "connected"
        assert platform.status()["outcomes"] == {"vended": 1, "failed": 1, "cancelled": 1}


async def test_the_next_customer_is_served_while_the_last_capture_is_in_flight(
    tmp_path: Path, sim: Any, sim_settings: Any, controller: VirtualController
) -> None:
    # The service is slow on the capture alone: the next selection's card is read, authorized
    # and vended while the last customer's capture is still with the service.
    await sim_call(sim, "POST", "/sim/faults",
                   {"path": "/api/v1/capture", "fault": "delay", "delay_s": 0.5})
    trigger = front(controller, vend_timeout=5)
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        await asyncio.wait_for(controller.wait_enabled(), 5)
        collector = asyncio.create_task(_final_events(agent, 2))
        first = await controller.customer("A2")
        second = await controller.customer("A1")  # at once

        assert first.outcome is VisitOutcome.VENDED
        assert second.outcome is VisitOutcome.VENDED
        [capturing, served] = sorted(agent.journal.query(), key=lambda r: r.created_at)
        assert capturing.state is SaleState.CAPTURING  # its capture is still in flight
        steps = [s.step for s in agent.journal.steps(served.sale_id)]
        assert "read_card.done" in steps
        assert "dispense.request" in steps
        finals = {e.sale_id: e for e in await collector}
        assert finals[capturing.sale_id].captured_cents == 250
        assert finals[served.sale_id].captured_cents == 150


def open_sales_of(agent: Any, source: str) -> dict[str, str]:
    """What the journal holds of a trigger's sales not ended yet."""
    return {r.sale_id: r.state.value for r in agent.journal.open_sales() if r.source == source}


# the virtual controller's machine as each serial platform sees it (its port added), and the
# status field that says the machine is busy with a customer
MACHINES = {
    "mdb": ({"platform": "mdb", "name": "front", "flow": "authorize_capture", "vend_timeout": 5},
            "session"),
    "serial_line": ({**MDB_AS_LINES, "flow": "authorize_capture", "vend_timeout": 5}, "vending"),
}  # fmt: skip


@pytest.mark.parametrize("kind", MACHINES)
async def test_the_status_shows_the_sale_still_capturing_once_the_machine_is_done(
    tmp_path: Path, sim: Any, sim_settings: Any, controller: VirtualController, kind: str
) -> None:
    # The customer has the goods and the machine's session is over ("session: none"); the
    # sale still captures. What the status shows is what the journal holds: both.
    trigger, machine_busy = MACHINES[kind]
    await sim_call(sim, "POST", "/sim/faults",
                   {"path": "/api/v1/capture", "fault": "delay", "delay_s": 0.5})
    async with running_agent(
        tmp_path, sim_settings, [{**trigger, "port": controller.port}]
    ) as agent:
        [platform] = agent.platforms
        await asyncio.wait_for(controller.wait_enabled(), 5)
        ending = asyncio.create_task(_final_events(agent, 1))
        assert (await controller.customer("A2")).outcome is VisitOutcome.VENDED
        await until(lambda: not platform.status()[machine_busy])
        status, held = platform.status(), open_sales_of(agent, platform.name)
        assert list(held.values()) == ["capturing"]
        assert status["open_sales"] == held
        [final] = await ending
        assert final.state is SaleState.COMPLETED
        assert platform.status()["open_sales"] == open_sales_of(agent, platform.name) == {}


@pytest.mark.parametrize("kind", MACHINES)
async def test_the_next_customer_is_served_while_a_lost_authorization_is_found_out(
    tmp_path: Path, sim_factory: Any, controller: VirtualController, kind: str
) -> None:
    # The authorization's answer is lost (the service commits it late): the machine is told not
    # to vend, and the reader serves the next customer while reporting is asked what became of
    # the hold. The agent's clock is a FakeClock: it gives up on the call when the test says.
    sim, settings, clock = await losing_authorization_answers(sim_factory)
    trigger = {**MACHINES[kind][0], "port": controller.port}
    sales = {"vend_timeout": 5.0, "answer_margin": 3.0}
    async with running_agent(
        tmp_path, settings, [trigger], time_scale=300, sales=sales, clock=clock
    ) as agent, stopped_on_failure(agent, clock):
        await asyncio.wait_for(controller.wait_enabled(), GUARD_S)
        visit = asyncio.create_task(controller.customer("A2"))
        await held_by_the_service(sim)
        await clock.advance(2.0)  # the agent gives up on the authorization
        assert (await asyncio.wait_for(visit, GUARD_S)).outcome is VisitOutcome.DENIED
        await clock.next_due()  # no row yet: looking again later
        [lost] = agent.journal.query()
        assert lost.state is SaleState.UNRESOLVED
        await arm_cleared(sim)  # the service commits it now, its answer going to nobody

        served = await asyncio.wait_for(controller.customer("A1"), GUARD_S)
        assert served.outcome is VisitOutcome.VENDED
        assert agent.journal.get(lost.sale_id).state is SaleState.UNRESOLVED  # type: ignore[union-attr]

        async with asyncio.timeout(GUARD_S):
            while not await ledger(agent, lost.order_id):  # the late authorization
                await asyncio.sleep(0.01)
        await clock.run(until_final(agent, lost.sale_id))
        # the second's capture too: served (vended) is not captured yet on a starved loop
        [served_id] = [r.sale_id for r in agent.journal.query() if r.sale_id != lost.sale_id]
        await clock.run(until_final(agent, served_id))
        records = {r.sale_id: r for r in agent.journal.query()}
        assert records[lost.sale_id].state is SaleState.REVERSED
        [second] = [r for r in records.values() if r.sale_id != lost.sale_id]
        assert second.state is SaleState.COMPLETED
        assert second.captured_cents == 150




async def test_virtual_platform_card_first(tmp_path: Path, sim_settings: Any) -> None:
    trigger = {
        "platform": "virtual",
        "name": "lobby",
        "mode": "card_first",
        "flow": "authorize_capture",
        "max_funds": "5.00",
        "customers": False,
        "dispense_time": 0.01,
    }
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        [platform] = agent.platforms
        assert isinstance(platform, VirtualPlatform)
        collector = asyncio.create_task(_final_events(agent, 1))
        visit = await platform.controller.card_first_customer("A1", wait=10)
        [final] = await collector

        assert visit.funds_cents == 500
        assert visit.outcome is VisitOutcome.VENDED
        assert final.state is SaleState.COMPLETED
        assert final.amount_cents == 500
        assert final.captured_cents == 150
        # chosen after the card: the sale names it once the machine does (the export's
        # product column and the page were empty for every sale of such a machine)
        assert final.product == "A1"
        assert agent.journal.get(final.sale_id).product == "A1"


# Sales in the soak, and those sold before its resources are first counted (the service's
# connections and the agent's lazily made parts are made by the first ones). 300 take every path
# dozens of times (about 30 failed vends, 75 declines); a leak a thousand sales would have shown
# by running out of a limit (1024 file descriptors) shows here as growth between the counts.
SOAK_SALES = 300
SOAK_WARM_UP = 50
LEAK_ALLOWANCE = 5  # open fds, tasks or threads at the end beyond the first count: in flight


def _resources() -> dict[str, int]:
    """What a sale could leak, one per sale: file descriptors, asyncio tasks, threads."""
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "tasks": len(asyncio.all_tasks()),
        "threads": threading.active_count(),
    }


@pytest.mark.slow
@pytest.mark.timeout(900)  # a loaded machine is slow, not wrong: only a stall (below) fails it
async def test_hundreds_of_sales_through_the_agent_none_lost_none_doubled_nothing_leaked(
    tmp_path: Path, sim_factory: Any, controller: VirtualController
) -> None:
    sim = await sim_factory(time_scale=1000, rate_limit="100000/1")
    trigger = {"platform": "mdb", "name": "soak", "port": controller.port,
               "flow": "authorize_capture"}
    controller.options.dispense_time = 0.0
    rng = random.Random(3)
    count = SOAK_SALES
    started = time.monotonic()
    settings = settings_from_ready(sim.ready_info(), rate_limit=10_000, rate_burst=10_000)
    async with running_agent(tmp_path, settings, [trigger], time_scale=1000) as agent:
        await asyncio.wait_for(controller.wait_enabled(), 5)
        collector = asyncio.create_task(_final_events(agent, count, stall=60))
        for n in range(count):
            if n == SOAK_WARM_UP:
                warm = _resources()
            await controller.customer(rng.choice(["A1", "A2", "B1", "D2"]),
                                      fail=rng.random() < 0.1)
        finals = await collector
        journaled = agent.journal.query()
        after = _resources()
    elapsed = time.monotonic() - started
    print(f"{count} sales through the agent in {elapsed:.1f}s; {warm} -> {after}")
    leaked = {k: after[k] - warm[k] for k in warm if after[k] - warm[k] > LEAK_ALLOWANCE}
    assert leaked == {}, f"grew over {count - SOAK_WARM_UP} sales: {warm} -> {after}"
    assert len(journaled) == count
    assert all(record.state.final for record in journaled)
    assert len(finals) == count
    assert len({f.sale_id for f in finals}) == count
    assert len({f.order_id for f in finals}) == count
    # in the customers' order: a capture waits while the next customer waits for an answer
    finals.sort(key=lambda f: f.created_at)
    for visit, final in zip(controller.visits, finals, strict=True):
        assert final.product == visit.product
        expected = {
            VisitOutcome.VENDED: SaleState.COMPLETED,
            VisitOutcome.FAILED: SaleState.REVERSED,
            VisitOutcome.DENIED: SaleState.DECLINED,
        }[visit.outcome]  # type: ignore[index]
        assert final.state is expected, (visit, final)
        assert final.captured_cents == (
            visit.price_cents if visit.outcome is VisitOutcome.VENDED else 0
        )
    outcomes = {visit.outcome for visit in controller.visits}
    assert outcomes == {VisitOutcome.VENDED, VisitOutcome.FAILED, VisitOutcome.DENIED}


async def test_unplugged_adapter_shows_in_health_and_comes_back(
    tmp_path: Path, sim_settings: Any, controller: VirtualController
) -> None:
    trigger = front(controller)
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        await asyncio.wait_for(controller.wait_enabled(), 5)

        controller.unplug()
        async with asyncio.timeout(3):
            while front_link(agent).state != "disconnected":
                await asyncio.sleep(0.01)
        assert any("mdb:front" in problem for problem in agent.health.snapshot().problems)

        controller.plug()
        await asyncio.wait_for(controller.wait_enabled(), 3)
        assert front_link(agent).state == "connected"
        collector = asyncio.create_task(_final_events(agent, 1))
        assert (await controller.customer("A1")).outcome is VisitOutcome.VENDED
        [final] = await collector
        assert final.state is SaleState.COMPLETED


async def test_controller_reset_mid_vend_voids_through_the_agent(
    tmp_path: Path, sim_settings: Any, controller: VirtualController
) -> None:
    trigger = front(controller)
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        await asyncio.wait_for(controller.wait_enabled(), 5)
        controller.options.dispense_time = 0.3
        collector = asyncio.create_task(_final_events(agent, 1))
        visit_task = asyncio.create_task(controller.customer("B1"))
        await vend_asked(controller)
        controller.reset()
        visit = await visit_task
        [final] = await collector

        assert visit.outcome is VisitOutcome.ABORTED
        assert final.state is SaleState.REVERSED
        assert final.captured_cents == 0
        assert "inactive mid-session" in final.message


async def test_card_first_session_timeout_voids_through_the_agent(
    tmp_path: Path, sim_settings: Any, controller: VirtualController
) -> None:
    trigger = {"platform": "mdb", "name": "lobby", "port": controller.port, "mode": "card_first",
               "max_funds": "5.00", "flow": "authorize_capture", "session_timeout": 0.2}
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        [final] = await _final_events(agent, 1)
        assert final.state is SaleState.REVERSED
        assert final.amount_cents == 500
        assert "session timeout" in final.message
        assert "C,START,5.00" in controller.received
        # the session's end goes to the controller beside the sale's end, not before it: on a
        # loaded machine the final event came while C,STOP was still in the pty
        await until(lambda: "C,STOP" in controller.received)


async def test_a_vend_requests_sale_is_journaled_and_running_in_the_turn_its_line_is_read(
    tmp_path: Path, sim_settings: Any, controller: VirtualController
) -> None:
    # vend request -> approve: the customer's sale is journaled with its read-card request and
    # its task made in the callback that read the request's line, its first step run there to
    # the read-card's request (aiohttp's body writer made: the request is on the wire at the
    # next turn), and no other task: a task of the line's own before it took a loop turn of the
    # customer's wait, so did the sale task's first step a turn later, and the platform's task
    # that follows the sale is made at its release, after the machine is answered
    trigger = front(controller, vend_timeout=5)
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        [platform] = agent.platforms
        assert isinstance(platform, MdbPlatform)
        link = platform.device.link
        await asyncio.wait_for(controller.wait_enabled(), 5)
        loop = asyncio.get_running_loop()
        made: list[str] = []  # the coroutines made tasks of while a line is handled
        handling = False

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
            if handling:
                made.append(coro.__qualname__)
            return asyncio.Task(coro, loop=loop, **kwargs)

        at_its_line: list[list[tuple[str, str]]] = []  # the open sales once the line is handled
        real_on_line = link._on_line

        def on_line(line: str) -> None:
            nonlocal handling
            handling = True
            try:
                real_on_line(line)
            finally:
                handling = False
            if line.startswith("c,STATUS,VEND,"):
                at_its_line.append([(sale.state.value, sale.product or "")
                                    for sale in agent.journal.open_sales()])

        link._on_line = on_line
        loop.set_task_factory(factory)
        try:
            visit = await controller.customer("A2")
        finally:
            loop.set_task_factory(None)
            link._on_line = real_on_line
        assert visit.outcome is VisitOutcome.VENDED
        assert at_its_line == [[("reading_card", "A2")]]
        # aiohttp writes the body in a task of its own: on Python 3.11 made by the loop's task
        # factory (on the wire a turn later), from 3.12 on started eagerly, past the factory
        # (written inside the line's callback, as the sale's first step runs there)
        writer = ["ClientRequest.write_bytes"] if sys.version_info < (3, 12) else []
        assert made == ["SaleRunner._run", *writer]
        # the platform still follows the sale to its end: the session is over, the sale done
        await until(lambda: platform.status()["session"] is None)
        await until_final(agent, agent.journal.query()[0].sale_id)
