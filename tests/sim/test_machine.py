"""The simulated vending machine on its in-memory transport: the agent's side played line by line
through ``feed``, the machine's lines read from the wire. No pty, no socket: the pty-based tests
in tests/platforms/ hold the same machine to the real serial line."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kiosk_agent.platforms import mdb_protocol as wire
from kiosk_agent.sim.machine import (
    ControllerOptions,
    Status,
    VirtualController,
    VisitOutcome,
    make_machine,
)


class ListWire:
    """The machine's side of the wire: every line it wrote, and a way to wait for one."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.changed = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.lines += [line for line in data.decode("ascii").split("\n") if line]
        self.changed.set()

    async def next_matching(self, prefix: str) -> str:
        async with asyncio.timeout(2):
            while True:
                found = [line for line in self.lines if line.startswith(prefix)]
                if found:
                    self.lines.remove(found[0])
                    return found[0]
                self.changed.clear()
                await self.changed.wait()


def agent_says(machine: VirtualController, *lines: str) -> None:
    machine.feed("".join(line + "\n" for line in lines).encode("ascii"))


async def enabled_machine(**options: Any) -> tuple[VirtualController, ListWire]:
    machine = VirtualController(
        ControllerOptions(dispense_time=0.0, enable_delay=0.0, step_up_time=0.0, **options),
        seed=1,
    )
    line = ListWire()
    machine.attach(line)
    agent_says(machine, *wire.setup_commands(0x10))
    await asyncio.wait_for(machine.wait_enabled(), 2)
    return machine, line


async def test_the_agents_setup_enables_the_reader() -> None:
    machine, line = await enabled_machine()
    assert await line.next_matching("r,ACK") == "r,ACK"  # C,SETCONF
    assert await line.next_matching("c,STATUS,ENABLED") == wire.status_line(Status.ENABLED)
    assert machine.status is Status.ENABLED
    assert machine.connected


async def test_an_approved_selection_is_dispensed_and_counted_in_the_books() -> None:
    machine, line = await enabled_machine()
    visiting = asyncio.create_task(machine.customer("A2"))
    assert await line.next_matching("c,STATUS,VEND") == wire.vend_request_line(250, "A2")
    agent_says(machine, wire.approve_vend(250))
    visit = await asyncio.wait_for(visiting, 2)
    assert (visit.outcome, visit.approved_cents) == (VisitOutcome.VENDED, 250)
    assert await line.next_matching("c,VEND,") == "c,VEND,SUCCESS"
    assert machine.tally()["vended"] == 1


@pytest.mark.parametrize(("knob", "outcome", "said"), [
    ({"fail": True}, VisitOutcome.FAILED, "c,ERR,VEND"),
    ({"no_result": True}, VisitOutcome.NO_RESULT, None),
])
async def test_a_failed_or_silent_vend_is_what_the_machine_says(
    knob: dict[str, bool], outcome: VisitOutcome, said: str | None
) -> None:
    machine, line = await enabled_machine()
    visiting = asyncio.create_task(machine.customer("A1", **knob))
    await line.next_matching("c,STATUS,VEND")
    agent_says(machine, wire.approve_vend(150))
    assert (await asyncio.wait_for(visiting, 2)).outcome is outcome
    if said is not None:
        assert (await line.next_matching(said)).startswith(said)
    else:
        assert not [text for text in line.lines if text.startswith("c,VEND")]


async def test_a_denied_selection_ends_the_session() -> None:
    machine, line = await enabled_machine()
    visiting = asyncio.create_task(machine.customer("B1"))
    await line.next_matching("c,STATUS,VEND")
    agent_says(machine, wire.deny_vend())
    assert (await asyncio.wait_for(visiting, 2)).outcome is VisitOutcome.DENIED
    assert await line.next_matching("c,STATUS,ENABLED")


async def test_a_reset_mid_session_aborts_the_visit() -> None:
    machine, line = await enabled_machine()
    visiting = asyncio.create_task(machine.customer("A1"))
    await line.next_matching("c,STATUS,VEND")
    machine.reset()
    assert (await asyncio.wait_for(visiting, 2)).outcome is VisitOutcome.ABORTED
    assert await line.next_matching("c,STATUS,INACTIVE")


async def test_card_first_the_agents_session_offers_the_funds() -> None:
    machine, line = await enabled_machine()
    visiting = asyncio.create_task(machine.card_first_customer("A1", wait=2))
    agent_says(machine, wire.start_session(500))
    assert await line.next_matching("c,STATUS,IDLE") == wire.status_line(Status.IDLE, 500)
    assert await line.next_matching("c,STATUS,VEND") == wire.vend_request_line(150, "A1")
    agent_says(machine, wire.approve_vend(150))
    visit = await asyncio.wait_for(visiting, 2)
    assert (visit.outcome, visit.funds_cents, visit.approved_cents) == (
        VisitOutcome.VENDED, 500, 150)


async def test_a_customer_who_steps_up_after_the_machine_closed_chooses_nothing() -> None:
    """`demo --sales 4` showed 5 sales at load 10-13: the 4th customer's choice closes every
    machine, and a customer on another one, waiting to step up, chose once woken."""
    machine = VirtualController(
        ControllerOptions(dispense_time=0.0, enable_delay=0.0, step_up_time=0.0), seed=1
    )
    line = ListWire()
    machine.attach(line)
    visiting = asyncio.create_task(machine.customer("A2"))  # waits for the reader
    await asyncio.sleep(0)
    machine.close()  # another machine's customer was the last one
    agent_says(machine, *wire.setup_commands(0x10))
    visit = await asyncio.wait_for(visiting, 2)
    assert visit.outcome is VisitOutcome.WALKED_AWAY
    assert not [text for text in line.lines if text.startswith("c,STATUS,VEND")]


async def test_a_card_first_customer_offered_a_session_after_the_close_chooses_nothing() -> None:
    machine, line = await enabled_machine()
    visiting = asyncio.create_task(machine.card_first_customer("A1", wait=2))
    await asyncio.sleep(0)
    machine.close()
    agent_says(machine, wire.start_session(500))  # the agent's session, offered meanwhile
    visit = await asyncio.wait_for(visiting, 2)
    assert visit.outcome is VisitOutcome.WALKED_AWAY
    assert not [text for text in line.lines if text.startswith("c,STATUS,VEND")]
    assert machine.status is Status.ENABLED  # the session ends unused: the agent gives it back


async def test_an_unknown_command_is_answered_with_an_error_and_kept() -> None:
    machine, line = await enabled_machine()
    agent_says(machine, "C,FROBNICATE")
    assert await line.next_matching("c,ERR") == "c,ERR,unknown command"
    assert machine.unexpected == ["C,FROBNICATE"]


def test_the_clis_factory_makes_the_machine_the_trigger_asks_for() -> None:
    machine = make_machine(products={"A1": 125}, dispense_time=0.1, dex=False, seed=3)
    assert machine.options.products == {"A1": 125}
    assert machine.options.dispense_time == 0.1
    assert machine.dex is None
    assert not machine.plugged  # made, not started: the platform starts it


async def test_a_column_sells_no_more_than_it_holds_and_the_tech_refills_after_a_read() -> None:
    # The demo showed a column sold 10 since its refill with a capacity of 8: the machine's
    # customers chose any column, empty or not. Now a column sold out is chosen by nobody, and
    # once every one is, the tech comes (the agent reads the books, then records the refill).
    from kiosk_agent.audit.books import figures_of
    from kiosk_agent.audit.evadts import parse_audit

    machine, _ = await enabled_machine(products={"A1": 150, "A2": 250, "B1": 325})
    capacity = {"A1": 2, "A2": 1, "B1": 3}
    sold_at_refill: list[dict[str, int]] = []

    async def tech_reads_the_books() -> None:
        assert machine.stock == {"A1": 0, "A2": 0, "B1": 0}  # every column sold out
        columns = figures_of(parse_audit(machine.books.audit_file())).columns
        sold_at_refill.append({name: c.paid.since_init.count for name, c in columns.items()
                               if c.paid is not None and c.paid.since_init is not None})

    machine.stock_columns(capacity, before_refill=tech_reads_the_books)
    await asyncio.wait_for(machine.random_customers(18, gap=(0, 0), cash_rate=1.0), 10)
    # 18 customers served: the columns hold 6, emptied three times, refilled before the 7th
    # and the 13th (never after the last: no customer came for it)
    assert sold_at_refill == [capacity, {name: 2 * n for name, n in capacity.items()}]
    assert machine.stock == {"A1": 0, "A2": 0, "B1": 0}
    assert machine.books.vends("cash") == 18
    # a column no capacity names never runs out; the named one is refilled once sold out
    refills: list[int] = []

    async def counted() -> None:
        refills.append(machine.books.vends("cash"))

    machine.stock_columns({"A1": 1}, before_refill=counted)
    await asyncio.wait_for(machine.random_customers(30, gap=(0, 0), cash_rate=1.0), 10)
    assert machine.books.vends("cash") == 18 + 30
    a1 = figures_of(parse_audit(machine.books.audit_file())).columns["A1"].paid
    assert a1 is not None
    assert a1.since_init is not None
    sold_a1 = a1.since_init.count - 6  # the first part's
    assert len(refills) in (sold_a1 - 1, sold_a1)  # one refill after each A1, bar the last
    assert machine.stock["A1"] in (0, 1)
