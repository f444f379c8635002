"""A live sale whose money call is answered 200 with valid JSON that contradicts the request.

A real HTTP proxy sits between the agent and the simulator. The service acts on the request as
sent; the proxy then rewrites the answer of the chosen call (another order id, an empty
transaction id, another currency, a void that was not approved or gave back less). The agent
must not take such an answer for its own: it moves no money it cannot tie to its request, and
what it cannot prove goes to reporting's word, then a person (rule 13).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.sales.model import DispenseStatus, Flow, SaleRequest
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service import cable, terminal
from kiosk_agent.service.models import (
    Interaction,
    InteractionKind,
    TransStatus,
)
from kiosk_agent.service.parsing import parse_interaction
from tests.assembly.agent_helpers import ScriptedDispenser
from tests.sales.test_lost_answers import ForwardingProxy, ledger, started_agent_behind

Rewrite = Callable[[dict[str, Any]], dict[str, Any]]


class RewritingProxy(ForwardingProxy):
    """Forwards to ``target``; the first answer of a POST whose path ends with ``path`` is
    rewritten by ``rewrite`` (the service acted on the request as the agent sent it)."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.rules: dict[str, Rewrite] = {}
        self.rewritten: list[dict[str, Any]] = []  # what the service really answered
        # a POST whose path ends so is answered here, never forwarded (the service refused it)
        self.answer_instead: dict[str, Callable[[web.Request], Awaitable[web.Response]]] = {}

    async def answer(self, request: web.Request) -> web.StreamResponse:
        for path, answer_here in self.answer_instead.items():
            if request.method == "POST" and request.path.endswith(path):
                return await answer_here(request)
        status, payload, _ = await self.ask_service(request)
        rule = next((r for p, r in self.rules.items() if request.path.endswith(p)), None)
        if request.method == "POST" and rule is not None and status == 200:
            del self.rules[next(p for p in self.rules if request.path.endswith(p))]
            real = json.loads(payload)
            self.rewritten.append(real)
            payload = json.dumps(rule(dict(real))).encode()
        return web.Response(status=status, body=payload, content_type="application/json")


@pytest.fixture
async def rewriting(
    sim_factory: Any, tmp_path: Path
) -> AsyncIterator[tuple[Agent, RewritingProxy]]:
    sim = await sim_factory(time_scale=300, transactions=0)
    proxy = RewritingProxy(sim.base_url)
    await proxy.start()
    agent = await started_agent_behind(proxy, sim, tmp_path, 300)
    yield agent, proxy
    await agent.stop()
    await proxy.stop()


async def a_vending_sale(
    agent: Agent, machine: ScriptedDispenser, cents: int = 300, timeout: float = 15
) -> Any:
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=cents), machine
    )
    return sale, await asyncio.wait_for(sale.result(), timeout)


_AUTHORIZATION_CONTRADICTIONS: dict[str, Rewrite] = {
    "another-order-id": lambda a: {**a, "order_id": "KA0000000000-00000000000000000000000000"},
    "no-trans-id": lambda a: {**a, "trans_id": ""},
    "another-currency": lambda a: {**a, "currency": "EUR"},
    "another-mid": lambda a: {**a, "mid": "999000000002"},
    "nothing-approved": lambda a: {**a, "amount": 0},
    "trans-id-of-spaces": lambda a: {**a, "trans_id": "   "},
    "currency-in-lower-case-of-another": lambda a: {**a, "currency": "eur"},
}


@pytest.mark.parametrize("contradiction", list(_AUTHORIZATION_CONTRADICTIONS))
async def test_an_approval_that_contradicts_the_authorization_asked_vends_nothing(
    rewriting: tuple[Agent, RewritingProxy], contradiction: str
) -> None:
    """An approval naming another order id (or another merchant, currency, or no transaction)
    is not this sale's: the machine is told no, and the charge the service really made under
    the sale's own order id is found in reporting and given back, never captured."""
    agent, proxy = rewriting
    proxy.rules["/api/v1/charge"] = _AUTHORIZATION_CONTRADICTIONS[contradiction]
    machine = ScriptedDispenser(DispenseStatus.VENDED, vended_cents=300)
    sale, event = await a_vending_sale(agent, machine)
    assert len(proxy.rewritten) == 1
    assert machine.authorized == []  # nothing vended on an answer not its own
    assert machine.denied
    assert event.state is SaleState.REVERSED, event.message
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.VOIDED
    record = agent.journal.get(sale.sale_id)
    assert record is not None
    assert record.trans_id == proxy.rewritten[0]["trans_id"]  # the real one, from reporting
    assert [s for s in proxy.seen if s.endswith("/capture")] == []


_VOID_CONTRADICTIONS: dict[str, Rewrite] = {
    "declined": lambda a: {**a, "result": "C", "resp_text": "Declined", "resp_code": "05"},
    "retry": lambda a: {**a, "result": "B", "resp_text": "Retry", "resp_code": "91"},
    "less-given-back": lambda a: {**a, "amount": a["amount"] - 100},
    "another-trans-id": lambda a: {**a, "trans_id": "999999999999"},
    "another-order-s-refund": lambda a: {
        **a, "trans_id": "999999999999", "resp_text": "Refund approved",
        "order_id": "KA0000000000-00000000000000000000000000"},
    "another-merchant-s-refund": lambda a: {
        **a, "trans_id": "999999999999", "resp_text": "Refund approved", "mid": "999000000002"},
}


@pytest.mark.parametrize("contradiction", list(_VOID_CONTRADICTIONS))
async def test_a_give_back_answer_that_contradicts_the_void_is_checked_in_reporting(
    rewriting: tuple[Agent, RewritingProxy], contradiction: str
) -> None:
    """The vend failed, the void was sent and the service voided the whole hold; its answer
    says otherwise (declined, retry, less given back, another transaction). The sale ends on
    reporting's word: reversed, holding what reporting holds, not the answer's figures."""
    agent, proxy = rewriting
    proxy.rules["/void-or-refund"] = _VOID_CONTRADICTIONS[contradiction]
    machine = ScriptedDispenser(DispenseStatus.FAILED)
    sale, event = await a_vending_sale(agent, machine)
    assert len(proxy.rewritten) == 1
    assert event.state is SaleState.REVERSED, event.message
    assert event.reversed_cents == 300
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.VOIDED
    record = agent.journal.get(sale.sale_id)
    assert record is not None
    assert record.reverse_trans_id == proxy.rewritten[0]["trans_id"]
    assert record.reversed_cents == 300


async def test_a_void_answered_declined_that_gave_nothing_back_goes_to_a_person(
    rewriting: tuple[Agent, RewritingProxy],
) -> None:
    """A void the service really refused (answered 200, result C; reporting still shows the
    hold): the sale is not called reversed. It waits in attention for the sweeper's retry or
    a person, saying the money is still held."""
    agent, proxy = rewriting

    async def refuse(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({
            "result": "C", "trans_id": body["trans_id"], "resp_code": "12",
            "resp_text": "Void not allowed", "resp_proc": "SIM", "user_identifier": "",
            "mid": body["mid"], "amount": 0, "currency": "USD", "order_id": "",
            "auth_code": "",
        })

    proxy.answer_instead["/void-or-refund"] = refuse
    machine = ScriptedDispenser(DispenseStatus.FAILED)
    sale, event = await a_vending_sale(agent, machine)
    assert event.state is SaleState.ATTENTION, event.message
    assert "$3.00" in event.message
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.AUTHORIZED  # the money is still held: a person knows


def _without_trans_id(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "trans_id"}


def rewrite_records(
    monkeypatch: pytest.MonkeyPatch, kind: InteractionKind, rewrite: Rewrite
) -> list[dict[str, Any]]:
    """Every succeeded record of ``kind`` the terminal sends (over the socket or the status
    endpoint) reaches the client's parser naming no kind and with ``rewrite``'s result; the
    real results, in order."""
    real: list[dict[str, Any]] = []

    def rewritten(data: Any, **how: Any) -> Interaction:
        if isinstance(data, dict) and data.get("kind") == kind.value and data.get("result"):
            real.append(data["result"])
            data = {**data, "kind": None, "result": rewrite(dict(data["result"]))}
        return parse_interaction(data, **how)

    for module in (cable, terminal):
        monkeypatch.setattr(module, "parse_interaction", rewritten)
    return real


_CHARGE_CARD_CONTRADICTIONS: dict[str, Rewrite] = {
    "another-order-id": lambda r: {**r, "order_id": "KA0000000000-00000000000000000000000000"},
    "empty-trans-id": lambda r: {**r, "trans_id": ""},
    "no-trans-id": _without_trans_id,
    "amount-not-a-number": lambda r: {**r, "amount": "lots"},
    "nothing-approved": lambda r: {**r, "amount": 0},
    "another-currency": lambda r: {**r, "currency": "EUR"},
    "another-mid": lambda r: {**r, "mid": "999000000002"},
}


@pytest.mark.parametrize("contradiction", list(_CHARGE_CARD_CONTRADICTIONS))
async def test_a_charge_card_result_that_contradicts_the_charge_asked_vends_nothing(
    rewriting: tuple[Agent, RewritingProxy],
    monkeypatch: pytest.MonkeyPatch,
    contradiction: str,
) -> None:
    """The terminal's charge-card succeeded, and its record (naming no kind) names another
    order, no transaction, or cannot be read as a charge: the machine is told no, and the
    charge the service made under the sale's order id is found and given back."""
    agent, _proxy = rewriting
    rewrite = _CHARGE_CARD_CONTRADICTIONS[contradiction]
    real = rewrite_records(monkeypatch, InteractionKind.CHARGE_CARD, rewrite)
    machine = ScriptedDispenser(DispenseStatus.VENDED, vended_cents=300)
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=300), machine
    )
    event = await asyncio.wait_for(sale.result(), 15)
    assert real
    assert machine.authorized == []  # nothing vended on a result not its own
    assert event.state is SaleState.REVERSED, event.message
    assert "internal error" not in event.message
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.VOIDED
    record = agent.journal.get(sale.sale_id)
    assert record is not None
    assert record.trans_id == real[0]["trans_id"]  # the real one, from reporting


async def test_a_card_read_whose_result_cannot_be_read_fails_the_sale_with_no_money_moved(
    rewriting: tuple[Agent, RewritingProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A succeeded read-card whose record names no kind and whose result carries no token:
    nothing was charged, so the sale fails saying why (not an internal error), and the
    terminal takes the next customer."""
    agent, _proxy = rewriting
    tokenless = rewrite_records(
        monkeypatch, InteractionKind.READ_CARD,
        lambda r: {k: v for k, v in r.items() if k != "token"},
    )  # fmt: skip
    machine = ScriptedDispenser(DispenseStatus.VENDED, vended_cents=300)
    sale, event = await a_vending_sale(agent, machine)
    assert tokenless
    assert machine.authorized == []
    assert event.state is SaleState.FAILED, event.message
    assert "internal error" not in event.message, event.message
    assert await ledger(agent, sale.order_id) == []
    monkeypatch.undo()
    _next, served = await a_vending_sale(agent, ScriptedDispenser(vended_cents=300))
    assert served.state is SaleState.COMPLETED, served.message


@pytest.mark.parametrize(
    ("status", "times", "retry_after"),
    # once within patience (0 s: no real wait in the suite); every time, 429 beyond patience
    [(429, 1, "0"), (503, 1, "0"), (429, 9, "3600"), (503, 9, "1")],
)
async def test_a_give_back_met_by_retry_after_ends_as_the_service_holds_it(
    rewriting: tuple[Agent, RewritingProxy], status: int, times: int, retry_after: str
) -> None:
    """The void is answered 429 or 503 with Retry-After (once, or every time): the sale ends
    reversed only when reporting shows the hold voided, else in attention naming the money
    still held (the sweeper gives it back later)."""
    agent, proxy = rewriting
    answered: list[int] = []

    async def busy(request: web.Request) -> web.Response:
        if len(answered) >= times:
            del proxy.answer_instead["/void-or-refund"]
            return await proxy.forward(request)
        answered.append(status)
        error = "rate_limited" if status == 429 else "unavailable"
        return web.json_response(
            {"error": error}, status=status, headers={"Retry-After": retry_after}
        )

    proxy.answer_instead["/void-or-refund"] = busy
    sale, event = await a_vending_sale(agent, ScriptedDispenser(DispenseStatus.FAILED))
    assert answered
    [row] = await ledger(agent, sale.order_id)
    if event.state is SaleState.REVERSED:
        assert row.status is TransStatus.VOIDED
    else:
        assert event.state is SaleState.ATTENTION, event.message
        assert row.status is TransStatus.AUTHORIZED
        assert "$3.00" in event.message


async def test_a_capture_found_above_what_was_asked_is_put_to_a_person(
    rewriting: tuple[Agent, RewritingProxy],
) -> None:
    """The machine vended $2.00 of the $3.00 held; the capture of $2.00 reached a service
    that captured the whole $3.00 (its fault), and its answer was lost (503). Reporting shows
    $3.00 captured: the sale is not called paid $3.00 for a $2.00 vend; a person decides,
    shown the two amounts, as when the answer itself says so."""
    agent, proxy = rewriting

    async def capture_in_full(request: web.Request) -> web.Response:
        body = {k: v for k, v in (await request.json()).items() if k != "amount"}
        headers = {"Authorization": request.headers["Authorization"]}
        async with proxy._session.post(
            proxy.target + request.path_qs, json=body, headers=headers
        ) as answer:
            assert answer.status == 200, await answer.text()
        return web.json_response({"error": "unavailable"}, status=503)

    proxy.answer_instead["/api/v1/capture"] = capture_in_full
    sale, event = await a_vending_sale(agent, ScriptedDispenser(vended_cents=200))
    [row] = await ledger(agent, sale.order_id)
    assert (row.status, row.amount_cents) == (TransStatus.CAPTURED, 300)
    assert event.state is SaleState.ATTENTION, event.message
    assert "$3.00" in event.message
    assert "$2.00" in event.message


_CAPTURE_CONTRADICTIONS: dict[str, Rewrite] = {
    "another-trans-id": lambda a: {**a, "trans_id": "999999999999"},
    "less-taken": lambda a: {**a, "amount": a["amount"] - 50},
    "none-taken": lambda a: {**a, "amount": 0},
    "declined": lambda a: {**a, "result": "C", "respstat": "C", "resptext": "Declined"},
    "no-trans-id": lambda a: {k: v for k, v in a.items() if k != "trans_id"},
    "trans-id-of-spaces": lambda a: {**a, "trans_id": "   "},
}
# the answers that name the sale's own capture but say it took less: reporting's word decides
_CAPTURE_SAYING_LESS = {"less-taken", "none-taken", "declined"}


@pytest.mark.parametrize("contradiction", list(_CAPTURE_CONTRADICTIONS))
async def test_a_capture_answer_that_contradicts_the_capture_ends_on_reporting_s_word(
    rewriting: tuple[Agent, RewritingProxy], contradiction: str
) -> None:
    """The machine vended $2.00 of the $3.00 held and the service captured $2.00; its answer
    says otherwise (another transaction, less or nothing taken, declined, none named). The sale
    ends as the service holds it: completed, $2.00 captured, what every face shows, and an
    answer that said less is not the figure it ends on (reporting's is)."""
    agent, proxy = rewriting
    proxy.rules["/api/v1/capture"] = _CAPTURE_CONTRADICTIONS[contradiction]
    machine = ScriptedDispenser(DispenseStatus.VENDED, vended_cents=200)
    sale, event = await a_vending_sale(agent, machine)
    assert len(proxy.rewritten) == 1
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.CAPTURED
    assert row.amount_cents == 200
    assert event.state is SaleState.COMPLETED, event.message
    assert event.captured_cents == 200
    if contradiction in _CAPTURE_SAYING_LESS:
        assert "found in reporting" in event.message, event.message
    record = agent.journal.get(sale.sale_id)
    assert record is not None
    assert (record.state, record.captured_cents) == (SaleState.COMPLETED, 200)


async def test_an_approval_naming_the_sales_currency_in_lower_case_is_the_sales(
    rewriting: tuple[Agent, RewritingProxy],
) -> None:
    """'usd' is USD (7799c5e): the approval is the sale's own, vended and captured once; not
    a contradiction that has every sale's authorization voided."""
    agent, proxy = rewriting
    proxy.rules["/api/v1/charge"] = lambda a: {**a, "currency": "usd"}
    machine = ScriptedDispenser(DispenseStatus.VENDED, vended_cents=300)
    sale, event = await a_vending_sale(agent, machine)
    assert len(proxy.rewritten) == 1
    assert machine.authorized == [300]
    assert event.state is SaleState.COMPLETED, event.message
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.CAPTURED
    assert row.amount_cents == 300


@pytest.mark.parametrize("written", [" 0{}", "{} ", "00{}"], ids=["space-zero", "trailing",
                                                                 "zeros"])
async def test_a_capture_answer_writing_the_sales_trans_id_otherwise_is_the_sales(
    rewriting: tuple[Agent, RewritingProxy], written: str
) -> None:
    """The capture's answer names the sale's transaction written otherwise (whitespace,
    leading zeros: a string, nothing more said). It is the sale's own capture, compared as
    every trans id is (one comparison, service.trans_ids.trans_key): completed on its answer,
    not sent to reporting as an answer "naming another trans_id than asked" (where reporting
    down would have left a paid sale to a person)."""
    agent, proxy = rewriting
    proxy.rules["/api/v1/capture"] = lambda a: {**a, "trans_id": written.format(a["trans_id"])}
    machine = ScriptedDispenser(DispenseStatus.VENDED, vended_cents=300)
    sale, event = await a_vending_sale(agent, machine)
    assert len(proxy.rewritten) == 1
    [row] = await ledger(agent, sale.order_id)
    assert (row.status, row.amount_cents) == (TransStatus.CAPTURED, 300)
    assert event.state is SaleState.COMPLETED, event.message
    assert "found in reporting" not in event.message
    assert event.captured_cents == 300
