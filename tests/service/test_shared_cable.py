"""One cable for every wait: interactions subscribe on the terminal client's one WebSocket, which
opens on first need, survives drops by reopening with a fresh token, and closes after a linger."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.service import cable as cable_module
from kiosk_agent.service.cable import CABLE_LINGER
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import InteractionStatus
from kiosk_agent.service.settings import ServiceSettings
from kiosk_agent.sim.cable import CABLE_KEY
from kiosk_agent.sim.server import SimServer

from ..helpers import holding_cards, until
from .scripted_server import ScriptedServer, json_reply
from .test_cable import drop_sockets, sim_call, wait_for_socket
from .test_cable_scripted import ACCEPTED, CHARGED, START, STATUS

READERS = ("SIM-0002", "SIM-0003")


def cable_connections(sim: SimServer) -> int:
    assert sim.app is not None
    return len(sim.app[CABLE_KEY].connections)


async def requests_served(service: ServiceClient) -> int:
    return int((await sim_call(service, "GET", "/sim/stats"))["requests"])


async def test_the_next_sale_costs_only_its_start(service: ServiceClient) -> None:
    first = await service.terminal.charge_card(READERS[0], 1000)
    await first.wait(timeout=10)
    before = await requests_served(service)
    second = await service.terminal.charge_card(READERS[0], 1000)
    interaction = await second.wait(timeout=10)
    assert await requests_served(service) - before == 1  # no token, no socket: the cable is open
    assert interaction.status is InteractionStatus.SUCCEEDED
    assert (second.via, second.socket_connects, second.polls) == ("websocket", 1, 0)
    assert service.terminal.cable.connects == 1


async def test_two_interactions_at_once_share_one_socket(sim_factory: Any) -> None:
    sim = await sim_factory(time_scale=3)  # the cards come after 0.5 real seconds
    async with ServiceClient(settings_from_ready(sim.ready_info())) as svc:
        handles = [await svc.terminal.charge_card(reader, 1000) for reader in READERS]
        waits = [asyncio.create_task(handle.wait(timeout=10)) for handle in handles]
        await until(lambda: cable_connections(sim) == 1)
        results = await asyncio.gather(*waits)
        assert svc.terminal.cable.connects == 1
    assert [r.status for r in results] == [InteractionStatus.SUCCEEDED] * 2
    assert [h.via for h in handles] == ["websocket", "websocket"]


async def test_a_drop_under_two_waits_reopens_one_socket_for_both(
    sim_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the cards wait until both waits are back on the new socket: 1.5 s after the start did
    # not keep them past the drop at load 11-15 (one answered on the first socket); real
    # time, so the interactions' 3-minute lifetime is not what a slow machine meets
    sim = await sim_factory(time_scale=1)
    cards = holding_cards(sim, monkeypatch)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as svc:
        handles = [await svc.terminal.charge_card(reader, 1000) for reader in READERS]
        waits = [asyncio.create_task(handle.wait(timeout=60)) for handle in handles]
        # both on the one socket before it drops (wait_for_socket says why)
        await wait_for_socket(sim, *handles)
        assert cable_connections(sim) == 1
        assert drop_sockets(sim, reconnect=True) == 1
        await until(lambda: all(h.socket_connects == 2 for h in handles))
        for handle in handles:
            cards[handle.interaction_id]()
        results = await asyncio.gather(*waits)
        assert svc.terminal.cable.connects == 2  # one fresh token and socket, not one each
    assert [r.status for r in results] == [InteractionStatus.SUCCEEDED] * 2
    assert [(h.socket_failures, h.socket_connects) for h in handles] == [(1, 2), (1, 2)]


async def test_a_sale_after_a_drop_between_sales_opens_a_new_socket(sim: SimServer) -> None:
    async with ServiceClient(settings_from_ready(sim.ready_info())) as svc:
        await (await svc.terminal.charge_card(READERS[0], 1000)).wait(timeout=10)
        assert drop_sockets(sim, reconnect=True) == 1  # between sales: no wait hears it
        await until(lambda: not svc.terminal.cable.is_open)
        handle = await svc.terminal.charge_card(READERS[0], 1000)
        assert (await handle.wait(timeout=10)).status is InteractionStatus.SUCCEEDED
        assert svc.terminal.cable.connects == 2
    assert (handle.via, handle.socket_failures, handle.socket_connects) == ("websocket", 0, 1)


async def test_an_idle_cable_closes_after_its_linger(sim: SimServer) -> None:
    clock = FakeClock()
    async with ServiceClient(settings_from_ready(sim.ready_info())) as svc:
        cable = svc.terminal.cable
        cable.clock = clock
        await (await svc.terminal.charge_card(READERS[0], 1000)).wait(timeout=10)
        await clock.advance(CABLE_LINGER - 1)
        assert cable.is_open
        assert cable_connections(sim) == 1
        # a sale within the linger keeps the cable and starts the linger again
        await (await svc.terminal.charge_card(READERS[0], 1000)).wait(timeout=10)
        await clock.advance(CABLE_LINGER - 1)
        assert cable.is_open
        await clock.advance(2)
        await until(lambda: not cable.is_open and cable_connections(sim) == 0)
        # the next sale opens it again, with a fresh token
        handle = await svc.terminal.charge_card(READERS[0], 1000)
        assert (await handle.wait(timeout=10)).status is InteractionStatus.SUCCEEDED
        assert (handle.via, cable.connects) == ("websocket", 2)


async def test_closing_the_client_closes_its_cable(sim: SimServer) -> None:
    async with ServiceClient(settings_from_ready(sim.ready_info())) as svc:
        await (await svc.terminal.charge_card(READERS[0], 1000)).wait(timeout=10)
        assert cable_connections(sim) == 1
    await until(lambda: cable_connections(sim) == 0)


def cable_rejecting_then_serving() -> Any:
    """A /cable that rejects the first subscription and confirms (and answers) the next ones."""
    seen: list[str] = []

    async def cable(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=("actioncable-v1-json",))
        await ws.prepare(request)
        await ws.send_json({"type": "welcome"})
        async for message in ws:
            command = json.loads(message.data)
            if command["command"] != "subscribe":
                continue
            identifier = command["identifier"]
            seen.append(identifier)
            if len(seen) == 1:
                await ws.send_json({"type": "reject_subscription", "identifier": identifier})
                continue
            await ws.send_json({"type": "confirm_subscription", "identifier": identifier})
            await ws.send_json({"identifier": identifier, "message": CHARGED})
        return ws

    return cable


async def test_a_rejected_subscription_polls_and_leaves_the_cable_to_the_others(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    scripted.script("POST", START, ACCEPTED)
    scripted.script("POST", "/api/ws-token", json_reply({"token": "wst", "expires_at": 1}))
    scripted.script("GET", "/cable", cable_rejecting_then_serving())
    scripted.script("GET", STATUS, json_reply(CHARGED))
    async with ServiceClient(scripted_settings) as svc:
        rejected = await svc.terminal.charge_card("SIM-0001", 100)
        assert (await rejected.wait(timeout=5)).status is InteractionStatus.SUCCEEDED
        served = await svc.terminal.charge_card("SIM-0001", 100)
        assert (await served.wait(timeout=5)).status is InteractionStatus.SUCCEEDED
        assert svc.terminal.cable.connects == 1
    assert (rejected.via, rejected.polls) == ("polling", 1)
    assert (served.via, served.polls) == ("websocket", 0)
    assert scripted.count("POST", "/api/ws-token") == 1


async def test_a_refused_token_is_asked_afresh_by_the_next_wait(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    refused = json_reply({"error": "forbidden"}, status=403)
    granted = json_reply({"token": "wst", "expires_at": 1})
    scripted.script("POST", START, ACCEPTED)
    scripted.script("POST", "/api/ws-token", refused, granted)
    scripted.script("GET", "/cable", cable_rejecting_then_serving())
    scripted.script("GET", STATUS, json_reply(CHARGED))
    async with ServiceClient(scripted_settings) as svc:
        handle = await svc.terminal.charge_card("SIM-0001", 100)
        # refused: the status endpoint says it ended, before any socket
        assert (await handle.wait(timeout=5)).status is InteractionStatus.SUCCEEDED
        assert (handle.via, handle.socket_connects, handle.socket_failures) == ("polling", 0, 1)
        assert not svc.terminal.cable.is_open


def sim_subscriptions(sim: SimServer) -> list[str]:
    """The channels each of the simulator's cable connections holds a subscription to."""
    assert sim.app is not None
    return [identifier for connection in sim.app[CABLE_KEY].connections
            for identifier in connection._subscriptions]


async def test_a_finished_waits_unsubscribe_waits_until_no_terminal_is_held(
    sim: SimServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The card wait's unsubscribe frame is not sent between the card and the approve (a socket
    write and some 0.1 ms of CPU there) but once the agent says no customer waits
    (SaleRunner.when_no_terminal_held), or after LEAVE_WAITS_FOR_CUSTOMER_S; a new wait on a
    channel left and not yet said says it first, in order."""
    waiting: list[Callable[[], None]] = []  # the callbacks the cable left with the "agent"
    monkeypatch.setattr(cable_module, "LEAVE_WAITS_FOR_CUSTOMER_S", 60.0)  # not on a slow run
    async with ServiceClient(settings_from_ready(sim.ready_info())) as svc:
        cable = svc.terminal.cable
        cable.leave_when = waiting.append
        first = await svc.terminal.charge_card(READERS[0], 1000)
        await first.wait(timeout=10)
        assert first.via == "websocket"
        await asyncio.sleep(0.05)  # the frame would be at the simulator by now
        assert sim_subscriptions(sim) == [first.identifier]  # not said yet
        assert len(waiting) == 1
        waiting.pop()()  # no customer waits now
        await until(lambda: sim_subscriptions(sim) == [])
        # nobody says so: the bound sends it
        monkeypatch.setattr(cable_module, "LEAVE_WAITS_FOR_CUSTOMER_S", 0.1)
        second = await svc.terminal.charge_card(READERS[0], 1000)
        await second.wait(timeout=10)
        await until(lambda: sim_subscriptions(sim) == [])
        assert len(waiting) == 1  # never called back
        waiting.pop()()  # late: nothing more to say
        monkeypatch.setattr(cable_module, "LEAVE_WAITS_FOR_CUSTOMER_S", 60.0)
        # a wait again on a channel left and not yet said: the leave first, then its subscribe
        third = await svc.terminal.charge_card(READERS[0], 1000)
        await third.wait(timeout=10)
        connection = cable._connection
        assert connection is not None
        assert connection.leaving == [third.identifier]
        await cable.subscribe(third.identifier)  # the sim confirms; a finished job: no record
        assert connection.leaving == []
        await until(lambda: sim_subscriptions(sim) == [third.identifier])
    assert cable._leaving is None or cable._leaving.done()
