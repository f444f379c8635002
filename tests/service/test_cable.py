"""InteractionHandle.wait(): the ActionCable WebSocket first, reconnecting when it drops, and
polling when it is refused or told not to come back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.service.cable import InteractionHandle
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import InteractionStatus
from kiosk_agent.service.settings import ServiceSettings
from kiosk_agent.sim.cable import CABLE_KEY
from kiosk_agent.sim.server import SimServer

from ..helpers import PythonCalls, free_port, until

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


async def wait_for_socket(sim: SimServer, *handles: InteractionHandle) -> None:
    """The server holds a cable and each of ``handles`` waits on it (subscribed). The server
    counts a socket as soon as its handshake is done, before its client has read the welcome
    and subscribed: a drop in between is met by the waits before they are on the socket (a
    failure, then their first socket, not their second), which a busy machine made happen
    (a whole suite at load 12-14: a 30 s hang for `socket_connects == 2`)."""
    assert sim.app is not None
    connections = sim.app[CABLE_KEY].connections
    await until(lambda: connections and all(h.socket_connects >= 1 for h in handles))


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
        await wait_for_socket(sim, handle)
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
        await wait_for_socket(sim, handle)
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


class _NoSocket:
    """A subscription's connection, never written to by the subscription itself."""


def _subscription() -> Any:
    from kiosk_agent.service.cable import Subscription

    return Subscription('{"channel":"terminal_job:i-1"}', _NoSocket())  # type: ignore[arg-type]


async def test_a_frame_put_and_taken_costs_a_few_calls_and_no_queue() -> None:
    # a frame on the cable was an asyncio.Queue's put_nowait and get: a dozen Python calls
    # (put_nowait, _put, _wakeup_next, get, empty, get_nowait, _get, ...) at each record, and
    # the read an asyncio.timeout entered and left around it
    subscription = _subscription()
    frame = {"identifier": subscription.identifier, "message": {"status": "succeeded"}}
    deadline = asyncio.get_running_loop().time() + 60
    with PythonCalls() as calls:
        subscription.put(frame)
        taken = await subscription.next(deadline)
    assert taken is frame
    assert calls == ["put", "next"], calls


async def test_a_waiting_reader_is_woken_in_order_and_its_bound_lapses() -> None:
    from kiosk_agent.service.cable import SocketUnavailable, _LifetimeOver

    loop = asyncio.get_running_loop()
    subscription = _subscription()
    reader = asyncio.ensure_future(subscription.next(loop.time() + 60))
    await asyncio.sleep(0)
    assert not reader.done()  # nothing yet: it waits
    first, second = {"message": 1}, {"message": 2}
    subscription.put(first)
    subscription.put(second)
    assert await reader is first
    assert await subscription.next(loop.time() + 60) is second  # kept, in order
    subscription.put(SocketUnavailable("socket closed"))
    with pytest.raises(SocketUnavailable, match="socket closed"):
        await subscription.next(loop.time() + 60)
    started = loop.time()
    with pytest.raises(_LifetimeOver):  # the interaction's lifetime: nothing came by then
        await subscription.next(started + 0.05)
    assert loop.time() - started >= 0.04
    late = {"message": 3}
    subscription.put(late)  # a frame after a lapse is the next read's, not lost
    assert await subscription.next(None) is late


async def test_a_cancelled_reader_leaves_no_bound_armed() -> None:
    loop = asyncio.get_running_loop()
    subscription = _subscription()
    armed = len(loop._scheduled)  # type: ignore[attr-defined]
    reader = asyncio.ensure_future(subscription.next(loop.time() + 3600))
    await asyncio.sleep(0)
    assert len(loop._scheduled) == armed + 1  # type: ignore[attr-defined]
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert all(h.cancelled() for h in loop._scheduled[armed:])  # type: ignore[attr-defined]
    subscription.put({"message": "after"})  # no reader left to wake: kept for the next
    assert await subscription.next(None) == {"message": "after"}


@pytest.mark.parametrize(
    "interaction_id",
    ["i-1", "int_7f3a9c", 'a"quote', "back\\slash", "ctl\x01\n", "ünï €😀", ""],
)
def test_the_cables_json_is_json_dumps_text_in_fewer_calls(interaction_id: str) -> None:
    # json.dumps was three Python calls (dumps, encode, iterencode) at each identifier,
    # subscribe and unsubscribe of a sale; the text sent must stay the same, byte for byte
    import json

    from kiosk_agent.service.cable import _channel, _command

    with PythonCalls() as calls:
        identifier = _channel(interaction_id)
        subscribe = _command("subscribe", identifier)
    assert identifier == json.dumps({"channel": f"terminal_job:{interaction_id}"})
    assert subscribe == json.dumps({"command": "subscribe", "identifier": identifier})
    assert json.loads(json.loads(subscribe)["identifier"])["channel"].endswith(interaction_id)
    assert calls == ["_channel", "_command"]


@pytest.mark.parametrize(
    "text",
    ['{"type":"ping","message":1764000000}', '{"identifier":"{\\"channel\\":\\"x\\"}","message":'
     '{"status":"succeeded","amount":1.5e2}}', "[1, 2]", '"text"', "  {} ", "{}\n", "{} {}",
     "", "nope", "{", '{"a": NaN}', "\ufeff{}"],
)
def test_a_frame_is_read_as_json_loads_reads_it(text: str) -> None:
    import json

    from kiosk_agent.service.cable import _loads

    try:
        expected: Any = ("value", json.loads(text))
    except ValueError as err:
        expected = ("error", type(err), str(err))
    try:
        got: Any = ("value", _loads(text))
    except ValueError as err:
        got = ("error", type(err), str(err))
    assert repr(got) == repr(expected)


def test_a_frame_as_a_server_sends_it_is_read_in_one_call() -> None:
    from kiosk_agent.service.cable import _loads

    frame = '{"identifier":"{\\"channel\\":\\"terminal_job:i-1\\"}","message":{"status":"ok"}}'
    with PythonCalls() as calls:
        value = _loads(frame)
    assert value["message"] == {"status": "ok"}
    assert calls == ["_loads"]


async def test_a_second_reader_at_once_is_refused_not_left_stranded() -> None:
    """A subscription has one reader (a deque and its one future, not asyncio.Queue, whose
    readers queue up). A second reading while the first waits took its wake-up: the first then
    waited to its bound (or, with none, forever) and ended its lifetime over, though the frame
    had come; a frame, not its reader, decides. The second is refused at once; the first
    reads the frame."""
    loop = asyncio.get_running_loop()
    subscription = _subscription()
    first = asyncio.ensure_future(subscription.next(loop.time() + 60))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="one reader"):  # at once: wait_for only a guard
        await asyncio.wait_for(subscription.next(loop.time() + 60), 5)
    subscription.put({"message": "one"})
    assert await asyncio.wait_for(first, 5) == {"message": "one"}


async def test_a_card_wait_resumes_three_coroutines_of_the_handle_at_each_wake_up(
    service: ServiceClient,
) -> None:
    """A sale's card wait (no bound of its own: the sale bounds it) waits in the handle's
    wait, its socket's wait and the socket session: each wake-up (a frame, a record) resumes
    those three and no more. It went through two coroutines more (``_wait`` between the wait
    and the socket's, ``_next_frame`` around each frame's read), two Python calls each a sale."""
    import inspect
    import sys
    import types

    handle = await service.terminal.charge_card(READER, 1000)
    resumed: list[str] = []
    mine = {
        code for name, member in vars(type(handle)).items()
        if inspect.iscoroutinefunction(member) and (code := getattr(member, "__code__", None))
    }  # fmt: skip

    def seen(frame: types.FrameType, event: str, _arg: object) -> None:
        if event == "call" and frame.f_code in mine:
            resumed.append(frame.f_code.co_name)

    sys.setprofile(seen)
    try:
        interaction = await handle.wait()
    finally:
        sys.setprofile(None)
    assert interaction.status is InteractionStatus.SUCCEEDED
    assert handle.via == "websocket"
    wake_ups = resumed.count("wait")
    assert wake_ups >= 2  # the call, then at least the record's wake-up
    assert resumed == ["wait", "_wait_on_socket", "_follow_socket"] * wake_ups, resumed
