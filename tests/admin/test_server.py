"""The admin API over real HTTP, on an agent that talks to the simulator."""

import csv
import datetime as dt
import io
import json
from typing import Any

import aiohttp
import pytest

from kiosk_agent.sales.model import DispenseOutcome, DispenseStatus, Flow, SaleRequest
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.webhooks import sign

ADMIN_TOKEN = "admin-token-0123456789abcdef"  # as in conftest's secrets.yaml
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
READER = {"Authorization": "Bearer read-token-0123456789abcdefgh"}


class VendingMachine:
    """Stands in for the machine's hardware: always vends what it is allowed."""

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        return DispenseOutcome(DispenseStatus.VENDED, vended_cents=authorized_cents)

    async def deny(self, reason: str) -> None:
        return None


@pytest.fixture
async def api(admin_server: Any) -> Any:
    async with aiohttp.ClientSession(base_url=admin_server.url) as session:
        yield session


async def _sell(agent: Any, cents: int) -> Any:
    request = SaleRequest(
        source="test", flow=Flow.CHARGE_CARD, amount_cents=cents, terminal="SIM-0007", product="A1"
    )
    sale = await agent.sales.start(request, VendingMachine())
    return await sale.result()


async def test_every_route_refuses_a_missing_or_wrong_token(api: Any) -> None:
    for path in ("/api/status", "/api/health", "/api/sales", "/metrics", "/api/reports/deposits"):
        async with api.get(path) as response:
            assert response.status == 401, path
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
            assert (await response.json())["error"] == "unauthorized"
        async with api.get(path, headers={"Authorization": "Bearer " + "x" * 28}) as response:
            assert response.status == 401, path
    async with api.get("/api/status", headers={"Authorization": ADMIN_TOKEN}) as response:
        assert response.status == 401  # the Bearer scheme is required


async def test_a_read_token_reads_but_cannot_act(api: Any) -> None:
    async with api.get("/api/status", headers=READER) as response:
        assert response.status == 200
        status = await response.json()
    assert status["version"]
    assert status["terminals"] == 2
    async with api.post("/api/terminals/SIM-0001/ping", headers=READER) as response:
        assert response.status == 403
        assert "admin token" in (await response.json())["detail"]


async def test_health_and_metrics_show_terminals_and_sales(agent: Any, api: Any) -> None:
    final = await _sell(agent, 250)
    assert final.state is SaleState.COMPLETED
    async with api.get("/api/health", headers=ADMIN) as response:
        health = await response.json()
    assert {t["device_id"] for t in health["terminals"]} == {"SIM-0001", "SIM-0007"}
    assert health["sales"]["today_count"] == 1
    assert health["sales"]["today_amount_cents"] == 250
    # "Sales today" is what `since=today` lists: one rule of days (kiosk_agent.moments)
    async with api.get("/api/sales?since=today&state=completed", headers=READER) as response:
        assert [s["sale_id"] for s in (await response.json())["sales"]] == [final.sale_id]
    async with api.get("/metrics", headers=READER) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await response.text()
    assert 'kiosk_agent_captured_cents_total{terminal="SIM-0007"} 250.0' in text
    assert 'kiosk_agent_sales_total{state="completed",terminal="SIM-0007"} 1.0' in text
    assert 'kiosk_agent_terminal_online{terminal="SIM-0001"} 1.0' in text
    assert "kiosk_agent_webhooks_total" in text


async def test_the_sales_journal_with_filters_and_steps(agent: Any, api: Any) -> None:
    done = await _sell(agent, 300)
    declined = await _sell(agent, 402)  # ..02: the card is declined
    assert declined.state is SaleState.DECLINED
    async with api.get("/api/sales", headers=READER) as response:
        sales = (await response.json())["sales"]
    assert [s["amount_cents"] for s in sales] == [402, 300]
    async with api.get("/api/sales?state=completed", headers=READER) as response:
        [completed] = (await response.json())["sales"]
    assert completed["sale_id"] == done.sale_id
    async with api.get(f"/api/sales/{done.sale_id}", headers=READER) as response:
        detail = await response.json()
    assert detail["sale"]["captured_cents"] == 300
    assert detail["steps"][-1]["state"] == "completed"
    text = json.dumps(detail)
    assert "account_token" not in text
    async with api.get("/api/sales?state=paid", headers=READER) as response:
        assert response.status == 400
        assert "state must be one of" in (await response.json())["detail"]
    async with api.get("/api/sales?since=tomorrow", headers=READER) as response:
        assert response.status == 400
    async with api.get("/api/sales/nope", headers=READER) as response:
        assert response.status == 404


async def test_reports_stream_as_json_and_csv_with_filters(api: Any) -> None:
    async with api.get("/api/reports/transactions?limit=30", headers=READER) as response:
        assert response.status == 200
        rows = await response.json()
    assert len(rows) == 30
    assert all("account_token" not in row for row in rows)
    assert all(isinstance(row["amount_cents"], int) for row in rows)
    mid = rows[0]["mid"]
    trans_id = rows[0]["trans_id"]
    async with api.get(f"/api/reports/transactions?trans_id={trans_id}", headers=READER) as resp:
        [one] = await resp.json()
    assert one["trans_id"] == trans_id
    async with api.get(f"/api/reports/deposits?format=csv&mid={mid}", headers=READER) as response:
        assert response.headers["Content-Type"].startswith("text/csv")
        table = list(csv.DictReader(io.StringIO(await response.text())))
    assert table, "the simulator seeds settled batches"
    assert {"deposit_id", "amount", "amount_cents"} <= set(table[0])
    for kind in ("chargebacks", "adjustments"):
        async with api.get(f"/api/reports/{kind}?limit=5", headers=READER) as response:
            assert response.status == 200
            assert isinstance(await response.json(), list)


async def test_report_filters_take_the_command_lines_forms(api: Any) -> None:
    """`?status=settled` as `report transactions --status settled` (docs/operations.md), any
    case for a deposit's status; an unknown status is a 400 naming it."""
    async with api.get("/api/reports/transactions?status=Settled&limit=5", headers=READER) as r:
        assert r.status == 200
        by_name = await r.json()
    async with api.get("/api/reports/transactions?trans_status_id=3&limit=5", headers=READER) as r:
        assert await r.json() == by_name
    assert by_name
    assert {row["status"] for row in by_name} == {"settled"}
    async with api.get("/api/reports/deposits?status=funded&limit=2", headers=READER) as r:
        assert r.status == 200
        assert {row["status"] for row in await r.json()} == {"FUNDED"}
    async with api.get("/api/reports/transactions?status=lost", headers=READER) as r:
        assert r.status == 400
        assert "unknown transaction status 'lost'" in (await r.json())["detail"]


async def test_a_reports_since_and_until_take_the_command_lines_words(api: Any) -> None:
    """`?since=` answered 400 "Extra inputs are not permitted" (it went to the service's
    filter) while `report --since` worked: the same window now, on the same field, in the same
    grammar (a day is a UTC day, `today` and `yesterday` too)."""
    async with api.get("/api/reports/transactions?limit=50", headers=READER) as response:
        some = await response.json()
    day = some[len(some) // 2]["trans_date"][:10]
    async with api.get(f"/api/reports/transactions?since={day}&until={day}",
                       headers=READER) as response:
        assert response.status == 200
        window = await response.json()
    assert window
    assert {row["trans_date"][:10] for row in window} == {day}
    # a limit counts what the window kept
    query = f"since={day}T00:00:00&until={day}&format=csv&limit=2"
    async with api.get(f"/api/reports/transactions?{query}", headers=READER) as response:
        assert len(list(csv.DictReader(io.StringIO(await response.text())))) == 2
    async with api.get("/api/reports/deposits?since=today", headers=READER) as response:
        assert response.status == 200
        today = dt.datetime.now(dt.UTC).date().isoformat()
        assert all(row["deposit_date"][:10] == today for row in await response.json())
    for query, named in (("since=last%20week", "since: expected"),
                         (f"since=today&until={day}", "since must be before until")):
        async with api.get(f"/api/reports/transactions?{query}", headers=READER) as response:
            assert response.status == 400, query
            assert named in (await response.json())["detail"]


async def test_report_mistakes_are_named(api: Any) -> None:
    async with api.get("/api/reports/transactions?colour=red", headers=READER) as response:
        assert response.status == 400
        assert "'colour'" in (await response.json())["detail"]
    async with api.get("/api/reports/refunds", headers=READER) as response:
        assert response.status == 404
        assert "known: transactions" in (await response.json())["detail"]
    async with api.get("/api/reports/deposits?format=xml", headers=READER) as response:
        assert response.status == 400
    async with api.get("/api/reports/deposits?limit=0", headers=READER) as response:
        assert response.status == 400


async def test_terminal_actions(agent: Any, api: Any) -> None:
    async with api.post("/api/terminals/SIM-0001/ping", headers=ADMIN) as response:
        pong = await response.json()
    assert pong["online"] is True
    assert agent.health.snapshot().terminals[0].last_ping_at is not None
    async with api.post("/api/terminals/SIM-0001/connect", headers=ADMIN) as response:
        assert (await response.json())["connected"] is True
    async with api.post("/api/terminals/SIM-0001/test-print", headers=ADMIN) as response:
        assert response.status == 400
        assert "cannot print" in (await response.json())["detail"]
    async with api.post("/api/terminals/SIM-0007/test-print", headers=ADMIN) as response:
        assert response.status == 409  # no sale to print yet
    await _sell(agent, 150)
    async with api.post("/api/terminals/SIM-0007/test-print", headers=ADMIN) as response:
        assert response.status == 200
        assert (await response.json())["printed"] is True
    async with api.post("/api/terminals/SIM-0001/explode", headers=ADMIN) as response:
        assert response.status == 404
    async with api.post("/api/terminals/NOPE-9/ping", headers=ADMIN) as response:
        assert response.status in (400, 404)
        assert "payment service" in (await response.json())["detail"]


async def test_boarding_merchants_from_the_webhook_receiver(
    webhook_receiver: Any, webhook_secret: str, api: Any
) -> None:
    receiver = webhook_receiver
    body = json.dumps(
        {
            "event_type": "merchant.live",
            "timestamp": "2026-11-22T10:00:00.000Z",
            "payload": {
                "merchant_id": 5,
                "mid": "999000000005",
                "dba_name": "Snacks",
                "merchant_status_id": 6,
                "reason": "live",
            },
            "metadata": {"webhook_id": "w1", "attempt": 1, "idempotency_key": "i1"},
        }
    ).encode()
    headers = {"X-Webhook-Signature-256": sign(body, webhook_secret)}
    async with (
        aiohttp.ClientSession() as session,
        session.post(receiver.url, data=body, headers=headers) as response,
    ):
        assert response.status == 200
    async with api.get("/api/boarding/merchants", headers=READER) as response:
        [merchant] = (await response.json())["merchants"]
    assert (merchant["merchant_id"], merchant["status"]) == (5, "live")


async def test_since_and_until_read_moments_as_the_command_line_does(agent: Any, api: Any) -> None:
    """One grammar (kiosk_agent/moments.py): an until day is the whole day, a time without an
    offset is UTC, spans back from now and Unix seconds are taken."""
    sold = [await _sell(agent, 300), await _sell(agent, 350)]
    expected = sorted(s.sale_id for s in sold)
    record = agent.journal.get(sold[0].sale_id)
    day = dt.datetime.fromtimestamp(record.created_at, dt.UTC).date().isoformat()
    for query in (f"since={day}&until={day}", "since=2h", f"until={day}T23:59:59.999999"):
        async with api.get(f"/api/sales?{query}", headers=READER) as response:
            assert response.status == 200, query
            found = (await response.json())["sales"]
        assert sorted(s["sale_id"] for s in found) == expected, query
    async with api.get("/api/sales?until=1000000000", headers=READER) as response:
        assert (await response.json())["sales"] == []  # 2001: before any sale
    async with api.get("/api/sales?since=7y", headers=READER) as response:
        assert response.status == 400
        assert '"90m", "24h", "7d", "2w"' in (await response.json())["detail"]


@pytest.mark.parametrize("fmt", [None, "csv", "json"])
async def test_a_span_back_past_the_year_1_is_a_400_not_a_500(api: Any, fmt: str | None) -> None:
    """``since=99999999w`` went past what a datetime holds: the API answered 500."""
    params = {"since": "99999999w"} | ({"format": fmt} if fmt else {})
    async with api.get("/api/sales", params=params, headers=READER) as response:
        assert response.status == 400
        assert "within the years 1 to 9999" in (await response.json())["detail"]
    params = {"until": "9999-12-31"} | ({"format": fmt} if fmt else {})
    async with api.get("/api/sales", params=params, headers=READER) as response:
        assert response.status == 200  # the whole last day, every sale before it



async def test_one_sale_is_found_by_its_order_id_or_a_start_of_its_id(
    agent: Any, api: Any
) -> None:
    """As `kiosk-agent sales show` and the resolve route find it; GET answered 404 for both."""
    sale = await _sell(agent, 300)
    async with api.get(f"/api/sales/{sale.sale_id}", headers=READER) as response:
        whole = await response.json()
    for name in (sale.order_id, sale.sale_id[:8]):
        async with api.get(f"/api/sales/{name}", headers=READER) as response:
            assert response.status == 200, name
            assert await response.json() == whole
    async with api.get("/api/sales/nope", headers=READER) as response:
        assert response.status == 404
        assert (await response.json())["detail"] == "no sale 'nope' in the journal"
