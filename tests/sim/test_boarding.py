"""Boarding over real HTTP: merchants, every status move, its event and reason, the sweep."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from kiosk_agent.service.models.boarding import MerchantCreate, MerchantFilter
from kiosk_agent.sim.server import SimServer

from .sim_api import Api
from .test_oauth import oauth_api

MERCHANTS = "/ords/sprint/api/3p/boarding/v1/merchants"


@pytest.fixture
async def boarding(sim: SimServer, http: aiohttp.ClientSession) -> Api:
    return await oauth_api(http, sim)


async def create(boarding: Api, **fields: Any) -> dict[str, Any]:
    status, merchant = await boarding.post(MERCHANTS, {"dba_name": "Corner Snacks", **fields})
    assert status == 201, merchant
    return merchant


async def put(boarding: Api, merchant_id: int, **fields: Any) -> tuple[int, dict[str, Any]]:
    return await boarding.put(f"{MERCHANTS}/{merchant_id}", fields)


async def force(boarding: Api, merchant_id: int, status: str, **extra: Any) -> dict[str, Any]:
    code, merchant = await boarding.post(
        f"/sim/merchants/{merchant_id}/status", {"merchant_status": status, **extra}
    )
    assert code == 200, merchant
    return merchant


async def events(boarding: Api, merchant_id: int | None = None) -> list[dict[str, Any]]:
    status, body = await boarding.get("/sim/events")
    assert status == 200
    found = [item["envelope"] for item in body["items"]]
    return [e for e in found if merchant_id is None or e["source_id"] == str(merchant_id)]


def moves(found: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(e["event_type"], e["payload"].get("reason")) for e in found]


async def test_create_get_and_the_created_event(boarding: Api) -> None:
    merchant = await create(boarding, legal_name="Corner Snacks LLC", external_crm_id="CRM-9")

    assert merchant["merchant_status_id"] == 1
    assert merchant["mid"] is None
    assert set(merchant) >= {"merchant_id", "rep_code_id", "customer_id", "created", "updated"}
    status, fetched = await boarding.get(f"{MERCHANTS}/{merchant['merchant_id']}")
    assert (status, fetched) == (200, merchant)
    (event,) = await events(boarding, merchant["merchant_id"])
    assert event["event_type"] == "merchant.new"
    payload = event["payload"]
    assert (payload["reason"], payload["trigger"]) == ("created", "api")
    assert payload["external_crm_id"] == "CRM-9"
    assert "+00:00" in payload["timestamp"]
    assert event["timestamp"].endswith("Z")
    assert set(event["metadata"]) == {"webhook_id", "attempt", "idempotency_key"}


async def test_send_resend_and_retract(boarding: Api) -> None:
    merchant_id = (await create(boarding))["merchant_id"]

    status, sent = await put(boarding, merchant_id, merchant_status="sent_for_signature")
    assert (status, sent["merchant_status_id"]) == (200, 2)
    status, resent = await put(boarding, merchant_id, merchant_status="sent_for_signature")
    assert (status, resent["merchant_status_id"]) == (200, 2)
    status, retracted = await put(boarding, merchant_id, merchant_status="new")
    assert (status, retracted["merchant_status_id"]) == (200, 1)

    assert moves(await events(boarding, merchant_id)) == [
        ("merchant.new", "created"),
        ("merchant.sent_for_signature", "sent_for_signature"),
        ("merchant.sent_for_signature", "resent"),
        ("merchant.new", "retracted"),
    ]


async def test_editing_an_application_out_for_signature_takes_it_back_to_new(
    boarding: Api,
) -> None:
    merchant_id = (await create(boarding))["merchant_id"]
    await put(boarding, merchant_id, merchant_status="sent_for_signature")

    status, edited = await put(boarding, merchant_id, dba_name="Corner Snacks & Drinks")

    assert status == 200
    assert (edited["dba_name"], edited["merchant_status_id"]) == ("Corner Snacks & Drinks", 1)
    assert moves(await events(boarding, merchant_id))[-1] == ("merchant.new", "updated")
    # A plain edit of a new application announces nothing.
    await put(boarding, merchant_id, custom_01="store 12")
    assert moves(await events(boarding, merchant_id))[-1] == ("merchant.new", "updated")


async def test_the_service_moves_boarded_assigns_a_mid_then_varcomplete(boarding: Api) -> None:
    merchant_id = (await create(boarding, dba_name="Vend Co"))["merchant_id"]
    for status in ("sent_for_signature", "signed", "in_underwriting"):
        await force(boarding, merchant_id, status, trigger="system")

    boarded = await force(boarding, merchant_id, "boarded", trigger="system")
    live = await force(boarding, merchant_id, "live")

    assert boarded["mid"] is not None
    assert live["mid"] == boarded["mid"]
    found = await events(boarding, merchant_id)
    assert moves(found)[1:] == [
        ("merchant.sent_for_signature", "sent_for_signature"),
        ("merchant.signed", "signed"),
        ("merchant.in_underwriting", "in_underwriting"),
        ("merchant.boarded", "boarded"),
        ("boarding.varcomplete", None),
        ("merchant.live", "live"),
    ]
    varcomplete = found[5]["payload"]
    assert varcomplete["mid"] == boarded["mid"]
    assert varcomplete["merchant_id"] == str(merchant_id)
    assert all(isinstance(value, str) for value in varcomplete.values())
    assert found[4]["payload"]["trigger"] == "system"
    assert found[6]["payload"]["trigger"] == "ui"  # the helper's default


async def test_deleting_emits_merchant_deleted_and_the_record_is_gone(boarding: Api) -> None:
    merchant_id = (await create(boarding))["merchant_id"]

    await force(boarding, merchant_id, "deleted", deleted_by="ops@example.com")

    event = (await events(boarding, merchant_id))[-1]
    assert event["event_type"] == "merchant.deleted"
    assert event["payload"]["deleted_by"] == "ops@example.com"
    assert event["payload"]["merchant_status_id"] == 1  # the status at deletion
    status, body = await boarding.get(f"{MERCHANTS}/{merchant_id}")
    assert (status, body["error"]) == (404, "merchant_not_found")


async def test_list_filters_and_pages(boarding: Api) -> None:
    ids = [(await create(boarding, dba_name=f"Shop {n}"))["merchant_id"] for n in range(5)]
    await put(boarding, ids[1], merchant_status="sent_for_signature")
    await put(boarding, ids[3], merchant_status="sent_for_signature")

    status, first = await boarding.get(MERCHANTS, params={"limit": "2"})
    assert status == 200
    assert ([m["merchant_id"] for m in first["items"]], first["hasMore"]) == (ids[:2], True)
    status, out = await boarding.get(MERCHANTS, params={"q": json.dumps({"merchant_status_id": 2})})
    assert [m["merchant_id"] for m in out["items"]] == [ids[1], ids[3]]
    status, shop = await boarding.get(MERCHANTS, params={"q": '{"dba_name": "Shop 4"}'})
    assert [m["merchant_id"] for m in shop["items"]] == [ids[4]]
    status, body = await boarding.get(MERCHANTS, params={"q": '{"signature_sent_at": 1}'})
    assert (status, body["error"]) == (400, "invalid_query")


@pytest.mark.parametrize(
    ("body", "status", "named"),
    [
        ({"merchant_status": "boarded"}, 400, "merchant_status"),
        ({"merchant_status": 2}, 400, "merchant_status"),
        ({"dba_name": 5}, 400, "dba_name"),
        ({"rep_code_id": "x"}, 400, "rep_code_id"),
        ({"merchant_status_id": 5}, 400, "merchant_status_id"),
        ({}, 400, "nothing to update"),
    ],
)
async def test_bad_updates_are_400(boarding: Api, body: Any, status: int, named: str) -> None:
    merchant_id = (await create(boarding))["merchant_id"]
    code, answer = await put(boarding, merchant_id, **body)
    assert code == status
    assert named in answer["error_description"]


async def test_bad_requests_never_500(boarding: Api) -> None:
    code, answer = await boarding.post(MERCHANTS, {"legal_name": "no dba"})
    assert (code, "dba_name" in answer["error_description"]) == (400, True)
    async with boarding.http.post(
        boarding.base_url + MERCHANTS,
        data=b"{not json",
        headers={**boarding.headers(), "Content-Type": "application/json"},
    ) as resp:
        assert resp.status == 400
        assert "not valid JSON" in (await resp.json())["error_description"]
    assert (await boarding.get(f"{MERCHANTS}/999999"))[0] == 404
    assert (await boarding.get(f"{MERCHANTS}/abc"))[0] == 400
    assert (await boarding.get(MERCHANTS, key="wrong"))[0] == 401
    code, answer = await boarding.post("/sim/merchants/999999/status", {"merchant_status": "live"})
    assert code == 404
    merchant_id = (await create(boarding))["merchant_id"]
    code, answer = await boarding.post(
        f"/sim/merchants/{merchant_id}/status", {"merchant_status": "live", "trigger": "robot"}
    )
    assert (code, "trigger" in answer["error_description"]) == (400, True)


async def test_moves_the_api_may_not_make_are_409(boarding: Api) -> None:
    merchant_id = (await create(boarding))["merchant_id"]
    await force(boarding, merchant_id, "signed")

    code, answer = await put(boarding, merchant_id, merchant_status="sent_for_signature")

    assert (code, answer["error"]) == (409, "invalid_status_transition")
    code, answer = await put(boarding, merchant_id, merchant_status="new", dba_name="Renamed")
    assert code == 409
    _, unchanged = await boarding.get(f"{MERCHANTS}/{merchant_id}")
    assert unchanged["dba_name"] == "Corner Snacks"  # a refused PUT changes nothing


async def test_unsigned_applications_expire_after_30_simulated_days(
    sim_factory, http: aiohttp.ClientSession
) -> None:
    # 30 simulated days pass in about 0.26 real seconds.
    sim = await sim_factory(time_scale=10_000_000, transactions=10)
    boarding = await oauth_api(http, sim)
    merchant_id = (await create(boarding))["merchant_id"]
    status, _ = await put(boarding, merchant_id, merchant_status="sent_for_signature")
    assert status == 200

    async with asyncio.timeout(10):  # about 0.26 s; a busy machine gets room
        expired = ("merchant.new", "signature_expired")
        while (found := moves(await events(boarding, merchant_id)))[-1] != expired:
            await asyncio.sleep(0.02)

    assert found == [
        ("merchant.new", "created"),
        ("merchant.sent_for_signature", "sent_for_signature"),
        ("merchant.new", "signature_expired"),
    ]
    last = (await events(boarding, merchant_id))[-1]
    assert last["payload"]["trigger"] == "system"
    status, merchant = await (await oauth_api(http, sim)).get(f"{MERCHANTS}/{merchant_id}")
    assert merchant["merchant_status_id"] == 1


async def test_the_service_client_boards_a_merchant(service, sim: SimServer, http) -> None:
    created = await service.boarding.create(MerchantCreate(dba_name="Client Co"))
    sent = await service.boarding.update(created.merchant_id, status="sent_for_signature")
    listed = [m async for m in service.boarding.merchants(MerchantFilter(merchant_status_id=2))]

    assert sent.merchant_status_id == 2
    assert [m.merchant_id for m in listed] == [created.merchant_id]
    boarding = await oauth_api(http, sim)
    assert moves(await events(boarding, created.merchant_id)) == [
        ("merchant.new", "created"),
        ("merchant.sent_for_signature", "sent_for_signature"),
    ]
