"""Boarding: merchant records, their statuses, and the webhook envelope and payloads.

The interface lets statuses and webhook reasons grow without a version change, so every enum here
is read tolerantly: an id or name this code does not know is kept as raw data and mapped to a
documented fallback (``MerchantReason.STATUS_CHANGED``) instead of rejecting the record.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from kiosk_agent.service.models.common import RequestBody, ServiceModel, Tolerant, invalid
from kiosk_agent.service.models.reporting import QueryFilter

__all__ = [
    "Merchant",
    "MerchantCreate",
    "MerchantFilter",
    "MerchantPayload",
    "MerchantReason",
    "MerchantStatus",
    "MerchantTrigger",
    "MerchantUpdate",
    "VarCompletePayload",
    "WebhookEnvelope",
    "WebhookMetadata",
]


class MerchantStatus(enum.IntEnum):
    """A merchant's onboarding status, by the interface's ``merchant_status_id``."""

    NEW = 1
    SENT_FOR_SIGNATURE = 2
    SIGNED = 3
    IN_UNDERWRITING = 4
    BOARDED = 5
    LIVE = 6
    CANCELLED = 7
    DECLINED = 8
    UNKNOWN = 9

    @property
    def api_name(self) -> str:
        """The name used on the wire (``sent_for_signature``) and in ``merchant.<name>`` events."""
        return self.name.lower()

    @classmethod
    def from_name(cls, name: str) -> MerchantStatus:
        """``"sent_for_signature"`` / ``"Sent For Signature"`` -> SENT_FOR_SIGNATURE."""
        key = name.strip().upper().replace(" ", "_").replace("-", "_")
        try:
            return cls[key]
        except KeyError:
            known = ", ".join(s.api_name for s in cls)
            raise ValueError(f"unknown merchant status {name!r} (known: {known})") from None

    @classmethod
    def from_id(cls, status_id: int) -> MerchantStatus | None:
        """The status for an id, or None for an id newer than this code."""
        try:
            return cls(status_id)
        except ValueError:
            return None


def _status_by_name(value: Any) -> Any:
    # People and the wire name statuses ("sent_for_signature"); ids are accepted too.
    if isinstance(value, str) and not value.strip().isdigit():
        try:
            return MerchantStatus.from_name(value)
        except ValueError:
            known = ", ".join(s.api_name for s in MerchantStatus)
            raise invalid("merchant_status", f"expected a merchant status ({known})") from None
    return value


StatusByName = Annotated[MerchantStatus, BeforeValidator(_status_by_name)]


class MerchantReason(enum.StrEnum):
    """Why a merchant event was sent; an open-ended set on the wire."""

    CREATED = "created"
    SENT_FOR_SIGNATURE = "sent_for_signature"
    RESENT = "resent"
    RETRACTED = "retracted"
    UPDATED = "updated"
    SIGNED = "signed"
    IN_UNDERWRITING = "in_underwriting"
    BOARDED = "boarded"
    LIVE = "live"
    CANCELLED = "cancelled"
    DECLINED = "declined"
    SIGNATURE_EXPIRED = "signature_expired"
    DELETED = "deleted"
    STATUS_CHANGED = "status_changed"

    @classmethod
    def parse(cls, value: str | None) -> MerchantReason:
        """Unknown or missing reasons fall back to STATUS_CHANGED, as the interface demands."""
        if isinstance(value, cls):
            return value
        try:
            return cls(value) if value is not None else cls.STATUS_CHANGED
        except ValueError:
            return cls.STATUS_CHANGED


class MerchantTrigger(enum.StrEnum):
    API = "api"
    UI = "ui"
    SYSTEM = "system"


class _MerchantFields(ServiceModel):
    merchant_id: int
    mid: str | None = None  # null until boarded
    rep_code_id: int | None = None
    customer_id: int | None = None
    dba_name: str | None = None
    merchant_status_id: int
    external_crm_id: str | None = None
    custom_01: str | None = None

    @property
    def status(self) -> MerchantStatus | None:
        """The known status, or None when the service sent an id this code does not know."""
        return MerchantStatus.from_id(self.merchant_status_id)


class Merchant(_MerchantFields):
    """A merchant record of the boarding API: the webhook payload's fields plus these."""

    legal_name: str | None = None
    created: datetime | None = None
    updated: datetime | None = None


class MerchantPayload(_MerchantFields):
    """The payload of every ``merchant.*`` event."""

    trigger: Tolerant[MerchantTrigger] | None = None
    reason: Tolerant[MerchantReason] | None = None
    timestamp: datetime | None = None  # when the change happened (ISO 8601 with offset)
    deleted_by: str | None = None  # merchant.deleted only

    @property
    def reason_kind(self) -> MerchantReason:
        return MerchantReason.parse(self.reason)


class VarCompletePayload(ServiceModel):
    """``boarding.varcomplete``: the acquirer's VAR-only process is complete (all strings)."""

    merchant_id: str
    acquirer_bin: str | None = None
    agent_bank_number: str | None = None
    agent_chain_number: str | None = None
    city: str | None = None
    zip_code: str | None = None
    contact_phone: str | None = None
    merchant_aba_number: str | None = None
    merchant_category_code: str | None = None
    merchant_location_number: str | None = None
    dba_name: str | None = None
    mid: str | None = None
    merchant_settlement_agent_number: str | None = None
    state: str | None = None
    store_number: str | None = None
    terminal_id: str | None = None
    terminal_number: str | None = None
    time_zone: str | None = None


class WebhookMetadata(ServiceModel):
    webhook_id: str
    attempt: int = 1
    idempotency_key: str | None = None


class WebhookEnvelope(ServiceModel):
    """What every webhook POST carries; ``payload`` is typed by ``event_type`` in webhooks.py."""

    event_type: str
    source_id: str | None = None
    timestamp: datetime
    payload: dict[str, Any] = Field(default_factory=dict)
    metadata: WebhookMetadata


class MerchantCreate(RequestBody):
    """Fields to create a merchant; anything else the service accepts may be passed as extra."""

    dba_name: str
    legal_name: str | None = None
    rep_code_id: int | None = None
    customer_id: int | None = None
    external_crm_id: str | None = None
    custom_01: str | None = None


class MerchantFilter(QueryFilter):
    """Attribute equalities for the merchant list (the ORDS ``q``); only real attributes."""

    merchant_id: int | None = None
    mid: str | None = None
    dba_name: str | None = None
    merchant_status_id: StatusByName | None = None
    rep_code_id: int | None = None
    customer_id: int | None = None
    external_crm_id: str | None = None


class MerchantUpdate(RequestBody):
    """Fields to change on a merchant; only those set are sent.

    ``merchant_status`` travels as its name; through the API only ``new`` (retract) and
    ``sent_for_signature`` (send, or resend) are accepted, the rest are the service's own moves.
    """

    merchant_status: StatusByName | None = None
    dba_name: str | None = None
    legal_name: str | None = None
    external_crm_id: str | None = None
    custom_01: str | None = None
    rep_code_id: int | None = None
    customer_id: int | None = None

    def to_wire(self) -> dict[str, Any]:
        body = super().to_wire()
        if self.merchant_status is not None:
            body["merchant_status"] = self.merchant_status.api_name
        return body
