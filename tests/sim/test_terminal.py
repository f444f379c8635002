"""The terminal interface over real HTTP: terminals, interactions, outcomes, limits."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from kiosk_agent.sim.clock import parse_iso
from kiosk_agent.sim.server import SimServer

from .sim_api import Api

T = "/api/terminal"


async def wait_final(api: Api, device: str, kind: str, interaction_id: str) -> dict[str, Any]:
    """Poll the status endpoint until the interaction leaves ``pending``."""
    for _ in range(500):
        status, record = await api.get(f"{T}/{device}/{kind}/{interaction_id}")
        assert status == 200, record
        if record["status"] != "pending":
            return record
        await asyncio.sleep(0.01)
    raise AssertionError("interaction stayed pending")


async def start(api: Api, device: str, kind: str, body: dict[str, Any]) -> str:
    status, answer = await api.post(f"{T}/{device}/{kind}", body)
    assert status == 202, answer
    assert answer["status"] == "pending"
    return str(answer["interaction_id"])


async def test_eight_terminals_two_vendors_and_their_capabilities(api: Api) -> None:
    status, body = await api.get(T)
    assert status == 200
    terminals = body["terminals"]
    assert [t["device_id"] for t in terminals] == [f"SIM-000{n}" for n in range(1, 9)]
    assert len({t["model"] for t in terminals}) == 8
    assert len({t["vendor"] for t in terminals}) == 2
    printers = [t["device_id"] for t in terminals if t["capabilities"]["receipt_printing"]]
    signers = [t["device_id"] for t in terminals if t["capabilities"]["signature_capture"]]
    assert printers == ["SIM-0007", "SIM-0008"]
    assert signers == [f"SIM-000{n}" for n in range(1, 7)]
    assert set(terminals[0]) >= {"name", "online", "connected", "last_seen_at"}


async def test_connect_disconnect_ping(api: Api) -> None:
    assert await api.post(f"{T}/SIM-0001/connect") == (
        200,
        {"device_id": "SIM-0001", "connected": True},
    )
    assert await api.delete(f"{T}/SIM-0001/disconnect") == (
        200,
        {"device_id": "SIM-0001", "connected": False},
    )
    status, pong = await api.post(f"{T}/SIM-0001/ping")
    assert status == 200
    assert pong["online"] is True
    assert 0 < pong["latency_ms"] < 1000
    status, body = await api.post(f"{T}/SIM-0099/ping")
    assert (status, body["error"]) == (404, "terminal_not_found")


async def test_read_card_gives_a_token_and_connects_the_session(api: Api) -> None:
    interaction_id = await start(api, "SIM-0001", "read-card", {"amount": 500})
    record = await wait_final(api, "SIM-0001", "read-card", interaction_id)
    assert record["status"] == "succeeded"
    assert record["kind"] == "read_card"
    assert record["device_id"] == "SIM-0001"
    assert record["created_at"].endswith("Z")
    assert record["expires_at"] > record["created_at"]
    result = record["result"]
    assert set(result) == {"token", "card_brand_id", "last_four", "expiration"}
    assert result["token"].endswith(result["last_four"])
    _, body = await api.get(T)
    assert body["terminals"][0]["connected"] is True
    # the token is then charged through the payments interface
    answer = await api.charge(500, account_token=result["token"], expiration=result["expiration"])
    assert answer["result"] == "A"


async def test_charge_card_approved_lands_in_the_ledger(api: Api, sim: SimServer) -> None:
    interaction_id = await start(
        api, "SIM-0002", "charge-card", {"amount": 1250, "order_id": "kiosk-1"}
    )
    record = await wait_final(api, "SIM-0002", "charge-card", interaction_id)
    assert record["status"] == "succeeded"
    assert record["stage_errors"] == []
    charge = record["result"]
    assert (charge["result"], charge["amount"], charge["order_id"]) == ("A", 1250, "kiosk-1")
    assert sim.ctx is not None
    row = sim.ctx.ledger.get(charge["trans_id"])
    assert (row["terminal_id"], row["trans_status_id"]) == ("SIM-0002", 2)


@pytest.mark.parametrize(("cents", "letter"), [(1001, "B"), (1002, "C")])
async def test_retry_and_decline_are_succeeded_interactions(
    api: Api, cents: int, letter: str
) -> None:
    interaction_id = await start(api, "SIM-0003", "charge-card", {"amount": cents})
    record = await wait_final(api, "SIM-0003", "charge-card", interaction_id)
    assert (record["status"], record["result"]["result"]) == ("succeeded", letter)


async def test_device_fault_fails_with_a_stage_error(api: Api) -> None:
    interaction_id = await start(api, "SIM-0004", "charge-card", {"amount": 1007})
    record = await wait_final(api, "SIM-0004", "charge-card", interaction_id)
    assert record["status"] == "failed"
    assert record["result"] is None
    assert record["stage_errors"][0]["code"] == "device_fault"
    assert set(record["stage_errors"][0]) == {"stage", "code", "message"}


async def test_no_card_expires_after_three_simulated_minutes(sim_factory: Any, http: Any) -> None:
    sim = await sim_factory(time_scale=1000)  # 3 minutes = 0.18 s
    api = Api(http, sim.base_url, "sim_api_key")
    interaction_id = await start(api, "SIM-0001", "read-card", {"amount": 1005})
    record = await wait_final(api, "SIM-0001", "read-card", interaction_id)
    assert record["status"] == "expired"
    # on the simulated clock (a bound of 1 s real on the whole wait was passed at load 11-15):
    # three minutes after its start, and not before them; an unscaled expiry outlasts the polls
    expires_at = parse_iso(record["expires_at"])
    assert expires_at - parse_iso(record["created_at"]) == pytest.approx(180)
    assert sim.ctx is not None
    assert sim.ctx.clock.time() >= expires_at
    # the terminal is free again
    await start(api, "SIM-0001", "read-card", {"amount": 100})


async def test_busy_terminal_is_409_until_the_interaction_ends(api: Api) -> None:
    interaction_id = await start(api, "SIM-0005", "read-card", {"amount": 1005})
    status, body = await api.post(f"{T}/SIM-0005/charge-card", {"amount": 100})
    assert (status, body["error"]) == (409, "terminal_busy")
    status, cancelled = await api.delete(f"{T}/SIM-0005/cancel/{interaction_id}")
    assert (status, cancelled["status"]) == (200, "cancelled")
    await start(api, "SIM-0005", "charge-card", {"amount": 100})


async def test_cancel_rules(api: Api) -> None:
    charge_id = await start(api, "SIM-0006", "charge-card", {"amount": 1005})
    status, body = await api.delete(f"{T}/SIM-0006/cancel/{charge_id}")
    assert (status, body["error"]) == (409, "not_cancellable")
    read_id = await start(api, "SIM-0001", "read-card", {"amount": 100})
    await wait_final(api, "SIM-0001", "read-card", read_id)
    status, body = await api.delete(f"{T}/SIM-0001/cancel/{read_id}")
    assert (status, body["error"]) == (409, "not_cancellable")
    status, body = await api.delete(f"{T}/SIM-0001/cancel/unknown")
    assert (status, body["error"]) == (404, "interaction_not_found")


async def test_status_of_the_wrong_kind_or_device_is_404(api: Api) -> None:
    read_id = await start(api, "SIM-0001", "read-card", {"amount": 100})
    status, _ = await api.get(f"{T}/SIM-0001/charge-card/{read_id}")
    assert status == 404
    status, _ = await api.get(f"{T}/SIM-0002/read-card/{read_id}")
    assert status == 404


async def test_missing_capabilities_are_non_fatal_stage_errors(api: Api) -> None:
    interaction_id = await start(
        api,
        "SIM-0007",
        "charge-card",
        {"amount": 300, "capture_signature": True, "print_receipt": True, "email": "a@b.co"},
    )
    record = await wait_final(api, "SIM-0007", "charge-card", interaction_id)
    assert record["status"] == "succeeded"
    assert record["result"]["result"] == "A"
    assert [(e["stage"], e["code"]) for e in record["stage_errors"]] == [
        ("signature", "capability_unsupported")
    ]


async def test_print_receipt(api: Api) -> None:
    sale = await api.charge(300)
    status, body = await api.post(
        f"{T}/SIM-0008/print-receipt", {"trans_id": sale["trans_id"], "copies": 2}
    )
    assert (status, body["printed"], body["copies"]) == (200, True, 2)
    status, body = await api.post(f"{T}/SIM-0001/print-receipt", {"trans_id": sale["trans_id"]})
    assert (status, body["error"]) == (400, "capability_unsupported")
    status, body = await api.post(f"{T}/SIM-0008/print-receipt", {"trans_id": "nope"})
    assert (status, body["error"]) == (400, "invalid_trans_id")


async def test_offline_terminal(api: Api) -> None:
    read_id = await start(api, "SIM-0002", "read-card", {"amount": 1005})
    status, body = await api.post("/sim/terminals/SIM-0002/offline", key="")
    assert (status, body) == (200, {"device_id": "SIM-0002", "online": False})
    record = await wait_final(api, "SIM-0002", "read-card", read_id)
    assert (record["status"], record["stage_errors"][0]["code"]) == ("failed", "terminal_offline")
    status, pong = await api.post(f"{T}/SIM-0002/ping")
    assert (status, pong["online"], pong["latency_ms"]) == (200, False, None)
    status, body = await api.post(f"{T}/SIM-0002/read-card", {"amount": 100})
    assert (status, body["error"]) == (409, "terminal_offline")
    await api.post("/sim/terminals/SIM-0002/online")
    await start(api, "SIM-0002", "read-card", {"amount": 100})


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({}, "amount"),
        ({"amount": "5.00"}, "amount"),
        ({"amount": 12.5}, "amount"),
        ({"amount": -3}, "amount"),
        ({"amount": 100, "confirm_amount": "yes"}, "confirm_amount"),
    ],
)
async def test_malformed_read_card_is_400(api: Api, body: dict[str, Any], named: str) -> None:
    status, answer = await api.post(f"{T}/SIM-0001/read-card", body)
    assert status == 400
    assert named in answer["error_description"]


async def test_isv_key_needs_a_mid_on_terminal_calls(api: Api) -> None:
    status, body = await api.get(T, key="sim_isv_key")
    assert (status, body["error"]) == (400, "mid_required")
    status, body = await api.get(T, key="sim_isv_key", params={"mid": "999000000777"})
    assert (status, body["error"]) == (400, "invalid_mid")
    status, _ = await api.get(T, key="sim_isv_key", params={"mid": "999000000002"})
    assert status == 200


async def test_rate_limit_answers_429_with_retry_after(sim_factory: Any, http: Any) -> None:
    # 30 per 60 s: bursts of 1 and a token every 2 s, so a slow machine cannot refill in time
    sim = await sim_factory(rate_limit="30/60")
    api = Api(http, sim.base_url, "sim_api_key")
    assert (await api.get(T))[0] == 200
    # every terminal endpoint draws on the same bucket
    status, body = await api.post(f"{T}/SIM-0001/ping")
    assert (status, body["error"]) == (429, "rate_limited")
    assert 1 <= int(api.last_headers["Retry-After"]) <= 2
    assert (await api.post("/api/ws-token"))[0] == 429
    # the limit is per credential: the ISV key has its own bucket
    status, _ = await api.get(T, key="sim_isv_key", params={"mid": "999000000001"})
    assert status == 200


async def test_ws_tokens_are_single_use_and_live_60_simulated_seconds(api: Api) -> None:
    status, issued = await api.post("/api/ws-token")
    assert status == 200
    assert issued["expires_at"] - time.time() > 0
    url = api.base_url.replace("http", "ws") + "/cable"
    async with api.http.ws_connect(f"{url}?token={issued['token']}") as ws:
        assert (await ws.receive_json())["type"] == "welcome"
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await api.http.ws_connect(f"{url}?token={issued['token']}")
    assert refused.value.status == 401


async def test_ws_token_expires(sim_factory: Any, http: Any) -> None:
    sim = await sim_factory(time_scale=1000)  # 60 s = 0.06 s
    api = Api(http, sim.base_url, "sim_api_key")
    _, issued = await api.post("/api/ws-token")
    await asyncio.sleep(0.1)
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(f"{sim.ws_url}/cable?token={issued['token']}")
    assert refused.value.status == 401


async def test_charge_card_with_a_used_order_id_answers_the_first_charge(
    api: Api, sim: SimServer
) -> None:
    first_id = await start(api, "SIM-0001", "charge-card", {"amount": 990, "order_id": "k-9"})
    first = await wait_final(api, "SIM-0001", "charge-card", first_id)
    again_id = await start(api, "SIM-0001", "charge-card", {"amount": 990, "order_id": "k-9"})
    again = await wait_final(api, "SIM-0001", "charge-card", again_id)
    assert again["result"] == first["result"]
    assert sim.ctx is not None
    assert len(sim.ctx.ledger.find_order("999000000001", "k-9")) == 1


async def test_simultaneous_starts_on_one_terminal_admit_exactly_one(api: Api) -> None:
    answers = await asyncio.gather(
        *(api.post(f"{T}/SIM-0008/read-card", {"amount": 1005}) for _ in range(5))
    )
    assert sorted(status for status, _ in answers) == [202, 409, 409, 409, 409]
