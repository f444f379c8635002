"""The machine's books against the journal end to end: the virtual vending machine over a real
pty, the agent's mdb platform and sale flows, the simulator over HTTP; the machine's audit read
by the agent's scheduler over the machine's DEX port (a pty of its own, DEX/UCS or DDCMP). A
vend the agent never heard of, and one the machine never made, each caught as a mismatch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.audit.component import AuditReads
from kiosk_agent.audit.ddcmp import DdcmpSlave
from kiosk_agent.audit.dexucs import DexSlave
from kiosk_agent.audit.schema import DEX_SCHEMA
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.models import TransactionFilter, TransStatus
from kiosk_agent.sim.machine import VirtualController, VisitOutcome
from tests.assembly.conftest import agent_factory

__all__ = ["agent_factory"]  # the real agent on the simulator, as tests/assembly has it

MACHINE = """\
triggers:
  - platform: virtual
    name: snacks
    terminal: front
    flow: authorize_capture
    customers: false
    dex: true
    dispense_time: 0.01
    products: {A1: "1.50", A2: "2.50"}
"""
BOOKS = DEX_SCHEMA({"port": "virtual:snacks", "trigger": "snacks", "first_read": 3600.0,
                   "interval": 3600.0, "deadline": 30.0})


async def machine_and_books(
    agent_factory: Any, protocol: str = "dex_ucs"
) -> tuple[Agent, VirtualController, AuditReads]:
    agent: Agent = await agent_factory(MACHINE)
    controller: VirtualController = agent.platforms[0].controller  # type: ignore[attr-defined]
    books = AuditReads(agent, {**BOOKS, "protocol": protocol})  # the real link on its DEX pty
    await books.start()
    agent.components.append(books)  # stopped with the agent
    await controller.wait_enabled()
    return agent, controller, books


async def served(agent: Agent, controller: VirtualController, product: str, **knobs: Any) -> None:
    """One card customer, and the agent's sale of them ended."""
    visit = await asyncio.wait_for(controller.customer(product, **knobs), 20)
    assert visit.outcome in (VisitOutcome.VENDED, VisitOutcome.FAILED)
    async with asyncio.timeout(20):
        while agent.sales.running:
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("protocol", ["dex_ucs", "ddcmp"])
async def test_a_vend_the_agent_never_heard_of_is_a_mismatch(
    agent_factory: Any, protocol: str
) -> None:
    agent, controller, books = await machine_and_books(agent_factory, protocol)
    await books.read_once()
    await served(agent, controller, "A1")
    await served(agent, controller, "A2", unheard=True)  # dropped; the agent gave the money back
    await controller.cash_customer("A1")  # cash: no part of the comparison
    recorded = await books.read_once()
    assert recorded is not None
    comparison = recorded.comparison
    assert comparison is not None
    assert comparison.verdict == "mismatch"
    assert "the machine counted 2 card vends worth $4.00" in comparison.text()
    assert "the journal holds 1 card vend worth $1.50" in comparison.text()
    [kept] = comparison.sales
    assert agent.journal.get(kept.sale_id).state is SaleState.COMPLETED  # type: ignore[union-attr]
    problems = agent.health.snapshot().problems
    assert any(p.startswith("audit mismatch on snacks: the machine counted 2") for p in problems)
    assert books.vends == {"cash": 1, "cashless": 2}
    assert controller.dex is not None  # read in the protocol asked
    assert isinstance(controller.dex.slave, DdcmpSlave if protocol == "ddcmp" else DexSlave)


async def test_a_vend_the_machine_never_made_is_a_mismatch(agent_factory: Any) -> None:
    agent, controller, books = await machine_and_books(agent_factory)
    await books.read_once()
    await served(agent, controller, "A1", phantom=True)  # captured; nothing dropped
    recorded = await books.read_once()
    assert recorded is not None
    comparison = recorded.comparison
    assert comparison is not None
    assert comparison.verdict == "mismatch"
    assert "the machine counted 0 card vends worth $0.00" in comparison.text()
    assert "the journal holds 1 card vend worth $1.50" in comparison.text()
    # a person is told; no money moves on the machine's word alone (docs/audit.md): the sale
    # stays paid in the journal and at the service, after the charge check has looked too
    problems = agent.health.snapshot().problems
    assert any(p.startswith("audit mismatch on snacks: the machine counted 0") for p in problems)
    await agent.journal_guard.audit.check()
    [kept] = comparison.sales
    record = agent.journal.get(kept.sale_id)
    assert record is not None
    assert (record.state, record.captured_cents, record.reversed_cents) == (
        SaleState.COMPLETED, 150, 0
    )
    query = TransactionFilter(order_id=record.order_id)
    rows = [t async for t in agent.service.reporting.transactions(query)]
    assert [(t.status, t.amount_cents) for t in rows] == [(TransStatus.CAPTURED, 150)]


async def test_honest_vends_match(agent_factory: Any) -> None:
    agent, controller, books = await machine_and_books(agent_factory)
    await books.read_once()
    for product in ("A1", "A2", "A1"):
        await served(agent, controller, product)
    await served(agent, controller, "A2", fail=True)  # nothing dropped: the money went back
    recorded = await books.read_once()
    assert recorded is not None
    assert recorded.comparison is not None
    assert recorded.comparison.verdict == "match"
    assert recorded.comparison.machine == recorded.comparison.journal


@pytest.mark.parametrize("protocol", ["dex_ucs", "ddcmp"])
async def test_a_dex_section_reads_the_machine_from_the_start(
    agent_factory: Any, protocol: str
) -> None:
    agent: Agent = await agent_factory(MACHINE + f"""
dex:
  port: virtual:snacks
  protocol: {protocol}
  trigger: snacks
  first_read: 0
  planogram: {{A1: 5, A2: 1}}
  low_stock: 1
""")
    [books] = [c for c in agent.components if isinstance(c, AuditReads)]
    controller: VirtualController = agent.platforms[0].controller  # type: ignore[attr-defined]
    async with asyncio.timeout(20):
        while books.reads["ok"] == 0:
            await books.done.wait()
            books.done.clear()
    audit = agent.health.snapshot().audit
    assert audit is not None
    assert (audit.machine, audit.last_outcome, audit.low) == ("snacks", "ok", ["A2"])
    assert controller.dex is not None
    assert controller.dex.reads == controller.dex.slave.reads == 1  # in the protocol asked
    assert isinstance(controller.dex.slave, DdcmpSlave if protocol == "ddcmp" else DexSlave)


async def test_a_sale_never_waits_for_a_read_that_hangs(agent_factory: Any) -> None:
    from kiosk_agent.audit.books import Figures
    from kiosk_agent.audit.component import Port

    agent: Agent = await agent_factory(MACHINE)
    controller: VirtualController = agent.platforms[0].controller  # type: ignore[attr-defined]
    await controller.wait_enabled()
    asked, answer = asyncio.Event(), asyncio.Event()

    async def hanging_port() -> bytes:  # a machine that takes the read and never answers
        asked.set()
        await answer.wait()
        return b""

    port = Port(hanging_port, lambda _: Figures())
    books = AuditReads(agent, {"trigger": "snacks", "deadline": 3600.0}, port)
    await books.start()
    agent.components.append(books)
    reading = asyncio.ensure_future(books.read_once())
    await asyncio.wait_for(asked.wait(), 10)
    await served(agent, controller, "A1")  # the whole sale, while the read hangs
    assert not reading.done()
    [sale] = agent.journal.query()
    assert sale.state is SaleState.COMPLETED
    answer.set()
    recorded = await asyncio.wait_for(reading, 10)
    assert recorded is not None
    assert not recorded.read.clean  # a sale ran during it: stored, no comparison boundary


async def test_the_machines_columns_hold_the_planogram_and_its_tech_reads_before_refilling(
    agent_factory: Any,
) -> None:
    # The demo showed a column sold 10 since its refill with a capacity of 8: the virtual
    # machine sold from columns long empty. Its columns hold the planogram of the dex: section
    # reading it; sold out, its tech has the agent read the books and record the refill.
    agent: Agent = await agent_factory(MACHINE + """
dex:
  port: virtual:snacks
  trigger: snacks
  first_read: 3600
  planogram: {A1: 2, A2: 1}
""")
    [books] = [c for c in agent.components if isinstance(c, AuditReads)]
    controller: VirtualController = agent.platforms[0].controller  # type: ignore[attr-defined]
    assert controller.stock == {"A1": 2, "A2": 1}
    await books.read_once()  # the base: the columns full
    # cash customers (the agent takes no part): 3 empty both columns, the 4th finds the tech
    # has come (a read, the refill recorded) and takes one of the full columns again
    await asyncio.wait_for(controller.random_customers(4, gap=(0, 0), cash_rate=1.0), 20)
    fills = books.store.last_fills()
    assert {name: f.by for name, f in fills.items()} == {
        "A1": "the virtual machine's tech", "A2": "the virtual machine's tech"}
    at_refill = books.store.read(fills["A1"].read_id)
    assert at_refill is not None
    assert {n: c.paid.since_init.count for n, c in at_refill.figures.columns.items()} == {
        "A1": 2, "A2": 1}  # read when both were sold out, just before the refill
    await books.read_once()
    stock = {s.column: (s.capacity, s.sold_since_fill) for s in books.stock()}
    # since the refill: the 4th customer's column sold 1, the other none, none past capacity
    assert sorted(sold for _, sold in stock.values()) == [0, 1]
    assert all(sold is not None and sold <= capacity for capacity, sold in stock.values())


async def test_the_machines_books_cleared_are_a_new_baseline_said_once_and_mismatches_still_caught(
    agent_factory: Any,
) -> None:
    """The machine's memory cleared between two reads (its books start again from 0, as the
    demo's machine does each run): a reset of its books, said once, no problem and no mismatch;
    the next read compares from it, and a vend the agent never heard is caught again."""
    agent, controller, books = await machine_and_books(agent_factory)
    await books.read_once()
    await served(agent, controller, "A1")
    await served(agent, controller, "A2")
    await books.read_once()  # DA2 since initialisation: 2 worth $4.00
    await served(agent, controller, "A2")
    controller.books.cold_start()  # DA2 since initialisation: 0
    await served(agent, controller, "A1")
    recorded = await books.read_once()
    assert recorded is not None
    reset = recorded.comparison
    assert reset is not None
    assert (reset.verdict, reset.machine) == ("books_reset", None)
    # the journal's side of that interval: its two sales, as its rows hold them
    held = [agent.journal.get(s.sale_id) for s in reset.sales]
    assert [(r.product, r.vended_cents) for r in held if r is not None] == [("A2", 250),
                                                                           ("A1", 150)]
    assert "went down (2 worth $4.00 -> 1 worth $1.50)" in reset.text()
    assert "the journal's 2 card vends worth $4.00 of that interval are not checked" in (
        reset.text())
    health = agent.health.snapshot()
    assert health.audit is not None
    assert health.audit.books_reset == reset.text()
    assert not any("audit" in p for p in health.problems), health.problems
    assert [e.detail["text"] for e in agent.event_log.recent(kind="books_reset")] == [reset.text()]
    # from the new baseline: honest, then a vend the agent never heard
    await served(agent, controller, "A2")
    recorded = await books.read_once()
    assert recorded is not None
    assert recorded.comparison is not None
    assert recorded.comparison.verdict == "match"
    await served(agent, controller, "A1", unheard=True)
    recorded = await books.read_once()
    assert recorded is not None
    assert recorded.comparison is not None
    assert recorded.comparison.verdict == "mismatch"
    assert "the machine counted 1 card vend worth $1.50" in recorded.comparison.text()
    assert len(agent.event_log.recent(kind="books_reset")) == 1  # said once


async def test_a_second_run_on_the_journal_meets_the_virtual_machines_books_anew_as_a_reset(
    agent_factory: Any,
) -> None:
    """`kiosk-agent run -c config/demo.yaml` twice: the first run read its machine at 0, sold
    and stopped with no read at its stop; the second run's machine starts its books at 0 again.
    0 then 0 with the first run's sales between is no mismatch: the agent made that machine
    with each run, so the interval is a reset of its books, said with the journal's sales."""
    first, controller, books = await machine_and_books(agent_factory)
    await books.read_once()  # DA2 0: the first run's baseline
    await served(first, controller, "A1")
    await served(first, controller, "A2")
    sold = [row[0] for row in first.journal.db.execute("SELECT sale_id FROM sales")]
    assert len(sold) == 2
    await first.stop()

    second, controller, books = await machine_and_books(agent_factory)
    assert second.journal.path == first.journal.path  # the same journal, kept between runs
    recorded = await books.read_once()
    assert recorded is not None
    reset = recorded.comparison
    assert reset is not None
    assert (reset.verdict, reset.cause, reset.machine) == ("books_reset", "restarted", None)
    assert sorted(s.sale_id for s in reset.sales) == sorted(sold)
    assert reset.text().startswith("the machine's books were reset between ")
    assert ": the virtual machine snacks starts its books at 0 with each run of the agent; the " \
        "journal's 2 card vends worth $4.00 of that interval are not checked" in reset.text()
    health = second.health.snapshot()
    assert not any("audit" in p for p in health.problems), health.problems
    # the run's own intervals compare as any machine's
    await served(second, controller, "A1")
    recorded = await books.read_once()
    assert recorded is not None
    assert recorded.comparison is not None
    assert recorded.comparison.verdict == "match"
