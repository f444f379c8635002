"""Boarding webhooks received: signatures, typed events, duplicates, and out-of-order state."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kiosk_agent.service.models.boarding import MerchantReason, MerchantStatus
from kiosk_agent.service.webhooks import (
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    MemoryIdempotencyStore,
    MerchantEvent,
    MerchantStateReducer,
    OtherEvent,
    VarCompleteEvent,
    WebhookPayloadError,
    WebhookProcessor,
    WebhookSignatureError,
    describe,
    parse_event,
    sign,
    verify,
)

SECRET = "whsec_test"
T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
_keys = itertools.count(1)


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def merchant_envelope(
    status: MerchantStatus,
    at: datetime,
    *,
    merchant_id: int = 42,
    event_type: str | None = None,
    reason: str | None = None,
    mid: str | None = None,
    key: str | None = None,
) -> dict[str, Any]:
    """An envelope as the service sends it; the payload timestamp carries an offset."""
    key = key or f"idem_{next(_keys)}"
    return {
        "event_type": event_type or f"merchant.{status.api_name}",
        "source_id": str(merchant_id),
        "timestamp": iso(at + timedelta(milliseconds=5)),
        "payload": {
            "merchant_id": merchant_id,
            "mid": mid,
            "rep_code_id": 7,
            "customer_id": 9,
            "dba_name": "Corner Snacks",
            "merchant_status_id": int(status),
            "external_crm_id": None,
            "custom_01": None,
            "trigger": "system",
            "reason": reason or status.api_name,
            "timestamp": at.astimezone(UTC).isoformat(),
        },
        "metadata": {"webhook_id": f"wh_{key}", "attempt": 1, "idempotency_key": key},
    }


def body_of(envelope: dict[str, Any]) -> bytes:
    return json.dumps(envelope, separators=(",", ":")).encode()


def signed_headers(body: bytes, key: str = "k") -> dict[str, str]:
    return {SIGNATURE_HEADER: sign(body, SECRET), IDEMPOTENCY_HEADER: key}


# -- verify ------------------------------------------------------------------------------------


def test_a_signature_made_with_the_shared_secret_verifies() -> None:
    body = b'{"event_type":"merchant.new"}'
    verify(body, sign(body, SECRET), SECRET)
    verify(body, sign(body, SECRET).upper().replace("SHA256=", "sha256="), SECRET)


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (None, "missing"),
        ("", "missing"),
        ("md5=abc", "must start with 'sha256='"),
        ("sha256=xyz", "not a hex SHA-256 digest"),
        ("sha256=" + "0" * 64, "does not match"),
    ],
)
def test_a_bad_signature_header_is_refused_with_the_reason(
    header: str | None, reason: str
) -> None:
    with pytest.raises(WebhookSignatureError, match=reason):
        verify(b"{}", header, SECRET)


def test_a_forged_body_or_another_secret_does_not_verify() -> None:
    body = body_of(merchant_envelope(MerchantStatus.NEW, T0))
    header = sign(body, SECRET)
    forged = body.replace(b"Corner Snacks", b"Evil Snacks")
    with pytest.raises(WebhookSignatureError, match="does not match"):
        verify(forged, header, SECRET)
    with pytest.raises(WebhookSignatureError, match="does not match"):
        verify(body, header, "another-secret")
    with pytest.raises(WebhookSignatureError, match="no webhook secret"):
        verify(body, header, "")


def test_the_error_never_shows_the_secret() -> None:
    with pytest.raises(WebhookSignatureError) as caught:
        verify(b"{}", "sha256=" + "1" * 64, SECRET)
    assert SECRET not in str(caught.value)


# -- parse -------------------------------------------------------------------------------------


def test_merchant_events_are_typed_with_status_reason_and_time() -> None:
    event = parse_event(body_of(merchant_envelope(MerchantStatus.BOARDED, T0, mid="999000000777")))
    assert isinstance(event, MerchantEvent)
    assert event.merchant_id == 42
    assert event.payload.status is MerchantStatus.BOARDED
    assert event.payload.reason_kind is MerchantReason.BOARDED
    assert event.payload.mid == "999000000777"
    assert event.effective_time == T0
    assert not event.deleted
    assert describe(event) == {
        "event_type": "merchant.boarded",
        "webhook_id": event.envelope.metadata.webhook_id,
        "attempt": 1,
        "merchant_id": 42,
        "merchant_status_id": 5,
        "reason": "boarded",
    }


def test_an_unknown_reason_or_status_is_tolerated() -> None:
    envelope = merchant_envelope(MerchantStatus.NEW, T0, reason="paperwork_lost")
    envelope["payload"]["merchant_status_id"] = 12
    envelope["payload"]["brand_new_field"] = {"kept": True}
    event = parse_event(body_of(envelope))
    assert isinstance(event, MerchantEvent)
    assert event.payload.reason == "paperwork_lost"
    assert event.payload.reason_kind is MerchantReason.STATUS_CHANGED
    assert event.payload.status is None
    assert event.payload.model_extra == {"brand_new_field": {"kept": True}}


def test_varcomplete_and_unknown_event_types() -> None:
    var = {
        "event_type": "boarding.varcomplete",
        "source_id": "42",
        "timestamp": iso(T0),
        "payload": {"merchant_id": "42", "mid": "999000000777", "terminal_id": "T1"},
        "metadata": {"webhook_id": "wh_v", "attempt": 2, "idempotency_key": "idem_v"},
    }
    event = parse_event(body_of(var))
    assert isinstance(event, VarCompleteEvent)
    assert event.payload.mid == "999000000777"
    assert event.envelope.metadata.attempt == 2

    other = dict(var, event_type="payments.settled", payload={"anything": 1})
    assert isinstance(parse_event(body_of(other)), OtherEvent)


def test_the_webhook_id_stands_in_for_a_missing_idempotency_key() -> None:
    envelope = merchant_envelope(MerchantStatus.NEW, T0)
    del envelope["metadata"]["idempotency_key"]
    assert parse_event(body_of(envelope)).idempotency_key == envelope["metadata"]["webhook_id"]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda e: e.pop("event_type"), "event_type"),
        (lambda e: e.update(timestamp="yesterday"), "timestamp"),
        (lambda e: e.pop("metadata"), "metadata"),
        (lambda e: e["payload"].update(merchant_id="forty-two"), "payload.merchant_id"),
        (lambda e: e["payload"].pop("merchant_status_id"), "payload.merchant_status_id"),
    ],
)
def test_a_malformed_envelope_names_the_field(mutate: Any, field: str) -> None:
    envelope = merchant_envelope(MerchantStatus.NEW, T0)
    mutate(envelope)
    with pytest.raises(WebhookPayloadError) as caught:
        parse_event(body_of(envelope))
    assert caught.value.field == field
    assert field in str(caught.value)


@pytest.mark.parametrize("body", [b"", b"{not json", b"[1, 2]", b"\xff\xfe", b'"text"'])
def test_a_body_that_is_not_a_json_object_is_refused(body: bytes) -> None:
    with pytest.raises(WebhookPayloadError) as caught:
        parse_event(body)
    assert caught.value.field == "<body>"


# -- duplicates --------------------------------------------------------------------------------


async def test_the_memory_store_admits_a_key_once_and_forgets_the_oldest() -> None:
    store = MemoryIdempotencyStore(max_keys=2)
    assert await store.add("a")
    assert not await store.add("a")
    assert await store.add("b")
    assert await store.add("c")  # "a" is forgotten now
    assert len(store) == 2
    assert await store.add("a")
    await store.discard("a")
    assert await store.add("a")


# -- reducer -----------------------------------------------------------------------------------


def lifecycle(merchant_id: int = 42) -> list[dict[str, Any]]:
    """A merchant's whole life, one minute apart: created, sent, resent, signed ... live."""
    steps: list[tuple[MerchantStatus, str, str | None]] = [
        (MerchantStatus.NEW, "created", None),
        (MerchantStatus.SENT_FOR_SIGNATURE, "sent_for_signature", None),
        (MerchantStatus.SENT_FOR_SIGNATURE, "resent", None),
        (MerchantStatus.SIGNED, "signed", None),
        (MerchantStatus.IN_UNDERWRITING, "in_underwriting", None),
        (MerchantStatus.BOARDED, "boarded", "999000000777"),
        (MerchantStatus.LIVE, "live", "999000000777"),
    ]
    return [
        merchant_envelope(
            status, T0 + timedelta(minutes=i), merchant_id=merchant_id, reason=reason, mid=mid
        )
        for i, (status, reason, mid) in enumerate(steps)
    ]


def fold(envelopes: list[dict[str, Any]]) -> MerchantStateReducer:
    reducer = MerchantStateReducer()
    for envelope in envelopes:
        reducer.apply(parse_event(body_of(envelope)))
    return reducer


def test_events_in_order_walk_the_merchant_to_live() -> None:
    state = fold(lifecycle()).get(42)
    assert state is not None
    assert state.status is MerchantStatus.LIVE
    assert state.mid == "999000000777"
    assert state.reason is MerchantReason.LIVE
    assert state.changed_at == T0 + timedelta(minutes=6)
    assert not state.deleted


def test_any_arrival_order_with_duplicates_ends_in_the_same_state() -> None:
    events = lifecycle(1) + lifecycle(2)
    expected = fold(events).states()
    shuffler = random.Random(3)
    for _ in range(50):
        delivered = events + shuffler.sample(events, k=5)  # some sent twice
        shuffler.shuffle(delivered)
        assert fold(delivered).states() == expected


def test_an_older_event_never_regresses_the_state() -> None:
    reducer = MerchantStateReducer()
    live, signed = lifecycle()[6], lifecycle()[3]
    assert reducer.apply(parse_event(body_of(live)))
    assert not reducer.apply(parse_event(body_of(signed)))
    assert not reducer.apply(parse_event(body_of(live)))  # the same event again
    state = reducer.get(42)
    assert state is not None
    assert state.status is MerchantStatus.LIVE


def test_a_newer_retraction_moves_the_status_back_on_purpose() -> None:
    sent = merchant_envelope(MerchantStatus.SENT_FOR_SIGNATURE, T0)
    retracted = merchant_envelope(MerchantStatus.NEW, T0 + timedelta(seconds=1), reason="retracted")
    for order in ([sent, retracted], [retracted, sent]):
        state = fold(order).get(42)
        assert state is not None
        assert state.status is MerchantStatus.NEW
        assert state.reason is MerchantReason.RETRACTED


def test_deleted_is_final_against_older_and_simultaneous_events() -> None:
    deleted = merchant_envelope(
        MerchantStatus.SIGNED, T0 + timedelta(minutes=3), event_type="merchant.deleted",
        reason="deleted",
    )
    deleted["payload"]["deleted_by"] = "ops@example.com"
    same_time = merchant_envelope(MerchantStatus.IN_UNDERWRITING, T0 + timedelta(minutes=3))
    same_time["timestamp"] = deleted["timestamp"]
    for order in ([*lifecycle()[:4], deleted, same_time], [same_time, deleted, *lifecycle()[:4]]):
        state = fold(order).get(42)
        assert state is not None
        assert state.deleted
        assert state.status is MerchantStatus.SIGNED  # the status at deletion
        assert state.event_type == "merchant.deleted"

    later = merchant_envelope(MerchantStatus.NEW, T0 + timedelta(minutes=9), reason="created")
    revived = fold([deleted, later]).get(42)
    assert revived is not None
    assert not revived.deleted


def test_varcomplete_adds_the_mid_whatever_arrives_first() -> None:
    var = {
        "event_type": "boarding.varcomplete",
        "source_id": "42",
        "timestamp": iso(T0 + timedelta(minutes=5, seconds=1)),
        "payload": {"merchant_id": "42", "mid": "999000000777", "store_number": "12"},
        "metadata": {"webhook_id": "wh_v", "attempt": 1, "idempotency_key": "idem_v"},
    }
    signed = lifecycle()[3]
    for order in ([var, signed], [signed, var]):
        state = fold(order).get(42)
        assert state is not None
        assert state.status is MerchantStatus.SIGNED
        assert state.mid == "999000000777"
        assert state.var is not None
        assert state.var.store_number == "12"


# -- the receive path --------------------------------------------------------------------------


async def test_the_processor_verifies_dedupes_reduces_and_hands_over() -> None:
    handled: list[str] = []

    async def handle(event: Any) -> None:
        handled.append(event.event_type)

    processor = WebhookProcessor(SECRET, handle=handle)
    body = body_of(lifecycle()[0])
    first = await processor.process(body, signed_headers(body))
    again = await processor.process(body, {k.lower(): v for k, v in signed_headers(body).items()})
    assert (first.duplicate, first.changed) == (False, True)
    assert (again.duplicate, again.changed) == (True, False)
    assert handled == ["merchant.new"]

    with pytest.raises(WebhookSignatureError):
        await processor.process(body.replace(b"42", b"43"), signed_headers(body))
    assert processor.reducer.get(43) is None


async def test_a_delivery_whose_handling_fails_is_taken_again_on_retry() -> None:
    calls = 0

    async def flaky(event: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("database is locked")

    processor = WebhookProcessor(SECRET, handle=flaky)
    body = body_of(lifecycle()[0])
    with pytest.raises(RuntimeError):
        await processor.process(body, signed_headers(body))
    retry = await processor.process(body, signed_headers(body))
    assert not retry.duplicate
    assert calls == 2


async def test_racing_copies_of_one_delivery_are_taken_once() -> None:
    handled: list[str] = []

    async def handle(event: Any) -> None:
        await asyncio.sleep(0)  # let the copies interleave
        handled.append(event.idempotency_key)

    processor = WebhookProcessor(SECRET, handle=handle)
    body = body_of(lifecycle()[0])
    receipts = await asyncio.gather(
        *(processor.process(body, signed_headers(body)) for _ in range(10))
    )
    assert sum(not r.duplicate for r in receipts) == 1
    assert len(handled) == 1
