"""InteractionHandle.wait(): the ActionCable WebSocket first, reconnecting when it drops, and
polling when it is refused or told not to come back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import InteractionStatus
from kiosk_agent.service.settings import ServiceSettings
from kiosk_agent.sim.cable import CABLE_KEY
from kiosk_agent.sim.server import SimServer

from ..helpers import free_port, until

READER = "SIM-0002"


def drop_sockets(sim: SimServer, *, reconnect: bool) -> int:
    """The server ends every cable connection with an ActionCable ``disconnect``."""
    assert sim.app is not None
    connections = list(sim.app[CABLE_KEY].connections)
    for connection in connections:
        connection.disconnect("test_drop", reconnect=reconnect)
    return len(connections)


def hold_card(sim: SimServer, interaction_id: str) -> Callable[[], None]:
    """The card waits until the returned call presents it."""
    assert sim.ctx is not None
    return sim.ctx.terminals.hold_card(interaction_id)


async def wait_for_socket(sim: SimServer) -> None:
    assert sim.app is not None
    connections = sim.app[CABLE_KEY].connections
    await until(lambda: connections)


async def test_wait_follows_the_websocket(service: ServiceClient) -> None:
    handle = await service.terminal.charge_card(READER, 1000)
    interaction = await handle.wait(timeout=10)
    assert interaction.status is InteractionStatus.SUCCEEDED
    assert handle.via == "websocket"
    assert handle.socket_connects == 1
    assert handle.polls == 0  # the socket's record is the answer: no GET to confirm it


async def test_socket_dropped_mid_wait_reconnects(sim_factory: Any) -> None:
    sim = await sim_factory(time_scale=1)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as svc:
        handle = await svc.terminal.charge_card(READER, 1000)
        present_card = hold_card(sim, handle.interaction_id)  # after the drop
        waiting = asyncio.create_task(handle.wait(timeout=10))
        await wait_for_socket(sim)
        assert drop_sockets(sim, reconnect=True) == 1
        await until(lambda: handle.socket_connects == 2)
        present_card()
        interaction = await waiting
    assert interaction.status is InteractionStatus.SUCCEEDED
    assert handle.socket_failures == 1
    assert handle.socket_connects == 2
    assert handle.via == "websocket"


async def test_disconnect_without_reconnect_falls_back_to_polling(sim_factory: Any) -> None:
    sim = await sim_factory(time_scale=1)
    settings = settings_from_ready(sim.ready_info(), poll_interval=0.05)
    async with ServiceClient(settings) as svc:
        handle = await svc.terminal.charge_card(READER, 1000)
        # the card comes after the drop, however long the socket took to open (a busy machine)
        present_card = hold_card(sim, handle.interaction_id)
        waiting = asyncio.create_task(handle.wait(timeout=10))
        await wait_for_socket(sim)
        drop_sockets(sim, reconnect=False)
        await until(lambda: handle.polls >= 1)
        present_card()
        interaction = await waiting
    assert interaction.status is InteractionStatus.SUCCEEDED
    assert handle.socket_connects == 1
    assert handle.via == "polling"
    assert handle.polls >= 2


async def test_refused_socket_falls_back_to_polling(sim_settings: ServiceSettings) -> None:
    nothing_listens = f"ws://127.0.0.1:{free_port()}"
    settings = sim_settings.replace(ws_url=nothing_listens, poll_interval=0.05)
    async with ServiceClient(settings) as svc:
        handle = await svc.terminal.read_card(READER, 700)
        interaction = await handle.wait(timeout=10)
    assert interaction.status is InteractionStatus.SUCCEEDED
    assert handle.socket_connects == 0
    assert handle.via == "polling"


async def test_polling_only_when_the_websocket_is_switched_off(
    sim_settings: ServiceSettings,
) -> None:
    settings = sim_settings.replace(websocket=False, poll_interval=0.02)
    async with ServiceClient(settings) as svc:
        handle = await svc.terminal.charge_card(READER, 1002)
        interaction = await handle.wait(timeout=10)
    assert interaction.charge_result is not None
    assert interaction.charge_result.result == "C"
    assert handle.socket_connects == 0
    assert handle.via == "polling"


async def test_wait_timeout_leaves_the_interaction_running(sim_factory: Any) -> None:
    sim = await sim_factory(time_scale=3)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as svc:
        handle = await svc.terminal.read_card(READER, 600)
        with pytest.raises(TimeoutError, match=handle.interaction_id):
            await handle.wait(timeout=0.1)
        assert (await handle.wait(timeout=10)).status is InteractionStatus.SUCCEEDED


async def sim_call(service: ServiceClient, method: str, path: str, body: Any = None) -> Any:
    url = f"{service.transport.settings.base_url}{path}"
    async with service.transport.session.request(method, url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def test_a_charge_card_costs_three_requests(service: ServiceClient) -> None:
    before = (await sim_call(service, "GET", "/sim/stats"))["requests"]
    handle = await service.terminal.charge_card(READER, 1000)
    await handle.wait(timeout=10)
    after = (await sim_call(service, "GET", "/sim/stats"))["requests"]
    assert after - before == 3  # the start, a WebSocket token, the socket itself


async def test_a_socket_dropped_after_each_confirmation_still_ends_the_wait(
    sim_factory: Any,
) -> None:
    sim = await sim_factory(time_scale=3)  # the card comes after 0.5 real seconds
    settings = settings_from_ready(sim.ready_info(), poll_interval=0.05)
    async with ServiceClient(settings) as service:
        armed = await sim_call(
            service, "POST", "/sim/faults", {"fault": "ws_drop_after_confirm", "share": 1}
        )
        handle = await service.terminal.charge_card(READER, 1000)
        interaction = await handle.wait(timeout=10)
        dropped = await sim_call(service, "DELETE", f"/sim/faults/{armed['id']}")
    assert interaction.status is InteractionStatus.SUCCEEDED
    assert handle.via == "polling"
    # two sockets that confirmed and closed with no record: the rest of the wait polls
    assert handle.socket_connects == handle.empty_sessions == dropped["hits"] == 2


async def test_a_socket_dropped_once_after_confirming_is_reconnected(sim_factory: Any) -> None:
    sim = await sim_factory(time_scale=3)  # the card comes after 0.5 real seconds
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        await sim_call(service, "POST", "/sim/faults", {"fault": "ws_drop_after_confirm"})
        handle = await service.terminal.charge_card(READER, 1000)
        interaction = await handle.wait(timeout=10)
    assert interaction.status is InteractionStatus.SUCCEEDED
    assert (handle.empty_sessions, handle.socket_connects) == (1, 2)
    assert handle.via == "websocket"
