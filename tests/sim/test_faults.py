"""Injected faults: the outcomes a client must survive, made on demand."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.sim.faults import FAULTS, Faults
from kiosk_agent.sim.http import ApiError, Body
from kiosk_agent.sim.server import SimServer
from tests.helpers import until

from .sim_api import Api
from .test_cable import identifier, open_cable, receive_message

CHARGE = {"account_token": "9411111111111111", "expiration": "1230", "amount": 640}


async def test_a_dropped_answer_still_charges(api: Api, sim: SimServer) -> None:
    status, armed = await api.post(
        "/sim/faults", {"path": "/api/v1/charge", "fault": "drop_answer"}
    )
    assert (status, armed["remaining"]) == (200, 1)
    with pytest.raises(aiohttp.ClientError):
        await api.post("/api/v1/charge", {**CHARGE, "order_id": "lost-1"})
    assert sim.ctx is not None
    rows = sim.ctx.ledger.find_order("999000000001", "lost-1")
    assert [row["result"] for row in rows] == ["A"]
    # the fault is spent: the retry with the same order_id answers the first charge
    answer = await api.charge(640, order_id="lost-1")
    assert answer["trans_id"] == rows[0]["trans_id"]


@pytest.mark.parametrize(("fault", "status"), [("server_error", 500), ("unavailable", 503)])
async def test_errors_before_processing(api: Api, sim: SimServer, fault: str, status: int) -> None:
    await api.post("/sim/faults", {"path": "/api/v1/charge", "fault": fault, "count": 2})
    for _ in range(2):
        got, _ = await api.post("/api/v1/charge", {**CHARGE, "order_id": f"never-{fault}"})
        assert got == status
    assert sim.ctx is not None
    assert sim.ctx.ledger.find_order("999000000001", f"never-{fault}") == []
    assert (await api.charge(640))["result"] == "A"


async def test_delay_and_prefix_paths(api: Api) -> None:
    await api.post(
        "/sim/faults",
        {"path": "/api/terminal*", "method": "GET", "fault": "delay", "delay_s": 0.2},
    )
    _, listed = await api.get("/sim/faults")
    assert [f["fault"] for f in listed["faults"]] == ["delay"]
    started = time.monotonic()
    assert (await api.get("/api/terminal"))[0] == 200
    assert time.monotonic() - started >= 0.2
    assert (await api.delete("/sim/faults"))[1] == {"faults": []}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"fault": "drop_answer"}, "path"),
        ({"path": "api", "fault": "drop_answer"}, "path"),
        ({"path": "/x", "fault": "explode"}, "fault"),
        ({"path": "/x", "fault": "delay", "delay_s": "long"}, "delay_s"),
        ({"path": "/x", "fault": "delay", "method": "PATCH"}, "method"),
        ({"path": "/x", "fault": "rate_limited", "share": 0}, "share"),
        ({"path": "/x", "fault": "rate_limited", "share": 1.5}, "share"),
        ({"path": "/x", "fault": "rate_limited", "count": 0}, "count"),
        ({"path": "/x", "fault": "rate_limited", "retry_after_s": -1}, "retry_after_s"),
    ],
)
async def test_bad_faults_are_400(api: Api, body: dict[str, Any], named: str) -> None:
    status, answer = await api.post("/sim/faults", body)
    assert status == 400
    assert named in answer["error_description"]


async def arm(api: Api, **fault: Any) -> dict[str, Any]:
    status, armed = await api.post("/sim/faults", fault)
    assert status == 200, armed
    return dict(armed)


async def hits(api: Api, fault_id: str) -> int:
    _, listed = await api.get("/sim/faults")
    return int(next(f["hits"] for f in listed["faults"] if f["id"] == fault_id))


async def test_each_fault_has_an_id_and_counts_its_hits_until_deleted(api: Api) -> None:
    first = await arm(api, path="/api/terminal", method="GET", fault="rate_limited", count=2)
    second = await arm(api, path="/api/terminal", method="GET", fault="server_error")
    assert (first["id"], second["id"]) == ("f1", "f2")
    statuses = [(await api.get("/api/terminal"))[0] for _ in range(4)]
    assert statuses == [429, 429, 500, 200]  # the first armed fault goes first
    assert api.last_headers["Content-Type"].startswith("application/json")
    # spent faults stay listed, so their hits can still be read
    assert (await hits(api, "f1"), await hits(api, "f2")) == (2, 1)
    status, deleted = await api.delete("/sim/faults/f1")
    assert (status, deleted["hits"], deleted["remaining"]) == (200, 2, 0)
    _, listed = await api.get("/sim/faults")
    assert [f["id"] for f in listed["faults"]] == ["f2"]
    status, missing = await api.delete("/sim/faults/f1")
    assert (status, missing["error"]) == (404, "fault_not_found")


async def test_rate_limited_says_its_retry_after_and_processes_nothing(
    api: Api, sim: SimServer
) -> None:
    await arm(api, path="/api/v1/charge", fault="rate_limited", retry_after_s=3)
    status, body = await api.post("/api/v1/charge", {**CHARGE, "order_id": "limited-1"})
    assert (status, body["error"], api.last_headers["Retry-After"]) == (429, "rate_limited", "3")
    assert sim.ctx is not None
    assert sim.ctx.ledger.find_order("999000000001", "limited-1") == []


async def test_a_share_of_calls_by_a_seeded_draw(api: Api) -> None:
    async def run(seed: int) -> list[int]:
        armed = await arm(
            api, path="/api/terminal", method="GET", fault="unavailable", share=0.5, seed=seed
        )
        statuses = [(await api.get("/api/terminal"))[0] for _ in range(40)]
        assert (await api.delete(f"/sim/faults/{armed['id']}"))[1]["hits"] == statuses.count(503)
        return statuses

    first, again = await run(7), await run(7)
    assert first == again  # the same seed, the same calls hit
    assert 8 <= first.count(503) <= 32
    # share with count: at most count hits
    await arm(api, path="/api/terminal", method="GET", fault="unavailable", share=0.9, count=3)
    statuses = [(await api.get("/api/terminal"))[0] for _ in range(30)]
    assert statuses.count(503) == 3


async def test_server_error_after_commit_charges(api: Api, sim: SimServer) -> None:
    await arm(api, path="/api/v1/charge", fault="server_error_after_commit")
    status, _ = await api.post("/api/v1/charge", {**CHARGE, "order_id": "late-500"})
    assert status == 500
    assert sim.ctx is not None
    assert [r["result"] for r in sim.ctx.ledger.find_order("999000000001", "late-500")] == ["A"]


async def test_slow_answer_commits_before_it_answers(api: Api, sim: SimServer) -> None:
    await arm(api, path="/api/v1/charge", fault="slow_answer", delay_s=0.5)
    call = asyncio.ensure_future(api.post("/api/v1/charge", {**CHARGE, "order_id": "slow-1"}))
    assert sim.ctx is not None
    ledger = sim.ctx.ledger
    # The simulator runs in this loop: the poll that first sees the commit runs before the
    # answer (0.5 s later) can be sent, however busy the machine.
    await until(lambda: ledger.find_order("999000000001", "slow-1"))
    assert not call.done()  # committed, not yet answered
    status, answer = await call
    assert (status, answer["result"]) == (200, "A")


async def test_latency_adds_to_every_matching_request_until_deleted(
    api: Api, sim: SimServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 0.5 s each: a plain call on a busy machine can take 0.1 s, never 0.5 s.
    armed = await arm(api, path="/api/*", method="*", fault="latency", delay_s=0.5)
    assert armed["count"] is None  # a standing condition
    await arm(api, path="/api/terminal", method="GET", fault="rate_limited")
    started = time.monotonic()
    assert (await api.get("/api/terminal"))[0] == 429  # latency and a fault together
    assert (await api.post("/api/terminal/SIM-0001/ping"))[0] == 200
    assert time.monotonic() - started >= 1.0
    assert (await api.delete(f"/sim/faults/{armed['id']}"))[1]["hits"] == 2
    # deleted: the next call gets no latency, as the simulator decides it (a bound of 0.5 s
    # of wall time on the call was passed at load 11-15)
    assert sim.ctx is not None
    faults = sim.ctx.extras["faults"]
    decided: list[float] = []
    take = faults.take

    def recorded(method: str, path: str) -> Any:
        latency, fault = take(method, path)
        decided.append(latency)
        return latency, fault

    monkeypatch.setattr(faults, "take", recorded)
    assert (await api.get("/api/terminal"))[0] == 200
    assert decided == [0.0]


async def test_a_black_hole_holds_the_call_until_the_client_leaves(
    api: Api, sim: SimServer
) -> None:
    armed = await arm(api, path="/api/terminal", method="GET", fault="black_hole")
    with pytest.raises(TimeoutError):
        await api.get("/api/terminal", timeout=aiohttp.ClientTimeout(total=0.3))
    assert await hits(api, armed["id"]) == 1
    assert sim.ctx is not None
    faults = sim.ctx.extras["faults"]
    await until(lambda: faults.held == 0)  # the client left: the hold ends
    assert (await api.get("/api/terminal"))[0] == 200  # count 1: spent
    # a request still held when the simulator stops does not hold up its stop
    await arm(api, path="/api/terminal", method="GET", fault="black_hole")
    held = asyncio.ensure_future(api.get("/api/terminal"))
    await until(lambda: faults.held == 1)  # held now (a 0.1 s sleep was not, at load 11-15)
    started = time.monotonic()
    await sim.stop()
    # not aiohttp's 60 s wait for a handler still running (a bound of 2 s was wall time)
    assert time.monotonic() - started < 30
    with pytest.raises(aiohttp.ClientError):
        await held


async def test_a_held_call_is_committed_when_its_fault_is_deleted_whatever_the_time(
    api: Api, sim: SimServer
) -> None:
    """``hold``: a late commit whose moment the test decides (a ``delay`` of real time raced a
    starved loop's own steps, tests/sales/test_release.py)."""
    armed = await arm(api, path="/api/v1/charge", fault="hold")
    charging = asyncio.ensure_future(api.post("/api/v1/charge", {**CHARGE, "order_id": "held-1"}))
    await until(lambda: sim.ctx is not None and sim.ctx.extras["faults"].armed[0].hits == 1)
    assert sim.ctx is not None
    await asyncio.sleep(0)  # the held call's turn: nothing is made while it is held
    assert sim.ctx.ledger.find_order("999000000001", "held-1") == []
    assert not charging.done()
    status, deleted = await api.delete(f"/sim/faults/{armed['id']}")
    assert (status, deleted["hits"]) == (200, 1)
    status, answer = await charging  # made and answered once released
    assert (status, answer["result"]) == (200, "A")
    [row] = sim.ctx.ledger.find_order("999000000001", "held-1")
    assert row["trans_id"] == answer["trans_id"]
    # the client gone first: the call is still made when released (clearing all faults)
    await arm(api, path="/api/v1/charge", fault="hold")
    with pytest.raises(TimeoutError):
        await api.post(
            "/api/v1/charge", {**CHARGE, "order_id": "held-2"},
            timeout=aiohttp.ClientTimeout(total=0.2),
        )
    assert sim.ctx.ledger.find_order("999000000001", "held-2") == []
    assert (await api.delete("/sim/faults"))[0] == 200
    await until(lambda: len(sim.ctx.ledger.find_order("999000000001", "held-2")) == 1)  # type: ignore[union-attr]


async def test_first_poll_rate_limited_hits_the_first_status_get_of_each_interaction(
    api: Api,
) -> None:
    armed = await arm(api, fault="first_poll_rate_limited", retry_after_s=2)
    assert (armed["path"], armed["count"]) == ("/api/terminal/*", None)
    for device in ("SIM-0001", "SIM-0002"):
        _, started = await api.post(f"/api/terminal/{device}/charge-card", {"amount": 900})
        status_path = f"/api/terminal/{device}/charge-card/{started['interaction_id']}"
        first, _ = await api.get(status_path)
        assert (first, api.last_headers["Retry-After"]) == (429, "2")
        assert [(await api.get(status_path))[0] for _ in range(2)] == [200, 200]
    assert (await api.get("/api/terminal"))[0] == 200  # not a status poll
    assert await hits(api, armed["id"]) == 2


async def test_ws_drop_after_confirm_closes_the_socket(api: Api, sim: SimServer) -> None:
    armed = await arm(api, fault="ws_drop_after_confirm")
    assert armed["path"] == "/cable*"
    _, started = await api.post("/api/terminal/SIM-0003/charge-card", {"amount": 800})
    ident = identifier(started["interaction_id"])
    for dropped in (True, False):  # count 1: the second socket works
        ws = await open_cable(api, sim)
        await ws.send_json({"command": "subscribe", "identifier": ident})
        assert await receive_message(ws) == {"type": "confirm_subscription", "identifier": ident}
        if dropped:
            assert (await ws.receive(timeout=2)).type in (
                aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING,
            )  # fmt: skip
        else:
            assert (await receive_message(ws))["identifier"] == ident
        await ws.close()
    assert await hits(api, armed["id"]) == 1


async def test_the_rate_limit_changes_at_run_time(api: Api) -> None:
    status, limit = await api.post("/sim/rate-limit", {"requests": 2, "per_s": 1})
    assert (status, limit) == (200, {"requests": 2, "per_s": 1, "burst": 4})
    statuses = [(await api.get("/api/terminal"))[0] for _ in range(6)]
    assert statuses.count(429) >= 1
    assert api.last_headers.get("Retry-After") is not None
    for body in ({"requests": 0, "per_s": 1}, {"requests": 2}, {"requests": "2", "per_s": 1}):
        status, answer = await api.post("/sim/rate-limit", body)
        assert status == 400, body
        assert "must be a number" in answer["error_description"]


async def test_requests_are_counted_for_benches(api: Api, sim: SimServer) -> None:
    assert sim.ctx is not None
    before = (await api.get("/sim/stats"))[1]["requests"]
    await api.get("/api/terminal")
    await api.post("/api/terminal/SIM-0001/ping")
    assert (await api.get("/sim/stats"))[1]["requests"] == before + 2


FIELD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 2_000_000), st.floats(allow_nan=True),
    st.text(max_size=20), st.sampled_from(["/api/*", "/cable*", "*", "GET", "latency"]),
    st.lists(st.integers(), max_size=2),
)  # fmt: skip
BODIES = st.dictionaries(
    st.sampled_from(
        ["path", "method", "fault", "count", "share", "delay_s", "retry_after_s", "seed", "x"]
    ),
    FIELD_VALUES,
)


@given(BODIES)
def test_any_fault_body_is_armed_or_a_400_naming_a_field(data: dict[str, Any]) -> None:
    try:
        fault = Faults()._parse(Body(data))
    except ApiError as err:
        refused: ApiError | None = err
    else:
        refused = None
    if refused is not None:
        assert refused.status == 400
        assert "'" in refused.description  # names the field
        return
    assert fault.path.startswith("/")
    assert fault.fault in FAULTS
    assert fault.share is None or 0 < fault.share <= 1
    assert fault.remaining is None or fault.remaining >= 1
    assert 0 <= fault.delay_s <= 60
