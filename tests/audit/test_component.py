"""The read scheduler on the agent's clock: never during a sale, a sale never waits for it,
failures backed off and shown, each outcome counted. Fakes over the agent's seams (the
runner's live sales, the event bus, health) and a scripted port; the journal on disk."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kiosk_agent.audit.books import Figures
from kiosk_agent.audit.component import AuditReads, Port
from kiosk_agent.audit.evadts import Counters, Tally
from kiosk_agent.audit.schema import DEX_SCHEMA
from kiosk_agent.bus import EventBus
from kiosk_agent.health.model import Health
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.events import EventLog
from kiosk_agent.sales.journal import Journal
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import SaleState
from tests.audit.helpers import MACHINE, figures, vended_sale


class LinkDown(Exception):
    """The link's own error: a clear reason."""


class ScriptedPort:
    """The machine's DEX port: each read answers the next scripted figures or error; a read
    with nothing scripted stalls until told."""

    def __init__(self) -> None:
        self.answers: list[Figures | Exception] = []
        self.started = 0
        self.release = asyncio.Event()

    async def read_file(self) -> bytes:
        self.started += 1
        if not self.answers:
            await self.release.wait()
            self.release.clear()
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return json.dumps(answer.as_dict()).encode()

    def port(self) -> Port:
        return Port(self.read_file, lambda data: Figures.of(json.loads(data)), (LinkDown,))


class Sales:
    def __init__(self) -> None:
        self.running: list[Any] = []


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    opened = Journal(tmp_path / "journal.db")
    opened.open()
    yield opened
    opened.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake_agent(journal: Journal, clock: FakeClock) -> SimpleNamespace:
    triggers = [{"platform": "virtual", "name": "snacks"}]
    return SimpleNamespace(
        config=_Config({"journal": {"keep_days": 30}}, triggers),
        journal=journal, clock=clock, health=Health("test"), events=EventBus(),
        sales=Sales(), settings=SimpleNamespace(currency="USD"),
        event_log=EventLog(lambda: journal.db, clock),
    )


class _Config(dict[str, Any]):
    def __init__(self, data: dict[str, Any], triggers: list[dict[str, Any]]) -> None:
        super().__init__(data)
        self.triggers = triggers


@pytest.fixture
def port() -> ScriptedPort:
    return ScriptedPort()


@pytest.fixture
async def reads(fake_agent: SimpleNamespace, port: ScriptedPort) -> AsyncIterator[AuditReads]:
    conf = {"trigger": "snacks", "interval": 600.0, "first_read": 5.0, "retry_min": 10.0,
            "retry_max": 40.0, "deadline": 30.0, "planogram": {"A1": 4}, "low_stock": 1}
    component = AuditReads(fake_agent, conf, port.port())  # type: ignore[arg-type]
    await component.start()
    yield component
    await component.stop()


async def next_read(reads: AuditReads, clock: FakeClock, seconds: float) -> None:
    reads.done.clear()
    await clock.advance(seconds)
    await asyncio.wait_for(reads.done.wait(), 5)


def live_sale(source: str = MACHINE) -> SimpleNamespace:
    return SimpleNamespace(sale_id="s-live", source=source, state=SaleState.DISPENSING)


async def test_reads_on_schedule_and_compares_with_the_journal(
    reads: AuditReads, port: ScriptedPort, clock: FakeClock, journal: Journal,
    fake_agent: SimpleNamespace,
) -> None:
    port.answers.append(figures((3, 450)))
    await next_read(reads, clock, 5)
    vended_sale(journal, 150)
    port.answers.append(figures((5, 750)))  # one vend more than the journal holds
    await next_read(reads, clock, 600)
    audit = fake_agent.health.snapshot().audit
    assert audit.reads["ok"] == 2
    [mismatch] = audit.mismatches
    assert "the machine counted 2 card vends worth $3.00" in mismatch
    assert "the journal holds 1 card vend worth $1.50" in mismatch
    assert any("audit mismatch on snacks" in p for p in fake_agent.health.snapshot().problems)


async def test_a_read_waits_while_a_sale_of_the_machine_runs(
    reads: AuditReads, port: ScriptedPort, clock: FakeClock, fake_agent: SimpleNamespace,
) -> None:
    fake_agent.sales.running.append(live_sale())
    await clock.advance(5 + 30)
    assert port.started == 0  # due for 30 s, but the sale runs
    fake_agent.sales.running.clear()
    port.answers.append(figures((3, 450)))
    await next_read(reads, clock, 1)
    assert port.started == 1


async def test_another_triggers_sale_does_not_hold_the_read(
    reads: AuditReads, port: ScriptedPort, clock: FakeClock, fake_agent: SimpleNamespace,
) -> None:
    fake_agent.sales.running.append(live_sale("kiosk_api:front"))
    port.answers.append(figures((3, 450)))
    await next_read(reads, clock, 5)
    assert port.started == 1


async def test_a_sale_starting_mid_read_waits_for_nothing_and_the_read_is_no_boundary(
    reads: AuditReads, port: ScriptedPort, clock: FakeClock, fake_agent: SimpleNamespace,
) -> None:
    port.answers.append(figures((3, 450)))
    await next_read(reads, clock, 5)
    reads.done.clear()
    await clock.advance(600)  # the read starts and stalls on the port
    assert port.started == 2
    # a customer: the sale's step is published and handled while the read is still out
    event = SaleEvent("s1", "KA1", MACHINE, SaleState.STARTED, 150)
    fake_agent.events.publish(event)
    assert not reads.done.is_set()
    port.answers.append(figures((4, 600)))
    port.release.set()
    await asyncio.wait_for(reads.done.wait(), 5)
    [during, first] = reads.store.reads()
    assert (during.clean, first.clean) == (False, True)
    assert reads.store.last_comparison() is None


async def test_failures_back_off_capped_and_show_in_health(
    reads: AuditReads, port: ScriptedPort, clock: FakeClock, fake_agent: SimpleNamespace,
) -> None:
    port.answers += [LinkDown("no answer to ENQ after 3 tries")] * 4
    await next_read(reads, clock, 5)
    audit = fake_agent.health.snapshot().audit
    assert (audit.failures, audit.last_outcome) == (1, "link")
    assert 10.0 <= audit.next_read_in_s <= 12.5  # retry_min, give or take the jitter
    problems = fake_agent.health.snapshot().problems
    assert any("no answer to ENQ after 3 tries" in p and "1 in a row" in p for p in problems)
    waits = []
    for _ in range(3):
        waits.append(fake_agent.health.snapshot().audit.next_read_in_s)
        await next_read(reads, clock, waits[-1])
    assert reads.failures == 4
    assert 15.0 <= waits[1] <= 25.0  # doubled
    assert 30.0 <= fake_agent.health.snapshot().audit.next_read_in_s <= 40.0  # capped: retry_max
    port.answers.append(figures((3, 450)))
    await next_read(reads, clock, 40)
    assert reads.failures == 0
    assert fake_agent.health.snapshot().audit.next_read_in_s == 600.0
    assert dict(reads.reads) == {"ok": 1, "link": 4, "unreadable": 0, "timeout": 0,
                                 "not_stored": 0, "error": 0}


async def test_a_port_that_stalls_ends_the_read_at_its_bound(
    reads: AuditReads, port: ScriptedPort, clock: FakeClock,
) -> None:
    await clock.advance(5)
    assert port.started == 1
    reads.done.clear()
    await clock.advance(39)
    assert not reads.done.is_set()  # the link's own deadline (30 s) and a margin
    await clock.advance(1)
    await asyncio.wait_for(reads.done.wait(), 5)
    assert (reads.last_outcome, reads.detail) == ("timeout", "no whole audit within 40 s")


async def test_garbage_is_unreadable_with_its_reason(
    reads: AuditReads, port: ScriptedPort, clock: FakeClock, fake_agent: SimpleNamespace,
) -> None:
    async def garbage() -> bytes:
        return b"\x00\xff not an audit"

    reads._port = Port(garbage, lambda data: Figures.of(json.loads(data)), (LinkDown,))
    await next_read(reads, clock, 5)
    assert reads.last_outcome == "unreadable"
    assert reads.detail.startswith("the audit could not be read:")


async def test_stock_low_and_sold_out_by_the_planogram(
    reads: AuditReads, port: ScriptedPort, clock: FakeClock, fake_agent: SimpleNamespace,
) -> None:
    port.answers.append(figures((0, 0), columns={"A1": (150, 0, 0)}))
    await next_read(reads, clock, 5)
    reads.store.record_fill(["A1"], at=clock.time())
    port.answers.append(figures((0, 0), columns={"A1": (150, 3, 0)}, cash=(3, 450)))
    await next_read(reads, clock, 600)
    assert fake_agent.health.snapshot().audit.low == ["A1"]
    port.answers.append(figures((0, 0), columns={"A1": (150, 4, 0)}, cash=(4, 600)))
    await next_read(reads, clock, 600)
    audit = fake_agent.health.snapshot().audit
    assert (audit.low, audit.sold_out) == ([], ["A1"])


async def test_metrics_count_reads_by_outcome_and_the_machines_vends(
    reads: AuditReads, port: ScriptedPort, clock: FakeClock, fake_agent: SimpleNamespace,
) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from kiosk_agent.admin.metrics import audit_families

    port.answers += [LinkDown("garbage on the line"), figures((3, 450), cash=(2, 300))]
    await next_read(reads, clock, 5)
    await next_read(reads, clock, fake_agent.health.snapshot().audit.next_read_in_s)
    port.answers.append(figures((5, 750), cash=(2, 300)))  # two card vends the journal lacks
    await next_read(reads, clock, 600)

    class Books:
        def collect(self) -> Any:
            return audit_families(reads.figures())

    registry = CollectorRegistry()
    registry.register(Books())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert 'kiosk_agent_audit_reads_total{outcome="ok"} 2.0' in text
    assert 'kiosk_agent_audit_reads_total{outcome="link"} 1.0' in text
    assert 'kiosk_agent_audit_vends_total{payment="cash"} 2.0' in text
    assert 'kiosk_agent_audit_vends_total{payment="cashless"} 5.0' in text
    assert "kiosk_agent_audit_mismatch 1.0" in text
    assert "kiosk_agent_audit_not_compared 0.0" in text  # two reads compared
    assert "kiosk_agent_audit_books_reset 0.0" in text


async def test_a_flooding_port_ends_the_read_with_the_links_reason_in_health(
    fake_agent: SimpleNamespace, clock: FakeClock
) -> None:
    from kiosk_agent.audit.virtual import PortFaults, VirtualDexPort

    async with VirtualDexPort(b"", port_faults=PortFaults(flood=True), clock=FakeClock()) as dex:
        conf = DEX_SCHEMA({"port": dex.port, "trigger": "snacks", "retry_min": 10.0})
        reads = AuditReads(fake_agent, conf)  # type: ignore[arg-type]  # the real link
        assert await asyncio.wait_for(reads.read_once(), 20) is None
        assert dex.bytes_sent < 1 << 20  # bounded in memory: the read stopped listening
    audit = fake_agent.health.snapshot().audit
    assert (audit.last_outcome, audit.failures) == ("link", 1)
    assert "without its end" in audit.detail
    assert 10.0 <= reads.settings.backoff(reads.failures) <= 12.5


async def test_a_port_that_is_not_there_is_named(fake_agent: SimpleNamespace) -> None:
    conf = DEX_SCHEMA({"port": "/dev/no-such-dex-port", "trigger": "snacks"})
    reads = AuditReads(fake_agent, conf)  # type: ignore[arg-type]
    await reads.read_once()
    problems = fake_agent.health.snapshot().problems
    assert any("cannot open /dev/no-such-dex-port" in p for p in problems), problems


async def test_the_machines_books_reset_are_said_once_as_no_problem_and_a_new_baseline(
    reads: AuditReads, port: ScriptedPort, clock: FakeClock, journal: Journal,
    fake_agent: SimpleNamespace,
) -> None:
    from kiosk_agent.admin.page import health_changes
    from kiosk_agent.cli.fleet import format_health
    from kiosk_agent.fleet.report import audit_state, build_report

    port.answers.append(figures((40, 6000)))
    await next_read(reads, clock, 5)
    before = [tuple(r) for r in journal.db.execute("SELECT * FROM sales ORDER BY sale_id")]
    vended_sale(journal, 150)
    sales = [tuple(r) for r in journal.db.execute("SELECT * FROM sales ORDER BY sale_id")]
    assert len(sales) == len(before) + 1
    was = fake_agent.health.snapshot().model_dump(mode="json")
    port.answers.append(figures((1, 150)))  # the machine's books went back: its DA2 went down
    await next_read(reads, clock, 600)
    snapshot = fake_agent.health.snapshot()
    stored = reads.store.last_comparison()
    assert stored is not None
    assert (stored.verdict, stored.cause) == ("books_reset", "reinitialised")
    # what health, the page, Home Assistant and /metrics show is what the store holds: a reset
    # of the books, no mismatch and no problem
    assert snapshot.audit.books_reset == stored.text()
    assert snapshot.audit.not_compared == ""
    assert snapshot.audit.mismatches == []
    assert not any("audit" in p for p in snapshot.problems), snapshot.problems
    assert audit_state(snapshot)["books_reset"] == stored.text()  # type: ignore[index]
    assert audit_state(snapshot)["mismatch"] is False  # type: ignore[index]
    # `kiosk-agent health` and `fleet show` say it beside the problems, not among them
    assert f"audit:    {stored.text()}" in format_health(snapshot.model_dump(mode="json"))
    assert f"audit:    {stored.text()}" in format_health(
        build_report("unit-1", snapshot, 60.0)).splitlines()
    assert reads.figures()["not_compared"] == reads.figures()["mismatches"] == 0
    assert reads.figures()["books_reset"] == 1  # /metrics: kiosk_agent_audit_books_reset
    assert reads.report()["comparisons"][0]["text"] == stored.text()
    # said once: one event journaled, one note in the event log when health shows it
    events = fake_agent.event_log.recent(kind="books_reset")
    assert [(e.subject, e.detail["text"]) for e in events] == [("snacks", stored.text())]
    notes = health_changes(was, snapshot.model_dump(mode="json"))
    assert [n["kind"] for n in notes] == ["audit"]
    assert notes[0]["text"] == f"snacks: {stored.text()}"
    # the audit only reports: no sale of the journal was touched
    assert [tuple(r) for r in journal.db.execute("SELECT * FROM sales ORDER BY sale_id")] == sales
    # an unclean read compares nothing: still shown, not said again
    fake_agent.sales.running.append(live_sale())
    port.answers.append(figures((1, 150)))
    task = asyncio.ensure_future(reads.read_once())
    await asyncio.wait_for(task, 5)
    fake_agent.sales.running.clear()
    assert fake_agent.health.snapshot().audit.books_reset == stored.text()
    assert len(fake_agent.event_log.recent(kind="books_reset")) == 1
    # the new baseline: a vend the journal does not hold after the reset is a mismatch again
    port.answers.append(figures((2, 300)))
    await next_read(reads, clock, 600)
    snapshot = fake_agent.health.snapshot()
    latest = reads.store.last_comparison()
    assert latest is not None
    assert (latest.verdict, latest.machine, latest.journal) == ("mismatch", Tally(1, 150),
                                                                 Tally(0, 0))
    assert snapshot.audit.books_reset == ""
    assert reads.figures()["books_reset"] == 0
    assert snapshot.audit.mismatches
    assert reads.figures()["mismatches"] == 1


async def test_a_file_stating_da2_twice_is_unreadable_naming_both_lines_and_reads_go_on(
    fake_agent: SimpleNamespace, clock: FakeClock, journal: Journal
) -> None:
    from kiosk_agent.audit.books import figures_of
    from kiosk_agent.audit.evadts import AuditError, parse_audit, render_audit

    files = [
        render_audit([("ID1", "VM-1"), ("DA2", "300", "2"), ("DA2", "450", "3")]),
        render_audit([("ID1", "VM-1"), ("DA2", "450", "3")]),
    ]

    async def read_file() -> bytes:
        return files.pop(0)

    port = Port(read_file, lambda data: figures_of(parse_audit(data)), (LinkDown,), (AuditError,))
    conf = {"trigger": "snacks", "interval": 600.0, "first_read": 5.0, "retry_min": 10.0,
            "retry_max": 40.0, "deadline": 30.0}
    reads = AuditReads(fake_agent, conf, port)  # type: ignore[arg-type]
    await reads.start()
    await asyncio.sleep(0)  # its schedule waits for the first read
    try:
        await next_read(reads, clock, 5)
        audit = fake_agent.health.snapshot().audit
        assert (audit.last_outcome, audit.failures) == ("unreadable", 1)
        assert audit.detail == (
            "the audit could not be read: line 5, DA2: a second DA2 for the file (the first on "
            "line 4): which one the machine means cannot be known"
        )
        assert reads.store.last_read() is None  # nothing stored, nothing compared on a guess
        await next_read(reads, clock, audit.next_read_in_s)  # the agent reads on
        audit = fake_agent.health.snapshot().audit
        assert (audit.last_outcome, audit.failures) == ("ok", 0)
        stored = reads.store.last_read()
        assert stored is not None
        assert stored.figures.cashless is not None
        assert stored.figures.cashless.since_init == Tally(3, 450)
    finally:
        await reads.stop()


async def test_the_cashless_device_changed_between_reads_shows_not_compared_on_every_face(
    reads: AuditReads, port: ScriptedPort, clock: FakeClock, journal: Journal,
    fake_agent: SimpleNamespace,
) -> None:
    import dataclasses

    from kiosk_agent.fleet.report import audit_state

    port.answers.append(figures((40, 6000)))  # DA2
    await next_read(reads, clock, 5)
    vended_sale(journal, 150)
    on_db = dataclasses.replace(  # DB2 counts 1 vend; VA1 goes on from 40
        figures((41, 6150)), cashless=Counters(Tally(1, 150)), cashless_device="DB"
    )
    port.answers.append(on_db)
    await next_read(reads, clock, 600)
    stored = reads.store.last_comparison()
    assert stored is not None
    assert (stored.verdict, stored.cause, stored.machine) == ("not_compared", "device", None)
    snapshot = fake_agent.health.snapshot()
    assert snapshot.audit.not_compared == stored.text()
    assert f"audit of snacks {stored.text()}" in snapshot.problems
    assert "DA2 (cashless) then DB2 (cashless)" in stored.text()
    assert snapshot.audit.mismatches == []
    assert audit_state(snapshot)["not_compared"] == stored.text()  # type: ignore[index]
    assert reads.figures()["not_compared"] == 1
    assert [c["kind"] for c in reads.report()["last_read"]["changes"]] == ["device"]
