"""Vault payment accounts and stored-credential charges over real HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from .sim_api import Api

V = "/api/v1/vault_payment_accounts"
ACCOUNT = {
    "account_token": "9541111111114444",
    "name": "Grace Hopper",
    "account_zip": "10001",
    "address1": "1 Main St",
    "city": "New York",
    "region": "NY",
    "country": "US",
    "email": "grace@example.com",
    "phone": "5550100",
    "expiration": "1129",
}


async def create_account(api: Api, **changes: Any) -> dict[str, Any]:
    status, record = await api.post(V, {**ACCOUNT, **changes})
    assert status == 200, record
    return dict(record)


async def test_create_returns_the_full_record_all_strings_but_id(api: Api) -> None:
    record = await create_account(api)
    assert isinstance(record["id"], int)
    assert all(isinstance(v, str) or v is None for k, v in record.items() if k != "id")
    assert (record["mid"], record["last_four"], record["card_brand_id"]) == (
        "999000000001",
        "4444",
        "2",
    )
    assert (record["is_deleted"], record["vault_account_type_id"]) == ("0", "1")
    assert record["nickname"] is None
    assert record["created"].endswith("Z")
    status, fetched = await api.get(f"{V}/{record['uuid']}")
    assert (status, fetched) == (200, record)


async def test_update_changes_only_the_fields_sent(api: Api) -> None:
    record = await create_account(api)
    status, updated = await api.put(f"{V}/{record['uuid']}", {"nickname": "work", "city": "Albany"})
    assert status == 200
    assert (updated["nickname"], updated["city"], updated["name"]) == (
        "work",
        "Albany",
        "Grace Hopper",
    )
    status, body = await api.put(f"{V}/{record['uuid']}", {"uuid": "x"})
    assert (status, "uuid" in body["error_description"]) == (400, True)


async def test_soft_delete_then_404(api: Api, sim: Any) -> None:
    record = await create_account(api)
    status, deleted = await api.delete(f"{V}/{record['uuid']}")
    assert (status, deleted["is_deleted"]) == (200, "1")
    status, body = await api.get(f"{V}/{record['uuid']}")
    assert (status, body["error"]) == (404, "vault_account_not_found")
    assert (await api.delete(f"{V}/{record['uuid']}"))[0] == 404


async def test_missing_required_field_is_400(api: Api) -> None:
    body = {k: v for k, v in ACCOUNT.items() if k != "phone"}
    status, answer = await api.post(V, body)
    assert status == 400
    assert "phone" in answer["error_description"]


async def test_another_merchants_account_is_not_found(api: Api) -> None:
    status, record = await api.post(
        V, {**ACCOUNT, "mid": "999000000002"}, key="sim_isv_key", params=None
    )
    assert status == 200
    assert (await api.get(f"{V}/{record['uuid']}"))[0] == 404


async def test_vaulted_charge_needs_cof_rules(api: Api) -> None:
    record = await create_account(api)
    body = {"payment_account_uuid": record["uuid"], "amount": 1500}
    status, answer = await api.post("/api/v1/charge", body)
    assert status == 400
    assert "cof" in answer["error_description"]
    status, answer = await api.post("/api/v1/charge", {**body, "cof": "M"})
    assert status == 400
    assert "cof_sched" in answer["error_description"]
    status, answer = await api.post("/api/v1/charge", {**body, "cof": "M", "cof_sched": "Y"})
    assert status == 200
    assert answer["result"] == "A"
    assert (answer["vault_id"], answer["payment_account_uuid"]) == (record["id"], record["uuid"])
    status, answer = await api.post("/api/v1/charge", {**body, "cof": "X", "cof_sched": "Y"})
    assert status == 400


async def test_charge_with_vault_y_creates_an_account(api: Api) -> None:
    answer = await api.charge(2500, vault="Y", name="Ada", cof="C", cof_sched="N")
    assert answer["vault_id"]
    status, record = await api.get(f"{V}/{answer['payment_account_uuid']}")
    assert (status, record["name"], record["id"]) == (200, "Ada", answer["vault_id"])


@pytest.mark.parametrize("uuid", ["missing-uuid"])
async def test_charge_of_an_unknown_vault_account(api: Api, uuid: str) -> None:
    status, answer = await api.post(
        "/api/v1/charge",
        {"payment_account_uuid": uuid, "amount": 100, "cof": "C", "cof_sched": "N"},
    )
    assert (status, answer["error"]) == (400, "invalid_payment_account")
