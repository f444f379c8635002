"""An order id this unit never sent: an attack on the order id's suffix.

The tag of an order id (sales/unit.py) covers the unit id and the sale's part, not the
``-N`` of a retried attempt nor ``-held``; the journal holds how many attempts each sale
made (each journaled before it is sent). Real agents on the simulator over HTTP, the journal
on disk."""

from __future__ import annotations

from typing import Any

import pytest

from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.models import TransStatus
from tests.sales.test_audit import (
    _a_charge_and_a_sale_of_its_order_id,
    _charge,
    give_backs_of,
    statuses,
    walk_to,
)


@pytest.mark.parametrize("suffix", ["-5", "-held"])
async def test_a_charge_under_an_attempt_the_sale_never_made_is_not_given_back(
    agent_factory: Any, sim_factory: Any, suffix: str
) -> None:
    """A completed sale of one attempt, its $3.00 paid; then a $4.00 charge on the unit's
    reader under its order id with ``-5`` (or ``-held``, under which the unit never charges),
    made by a program that copied the order id from reporting. Its tag is the sale's, so the
    check took it for the sale's own retry, charged twice, and voided it: another's money.
    The journal says the sale sent one attempt: this order id was never the unit's to send,
    so the charge is put to a person, worded, never given back (nor by the sweeper)."""
    agent, base, paid, sale = await _a_charge_and_a_sale_of_its_order_id(
        agent_factory, sim_factory, 0x3D, f"paid-once{suffix}")
    walk_to(agent.journal, sale, SaleState.COMPLETED, trans_id=paid)
    copied = base + suffix
    other = await _charge(agent, copied, 400, capture=True)

    result = await agent.journal_guard.audit.check(settled=False)
    await agent.attention.sweep()

    assert result.ok, result.error
    assert (await statuses(agent, copied))[other] is TransStatus.CAPTURED
    assert (await statuses(agent, base))[paid] is TransStatus.CAPTURED
    [(_, state)] = give_backs_of(agent, other)
    assert state == SaleState.ATTENTION.value
    [event] = result.events
    record = agent.journal.get(event.sale_id)
    assert record is not None
    assert record.state is SaleState.ATTENTION
    assert "never sent" in record.message, record.message
