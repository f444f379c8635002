"""Webhook delivery to a real aiohttp receiver: signatures, retries, give-up, order, chaos."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kiosk_agent.sim.server import SimServer
from kiosk_agent.sim.webhooks import (
    IDEMPOTENCY_HEADER,
    MAX_ATTEMPTS,
    SIGNATURE_HEADER,
    WebhookDispatcher,
    dispatcher_for,
    sign,
    signature_matches,
)

from ..helpers import free_port, until
from .sim_api import Api
from .test_oauth import oauth_api

MERCHANTS = "/ords/sprint/api/3p/boarding/v1/merchants"
SECRET = "whsec_test_only"


@dataclass
class Delivery:
    envelope: dict[str, Any]
    signature_ok: bool
    idempotency_header: str | None
    at: float


@dataclass
class Receiver:
    """A webhook endpoint that answers each attempt as ``answer(envelope)`` says."""

    url: str = ""
    answer: Callable[[dict[str, Any]], int] = lambda envelope: 200
    answers: asyncio.Event | None = None  # when given, each answer waits until it is set
    deliveries: list[Delivery] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        envelope = json.loads(raw)
        self.deliveries.append(
            Delivery(
                envelope,
                signature_matches(raw, SECRET, request.headers.get(SIGNATURE_HEADER)),
                request.headers.get(IDEMPOTENCY_HEADER),
                time.monotonic(),
            )
        )
        if self.answers is not None:
            await self.answers.wait()
        return web.Response(status=self.answer(envelope))

    def ok(self) -> list[Delivery]:
        return [d for d in self.deliveries if d.signature_ok]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    found = Receiver()
    app = web.Application()
    app.router.add_post("/hooks", found.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    found.url = f"http://127.0.0.1:{port}/hooks"
    yield found
    await runner.cleanup()


async def start_sim(sim_factory, receiver: Receiver, **options: Any) -> SimServer:
    options.setdefault("time_scale", 1000)
    return await sim_factory(
        webhook_url=receiver.url, webhook_secret=SECRET, transactions=10, **options
    )


async def create(boarding: Api, name: str = "Corner Snacks") -> int:
    status, merchant = await boarding.post(MERCHANTS, {"dba_name": name})
    assert status == 201
    return int(merchant["merchant_id"])


def webhooks_of(sim: SimServer) -> WebhookDispatcher:
    assert sim.ctx is not None
    return dispatcher_for(sim.ctx)


async def sim_events(boarding: Api) -> list[dict[str, Any]]:
    status, body = await boarding.get("/sim/events")
    assert status == 200
    return list(body["items"])


def test_signature_is_hmac_sha256_of_the_raw_body() -> None:
    body = b'{"event_type":"merchant.new"}'
    expected = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()

    assert sign(body, SECRET) == f"sha256={expected}"
    assert signature_matches(body, SECRET, f"sha256={expected}")
    assert not signature_matches(body + b" ", SECRET, f"sha256={expected}")
    assert not signature_matches(body, "other", f"sha256={expected}")
    assert not signature_matches(body, SECRET, None)


async def test_failed_attempts_are_retried_with_the_same_ids_and_backoff(
    receiver: Receiver, sim_factory, http: aiohttp.ClientSession
) -> None:
    receiver.answer = lambda envelope: 500 if envelope["metadata"]["attempt"] < 3 else 204
    sim = await start_sim(sim_factory, receiver)
    boarding = await oauth_api(http, sim)

    await create(boarding)
    await until(lambda: len(receiver.deliveries) == 3)

    attempts = receiver.deliveries
    assert all(d.signature_ok for d in attempts)
    assert [d.envelope["metadata"]["attempt"] for d in attempts] == [1, 2, 3]
    assert len({d.envelope["metadata"]["webhook_id"] for d in attempts}) == 1
    keys = {d.envelope["metadata"]["idempotency_key"] for d in attempts}
    assert keys == {d.idempotency_header for d in attempts}
    assert len(keys) == 1
    # 5 then 10 simulated seconds at time scale 1000.
    assert attempts[1].at - attempts[0].at >= 0.005
    assert attempts[2].at - attempts[1].at >= 0.010
    (item,) = await sim_events(boarding)
    assert (item["delivered"], item["attempts"], item["last_status"]) == (True, 3, 204)


async def test_delivery_gives_up_after_eight_attempts(
    receiver: Receiver, sim_factory, http: aiohttp.ClientSession
) -> None:
    receiver.answer = lambda envelope: 503
    sim = await start_sim(sim_factory, receiver, time_scale=20_000)
    boarding = await oauth_api(http, sim)

    await create(boarding)
    await until(lambda: len(receiver.deliveries) == MAX_ATTEMPTS)
    await asyncio.sleep(0.1)  # the whole backoff would fit several times over

    assert [d.envelope["metadata"]["attempt"] for d in receiver.deliveries] == list(range(1, 9))
    (item,) = await sim_events(boarding)
    assert (item["delivered"], item["attempts"]) == (False, 8)
    assert item["last_error"] == "HTTP 503"


async def test_events_arrive_in_order_without_chaos_and_never_block_the_api(
    receiver: Receiver, sim_factory, http: aiohttp.ClientSession
) -> None:
    receiver.answers = asyncio.Event()  # a receiver that answers nothing yet
    sim = await start_sim(sim_factory, receiver)
    boarding = await oauth_api(http, sim)

    async with asyncio.timeout(10):  # the API answers while the first delivery hangs
        ids = [await create(boarding, f"Shop {n}") for n in range(4)]
    await until(lambda: len(receiver.deliveries) == 1)
    receiver.answers.set()

    await until(lambda: len(receiver.deliveries) == 4)
    assert [int(d.envelope["source_id"]) for d in receiver.deliveries] == ids


async def test_events_made_while_held_go_out_together_when_released(
    receiver: Receiver, sim_factory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(sim_factory, receiver)
    boarding = await oauth_api(http, sim)
    dispatcher = webhooks_of(sim)

    with dispatcher.held():
        ids = [await create(boarding, f"Shop {n}") for n in range(3)]
        await asyncio.sleep(0.05)  # 50 simulated seconds: time enough to deliver, were it free
        assert receiver.deliveries == []
        assert dispatcher.busy
    await until(lambda: len(receiver.deliveries) == 3)
    await until(lambda: not dispatcher.busy)

    assert [int(d.envelope["source_id"]) for d in receiver.deliveries] == ids
    assert all(item["delivered"] for item in await sim_events(boarding))


async def test_chaos_duplicates_and_reorders(
    receiver: Receiver, sim_factory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(sim_factory, receiver, time_scale=50, chaos=True)
    boarding = await oauth_api(http, sim)
    dispatcher = webhooks_of(sim)

    # one burst, however slow the machine: chaos delays are at most 2 simulated seconds (40 ms
    # here), and events made further apart than that are never swapped
    with dispatcher.held():
        ids = [await create(boarding, f"Shop {n}") for n in range(15)]
    await until(lambda: len({d.idempotency_header for d in receiver.deliveries}) == 15)
    await until(lambda: not dispatcher.busy)  # duplicates may trail the first deliveries

    assert len(receiver.ok()) == len(receiver.deliveries)
    seen = Counter(d.idempotency_header for d in receiver.deliveries)
    assert max(seen.values()) >= 2  # duplicates: the same key more than once
    first_seen = list(dict.fromkeys(int(d.envelope["source_id"]) for d in receiver.deliveries))
    assert sorted(first_seen) == ids
    assert first_seen != ids  # reordered
    items = await sim_events(boarding)
    assert all(item["delivered"] for item in items)


async def test_an_unreachable_receiver_is_retried_and_the_simulator_keeps_serving(
    sim_factory, http: aiohttp.ClientSession
) -> None:
    nothing_listens = f"http://127.0.0.1:{free_port()}/hooks"
    sim = await sim_factory(webhook_url=nothing_listens, time_scale=1000, transactions=10)
    boarding = await oauth_api(http, sim)

    await create(boarding)
    async with asyncio.timeout(10):  # a busy machine gets room
        while (item := (await sim_events(boarding))[0])["attempts"] < 2:
            await asyncio.sleep(0.01)

    assert item["delivered"] is False
    assert item["attempts"] >= 2
    assert "Connect" in item["last_error"]
    assert (await boarding.get(MERCHANTS))[0] == 200


async def test_a_restart_on_the_data_dir_resumes_unfinished_deliveries(
    receiver: Receiver, sim_factory, http: aiohttp.ClientSession, tmp_path
) -> None:
    receiver.answer = lambda envelope: 500
    # The first simulator's retry would wait 5 simulated seconds: 500 s real at time scale
    # 0.01, so it is stopped before any (at 50 its retry came 0.1 s after the first attempt,
    # before a starved test stopped it: the second made attempt 3). The second's, at 50, waits
    # 0.1 s on its own clock.
    first = await start_sim(sim_factory, receiver, time_scale=0.01, data_dir=tmp_path)
    merchant_id = await create(await oauth_api(http, first))
    await until(lambda: len(receiver.deliveries) == 1)
    await first.stop()

    receiver.answer = lambda envelope: 200
    second = await start_sim(sim_factory, receiver, time_scale=50, data_dir=tmp_path)
    await until(lambda: len(receiver.deliveries) == 2)

    resumed = receiver.deliveries[1].envelope
    assert resumed["source_id"] == str(merchant_id)
    assert resumed["metadata"]["attempt"] == 2
    assert resumed["metadata"] == {**receiver.deliveries[0].envelope["metadata"], "attempt": 2}
    boarding = await oauth_api(http, second)
    async with asyncio.timeout(10):  # the receiver logs a delivery just before it answers
        while not (item := (await sim_events(boarding))[0])["delivered"]:
            await asyncio.sleep(0.01)
    assert (item["delivered"], item["attempts"]) == (True, 2)
    assert (await boarding.get(f"{MERCHANTS}/{merchant_id}"))[0] == 200
