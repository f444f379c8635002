"""Sales that end in the odd ways, each face read against the journal and the simulator's own
reporting (rule 12), one test a face: `kiosk-agent sales` (its table and `--format json`),
the admin API's records, the export (CSV and JSON, the CLI's and the API's) and the health
summary (`/api/health`, `kiosk-agent health`). Money is compared as Decimal dollars and integer
cents, never as the words a renderer made.

The odd ends, each made by the agent's own flows on the simulator (a crashed agent's journal
left as it would be, the service's records made as they would be):
- ``partly``: a charge found under a lost sale's order id, $1.00 of its $3.00 refunded before
  the agent looked: the agent refunds the $2.00 left (reversed, $3.00 given back in all);
- ``refunded``: a charge found already refunded whole (a give-back the journal never heard
  of): reversed, the charge taken and all of it given back;
- ``refund0``: a charge found refunded, its row reading $0.00: a person decides (attention);
- ``unknown``: a charge found in a status the interface does not name: a person decides;
- ``capture0``: killed while capturing a $1.75 vend that reporting shows captured for $0.00;
- ``dispensing``: killed mid-dispense, no vend result heard after the restart: given back;
  then the machine reports the vend late (a late vend: the product went out unpaid);
- ``maybe``: the dispenser raised after it may have moved the machine: given back, and the
  product may have gone out (told to a person, as a late vend is);
- ``plain``: a sale that went well, for the sums.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import time
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.app import load_agent
from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.sales.model import DispenseStatus, Flow, SaleRequest
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import TransactionFilter, TransStatus
from tests.admin.conftest import ADMIN_TOKEN, READ_TOKEN, write_config
from tests.admin.test_sales_export import _cli
from tests.assembly.agent_helpers import ScriptedDispenser
from tests.sales.test_recovery import authorize, leave_open

CENT = Decimal("0.01")
# what the service holds of a charge: taken (captured, settled, refunded in part or whole),
# held (an authorization), and what its give-backs' rows say
_TAKEN = {TransStatus.CAPTURED, TransStatus.SETTLED, TransStatus.PARTIALLY_REFUNDED,
          TransStatus.REFUNDED}


def dollars(cents: int) -> Decimal:
    return (Decimal(cents) * CENT).quantize(CENT)


class Odd:
    """The agent, its journal's records of the odd sales, and the simulator's rows of each."""

    def __init__(self, agent: Any, config: Path, sim: Any) -> None:
        self.agent = agent
        self.config = config
        self.sim = sim
        self.ids: dict[str, str] = {}  # name -> sale id
        self.rows: dict[str, list[Any]] = {}  # name -> reporting's rows under its order id

    def record(self, name: str) -> Any:
        record = self.agent.journal.get(self.ids[name])
        assert record is not None
        return record

    def records(self) -> dict[str, Any]:
        return {sale_id: self.agent.journal.get(sale_id) for sale_id in self.ids.values()}

    def service(self, name: str) -> dict[str, Decimal]:
        """What the service's own rows say of the sale's money, in Decimal dollars."""
        rows = self.rows[name]
        return {
            "taken": sum((r.amount for r in rows if r.status in _TAKEN), Decimal(0)),
            "held": sum((r.amount for r in rows if r.status is TransStatus.AUTHORIZED),
                        Decimal(0)),
            "voided": sum((r.amount for r in rows if r.status is TransStatus.VOIDED),
                          Decimal(0)),
            "refunded": sum((r.amount for r in rows if r.status is TransStatus.REFUND),
                            Decimal(0)),
        }


class RaisingDispenser(ScriptedDispenser):
    """A machine whose dispense raises after its relay may have fired."""

    async def dispense(self, authorized_cents: int) -> Any:
        self.authorized.append(authorized_cents)
        raise RuntimeError("the relay fired, then the bus dropped")


@pytest.fixture
async def odd(tmp_path: Path, sim_factory: Any) -> AsyncIterator[Odd]:
    sim = await sim_factory(time_scale=300, transactions=0)
    settings = settings_from_ready(sim.ready_info())
    async with ServiceClient(settings) as service:  # the crashed agent's charges
        capture0 = await authorize(service, "KACAPTURE0", capture=False)
        await service.payments.capture(capture0, amount=175)
        dispensing = await authorize(service, "KADISPENSING", capture=False)
    sim.ctx.ledger.update(capture0, amount_cents=0)  # reporting shows it captured for $0.00
    leave_open(tmp_path, sale_id="capture0", order_id="KACAPTURE0", state=SaleState.CAPTURING,
               trans_id=capture0, authorized_cents=300, vended_cents=175)
    leave_open(tmp_path, sale_id="dispensing", order_id="KADISPENSING",
               state=SaleState.DISPENSING, trans_id=dispensing, authorized_cents=300)
    for name in ("partly", "refunded", "refund0", "unknown"):  # lost answers, their deadline past
        leave_open(tmp_path, sale_id=name, order_id=f"KA{name.upper()}",
                   state=SaleState.ATTENTION, answer_by=time.time() - 1)
    config = write_config(tmp_path)
    agent = load_agent(config, settings, systemd=False)
    await agent.start()
    try:
        odd = Odd(agent, config, sim)
        await asyncio.wait_for(agent.recovery.wait(), 60)
        ledger = sim.ctx.ledger
        partly = await authorize(agent.service, "KAPARTLY", capture=True)
        ledger.update(partly, trans_status_id=TransStatus.SETTLED)
        await agent.service.payments.void_or_refund(partly, amount=100)  # a person, before
        refunded = await authorize(agent.service, "KAREFUNDED", capture=True)
        ledger.update(refunded, trans_status_id=TransStatus.SETTLED)
        await agent.service.payments.void_or_refund(refunded)  # a person, before
        refund0 = await authorize(agent.service, "KAREFUND0", capture=True)
        ledger.update(refund0, trans_status_id=TransStatus.SETTLED)
        await agent.service.payments.void_or_refund(refund0)
        ledger.update(refund0, amount_cents=0)  # the refunded charge's row reads $0.00
        unknown = await authorize(agent.service, "KAUNKNOWN", capture=True)
        ledger.update(unknown, trans_status_id=42)
        await agent.attention.sweep()
        request = SaleRequest("test", Flow.AUTHORIZE_CAPTURE, 250, terminal="SIM-0007",
                              product="A1")
        sale = await agent.sales.start(request, ScriptedDispenser(DispenseStatus.VENDED,
                                                                  vended_cents=180))
        await asyncio.wait_for(sale.result(), 30)
        maybe = await agent.sales.start(
            SaleRequest("test", Flow.AUTHORIZE_CAPTURE, 150, terminal="SIM-0007", product="B1"),
            RaisingDispenser())
        await asyncio.wait_for(maybe.result(), 30)
        agent.sales.late_vend("dispensing", "A2", "test")  # the machine, after the restart
        odd.ids = {name: name for name in ("partly", "refunded", "refund0", "unknown", "capture0",
                                           "dispensing")}
        odd.ids["plain"] = sale.sale_id
        odd.ids["maybe"] = maybe.sale_id
        for name in odd.ids:
            order_id = odd.record(name).order_id
            odd.rows[name] = [t async for t in agent.service.reporting.transactions(
                TransactionFilter(order_id=order_id))]
        yield odd
    finally:
        await agent.stop()


async def test_the_odd_ends_are_held_in_the_journal_as_the_service_holds_them(odd: Odd) -> None:
    """The journal against the service first: what each face is then compared with."""
    ends = {name: odd.record(name).state for name in odd.ids}
    assert ends == {
        "partly": SaleState.REVERSED, "refunded": SaleState.REVERSED,
        "refund0": SaleState.ATTENTION,
        "unknown": SaleState.ATTENTION, "capture0": SaleState.ATTENTION,
        "dispensing": SaleState.REVERSED, "plain": SaleState.COMPLETED,
        "maybe": SaleState.REVERSED,
    }, {name: odd.record(name).message for name in odd.ids}
    for name in ("partly", "refunded", "dispensing", "plain", "capture0", "maybe"):
        record, service = odd.record(name), odd.service(name)
        assert dollars(record.captured_cents) == service["taken"], name
        assert dollars(record.reversed_cents) == service["refunded"] + service["voided"], name
    # the partly refunded charge: the agent's refund is the $2.00 left, told as such
    partly = odd.record("partly")
    refunds = sorted(r.amount for r in odd.rows["partly"] if r.status is TransStatus.REFUND)
    assert refunds == [Decimal("1.00"), Decimal("2.00")]
    assert "$2.00 refunded, the rest of the $3.00 charge: $1.00 of it had been refunded " \
        "before" in partly.message
    # a person decides the others: nothing moved by the agent on what it could not read
    for name in ("refund0", "unknown", "capture0"):
        assert odd.record(name).reversed_cents == 0, name



def _settled(record: Any) -> bool:
    """Ended, and not for a person to decide: the money as it stays."""
    return bool(record.state.final) and record.state is not SaleState.ATTENTION


def _kept(record: Any) -> int:
    return max(0, record.captured_cents - record.reversed_cents)


def _figures(record: Any) -> set[Decimal]:
    """Every figure the journal holds of a sale's money, and what follows from them."""
    held = record.captured_cents or record.authorized_cents
    return {dollars(c) for c in (record.amount_cents, record.captured_cents,
                                 record.reversed_cents, record.vended_cents, _kept(record),
                                 held, max(0, held - record.reversed_cents))}


def _amounts(text: str) -> list[Decimal]:
    return [Decimal(m) for m in re.findall(r"\$(\d+\.\d\d)", text)]


async def test_the_sales_command_shows_the_journals_money_of_each_odd_end(
    odd: Odd, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kiosk-agent sales` (its table) and `sales --format json`: each sale's figures are the
    journal's, and what a sale kept is what the service kept (taken less given back)."""
    records = odd.records()
    code, out, _ = await _cli(capsys, "sales", "-c", str(odd.config), "--format", "json")
    assert code == 0
    rows = {row["sale_id"]: row for row in json.loads(out)}
    assert set(rows) == set(records)
    for name, sale_id in odd.ids.items():
        row, record = rows[sale_id], records[sale_id]
        assert row["state"] == record.state.value, name
        assert (Decimal(row["amount"]), Decimal(row["captured"]), Decimal(row["reversed"])) == (
            dollars(record.amount_cents), dollars(record.captured_cents),
            dollars(record.reversed_cents)), name
        assert row["trans_id"] == (record.trans_id or ""), name
        if _settled(record):
            service = odd.service(name)
            kept = max(Decimal(0), service["taken"] - service["refunded"])
            assert max(Decimal(0), Decimal(row["captured"]) - Decimal(row["reversed"])) == kept
    code, out, _ = await _cli(capsys, "sales", "-c", str(odd.config))
    assert code == 0
    lines = {record.order_id: line for line in out.splitlines()
             for record in records.values() if f" {record.order_id} " in line}
    assert len(lines) == len(records)
    for record in records.values():
        money = lines[record.order_id].split(record.source, 1)[1].split(record.state.value)[0]
        shown = _amounts(money)
        assert shown, (record.order_id, money)
        assert set(shown) <= _figures(record), (record.order_id, money)
        if record.sale_id == odd.ids["refund0"]:  # the journal's words: "may still be held"
            assert "$3.00 may be held, undecided" in money, money
        if record.sale_id in (odd.ids["dispensing"], odd.ids["maybe"]):
            assert "dispensed" in lines[record.order_id], record.order_id  # its late vend
        if _settled(record):  # what it kept, said as charged, or "nothing charged"
            kept = _kept(record)
            assert (f"{'$' + str(dollars(kept)) if kept else 'nothing'} charged") in money, money


async def test_the_admin_api_shows_the_journals_money_of_each_odd_end(odd: Odd) -> None:
    """`GET /api/sales` and `GET /api/sales/{id}`: the journal's cents, field for field."""
    records = odd.records()
    admin = next(c for c in odd.agent.components if type(c).__name__ == "AdminServer")
    headers = {"Authorization": f"Bearer {READ_TOKEN}"}
    money = ("amount_cents", "authorized_cents", "vended_cents", "captured_cents",
             "reversed_cents")
    async with aiohttp.ClientSession(base_url=admin.url, headers=headers) as http:
        async with http.get("/api/sales") as answer:
            assert answer.status == 200
            listed = {s["sale_id"]: s for s in (await answer.json())["sales"]}
        assert set(listed) == set(records)
        for name, sale_id in odd.ids.items():
            record = records[sale_id]
            for field in money:
                assert listed[sale_id][field] == getattr(record, field), (name, field)
            assert (listed[sale_id]["state"], listed[sale_id]["trans_id"],
                    listed[sale_id]["message"]) == (record.state.value, record.trans_id,
                                                    record.message), name
            async with http.get(f"/api/sales/{sale_id}") as answer:
                assert answer.status == 200
                shown = (await answer.json())["sale"]
            for field in money:
                assert shown[field] == getattr(record, field), (name, field)
    # the reversed sales' money back is the service's refund and void rows
    for name in ("partly", "refunded", "dispensing"):
        service = odd.service(name)
        assert dollars(listed[odd.ids[name]]["reversed_cents"]) == (
            service["refunded"] + service["voided"])


async def test_the_exports_sum_to_what_the_journal_and_the_service_hold(
    odd: Odd, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CSV and JSON exports, from the CLI and the API, byte for byte alike; their money
    columns summed as Decimal are the journal's cents and, for the ended sales, the service's
    own rows (taken; given back by refunds and voids)."""
    records = odd.records()
    admin = next(c for c in odd.agent.components if type(c).__name__ == "AdminServer")
    headers = {"Authorization": f"Bearer {READ_TOKEN}"}
    exported = {}
    async with aiohttp.ClientSession(base_url=admin.url, headers=headers) as http:
        for fmt in ("csv", "json"):
            code, out, _ = await _cli(capsys, "sales", "-c", str(odd.config), "--format", fmt)
            assert code == 0
            async with http.get(f"/api/sales?format={fmt}") as answer:
                assert answer.status == 200
                assert await answer.text() == out, fmt
            exported[fmt] = out
    rows = list(csv.DictReader(io.StringIO(exported["csv"])))
    late = {r["sale_id"] for r in rows if r["late_vend"]}
    assert late == {odd.ids["dispensing"], odd.ids["maybe"]}  # as the journal's late.vend
    assert rows == [{k: str(v) for k, v in row.items()} for row in json.loads(exported["json"])]
    assert len(rows) == len(records)
    for column, field in (("amount", "amount_cents"), ("captured", "captured_cents"),
                          ("reversed", "reversed_cents")):
        assert sum(Decimal(r[column]) for r in rows) == dollars(
            sum(getattr(record, field) for record in records.values())), column
    ended = {odd.ids[name] for name in odd.ids if _settled(records[odd.ids[name]])}
    services = [odd.service(name) for name in odd.ids if odd.ids[name] in ended]
    assert sum(Decimal(r["captured"]) for r in rows if r["sale_id"] in ended) == sum(
        s["taken"] for s in services)
    assert sum(Decimal(r["reversed"]) for r in rows if r["sale_id"] in ended) == sum(
        s["refunded"] + s["voided"] for s in services)


async def test_the_health_summary_counts_what_the_journal_holds(
    odd: Odd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`/api/health`, `kiosk-agent health` and `/metrics`: today's completed sales and their
    cents, the sales that need a person, and the money counters, against the journal (and the
    counters' money back against the service's rows)."""
    records = odd.records()
    admin = next(c for c in odd.agent.components if type(c).__name__ == "AdminServer")
    async with aiohttp.ClientSession(
        base_url=admin.url, headers={"Authorization": f"Bearer {READ_TOKEN}"}
    ) as http:
        async with http.get("/api/health") as answer:
            health = await answer.json()
        async with http.get("/metrics") as answer:
            metrics = await answer.text()
    count, cents = odd.agent.journal.today()
    attention = [r for r in records.values() if r.state is SaleState.ATTENTION]
    sales = health["sales"]
    assert (sales["today_count"], sales["today_amount_cents"]) == (count, cents) == (1, 180)
    assert (sales["attention"], sales["open"]) == (len(attention), 0) == (3, 0)
    assert f"{len(attention)} sale(s) need attention" in health["problems"]
    monkeypatch.setenv("KIOSK_AGENT_TOKEN", ADMIN_TOKEN)
    code, out, _ = await _cli(capsys, "health", "--url", admin.url)
    assert code == 1  # degraded: sales need a person
    [line] = [line for line in out.splitlines() if line.startswith("sales:")]
    assert f"{count} completed, ${dollars(cents)}; open 0, attention {len(attention)}" in line
    # what a tech runs next: the sales a person decides, the products that went out unpaid
    steps = [line for line in out.splitlines() if line.startswith("next:")]
    assert len(steps) == 2, steps
    assert " sales attention -c FILE` lists the sales a person decides" in steps[0]
    assert " sales late-vends -c FILE`: check the stock, then acknowledge them" in steps[1]
    reversed_ = [r for r in records.values() if r.state is SaleState.REVERSED]
    terminals = ("SIM-0001", "SIM-0007")
    assert sum(_counter(metrics, "kiosk_agent_reversed_cents_total", t) for t in terminals) == (
        sum(r.reversed_cents for r in reversed_))
    assert dollars(sum(r.reversed_cents for r in reversed_)) == sum(
        odd.service(name)["refunded"] + odd.service(name)["voided"]
        for name in ("partly", "refunded", "dispensing", "maybe"))
    assert sum(_counter(metrics, "kiosk_agent_captured_cents_total", t) for t in terminals) == (
        cents)
    # the products that went out unpaid (or may have): a person is told, no money moved
    assert ("1 product(s) dispensed after the sale gave up waiting and 1 product(s) that may "
            "have been dispensed (a dispenser's error)") in " ".join(health["problems"])


def _counter(metrics: str, name: str, terminal: str) -> int:
    for line in metrics.splitlines():
        if line.startswith(f'{name}{{terminal="{terminal}"}}'):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0
