"""What a person pulls as a report: the four kinds (``ReportKind``, the command line's and the
admin API's entry), and the records and filters of deposits, chargebacks and adjustments.

Transactions and the paging live in ``reporting``: a running agent reads those (its charge
checks) and never builds these.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime
from typing import NamedTuple

from kiosk_agent.service.models.common import Tolerant
from kiosk_agent.service.models.reporting import (
    QueryFilter,
    RecordId,
    ReportRecord,
    Transaction,
    TransactionFilter,
    TransStatus,
)

__all__ = [
    "Adjustment",
    "AdjustmentFilter",
    "Chargeback",
    "ChargebackFilter",
    "ChargebackStatus",
    "Deposit",
    "DepositFilter",
    "ReportKind",
]


class Deposit(ReportRecord):
    deposit_id: RecordId
    mid: str | None = None
    deposit_date: datetime | None = None
    transaction_count: int | None = None
    batch_id: str | None = None
    funding_master_id: str | None = None
    status: str | None = None


class ChargebackStatus(enum.StrEnum):
    OPEN = "OPEN"
    WON = "WON"
    LOST = "LOST"


class Chargeback(ReportRecord):
    chargeback_id: RecordId
    mid: str | None = None
    trans_id: str | None = None
    case_number: str | None = None
    reason_code: str | None = None
    reason_text: str | None = None
    chargeback_date: datetime | None = None
    status: Tolerant[ChargebackStatus] | None = None
    card_brand_id: int | None = None
    card_number: str | None = None  # masked by the service


class Adjustment(ReportRecord):
    adjustment_id: RecordId
    mid: str | None = None
    adjustment_date: datetime | None = None
    category: str | None = None
    description: str | None = None
    funding_master_id: str | None = None


class DepositFilter(QueryFilter):
    mid: str | None = None
    deposit_id: str | None = None
    batch_id: str | None = None
    funding_master_id: str | None = None
    status: str | None = None


class ChargebackFilter(QueryFilter):
    mid: str | None = None
    chargeback_id: str | None = None
    trans_id: str | None = None
    case_number: str | None = None
    reason_code: str | None = None
    status: ChargebackStatus | None = None


class AdjustmentFilter(QueryFilter):
    mid: str | None = None
    adjustment_id: str | None = None
    category: str | None = None
    funding_master_id: str | None = None


class ReportKind(enum.StrEnum):
    """The four reporting collections, by their path segment."""

    TRANSACTIONS = "transactions"
    DEPOSITS = "deposits"
    CHARGEBACKS = "chargebacks"
    ADJUSTMENTS = "adjustments"

    @property
    def model(self) -> type[ReportRecord]:
        return _KIND_SHAPES[self].model

    @property
    def filter(self) -> type[QueryFilter]:
        return _KIND_SHAPES[self].filter

    @property
    def date_field(self) -> str:
        """The record's date that the command line's --since/--until compare against."""
        return _KIND_SHAPES[self].date_field

    def text_filter(self, fields: Mapping[str, str]) -> dict[str, object]:
        """Filter fields as people write them (the command line's options, the admin API's
        query) in the service's terms: a transaction's ``status`` by name or id (``settled``,
        ``3``) becomes its ``trans_status_id``; any other ``status`` is taken in any case
        (``funded``). Raises ``ValueError`` naming an unknown transaction status."""
        values: dict[str, object] = dict(fields)
        if "status" in values:
            status = str(values.pop("status"))
            if self is ReportKind.TRANSACTIONS:
                values["trans_status_id"] = TransStatus.parse(status)
            else:
                values["status"] = status.strip().upper()
        return values


class _KindShape(NamedTuple):
    model: type[ReportRecord]
    filter: type[QueryFilter]
    date_field: str


_KIND_SHAPES: dict[ReportKind, _KindShape] = {
    ReportKind.TRANSACTIONS: _KindShape(Transaction, TransactionFilter, "trans_date"),
    ReportKind.DEPOSITS: _KindShape(Deposit, DepositFilter, "deposit_date"),
    ReportKind.CHARGEBACKS: _KindShape(Chargeback, ChargebackFilter, "chargeback_date"),
    ReportKind.ADJUSTMENTS: _KindShape(Adjustment, AdjustmentFilter, "adjustment_date"),
}
