"""Reporting: transactions, the ORDS page and the filters, which a running agent reads (its
charge checks). Deposits, chargebacks, adjustments and the report kinds a person pulls are in
``reports``, imported on use.

Reporting sends amounts as JSON numbers in dollars. They are turned into exact ``Decimal`` dollars
through ``kiosk_agent.money`` on the way in (never kept as floats), and every record has an
``amount_cents`` for arithmetic.
"""


import enum
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from kiosk_agent.money import reported_dollars_to_cents
from kiosk_agent.service.models.common import Dollars, ServiceModel, empty_list
from kiosk_agent.service.models.statuses import TransStatus

__all__ = [
    "Page",
    "PageInfo",
    "PageLink",
    "QueryFilter",
    "RecordId",
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
    def trans_at(self) -> float | None:
        """``trans_date`` in Unix seconds. A date-time sent without an offset is UTC, as every
        date-time of the interface (choices.md): read as the unit's local time it moved the
        charge check's window by the unit's offset, and could not be compared with a dated one."""
        moment = self.trans_date
        if moment is None:
            return None
        return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()

    @property
    def status(self) -> TransStatus | None:
        if self.trans_status_id is None:
            return None
        try:
            return TransStatus(self.trans_status_id)
        except ValueError:
            return None


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
    links: list[PageLink] = Field(default_factory=empty_list)

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
