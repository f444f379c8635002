"""Where a sale stands: the states the journal stores."""

from __future__ import annotations

import enum


class SaleState(enum.StrEnum):
    """Where a sale stands; the journal stores these values."""

    STARTED = "started"
    READING_CARD = "reading_card"
    AUTHORIZING = "authorizing"
    CHARGING = "charging"
    DISPENSING = "dispensing"
    CAPTURING = "capturing"
    REVERSING = "reversing"  # void or refund under way
    ENROLLING = "enrolling"
    # a money call's answer was lost and reporting shows no charge yet: the service may still
    # answer it, so the sale looks again until the call's deadline (the journal's answer_by)
    UNRESOLVED = "unresolved"
    COMPLETED = "completed"  # paid and dispensed (or enrolled)
    DECLINED = "declined"  # no money moved
    CANCELLED = "cancelled"  # no money moved
    FAILED = "failed"  # no money moved (device fault, expiry, error before a charge)
    REVERSED = "reversed"  # money moved and was given back
    ATTENTION = "attention"  # could not be decided: a person must look

    @property
    def final(self) -> bool:
        return self in _FINAL


_FINAL = frozenset(
    {
        SaleState.COMPLETED,
        SaleState.DECLINED,
        SaleState.CANCELLED,
        SaleState.FAILED,
        SaleState.REVERSED,
        SaleState.ATTENTION,
    }
)
