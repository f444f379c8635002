"""Reporting: transactions, deposits, chargebacks and adjustments as ORDS collections.

``GET {reporting_url}/ords/sprint/api/3p/v1/<collection>`` with an OAuth bearer token answers
``{items, hasMore, limit, offset, count, links}`` (choices.md). ``q`` is a JSON object of attribute
equalities combined with AND; an unknown attribute or a ``q`` that is not a JSON object is a 400
naming it. Amounts are served as JSON numbers in dollars, written exactly from integer cents.
Pages are written by SQLite (:class:`~kiosk_agent.sim.store.JsonPager`): their items never pass
through Python objects.

Transactions and deposits live in the ledger (every charge, capture, void and refund made in the
simulator lands there); chargebacks and adjustments only exist in the seeded data set, so their
tables are kept here.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from aiohttp import web

from kiosk_agent.money import MoneyError
from kiosk_agent.sim import dataset
from kiosk_agent.sim.context import SimContext
from kiosk_agent.sim.http import bad_request, dumps, query_int
from kiosk_agent.sim.oauth import require_token
from kiosk_agent.sim.store import (
    JsonPage,
    JsonPager,
    Store,
    UnknownFieldError,
    record_json_sql,
    stored_filters,
)

API_PREFIX = "/ords/sprint/api/3p/v1"
DEFAULT_LIMIT = 25
MAX_LIMIT = 1000

CHARGEBACK_FIELDS = (
    "chargeback_id", "mid", "trans_id", "case_number", "amount", "reason_code", "reason_text",
    "chargeback_date", "status", "card_brand_id", "card_number",
)  # fmt: skip
ADJUSTMENT_FIELDS = (
    "adjustment_id", "mid", "amount", "adjustment_date", "category", "description",
    "funding_master_id",
)  # fmt: skip

_DDL = """
CREATE TABLE IF NOT EXISTS chargebacks (
    chargeback_id TEXT PRIMARY KEY,
    mid TEXT NOT NULL,
    trans_id TEXT NOT NULL,
    case_number TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    reason_code TEXT NOT NULL,
    reason_text TEXT NOT NULL,
    chargeback_date TEXT NOT NULL,
    status TEXT NOT NULL,
    card_brand_id INTEGER,
    card_number TEXT
);
CREATE INDEX IF NOT EXISTS chargebacks_mid ON chargebacks (mid);
CREATE TABLE IF NOT EXISTS adjustments (
    adjustment_id TEXT PRIMARY KEY,
    mid TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    adjustment_date TEXT NOT NULL,
    category TEXT NOT NULL,
    description TEXT NOT NULL,
    funding_master_id TEXT
);
CREATE INDEX IF NOT EXISTS adjustments_mid ON adjustments (mid);
"""


class ReportTables:
    """The chargeback and adjustment tables (amounts stored as integer cents)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        store.create(_DDL)
        self._pagers = {
            table: JsonPager(
                store, table, "rowid", _stored_columns(fields), record_json_sql(fields)
            )
            for table, fields in (
                ("chargebacks", CHARGEBACK_FIELDS),
                ("adjustments", ADJUSTMENT_FIELDS),
            )
        }

    def add_chargebacks(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self._store.executemany(_insert_sql("chargebacks", CHARGEBACK_FIELDS), rows)

    def add_adjustments(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self._store.executemany(_insert_sql("adjustments", ADJUSTMENT_FIELDS), rows)

    def query_chargebacks(
        self, filters: Mapping[str, Any], limit: int, offset: int
    ) -> tuple[list[dict[str, Any]], bool]:
        return self._page("chargebacks", CHARGEBACK_FIELDS, filters, limit, offset)

    def query_adjustments(
        self, filters: Mapping[str, Any], limit: int, offset: int
    ) -> tuple[list[dict[str, Any]], bool]:
        return self._page("adjustments", ADJUSTMENT_FIELDS, filters, limit, offset)

    def query_chargebacks_json(
        self, filters: Mapping[str, Any], limit: int, offset: int
    ) -> JsonPage:
        stored = stored_filters(filters, CHARGEBACK_FIELDS)
        return self._pagers["chargebacks"].page(stored, limit, offset)

    def query_adjustments_json(
        self, filters: Mapping[str, Any], limit: int, offset: int
    ) -> JsonPage:
        stored = stored_filters(filters, ADJUSTMENT_FIELDS)
        return self._pagers["adjustments"].page(stored, limit, offset)

    def _page(
        self,
        table: str,
        fields: tuple[str, ...],
        filters: Mapping[str, Any],
        limit: int,
        offset: int,
    ) -> tuple[list[dict[str, Any]], bool]:
        stored = stored_filters(filters, fields)
        return self._store.page(table, _stored_columns(fields), stored, limit, offset)


def _stored_columns(fields: tuple[str, ...]) -> frozenset[str]:
    return frozenset({*fields, "amount_cents"} - {"amount"})


def _insert_sql(table: str, fields: tuple[str, ...]) -> str:
    columns = [("amount_cents" if name == "amount" else name) for name in fields]
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) "  # noqa: S608
        f"VALUES ({', '.join(':' + name for name in columns)})"
    )


def parse_q(raw: str | None) -> dict[str, Any]:
    """The ``q`` parameter as attribute equalities, or a 400 saying what is wrong with it."""
    if raw is None or raw.strip() == "":
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as err:
        description = f"q is not JSON: {err.msg} at column {err.colno}"
        raise bad_request(description, "invalid_query") from None
    if not isinstance(parsed, dict):
        raise bad_request("q must be a JSON object of attribute equalities", "invalid_query")
    for name, value in parsed.items():
        if isinstance(value, (dict, list)):
            raise bad_request(
                f"q attribute {name!r} must be compared with a single value", "invalid_query"
            )
    return parsed


Query = Callable[[Mapping[str, Any], int, int], JsonPage]
Handler = Callable[[web.Request], Awaitable[web.Response]]


def ords_page(
    request: web.Request, items: list[dict[str, Any]], has_more: bool, limit: int, offset: int
) -> dict[str, Any]:
    """The ORDS collection body, with ``self`` and, while more remain, ``next`` links."""
    links = [{"rel": "self", "href": str(request.url)}]
    if has_more:
        next_url = request.url.update_query(limit=str(limit), offset=str(offset + limit))
        links.append({"rel": "next", "href": str(next_url)})
    return {
        "items": items,
        "hasMore": has_more,
        "limit": limit,
        "offset": offset,
        "count": len(items),
        "links": links,
    }


def ords_json(request: web.Request, page: JsonPage, limit: int, offset: int) -> str:
    """The ORDS collection body around items that SQLite already wrote as a JSON array."""
    body = ords_page(request, [], page.has_more, limit, offset)
    del body["items"]
    body["count"] = page.count
    # items first, as ords_page orders them, then the rest of the members
    return f'{{"items":{page.items},{dumps(body)[1:]}'


def page_params(request: web.Request) -> tuple[int, int]:
    limit = query_int(request, "limit", DEFAULT_LIMIT, minimum=1, maximum=MAX_LIMIT)
    offset = query_int(request, "offset", 0, minimum=0)
    return limit, offset


def collection(query: Callable[[SimContext], Query]) -> Handler:
    """An aiohttp handler serving one collection through ``query``."""

    async def handler(request: web.Request) -> web.Response:
        require_token(request)
        limit, offset = page_params(request)
        filters = parse_q(request.query.get("q"))
        ctx = request.app[CONTEXT_KEY]
        try:
            page = query(ctx)(filters, limit, offset)
        except UnknownFieldError as err:
            raise bad_request(f"q names unknown attribute {err.name!r}", "invalid_query") from None
        except MoneyError as err:
            raise bad_request(f"q attribute 'amount': {err}", "invalid_query") from None
        body = ords_json(request, page, limit, offset)
        return web.Response(text=body, content_type="application/json")

    return handler


CONTEXT_KEY = web.AppKey("sim_reporting_context", SimContext)


def report_tables(ctx: SimContext) -> ReportTables:
    """The one :class:`ReportTables` of a simulator (made on first use)."""
    tables = ctx.extras.get("report_tables")
    if not isinstance(tables, ReportTables):
        tables = ReportTables(ctx.store)
        ctx.extras["report_tables"] = tables
    return tables


def setup(app: web.Application, ctx: SimContext) -> None:
    tables = report_tables(ctx)
    app[CONTEXT_KEY] = ctx
    dataset.ensure_seeded(ctx, tables)
    routes = {
        "transactions": collection(lambda c: c.ledger.query_json),
        "deposits": collection(lambda c: c.ledger.query_deposits_json),
        "chargebacks": collection(lambda c: report_tables(c).query_chargebacks_json),
        "adjustments": collection(lambda c: report_tables(c).query_adjustments_json),
    }
    for name, handler in routes.items():
        app.router.add_get(f"{API_PREFIX}/{name}", handler)
