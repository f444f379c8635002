"""ATTENTION sales: the sweeper ends them once reporting knows; a person resolves the rest."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.sales.journal import Journal
from kiosk_agent.sales.model import Flow, money_text
from kiosk_agent.sales.resolve import NotInAttention, ResolveError, UnknownSale, resolve
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.errors import ServiceUnreachableError
from kiosk_agent.service.models import TransStatus
from tests.sales.test_recovery import authorize, crashed_charge, leave_open, rows


async def attention_sale(agent_factory: Any, tmp_path: Path, **fields: Any) -> Any:
    """An agent whose journal holds one ATTENTION sale ``crashed1`` (order KACRASHED1)."""
    leave_open(tmp_path, state=SaleState.ATTENTION, answer_by=time.time() - 1, **fields)
    return await agent_factory()


def found_in_reporting(agent: Any, trans_id: str) -> None:
    """The charge of ``crashed1`` as a sweep finds it in reporting (its trans_id journaled)."""
    record = agent.journal.get("crashed1")
    agent.journal.record(record, Step.ATTENTION_FOUND, trans_id=trans_id)


async def test_an_authorization_vended_and_left_open_is_captured(
    agent_factory: Any, tmp_path: Path, sim_factory: Any
) -> None:
    agent = await attention_sale(agent_factory, tmp_path, vended_cents=250)
    trans_id = await authorize(agent.service, "KACRASHED1", capture=False)
    found_in_reporting(agent, trans_id)
    [event] = await agent.attention.sweep()
    assert event.state is SaleState.COMPLETED, event.message
    assert event.captured_cents == 250
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.CAPTURED
    assert agent.attention.stats.ended == 1
    assert agent.health.snapshot().sales.attention == 0


async def test_a_charge_captured_above_the_price_asked_stays_for_a_person(
    agent_factory: Any, tmp_path: Path
) -> None:
    # the service answered a charge above the price (a unit mistake somewhere): the sale went to
    # attention; reporting showing it captured must not end it "paid" as if all were well
    agent = await attention_sale(
        agent_factory, tmp_path, flow=Flow.CHARGE_CARD.value, amount_cents=250, vended_cents=250
    )
    trans_id = await authorize(agent.service, "KACRASHED1", capture=True)  # $3.00 taken
    found_in_reporting(agent, trans_id)
    assert await agent.attention.sweep() == []
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.state is SaleState.ATTENTION
    assert agent.health.snapshot().sales.attention == 1


async def test_money_held_without_a_vend_is_given_back(agent_factory: Any, tmp_path: Path) -> None:
    agent = await attention_sale(agent_factory, tmp_path)
    trans_id = await authorize(agent.service, "KACRASHED1", capture=False)
    found_in_reporting(agent, trans_id)
    [event] = await agent.attention.sweep()
    assert event.state is SaleState.REVERSED
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.VOIDED


async def test_a_charge_found_later_by_order_id_is_voided(
    agent_factory: Any, tmp_path: Path
) -> None:
    agent = await attention_sale(agent_factory, tmp_path)  # no trans_id: reporting was down
    await authorize(agent.service, "KACRASHED1", capture=False)
    [event] = await agent.attention.sweep()
    assert event.state is SaleState.REVERSED
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.VOIDED


async def test_no_charge_after_the_deadline_ends_failed(
    agent_factory: Any, tmp_path: Path
) -> None:
    agent = await attention_sale(agent_factory, tmp_path)
    [event] = await agent.attention.sweep()
    assert event.state is SaleState.FAILED
    assert "no charge was made" in event.message


async def test_no_charge_before_the_deadline_proves_nothing(
    agent_factory: Any, tmp_path: Path
) -> None:
    leave_open(tmp_path, state=SaleState.ATTENTION, answer_by=time.time() + 60)
    agent = await agent_factory()
    assert await agent.attention.sweep() == []
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.state is SaleState.ATTENTION


async def test_an_unreachable_reporting_leaves_the_sale_for_the_next_sweep(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    leave_open(tmp_path, state=SaleState.ATTENTION, answer_by=time.time() - 1)
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await agent_factory(sim=sim)
    await sim.stop()
    assert await agent.attention.sweep() == []
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.state is SaleState.ATTENTION
    assert agent.attention.stats.errors == 0  # not an error: reporting cannot say yet


async def test_a_person_resolves_an_attention_sale(agent_factory: Any, tmp_path: Path) -> None:
    agent = await attention_sale(agent_factory, tmp_path, authorized_cents=300, vended_cents=300)
    resolved = resolve(
        agent.journal,
        "crashed1",
        "captured",
        "captured in the portal, card 4111 1111 1111 1111",
        "cli (root)",
        agent.events,
    )
    assert resolved.state is SaleState.COMPLETED
    assert resolved.captured_cents == 300
    info = json.loads(resolved.resolution or "{}")
    assert info["as"] == "captured"
    assert info["by"] == "cli (root)"
    assert "4111 1111 1111 1111" not in info["why"]  # card numbers never reach the journal
    assert agent.journal.steps("crashed1")[-1].step == "attention.resolved"
    with pytest.raises(NotInAttention, match="completed, not attention"):
        resolve(agent.journal, "crashed1", "reversed", "again", "cli")


@pytest.mark.parametrize(
    ("sale_id", "as_", "why", "error", "message"),
    [
        ("crashed1", "refunded", "x", ResolveError, "one of captured, reversed"),
        ("crashed1", "reversed", "   ", ResolveError, "say why"),
        ("crashed1", "reversed", "x" * 501, ResolveError, "at most 500"),
        ("nosuchsale", "reversed", "x", UnknownSale, "no sale 'nosuchsale'"),
    ],
)
async def test_a_resolution_must_say_what_and_why(
    agent_factory: Any,
    tmp_path: Path,
    sale_id: str,
    as_: str,
    why: str,
    error: type[Exception],
    message: str,
) -> None:
    agent = await attention_sale(agent_factory, tmp_path)
    with pytest.raises(error, match=message):
        resolve(agent.journal, sale_id, as_, why, "cli")
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.state is SaleState.ATTENTION


async def test_a_charge_made_after_its_sale_ended_with_none_is_given_back(
    agent_factory: Any, tmp_path: Path
) -> None:
    # A service slower than its answer margin: the sale ended "no charge was made", then the
    # authorization went through after all.
    leave_open(tmp_path, state=SaleState.UNRESOLVED, answer_by=time.time() - 1)
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    record = journal.get("crashed1")
    assert record is not None
    journal.record(record, Step.AUTHORIZE_NONE, SaleState.FAILED, message="no charge was made")
    journal.close()
    agent = await agent_factory()
    await authorize(agent.service, "KACRASHED1", capture=False)
    [event] = await agent.attention.sweep()
    assert event.state is SaleState.REVERSED, event.message
    assert "after the sale had ended" in event.message
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.VOIDED
    assert agent.attention.stats.late_charges == 1
    assert await agent.attention.sweep() == []  # once given back, never again
    # found and reopened in one write: a crash before the void leaves an open sale
    [found] = [s for s in agent.journal.steps("crashed1") if s.step == Step.LATE_FOUND]
    assert found.state is SaleState.REVERSING


async def test_a_late_charge_found_just_before_a_crash_is_given_back_by_recovery(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """``late.found`` reopens the sale (REVERSING) in the write that journals the charge: an
    agent killed before the void leaves an open sale, which the next start gives back."""
    sim = await sim_factory(time_scale=300, transactions=0)
    trans_id = await crashed_charge(sim, capture=False)
    leave_open(tmp_path, state=SaleState.UNRESOLVED, answer_by=time.time() - 1)
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    record = journal.get("crashed1")
    assert record is not None
    record = journal.record(record, Step.AUTHORIZE_NONE, SaleState.FAILED)
    journal.record(record, Step.LATE_FOUND, SaleState.REVERSING, trans_id=trans_id,
                   authorized_cents=300)  # the sweeper's write; then the crash
    journal.close()
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), 10)
    assert event.state is SaleState.REVERSED, event.message
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.VOIDED


async def test_a_sale_that_failed_for_another_reason_is_not_looked_up(
    agent_factory: Any, tmp_path: Path
) -> None:
    leave_open(tmp_path, state=SaleState.FAILED, message="no card was presented")
    agent = await agent_factory()
    await authorize(agent.service, "KACRASHED1", capture=False)  # not this sale's doing
    assert await agent.attention.sweep() == []


class _SlowReader(Journal):
    """The journal as a second process has it open (its own SQLite connection to the same file)
    that reads the sale, and then loses the CPU to ``meanwhile`` before it writes."""

    meanwhile: Any = None

    def get(self, sale_id: str) -> Any:
        record = super().get(sale_id)
        if self.meanwhile is not None:
            run, self.meanwhile = self.meanwhile, None
            run()
        return record


async def test_two_people_resolving_at_once_journal_one_resolution(
    agent_factory: Any, tmp_path: Path
) -> None:
    """The CLI (its own process) and the admin API resolve the same sale at the same moment: one
    resolution is journaled, the other is told the sale is no longer in ATTENTION."""
    agent = await attention_sale(agent_factory, tmp_path, authorized_cents=300, vended_cents=300)
    cli = _SlowReader(agent.journal.path)
    cli.open()
    try:
        cli.meanwhile = lambda: resolve(agent.journal, "crashed1", "captured", "api", "admin API")
        with pytest.raises(NotInAttention, match="completed, not attention"):
            resolve(cli, "crashed1", "reversed", "refunded by hand", "cli (root)")
    finally:
        cli.close()
    steps = [s.step for s in agent.journal.steps("crashed1")]
    assert steps.count("attention.resolved") == 1
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.state is SaleState.COMPLETED
    assert json.loads(record.resolution or "{}")["by"] == "admin API"


@pytest.mark.parametrize(
    "why",
    [
        "refunded \x1b[2J\x1b[31mby hand",  # a terminal escape: `kiosk-agent sales` prints it
        "refunded\u202e dnah yb",  # right-to-left override: the text reads otherwise
        "refunded\x00 by hand",
    ],
)
async def test_a_reason_with_control_characters_is_refused(
    agent_factory: Any, tmp_path: Path, why: str
) -> None:
    agent = await attention_sale(agent_factory, tmp_path)
    with pytest.raises(ResolveError, match=r"--why holds a control character \(U\+"):
        resolve(agent.journal, "crashed1", "reversed", why, "cli")
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.state is SaleState.ATTENTION


async def test_a_person_resolving_while_the_sweeper_decides_wins(
    agent_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweeper has asked reporting and checked the sale is still ATTENTION; at that moment a
    tech runs `kiosk-agent sales resolve --as reversed` (another process, its own connection).
    The sweeper must not then capture the money nor write the sale back to ATTENTION."""
    agent = await attention_sale(agent_factory, tmp_path, vended_cents=250)
    trans_id = await authorize(agent.service, "KACRASHED1", capture=False)
    found_in_reporting(agent, trans_id)
    cli = Journal(agent.journal.path)
    cli.open()
    real_get = agent.journal.get
    reads = []

    def get(sale_id: str) -> Any:
        record = real_get(sale_id)
        reads.append(sale_id)
        if len(reads) == 1:  # the sweeper's "still attention?" read, right after reporting
            resolve(cli, "crashed1", "reversed", "voided in the portal", "cli (root)")
        return record

    monkeypatch.setattr(agent.journal, "get", get)
    try:
        ended = await agent.attention.sweep()
    finally:
        cli.close()
    assert reads  # the sweeper did look
    assert ended == []
    monkeypatch.undo()
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.state is SaleState.REVERSED  # the person's word stands
    assert agent.journal.steps("crashed1")[-1].step == "attention.resolved"
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is not TransStatus.CAPTURED  # no money moved after the person decided
    assert agent.attention.stats.errors == 0


async def test_a_bug_in_a_recheck_is_an_unexpected_error_in_health_an_outage_is_not(
    agent_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = await attention_sale(agent_factory, tmp_path)

    async def service_down(steps: Any) -> None:
        raise ServiceUnreachableError("reporting: connection refused")

    monkeypatch.setattr(agent.attention, "recheck", service_down)
    await agent.attention.sweep()
    assert (agent.attention.stats.errors, agent.attention.stats.unexpected) == (1, 0)
    assert not any("unexpected" in p for p in agent.health.snapshot().problems)

    async def bug(steps: Any) -> None:
        raise KeyError("trans_id")

    monkeypatch.setattr(agent.attention, "recheck", bug)
    await agent.attention.sweep()
    assert (agent.attention.stats.errors, agent.attention.stats.unexpected) == (2, 1)
    snapshot = agent.health.snapshot()
    assert snapshot.errors["attention sweeper"] == 1
    assert any(p.startswith("unexpected errors, logged with their tracebacks: attention sweeper")
               for p in snapshot.problems)
    assert agent.journal.get("crashed1").state is SaleState.ATTENTION  # the sale waits for the next


def test_a_charge_card_resolved_as_given_back_shows_it_taken_and_given_back(
    tmp_path: Path,
) -> None:
    # a charge-card whose answer was lost: the person found the charge and refunded it by hand
    leave_open(tmp_path, state=SaleState.ATTENTION, flow=Flow.CHARGE_CARD.value)
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    try:
        resolved = resolve(journal, "crashed1", "reversed", "refunded in the portal", "cli")
    finally:
        journal.close()
    assert (resolved.captured_cents, resolved.reversed_cents) == (300, 300)
    assert money_text(resolved) == "nothing charged ($3.00 given back)"  # not a hold released
