"""The HTTP heartbeat against a real aiohttp receiver."""

import socket
from collections.abc import AsyncIterator

import pytest

from kiosk_agent.fleet.component import Upstream

from ..helpers import until
from .helpers import HttpReceiver, settled_agent


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
