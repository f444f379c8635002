"""wait() against a scripted service: bad frames and bad records name the field, and a passing
outage of the status endpoint does not end the wait."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp import web

from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.errors import InvalidResponseError
from kiosk_agent.service.models import InteractionStatus
from kiosk_agent.service.settings import CallKind, ServiceSettings

from .scripted_server import ScriptedServer, json_reply

START = "/api/terminal/SIM-0001/charge-card"
STATUS = "/api/terminal/SIM-0001/charge-card/i-1"
ACCEPTED = json_reply({"interaction_id": "i-1", "status": "pending"}, status=202)
CHARGED = {
    "interaction_id": "i-1", "device_id": "SIM-0001", "kind": "charge_card",
    "status": "succeeded", "created_at": "2026-11-22T10:15:30.123Z",
    "expires_at": "2026-11-22T10:18:30.123Z", "stage_errors": [],
    "result": {"result": "A", "trans_id": "t-1", "amount": 100, "respcode": "00"},
}  # fmt: skip


def cable_with(message: object) -> object:
    """A /cable endpoint that welcomes, confirms the subscription and sends ``message``."""

    async def cable(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=("actioncable-v1-json",))
        await ws.prepare(request)
        await ws.send_json({"type": "welcome"})
        subscribe = json.loads((await ws.receive()).data)
        identifier = subscribe["identifier"]
        await ws.send_json({"type": "confirm_subscription", "identifier": identifier})
        await ws.send_json({"identifier": identifier, "message": message})
        await ws.receive()  # until the client goes
        return ws

    return cable


async def test_bad_socket_record_falls_back_to_the_status_endpoint(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    scripted.script("POST", START, ACCEPTED)
    scripted.script("POST", "/api/ws-token", json_reply({"token": "wst", "expires_at": 1}))
    scripted.script("GET", "/cable", cable_with({"interaction_id": "i-1", "status": 42}))
    scripted.script("GET", STATUS, json_reply(CHARGED))
    async with ServiceClient(scripted_settings) as svc:
        handle = await svc.terminal.charge_card("SIM-0001", 100)
        interaction = await handle.wait(timeout=5)
    assert interaction.status is InteractionStatus.SUCCEEDED
    assert handle.socket_connects == 1
    assert handle.via == "polling"


async def test_bad_record_from_the_status_endpoint_names_the_field(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    broken = {**CHARGED, "result": {"result": "A"}}  # no trans_id
    scripted.script("POST", START, ACCEPTED)
    scripted.script("GET", STATUS, json_reply(broken))
    settings = scripted_settings.replace(websocket=False)
    async with ServiceClient(settings) as svc:
        handle = await svc.terminal.charge_card("SIM-0001", 100)
        with pytest.raises(InvalidResponseError) as caught:
            await handle.wait(timeout=5)
    assert caught.value.field == "result.trans_id"


async def test_wait_polls_through_an_outage_of_the_status_endpoint(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    down = json_reply({"error": "unavailable"}, status=503)
    scripted.script("POST", START, ACCEPTED)
    # more 503s in a row than one call retries: the wait itself must carry on
    scripted.script("GET", STATUS, *[down] * 6, json_reply(CHARGED))
    settings = scripted_settings.replace(websocket=False, poll_interval=0.01)
    async with ServiceClient(settings) as svc:
        handle = await svc.terminal.charge_card("SIM-0001", 100)
        interaction = await handle.wait(timeout=5)
    assert interaction.charge_result is not None
    assert interaction.charge_result.trans_id == "t-1"
    assert scripted.count("GET", STATUS) == 7


async def test_ws_token_refused_falls_back_to_polling(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    scripted.script("POST", START, ACCEPTED)
    scripted.script("POST", "/api/ws-token", json_reply({"error": "forbidden"}, status=403))
    scripted.script("GET", STATUS, json_reply(CHARGED))
    async with ServiceClient(scripted_settings) as svc:
        handle = await svc.terminal.charge_card("SIM-0001", 100)
        interaction = await handle.wait(timeout=5)
    assert interaction.status is InteractionStatus.SUCCEEDED
    assert handle.socket_connects == 0


async def test_a_silent_socket_ends_at_the_lifetime_with_the_status_endpoints_word(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    # an interaction that lives 0.3 s, and a socket that never says it ended
    pending = {**CHARGED, "status": "pending", "result": None,
               "created_at": "2026-11-22T10:15:30.000Z", "expires_at": "2026-11-22T10:15:30.300Z"}
    scripted.script("POST", START, ACCEPTED)
    scripted.script("POST", "/api/ws-token", json_reply({"token": "wst", "expires_at": 1}))
    scripted.script("GET", "/cable", cable_with(pending))
    scripted.script("GET", STATUS, json_reply(pending))
    async with ServiceClient(scripted_settings) as svc:
        handle = await svc.terminal.charge_card("SIM-0001", 100)
        started = asyncio.get_running_loop().time()
        interaction = await handle.wait(timeout=5)
        waited = asyncio.get_running_loop().time() - started
    assert interaction.status is InteractionStatus.PENDING  # what the service says, as it is
    assert 0.25 <= waited < 1.5
    assert scripted.count("GET", STATUS) >= 1


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirected_handshake_is_not_followed_and_the_wait_polls(
    scripted: ScriptedServer,
    scripted_settings: ServiceSettings,
    caplog: pytest.LogCaptureFixture,
    status: int,
) -> None:
    """A cable address answering the upgrade with "go elsewhere": followed, the agent would read
    the other server's records (a forged charge) as the service's. The handshake is refused,
    counted as a failed one, and the wait asks the status endpoint instead."""
    elsewhere = ScriptedServer()
    await elsewhere.start()
    try:
        forged = {**CHARGED, "result": {**CHARGED["result"], "trans_id": "forged"}}  # type: ignore[dict-item]
        elsewhere.script("GET", "/cable", cable_with(forged))
        target = f"{elsewhere.url}/cable?token=wst-secret"
        scripted.script("POST", START, ACCEPTED)
        token = json_reply({"token": "wst-secret", "expires_at": 1})
        scripted.script("POST", "/api/ws-token", token)
        scripted.script("GET", "/cable", json_reply({}, status, {"Location": target}))
        scripted.script("GET", STATUS, json_reply(CHARGED))
        handshakes: list[str] = []
        async with ServiceClient(scripted_settings) as svc:
            svc.transport.observe(
                lambda kind, _s, outcome: handshakes.append(outcome)
                if kind is CallKind.WEBSOCKET else None
            )  # fmt: skip
            handle = await svc.terminal.charge_card("SIM-0001", 100)
            with caplog.at_level(logging.WARNING, logger="kiosk_agent.service.cable"):
                interaction = await handle.wait(timeout=5)
        assert elsewhere.requests == []  # no second request: nothing reached the other server
        assert interaction.charge_result is not None
        assert interaction.charge_result.trans_id == "t-1"  # the service's record, by polling
        assert handle.via == "polling"
        assert handshakes == ["error"]  # counted with the other failed handshakes
        assert scripted.count("GET", "/cable") == 1  # the wait polls at once, not again
        assert f"HTTP {status}: a redirect to {elsewhere.url}/cable, not followed" in caplog.text
        assert "wst-secret" not in caplog.text  # the token sat in its query
    finally:
        await elsewhere.stop()


def cable_then(frames: list[object], pause: float, last: object | None) -> object:
    """A /cable endpoint that welcomes and confirms, sends ``frames`` ``pause`` seconds apart,
    then ``last`` (as the channel's message), or nothing more when None."""

    async def cable(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=("actioncable-v1-json",))
        await ws.prepare(request)
        await ws.send_json({"type": "welcome"})
        identifier = json.loads((await ws.receive()).data)["identifier"]
        await ws.send_json({"type": "confirm_subscription", "identifier": identifier})
        for frame in frames:
            await asyncio.sleep(pause)
            await ws.send_json(frame)
        if last is not None:
            await ws.send_json({"identifier": identifier, "message": last})
        await ws.receive()  # until the client goes
        return ws

    return cable


async def test_a_cable_silent_past_its_bound_is_dropped_and_the_status_endpoint_asked(
    scripted: ScriptedServer, scripted_settings: ServiceSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kiosk_agent.service import cable

    monkeypatch.setattr(cable, "STALE_AFTER", 0.3)
    scripted.script("POST", START, ACCEPTED)
    scripted.script("POST", "/api/ws-token", json_reply({"token": "wst", "expires_at": 1}))
    scripted.script("GET", "/cable", cable_then([], 0.0, None))
    scripted.script("GET", STATUS, json_reply(CHARGED))
    async with ServiceClient(scripted_settings) as svc:
        handle = await svc.terminal.charge_card("SIM-0001", 100)
        started = asyncio.get_running_loop().time()
        interaction = await handle.wait(timeout=10)
        waited = asyncio.get_running_loop().time() - started
    assert interaction.status is InteractionStatus.SUCCEEDED
    assert (handle.socket_failures, handle.via) == (1, "polling")
    assert 0.3 <= waited < 5.0  # the bound, then one GET (a loaded machine takes its time)


async def test_frames_keep_the_cable_open_without_a_timer_each(
    scripted: ScriptedServer, scripted_settings: ServiceSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: each frame was read inside a timeout of its own (a timer armed and cancelled per
    frame, two a sale). Now the socket's silence has one bound, whatever the frames."""
    from kiosk_agent.service import cable

    monkeypatch.setattr(cable, "STALE_AFTER", 7.5)  # told apart from every other bound here
    scripted.script("POST", START, ACCEPTED)
    scripted.script("POST", "/api/ws-token", json_reply({"token": "wst", "expires_at": 1}))
    pings = [{"type": "ping", "message": n} for n in range(8)]
    scripted.script("GET", "/cable", cable_then(pings, 0.01, CHARGED))
    bounds: list[float | None] = []
    timeout = asyncio.timeout

    def counted(delay: float | None) -> asyncio.Timeout:
        bounds.append(delay)
        return timeout(delay)

    async with ServiceClient(scripted_settings) as svc:
        handle = await svc.terminal.charge_card("SIM-0001", 100)
        monkeypatch.setattr(asyncio, "timeout", counted)
        interaction = await handle.wait(timeout=10)
        monkeypatch.setattr(asyncio, "timeout", timeout)
    assert interaction.status is InteractionStatus.SUCCEEDED
    assert (handle.socket_failures, handle.via) == (0, "websocket")
    assert bounds.count(7.5) <= 1  # the welcome's wait only


async def test_the_silence_bound_moves_on_with_each_frame_and_ends_only_its_own_reader() -> None:
    """The one timer, firing before the bound because a frame came since, is set for the rest
    and cancels nothing; past the bound it cancels the reader, and says the cancel was its
    own; a cancel from the reader's owner is not taken for it."""
    from kiosk_agent.service.cable import _Silence

    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    silences: list[_Silence] = []

    async def reader() -> None:
        silences.append(_Silence(60.0))
        ready.set()
        await asyncio.sleep(3600)

    task = asyncio.create_task(reader())
    await ready.wait()
    [silence] = silences
    silence.stop()  # fired by hand here
    silence.heard_at = loop.time() - 59.0  # a frame came 59 s ago: 1 s of the bound left
    silence._check()  # fired early (as its first deadline, set at the start, would)
    await asyncio.sleep(0)
    assert not task.done()  # neither cancelled nor ended
    silence.heard_at = loop.time() - 61.0  # nothing since: past the bound
    silence._check()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert silence.ended_it()
    silence.stop()

    owner_cancelled = asyncio.create_task(reader())
    await asyncio.sleep(0)
    owner_cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await owner_cancelled
    assert not silences[-1].ended_it()
    silences[-1].stop()
