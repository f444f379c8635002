"""Boarding webhooks, received: signature check, typed events, duplicates, merchant state.

The pieces are separate so a receiver can use what it needs:

- :func:`verify` checks ``X-Webhook-Signature-256`` over the raw body (constant-time compare).
- :func:`parse_event` turns the raw body into a typed :class:`MerchantEvent`,
  :class:`VarCompleteEvent` or :class:`OtherEvent` (an event type this code does not know).
- :class:`IdempotencyStore` remembers delivered idempotency keys; :class:`MemoryIdempotencyStore`
  is the in-process one (a durable store implements the same two methods).
- :class:`MerchantStateReducer` folds events into each merchant's current state, correct when
  events arrive out of order or more than once.
- :class:`WebhookProcessor` chains them: verify, parse, drop duplicates, reduce, hand over.

Ordering rule of the reducer (the interface only says "status changes can arrive in any order"):
each merchant event is placed by its *effective time*, the payload's ``timestamp`` (when the change
happened) or, when the payload has none, the envelope's ``timestamp``. An event is applied only
when it sorts after the last applied one; ties on time are broken by the envelope timestamp, then
``merchant.deleted`` before anything else, then the higher status id, then the idempotency key, so
the final state is the same whatever the arrival order. A deletion is final against every event
that is not strictly newer; a strictly newer event for the same merchant (the service only sends
those for a record that exists again) clears it. A duplicate changes nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import ValidationError

from kiosk_agent.service.models.boarding import (
    MerchantPayload,
    MerchantReason,
    MerchantStatus,
    VarCompletePayload,
    WebhookEnvelope,
)

SIGNATURE_HEADER = "X-Webhook-Signature-256"
IDEMPOTENCY_HEADER = "X-Idempotency-Key"
_SIGNATURE_PREFIX = "sha256="
_HEX_DIGEST_LENGTH = 64

MERCHANT_EVENT_PREFIX = "merchant."
MERCHANT_DELETED = "merchant.deleted"
VAR_COMPLETE = "boarding.varcomplete"


class WebhookError(Exception):
    """A webhook delivery that must be refused; the message says why (never the secret)."""


class WebhookSignatureError(WebhookError):
    """The signature header is missing, malformed, or does not match the body."""


class WebhookPayloadError(WebhookError):
    """The body is not a valid envelope; ``field`` names what was wrong."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


# -- signature ---------------------------------------------------------------------------------


def _digest(raw_body: bytes, secret: str) -> str:
    return hmac.new(secret.encode(), raw_body, hashlib.sha256).hexdigest()


def sign(raw_body: bytes, secret: str) -> str:
    """The ``X-Webhook-Signature-256`` header value for ``raw_body``."""
    return f"{_SIGNATURE_PREFIX}{_digest(raw_body, secret)}"


def verify(raw_body: bytes, signature_header: str | None, secret: str) -> None:
    """Raise :class:`WebhookSignatureError` unless ``signature_header`` signs ``raw_body``.

    The body must be the exact bytes received: re-serialised JSON would not match.
    """
    if not secret:
        raise WebhookSignatureError("no webhook secret is configured; refusing every delivery")
    if not signature_header:
        raise WebhookSignatureError(f"missing {SIGNATURE_HEADER} header")
    header = signature_header.strip()
    if not header.startswith(_SIGNATURE_PREFIX):
        raise WebhookSignatureError(f"{SIGNATURE_HEADER} must start with {_SIGNATURE_PREFIX!r}")
    received = header[len(_SIGNATURE_PREFIX) :].lower()
    if len(received) != _HEX_DIGEST_LENGTH or any(c not in "0123456789abcdef" for c in received):
        raise WebhookSignatureError(f"{SIGNATURE_HEADER} is not a hex SHA-256 digest")
    if not hmac.compare_digest(_digest(raw_body, secret), received):
        raise WebhookSignatureError(f"{SIGNATURE_HEADER} does not match the body")


# -- typed events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Event:
    envelope: WebhookEnvelope

    @property
    def event_type(self) -> str:
        return self.envelope.event_type

    @property
    def idempotency_key(self) -> str:
        """The key duplicates share; the webhook id stands in when a sender omits it."""
        return self.envelope.metadata.idempotency_key or self.envelope.metadata.webhook_id


@dataclass(frozen=True, slots=True)
class MerchantEvent(_Event):
    """``merchant.<status>`` or ``merchant.deleted``."""

    payload: MerchantPayload

    @property
    def merchant_id(self) -> int:
        return self.payload.merchant_id

    @property
    def deleted(self) -> bool:
        return self.event_type == MERCHANT_DELETED

    @property
    def effective_time(self) -> datetime:
        """When the change happened: the payload's timestamp, else the envelope's."""
        return _aware(self.payload.timestamp or self.envelope.timestamp)


@dataclass(frozen=True, slots=True)
class VarCompleteEvent(_Event):
    payload: VarCompletePayload


@dataclass(frozen=True, slots=True)
class OtherEvent(_Event):
    """An event type this code does not know; kept (and acknowledged), not acted on."""


WebhookEvent = MerchantEvent | VarCompleteEvent | OtherEvent


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _first_error(err: ValidationError, prefix: str) -> WebhookPayloadError:
    first = err.errors()[0]
    where = ".".join(str(part) for part in (prefix, *first["loc"]) if part != "")
    return WebhookPayloadError(f"webhook field {where!r}: {first['msg']}", field=where)


def parse_event(raw_body: bytes) -> WebhookEvent:
    """The typed event in ``raw_body``; :class:`WebhookPayloadError` names the bad field."""
    try:
        data = json.loads(raw_body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise WebhookPayloadError(f"webhook body is not JSON: {err}", field="<body>") from None
    if not isinstance(data, dict):
        raise WebhookPayloadError("webhook body is not a JSON object", field="<body>")
    try:
        envelope = WebhookEnvelope.model_validate(data)
    except ValidationError as err:
        raise _first_error(err, "") from None
    try:
        if envelope.event_type == VAR_COMPLETE:
            return VarCompleteEvent(envelope, VarCompletePayload.model_validate(envelope.payload))
        if envelope.event_type.startswith(MERCHANT_EVENT_PREFIX):
            return MerchantEvent(envelope, MerchantPayload.model_validate(envelope.payload))
    except ValidationError as err:
        raise _first_error(err, "payload") from None
    return OtherEvent(envelope)


# -- duplicates --------------------------------------------------------------------------------


class IdempotencyStore(Protocol):
    """Delivered idempotency keys. ``add`` must be atomic: two racing deliveries, one winner."""

    async def add(self, key: str) -> bool:
        """Record ``key``; True when it was new, False when it was already recorded."""
        ...

    async def discard(self, key: str) -> None:
        """Forget ``key`` (its handling failed, so the sender's retry must be accepted)."""
        ...


class MemoryIdempotencyStore:
    """Keys in memory, the oldest forgotten past ``max_keys`` (retries end within hours)."""

    def __init__(self, max_keys: int = 10_000) -> None:
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._max_keys = max_keys

    async def add(self, key: str) -> bool:
        if key in self._keys:
            self._keys.move_to_end(key)
            return False
        self._keys[key] = None
        if len(self._keys) > self._max_keys:
            self._keys.popitem(last=False)
        return True

    async def discard(self, key: str) -> None:
        self._keys.pop(key, None)

    def __len__(self) -> int:
        return len(self._keys)


# -- merchant state ----------------------------------------------------------------------------

_OrderKey = tuple[datetime, datetime, int, int, str]


@dataclass(frozen=True, slots=True)
class MerchantState:
    """What the webhooks say about one merchant, as of ``changed_at``."""

    merchant_id: int
    status_id: int | None = None  # None until a merchant.* event arrived (varcomplete first)
    deleted: bool = False
    mid: str | None = None
    dba_name: str | None = None
    reason: MerchantReason | None = None
    trigger: str | None = None
    changed_at: datetime | None = None
    event_type: str | None = None
    var: VarCompletePayload | None = None
    _order: _OrderKey | None = None
    _var_at: datetime | None = None

    @property
    def status(self) -> MerchantStatus | None:
        return MerchantStatus.from_id(self.status_id) if self.status_id is not None else None


def _order_key(event: MerchantEvent) -> _OrderKey:
    return (
        event.effective_time,
        _aware(event.envelope.timestamp),
        1 if event.deleted else 0,
        event.payload.merchant_status_id,
        event.idempotency_key,
    )


class MerchantStateReducer:
    """Folds webhook events into each merchant's latest state (see the module's ordering rule)."""

    def __init__(self) -> None:
        self._states: dict[int, MerchantState] = {}

    def get(self, merchant_id: int) -> MerchantState | None:
        return self._states.get(merchant_id)

    def states(self) -> dict[int, MerchantState]:
        return dict(self._states)

    def apply(self, event: WebhookEvent) -> bool:
        """Fold ``event`` in; True when the merchant's state changed."""
        if isinstance(event, MerchantEvent):
            return self._apply_merchant(event)
        if isinstance(event, VarCompleteEvent):
            return self._apply_var(event)
        return False

    def _apply_merchant(self, event: MerchantEvent) -> bool:
        current = self._states.get(event.merchant_id) or MerchantState(event.merchant_id)
        key = _order_key(event)
        if current._order is not None and key <= current._order:
            return False  # older than (or the same as) what is applied: never regress
        payload = event.payload
        self._states[event.merchant_id] = replace(
            current,
            status_id=payload.merchant_status_id,
            deleted=event.deleted,
            # A newer event without a mid (retracted before boarding) still keeps a mid we know.
            mid=payload.mid or current.mid,
            dba_name=payload.dba_name or current.dba_name,
            reason=payload.reason_kind,
            trigger=payload.trigger,
            changed_at=event.effective_time,
            event_type=event.event_type,
            _order=key,
        )
        return True

    def _apply_var(self, event: VarCompleteEvent) -> bool:
        try:
            merchant_id = int(event.payload.merchant_id)
        except ValueError:
            return False
        current = self._states.get(merchant_id) or MerchantState(merchant_id)
        at = _aware(event.envelope.timestamp)
        if current._var_at is not None and at <= current._var_at:
            return False
        self._states[merchant_id] = replace(
            current, var=event.payload, mid=current.mid or event.payload.mid, _var_at=at
        )
        return True


# -- the whole receive path --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Receipt:
    """The outcome of one delivery: the event, and whether it was new."""

    event: WebhookEvent
    duplicate: bool
    changed: bool  # the reducer's state moved


Handler = Callable[[WebhookEvent], Awaitable[None]]


class WebhookProcessor:
    """verify -> parse -> drop duplicates -> reduce -> ``handle``, for one shared secret.

    A delivery whose handling raises is forgotten by the store, so the sender's retry is taken.
    Raises :class:`WebhookSignatureError` / :class:`WebhookPayloadError` for a refused delivery
    (answer 401 / 400: the sender retries a 4xx, which a forged body deserves no better than).
    """

    def __init__(
        self,
        secret: str,
        store: IdempotencyStore | None = None,
        reducer: MerchantStateReducer | None = None,
        handle: Handler | None = None,
    ) -> None:
        self._secret = secret
        self.store: IdempotencyStore = store if store is not None else MemoryIdempotencyStore()
        self.reducer = reducer if reducer is not None else MerchantStateReducer()
        self._handle = handle

    async def process(self, raw_body: bytes, headers: Mapping[str, str]) -> Receipt:
        verify(raw_body, _header(headers, SIGNATURE_HEADER), self._secret)
        event = parse_event(raw_body)
        key = event.idempotency_key
        if not await self.store.add(key):
            return Receipt(event, duplicate=True, changed=False)
        try:
            changed = self.reducer.apply(event)
            if self._handle is not None:
                await self._handle(event)
        except BaseException:
            await self.store.discard(key)
            raise
        return Receipt(event, duplicate=False, changed=changed)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    lowered = name.lower()
    return next((v for k, v in headers.items() if k.lower() == lowered), None)


def describe(event: WebhookEvent) -> dict[str, Any]:
    """A log-safe summary of an event (ids and status only; no contact details)."""
    summary: dict[str, Any] = {
        "event_type": event.event_type,
        "webhook_id": event.envelope.metadata.webhook_id,
        "attempt": event.envelope.metadata.attempt,
    }
    if isinstance(event, MerchantEvent):
        summary.update(
            merchant_id=event.merchant_id,
            merchant_status_id=event.payload.merchant_status_id,
            reason=event.payload.reason_kind.value,
        )
    elif isinstance(event, VarCompleteEvent):
        summary["merchant_id"] = event.payload.merchant_id
    return summary
