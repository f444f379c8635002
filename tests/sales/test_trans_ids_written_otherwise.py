"""Reporting writing a transaction reference number otherwise than the charge's answer did.

The interface types a trans id a string and says no more: reporting may write one charge with
whitespace around it, letters in another case, leading zeros. Recovery and the attention
sweeper (``Reconciler.transaction_state``) compare trans ids as the charge check does
(``reconcile.trans_key``, one comparison for all): a charge written otherwise is still the
sale's, and a refund whose row names its charge otherwise is still a refund, never taken for a
void (a void releases the whole hold; a refund of $0.00 gives nothing back).
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kiosk_agent.app import build_agent
from kiosk_agent.assembly.agent import Agent
from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.config.load import load_config
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import TransStatus
from tests.sales.test_lost_answers import ForwardingProxy
from tests.sales.test_recovery import authorize, leave_open, rows

WAIT_S = 60


class ReportingWritingOtherwise(ForwardingProxy):
    """Reporting, forwarded to the simulator: each transaction row comes back with the fields
    named in ``fields`` written otherwise (a space and a leading zero before the number)."""

    def __init__(self, target: str, fields: tuple[str, ...]) -> None:
        super().__init__(target)
        self.fields = fields
        self.rewritten = 0

    async def answer(self, request: web.Request) -> web.StreamResponse:
        status, payload, _ = await self.ask_service(request)
        if request.method == "GET" and request.path.endswith("/transactions") and status == 200:
            body = json.loads(payload)
            for item in body["items"]:
                for name in self.fields:
                    if item.get(name):
                        item[name] = f" 0{item[name]}"
                        self.rewritten += 1
            payload = json.dumps(body).encode()
        return web.Response(status=status, body=payload, content_type="application/json")



@pytest.fixture
async def start_behind(
    sim_factory: Any, tmp_path: Path
) -> AsyncIterator[tuple[Any, Callable[[tuple[str, ...]], Any]]]:
    """The simulator, and a start of an agent whose reporting writes ``fields`` otherwise
    (its money calls go straight to the simulator)."""
    sim = await sim_factory(time_scale=300, transactions=0)
    made: list[tuple[Agent, ReportingWritingOtherwise]] = []

    async def start(fields: tuple[str, ...]) -> tuple[Agent, ReportingWritingOtherwise]:
        proxy = ReportingWritingOtherwise(sim.base_url, fields)
        await proxy.start()
        config_path = tmp_path / "config.yaml"
        config_path.write_text(textwrap.dedent("""\
            service: {simulator: {time_scale: 300}}
            terminals: [{device_id: SIM-0001}]
            journal: {path: journal.db}
            """))
        settings = settings_from_ready(sim.ready_info()).model_copy(
            update={"reporting_url": proxy.url, "ws_url": sim.ws_url})
        agent = build_agent(load_config(config_path), settings, systemd=False)
        made.append((agent, proxy))
        await agent.start()
        return agent, proxy

    yield sim, start
    for agent, proxy in made:
        await agent.stop()
        await proxy.stop()


async def test_recovery_finds_a_capture_reporting_writes_otherwise(
    start_behind: tuple[Any, Callable[[tuple[str, ...]], Any]], tmp_path: Path
) -> None:
    """Killed while capturing a $3.00 vend the service captured; reporting writes its trans
    id otherwise. The sale is the capture's: completed, paid $3.00. Before, compared exactly,
    reporting's row was not the sale's, and the paid sale waited for a person."""
    sim, start = start_behind
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        trans_id = await authorize(service, "KACRASHED1", capture=False)
        await service.payments.capture(trans_id, amount=300)
    leave_open(tmp_path, state=SaleState.CAPTURING, trans_id=trans_id, authorized_cents=300,
               vended_cents=300)
    agent, proxy = await start(("trans_id",))
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    assert proxy.rewritten  # reporting was asked, and wrote it otherwise
    assert event.state is SaleState.COMPLETED, event.message
    assert event.captured_cents == 300
    [row] = await rows(agent.service, "KACRASHED1")
    assert (row.status, row.amount_cents) == (TransStatus.CAPTURED, 300)  # as the journal says


@pytest.mark.parametrize("cents", [300, 0], ids=["refund", "refund-of-nothing"])
async def test_a_refund_whose_row_names_its_charge_otherwise_is_not_taken_for_a_void(
    start_behind: tuple[Any, Callable[[tuple[str, ...]], Any]], tmp_path: Path, cents: int
) -> None:
    """Killed while giving back a settled $3.00 charge: the service refunded it, and
    reporting's refund row names the charge (``related_trans_id``) otherwise. The status
    says refunded: the sale ends refunded, naming the refund's transaction; a refund
    reporting shows for $0.00 goes to a person. Before, the refund's row was not found, the
    give-back was read as a void (which releases the whole hold), and a refund of nothing
    ended the sale "$3.00 voided": the customer's money called given back."""
    sim, start = start_behind
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        trans_id = await authorize(service, "KACRASHED1", capture=True)
        sim.ctx.ledger.update(trans_id, trans_status_id=TransStatus.SETTLED)
        refund = await service.payments.void_or_refund(trans_id)
    assert refund.refunded
    sim.ctx.ledger.update(trans_id, amount_cents=cents)
    leave_open(tmp_path, state=SaleState.REVERSING, trans_id=trans_id, authorized_cents=300,
               captured_cents=300)
    agent, proxy = await start(("related_trans_id",))
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    assert proxy.rewritten
    statuses = {row.trans_id: row.status for row in await rows(agent.service, "KACRASHED1")}
    assert statuses == {trans_id: TransStatus.REFUNDED, refund.trans_id: TransStatus.REFUND}
    if cents:
        assert event.state is SaleState.REVERSED, event.message
        assert "$3.00 refunded" in event.message
        assert event.reversed_cents == 300
        record = agent.journal.get("crashed1")
        assert record is not None
        assert record.reverse_trans_id == refund.trans_id  # the refund's, not the charge
        return
    assert event.state is SaleState.ATTENTION, event.message
    assert "refunded for $0.00" in event.message
    assert event.reversed_cents == 0
