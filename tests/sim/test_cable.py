"""The ActionCable endpoint over a real WebSocket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any

import aiohttp
import pytest

from kiosk_agent.sim import cable
from kiosk_agent.sim.cable import PING_INTERVAL_S, CableConnection
from kiosk_agent.sim.server import SimServer

from ..helpers import holding_cards, until
from .sim_api import Api

WAIT_S = 30.0  # a frame's hang guard, not a bound (a busy 2-core machine)


def identifier(interaction_id: str) -> str:
    return json.dumps({"channel": f"terminal_job:{interaction_id}"})


async def open_cable(api: Api, sim: SimServer, key: str | None = None) -> Any:
    _, issued = await api.post("/api/ws-token", key=key)
    ws = await api.http.ws_connect(f"{sim.ws_url}/cable?token={issued['token']}")
    assert (await ws.receive_json(timeout=WAIT_S))["type"] == "welcome"
    return ws


async def receive_message(ws: Any) -> dict[str, Any]:
    """The next frame that is not a ping."""
    while True:
        frame = await ws.receive_json(timeout=WAIT_S)
        if frame.get("type") != "ping":
            return dict(frame)


async def test_subscribe_then_every_change_is_pushed(api: Api, sim: SimServer) -> None:
    ws = await open_cable(api, sim)
    _, started = await api.post("/api/terminal/SIM-0001/charge-card", {"amount": 800})
    ident = identifier(started["interaction_id"])
    await ws.send_json({"command": "subscribe", "identifier": ident})
    assert await receive_message(ws) == {"type": "confirm_subscription", "identifier": ident}
    current = await receive_message(ws)
    assert current["identifier"] == ident
    assert current["message"]["status"] in ("pending", "succeeded")
    final = current if current["message"]["status"] != "pending" else await receive_message(ws)
    assert final["message"]["status"] == "succeeded"
    assert final["message"]["result"]["result"] == "A"
    assert final["message"]["interaction_id"] == started["interaction_id"]
    await ws.close()


async def test_a_finished_interaction_is_still_seen_after_subscribing(
    api: Api, sim: SimServer
) -> None:
    _, started = await api.post("/api/terminal/SIM-0002/read-card", {"amount": 1007})
    assert sim.ctx is not None
    await sim.ctx.clock.sleep(2)  # past the card delay: the device fault already happened
    ws = await open_cable(api, sim)
    ident = identifier(started["interaction_id"])
    await ws.send_json({"command": "subscribe", "identifier": ident})
    assert (await receive_message(ws))["type"] == "confirm_subscription"
    record = (await receive_message(ws))["message"]
    assert record["status"] == "failed"
    await ws.close()


async def test_unknown_or_foreign_interactions_are_rejected(api: Api, sim: SimServer) -> None:
    _, started = await api.post(
        "/api/terminal/SIM-0003/read-card",
        {"amount": 100},
        key="sim_isv_key",
        params={"mid": "999000000002"},
    )
    ws = await open_cable(api, sim)  # the merchant key of 999000000001
    for ident in (identifier("nope"), identifier(started["interaction_id"]), "not json"):
        await ws.send_json({"command": "subscribe", "identifier": ident})
        assert await receive_message(ws) == {"type": "reject_subscription", "identifier": ident}
    await ws.send_str("garbage that is not JSON")  # ignored; the connection stays up
    await ws.send_json({"command": "subscribe", "identifier": identifier("nope")})
    assert (await receive_message(ws))["type"] == "reject_subscription"
    await ws.close()


async def test_pings_every_three_seconds(api: Api, sim: SimServer) -> None:
    ws = await open_cable(api, sim)
    # the first frame after the welcome is a ping, PING_INTERVAL_S real seconds on (the wait
    # is a hang's guard: a 4 s bound on the 3 s ping failed at load 11-15)
    frame = await ws.receive_json(timeout=WAIT_S)
    assert PING_INTERVAL_S == 3.0
    assert frame["type"] == "ping"
    assert isinstance(frame["message"], int)
    await ws.close()


async def test_missing_token_is_refused(api: Api, sim: SimServer) -> None:
    async with api.http.get(f"{sim.base_url}/cable") as resp:
        assert resp.status == 401


async def test_stopping_the_server_says_disconnect(sim_factory: Any, http: Any) -> None:
    sim = await sim_factory()
    api = Api(http, sim.base_url, "sim_api_key")
    ws = await open_cable(api, sim)
    await sim.stop()
    frame = await ws.receive(timeout=2)
    assert frame.type == aiohttp.WSMsgType.TEXT
    assert json.loads(frame.data) == {
        "type": "disconnect",
        "reason": "server_restart",
        "reconnect": True,
    }
    await ws.close()


async def test_push_delays_are_counted_for_benchmarks(
    sim_factory: Any, http: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = await sim_factory(time_scale=1)  # the held card's interaction lives 3 real minutes
    api = Api(http, sim.base_url, "sim_api_key")
    ws = await open_cable(api, sim)
    cards = holding_cards(sim, monkeypatch)
    _, started = await api.post("/api/terminal/SIM-0004/read-card", {"amount": 100})
    await ws.send_json(
        {"command": "subscribe", "identifier": identifier(started["interaction_id"])}
    )
    assert (await receive_message(ws))["type"] == "confirm_subscription"
    assert (await receive_message(ws))["message"]["status"] == "pending"
    cards[started["interaction_id"]]()  # the card, once subscribed: its change is pushed
    assert (await receive_message(ws))["message"]["status"] == "succeeded"
    _, stats = await api.get("/sim/stats")
    assert stats["pushes"] >= 1
    assert 0 <= stats["push_p50_ms"] <= stats["push_p99_ms"]
    await ws.close()


async def test_a_connection_cancelled_while_its_writer_ends_is_cancelled_not_returned(
    api: Api, sim: SimServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client goes; the connection stops its pinger and waits for its writer to end. A
    # cancel that lands there (the server stopping) must end the connection cancelled: it
    # was swallowed with the writer's own end, and the connection returned as if done.
    ended: list[str] = []
    run = CableConnection.run

    async def recorded(connection: CableConnection) -> None:
        try:
            await run(connection)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise
        ended.append("returned")

    def cancelled_here(pinger: asyncio.Task[Any]) -> Awaitable[None]:
        pinger.cancel()
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # lands at the connection's next wait: its writer's end
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    monkeypatch.setattr(CableConnection, "run", recorded)
    monkeypatch.setattr(cable, "cancel_and_wait", cancelled_here)
    ws = await open_cable(api, sim)
    await ws.close()
    await until(lambda: ended)
    assert ended == ["cancelled"]
    monkeypatch.undo()
    second = await open_cable(api, sim)  # the server serves on
    await second.close()
