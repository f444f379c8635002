"""The admin API over real HTTP, on an agent that talks to the simulator."""

import csv
import io
import json
from typing import Any

import aiohttp
import pytest

from kiosk_agent.core.sale import DispenseOutcome, DispenseStatus, Flow, SaleRequest
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
    request = SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=cents,
                          terminal="SIM-0007", product="A1")
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


async def test_boarding_merchants_from_the_webhook_receiver(
    webhook_receiver: Any, webhook_secret: str, api: Any
) -> None:
    receiver = webhook_receiver
    body = json.dumps(
        {
            "event_type": "merchant.live",
            "timestamp": "2026-11-22T10:00:00.000Z",
            "payload": {"merchant_id": 5, "mid": "999000000005", "dba_name": "Snacks",
                        "merchant_status_id": 6, "reason": "live"},
            "metadata": {"webhook_id": "w1", "attempt": 1, "idempotency_key": "i1"},
        }
    ).encode()
    headers = {"X-Webhook-Signature-256": sign(body, webhook_secret)}
    async with aiohttp.ClientSession() as session, session.post(
        receiver.url, data=body, headers=headers
    ) as response:
        assert response.status == 200
    async with api.get("/api/boarding/merchants", headers=READER) as response:
        [merchant] = (await response.json())["merchants"]
    assert (merchant["merchant_id"], merchant["status"]) == (5, "live")
