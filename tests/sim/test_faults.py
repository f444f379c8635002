"""Injected faults: the outcomes a client must survive, made on demand."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest

from kiosk_agent.sim.server import SimServer

from .sim_api import Api

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
    ],
)
async def test_bad_faults_are_400(api: Api, body: dict[str, Any], named: str) -> None:
    status, answer = await api.post("/sim/faults", body)
    assert status == 400
    assert named in answer["error_description"]
