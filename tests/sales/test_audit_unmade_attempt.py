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
    own,
    statuses,
    walk_to,
)


@pytest.mark.parametrize("suffix", ["-5", "-held", "-1", "-0", "-02"])
async def test_a_charge_under_an_attempt_the_sale_never_made_is_not_given_back(
    agent_factory: Any, sim_factory: Any, suffix: str
) -> None:
    """A completed sale of one attempt, its $3.00 paid; then a $4.00 charge on the unit's
    reader under its order id with ``-5`` (or ``-held``, under which the unit never charges,
    or ``-1``, ``-0``, ``-02``, forms it never writes), made by a program that copied the order
    id from reporting. Its tag is the sale's, so the check took it for the sale's own retry,
    charged twice, and voided it (``-5``, ``-0``, ``-02``): another's money. This order id was
    never the unit's to send (the journal says the sale sent one attempt), so the charge is put
    to a person, worded, never given back (nor by the sweeper)."""
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
    assert (await agent.journal_guard.audit.check(settled=False)).unaccounted == []  # once


async def test_a_charge_under_a_suffix_the_unit_never_writes_is_not_given_back_without_a_sale(
    agent_factory: Any, sim_factory: Any
) -> None:
    """No sale of the journal under the order id (a journal lost, or a sale never made): a
    charge under the unit's order id with ``-0`` is still not one it sent (it writes attempts
    from ``-2``): put to a person, where a charge under the order id itself is given back as
    a lost journal's."""
    agent, _base, _, _ = await _a_charge_and_a_sale_of_its_order_id(
        agent_factory, sim_factory, 0x3E, "unrelated")
    orphan = own(agent, 0x3F)
    odd = await _charge(agent, f"{orphan}-0", 125, capture=True)
    lost = await _charge(agent, orphan, 150, capture=True)

    result = await agent.journal_guard.audit.check(settled=False)

    assert result.ok, result.error
    states = {trans_id: state for trans_id in (odd, lost)
              for _, state in give_backs_of(agent, trans_id)}
    assert states == {odd: SaleState.ATTENTION.value, lost: SaleState.REVERSED.value}
    assert (await statuses(agent, f"{orphan}-0"))[odd] is TransStatus.CAPTURED
    assert (await statuses(agent, orphan))[lost] is TransStatus.VOIDED
