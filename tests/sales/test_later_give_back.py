"""Money a person gives back at the service after the agent's sale completed.

A charge of one of the agent's own completed sales, voided or refunded (whole or in part) at the
service afterwards (a person at the portal, another program), is found by the charge check's
whole read of the terminals' history, by its trans id (a refund's row by the trans id it names),
never by amount or time; it is journaled on that sale as a note of what the service holds now,
and every face that shows the sale says it apart from what the agent captured and gave back.
The agent moves no money on it. Each test: a real sale of a real agent on the real simulator,
the person's give-back through the simulator's own payments API over HTTP, the faces compared
with reporting's own rows summed as Decimal."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal
from typing import Any

from kiosk_agent.cli.sales import sale_text
from kiosk_agent.export import export_sales
from kiosk_agent.sales.model import Flow, SaleRequest, money_text
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.sales.steps import agent_user
from kiosk_agent.service.models import Transaction, TransactionFilter, TransStatus
from kiosk_agent.service.models.reports import ChargebackFilter, ChargebackStatus
from kiosk_agent.service.settings import CallKind
from kiosk_agent.sim.reporting import report_tables
from tests.assembly.agent_helpers import ScriptedDispenser
from tests.helpers import sim_call, until


async def _completed(
    agent_factory: Any, sim_factory: Any, cents: int = 250
) -> tuple[Any, Any, Any]:
    """The simulator, an agent on it whose start's checks are done, and one sale of its own
    completed for ``cents``."""
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await agent_factory(sim=sim)
    await until(lambda: agent.journal_guard.history_read)
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=cents),
        ScriptedDispenser())
    done = await sale.result()
    assert done.state is SaleState.COMPLETED
    record = agent.journal.get(sale.sale_id)
    assert record is not None
    assert record.captured_cents == cents
    return sim, agent, record


async def _rows(agent: Any, order_id: str) -> list[Transaction]:
    query = TransactionFilter(mid=agent.service.settings.mid, order_id=order_id)
    return [row async for row in agent.service.reporting.transactions(query)]


def _dollars(text: str) -> Decimal:
    return Decimal(text) if text else Decimal(0)


async def _faces_against_reporting(agent: Any, sale_id: str) -> dict[str, Any]:
    """The sale's CSV and JSON exports (the journal's, as `kiosk-agent sales --format` and the
    admin API write them) against reporting's own rows: what the service still holds of the
    charge is what the agent captured less what others gave back, each summed as Decimal."""
    record = agent.journal.get(sale_id)
    rows = await _rows(agent, record.order_id)
    [charge] = [r for r in rows if r.trans_id == record.trans_id]
    refunds = [r for r in rows if r.status is TransStatus.REFUND]
    if charge.status is TransStatus.VOIDED:
        back = Decimal(charge.amount_cents) / 100
    else:
        back = sum((Decimal(r.amount_cents) / 100 for r in refunds), Decimal(0))
    query = ChargebackFilter(mid=agent.service.settings.mid, trans_id=record.trans_id)
    back += sum([case.amount async for case in agent.service.reporting.chargebacks(query)
                 if case.status in {ChargebackStatus.OPEN, ChargebackStatus.LOST}], Decimal(0))
    held = Decimal(charge.amount_cents) / 100 - back
    [as_json] = json.loads("".join(export_sales([record], "json")))
    [as_csv] = list(csv.DictReader(io.StringIO("".join(export_sales([record], "csv")))))
    for face in (as_json, as_csv):
        captured = _dollars(str(face["captured"]))
        by_agent = _dollars(str(face["reversed"]))
        by_others = _dollars(str(face["given_back_by_others"]))
        assert by_agent == 0  # the agent gave nothing back: not folded into its own figure
        assert captured == Decimal(record.captured_cents) / 100  # what it took, as it took it
        assert by_others == back, (face, back)
        assert captured - by_agent - by_others == held
        assert face["state"] == "completed"
    return as_json


async def test_a_persons_partial_then_whole_refund_is_noted_on_the_sale_and_shown_apart(
    agent_factory: Any, sim_factory: Any
) -> None:
    """$2.50 captured and settled; 'jane' refunds $1.00 of it at the service, later 'bob' the
    $1.50 left. Each whole read of the history notes what the service holds now on the sale
    (one note a change, none when nothing changed); the sale stays completed with its $2.50
    captured and nothing given back by the agent; the exports say the refunds apart, and agree
    with reporting's rows."""
    sim, agent, record = await _completed(agent_factory, sim_factory)
    audit = agent.journal_guard.audit
    await sim_call(sim, "POST", "/sim/settle")
    await agent.service.payments.void_or_refund(record.trans_id, amount=100,
                                                user_identifier="jane")

    first = await audit.check(settled=True)

    assert first.ok, first.error
    assert first.later == [record.sale_id]
    assert first.unaccounted == []  # nothing given back: not the agent's to move
    noted = agent.journal.get(record.sale_id)
    assert noted.state is SaleState.COMPLETED
    assert (noted.captured_cents, noted.reversed_cents) == (250, 0)
    assert (noted.later_cents, noted.later_status, noted.later_by) == (
        100, "partly_refunded", "jane")
    [step] = [s for s in agent.journal.steps(record.sale_id) if s.step == Step.SERVICE_LATER]
    assert step.detail["cents"] == 100
    assert "by 'jane' (not the agent)" in step.detail["message"]
    assert "the agent moved no money" in step.detail["message"]
    face = await _faces_against_reporting(agent, record.sale_id)
    assert face["given_back_by"] == "jane"
    assert face["service_status"] == "partly_refunded"
    # the list's and the page's words (one function): what it charged, what others gave back
    assert money_text(noted) == (
        "$2.50 charged ($1.00 given back since by others, at the service)")
    assert "$1.00 partly_refunded at the service after it completed by 'jane'" in sale_text(
        noted, agent.journal.steps(record.sale_id))

    again = await audit.check(settled=True)
    assert again.later == []  # nothing changed at the service: no second note
    await agent.service.payments.void_or_refund(record.trans_id, user_identifier="bob")
    third = await audit.check(settled=True)

    assert third.later == [record.sale_id]
    whole = agent.journal.get(record.sale_id)
    assert (whole.later_cents, whole.later_status, whole.later_by) == (250, "refunded",
                                                                       "jane, bob")
    assert (whole.captured_cents, whole.reversed_cents) == (250, 0)
    await _faces_against_reporting(agent, record.sale_id)
    # the agent moved no money: every give-back row at the service is a person's
    rows = await _rows(agent, record.order_id)
    assert sorted(r.user_identifier or "" for r in rows if r.status is TransStatus.REFUND) == [
        "bob", "jane"]
    assert len([s for s in agent.journal.steps(record.sale_id)
                if s.step == Step.SERVICE_LATER]) == 2


async def test_a_persons_void_of_a_captured_sale_is_noted_and_read_in_the_same_queries(
    agent_factory: Any, sim_factory: Any
) -> None:
    """$2.50 captured, not yet settled; 'ops' voids it at the service. The whole read finds it
    voided by its trans id, in the same one query a terminal as ever (no lookup of its own),
    and notes the whole $2.50 given back by others; the checks that read only the unsettled
    charges see nothing of it and note nothing."""
    _, agent, record = await _completed(agent_factory, sim_factory)
    audit = agent.journal_guard.audit
    await agent.service.payments.void_or_refund(record.trans_id, user_identifier="ops")

    unsettled = await audit.check(settled=False)
    assert unsettled.ok
    assert unsettled.later == []
    assert agent.journal.get(record.sale_id).later_cents is None
    kinds: list[CallKind] = []
    forget = agent.service.transport.observe(lambda kind, _s, _o: kinds.append(kind))
    try:
        result = await audit.check(settled=True)
    finally:
        forget()

    assert result.later == [record.sale_id]
    # one query a terminal, and the merchant's chargebacks once: none of the sale's own
    assert kinds.count(CallKind.REPORT) == len(audit.settings.terminals) + 1
    noted = agent.journal.get(record.sale_id)
    assert (noted.later_cents, noted.later_status, noted.later_by) == (250, "voided", "ops")
    assert noted.later_at is not None
    assert noted.state is SaleState.COMPLETED
    face = await _faces_against_reporting(agent, record.sale_id)
    assert face["given_back_by_others"] == "2.50"
    assert money_text(noted) == (
        "$2.50 charged ($2.50 given back since by others, at the service)")


async def test_a_chargeback_of_a_completed_sale_is_noted_and_follows_its_case(
    agent_factory: Any, sim_factory: Any
) -> None:
    """$2.50 captured and settled, then 'jane' refunds $0.50 and the cardholder's bank charges
    back the $2.50 (the simulator's chargebacks are its data set's: written in its reporting
    tables, read by the agent over HTTP like any). The whole read notes both, found by the
    sale's trans id; once the case is won, the chargeback's amount is no longer counted given
    back, and a note says so."""
    sim, agent, record = await _completed(agent_factory, sim_factory)
    audit = agent.journal_guard.audit
    await sim_call(sim, "POST", "/sim/settle")
    await agent.service.payments.void_or_refund(record.trans_id, amount=50,
                                                user_identifier="jane")
    case = {"chargeback_id": "7700001", "mid": agent.service.settings.mid,
            "trans_id": record.trans_id, "case_number": "CB2026000001", "amount_cents": 250,
            "reason_code": "10.4", "reason_text": "Fraud", "status": "OPEN",
            "chargeback_date": "2026-11-30T09:00:00.000Z", "card_brand_id": 1,
            "card_number": "XXXXXXXXXXXX1111"}
    report_tables(sim.ctx).add_chargebacks([case])

    result = await audit.check(settled=True)

    assert result.later == [record.sale_id]
    assert result.unaccounted == []
    noted = agent.journal.get(record.sale_id)
    assert (noted.later_cents, noted.later_status, noted.later_by) == (
        300, "partly_refunded, chargeback_open", "jane, chargeback case CB2026000001")
    assert (noted.captured_cents, noted.reversed_cents, noted.state) == (
        250, 0, SaleState.COMPLETED)
    await _faces_against_reporting(agent, record.sale_id)

    sim.ctx.store.execute("UPDATE chargebacks SET status = 'WON' WHERE chargeback_id = ?",
                          ("7700001",))
    won = await audit.check(settled=True)

    assert won.later == [record.sale_id]
    after = agent.journal.get(record.sale_id)
    assert (after.later_cents, after.later_status) == (50, "partly_refunded, chargeback_won")
    await _faces_against_reporting(agent, record.sale_id)
    [_, last] = [s for s in agent.journal.steps(record.sale_id) if s.step == Step.SERVICE_LATER]
    assert "charged back and won back" in last.detail["message"]


def test_a_journal_without_the_table_of_later_give_backs_reads_as_before(tmp_path: Any) -> None:
    """A journal an older agent made and still holds (no ``sale_later`` yet: this release makes
    it at its own open) is read in place by `kiosk-agent sales`: its completed sale is listed,
    with nothing noted of it, and the read fails on no missing table."""
    from kiosk_agent.sales.journal import Journal, SaleRecord
    from tests.helpers import walk_to

    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.open()
    sale = journal.create(SaleRecord(sale_id="s1", order_id="KA1", source="test",
                                     flow="charge_card", terminal="SIM-0001", amount_cents=250,
                                     state=SaleState.STARTED))
    walk_to(journal, sale, SaleState.COMPLETED, trans_id="1001", captured_cents=250)
    journal.db.execute("DROP TABLE sale_later")
    journal.close()
    reader = Journal(path)
    reader.open_to_read()
    try:
        [listed] = [s for page in reader.pages() for s in page]
        assert (listed.sale_id, listed.state, listed.captured_cents) == (
            "s1", SaleState.COMPLETED, 250)
        assert listed.later_cents is None
        assert reader.get("s1") == listed
        assert reader.query(limit=25) == [listed]
    finally:
        reader.close()


async def test_a_give_back_named_as_the_agents_own_is_not_said_to_be_anothers(
    agent_factory: Any, sim_factory: Any
) -> None:
    """A completed sale's charge voided under the agent's own name (``kiosk-agent <unit>``):
    not a give-back by others, so not noted as one (what the agent gives back is its own
    figure, ``reversed``, and only its flows write it)."""
    _, agent, record = await _completed(agent_factory, sim_factory)
    await agent.service.payments.void_or_refund(record.trans_id,
                                                user_identifier=agent_user(agent.unit))

    result = await agent.journal_guard.audit.check(settled=True)

    assert result.ok, result.error
    assert result.later == []
    kept = agent.journal.get(record.sale_id)
    assert (kept.later_cents, kept.captured_cents, kept.reversed_cents) == (None, 250, 0)


async def test_nothing_is_noted_on_a_journal_found_damaged(
    agent_factory: Any, sim_factory: Any
) -> None:
    """The journal's file found damaged (its check says so: ``before_money`` False): the check
    reads, but writes no note on it, as it gives nothing back on it; once it is sound, the next
    whole read notes the refund."""
    sim, agent, record = await _completed(agent_factory, sim_factory)
    audit = agent.journal_guard.audit
    await sim_call(sim, "POST", "/sim/settle")
    await agent.service.payments.void_or_refund(record.trans_id, amount=100,
                                                user_identifier="jane")
    sound = [False]

    async def verdict() -> bool:
        return sound[0]

    audit.before_money = verdict
    damaged = await audit.check(settled=True)
    assert damaged.later == []
    assert agent.journal.get(record.sale_id).later_cents is None
    assert not [s for s in agent.journal.steps(record.sale_id) if s.step == Step.SERVICE_LATER]
    sound[0] = True
    again = await audit.check(settled=True)
    assert again.later == [record.sale_id]
    assert agent.journal.get(record.sale_id).later_cents == 100
