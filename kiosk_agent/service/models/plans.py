"""Models of billing plans and their scheduled payments (recurring charges on a vaulted card).

Amounts in decimal dollars (``Decimal``), as choices.md fixes for plans.
"""

from __future__ import annotations

import enum
from datetime import datetime

from kiosk_agent.service.models.common import (
    Dollars,
    RequestBody,
    RequestDollars,
    ServiceModel,
    Tolerant,
)


class BillingPlanStatus(enum.StrEnum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    CANCELLED = "CANCELLED"
    COMPLETED = "COMPLETED"


class ScheduledPaymentStatus(enum.StrEnum):
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    PARTIAL = "PARTIAL"


class ScheduledPayment(ServiceModel):
    id: int
    payment_number: int
    payment_date: datetime
    amount_scheduled: Dollars
    amount_paid: Dollars
    amount_remaining: Dollars
    payment_status: Tolerant[ScheduledPaymentStatus]


class BillingPlan(ServiceModel):
    id: int
    name: str
    description: str | None
    mid: str
    payment_account_uuid: str
    status: Tolerant[BillingPlanStatus]
    rrule_pattern: str
    amount: Dollars
    scheduled_payments: list[ScheduledPayment]


class BillingPlanRequest(RequestBody):
    """The body of ``POST /api/v1/billing_plans``; ``amount`` in dollars, sent as ``"12.50"``."""

    name: str
    description: str
    mid: str
    payment_account_uuid: str
    amount: RequestDollars
    rrule_pattern: str


class BillingPlanCreated(ServiceModel):
    id: int
