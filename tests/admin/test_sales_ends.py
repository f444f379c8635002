"""Sales that end every way, each face read against the journal's row and the service's own
reporting (rule 12): `sales --format json`, `sales show --json`, `GET /api/sales/{id}`,
"Sales today" in `/api/health`, and `/metrics`' money counters. Money as integer cents; a
refund is money back on the sale's own row, never a second sale."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.money import dollars_to_cents
from kiosk_agent.sales.model import DispenseStatus, Flow, SaleRequest
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.models import TransactionFilter, TransStatus
from tests.admin.test_sales_export import _cli
from tests.assembly.agent_helpers import ScriptedDispenser

# (flow, cents asked, the machine's answer, what it vended) -> how the sale ends
ENDS = [
    (Flow.CHARGE_CARD, 250, DispenseStatus.VENDED, 0, SaleState.COMPLETED),
    (Flow.CHARGE_CARD, 402, DispenseStatus.VENDED, 0, SaleState.DECLINED),  # the sim declines
    (Flow.CHARGE_CARD, 300, DispenseStatus.FAILED, 0, SaleState.REVERSED),  # charged, refunded
    (Flow.AUTHORIZE_CAPTURE, 500, DispenseStatus.VENDED, 180, SaleState.COMPLETED),  # partly
    (Flow.AUTHORIZE_CAPTURE, 400, DispenseStatus.FAILED, 0, SaleState.REVERSED),  # hold released
]
# what the service holds of a charge kept, and of one given back
_KEPT = {TransStatus.CAPTURED, TransStatus.SETTLED}
_BACK = {TransStatus.VOIDED, TransStatus.REFUNDED}


async def test_each_end_shows_on_every_face_as_the_journal_and_the_service_hold_it(
    agent: Any, admin_server: Any, read_headers: dict[str, str], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sale_ids = []
    for flow, cents, status, vended, state in ENDS:
        request = SaleRequest("test", flow, cents, terminal="SIM-0007", product="A1")
        sale = await agent.sales.start(request, ScriptedDispenser(status, vended_cents=vended))
        event = await asyncio.wait_for(sale.result(), 30)
        assert event.state is state, (flow, cents, event.message)
        sale_ids.append(sale.sale_id)
    records = {sale_id: agent.journal.get(sale_id) for sale_id in sale_ids}

    # the journal against the service: each charge's status and amount in reporting
    for flow, cents, _, vended, state in ENDS:
        [record] = [r for r in records.values() if r.amount_cents == cents]
        rows = [t async for t in agent.service.reporting.transactions(
            TransactionFilter(order_id=record.order_id))]
        held = [t for t in rows if t.status in _KEPT]
        given_back = [t for t in rows if t.status in _BACK]
        if state is SaleState.COMPLETED:
            assert [t.amount_cents for t in held] == [record.captured_cents]
            assert record.captured_cents == (vended or cents)
            assert record.reversed_cents == 0
        elif state is SaleState.REVERSED:
            assert held == []
            assert [t.amount_cents for t in given_back] == [record.reversed_cents] == [cents]
            assert record.captured_cents == (cents if flow is Flow.CHARGE_CARD else 0)
        else:
            assert held == given_back == []
            assert (record.captured_cents, record.reversed_cents) == (0, 0)

    # `kiosk-agent sales --format json`, `sales show --json`, the API's record: the same money
    config = str(tmp_path / "config.yaml")
    code, out, _ = await _cli(capsys, "sales", "-c", config, "--format", "json")
    assert code == 0
    exported = {row["sale_id"]: row for row in json.loads(out)}
    assert set(exported) == set(sale_ids)  # five sales: a refund is no second sale
    async with aiohttp.ClientSession(base_url=admin_server.url, headers=read_headers) as http:
        for sale_id, record in records.items():
            row = exported[sale_id]
            assert (row["state"], row["kind"]) == (record.state.value, "sale")
            assert dollars_to_cents(row["amount"]) == record.amount_cents
            assert dollars_to_cents(row["captured"]) == record.captured_cents
            assert dollars_to_cents(row["reversed"]) == record.reversed_cents
            code, out, _ = await _cli(capsys, "sales", "show", sale_id, "-c", config, "--json")
            assert code == 0
            async with http.get(f"/api/sales/{sale_id}") as answer:
                assert answer.status == 200
                assert await answer.json() == json.loads(out)
            shown = json.loads(out)["sale"]
            assert (shown["state"], shown["order_id"]) == (record.state.value, record.order_id)
        async with http.get("/api/health") as answer:
            health = await answer.json()
        async with http.get("/metrics") as answer:
            metrics = await answer.text()

    # "Sales today" and the money counters: the journal's sums
    completed = [r for r in records.values() if r.state is SaleState.COMPLETED]
    assert (health["sales"]["today_count"], health["sales"]["today_amount_cents"]) == (
        len(completed), sum(r.captured_cents for r in completed)
    )
    given_back = sum(r.reversed_cents for r in records.values() if r.state is SaleState.REVERSED)
    assert _counter(metrics, "kiosk_agent_captured_cents_total") == 250 + 180
    assert _counter(metrics, "kiosk_agent_reversed_cents_total") == given_back == 300 + 400


def _counter(metrics: str, name: str) -> int:
    """A counter's value on the sales' terminal (Prometheus text)."""
    for line in metrics.splitlines():
        if line.startswith(name + '{terminal="SIM-0007"}'):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError(f"{name} not in /metrics")
