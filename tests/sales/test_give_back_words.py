"""A give-back (void or refund) that did not give the money back says what happened.

A 429 is the service asking to wait, a 5xx its failure, a lost or unreadable answer no answer:
none of them is a refusal, and the sale's words (its journal message, what the status page and
`kiosk-agent sales` show) say which it was, that the money is still held, and when the agent
tries again. Only an answer refusing the request (a 4xx that is not 429) is worded "refused".
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.sales.model import DispenseStatus
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.models import TransStatus
from tests.assembly.agent_helpers import ScriptedDispenser
from tests.sales.test_contradicting_answers import RewritingProxy, a_vending_sale, rewriting
from tests.sales.test_lost_answers import ledger

__all__ = ["rewriting"]


async def _rate_limited(request: web.Request) -> web.StreamResponse:
    return web.json_response({"error": "rate_limited"}, status=429,
                             headers={"Retry-After": "3600"})


async def _server_error(request: web.Request) -> web.StreamResponse:
    return web.json_response({"error": "internal"}, status=500)


async def _unreadable(request: web.Request) -> web.StreamResponse:
    return web.Response(status=200, body=b"<html>gateway</html>", content_type="text/html")


async def _lost(request: web.Request) -> web.StreamResponse:
    assert request.transport is not None
    request.transport.close()
    raise asyncio.CancelledError


async def _refused(request: web.Request) -> web.StreamResponse:
    return web.json_response(
        {"error": "not_allowed", "error_description": "void window closed"}, status=403
    )


# the void is never forwarded: the service gave nothing back, reporting shows the hold
_FAILURES = {
    "rate-limited": (_rate_limited, "the service rate-limited the void or refund (429"),
    "server-error": (_server_error, "the service answered 500 to the void or refund"),
    "unreadable": (_unreadable, "the void or refund's answer could not be read"),
    "lost": (_lost, "the void or refund's answer was lost"),
    "refused": (_refused, "the service refused the void or refund"),
}


@pytest.mark.parametrize("failure", list(_FAILURES))
async def test_a_give_back_that_failed_says_what_happened(
    rewriting: tuple[Agent, RewritingProxy], failure: str
) -> None:
    agent, proxy = rewriting
    answer, words = _FAILURES[failure]
    proxy.answer_instead["/void-or-refund"] = answer
    sale, event = await a_vending_sale(agent, ScriptedDispenser(DispenseStatus.FAILED))
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.AUTHORIZED  # still held
    assert event.state is SaleState.ATTENTION, event.message
    assert words in event.message, event.message
    assert "$3.00" in event.message  # what the agent still gives back
    assert "tries again at" in event.message  # and when
    if failure != "refused":
        assert "refused" not in event.message, event.message
    steps = [s.step for s in agent.journal.steps(sale.sale_id)]
    assert steps[-1] == Step.REVERSE_FAILED
