"""Whose give-back, where reporting shows several refunds of a charge the agent finds given
back after a restart (sales/steps.py ``given_back_found``): the words name each refund's
maker, never the latest's for all of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiosk_agent.sales.states import SaleState
from kiosk_agent.sales.steps import agent_user
from tests.sales.test_recovery import leave_open
from tests.sales.test_who_gave_back import _charge, _restarted


async def test_a_persons_refund_and_the_agents_found_together_are_each_said_to_be_whose(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """A person refunds $1.00 of the $3.00 charge at the service (naming themself) while the
    agent is down; the agent, killed giving the money back (its journal had nothing refunded
    before), had its refund of the $2.00 left made, unanswered. The next start finds the charge
    refunded, $3.00 back in all: right. Its words said "$3.00 refunded by the agent", the
    latest refund's maker named for the whole: the person's $1.00 given to the agent."""
    sim = await sim_factory(time_scale=300, transactions=0)
    first = await agent_factory(sim=sim)
    own = agent_user(first.sales.context.unit)
    await first.stop()
    service, trans_id = await _charge(sim, settled=True)
    try:
        assert (await service.payments.void_or_refund(
            trans_id, amount=100, user_identifier="jane")).refunded
        assert (await service.payments.void_or_refund(
            trans_id, amount=200, user_identifier=own)).refunded
    finally:
        await service.__aexit__(None, None, None)
    leave_open(tmp_path, state=SaleState.REVERSING, trans_id=trans_id, authorized_cents=300,
               captured_cents=300, message="dispense failed")
    _, event, record = await _restarted(agent_factory, sim)
    assert record is not None
    assert event.message == record.message
    assert (record.state, record.reversed_cents) == (SaleState.REVERSED, 300), record.message
    assert "$3.00 refunded by the agent" not in record.message, record.message
    assert "$1.00 ('jane')" in record.message, record.message
    assert "$2.00 (the agent's)" in record.message, record.message
