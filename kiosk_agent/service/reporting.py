"""Reporting: transactions, deposits, chargebacks and adjustments as async iterators.

Every collection is an ORDS list (``items``, ``hasMore``, ``links``). The iterators walk it a page
at a time: a page's paging fields are read first (cheap), the next page is asked for, and only then
are this page's records built and yielded one by one, so the service's time overlaps ours. At most
one page is in flight beside the one being read, so memory stays flat however many pages a pull
spans. The next page is the page's ``links`` ``rel: next`` when present, else ``offset + count``
while ``hasMore`` says so.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel

from kiosk_agent.redact import redact
from kiosk_agent.service.errors import InvalidResponseError
from kiosk_agent.service.models.reporting import (
    Page,
    PageInfo,
    QueryFilter,
    ReportRecord,
    Transaction,
    TransactionFilter,
)
from kiosk_agent.service.parsing import parse_json
from kiosk_agent.service.transport import Auth, MidPlacement, Transport

if TYPE_CHECKING:
    # a person's reports, imported when one is pulled: a running agent reads transactions only
    from kiosk_agent.service.models.reports import (
        Adjustment,
        AdjustmentFilter,
        Chargeback,
        ChargebackFilter,
        Deposit,
        DepositFilter,
        ReportKind,
    )

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

    The next page is asked for as soon as this one's paging fields are read, so the service
    serves it while this page's records are built and consumed; never more than that one page
    ahead, so memory stays flat. ``limit`` stops after that many items and never asks for more
    than it needs.
    """
    check_page_size(page_size)
    if limit is not None and limit <= 0:
        return
    pages = _PageFetcher(transport, path, model)
    params: dict[str, str | int] = {"offset": 0, "limit": _page_limit(page_size, limit)}
    if q is not None:
        params["q"] = q
    ahead: asyncio.Task[_RawPage] | None = pages.start(params)
    remaining = limit
    try:
        while ahead is not None:
            raw = await ahead
            ahead = None
            info = raw.info()
            page: Page[M] | None = None
            if info.count is None:  # only the items can tell how many there are
                page = raw.parse(pages.page_model)
            count = len(page.items) if page is not None else info.count or 0
            left = None if remaining is None else remaining - count
            broken: InvalidResponseError | None = None
            if info.has_more and (left is None or left > 0):
                try:
                    params = _following(info, count, path, params)
                except InvalidResponseError as exc:
                    broken = exc  # raised once this page's items are out
                else:
                    params["limit"] = _page_limit(page_size, left)
                    ahead = pages.start(params)  # served while this page is built and read
                    await asyncio.sleep(0)  # let it go out before the CPU-bound build below
            if page is None:
                page = raw.parse(pages.page_model)
            del raw  # the bytes, once the records are built
            for item in itertools.islice(page.items, remaining):
                yield item
            if broken is not None:
                raise broken
            if remaining is not None:
                remaining -= min(remaining, len(page.items))
                if remaining == 0:
                    return  # a page in flight (its count was wrong) is dropped below
            del page  # this page and the one in flight: never more in memory
    finally:
        if ahead is not None:  # the caller stopped early: drop the page it will not read
            ahead.cancel()
            ahead.add_done_callback(_discard)


async def within(
    records: AsyncIterator[M],
    field: str,
    since: dt.datetime | None,
    until: dt.datetime | None,
    *,
    limit: int | None = None,
    scanned: Callable[[int], object] | None = None,
) -> AsyncIterator[M]:
    """The records whose ``field`` is at or after ``since`` and before ``until`` (a record
    without it is left out), at most ``limit`` of them. The service's ``q`` filters equalities
    only, so a time window is applied on the stream: the command line's ``report --since`` and
    the admin API's ``/api/reports/{kind}?since=`` read it here. ``scanned(n)`` is told each
    record read."""
    count = matched = 0
    try:
        async for record in records:
            count += 1
            if scanned is not None:
                scanned(count)
            moment = getattr(record, field, None)
            if moment is None or (since is not None and moment < since):
                continue
            if until is not None and moment >= until:
                continue
            yield record
            matched += 1
            if limit is not None and matched >= limit:
                return
    finally:  # left early (a limit, an error): no prefetched page stays in flight
        aclose = getattr(records, "aclose", None)
        if aclose is not None:
            await aclose()


def _page_limit(page_size: int, remaining: int | None) -> int:
    return page_size if remaining is None else min(page_size, remaining)


def _following(
    info: PageInfo, count: int, path: str, params: dict[str, str | int]
) -> dict[str, str | int]:
    """The query of the page after one of ``count`` items that says more items remain."""
    if count == 0:
        raise InvalidResponseError(
            f"{path}: the service says more items remain but sent an empty page",
            field="hasMore",
        )
    return _next_params(info, int(params["offset"]) + count, params)


def _discard(task: asyncio.Task[Any]) -> None:
    # Retrieve the outcome of a page nobody will read, so asyncio does not log it as lost.
    if not task.cancelled():
        task.exception()


class _RawPage(NamedTuple):
    """A page's bytes as they came, read in two steps: the paging fields, then the records."""

    body: bytes
    what: str

    def info(self) -> PageInfo:
        return parse_json(PageInfo, self.body, what=self.what)

    def parse(self, page_model: type[Page[M]]) -> Page[M]:
        return parse_json(page_model, self.body, what=self.what)


class _PageFetcher(Generic[M]):
    """Starts the fetch of one page of a collection as a task (the lookahead)."""

    def __init__(self, transport: Transport, path: str, model: type[M]) -> None:
        self._transport = transport
        self._path = path
        self._url = transport.reporting_url(path)
        self.page_model: type[Page[M]] = Page[model]  # type: ignore[valid-type]

    def start(self, params: dict[str, str | int]) -> asyncio.Task[_RawPage]:
        return asyncio.create_task(self._fetch(dict(params)))

    async def _fetch(self, params: dict[str, str | int]) -> _RawPage:
        what = f"{self._path} at offset {params['offset']}"
        _status, body, _type = await self._transport.send(
            "GET",
            self._url,
            params=params,
            auth=Auth.OAUTH,
            mid=MidPlacement.NONE,
            rate_limited=False,
            what=what,
        )
        return _RawPage(body, what)


def _next_params(
    page: PageInfo, fallback_offset: int, current: dict[str, str | int]
) -> dict[str, str | int]:
    """The query of the next page: from ``links`` ``next`` when given, else the next offset."""
    href = page.next_href
    if href is None:
        return {**current, "offset": fallback_offset}
    query: dict[str, str | int] = dict(parse_qsl(urlsplit(href).query, keep_blank_values=True))
    offset = query.get("offset")
    if not isinstance(offset, str) or not offset.isdigit():
        raise InvalidResponseError(
            f"next link has no numeric offset: {redact(href)!r}", field="links"
        )
    if int(offset) <= int(current["offset"]):  # the same page again and again, never ending
        raise InvalidResponseError(
            f"next link does not move forward (offset {offset} after {current['offset']})",
            field="links",
        )
    # The filter is the one asked for, whatever the link says (rows of another question are
    # not this one's answer); the page size is the link's, else ours.
    if "q" in current:
        query["q"] = current["q"]
    else:
        query.pop("q", None)
    if "limit" in current and "limit" not in query:
        query["limit"] = current["limit"]
    return query


class CollectionClient:
    """What the reporting and boarding clients share: ORDS collections, filtered by ``q``."""

    def __init__(self, transport: Transport, *, page_size: int = DEFAULT_PAGE_SIZE) -> None:
        self._transport = transport
        self.page_size = check_page_size(page_size)

    def _collection(
        self,
        path: str,
        model: type[M],
        filters: QueryFilter | None,
        page_size: int | None,
        limit: int | None,
    ) -> AsyncIterator[M]:
        return iterate_collection(
            self._transport,
            path,
            model,
            q=filters.to_q() if filters is not None else None,
            page_size=page_size or self.page_size,
            limit=limit,
        )


class ReportingClient(CollectionClient):
    """The four reporting collections; every method returns an async iterator of typed records."""

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
        return self._typed(kind.value, kind.model, filters, page_size, limit)

    def transactions(
        self,
        filters: TransactionFilter | None = None,
        *,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Transaction]:
        return self._typed("transactions", Transaction, filters, page_size, limit)

    def deposits(
        self,
        filters: DepositFilter | None = None,
        *,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Deposit]:
        from kiosk_agent.service.models.reports import Deposit

        return self._typed("deposits", Deposit, filters, page_size, limit)

    def chargebacks(
        self,
        filters: ChargebackFilter | None = None,
        *,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Chargeback]:
        from kiosk_agent.service.models.reports import Chargeback

        return self._typed("chargebacks", Chargeback, filters, page_size, limit)

    def adjustments(
        self,
        filters: AdjustmentFilter | None = None,
        *,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Adjustment]:
        from kiosk_agent.service.models.reports import Adjustment

        return self._typed("adjustments", Adjustment, filters, page_size, limit)

    def _typed(
        self,
        collection: str,
        model: type[M],
        filters: QueryFilter | None,
        page_size: int | None,
        limit: int | None,
    ) -> AsyncIterator[M]:
        path = f"{REPORTING_PREFIX}/{collection}"
        return self._collection(path, model, filters, page_size, limit)
