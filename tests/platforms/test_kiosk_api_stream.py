"""Attacks on the kiosk API's event streams as i36-sale changed them (a sale's steps written at
once from the listener while its app is silent, else through the stream's bounded queue; one
handler coroutine; the slot and the subscription as small classes): order, gaps, a vanished or
slow reader, two readers of one sale, and an error inside the stream's loop."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiosk_agent.bus import Subscription
from kiosk_agent.platforms.kiosk_api import event_json, event_text
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.models import TransStatus
from tests.assembly.test_slow_service import ledger

from ..helpers import ErrorLog, until
from .test_kiosk_api import TOKEN, App, _app, _no_stream


@pytest.fixture
async def app(tmp_path: Path, sim_settings: Any) -> AsyncIterator[App]:
    async for a in _app(tmp_path, sim_settings):
        yield a


def _step(app: App, sale_id: str, n: int, state: SaleState = SaleState.CHARGING) -> SaleEvent:
    """A step of a sale of this app's, numbered in its message (the order the app must see)."""
    return SaleEvent(sale_id=sale_id, order_id="o-1", source=app.api.name, state=state,
                     amount_cents=250, message=f"n{n}")  # fmt: skip


def _server_socket(app: App) -> socket.socket:
    [ws] = app.api._sockets
    transport = ws._req.transport  # type: ignore[union-attr]
    sock: socket.socket = transport.get_extra_info("socket")
    return sock


async def _read_all(ws: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    frames = []
    async for message in ws:
        frames.append(message.json())
    return frames


def _numbers_and_losses(frames: list[dict[str, Any]]) -> tuple[list[int], int]:
    numbers = [int(f["message"][1:]) for f in frames if "gap" not in f]
    return numbers, sum(f["missed"] for f in frames if "gap" in f)


async def _read_to_the_end(ws: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    """The app-wide stream's frames up to a sale's end (that stream lives on after it)."""
    frames = [await ws.receive_json()]
    while not frames[-1].get("final"):
        frames.append(await ws.receive_json())
    return frames


@pytest.mark.parametrize(("seed", "route"), [(1, "sale"), (2, "sale"), (3, "app-wide")])
async def test_a_slow_reader_sees_every_step_in_order_or_a_gap_saying_how_many_it_lost(
    app: App, seed: int, route: str
) -> None:
    """A reader that stops reading and reads again: its stream switches between writing a step at
    once (the socket took every byte) and queuing it (bytes wait; a bound of 256, the oldest
    dropped). Whatever the switches, the app reads the steps in their order, and each hole is a
    gap frame counting exactly what it lost: seen + missed = published. The app-wide stream
    (always queued, its handler now the same coroutine) the same."""
    rng = random.Random(seed)
    sale_id = f"attack-{seed}"
    app.api._follow(_step(app, sale_id, 0))  # a sale's own stream joins with it; not the other
    published = 1
    first = 0 if route == "sale" else 1  # the first step this stream can show
    url = (f"{app.base}/sales/{sale_id}/events?token={TOKEN}" if route == "sale"
           else f"{app.base}/events?token={TOKEN}")  # fmt: skip
    async with app.session.ws_connect(url) as ws:
        await until(lambda: bool(app.api._sockets))
        server = _server_socket(app)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        client = ws._conn.transport  # type: ignore[union-attr]
        client.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader = asyncio.create_task(_read_all(ws) if route == "sale" else _read_to_the_end(ws))
        for _ in range(12):
            client.pause_reading()  # the app stops reading: the agent's socket fills
            for _ in range(rng.choice([1, 5, 60, 1200])):
                app.api._follow(_step(app, sale_id, published))
                published += 1
                if rng.random() < 0.02:
                    await asyncio.sleep(0)  # the handler sends some of what is queued
            client.resume_reading()
            for _ in range(rng.choice([0, 1, 3, 30])):
                await asyncio.sleep(0)
        app.api._follow(_step(app, sale_id, published, SaleState.COMPLETED))
        published += 1
        frames = await asyncio.wait_for(reader, 20)
    numbers, missed = _numbers_and_losses(frames)
    assert numbers == sorted(numbers), "a step overtook an earlier one"
    assert len(set(numbers)) == len(numbers), "a step was sent twice"
    assert numbers[-1] == published - 1
    assert frames[-1]["final"]
    assert missed > 0, "the attack never filled the stream's queue"
    assert numbers[0] >= first
    assert len(numbers) + missed == published - first
    await until(functools.partial(_no_stream_nor_slot, app))


async def test_two_readers_of_one_sale_one_gone_without_a_word_the_other_gets_every_step(
    app: App,
) -> None:
    """Two streams of one sale: one app's connection is cut while it is silent (its steps were
    being written at once); the other reads every step, in order, and both streams end."""
    sale_id = "attack-two"
    app.api._follow(_step(app, sale_id, 0))
    async with app.sale_stream(sale_id) as kept, app.sale_stream(sale_id) as lost:
        await until(lambda: len(app.api._sockets) == 2)
        reader = asyncio.create_task(_read_all(kept))
        for n in range(1, 20):
            if n == 7:
                lost._conn.transport.abort()  # type: ignore[union-attr]
            app.api._follow(_step(app, sale_id, n))
            await asyncio.sleep(0)
        app.api._follow(_step(app, sale_id, 20, SaleState.COMPLETED))
        frames = await asyncio.wait_for(reader, 10)
    assert [int(f["message"][1:]) for f in frames] == list(range(21))
    await until(functools.partial(_no_stream_nor_slot, app))
    assert sale_id not in app.api._frames._keyed


@pytest.mark.parametrize("route", ["sale", "app-wide"])
async def test_an_error_inside_a_streams_loop_gives_its_slot_and_subscription_back(
    app: App, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """The slot and the subscription are small classes now, not generator context managers: a
    stream whose loop raises still gives both back, and the next stream is served."""
    sale_id = "attack-error"
    app.api._follow(_step(app, sale_id, 0))
    before = app.api._frames.subscriber_count
    real_next = Subscription.next

    async def failing(queue: Subscription[Any], *until_: Any) -> Any:
        raise RuntimeError("a bug inside the stream's loop")

    monkeypatch.setattr(Subscription, "next", failing)
    url = (f"{app.base}/sales/{sale_id}/events?token={TOKEN}" if route == "sale"
           else f"{app.base}/events?token={TOKEN}")  # fmt: skip
    async with app.session.ws_connect(url) as ws:
        frames = await asyncio.wait_for(_read_all(ws), 10)
    await until(functools.partial(_no_stream_nor_slot, app))
    assert app.api._frames.subscriber_count == before
    assert [f["message"] for f in frames] == (["n0"] if route == "sale" else [])
    monkeypatch.setattr(Subscription, "next", real_next)
    async with app.session.ws_connect(url) as ws:  # served again
        await until(lambda: bool(app.api._sockets))
        app.api._follow(_step(app, sale_id, 1, SaleState.COMPLETED))
        assert (await asyncio.wait_for(ws.receive_json(), 10))["message"] in {"n0", "n1"}
    await until(functools.partial(_no_stream_nor_slot, app))


def _no_stream_nor_slot(app: App) -> bool:
    return _no_stream(app) and app.api._site.streams == 0  # the slot is given back after close


_texts = st.text(max_size=30)


@given(
    state=st.sampled_from(SaleState), cents=st.integers(1, 10**9), captured=st.integers(0, 10**9),
    product=st.one_of(st.none(), _texts), terminal=st.one_of(st.none(), _texts),
    message=_texts, at=st.floats(allow_nan=True, allow_infinity=True),
    sale_id=_texts, order_id=_texts,
)  # fmt: skip
@settings(max_examples=150, deadline=None)
def test_a_frames_text_is_main_s_json_dumps_of_the_step(
    state: SaleState, cents: int, captured: int, product: str | None, terminal: str | None,
    message: str, at: float, sale_id: str, order_id: str,
) -> None:
    """event_text now joins the C encoder's chunks itself; main's made them with json.dumps's
    defaults: the same text for any step, NaN, escapes and non-ASCII among them."""
    event = SaleEvent(sale_id=sale_id, order_id=order_id, source="kiosk_api:screen", state=state,
                      amount_cents=cents, captured_cents=captured, product=product,
                      terminal=terminal, message=message, at=at)  # fmt: skip
    assert event_text(event) == json.dumps(event_json(event))


async def test_a_capture_waiting_for_another_customer_keeps_its_sales_stream_until_it_is_sent(
    tmp_path: Path, sim_settings: Any
) -> None:
    """i36-defer meets i36-sale: a kiosk API sale's capture waits while another customer of this
    agent waits for their machine's answer. Its own stream (written at once, the app silent)
    stays open through the wait, then gets the capture's end in order, and closes; the app-wide
    stream hears the same end; one capture at the service."""
    async for app in _app(tmp_path, sim_settings, confirm_dispense=True, flow="authorize_capture"):
        customers = app.api.agent.sales.context.customers
        _, started = await app.post("/sales", {"product": "coffee"})
        sale_id = started["sale_id"]
        async with (
            app.session.ws_connect(f"{app.base}/events?token={TOKEN}") as everything,
            app.sale_stream(sale_id) as own,
        ):
            seen: list[dict[str, Any]] = []
            while not seen or seen[-1]["state"] != "dispensing":
                seen.append(await asyncio.wait_for(own.receive_json(), 10))
            customers.waits("another machine's customer")
            status, _ = await app.post(f"/sales/{sale_id}/dispensed", {"status": "vended"})
            assert status == 202
            seen.append(await asyncio.wait_for(own.receive_json(), 10))
            assert seen[-1]["state"] == "capturing"
            for _ in range(20):
                await asyncio.sleep(0)
            assert not app.api._latest[sale_id].state.final  # the capture waits
            assert len(app.api._sockets) == 2  # its stream with it
            customers.answered("another machine's customer")
            seen.extend(await asyncio.wait_for(_read_all(own), 10))
            everything_seen = [await asyncio.wait_for(everything.receive_json(), 10)]
            while not everything_seen[-1]["final"]:
                everything_seen.append(await asyncio.wait_for(everything.receive_json(), 10))
        assert [f["state"] for f in seen][-2:] == ["capturing", "completed"]
        assert not any("gap" in f for f in seen)
        assert seen[-1]["captured_cents"] == 250
        assert everything_seen[-1] == seen[-1]
        await until(functools.partial(_no_stream_nor_slot, app))
        [charged] = await ledger(app.api.agent, started["order_id"])
        assert charged.status is TransStatus.CAPTURED


async def test_the_agent_stopping_under_a_silent_apps_sale_stream_closes_it_and_stops(
    tmp_path: Path, sim_settings: Any
) -> None:
    """A sale waits for a card, its app silent on its stream (steps written at once): the agent
    stops. The stream closes after the sale's end (the stop cancels an unpaid sale) or with 1001,
    nothing after an end; the stop does not hang on it, and nothing is logged as an error."""
    errors = ErrorLog()
    try:
        async with aiohttp.ClientSession() as own_session:  # not closed by the agent's stop
            running = _app(tmp_path, sim_settings)
            app = App((await anext(running)).api, own_session)
            _, started = await app.post("/sales", {"amount": 305, "flow": "authorize_capture"})
            ws = await app.sale_stream(started["sale_id"])
            reader = asyncio.create_task(_read_all(ws))
            await until(lambda: bool(app.api._sockets))
            await asyncio.wait_for(running.aclose(), 30)
            frames = await asyncio.wait_for(reader, 10)
    finally:
        errors.close()
    assert frames, "not even the step it joined at"
    # its end first (the stop cancels an unpaid sale), then a normal close; else the 1001
    assert ws.close_code == (1000 if frames[-1]["final"] else 1001), (ws.close_code, frames)
    assert frames[-1]["state"] in ("cancelled", "reading_card", "started")
    assert all(not f["final"] for f in frames[:-1])
    assert errors.records == []


async def test_a_bad_websocket_handshake_gives_its_stream_slot_back(app: App) -> None:
    """The slot is taken before the 101 (a small class now, not a generator context manager): a
    handshake aiohttp refuses raises inside it; the slot is given back, and the API serves on."""
    sale_id = "attack-handshake"
    app.api._follow(_step(app, sale_id, 0))
    headers = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13"}
    for _ in range(3):  # no Sec-WebSocket-Key: refused
        async with app.session.get(
            f"{app.base}/sales/{sale_id}/events?token={TOKEN}", headers=headers
        ) as response:
            assert response.status == 400
    assert app.api._site.streams == 0
    assert not app.api._sockets
    app.api._follow(_step(app, sale_id, 1, SaleState.COMPLETED))
    status, latest = await app.get(f"/sales/{sale_id}")
    assert status == 200
    assert latest["state"] == "completed"
