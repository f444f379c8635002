"""Reporting against the simulator: ORDS pages streamed into typed records, q filters, memory."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import tracemalloc
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pydantic import ValidationError

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.service.client import ServiceClient, ServiceSettings
from kiosk_agent.service.errors import BadRequestError, InvalidResponseError
from kiosk_agent.service.models.payments import ChargeRequest
from kiosk_agent.service.models.reporting import (
    Page,
    PageLink,
    Transaction,
    TransactionFilter,
    TransStatus,
)
from kiosk_agent.service.models.reports import (
    Adjustment,
    AdjustmentFilter,
    Chargeback,
    ChargebackFilter,
    ChargebackStatus,
    Deposit,
    DepositFilter,
    ReportKind,
)
from kiosk_agent.service.redirects import service_session
from kiosk_agent.service.reporting import REPORTING_PREFIX, _next_params

from .scripted_server import ScriptedServer, json_reply


@pytest.fixture
async def traced(sim_settings: ServiceSettings) -> AsyncIterator[tuple[ServiceClient, list[str]]]:
    """A client on ``sim`` whose session records every reporting URL it asks for."""
    urls: list[str] = []

    async def on_start(_s: Any, _c: Any, params: aiohttp.TraceRequestStartParams) -> None:
        if REPORTING_PREFIX in params.url.path:
            urls.append(str(params.url))

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    async with (
        service_session(trace_configs=[trace]) as session,
        ServiceClient(sim_settings, session=session) as svc,
    ):
        yield svc, urls


async def collect(records: AsyncIterator[Any]) -> list[Any]:
    return [record async for record in records]


async def test_transactions_stream_across_pages_in_the_services_order(
    traced: tuple[ServiceClient, list[str]],
) -> None:
    svc, urls = traced
    whole = await collect(svc.reporting.transactions(page_size=1000))
    urls.clear()
    paged = await collect(svc.reporting.transactions(page_size=30))
    assert len(whole) >= 200
    assert [t.trans_id for t in paged] == [t.trans_id for t in whole]
    assert len({t.trans_id for t in paged}) == len(paged)
    assert len(urls) == -(-len(whole) // 30)  # one request per page, no extra
    first = paged[0]
    assert isinstance(first, Transaction)
    assert isinstance(first.amount, Decimal)
    assert first.amount_cents == int(first.amount * 100)
    assert first.trans_date is not None
    assert first.trans_date.tzinfo is not None


async def test_a_limit_stops_early_and_never_asks_for_more(
    traced: tuple[ServiceClient, list[str]],
) -> None:
    svc, urls = traced
    got = await collect(svc.reporting.transactions(page_size=20, limit=45))
    assert len(got) == 45
    assert len(urls) == 3
    assert "limit=5" in urls[-1]  # the last page asks only for what is left
    assert await collect(svc.reporting.transactions(limit=0)) == []


async def test_the_next_page_travels_while_this_one_is_read_and_never_more(
    traced: tuple[ServiceClient, list[str]],
) -> None:
    svc, urls = traced
    page_size, pages = 10, 5
    asked_on_arrival: list[int] = []
    asked_while_reading: list[int] = []
    read = 0
    async for _ in svc.reporting.transactions(page_size=page_size, limit=page_size * pages):
        if read % page_size == 0:  # the first item of each page
            asked_on_arrival.append(len(urls))  # the next page went out before this one's build
            await asyncio.sleep(0.05)  # dawdle: time enough for a greedy reader to run ahead
            asked_while_reading.append(len(urls))
        read += 1
    assert read == page_size * pages
    # Reading page n, pages up to n + 1 have been asked for: one ahead, never two.
    assert asked_on_arrival == asked_while_reading == [2, 3, 4, 5, 5]
    assert len(urls) == pages


async def test_a_reader_that_stops_early_leaves_no_page_in_flight(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    release = asyncio.Event()

    async def slow_page(request: web.Request) -> web.StreamResponse:
        await release.wait()  # the second page is still on its way when the reader leaves
        return web.json_response({"items": [], "hasMore": False})

    first = {"items": [{"trans_id": "1", "amount": 1.5}], "hasMore": True, "count": 1}
    scripted.script("POST", "/ords/sprint/oauth/token", json_reply({"access_token": "t"}))
    scripted.script("GET", f"{REPORTING_PREFIX}/transactions", json_reply(first), slow_page)
    try:
        async with ServiceClient(scripted_settings) as svc:
            records = svc.reporting.transactions(page_size=1)
            async with contextlib.aclosing(records):
                async for _ in records:
                    while scripted.count("GET", f"{REPORTING_PREFIX}/transactions") < 2:
                        await asyncio.sleep(0.005)
                    in_flight = [t for t in asyncio.all_tasks() if "_fetch" in repr(t)]
                    break
            assert len(in_flight) == 1
            await asyncio.wait(in_flight, timeout=2)
            assert in_flight[0].cancelled()
    finally:
        release.set()


async def test_pages_without_count_or_links_follow_by_their_items(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    def page(*ids: str, more: bool) -> dict[str, Any]:
        return {"items": [{"trans_id": i, "amount": "1.00"} for i in ids], "hasMore": more}

    path = f"{REPORTING_PREFIX}/transactions"
    scripted.script("POST", "/ords/sprint/oauth/token", json_reply({"access_token": "t"}))
    scripted.script("GET", path, json_reply(page("1", "2", more=True)),
                    json_reply(page("3", more=True)), json_reply(page(more=True)))
    got: list[str] = []

    async def read_all(svc: ServiceClient) -> None:
        async for transaction in svc.reporting.transactions(page_size=2):
            got.append(transaction.trans_id)

    async with ServiceClient(scripted_settings) as svc:
        with pytest.raises(InvalidResponseError, match="empty page") as caught:
            await read_all(svc)
    assert got == ["1", "2", "3"]  # every record before the broken page is delivered
    assert caught.value.field == "hasMore"
    offsets = [r.query["offset"] for r in scripted.requests if r.path == path]
    assert offsets == ["0", "2", "3"]


async def test_filters_travel_as_q_and_every_page_keeps_them(
    traced: tuple[ServiceClient, list[str]],
) -> None:
    svc, urls = traced
    settled = await collect(
        svc.reporting.transactions(TransactionFilter(trans_status_id=TransStatus.SETTLED),
                                   page_size=10)
    )
    assert settled
    assert {t.status for t in settled} == {TransStatus.SETTLED}
    assert len(urls) > 1
    assert all("trans_status_id" in url for url in urls)

    one = settled[0]
    by_order = await collect(svc.reporting.transactions(TransactionFilter(order_id=one.order_id)))
    assert [t.trans_id for t in by_order] == [one.trans_id]
    by_amount = await collect(
        svc.reporting.transactions(TransactionFilter(mid=one.mid, amount=one.amount))
    )
    assert one.trans_id in {t.trans_id for t in by_amount}
    assert {t.amount for t in by_amount} == {one.amount}
    tagged = next(t for t in settled if t.custom_01)
    by_tag = await collect(
        svc.reporting.transactions(TransactionFilter(custom_01=tagged.custom_01))
    )
    assert tagged.trans_id in {t.trans_id for t in by_tag}
    assert {t.custom_01 for t in by_tag} == {tagged.custom_01}


def test_filters_serialise_exactly_and_refuse_unknown_attributes() -> None:
    assert TransactionFilter().to_q() is None
    assert (
        TransactionFilter(mid="999000000001", amount=Decimal("12.10"), trans_status_id=3).to_q()
        == '{"mid":"999000000001","trans_status_id":3,"amount":12.10}'
    )
    assert ChargebackFilter(status="OPEN").to_q() == '{"status":"OPEN"}'
    with pytest.raises(ValidationError, match="order_number"):
        TransactionFilter(order_number="x")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        ChargebackFilter(status="MAYBE")


@pytest.mark.parametrize("kind", list(ReportKind))
def test_each_kind_filters_on_its_records_own_fields(kind: ReportKind) -> None:
    """A filter attribute is a field of the record it filters, and --since/--until read one."""
    record_fields = kind.model.model_fields
    assert set(kind.filter.model_fields) <= set(record_fields)
    assert kind.date_field in record_fields


async def test_a_charge_made_now_is_found_by_its_order_id(service: ServiceClient) -> None:
    """The reconcile path after a lost answer: look the order up in reporting."""
    result = await service.payments.charge(
        ChargeRequest(mid=service.settings.mid, amount=1234, account_token="tok_4111111111111111",
                      expiration="1230", order_id="cli-reconcile-1")
    )
    lookup = TransactionFilter(order_id="cli-reconcile-1")
    found = await collect(service.reporting.transactions(lookup))
    assert [t.trans_id for t in found] == [result.trans_id]
    assert found[0].amount == Decimal("12.34")
    assert found[0].amount_cents == 1234


async def test_deposits_chargebacks_and_adjustments_are_typed(service: ServiceClient) -> None:
    deposits = await collect(service.reporting.deposits(page_size=50))
    chargebacks = await collect(service.reporting.chargebacks(page_size=5))
    adjustments = await collect(service.reporting.adjustments(page_size=5))
    assert deposits
    assert chargebacks
    assert adjustments
    assert all(isinstance(d, Deposit) and d.deposit_date is not None for d in deposits)
    assert all(isinstance(c, Chargeback) for c in chargebacks)
    assert all(isinstance(a, Adjustment) for a in adjustments)
    assert all(isinstance(r.amount_cents, int) for r in (*deposits, *chargebacks, *adjustments))

    open_cases = await collect(
        service.reporting.chargebacks(ChargebackFilter(status=ChargebackStatus.OPEN))
    )
    assert {c.status for c in open_cases} <= {ChargebackStatus.OPEN}
    one = deposits[0]
    again = await collect(service.reporting.deposits(DepositFilter(deposit_id=one.deposit_id)))
    assert [d.amount for d in again] == [one.amount]
    fees = await collect(service.reporting.adjustments(AdjustmentFilter(category="chargeback_fee")))
    assert all(a.category == "chargeback_fee" for a in fees)


async def test_records_by_kind_checks_the_filter_type(service: ServiceClient) -> None:
    kinds = {kind: await collect(service.reporting.records(kind, limit=3)) for kind in ReportKind}
    assert len(kinds[ReportKind.TRANSACTIONS]) == 3
    assert all(1 <= len(records) <= 3 for records in kinds.values())
    assert isinstance(kinds[ReportKind.CHARGEBACKS][0], Chargeback)
    with pytest.raises(TypeError, match="DepositFilter"):
        service.reporting.records(ReportKind.DEPOSITS, TransactionFilter(mid="1"))


async def test_the_service_refusing_a_filter_is_a_bad_request(service: ServiceClient) -> None:
    # A filter model only names real attributes; a raw q the service rejects still surfaces.
    from kiosk_agent.service.reporting import iterate_collection

    records = iterate_collection(
        service.transport, f"{REPORTING_PREFIX}/transactions", Transaction, q='{"colour":"red"}'
    )
    with pytest.raises(BadRequestError, match="colour"):
        await collect(records)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"items": [{"trans_id": "1", "amount": "lots"}], "hasMore": false}', "items.0.amount"),
        (b'{"items": [{"amount": 1.5}], "hasMore": false}', "items.0.trans_id"),
        (b'{"items": {"trans_id": "1"}, "hasMore": false}', "items"),
        (b"<html><body>502 Bad Gateway</body></html>", "<body>"),
        (b'{"items": [{"trans_id": "1", "amount": 1.5}', "<body>"),
    ],
)
def test_a_bad_page_names_the_field(body: bytes, field: str) -> None:
    from kiosk_agent.service.parsing import parse_json

    with pytest.raises(InvalidResponseError) as caught:
        parse_json(Page[Transaction], body, what="transactions page")
    assert caught.value.field == field
    assert field in str(caught.value)
    assert "lots" not in str(caught.value)  # the refused value is never echoed


def test_a_next_link_without_an_offset_is_an_invalid_answer() -> None:
    page: Page[Transaction] = Page[Transaction](
        items=[], hasMore=True, links=[PageLink(rel="next", href="http://x/t?limit=5")]
    )
    with pytest.raises(InvalidResponseError, match="offset") as caught:
        _next_params(page, 5, {"limit": 5, "offset": 0})
    assert caught.value.field == "links"


async def test_memory_stays_flat_however_many_pages(sim_factory: Any) -> None:
    sim = await sim_factory(seed=2, transactions=3000)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as svc:

        async def peak_while_reading(limit: int) -> int:
            gc.collect()
            tracemalloc.reset_peak()
            count = 0
            async for _ in svc.reporting.transactions(page_size=100, limit=limit):
                count += 1
            assert count == limit
            return tracemalloc.get_traced_memory()[1]

        tracemalloc.start()
        try:
            await peak_while_reading(100)  # warm the OAuth token and the page model
            few_pages = await peak_while_reading(300)
            many_pages = await peak_while_reading(3000)
        finally:
            tracemalloc.stop()
    # Ten times the pages, about the same peak: only one page is ever held.
    assert many_pages < few_pages * 1.3, (few_pages, many_pages)


@pytest.mark.parametrize("amount", [1e308, 10**40, "1e999999", -1e300])
async def test_an_amount_no_money_can_be_is_refused_naming_it(
    scripted: ScriptedServer, scripted_settings: ServiceSettings, amount: Any
) -> None:
    """Reporting answering 1e308 dollars: refused when read, naming ``items.0.amount``, never
    an arithmetic error later where its cents are asked for (the reconciler's lookup)."""
    path = f"{REPORTING_PREFIX}/transactions"
    scripted.script("POST", "/ords/sprint/oauth/token", json_reply({"access_token": "t"}))
    scripted.script("GET", path, json_reply(
        {"items": [{"trans_id": "1", "amount": amount}], "hasMore": False}))
    async with ServiceClient(scripted_settings) as svc:
        with pytest.raises(InvalidResponseError) as caught:
            await collect(svc.reporting.transactions())
    assert caught.value.field == "items.0.amount"


def test_a_next_link_that_does_not_move_forward_is_an_invalid_answer() -> None:
    # A next link back at this page's offset (or before it) was followed as given: the same
    # page asked for again and again, a lookup in recovery or the charge check never ending.
    for offset in (0, 3):
        page: Page[Transaction] = Page[Transaction](items=[], hasMore=True, links=[
            PageLink(rel="next", href=f"http://x/t?limit=5&offset={offset}")])
        with pytest.raises(InvalidResponseError, match="forward") as caught:
            _next_params(page, 8, {"limit": 5, "offset": 3})
        assert caught.value.field == "links"


def test_a_next_link_keeps_the_filter_asked_for() -> None:
    # A next link whose q differs from the one asked for (none at all, another order id) was
    # followed as given: the next page held rows the question never asked about.
    ours = '{"order_id":"KA3F9C0E12AB-9F3C0A77D21B4E551A2B3C4D"}'
    for theirs in ("", "&q=%7B%7D", "&q=%7B%22order_id%22%3A%22KA0%22%7D"):
        page: Page[Transaction] = Page[Transaction](items=[], hasMore=True, links=[
            PageLink(rel="next", href=f"http://x/t?limit=5&offset=5{theirs}")])
        following = _next_params(page, 5, {"limit": 5, "offset": 0, "q": ours})
        assert following["q"] == ours
        assert following["offset"] == "5"
