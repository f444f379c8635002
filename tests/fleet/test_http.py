"""The HTTP heartbeat against a real aiohttp receiver."""

import asyncio
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from kiosk_agent.fleet import http
from kiosk_agent.fleet.component import Upstream

from ..helpers import until
from ..mqtt_broker import Observer, mosquitto
from .helpers import HttpReceiver, settled_agent

__all__ = ["mosquitto"]  # the broker fixture, imported for the tests below


@pytest.fixture
async def receiver() -> AsyncIterator[HttpReceiver]:
    receiver = HttpReceiver()
    await receiver.up()
    yield receiver
    await receiver.down()


async def test_http_heartbeat_queues_while_down_and_catches_up(receiver: HttpReceiver) -> None:
    conf = {
        "device_id": "unit-7",
        "interval": 3600,
        "queue_size": 2,
        "http": {"url": f"http://127.0.0.1:{receiver.port}/heartbeat", "token": "s3cr3t"},
    }
    upstream = Upstream(settled_agent(), conf)
    await upstream.start()  # the first heartbeat goes out at once
    try:
        await until(lambda: len(receiver.bodies) == 1)
        assert receiver.auth == ["Bearer s3cr3t"]
        assert receiver.bodies[0]["device_id"] == "unit-7"

        await receiver.down()
        missed = [upstream.heartbeat() for _ in range(3)]
        sink = upstream.sinks[0]
        await until(lambda: sink.failures >= 1)
        assert upstream.stats()["http"]["dropped"] == 1

        await receiver.up()
        latest = upstream.heartbeat()  # the next heartbeat flushes what was kept
        await until(lambda: len(receiver.bodies) == 3)
        # the queue holds two: the oldest ones gave way; the rest arrive in order
        kept = [*missed, latest][-2:]
        assert [b["at"] for b in receiver.bodies[1:]] == [r["at"] for r in kept]
        # the receiver keeps a body before it answers; the sink drops it once answered
        await until(lambda: upstream.stats()["http"]["queued"] == 0)
    finally:
        await upstream.stop()


async def test_http_error_answers_keep_the_report_queued(receiver: HttpReceiver) -> None:
    url = f"http://127.0.0.1:{receiver.port}/heartbeat"
    receiver.failing = True
    upstream = Upstream(settled_agent(), {"interval": 3600, "http": {"url": url}})
    await upstream.start()
    try:
        sink = upstream.sinks[0]
        await until(lambda: sink.failures == 1)
        assert sink.last_error == f"HTTP 503 from {url}"
        assert upstream.stats()["http"]["queued"] == 1
        receiver.failing = False
        upstream.heartbeat()
        await until(lambda: len(receiver.bodies) == 2)
        await until(lambda: upstream.stats()["http"]["queued"] == 0)  # once the 200 is heard
    finally:
        await upstream.stop()


async def test_an_allowed_heartbeat_in_clear_is_warned_at_start_and_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the receiver on every address, reached by this machine's name (not a loopback literal)
    receiver = HttpReceiver(host="0.0.0.0")  # noqa: S104 - the test's own receiver
    await receiver.up()
    url = f"http://{socket.gethostname()}:{receiver.port}/heartbeat"
    http = {"url": url, "token": "fleet-token-0123456789", "allow_insecure_http": True}
    upstream = Upstream(settled_agent(), {"interval": 3600, "http": http})
    try:
        with caplog.at_level("WARNING", logger="kiosk_agent.fleet.component"):
            await upstream.start()
        await until(lambda: len(receiver.bodies) == 1)
        assert receiver.auth == ["Bearer fleet-token-0123456789"]
        [warning] = [r.getMessage() for r in caplog.records if "in clear" in r.getMessage()]
        assert f"{url} is plain http to another host (allow_insecure_http)" in warning
        assert "fleet-token" not in caplog.text
    finally:
        await upstream.stop()
        await receiver.down()


async def test_a_redirect_is_not_followed_and_counts_as_a_failed_delivery(
    receiver: HttpReceiver,
) -> None:
    """aiohttp followed a redirect to another host (the token stripped, the report sent). Where
    it pointed is shown without its query (a session or a token may ride there)."""
    elsewhere = HttpReceiver()
    await elsewhere.up()
    target = f"http://127.0.0.1:{elsewhere.port}/heartbeat"
    receiver.redirect_to = f"{target}?session=s3ss10n"
    url = f"http://127.0.0.1:{receiver.port}/heartbeat"
    upstream = Upstream(settled_agent(), {"interval": 3600, "http": {"url": url, "token": "t0k"}})
    await upstream.start()
    try:
        sink = upstream.sinks[0]
        await until(lambda: sink.failures == 1)
        assert sink.last_error == (
            f"HTTP 307 from {url}: a redirect to {target}, not followed"
        )
        assert elsewhere.bodies == []
        assert upstream.stats()["http"]["queued"] == 1  # kept for the configured URL
    finally:
        await upstream.stop()
        await elsewhere.down()


@pytest.mark.mqtt
async def test_a_clean_stop_tells_both_sinks_it_stopped_before_it_returns(
    receiver: HttpReceiver, mosquitto: int
) -> None:
    """Before, the HTTP sink's loop was cancelled with the stop's last report still queued: the
    fleet server's last word of a unit stopped on purpose was its last heartbeat (`ok`), as
    for a unit that died. Both sinks now have it once `stop()` returns."""
    device_id = f"unit-{uuid.uuid4().hex[:6]}"
    agent = settled_agent()
    agent.sales = SimpleNamespace(stopping=False)
    conf = {"device_id": device_id, "interval": 3600,
            "http": {"url": f"http://127.0.0.1:{receiver.port}/heartbeat"},
            "mqtt": {"host": "127.0.0.1", "port": mosquitto, "discovery_prefix": False}}
    upstream = Upstream(agent, conf)
    observer = Observer(mosquitto)
    await observer.start(f"kiosk-agent/{device_id}/state")
    await upstream.start()
    try:
        await until(lambda: len(receiver.bodies) == 1 and upstream.mqtt is not None
                    and upstream.mqtt.online)
        agent.sales.stopping = True
    finally:
        await upstream.stop()
    assert [body["status"] for body in receiver.bodies] == ["ok", "stopped"]
    await until(lambda: len(observer.on(f"kiosk-agent/{device_id}/state")) == 2)
    await observer.stop()
    assert json.loads(observer.on(f"kiosk-agent/{device_id}/state")[1])["status"] == "stopped"


async def test_a_fleet_server_that_does_not_answer_holds_the_stop_no_longer_than_the_goodbye(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that takes the connection and never answers: the stop waits for its last
    report no longer than GOODBYE_TIMEOUT (here 0.2 s), says it was not delivered, and returns."""
    monkeypatch.setattr(http, "GOODBYE_TIMEOUT", 0.2)
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # kept open, never answered

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conf = {"interval": 3600, "http": {"url": f"http://127.0.0.1:{port}/heartbeat"}}
    upstream = Upstream(settled_agent(), conf)
    await upstream.start()
    try:
        await until(lambda: len(accepted) == 1)  # the first report, unanswered
        started = time.monotonic()
    finally:
        await upstream.stop()
        server.close()
        for writer in accepted:
            writer.close()
    assert time.monotonic() - started < 5.0  # the goodbye's bound, not the POST's 10 s
    sink = upstream.sinks[0]
    assert len(sink.queue) == 2  # the last heartbeat and the stop's report, kept for no one
    assert "upstream http: 2 report(s) not delivered at the stop, the last one saying it " \
           f"stopped: no answer from http://127.0.0.1:{port}/heartbeat within 0.2 s" in caplog.text
