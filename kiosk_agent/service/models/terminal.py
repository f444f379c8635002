"""Models of the terminal interface: readers, their capabilities and card-present interactions."""


import enum
import functools
from datetime import datetime
from typing import Any

from pydantic import Field

from kiosk_agent.service.models.common import ServiceModel, Tolerant, empty_list
from kiosk_agent.service.models.payments import ChargeResult


class Capabilities(ServiceModel):
    """What a reader can do; the authority, not the device model."""

    signature_capture: bool = False
    receipt_printing: bool = False


class Terminal(ServiceModel):
    device_id: str
    name: str | None = None
    vendor: str | None = None
    model: str | None = None
    online: bool
    connected: bool = False
    last_seen_at: datetime | None = None
    capabilities: Capabilities = Field(default_factory=Capabilities)


class TerminalList(ServiceModel):
    terminals: list[Terminal]


class TerminalConnection(ServiceModel):
    """The answer of connect and disconnect."""

    device_id: str
    connected: bool


class PingResult(ServiceModel):
    device_id: str
    online: bool
    latency_ms: float | None = None


class InteractionKind(enum.StrEnum):
    READ_CARD = "read_card"
    CHARGE_CARD = "charge_card"

    @property
    def path(self) -> str:
        """The path segment of this kind's status endpoint (``read-card``/``charge-card``)."""
        return self._value_.replace("_", "-")


class InteractionStatus(enum.StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self is not InteractionStatus.PENDING


class StageError(ServiceModel):
    """A device-side problem in one stage of an interaction (fatal when status is failed)."""

    stage: str
    code: str
    message: str | None = None


class ReadCardResult(ServiceModel):
    """A read-card interaction's result: the payment account token to charge."""

    token: str
    card_brand_id: int | str | None = None
    last_four: str | None = None
    expiration: str | None = None


class InteractionAccepted(ServiceModel):
    """The 202 answer of read-card and charge-card."""

    interaction_id: str
    status: Tolerant[InteractionStatus] = InteractionStatus.PENDING


class Interaction(ServiceModel):
    """An interaction record, as the status endpoints and the WebSocket send it."""

    interaction_id: str
    device_id: str | None = None
    kind: Tolerant[InteractionKind] | None = None
    status: Tolerant[InteractionStatus]
    created_at: datetime | None = None
    expires_at: datetime | None = None
    result: dict[str, Any] | None = None
    stage_errors: list[StageError] = Field(default_factory=empty_list)

    @property
    def finished(self) -> bool:
        """Anything but pending; an unknown status counts as finished (the service moved on)."""
        return self.status != InteractionStatus.PENDING

    @property
    def fault(self) -> str:
        """Why the terminal ended it without a result, for people: each stage error's stage and
        code, else its status."""
        errors = "; ".join(f"{e.stage}: {e.code}" for e in self.stage_errors)
        return f"terminal fault ({errors or self.status})"

    @property
    def read_card_result(self) -> ReadCardResult | None:
        """The typed result of a succeeded read-card, else None."""
        if self.result is None or self.status != InteractionStatus.SUCCEEDED:
            return None
        return ReadCardResult.model_validate(self.result)

    @functools.cached_property
    def charge_result(self) -> ChargeResult | None:
        """The typed result of a succeeded charge-card, else None: validated once and kept with
        the record (``parse_interaction`` checks it; the sale reads it after: one validation,
        not two). Kept in the instance's ``__dict__``, beside the fields: no dump, copy or
        comparison of the record names it (pydantic compares fields only)."""
        if self.result is None or self.status != InteractionStatus.SUCCEEDED:
            return None
        return ChargeResult.model_validate(self.result)


class WsToken(ServiceModel):
    token: str
    expires_at: int | float | None = None
