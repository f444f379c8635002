"""The reconciler's reading of reporting's statuses, kept without importing reporting's models."""

from __future__ import annotations

from kiosk_agent.sales.reconcile import _HELD, _REVERSED
from kiosk_agent.service.models.reporting import TransStatus


def test_held_and_reversed_are_reportings_statuses_by_name() -> None:
    assert frozenset({TransStatus.AUTHORIZED, TransStatus.CAPTURED, TransStatus.SETTLED}) == _HELD
    assert frozenset({TransStatus.VOIDED, TransStatus.REFUNDED}) == _REVERSED
