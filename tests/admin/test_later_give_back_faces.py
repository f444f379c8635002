"""A completed sale given back at the service by someone else, as the admin API and the status
page show it: the same figures the journal notes and reporting holds (sales/audit.py's later
give-backs; tests/sales/test_later_give_back.py has the sums against reporting)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.cli import main
from kiosk_agent.service.models import TransactionFilter, TransStatus
from tests.admin.test_server import _sell


async def test_the_api_the_export_and_the_page_show_a_void_made_at_the_service_later(
    agent: Any, admin_server: Any, admin_headers: dict[str, str], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    done = await _sell(agent, 1999)
    record = agent.journal.get(done.sale_id)
    assert record.captured_cents == 1999
    # a person voids it at the service (its payments API), naming themself
    await agent.service.payments.void_or_refund(record.trans_id, user_identifier="ops")
    result = await agent.journal_guard.audit.check(settled=True)
    assert result.later == [record.sale_id]
    query = TransactionFilter(mid=agent.service.settings.mid, order_id=record.order_id)
    [row] = [r async for r in agent.service.reporting.transactions(query)
             if r.trans_id == record.trans_id]
    assert row.status is TransStatus.VOIDED
    voided = Decimal(row.amount_cents) / 100

    async with aiohttp.ClientSession(headers=admin_headers) as http:
        async with http.get(f"{admin_server.url}/api/sales/{record.sale_id}") as response:
            assert response.status == 200
            sale = (await response.json())["sale"]
        async with http.get(f"{admin_server.url}/api/sales", params={"format": "csv"}) as response:
            assert response.status == 200
            rows = list(csv.DictReader(io.StringIO(await response.text())))
        async with http.get(f"{admin_server.url}/api/page") as response:
            assert response.status == 200
            page = await response.json()

    assert (sale["later_cents"], sale["later_status"], sale["later_by"]) == (1999, "voided", "ops")
    assert sale["state"] == "completed"
    assert (sale["captured_cents"], sale["reversed_cents"]) == (1999, 0)
    [exported] = [r for r in rows if r["sale_id"] == record.sale_id]
    assert Decimal(exported["given_back_by_others"]) == voided
    assert Decimal(exported["captured"]) - Decimal(exported["reversed"]) - Decimal(
        exported["given_back_by_others"]) == Decimal(0)  # reporting holds nothing of it now
    assert (exported["service_status"], exported["given_back_by"]) == ("voided", "ops")
    [shown] = [s for s in page["recent"] if s["sale_id"] == record.sale_id]
    assert shown["money"] == "$19.99 charged ($19.99 given back since by others, at the service)"
    assert shown["later_cents"] == 1999
    assert any(s["step"] == "service.later" for s in shown["steps"])

    # the command line reads the journal file: the same figures
    config = str(tmp_path / "config.yaml")
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["sales", "-c", config, "--format", "json"]) == 0
    [listed] = [s for s in json.loads(capsys.readouterr().out) if s["sale_id"] == record.sale_id]
    assert Decimal(listed["given_back_by_others"]) == voided
    assert await asyncio.to_thread(main, ["sales", "-c", config]) == 0
    table = capsys.readouterr().out
    assert "$19.99 charged ($19.99 given back since by others, at the service)" in table


async def test_the_event_stream_announces_a_later_give_back_as_its_own_kind_live_and_replayed(
    agent: Any, admin_server: Any, admin_headers: dict[str, str]
) -> None:
    """Open on `GET /api/events` while the charge check notes a void a person made at the
    service: one ``sale`` event of its own step (``service.later``), the sale still completed,
    its words and money as the journal's note and record hold them; the same view again when
    a follower that lost its connection asks for what it missed (``since``). The day's count
    and takings in the stream's health stay; what others gave back sits beside them."""
    from tests.admin.test_page import _events

    done = await _sell(agent, 1999)
    record = agent.journal.get(done.sale_id)
    began = record.updated_at
    async with aiohttp.ClientSession(headers=admin_headers) as http, http.get(
            f"{admin_server.url}/api/events") as response:
        stream = _events(response)
        kind, _ = await anext(stream)
        assert kind == "health"
        today = agent.health.snapshot().sales
        await agent.service.payments.void_or_refund(record.trans_id, user_identifier="jane")
        assert (await agent.journal_guard.audit.check(settled=True)).later == [record.sale_id]
        async with asyncio.timeout(10):
            async for kind, view in stream:
                if kind == "sale" and view["sale_id"] == record.sale_id:
                    break
    noted = agent.journal.get(record.sale_id)
    [step] = [s for s in agent.journal.steps(record.sale_id) if s.step == "service.later"]
    assert view["step"] == "service.later"
    assert view["state"] == "completed"
    assert view["message"] == step.detail["message"]
    assert view["message"] == ("$19.99 voided at the service after the sale completed by "
                               "'jane' (not the agent); the agent moved no money on it")
    assert view["money"] == "$19.99 charged ($19.99 given back since by others, at the service)"
    assert noted.later_cents == 1999
    after = agent.health.snapshot().sales
    assert (after.today_count, after.today_amount_cents) == (
        today.today_count, today.today_amount_cents)
    assert (after.today_given_back_count, after.today_given_back_cents) == (1, 1999)
    async with aiohttp.ClientSession(headers=admin_headers) as http, http.get(
            f"{admin_server.url}/api/page") as response:
        page = await response.json()
    # the page's line of the day: its takings as they were, what others gave back beside
    assert page["today_amount"] == f"${Decimal(today.today_amount_cents) / 100:.2f}"
    assert page["today_given_back"] == "$19.99 given back since by others, at the service"

    async with aiohttp.ClientSession(headers=admin_headers) as http, http.get(
            f"{admin_server.url}/api/events", params={"since": str(began + 0.0005)}) as response:
        replayed = []
        async with asyncio.timeout(10):
            async for kind, data in _events(response):
                if kind == "sale":
                    replayed.append(data)
                if kind == "replayed":
                    break
    [again] = [v for v in replayed if v["step"] == "service.later"]
    assert {k: again[k] for k in ("sale_id", "state", "message", "money")} == {
        k: view[k] for k in ("sale_id", "state", "message", "money")}
