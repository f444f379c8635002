"""The charge check: what reporting holds that the journal says never moved is given back."""

from __future__ import annotations

from typing import Any

from kiosk_agent.sales.audit import HELD_SUFFIX
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.models import ChargeRequest, TransactionFilter, TransStatus
from kiosk_agent.service.settings import CallKind

from .test_recovery import leave_open


async def test_a_charge_held_under_a_sale_the_journal_ended_uncharged_is_given_back(
    agent_factory: Any, tmp_path: Any
) -> None:
    """A journal that lost its WAL after the authorization's step: recovery saw the card read
    and nothing after it, and ended the sale failed ("no money moved"). The service still holds
    the charge: the check gives it back, under a sale of its own, and leaves the ended one as it
    is (final). A second check finds nothing more to do."""
    order = "KA" + "0123456789ABCDEF01"
    leave_open(tmp_path, state=SaleState.FAILED, order_id=order)
    agent = await agent_factory()
    # the authorization the lost part of the journal had sent, as the flow sends it
    handle = await agent.service.terminal.read_card("SIM-0001", 300)
    card = (await handle.wait(timeout=5)).read_card_result
    assert card is not None
    charged = await agent.service.payments.charge(ChargeRequest(
        mid=agent.service.settings.mid, amount=300, account_token=card.token,
        expiration=card.expiration, capture=False, order_id=order, terminal_id="SIM-0001",
    ))
    assert charged.approved
    trans_id = charged.trans_id

    result = await agent.journal_guard.audit.check()

    assert result.unaccounted == [trans_id], result
    [event] = result.events
    assert event.state is SaleState.REVERSED
    held = agent.journal.by_order_id(order + HELD_SUFFIX)
    assert held is not None
    assert held.state is SaleState.REVERSED
    assert [s.step for s in agent.journal.steps(held.sale_id)][:2] == [
        Step.CREATED, Step.AUDIT_FOUND
    ]
    ended = agent.journal.by_order_id(order)
    assert ended is not None
    assert ended.state is SaleState.FAILED
    rows = [t async for t in agent.service.reporting.transactions(
        TransactionFilter(order_id=order))]
    assert [t.status for t in rows] == [TransStatus.VOIDED]
    again = await agent.journal_guard.audit.check()
    assert again.unaccounted == []


async def test_a_check_asks_reporting_once_a_terminal(agent_factory: Any) -> None:
    """Reporting's ``q`` filters by equalities only: the statuses that hold money are picked
    from one query a terminal, not asked for one by one (three round trips a terminal, on every
    start before the triggers and every check after)."""
    agent = await agent_factory()
    audit = agent.journal_guard.audit
    kinds: list[CallKind] = []
    forget = agent.service.transport.observe(lambda kind, _started, _outcome: kinds.append(kind))
    try:
        result = await audit.check()
    finally:
        forget()
    assert result.ok, result.error
    assert len(audit.settings.terminals) > 1
    assert kinds.count(CallKind.REPORT) == len(audit.settings.terminals)
