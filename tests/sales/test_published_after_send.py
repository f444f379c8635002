"""Attack on publishing a sale's opening and its authorization's intent two loop turns after
their commit (8a1e44a): every face hears each step the journal holds, in the journal's order,
and none it does not hold, whatever ends the sale or the agent inside those two turns."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3

import pytest

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.sales.model import Flow, SaleEvent, SaleRequest
from kiosk_agent.sales.states import SaleState, Step
from tests.assembly.agent_helpers import ScriptedDispenser
from tests.helpers import hearing

WAIT_S = 60.0


def vend(cents: int = 300, flow: Flow = Flow.AUTHORIZE_CAPTURE) -> SaleRequest:
    return SaleRequest(source="test", flow=flow, amount_cents=cents)


def journal_says(agent: Agent, sale_id: str) -> list[str]:
    """The sale's steps as the journal holds them, in order; ``cancel.requested`` is a note of
    the journal's alone (never published, as before 8a1e44a)."""
    with contextlib.closing(sqlite3.connect(agent.journal.path)) as db:  # open or closed
        rows = db.execute("SELECT step FROM steps WHERE sale_id = ? ORDER BY id", (sale_id,))
        return [step for (step,) in rows if step != Step.CANCEL_REQUESTED]


def faces_heard(heard: list[SaleEvent], sale_id: str) -> list[str]:
    return [event.step for event in heard if event.sale_id == sale_id]


@pytest.mark.parametrize("flow", [Flow.AUTHORIZE_CAPTURE, Flow.CHARGE_CARD])
async def test_a_sale_cancelled_in_the_turn_it_opened_is_heard_step_for_step(
    agent: Agent, flow: Flow
) -> None:
    # the customer's cancel heard in the turn that started the sale (a kiosk app's cancel, an
    # MDB vend cancel in the same read), while its opening still waits its two turns: heard
    # whole, in the journal's order, the opening before the end
    with hearing(agent) as heard:
        sale = await agent.sales.start(vend(flow=flow), ScriptedDispenser(vended_cents=300))
        assert faces_heard(heard, sale.sale_id) == []  # the journal holds it: two turns on
        assert journal_says(agent, sale.sale_id)[:2] == [Step.CREATED, _first_request(flow)]
        assert await agent.sales.cancel(sale.sale_id)
        final = await asyncio.wait_for(sale.result(), WAIT_S)
    # cancelled at the read; charge_card's charge may be made first, then given back
    assert final.state in (SaleState.CANCELLED, SaleState.REVERSED)
    assert faces_heard(heard, sale.sale_id) == journal_says(agent, sale.sale_id)
    assert heard[-1].state is final.state


@pytest.mark.parametrize("flow", [Flow.AUTHORIZE_CAPTURE, Flow.CHARGE_CARD])
async def test_an_agent_stopped_in_the_turn_a_sale_opened_leaves_no_step_unheard(
    agent: Agent, flow: Flow
) -> None:
    # the stop begins in the turn the sale opened, before its opening is published: the
    # listeners (health, Home Assistant, the streams, `kiosk-agent events`) hear every step the
    # journal holds, the opening first, and nothing it does not hold
    with hearing(agent) as heard:
        sale = await agent.sales.start(vend(flow=flow), ScriptedDispenser(vended_cents=300))
        assert faces_heard(heard, sale.sale_id) == []
        await asyncio.wait_for(agent.stop(), WAIT_S)
    said = journal_says(agent, sale.sale_id)
    assert said[:2] == [Step.CREATED, _first_request(flow)]
    assert faces_heard(heard, sale.sale_id) == said


def _first_request(flow: Flow) -> Step:
    if flow is Flow.AUTHORIZE_CAPTURE:
        return Step.READ_CARD_REQUEST
    return Step.CHARGE_CARD_REQUEST
