"""The boarding webhook receiver over real HTTP with its SQLite store on disk."""

import asyncio
import contextlib
import json
import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiosk_agent.admin.webhooks import SqliteIdempotencyStore, WebhookReceiver
from kiosk_agent.cli import build_parser
from kiosk_agent.health.model import Health, Status
from kiosk_agent.logs import refusal_counts
from kiosk_agent.service.webhooks import MemoryIdempotencyStore, parse_event, sign

SECRET = "whsec_test_secret"


def envelope(
    key: str,
    *,
    merchant_id: int = 42,
    status_id: int = 2,
    event_type: str = "merchant.sent_for_signature",
    at: str = "2026-11-22T10:00:00.000Z",
    reason: str = "sent_for_signature",
    mid: str | None = None,
) -> dict[str, Any]:
    return {
        "event_type": event_type,
        "source_id": str(merchant_id),
        "timestamp": at,
        "payload": {
            "merchant_id": merchant_id,
            "mid": mid,
            "rep_code_id": 7,
            "customer_id": 9,
            "dba_name": "Corner Snacks",
            "merchant_status_id": status_id,
            "external_crm_id": None,
            "custom_01": None,
            "trigger": "system",
            "reason": reason,
            "timestamp": at.replace("Z", "+00:00"),
        },
        "metadata": {"webhook_id": f"wh-{key}", "attempt": 1, "idempotency_key": key},
    }


def signed(body: dict[str, Any] | bytes, secret: str = SECRET) -> tuple[bytes, dict[str, str]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"X-Webhook-Signature-256": sign(raw, secret), "Content-Type": "application/json"}
    if isinstance(body, dict):
        headers["X-Idempotency-Key"] = body["metadata"]["idempotency_key"]
    return raw, headers


class Harness:
    def __init__(self, store: Path) -> None:
        self.store = store
        self.receiver: WebhookReceiver | None = None
        self.session = aiohttp.ClientSession()
        self.health = Health("test")
        self.http: dict[str, Any] = {}

    async def start(self, **conf: Any) -> WebhookReceiver:
        agent = SimpleNamespace(health=self.health, config={"http": self.http})
        conf = {"secret": SECRET, "port": 0, "store": str(self.store), **conf}
        self.receiver = WebhookReceiver(agent, conf)
        await self.receiver.start()
        return self.receiver

    async def restart(self) -> WebhookReceiver:
        assert self.receiver is not None
        await self.receiver.stop()
        return await self.start()

    async def post(self, raw: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        assert self.receiver is not None
        async with self.session.post(self.receiver.url, data=raw, headers=headers) as response:
            return response.status, await response.json()

    async def deliver(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return await self.post(*signed(body))

    async def close(self) -> None:
        if self.receiver is not None:
            await self.receiver.stop()
        await self.session.close()


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(tmp_path / "webhooks.db")
    yield harness
    await harness.close()


async def test_an_event_is_accepted_and_sets_the_merchant_state(harness: Harness) -> None:
    receiver = await harness.start()
    assert await harness.deliver(envelope("k1")) == (200, {"status": "accepted"})
    [merchant] = receiver.merchants()
    assert merchant["merchant_id"] == 42
    assert merchant["status"] == "sent_for_signature"
    assert merchant["dba_name"] == "Corner Snacks"
    assert len(receiver.store) == 1
    assert oct(harness.store.stat().st_mode & 0o777) == "0o600"


async def test_duplicates_are_answered_2xx_and_applied_once(harness: Harness) -> None:
    receiver = await harness.start()
    first = envelope("k1", status_id=3, event_type="merchant.signed", reason="signed")
    assert (await harness.deliver(first))[1] == {"status": "accepted"}
    retry = {**first, "metadata": {**first["metadata"], "attempt": 2}}
    assert await harness.deliver(retry) == (200, {"status": "duplicate"})
    assert len(receiver.store) == 1
    assert receiver.outcomes == {"accepted": 1, "duplicate": 1}


async def test_reordered_events_keep_the_latest_state(harness: Harness) -> None:
    receiver = await harness.start()
    boarded = envelope(
        "k-boarded",
        status_id=5,
        event_type="merchant.boarded",
        reason="boarded",
        at="2026-11-22T12:00:00.000Z",
        mid="999000000042",
    )
    sent = envelope("k-sent", status_id=2, at="2026-11-22T10:00:00.000Z")
    assert (await harness.deliver(boarded))[0] == 200
    assert (await harness.deliver(sent))[0] == 200  # older, arrives late: stored, not applied
    [merchant] = receiver.merchants()
    assert (merchant["status"], merchant["mid"]) == ("boarded", "999000000042")
    assert len(receiver.store) == 2


async def test_forged_deliveries_are_refused_and_not_stored(harness: Harness) -> None:
    receiver = await harness.start()
    raw, headers = signed(envelope("k1"), secret="not-the-secret")
    status, answer = await harness.post(raw, headers)
    assert (status, answer["error"]) == (401, "invalid_signature")
    assert "does not match" in answer["detail"]
    raw, headers = signed(envelope("k2"))
    tampered = raw.replace(b"Corner Snacks", b"Evil Snacks!!")
    assert (await harness.post(tampered, headers))[0] == 401
    del headers["X-Webhook-Signature-256"]
    status, answer = await harness.post(raw, headers)
    assert status == 401
    assert "missing" in answer["detail"]
    assert len(receiver.store) == 0
    assert receiver.merchants() == []


async def test_malformed_deliveries_are_refused_naming_the_field(harness: Harness) -> None:
    receiver = await harness.start()
    status, answer = await harness.post(*signed(b"{not json"))
    assert (status, answer["error"], answer["field"]) == (400, "malformed", "<body>")
    broken = envelope("k1")
    del broken["metadata"]["webhook_id"]
    status, answer = await harness.post(*signed(broken))
    assert status == 400
    assert answer["field"] == "metadata.webhook_id"
    no_status = envelope("k2")
    del no_status["payload"]["merchant_status_id"]
    status, answer = await harness.post(*signed(no_status))
    assert (status, answer["field"]) == (400, "payload.merchant_status_id")
    assert len(receiver.store) == 0


async def test_oversized_deliveries_are_refused(harness: Harness) -> None:
    receiver = await harness.start(max_body=2048)
    big = envelope("k1")
    big["payload"]["custom_01"] = "x" * 4096
    status, answer = await harness.post(*signed(big))
    assert (status, answer["error"]) == (413, "too_large")
    assert len(receiver.store) == 0
    assert (await harness.deliver(envelope("k2")))[0] == 200  # still serving


async def test_unknown_reasons_and_event_types_are_acknowledged(harness: Harness) -> None:
    receiver = await harness.start()
    odd = envelope("k1", status_id=4, event_type="merchant.in_underwriting", reason="moon_phase")
    assert (await harness.deliver(odd))[0] == 200
    assert receiver.merchants()[0]["reason"] == "status_changed"
    future = envelope("k2", event_type="payment.settled")
    assert await harness.deliver(future) == (200, {"status": "accepted"})
    assert receiver.merchants()[0]["status"] == "in_underwriting"


async def test_dedupe_and_state_survive_a_restart(harness: Harness) -> None:
    await harness.start()
    live = envelope(
        "k-live",
        status_id=6,
        event_type="merchant.live",
        reason="live",
        at="2026-11-22T13:00:00.000Z",
        mid="999000000042",
    )
    assert (await harness.deliver(live))[1] == {"status": "accepted"}
    receiver = await harness.restart()
    assert receiver.merchants()[0]["status"] == "live"
    assert await harness.deliver(live) == (200, {"status": "duplicate"})
    # an older event delivered after the restart still cannot move the state back
    assert (await harness.deliver(envelope("k-old", at="2026-11-22T09:00:00.000Z")))[0] == 200
    assert receiver.merchants()[0]["status"] == "live"


async def test_concurrent_deliveries_share_commits_and_none_is_lost(harness: Harness) -> None:
    receiver = await harness.start()
    bodies = [envelope(f"k{n}", merchant_id=n) for n in range(120)]
    deliveries = [harness.deliver(b) for b in bodies] + [harness.deliver(b) for b in bodies[:30]]
    answers = await asyncio.gather(*deliveries)
    statuses = [answer["status"] for _, answer in answers]
    assert statuses.count("accepted") == 120
    assert statuses.count("duplicate") == 30
    assert len(receiver.store) == 120
    assert len(receiver.merchants()) == 120
    assert receiver.store.commits < 150  # concurrent deliveries were committed together


async def test_sqlite_store_speaks_the_idempotency_store_protocol(tmp_path: Path) -> None:
    store = SqliteIdempotencyStore(tmp_path / "keys.db")
    store.open()
    try:
        assert await store.add("a") is True
        assert await store.add("a") is False
        await store.discard("a")
        assert await store.add("a") is True
        event = parse_event(json.dumps(envelope("b")).encode())
        assert await store.record("b", event, b"{}") is True
        assert await store.record("b", event, b"{}") is False
    finally:
        await store.close()
    # same answers as the in-memory store
    memory = MemoryIdempotencyStore()
    assert [await memory.add("a"), await memory.add("a")] == [True, False]


async def test_an_event_that_cannot_be_committed_is_not_acknowledged(harness: Harness) -> None:
    receiver = await harness.start()
    # Another process breaks the database under the receiver (a stand-in for a failing disk).
    other = sqlite3.connect(harness.store)
    other.execute("ALTER TABLE webhook_events RENAME TO broken")
    other.commit()
    status, answer = await harness.deliver(envelope("k1"))
    assert (status, answer["error"]) == (503, "unavailable")  # the sender will retry
    assert receiver.merchants() == []
    other.execute("ALTER TABLE broken RENAME TO webhook_events")
    other.commit()
    other.close()
    assert await harness.deliver(envelope("k1")) == (200, {"status": "accepted"})
    assert receiver.outcomes["store_error"] == 1


async def test_the_command_line_shows_the_state_the_receiver_kept(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kiosk-agent boarding merchants --webhooks` reads the store, even while the agent runs."""
    await harness.start()
    boarded = envelope("b", status_id=5, event_type="merchant.boarded", reason="boarded",
                       at="2026-11-22T11:00:00.000Z", mid="998000000042")
    sent = envelope("a")  # older, arriving after: must not win
    for body in (boarded, sent, boarded):
        status, _ = await harness.post(*signed(body))
        assert status == 200
    config = tmp_path / "kiosk.yaml"
    config.write_text(
        "service: {simulator: {}}\n"
        "terminals: [{device_id: SIM-0001}]\n"
        f"journal: {{path: {tmp_path / 'journal.db'}}}\n"
        f"webhooks: {{secret: !secret webhook_secret, store: {harness.store}}}\n"
    )
    secrets = config.with_name("secrets.yaml")
    secrets.write_text(f"webhook_secret: {SECRET}\n")
    secrets.chmod(0o600)

    argv = ["boarding", "merchants", "--webhooks", "--config", str(config), "--format", "json"]
    args = build_parser("boarding").parse_args(argv)
    code = await args.handler(args)

    assert code == 0
    [merchant] = json.loads(capsys.readouterr().out)
    assert merchant["merchant_id"] == 42
    assert merchant["status"] == "boarded"
    assert merchant["mid"] == "998000000042"


# -- attacks ---------------------------------------------------------------------------------


async def test_a_signed_merchant_id_of_2_64_is_refused_and_deliveries_go_on(
    harness: Harness,
) -> None:
    """The attack that killed the writer: one correctly signed event with merchant_id 2**64."""
    receiver = await harness.start()
    status, answer = await harness.deliver(envelope("k-big", merchant_id=2**64))
    assert status == 400
    assert answer["field"] == "payload.merchant_id"
    assert "18446744073709551616" in answer["detail"]
    for n in range(5):
        assert await harness.deliver(envelope(f"k{n}", merchant_id=n)) == (
            200, {"status": "accepted"})
    assert harness.health.snapshot().status is not Status.DOWN
    assert harness.health.alive()
    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(receiver.stop(), 10)  # what SIGTERM runs
    assert asyncio.get_running_loop().time() - started < 2
    harness.receiver = None
    db = sqlite3.connect(harness.store)
    assert db.execute("SELECT count(*) FROM webhook_events").fetchone()[0] == 5
    db.close()


async def test_whatever_the_writer_meets_it_goes_on_and_health_says_why(
    harness: Harness,
) -> None:
    """Past the range check (a future field, a bug): the write fails, the writer does not."""
    receiver = await harness.start()
    poison = parse_event(json.dumps(envelope("k-poison", merchant_id=2**64)).encode())
    with pytest.raises(OverflowError):
        await receiver.store.record("k-poison", poison, b"{}")
    snapshot = harness.health.snapshot()
    assert snapshot.status is Status.DOWN
    assert any("webhook store" in p and "OverflowError" in p for p in snapshot.problems)
    assert not harness.health.alive()  # the watchdog is no longer fed
    # a poisoned write among good ones in one group commit fails alone
    results = await asyncio.gather(
        receiver.store.record("k-poison", poison, b"{}"),
        *(harness.deliver(envelope(f"k{n}", merchant_id=n)) for n in range(20)),
        return_exceptions=True,
    )
    assert isinstance(results[0], OverflowError)
    assert all(r == (200, {"status": "accepted"}) for r in results[1:])
    assert harness.health.snapshot().status is not Status.DOWN  # a good commit cleared it
    assert harness.health.alive()
    assert len(receiver.store) == 20


async def test_close_ends_within_its_grace_while_a_commit_hangs_on_the_disk(
    harness: Harness,
) -> None:
    harness.http = {"shutdown_grace": 0.5}
    receiver = await harness.start()
    assert (await harness.deliver(envelope("k0")))[0] == 200
    other = sqlite3.connect(harness.store, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # the disk "hangs": every commit waits on this lock
    try:
        delivery = asyncio.create_task(harness.deliver(envelope("k1")))
        await asyncio.sleep(0.2)
        assert not delivery.done()
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(receiver.stop(), 10)
        assert asyncio.get_running_loop().time() - started < 2.5
        harness.receiver = None
        with contextlib.suppress(aiohttp.ClientError):
            status, _ = await asyncio.wait_for(delivery, 5)
            assert status == 503  # not committed, not acknowledged: the sender retries
    finally:
        other.execute("ROLLBACK")
        other.close()


HOSTILE = [
    (b'{"event_type": "merchant.new", "payload": {"merchant_id": ' + b"7" * 5000 + b"}}",
     "5000 characters"),
    (b'{"payload": ' + b"[" * 30000 + b"]" * 30000 + b"}", "nests deeper"),
    (b'{"payload": {"merchant_id": 1e999}}', "out of range"),
    (b'{"payload": {"merchant_id": NaN}}', "NaN is not a JSON number"),
]


@pytest.mark.parametrize(("raw", "message"), HOSTILE)
async def test_hostile_signed_bodies_get_a_400_naming_the_fault(
    harness: Harness, raw: bytes, message: str
) -> None:
    receiver = await harness.start()
    status, answer = await harness.post(*signed(raw))
    assert (status, answer["error"]) == (400, "malformed")
    assert message in answer["detail"]
    status, answer = await harness.post(raw, {"Content-Type": "application/json"})
    assert status == 401  # unsigned: refused before it is even parsed
    assert len(receiver.store) == 0
    assert (await harness.deliver(envelope("k1")))[0] == 200


async def test_a_forged_flood_writes_a_few_lines_and_counts_them_all(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = await harness.start()
    raw, headers = signed(envelope("k1"), secret="not-the-secret")
    with caplog.at_level(logging.WARNING, "kiosk_agent.admin.webhooks"):
        answers = await asyncio.gather(*(harness.post(raw, headers) for _ in range(300)))
    assert {status for status, _ in answers} == {401}
    lines = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) <= 6  # the first few; the rest wait for the interval's summary
    assert receiver.outcomes["invalid_signature"] == 300
    assert refusal_counts()[("webhooks", "invalid_signature")] >= 300


# -- any signed envelope: each field generated -----------------------------------------------------

ANY_TEXT = st.text(max_size=20) | st.sampled_from(["\ud800", "a\udfffb", "\x00", "\u202e"])
ANY_VALUE = (st.none() | st.booleans() | st.integers() | ANY_TEXT
             | st.integers(min_value=2**63 - 2, max_value=2**70))
MOMENTS = st.sampled_from([
    "2026-11-22T10:00:00Z", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00",
    "9999-12-31T23:59:59.999999Z", "2026-11-22T10:00:00", "2026-02-30T00:00:00Z", "now", "",
]) | ANY_VALUE


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=ANY_TEXT, webhook_id=ANY_TEXT, event_type=st.sampled_from(
           ["merchant.boarded", "merchant.deleted", "boarding.varcomplete", "x"]) | ANY_TEXT,
       merchant_id=ANY_VALUE | st.integers(min_value=0, max_value=10), status_id=ANY_VALUE,
       at=MOMENTS, payload_at=MOMENTS, mid=ANY_VALUE)
async def test_any_signed_envelope_is_stored_or_refused_naming_the_field(
    harness: Harness, key: Any, webhook_id: Any, event_type: Any, merchant_id: Any,
    status_id: Any, at: Any, payload_at: Any, mid: Any,
) -> None:
    """A correctly signed event of any shape: 200 (and kept), or a 4xx naming its field; never
    a 503 that the sender would retry for ever, never a 500, and the next event is taken."""
    receiver = harness.receiver or await harness.start()
    body = envelope("k")
    body["metadata"] |= {"idempotency_key": key, "webhook_id": webhook_id}
    body |= {"event_type": event_type, "timestamp": at}
    body["payload"] |= {"merchant_id": merchant_id, "merchant_status_id": status_id,
                        "timestamp": payload_at, "mid": mid}
    raw = json.dumps(body).encode()
    status, answer = await harness.post(raw, {"X-Webhook-Signature-256": sign(raw, SECRET)})
    assert status in (200, 400), (status, answer)
    if status == 400:
        assert answer["field"], answer
    receiver.merchants()  # the admin API's view of what was kept
    fresh = envelope(f"fresh-{len(receiver.store)}-{status}-{id(body)}")
    assert (await harness.deliver(fresh))[0] == 200
