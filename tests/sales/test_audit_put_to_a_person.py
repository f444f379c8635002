"""What the charge check puts to a person stays the person's: the attention sweeper moves no
money on it. Real agents on the simulator over HTTP, the journal on disk."""

from __future__ import annotations

from typing import Any

import pytest

from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.models import TransStatus
from tests.sales.test_audit import (
    TIME_SCALE,
    _a_charge_and_a_sale_of_its_order_id,
    _charge,
    checked_start,
    give_backs_of,
    own,
    statuses,
    walk_to,
)


async def _swept_twice(agent: Any) -> None:
    """Two sweeps of the attention sweeper, as its schedule would make them."""
    for _ in range(2):
        await agent.attention.sweep()


async def test_a_charge_the_check_cannot_place_is_not_given_back_by_the_next_sweep(
    agent_factory: Any, sim_factory: Any
) -> None:
    """A completed sale whose own charge reporting does not show under its order id, and a
    $3.00 charge held under that order id: the check cannot tell which is the customer's
    payment and says it "gives none back; a person decides now" (attention). The sweeper then
    took that attention sale as its own to settle and voided the $3.00 at its next sweep
    ("money held without a confirmed vend"): the payment, maybe, of a customer who got the
    product. Now it moves no money on it; the sale keeps its words for the person."""
    agent, base, held, sale = await _a_charge_and_a_sale_of_its_order_id(
        agent_factory, sim_factory, 0x3C, "completed-unplaced")
    walk_to(agent.journal, sale, SaleState.COMPLETED, trans_id="T-NOT-IN-REPORTING")
    result = await agent.journal_guard.audit.check(settled=False)
    [(_, state)] = give_backs_of(agent, held)
    assert state == SaleState.ATTENTION.value

    await _swept_twice(agent)

    assert (await statuses(agent, base))[held] is TransStatus.CAPTURED  # nothing moved
    [event] = result.events
    record = agent.journal.get(event.sale_id)
    assert record is not None
    assert record.state is SaleState.ATTENTION
    assert "cannot tell" in record.message
    names = [s.step for s in agent.journal.steps(record.sale_id)]
    assert Step.REVERSE_REQUEST not in names, names
    assert Step.ATTENTION_RECHECK not in names, names


async def test_charges_too_many_to_give_back_unasked_are_not_given_back_by_the_sweeps(
    agent_factory: Any, sim_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More charges of the unit's own than ``max_give_back`` that the journal does not hold,
    in one check, smell of a wholesale mismatch (a cloned card's twin on the same terminals,
    sharing the unit's id and key, whose sales this journal never made): each is put to a
    person, none given back. The sweeper then voided each of them, one sweep later. Now the
    person decides, as the sale says."""
    sim = await sim_factory(time_scale=TIME_SCALE, transactions=0)
    agent = await checked_start(agent_factory, sim=sim)
    audit = agent.journal_guard.audit
    monkeypatch.setattr(audit, "max_give_back", 1)
    orders = [own(agent, 0x7100 + n) for n in range(2)]
    charges = [await _charge(agent, order_id, 250 + n, capture=True)
               for n, order_id in enumerate(orders)]

    result = await audit.check(settled=False)
    assert sorted(result.unaccounted) == sorted(charges)
    assert {e.state for e in result.events} == {SaleState.ATTENTION}
    assert all("too many to give back unasked" in e.message for e in result.events)

    await _swept_twice(agent)

    for order_id, trans_id in zip(orders, charges, strict=True):
        assert (await statuses(agent, order_id))[trans_id] is TransStatus.CAPTURED
        [(_, state)] = give_backs_of(agent, trans_id)
        assert state == SaleState.ATTENTION.value
