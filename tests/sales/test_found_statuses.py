"""A charge found under a sale's order id in a status other than held or given back whole.

"No charge in reporting" ends a sale FAILED ("no charge was made") once the service can no
longer answer the money call. A row under the sale's own order id that still holds part of the
money (partially refunded, by a person at the merchant's portal say), or whose status the agent
does not know, is not "no charge": the first is the sale's charge, never vended (the machine was
told not to vend), and its rest is given back as any charge found is; the second proves nothing
either way, and a person decides.
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


async def attention_sale(agent_factory: Any, sim: Any, tmp_path: Path) -> Any:
    """An agent on ``sim`` whose journal holds one ATTENTION sale ``crashed1`` (order
    KACRASHED1) whose charge's answer was never heard, its deadline past."""
    leave_open(tmp_path, state=SaleState.ATTENTION, answer_by=time.time() - 1)
    return await agent_factory(sim=sim)


async def test_a_charge_found_partly_refunded_is_given_back_not_called_no_charge(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """A sale in attention that never heard its $3.00 charge's answer; reporting shows the
    charge settled and $1.00 of it refunded (PARTIALLY_REFUNDED). Before, the sweep ended the
    sale FAILED, "no charge was made", and the $2.00 stayed on the customer's card with every
    face saying nothing was taken."""
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await attention_sale(agent_factory, sim, tmp_path)
    trans_id = await authorize(agent.service, "KACRASHED1", capture=True)
    sim.ctx.ledger.update(trans_id, trans_status_id=TransStatus.SETTLED)
    assert (await agent.service.payments.void_or_refund(trans_id, amount=100)).refunded
    [event] = await agent.attention.sweep()
    assert event.state is SaleState.REVERSED, event.message
    assert "no charge" not in event.message
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.trans_id == trans_id
    statuses = {row.trans_id: row.status for row in await rows(agent.service, "KACRASHED1")}
    assert statuses[trans_id] is TransStatus.REFUNDED  # all of it back on the card now
    refunds = [s for s in statuses.values() if s is TransStatus.REFUND]
    assert len(refunds) == 2  # the person's $1.00 and the agent's rest


async def test_a_charge_found_partly_refunded_is_told_in_what_the_agent_gave_back(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """The same sale: the agent gives back the $2.00 still held, and $1.00 was refunded before
    it looked. Before, its message said "$3.00 refunded", as if the agent had given back all
    of it. The message names each amount; the journal holds what the service does: the charge,
    and the whole of it given back (the two refunds' rows, summed as Decimal dollars)."""
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await attention_sale(agent_factory, sim, tmp_path)
    trans_id = await authorize(agent.service, "KACRASHED1", capture=True)
    sim.ctx.ledger.update(trans_id, trans_status_id=TransStatus.SETTLED)
    before = await agent.service.payments.void_or_refund(trans_id, amount=100)
    [event] = await agent.attention.sweep()
    assert event.state is SaleState.REVERSED, event.message
    found = {row.trans_id: row for row in await rows(agent.service, "KACRASHED1")}
    refunds = {t: row for t, row in found.items() if row.status is TransStatus.REFUND}
    [agents] = [row for t, row in refunds.items() if t != before.trans_id]
    assert agents.amount == Decimal("2.00")  # what the agent gave back, by the service
    assert "$2.00 refunded" in event.message, event.message
    assert "$3.00 refunded" not in event.message, event.message
    assert "$1.00 of it had been refunded before" in event.message, event.message
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.message == event.message
    # the journal holds the charge and all of it given back, as the service does
    assert Decimal(record.authorized_cents) / 100 == found[trans_id].amount
    assert Decimal(record.reversed_cents) / 100 == sum(r.amount for r in refunds.values())
    assert record.reverse_trans_id == agents.trans_id
    assert Decimal(record.captured_cents) / 100 == found[trans_id].amount  # refunded: captured


async def test_a_charge_in_a_status_the_agent_does_not_know_goes_to_a_person(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """Reporting shows the sale's charge in a status the interface does not name (42): not
    proof that no charge was made. Before, the sweep ended the sale FAILED "no charge was
    made"; it stays for a person, and no money is moved."""
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await attention_sale(agent_factory, sim, tmp_path)
    trans_id = await authorize(agent.service, "KACRASHED1", capture=True)
    sim.ctx.ledger.update(trans_id, trans_status_id=42)
    assert await agent.attention.sweep() == []
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.state is SaleState.ATTENTION, record.message
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.trans_status_id == 42  # nothing asked of the service



async def test_a_capture_reporting_shows_for_a_negative_amount_is_not_called_paid(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """Killed while capturing a $1.75 vend; reporting shows the capture made for -$1.75 (a
    sign the interface never speaks of). Not a payment: before, recovery ended the sale
    COMPLETED "dispensed and captured" with -175 captured, and the day's takings lost $1.75.
    It goes to a person, nothing negative journaled, and the sweeper after it moves no money."""
    sim = await sim_factory(time_scale=300, transactions=0)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        trans_id = await authorize(service, "KACRASHED1", capture=False)
        await service.payments.capture(trans_id, amount=175)
    sim.ctx.ledger.update(trans_id, amount_cents=-175)
    leave_open(tmp_path, state=SaleState.CAPTURING, trans_id=trans_id, authorized_cents=300,
               vended_cents=175)
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), 60)
    assert event.state is SaleState.ATTENTION, event.message
    assert event.captured_cents >= 0
    assert await agent.attention.sweep() == []
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.state is SaleState.ATTENTION
    assert min(record.captured_cents, record.authorized_cents, record.reversed_cents) >= 0
    [row] = await rows(agent.service, "KACRASHED1")
    assert (row.status, row.amount_cents) == (TransStatus.CAPTURED, -175)  # nothing asked


async def test_a_charge_found_for_a_negative_amount_decides_nothing(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """A sale in attention that never heard its charge's answer; reporting shows the charge
    held for -$3.00. The agent cannot read that figure: it journals no negative money and
    leaves the sale to a person (no void is sent on a figure it cannot read)."""
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await attention_sale(agent_factory, sim, tmp_path)
    trans_id = await authorize(agent.service, "KACRASHED1", capture=True)
    sim.ctx.ledger.update(trans_id, amount_cents=-300)
    assert await agent.attention.sweep() == []
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.state is SaleState.ATTENTION, record.message
    assert min(record.captured_cents, record.authorized_cents, record.reversed_cents) >= 0
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.CAPTURED
