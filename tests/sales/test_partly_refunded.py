"""A charge partly refunded before the agent gave back the rest, attacked on the real simulator.

Rule 13: the agent gives back exactly the rest its sale still holds, never more, and what it
cannot prove goes to a person. Each test sets the service's ledger as a person at the merchant's
portal, a crash or a slow reporting would leave it, lets the agent act, and reads the journal
against the simulator's own rows in Decimal dollars.
"""

from __future__ import annotations

import asyncio
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import TransStatus
from tests.sales.test_recovery import authorize, leave_open, rows

WAIT_S = 60.0


def _given_back(found: list[Any], trans_id: str) -> Decimal:
    """What the service shows given back of ``trans_id``: its refunds' own rows, in dollars."""
    return sum((r.amount for r in found
                if r.status is TransStatus.REFUND and r.related_trans_id == trans_id),
               Decimal("0"))


async def test_a_crash_after_the_rest_was_refunded_journals_the_charge_given_back_once(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """$1.00 of a $3.00 charge was refunded by a person; the agent journaled the charge (300
    captured, 100 given back before), asked to refund the rest, and crashed before it heard the
    answer, which went through. After the restart, recovery reads the charge refunded and ends
    the sale. Before, it took the charge row's $3.00 for what the agent gave back: "$3.00
    refunded", reversed 400 cents of a 300 cent charge."""
    sim = await sim_factory(time_scale=300, transactions=0)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        trans_id = await authorize(service, "KACRASHED1", capture=True)
        sim.ctx.ledger.update(trans_id, trans_status_id=TransStatus.SETTLED)
        assert (await service.payments.void_or_refund(trans_id, amount=100)).refunded
        assert (await service.payments.void_or_refund(trans_id)).amount == 200  # the agent's
    leave_open(tmp_path, state=SaleState.REVERSING, trans_id=trans_id, authorized_cents=300,
               captured_cents=300, reversed_cents=100, message="a charge found, not vended")
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    assert event.state is SaleState.REVERSED, event.message
    found = await rows(agent.service, "KACRASHED1")
    assert _given_back(found, trans_id) == Decimal("3.00")
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.reversed_cents == 300, record.message  # never more than the charge
    assert record.captured_cents == 300
    assert "$2.00 refunded" in record.message, record.message
    assert "$1.00 of it had been refunded before" in record.message, record.message


async def test_a_crash_before_the_rest_was_refunded_gives_back_the_rest_only(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """The same crash, the refund never sent: recovery gives back the $2.00 still held, and
    the service's refunds of the charge sum to the charge, not above it."""
    sim = await sim_factory(time_scale=300, transactions=0)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        trans_id = await authorize(service, "KACRASHED1", capture=True)
        sim.ctx.ledger.update(trans_id, trans_status_id=TransStatus.SETTLED)
        assert (await service.payments.void_or_refund(trans_id, amount=100)).refunded
    leave_open(tmp_path, state=SaleState.REVERSING, trans_id=trans_id, authorized_cents=300,
               captured_cents=300, reversed_cents=100, message="a charge found, not vended")
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    assert event.state is SaleState.REVERSED, event.message
    found = await rows(agent.service, "KACRASHED1")
    refunds = sorted(r.amount for r in found if r.status is TransStatus.REFUND)
    assert refunds == [Decimal("1.00"), Decimal("2.00")]
    record = agent.journal.get("crashed1")
    assert record is not None
    assert (record.captured_cents, record.reversed_cents) == (300, 300), record.message
    assert "$2.00 refunded" in record.message, record.message


async def test_a_charge_partly_refunded_then_shown_voided_is_never_given_back_above_it(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """A void after a partial refund: the journal holds the $3.00 charge with $1.00 refunded
    before, and reporting now shows the charge voided (its row still reads $3.00). A void
    releases what was still held, the $2.00: the sale ends given back 300 cents in all. Before,
    the void's row was read as $3.00 given back on top of the $1.00: reversed 400 cents."""
    sim = await sim_factory(time_scale=300, transactions=0)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        trans_id = await authorize(service, "KACRASHED1", capture=True)
        sim.ctx.ledger.update(trans_id, trans_status_id=TransStatus.SETTLED)
        assert (await service.payments.void_or_refund(trans_id, amount=100)).refunded
    sim.ctx.ledger.update(trans_id, trans_status_id=TransStatus.VOIDED)
    leave_open(tmp_path, state=SaleState.REVERSING, trans_id=trans_id, authorized_cents=300,
               captured_cents=300, reversed_cents=100, message="a charge found, not vended")
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    assert event.state is SaleState.REVERSED, event.message
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.reversed_cents == 300, record.message
    assert "$2.00 voided" in record.message, record.message


async def attention_sale(agent_factory: Any, sim: Any, tmp_path: Path) -> Any:
    """An agent on ``sim`` whose journal holds one ATTENTION sale ``crashed1`` (KACRASHED1)
    whose charge's answer was never heard, its deadline past."""
    leave_open(tmp_path, state=SaleState.ATTENTION, answer_by=time.time() - 1)
    return await agent_factory(sim=sim)


async def test_a_refund_row_in_a_status_the_agent_does_not_know_decides_nothing(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """$1.00 and $0.50 of the $3.00 charge were refunded; reporting shows the $0.50 refund's
    row in a status the interface does not name. It may have given money back or not: what
    the charge still holds cannot be told, so the agent refunds nothing and the sale stays
    for a person. Before, the row was left out of the sum: the agent took $2.00 for the rest,
    was given back the $1.50 the service had left, and said "$2.00 refunded"."""
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await attention_sale(agent_factory, sim, tmp_path)
    trans_id = await authorize(agent.service, "KACRASHED1", capture=True)
    sim.ctx.ledger.update(trans_id, trans_status_id=TransStatus.SETTLED)
    assert (await agent.service.payments.void_or_refund(trans_id, amount=100)).refunded
    odd = await agent.service.payments.void_or_refund(trans_id, amount=50)
    sim.ctx.ledger.update(odd.trans_id, trans_status_id=42)
    assert await agent.attention.sweep() == []
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.state is SaleState.ATTENTION
    assert record.reversed_cents == 0
    found = await rows(agent.service, "KACRASHED1")
    assert sorted(r.amount for r in found if r.related_trans_id == trans_id) == [
        Decimal("0.50"), Decimal("1.00")]  # the agent gave back nothing
