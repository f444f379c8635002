"""Reporting: transactions, deposits, chargebacks, adjustments, the ORDS page and typed filters.

Reporting sends amounts as JSON numbers in dollars. They are turned into exact ``Decimal`` dollars
through ``kiosk_agent.money`` on the way in (never kept as floats), and every record has an
``amount_cents`` for arithmetic.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Generic, NamedTuple, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from kiosk_agent.money import reported_dollars_to_cents
from kiosk_agent.service.models.common import Dollars, ServiceModel, Tolerant

__all__ = [
    "Adjustment",
    "AdjustmentFilter",
    "Chargeback",
    "ChargebackFilter",
    "ChargebackStatus",
    "Deposit",
    "DepositFilter",
    "Page",
    "PageInfo",
    "PageLink",
    "QueryFilter",
    "ReportKind",
    "ReportRecord",
    "TransStatus",
    "Transaction",
    "TransactionFilter",
]


class ReportRecord(ServiceModel):
    """What every reporting record has: an amount in dollars, exact."""

    amount: Dollars

    @property
    def amount_cents(self) -> int:
        return reported_dollars_to_cents(self.amount)


ItemT = TypeVar("ItemT")


def _id_text(value: object) -> object:
    # The interface does not type these ids; services send numbers or text. Kept as text.
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


RecordId = Annotated[str, BeforeValidator(_id_text)]


class TransStatus(enum.IntEnum):
    """``trans_status_id`` of a reported transaction."""

    AUTHORIZED = 1
    CAPTURED = 2
    SETTLED = 3
    VOIDED = 4
    REFUND = 5  # the refund's own row
    DECLINED = 6
    RETRY = 7
    PARTIALLY_REFUNDED = 8
    REFUNDED = 9

    @classmethod
    def parse(cls, text: str) -> TransStatus:
        """``"3"``, ``"settled"`` or ``"SETTLED"`` -> SETTLED."""
        text = text.strip()
        if text.isdigit():
            try:
                return cls(int(text))
            except ValueError:
                pass
        else:
            try:
                return cls[text.upper().replace("-", "_").replace(" ", "_")]
            except KeyError:
                pass
        known = ", ".join(f"{s.value}={s.name.lower()}" for s in cls)
        raise ValueError(f"unknown transaction status {text!r} (known: {known})")


class Transaction(ReportRecord):
    trans_id: str
    mid: str | None = None
    order_id: str | None = None
    trans_date: datetime | None = None
    settlement_date: datetime | None = None
    trans_status_id: int | None = None
    result: str | None = None
    resp_code: str | None = None
    resp_text: str | None = None
    auth_code: str | None = None
    avs_resp: str | None = None
    cvv_resp: str | None = None
    account_token: str | None = None
    card_brand_id: int | None = None
    card_number: str | None = None  # masked by the service
    expiration: str | None = None
    name: str | None = None
    batch_id: str | None = None
    funded_batch_id: str | None = None
    funding_master_id: str | None = None
    related_trans_id: str | None = None
    terminal_id: str | None = None
    user_identifier: str | None = None
    vault_id: int | None = None
    # Interchange figures are rates and per-item fees, kept exact but not rounded to cents.
    interchange_per_item: Decimal | None = None
    interchange_rate: Decimal | None = None
    # Merchant-specific fields, free text set at charge time.
    custom_01: str | None = None
    custom_02: str | None = None
    custom_03: str | None = None
    custom_04: str | None = None
    custom_05: str | None = None
    custom_06: str | None = None
    custom_07: str | None = None
    custom_08: str | None = None
    custom_09: str | None = None
    custom_10: str | None = None

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # The account token stands in for the card: keep it out of reprs and so out of logs.
        return ((k, v) for k, v in super().__repr_args__() if k != "account_token")

    @property
    def status(self) -> TransStatus | None:
        if self.trans_status_id is None:
            return None
        try:
            return TransStatus(self.trans_status_id)
        except ValueError:
            return None


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


class PageLink(ServiceModel):
    rel: str
    href: str


class PageInfo(ServiceModel):
    """The paging fields of an ORDS page, read without its items.

    A few milliseconds for a page of a thousand records (the records cost ten times that): read
    first, they say which page comes next, so it is asked for before this one's records are
    built.
    """

    # Ignored, not kept: keeping the items as extras would build them all, the cost saved here.
    model_config = ConfigDict(extra="ignore")

    has_more: bool = Field(default=False, alias="hasMore")
    limit: int | None = None
    offset: int | None = None
    count: int | None = None
    links: list[PageLink] = Field(default_factory=list)

    @property
    def next_href(self) -> str | None:
        return next((link.href for link in self.links if link.rel == "next"), None)


class Page(PageInfo, Generic[ItemT]):
    """One ORDS page of ``ItemT`` records (``Page[Transaction]``), validated in one pass."""

    # Cache only keys while parsing: values (ids, dates) are unique per record, and caching
    # them would grow the parser's cache with the pull instead of keeping memory flat.
    model_config = ConfigDict(extra="allow", cache_strings="keys")

    items: list[ItemT]


def _q_value(value: object) -> str:
    if isinstance(value, Decimal):
        return str(value)  # a JSON number, written exactly (json.dumps would need a float)
    if isinstance(value, enum.Enum):
        value = value.value
    return json.dumps(value)


class QueryFilter(BaseModel):
    """Attribute equalities, combined with AND, serialised to the ORDS ``q`` JSON object.

    Subclasses declare only attributes the service really filters on, so a typo is a
    validation error here instead of a 400 from the service.
    """

    # hide_input_in_errors: like the service models, a refused value is never echoed back.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    def to_q(self) -> str | None:
        """The ``q`` text, or None when no attribute is set (no filter at all)."""
        fields = self.model_dump(exclude_none=True)
        if not fields:
            return None
        return "{" + ",".join(f"{json.dumps(k)}:{_q_value(v)}" for k, v in fields.items()) + "}"


class TransactionFilter(QueryFilter):
    mid: str | None = None
    trans_id: str | None = None
    order_id: str | None = None
    trans_status_id: TransStatus | None = None
    # Dollars, compared exactly; pass a Decimal or a two-place string such as "12.50".
    amount: Decimal | None = None
    batch_id: str | None = None
    funded_batch_id: str | None = None
    funding_master_id: str | None = None
    related_trans_id: str | None = None
    terminal_id: str | None = None
    auth_code: str | None = None
    result: str | None = None
    user_identifier: str | None = None
    custom_01: str | None = None
    custom_02: str | None = None
    custom_03: str | None = None
    custom_04: str | None = None
    custom_05: str | None = None
    custom_06: str | None = None
    custom_07: str | None = None
    custom_08: str | None = None
    custom_09: str | None = None
    custom_10: str | None = None


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
