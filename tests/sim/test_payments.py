"""Payments over real HTTP: charge, capture, void-or-refund, surcharge, receipts, key refresh."""

from __future__ import annotations

from typing import Any

import pytest

from .sim_api import Api

ISV = "sim_isv_key"


async def test_charge_approves_and_lands_in_the_ledger(api: Api, sim: Any) -> None:
    answer = await api.charge(1250, order_id="ord-1", name="Ada")
    assert answer["result"] == answer["respstat"] == "A"
    assert answer["amount"] == 1250
    assert answer["order_id"] == "ord-1"
    assert answer["mid"] == "999000000001"
    assert (answer["respcode"], answer["respproc"]) == ("00", "SIM")
    assert len(answer["auth_code"]) == 6
    row = sim.ctx.ledger.get(answer["trans_id"])
    assert row["trans_status_id"] == 2
    assert row["card_number"] == "XXXXXXXXXXXX1111"


@pytest.mark.parametrize(("cents", "result", "status"), [(1001, "B", 7), (1002, "C", 6)])
async def test_cents_choose_retry_and_decline_as_answers(
    api: Api, sim: Any, cents: int, result: str, status: int
) -> None:
    answer = await api.charge(cents)
    assert answer["result"] == result
    assert sim.ctx.ledger.get(answer["trans_id"])["trans_status_id"] == status


async def test_order_id_is_generated_when_omitted(api: Api) -> None:
    first, second = await api.charge(100), await api.charge(100)
    assert first["order_id"]
    assert first["order_id"] != second["order_id"]


async def test_a_second_charge_with_the_same_order_id_returns_the_first(api: Api, sim: Any) -> None:
    first = await api.charge(700, order_id="dup-1")
    again = await api.charge(700, order_id="dup-1")
    assert again == first
    assert len(sim.ctx.ledger.find_order("999000000001", "dup-1")) == 1
    # a decline is not remembered: the retry is really tried again
    declined = await api.charge(1002, order_id="dup-2")
    retried = await api.charge(1002, order_id="dup-2")
    assert declined["trans_id"] != retried["trans_id"]


async def test_auth_only_then_partial_capture(api: Api, sim: Any) -> None:
    auth = await api.charge(500, capture="N")
    assert sim.ctx.ledger.get(auth["trans_id"])["trans_status_id"] == 1
    status, captured = await api.post(
        "/api/v1/capture", {"trans_id": auth["trans_id"], "amount": 350}
    )
    assert status == 200
    assert (captured["result"], captured["amount"]) == ("A", 350)
    assert sim.ctx.ledger.get(auth["trans_id"])["trans_status_id"] == 2
    status, again = await api.post("/api/v1/capture", {"trans_id": auth["trans_id"]})
    assert (status, again["error"]) == (400, "already_captured")


async def test_capture_errors(api: Api) -> None:
    auth = await api.charge(500, capture="N")
    status, body = await api.post("/api/v1/capture", {"trans_id": auth["trans_id"], "amount": 501})
    assert (status, body["error"]) == (400, "amount_exceeds_authorization")
    status, body = await api.post("/api/v1/capture", {"trans_id": "nope"})
    assert (status, body["error"]) == (400, "invalid_trans_id")
    await api.post("/api/v1/void-or-refund", {"trans_id": auth["trans_id"]})
    status, body = await api.post("/api/v1/capture", {"trans_id": auth["trans_id"]})
    assert (status, body["error"]) == (400, "transaction_voided")
    declined = await api.charge(1002)
    status, body = await api.post("/api/v1/capture", {"trans_id": declined["trans_id"]})
    assert (status, body["error"]) == (400, "not_capturable")


async def test_void_before_settlement(api: Api, sim: Any) -> None:
    sale = await api.charge(900)
    status, body = await api.post("/api/v1/void-or-refund", {"trans_id": sale["trans_id"]})
    assert status == 200
    assert body["resp_text"] == "Voided"
    assert body["trans_id"] == sale["trans_id"]
    assert set(body) >= {
        "result",
        "resp_code",
        "resp_proc",
        "user_identifier",
        "mid",
        "amount",
        "currency",
        "order_id",
        "auth_code",
    }
    assert sim.ctx.ledger.get(sale["trans_id"])["trans_status_id"] == 4
    status, body = await api.post("/api/v1/void-or-refund", {"trans_id": sale["trans_id"]})
    assert (status, body["error"]) == (400, "already_voided")
    status, body = await api.post("/api/v1/void-or-refund", {"trans_id": "missing"})
    assert (status, body["error"]) == (400, "invalid_trans_id")


async def test_refunds_after_settlement_partial_then_full(api: Api, sim: Any) -> None:
    sale = await api.charge(1000, order_id="refund-me")
    status, settled = await api.post("/sim/settle")
    assert status == 200
    assert settled["settled"] >= 1
    row = sim.ctx.ledger.get(sale["trans_id"])
    assert row["trans_status_id"] == 3
    deposit = next(d for d in settled["deposits"] if d["batch_id"] == row["batch_id"])
    assert deposit["amount"] >= 10
    status, body = await api.post(
        "/api/v1/void-or-refund", {"trans_id": sale["trans_id"], "amount": 1001}
    )
    assert (status, body["error"]) == (400, "amount_exceeds")
    status, partial = await api.post(
        "/api/v1/void-or-refund", {"trans_id": sale["trans_id"], "amount": 400}
    )
    assert (status, partial["resp_text"], partial["amount"]) == (200, "Refunded", 400)
    assert partial["trans_id"] != sale["trans_id"]
    refund_row = sim.ctx.ledger.get(partial["trans_id"])
    assert (refund_row["trans_status_id"], refund_row["related_trans_id"]) == (5, sale["trans_id"])
    assert sim.ctx.ledger.get(sale["trans_id"])["trans_status_id"] == 8
    status, rest = await api.post("/api/v1/void-or-refund", {"trans_id": sale["trans_id"]})
    assert (status, rest["amount"]) == (200, 600)
    assert sim.ctx.ledger.get(sale["trans_id"])["trans_status_id"] == 9
    status, body = await api.post("/api/v1/void-or-refund", {"trans_id": sale["trans_id"]})
    assert (status, body["error"]) == (400, "already_refunded")


async def test_a_refund_naming_more_than_is_left_after_a_partial_one_is_refused(
    api: Api, sim: Any
) -> None:
    """After a partial refund, a refund naming more than is left (though not more than the
    original) gives 400 and moves nothing; one naming exactly what is left refunds it, and the
    charge reads refunded: what the agent's give-back of the rest relies on."""
    sale = await api.charge(1000, order_id="refund-rest")
    await api.post("/sim/settle")
    status, partial = await api.post(
        "/api/v1/void-or-refund", {"trans_id": sale["trans_id"], "amount": 300}
    )
    assert (status, partial["amount"]) == (200, 300)
    status, body = await api.post(
        "/api/v1/void-or-refund", {"trans_id": sale["trans_id"], "amount": 701}
    )
    assert (status, body["error"]) == (400, "amount_exceeds")
    row = sim.ctx.ledger.get(sale["trans_id"])
    assert (row["trans_status_id"], row["refunded_cents"]) == (8, 300)  # nothing moved
    status, rest = await api.post(
        "/api/v1/void-or-refund", {"trans_id": sale["trans_id"], "amount": 700}
    )
    assert (status, rest["resp_text"], rest["amount"]) == (200, "Refunded", 700)
    assert sim.ctx.ledger.get(sale["trans_id"])["trans_status_id"] == 9
    status, body = await api.post(
        "/api/v1/void-or-refund", {"trans_id": sale["trans_id"], "amount": 1}
    )
    assert (status, body["error"]) == (400, "already_refunded")


async def test_declines_cannot_be_reversed(api: Api) -> None:
    declined = await api.charge(1002)
    status, body = await api.post("/api/v1/void-or-refund", {"trans_id": declined["trans_id"]})
    assert (status, body["error"]) == (400, "not_reversible")


async def test_surcharge_for_credit_not_debit(api: Api) -> None:
    status, body = await api.get(
        "/api/v1/surcharge", params={"amount": "1000", "account_token": "9411111111111111"}
    )
    assert (status, body) == (
        200,
        {"surcharge": True, "surcharge_amount": 30, "surcharge_percent": "3.00"},
    )
    status, body = await api.get(
        "/api/v1/surcharge", params={"amount": "1000", "card_bin": "601100"}
    )
    assert body == {"surcharge": False, "surcharge_amount": 0, "surcharge_percent": "0.00"}
    status, body = await api.get("/api/v1/surcharge", params={"amount": "ten", "card_bin": "4"})
    assert status == 400
    assert "amount" in body["error_description"]
    status, body = await api.get("/api/v1/surcharge", params={"amount": "10"})
    assert status == 400


async def test_send_receipt(api: Api) -> None:
    sale = await api.charge(300)
    status, body = await api.post(
        "/api/v1/send_receipt", {"trans_id": sale["trans_id"], "email": "a@example.com"}
    )
    assert (status, body) == (200, {"sent": True})
    status, body = await api.post(
        "/api/v1/send_receipt", {"trans_id": "000", "email": "a@example.com"}
    )
    assert (status, body["error"]) == (400, "invalid_trans_id")
    status, body = await api.post(
        "/api/v1/send_receipt", {"trans_id": sale["trans_id"], "email": "not-mail"}
    )
    assert status == 400


async def test_isv_key_must_name_an_allowed_mid(api: Api) -> None:
    body = {"account_token": "9411111111111111", "expiration": "1230", "amount": 100}
    status, answer = await api.post("/api/v1/charge", body, key=ISV)
    assert (status, answer["error"]) == (400, "mid_required")
    status, answer = await api.post("/api/v1/charge", {**body, "mid": "123"}, key=ISV)
    assert (status, answer["error"]) == (400, "invalid_mid")
    status, answer = await api.post("/api/v1/charge", {**body, "mid": "999000000002"}, key=ISV)
    assert (status, answer["mid"]) == (200, "999000000002")
    # a merchant key may not act for another merchant either
    status, answer = await api.post("/api/v1/charge", {**body, "mid": "999000000002"})
    assert (status, answer["error"]) == (400, "invalid_mid")


async def test_level_2_3_and_ach_fields_are_accepted(api: Api) -> None:
    level3 = await api.charge(
        2000,
        comm_card="Y",
        order_date="20261122",
        po_number="PO-1",
        line_items=[{"description": "widget", "quantity": 2, "unit_cost": 1000}],
        ship_to_zip="10001",
    )
    assert level3["result"] == "A"
    status, ach = await api.post(
        "/api/v1/charge",
        {
            "account_token": "9311111111112222",
            "amount": 1500,
            "entry_class": "WEB",
            "credit_or_debit": "D",
            "payment_description": "rent",
            "ach_discretionary_data": "x",
        },
    )
    assert (status, ach["result"]) == (200, "A")


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"expiration": "1230", "amount": 100}, "account_token"),
        ({"account_token": "9411111111111111", "expiration": "1230"}, "amount"),
        ({"account_token": "9411111111111111", "expiration": "1230", "amount": 1.5}, "amount"),
        ({"account_token": "9411111111111111", "expiration": "1230", "amount": "100"}, "amount"),
        ({"account_token": "9411111111111111", "expiration": "1230", "amount": True}, "amount"),
        ({"account_token": "9411111111111111", "expiration": "1230", "amount": 0}, "amount"),
        ({"account_token": "9411111111111111", "amount": 100}, "expiration"),
        ({"account_token": "9411111111111111", "expiration": "1330", "amount": 100}, "expiration"),
        ({"account_token": 94, "expiration": "1230", "amount": 100}, "account_token"),
        (
            {
                "account_token": "9411111111111111",
                "expiration": "1230",
                "amount": 100,
                "capture": "maybe",
            },
            "capture",
        ),
        (
            {
                "account_token": "9411111111111111",
                "expiration": "1230",
                "amount": 100,
                "line_items": "all",
            },
            "line_items",
        ),
        (
            {
                "account_token": "9411111111111111",
                "expiration": "1230",
                "amount": 100,
                "currency": "dollars",
            },
            "currency",
        ),
    ],
)
async def test_malformed_charges_are_400_naming_the_field(
    api: Api, body: dict[str, Any], named: str
) -> None:
    status, answer = await api.post("/api/v1/charge", body)
    assert status == 400
    assert named in answer["error_description"]


async def test_bodies_that_are_not_json_objects(api: Api) -> None:
    url = "/api/v1/charge"
    cases = [
        ({"data": b"{not json", "headers": {"Content-Type": "application/json"}}, "not valid JSON"),
        ({"data": b"[1, 2]", "headers": {"Content-Type": "application/json"}}, "JSON object"),
        ({"data": b'{"amount": 1}', "headers": {"Content-Type": "text/plain"}}, "Content-Type"),
        ({"data": b"\xff\xfe", "headers": {"Content-Type": "application/json"}}, "UTF-8"),
        (
            {
                "data": b'{"a": "' + b"x" * 70_000 + b'"}',
                "headers": {"Content-Type": "application/json"},
            },
            "limit",
        ),
        ({"data": b"x" * 2_000_000, "headers": {"Content-Type": "application/json"}}, "limit"),
    ]
    for kwargs, words in cases:
        headers = {**api.headers(), **kwargs["headers"]}
        async with api.http.post(api.base_url + url, data=kwargs["data"], headers=headers) as resp:
            body = await resp.json()
            assert resp.status == 400, body
            assert words in body["error_description"]


async def test_missing_and_wrong_credentials_are_401(api: Api) -> None:
    async with api.http.post(api.base_url + "/api/v1/charge", json={}) as resp:
        assert resp.status == 401
    status, body = await api.post("/api/v1/charge", {}, key="wrong")
    assert (status, body["error"]) == (401, "invalid_token")


async def test_key_refresh_rotates_and_spends_the_refresh_token(api: Api, sim: Any) -> None:
    before = sim.ctx.clock.time()
    status, keys = await api.post("/api/v1/api_keys/refresh", {"token": "sim_refresh_token"})
    after = sim.ctx.clock.time()
    assert status == 200
    assert set(keys) == {
        "api_key",
        "public_key",
        "refresh_token",
        "api_key_expires_at",
        "refresh_token_expires_at",
    }
    # an hour after the key was made, within the call (its clock runs 50 times real time: the
    # call's own span, read after it, had been 20 s of it on a starved loop)
    assert before - 1 <= keys["api_key_expires_at"] - 3600 <= after + 1
    # the new key works, the seeded key still works, the spent refresh token does not
    assert (await api.charge(100))["result"] == "A"
    status, body = await api.post("/api/v1/charge", {}, key=keys["api_key"])
    assert status == 400  # authenticated; the empty body is the problem
    status, body = await api.post("/api/v1/api_keys/refresh", {"token": "sim_refresh_token"})
    assert (status, body["error"]) == (401, "invalid_grant")
    # the two may come the other way round: refresh token as bearer, key in the body
    status, again = await api.post(
        "/api/v1/api_keys/refresh", {"token": keys["api_key"]}, key=keys["refresh_token"]
    )
    assert status == 200
    assert again["api_key"] != keys["api_key"]


async def test_refreshed_keys_expire_on_virtual_time(sim_factory: Any, http: Any) -> None:
    sim = await sim_factory(time_scale=36_000)  # an hour is 0.1 s
    api = Api(http, sim.base_url, "sim_api_key")
    _, keys = await api.post("/api/v1/api_keys/refresh", {"token": "sim_refresh_token"})
    await sim.ctx.clock.sleep(3601)
    status, body = await api.post("/api/v1/charge", {}, key=keys["api_key"])
    assert (status, body["error"]) == (401, "invalid_token")
    # an expired key may still be refreshed with its refresh token
    status, _ = await api.post(
        "/api/v1/api_keys/refresh", {"token": keys["refresh_token"]}, key=keys["api_key"]
    )
    assert status == 200
    # the seeded key never expires
    assert (await api.charge(100))["result"] == "A"


async def test_isv_send_receipt_names_the_mid_in_the_body(api: Api) -> None:
    body = {"account_token": "9411111111111111", "expiration": "1230", "amount": 100}
    _, sale = await api.post("/api/v1/charge", {**body, "mid": "999000000002"}, key=ISV)
    receipt = {"trans_id": sale["trans_id"], "email": "a@example.com"}
    status, answer = await api.post("/api/v1/send_receipt", receipt, key=ISV)
    assert (status, answer["error"]) == (400, "mid_required")
    status, answer = await api.post(
        "/api/v1/send_receipt", {**receipt, "mid": "999000000002"}, key=ISV
    )
    assert (status, answer) == (200, {"sent": True})
    # another merchant's transaction is unknown to this one
    status, answer = await api.post(
        "/api/v1/send_receipt", {**receipt, "mid": "999000000001"}, key=ISV
    )
    assert (status, answer["error"]) == (400, "invalid_trans_id")
