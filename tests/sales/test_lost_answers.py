"""A live sale whose answer is lost on the way back: reconciled by order_id, never re-sent blind.

A real HTTP proxy sits between the agent and the simulator. It forwards every request, and for
the chosen call it lets the service act and then cuts the connection instead of answering.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kiosk_agent.app import build_agent
from kiosk_agent.assembly.agent import Agent
from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.config.load import load_config
from kiosk_agent.sales.model import DispenseStatus, Flow, SaleEvent, SaleRequest
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.models import TransactionFilter, TransStatus
from kiosk_agent.web.server import LocalSite
from tests.assembly.agent_helpers import ScriptedDispenser


class ForwardingProxy:
    """Forwards every request to ``target``, noting each; a subclass chooses what goes back."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.seen: list[str] = []
        self._site = LocalSite("127.0.0.1", 0)

    async def start(self) -> None:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.forward)
        await self._site.start(app)
        self.url = self._site.url

    async def stop(self) -> None:
        await self._session.close()
        await self._site.stop()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(f"{request.method} {request.path}")
        return await self.answer(request)

    async def answer(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def ask_service(self, request: web.Request) -> tuple[int, bytes, str]:
        """The service's status, body and content type for ``request`` as the agent sent it."""
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with self._session.request(
            request.method, self.target + request.path_qs, data=body, headers=headers
        ) as answer:
            payload = await answer.read()
            return answer.status, payload, answer.headers.get("Content-Type", "application/json")


class AnswerLosingProxy(ForwardingProxy):
    """Forwards to ``target``; swallows the answer of the first request whose path ends so."""

    def __init__(self, target: str, lose: str) -> None:
        super().__init__(target)
        self.lose = lose
        self.lost = 0
        self.lost_answers: list[bytes] = []  # what the service answered, never forwarded

    async def answer(self, request: web.Request) -> web.StreamResponse:
        status, payload, content_type = await self.ask_service(request)
        if request.method == "POST" and request.path.endswith(self.lose) and not self.lost:
            self.lost += 1
            self.lost_answers.append(payload)
            assert request.transport is not None
            request.transport.close()  # the service acted; the agent hears nothing
            raise asyncio.CancelledError
        return web.Response(status=status, body=payload, headers={"Content-Type": content_type})


async def started_agent_behind(
    proxy: ForwardingProxy, sim: Any, tmp_path: Path, time_scale: int
) -> Agent:
    """An agent whose money calls go through ``proxy``; reporting and events go straight."""
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        textwrap.dedent(
            f"""\
            service: {{simulator: {{time_scale: {time_scale}}}}}
            terminals: [{{device_id: SIM-0001}}]
            journal: {{path: journal.db}}
            """
        )
    )
    settings = settings_from_ready(sim.ready_info()).model_copy(
        update={"base_url": proxy.url, "reporting_url": sim.base_url, "ws_url": sim.ws_url}
    )
    agent = build_agent(load_config(config_path), settings, systemd=False)
    await agent.start()
    return agent


@pytest.fixture
async def lossy(
    sim_factory: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Agent, AnswerLosingProxy]]:
    # a lost card read's (or another's pending one) 3-minute lifetime is 9 s here, never the
    # 0.6 s that a loaded machine's next sale could miss (the tests end such a read themselves,
    # once they see it waited for)
    scale = 20 if request.param in ("/read-card", "/no-call-ends-so") else 300
    sim = await sim_factory(time_scale=scale, transactions=0)
    proxy = AnswerLosingProxy(sim.base_url, request.param)
    await proxy.start()
    agent = await started_agent_behind(proxy, sim, tmp_path, scale)
    yield agent, proxy
    await agent.stop()
    await proxy.stop()


async def ledger(agent: Agent, order_id: str) -> list[Any]:
    query = TransactionFilter(order_id=order_id)
    return [t async for t in agent.service.reporting.transactions(query)]


@pytest.mark.parametrize("lossy", ["/charge-card"], indirect=True)
async def test_a_lost_charge_card_answer_is_found_and_given_back(
    lossy: tuple[Agent, AnswerLosingProxy],
) -> None:
    agent, proxy = lossy
    machine = ScriptedDispenser()
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=250), machine
    )
    event = await asyncio.wait_for(sale.result(), 15)
    assert proxy.lost == 1
    assert [s for s in proxy.seen if s.endswith("/charge-card")] == [
        "POST /api/terminal/SIM-0001/charge-card"
    ]  # never sent twice
    assert event.state is SaleState.REVERSED
    assert machine.authorized == []
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.VOIDED


@pytest.mark.parametrize("lossy", ["/api/v1/charge"], indirect=True)
async def test_a_lost_authorization_answer_is_found_and_voided(
    lossy: tuple[Agent, AnswerLosingProxy],
) -> None:
    agent, proxy = lossy
    machine = ScriptedDispenser()
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=300), machine
    )
    event = await asyncio.wait_for(sale.result(), 15)
    assert proxy.lost == 1
    assert event.state is SaleState.REVERSED
    assert machine.authorized == []
    assert machine.denied
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.VOIDED


@pytest.mark.parametrize("lossy", ["/api/v1/capture"], indirect=True)
async def test_a_lost_capture_answer_is_confirmed_from_reporting(
    lossy: tuple[Agent, AnswerLosingProxy],
) -> None:
    agent, proxy = lossy
    machine = ScriptedDispenser(DispenseStatus.VENDED, vended_cents=200)
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=300), machine
    )
    event = await asyncio.wait_for(sale.result(), 15)
    assert proxy.lost == 1
    assert event.state is SaleState.COMPLETED
    assert event.captured_cents == 200
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.CAPTURED
    assert row.amount_cents == 200


async def a_card_read_lost(agent: Agent, cents: int) -> SaleEvent:
    """An authorize_capture sale whose read-card answer the proxy loses, ended (at once: a
    read moves no money). Amount ..05: nobody taps, the service's read waits until it expires;
    else a card is tapped on it and the terminal is free again soon."""
    lost = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=cents),
        ScriptedDispenser(),
    )
    return await asyncio.wait_for(lost.result(), 15)


@pytest.mark.parametrize("lossy", ["/read-card"], indirect=True)
@pytest.mark.parametrize("next_flow", [Flow.AUTHORIZE_CAPTURE, Flow.CHARGE_CARD])
async def test_the_next_customer_waits_out_a_card_read_whose_answer_was_lost(
    lossy: tuple[Agent, AnswerLosingProxy], next_flow: Flow
) -> None:
    agent, proxy = lossy
    # ..05: nobody taps, so the read the service started waits for a card until it expires
    event = await a_card_read_lost(agent, 305)
    assert proxy.lost == 1
    assert event.state is SaleState.FAILED  # at once: a read moves no money
    assert "SIM-0001 may wait for a card" in event.message  # the machine hears why
    waiting = asyncio.Event()
    agent.events.listen(lambda e: waiting.set() if e.step == "terminal.wait" else None)
    machine = ScriptedDispenser(DispenseStatus.VENDED, vended_cents=300)
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=next_flow, amount_cents=300), machine
    )
    await asyncio.wait_for(waiting.wait(), 15)
    # the read ends (as if it expired, or its customer walked off): the waiting one is served
    [answer] = proxy.lost_answers
    await agent.service.terminal.cancel("SIM-0001", json.loads(answer)["interaction_id"])
    served = await asyncio.wait_for(sale.result(), 15)
    # served once the lost read ended, not refused with "terminal busy"
    assert served.state is SaleState.COMPLETED, served.message
    steps = [s.step for s in agent.journal.steps(sale.sale_id)]
    assert steps.count("terminal.wait") == 1  # said once: why this customer waited
    [row] = await ledger(agent, sale.order_id)
    assert row.status is TransStatus.CAPTURED


@pytest.mark.parametrize("lossy", ["/no-call-ends-so"], indirect=True)
async def test_a_terminal_busy_with_no_lost_read_behind_it_refuses_at_once(
    lossy: tuple[Agent, AnswerLosingProxy],
) -> None:
    agent, _ = lossy
    handle = await agent.service.terminal.read_card("SIM-0001", 305)  # someone else's read
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=300), ScriptedDispenser()
    )
    event = await asyncio.wait_for(sale.result(), 15)
    assert event.state is SaleState.FAILED
    assert "terminal busy" in event.message
    assert "terminal.wait" not in [s.step for s in agent.journal.steps(sale.sale_id)]
    await agent.service.terminal.cancel("SIM-0001", handle.interaction_id)


@pytest.mark.parametrize("lossy", ["/read-card"], indirect=True)
async def test_a_customer_waiting_out_a_lost_card_read_may_cancel(
    lossy: tuple[Agent, AnswerLosingProxy],
) -> None:
    agent, _ = lossy
    await a_card_read_lost(agent, 305)
    waiting = asyncio.Event()
    agent.events.listen(lambda e: waiting.set() if e.step == "terminal.wait" else None)
    machine = ScriptedDispenser()
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=300), machine
    )
    await asyncio.wait_for(waiting.wait(), 5)
    assert await agent.sales.cancel(sale.sale_id)
    event = await asyncio.wait_for(sale.result(), 5)
    assert event.state is SaleState.CANCELLED
    assert machine.denied
    assert await ledger(agent, sale.order_id) == []  # nothing charged


@pytest.mark.parametrize("lossy", ["/read-card"], indirect=True)
async def test_a_terminal_that_took_a_new_sale_is_no_longer_held_by_a_lost_read(
    lossy: tuple[Agent, AnswerLosingProxy],
) -> None:
    agent, _ = lossy
    # the lost read ends at once (the simulator taps a card on it): the terminal is free again
    await a_card_read_lost(agent, 300)
    assert agent.sales.context.lost_reads.left("SIM-0001") is not None
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=300),
        ScriptedDispenser(DispenseStatus.VENDED, vended_cents=300),
    )
    await asyncio.wait_for(sale.result(), 15)
    # the terminal took it: a busy answer from now on is someone else's, refused at once
    assert agent.sales.context.lost_reads.left("SIM-0001") is None
