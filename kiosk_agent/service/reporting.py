"""Reporting: transactions, deposits, chargebacks and adjustments as async iterators.

Every collection is an ORDS list (``items``, ``hasMore``, ``links``). The iterators walk it one page
at a time: a page is fetched, its items are typed and yielded one by one, and only then is the next
page asked for, so memory stays flat however many pages a pull spans. The next page is the page's
``links`` ``rel: next`` when present, else ``offset + count`` while ``hasMore`` says so.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypeVar
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel

from kiosk_agent.service.errors import InvalidResponseError
from kiosk_agent.service.models.reporting import (
    Adjustment,
    AdjustmentFilter,
    Chargeback,
    ChargebackFilter,
    Deposit,
    DepositFilter,
    Page,
    QueryFilter,
    ReportKind,
    ReportRecord,
    Transaction,
    TransactionFilter,
)
from kiosk_agent.service.transport import Auth, MidPlacement, Transport

REPORTING_PREFIX = "/ords/sprint/api/3p/v1"
DEFAULT_PAGE_SIZE = 500
MAX_PAGE_SIZE = 1000  # the service's own cap on ``limit``

M = TypeVar("M", bound=BaseModel)


def check_page_size(page_size: int) -> int:
    if not 1 <= page_size <= MAX_PAGE_SIZE:
        raise ValueError(f"page_size must be 1..{MAX_PAGE_SIZE}, got {page_size}")
    return page_size


async def iterate_collection(
    transport: Transport,
    path: str,
    model: type[M],
    *,
    q: str | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
    limit: int | None = None,
) -> AsyncIterator[M]:
    """Yield the items of the ORDS collection at ``path`` (on the reporting address) as ``model``.

    One page is in memory at a time. ``limit`` stops after that many items and never asks for
    more than it needs.
    """
    check_page_size(page_size)
    if limit is not None and limit <= 0:
        return
    url = transport.reporting_url(path)
    page_model = Page[model]  # type: ignore[valid-type]
    params: dict[str, str | int] = {"offset": 0}
    if q is not None:
        params["q"] = q
    remaining = limit
    while True:
        params["limit"] = min(page_size, remaining) if remaining is not None else page_size
        page: Page[M] = await transport.request_model(
            page_model,
            "GET",
            url,
            params=params,
            auth=Auth.OAUTH,
            mid=MidPlacement.NONE,
            rate_limited=False,
            what=f"{path} at offset {params['offset']}",
        )
        for item in page.items:
            yield item
            if remaining is not None:
                remaining -= 1
                if remaining == 0:
                    return
        if not page.has_more:
            return
        count = page.count if page.count is not None else len(page.items)
        if count == 0:
            raise InvalidResponseError(
                f"{path}: the service says more items remain but sent an empty page",
                field="hasMore",
            )
        params = _next_params(page, int(params["offset"]) + count, params)
        del page  # one page in memory at a time


def _next_params(
    page: Page[M], fallback_offset: int, current: dict[str, str | int]
) -> dict[str, str | int]:
    """The query of the next page: from ``links`` ``next`` when given, else the next offset."""
    href = page.next_href
    if href is None:
        return {**current, "offset": fallback_offset}
    query: dict[str, str | int] = dict(parse_qsl(urlsplit(href).query, keep_blank_values=True))
    offset = query.get("offset")
    if not isinstance(offset, str) or not offset.isdigit():
        raise InvalidResponseError(f"next link has no numeric offset: {href!r}", field="links")
    # The service's link keeps the filter and the page size; keep ours where it does not.
    for key in ("q", "limit"):
        if key in current and key not in query:
            query[key] = current[key]
    return query


class ReportingClient:
    """The four reporting collections; every method returns an async iterator of typed records."""

    def __init__(self, transport: Transport, *, page_size: int = DEFAULT_PAGE_SIZE) -> None:
        self._transport = transport
        self.page_size = check_page_size(page_size)

    def records(
        self,
        kind: ReportKind,
        filters: QueryFilter | None = None,
        *,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[ReportRecord]:
        """Any collection by kind (the command line's entry); ``filters`` must match the kind."""
        if filters is not None and not isinstance(filters, kind.filter):
            wanted, given = kind.filter.__name__, type(filters).__name__
            raise TypeError(f"{kind.value} takes a {wanted}, not {given}")
        return self._typed(kind, kind.model, filters, page_size, limit)

    def transactions(
        self,
        filters: TransactionFilter | None = None,
        *,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Transaction]:
        return self._typed(ReportKind.TRANSACTIONS, Transaction, filters, page_size, limit)

    def deposits(
        self,
        filters: DepositFilter | None = None,
        *,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Deposit]:
        return self._typed(ReportKind.DEPOSITS, Deposit, filters, page_size, limit)

    def chargebacks(
        self,
        filters: ChargebackFilter | None = None,
        *,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Chargeback]:
        return self._typed(ReportKind.CHARGEBACKS, Chargeback, filters, page_size, limit)

    def adjustments(
        self,
        filters: AdjustmentFilter | None = None,
        *,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Adjustment]:
        return self._typed(ReportKind.ADJUSTMENTS, Adjustment, filters, page_size, limit)

    def _typed(
        self,
        kind: ReportKind,
        model: type[M],
        filters: QueryFilter | None,
        page_size: int | None,
        limit: int | None,
    ) -> AsyncIterator[M]:
        return iterate_collection(
            self._transport,
            f"{REPORTING_PREFIX}/{kind.value}",
            model,
            q=filters.to_q() if filters is not None else None,
            page_size=page_size or self.page_size,
            limit=limit,
        )
