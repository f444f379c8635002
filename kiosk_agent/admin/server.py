"""The admin API: the device's face for remote operators (aiohttp, bearer tokens, loopback).

Routes (all need ``Authorization: Bearer <token>`` or the status page's session; POSTs need an
``admin`` token; the status page and its own routes are in page.py):

    GET  /api/status                     version, status, uptime, problems
    GET  /api/health                     the full health snapshot
    GET  /api/sales[?since&until&state&limit]    the local sales journal, newest first
    GET  /api/sales?format=csv|json[&...]        the same as `kiosk-agent sales --format csv|json`
    GET  /api/sales/{sale_id}            one sale with its steps
    GET  /api/reports/{kind}[?format=json|csv&limit&since&until&<filter>=...]   streamed
    GET  /api/audit[?format=json|csv&since]    the machine's books, as `kiosk-agent audit`
    GET  /api/terminals                  the service's terminal list
    POST /api/terminals/{device_id}/{ping|connect|disconnect|test-print}
    GET  /api/boarding/merchants         merchant states from the webhook receiver
    GET  /metrics                        Prometheus text format or OpenMetrics (Accept)

Tokens are compared in constant time, never logged, and come from the configuration through
``!secret``. Reports are streamed page by page from the service's async iterators, so a pull of
any size keeps one page in memory. A report never carries a card token (``account_token``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import hashlib
import hmac
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from kiosk_agent.admin.page import StatusPage, TokenGuesses
from kiosk_agent.admin.schema import ADMIN, ADMIN_SCHEMA
from kiosk_agent.export import (
    SALE_FORMATS,
    CsvExport,
    JsonExport,
    export_audit,
    export_sales,
    json_value,
    report_columns,
    report_values,
    sale_json,
    step_json,
)
from kiosk_agent.logs import RefusalLog
from kiosk_agent.moments import MOMENT_FORMS, MomentError, optional_timestamp, parse_moment
from kiosk_agent.sales.journal import Journal, JournalError, SaleRecord
from kiosk_agent.sales.kinds import KIND_CHOICES, SaleKind
from kiosk_agent.sales.late_vends import late_vended
from kiosk_agent.sales.resolve import (
    NotInAttention,
    ResolveError,
    UnknownSale,
    find_sale,
    resolve,
)
from kiosk_agent.sales.states import SaleState
from kiosk_agent.sales.terminal_actions import ActionRefused, ping_terminal, print_test_receipt
from kiosk_agent.service.errors import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    NotFoundError,
    RateLimitedError,
    ServiceError,
    ServiceUnreachableError,
)
from kiosk_agent.service.models.reports import ReportKind
from kiosk_agent.service.reporting import within
from kiosk_agent.web.server import BodyError, HttpLimits, LocalSite, read_json

if TYPE_CHECKING:
    from kiosk_agent.admin.metrics import AgentMetrics

_LOGGER = logging.getLogger(__name__)

# the name of the configured token a request presented
CALLER = web.RequestKey("kiosk_agent.caller", str)

# Fields a report never leaves the device with.
MAX_REPORT_LIMIT = 100_000
# a report's query parameters that are not filters of the records
_REPORT_PARAMETERS = ("format", "limit", "since", "until")
MAX_SALES_LIMIT = 10_000  # the API's records, read whole
# an export is streamed, so it takes any limit the command line's --limit takes (SQLite's INTEGER)
MAX_EXPORT_LIMIT = 2**63 - 1

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminServer:
    """The `admin:` component."""

    def __init__(self, agent: Any, conf: dict[str, Any]) -> None:
        conf = ADMIN_SCHEMA(conf)
        self.agent = agent
        self._site = LocalSite(
            conf["host"], conf["port"], name="admin", limits=HttpLimits.of(agent),
            health=getattr(agent, "health", None), counted_as="admin API",
            # its port held by another program: waited for, the agent selling meanwhile (the
            # page, /metrics and the API come once it is free), not an agent that cannot start
            wait_for_port=True, waits=getattr(agent, "clock", None),
            resolve=getattr(agent, "listen_resolve", None),
        )
        self._refused = RefusalLog(_LOGGER, "admin_api")
        self._tokens: list[tuple[str, bytes, str]] = [
            (t["name"], _digest(t["token"]), t["role"]) for t in conf["tokens"]
        ]
        self._metrics_public: bool = conf["metrics_public"]
        self.guesses = TokenGuesses()  # wrong tokens by address, at the login and as bearer
        # the field tech's page at / (page.py)
        self.page = StatusPage(agent, self._token_for, self.guesses)
        self.prometheus: AgentMetrics | None = None  # /metrics, made at start()

    @property
    def port(self) -> int | None:
        """The bound port, once started (the configured one may be 0: any free port)."""
        return self._site.port

    @property
    def url(self) -> str:
        return self._site.url

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth_middleware, _error_middleware])
        app.on_response_prepare.append(_private)
        router = app.router
        router.add_get("/api/status", self.status)
        router.add_get("/api/health", self.health)
        router.add_get("/api/sales", self.sales)
        router.add_get("/api/sales/{sale_id}", self.sale)
        router.add_post("/api/sales/{sale_id}/resolve", self.resolve)
        router.add_get("/api/reports/{kind}", self.report)
        router.add_get("/api/audit", self.audit)
        router.add_get("/api/terminals", self.terminals)
        router.add_post("/api/terminals/{device_id}/{action}", self.terminal_action)
        router.add_get("/api/boarding/merchants", self.merchants)
        router.add_get("/metrics", self.metrics)
        self.page.add_routes(app)
        return app

    async def start(self) -> None:
        # prometheus_client is loaded here, by the one part that serves it (not at every command)
        from kiosk_agent.admin.metrics import AgentMetrics

        self.prometheus = AgentMetrics(self.agent, lambda name: _component(self.agent, name))
        self.prometheus.start()
        try:
            await self._site.start(self.app())
        except BaseException:
            await self.prometheus.stop()
            raise
        if self._site.waiting is None:
            _LOGGER.info("admin API on %s", self.url)

    async def stop(self) -> None:
        await self._site.stop()
        if self.prometheus is not None:
            await self.prometheus.stop()

    # -- auth --------------------------------------------------------------------------------

    def _token_for(self, header: str | None) -> tuple[str | None, str | None]:
        """(name, role) of the token presented, or (None, None)."""
        if not header or not header.startswith("Bearer "):
            return None, None
        presented = _digest(header[len("Bearer ") :].strip())
        found: tuple[str | None, str | None] = (None, None)
        for name, token, token_role in self._tokens:
            # compare against every token, so timing says nothing about which one (if any) matched
            if hmac.compare_digest(presented, token):
                found = (name, token_role)
        return found

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if (request.path == "/metrics" and self._metrics_public) or self.page.public(request):
            return await handler(request)
        # a bearer token, or the status page's session cookie (which checks CSRF and Origin)
        header = request.headers.get("Authorization")
        if header is not None and self.guesses.wait(request.remote):
            self._refused("guessing", "admin API: %s is guessing tokens", request.remote)
            return self.guesses.refusal(request.remote)
        name, role = self._token_for(header)
        if role is None and header is not None:
            self.guesses.wrong(request.remote)
        if role is None:
            name, role = self.page.session_auth(request)
        request[CALLER] = name or ""
        if role is None:
            self._refused(
                "unauthorized",
                "admin API: refused %s %s from %s: no valid token",
                request.method,
                request.path,
                request.remote,
            )
            return _error(
                401,
                "unauthorized",
                "send Authorization: Bearer <token> with a configured token",
                headers={"WWW-Authenticate": 'Bearer realm="kiosk-agent"'},
            )
        if request.method != "GET" and role != ADMIN:
            self._refused("forbidden", "admin API: a read token tried %s %s",
                          request.method, request.path)
            return _error(403, "forbidden", "this token may only read; actions need an admin token")
        return await handler(request)

    # -- status and health -------------------------------------------------------------------

    async def status(self, request: web.Request) -> web.Response:
        snapshot = self.agent.health.snapshot()
        return web.json_response(
            {
                "version": snapshot.version,
                "status": str(snapshot.status),
                "problems": snapshot.problems,
                "uptime_s": snapshot.uptime_s,
                "sales": snapshot.sales.model_dump(mode="json"),
                "terminals_online": sum(1 for t in snapshot.terminals if t.online),
                "terminals": len(snapshot.terminals),
                # outside tools wait for recovery "done" before they judge the money
                "recovery": _recovery_json(self.agent.recovery.status()),
                "attention": dataclasses.asdict(self.agent.attention.stats),
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(self.agent.health.snapshot().model_dump(mode="json"))

    # -- the journal -------------------------------------------------------------------------

    async def sales(self, request: web.Request) -> web.StreamResponse:
        """The journal's sales: the API's records (``{"sales": [...]}``), or with ``format=csv``
        or ``format=json`` the one export that ``kiosk-agent sales --format`` writes (export.py:
        the same columns, dollar amounts and UTC times, byte for byte)."""
        journal = self._journal()
        query = request.query
        fmt = query.get("format")
        if fmt is not None and fmt not in SALE_FORMATS:
            raise _BadParameter(f"format must be {' or '.join(SALE_FORMATS)}, got {fmt[:40]!r}")
        states = [_sale_state(s) for s in query.getall("state", [])]
        since, until = (None if m is None else m.timestamp() for m in _window(query))
        # an export takes every sale unless told; the API's page of records is 100
        limit = (
            _int_param(query, "limit", None, MAX_EXPORT_LIMIT)
            if fmt
            else _int_param(query, "limit", 100, MAX_SALES_LIMIT)
        )
        kind = _sale_kind(query.get("kind", SaleKind.SALE.value))
        chosen = states or None
        after = _cursor(journal, query.get("before"))
        if fmt is None:
            records = journal.query(since=since, until=until, states=chosen, kind=kind,
                                    limit=limit, older_than=after)
            # what sales.kinds says is not a sale, counted apart as every face counts it
            apart = (journal.count(since=since, until=until, states=chosen,
                                   kind=SaleKind.NO_SELECTION)
                     if kind is SaleKind.SALE else 0)
            # the sales of the window past this page (older), as `sales` says "N more": a
            # client tells a page from the whole (counted only when the page is full), and
            # asks for them with before=next, in the journal's order: none lost, none twice
            more = (journal.count(since=since, until=until, states=chosen, kind=kind,
                                  older_than=after) - len(records)
                    if len(records) == limit else 0)
            return web.json_response({
                "sales": self._with_unwritten(records, states), "no_selection": apart,
                "more": more, "next": records[-1].sale_id if more else None,
            })
        # A year of sales is streamed page by page, the loop running sales between pages: read
        # and written whole, 100,000 sales held the agent 4.6 s (and 20 MB) here.
        pages = journal.pages(since=since, until=until, states=chosen, kind=kind, limit=limit,
                              older_than=after)
        # the first page read before the answer starts: a journal that cannot be read is a
        # clear error, not half a body
        first: list[SaleRecord] = next(pages, [])
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/csv; charset=utf-8" if fmt == "csv" else "application/json",
                "Content-Disposition": f'inline; filename="sales.{fmt}"',
            }
        )
        await response.prepare(request)
        async with _until_hung_up(request):
            # the late vends said on their sale: a handful, read from their own index
            late = {i: v.at for i, v in late_vended(journal).items()}
            await _write_pieces(response, export_sales(_each_sale(first, pages), fmt, late))
            await response.write_eof()
        return response

    async def audit(self, request: web.Request) -> web.Response:
        """The machine's books (the `dex:` section): the one export `kiosk-agent audit
        --format json|csv` writes (export.export_audit)."""
        fmt = request.query.get("format", "json")
        if fmt not in SALE_FORMATS:
            raise _BadParameter(f"format must be {' or '.join(SALE_FORMATS)}, got {fmt[:40]!r}")
        since = _moment_param(request.query, "since")  # the intervals that ended since
        books = _component(self.agent, "AuditReads")
        if books is None:
            return _error(404, "no_audit", "this unit reads no machine audit (no dex: section)")
        report = books.report(None if since is None else since.timestamp())
        body = "".join(export_audit(report, fmt))
        content = "text/csv" if fmt == "csv" else "application/json"
        return web.Response(text=body, content_type=content, charset="utf-8")

    def _with_unwritten(
        self, records: list[SaleRecord], states: list[SaleState]
    ) -> list[dict[str, Any]]:
        """The journal's sales, each one kept in memory (its step not written yet) shown as
        memory holds it: ``attention`` with ``unwritten: true`` until the journal has it."""
        unwritten = getattr(self.agent, "unwritten", None)
        kept = {r.sale_id: r for r in (unwritten.records if unwritten is not None else [])}
        # when the machine said the product went out after the sale gave up (a late vend), as
        # the export's late_vend column says it: the state alone reads "nothing went out"
        late = late_vended(self._journal())
        shown = []
        for record in records:
            if record.sale_id in kept:
                continue
            vend = late.get(record.sale_id)
            shown.append({**sale_json(record),
                          "late_vend": optional_timestamp(vend.at if vend else None)})
        if not states or SaleState.ATTENTION in states:
            for record in kept.values():
                shown.insert(0, {**sale_json(record), "state": SaleState.ATTENTION.value,
                                 "unwritten": True, "state_unwritten": record.state.value,
                                 "late_vend": None})
        return shown

    async def sale(self, request: web.Request) -> web.Response:
        journal = self._journal()
        sale_id = request.match_info["sale_id"]
        try:  # as `kiosk-agent sales show` and the resolve route name one: id, start or order id
            record = journal.get(sale_id) or find_sale(journal, sale_id)
        except UnknownSale as err:
            return _error(404, "not_found", str(err))
        steps = [step_json(s) for s in journal.steps(record.sale_id)]
        return web.json_response({"sale": sale_json(record), "steps": steps})

    async def resolve(self, request: web.Request) -> web.Response:
        """A person's decision on an ATTENTION sale (admin): ``{"as", "why"}``."""
        journal = self._journal()
        body = await _json_body(request)
        as_, why = body.get("as"), body.get("why")
        if not isinstance(as_, str) or not isinstance(why, str):
            raise _BadParameter('send {"as": "captured"|"reversed", "why": "what you did"}')
        who = f"admin API ({request.get(CALLER) or 'token'})"
        try:
            sale_id = request.match_info["sale_id"]
            record = resolve(journal, sale_id, as_, why, who, self.agent.events)
        except UnknownSale as err:
            return _error(404, "not_found", str(err))
        except NotInAttention as err:
            return _error(409, "not_in_attention", str(err))
        except ResolveError as err:
            return _error(400, "invalid_request", str(err))
        return web.json_response({"sale": sale_json(record)})

    def _journal(self) -> Any:
        return self._agent_part("journal", "the journal is not open")

    def _service(self) -> Any:
        return self._agent_part("service", "no service client")

    def _agent_part(self, name: str, missing: str) -> Any:
        """The agent's ``name`` (journal, service client); 503 saying ``missing`` without one."""
        part = getattr(self.agent, name, None)
        if part is None:
            raise web.HTTPServiceUnavailable(
                text=json.dumps({"error": "unavailable", "detail": missing}),
                content_type="application/json",
            )
        return part

    # -- reports -----------------------------------------------------------------------------

    async def report(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["kind"]
        try:
            kind = ReportKind(name)
        except ValueError:
            known = ", ".join(k.value for k in ReportKind)
            return _error(404, "unknown_report", f"no report {name!r}; known: {known}")
        query = request.query
        fmt = query.get("format", "json")
        if fmt not in ("json", "csv"):
            return _error(400, "bad_parameter", f"format must be json or csv, got {fmt!r}")
        limit = _int_param(query, "limit", None, MAX_REPORT_LIMIT)
        since, until = _window(query)
        try:  # the forms the command line takes: status=settled, status=funded
            filter_values = kind.text_filter(
                {k: v for k, v in query.items() if k not in _REPORT_PARAMETERS}
            )
        except ValueError as err:
            return _error(400, "bad_filter", f"{kind.value} filter 'status': {err}")
        try:
            filters = kind.filter.model_validate(filter_values) if filter_values else None
        except ValidationError as err:
            first = err.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            known = ", ".join(kind.filter.model_fields)
            message = f"{kind.value} filter {field!r}: {first['msg']} (filters: {known})"
            return _error(400, "bad_filter", message)
        reporting = self._service().reporting
        if since is None and until is None:
            records = reporting.records(kind, filters, limit=limit)
        else:  # as `kiosk-agent report --since/--until`: the window on the stream, then the limit
            records = within(reporting.records(kind, filters), kind.date_field, since, until,
                             limit=limit)
        # The first page decides the status: a service error becomes a clear answer, not a
        # half-written stream.
        first_record = await anext(records, None)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/csv; charset=utf-8" if fmt == "csv" else "application/json",
                "Content-Disposition": f'inline; filename="{kind.value}.{fmt}"',
            }
        )
        await response.prepare(request)
        rows = _report_rows(first_record, records)
        writer = _write_csv if fmt == "csv" else _write_json
        # An error after this point cannot change the status; the stream is cut short instead,
        # so the client sees an incomplete body rather than a silently truncated report.
        async with _until_hung_up(request):
            await writer(response, kind, rows)
            await response.write_eof()
        return response

    # -- terminals ---------------------------------------------------------------------------

    async def terminals(self, request: web.Request) -> web.Response:
        listed = await self._service().terminal.list()
        return web.json_response({"terminals": [json_value(t) for t in listed]})

    async def terminal_action(self, request: web.Request) -> web.Response:
        device_id = request.match_info["device_id"]
        action = request.match_info["action"]
        terminal = self._service().terminal
        if action == "ping":
            answer = await ping_terminal(self.agent, self._service(), device_id)
            return web.json_response(json_value(answer))
        if action == "connect":
            return web.json_response(json_value(await terminal.connect(device_id)))
        if action == "disconnect":
            return web.json_response(json_value(await terminal.disconnect(device_id)))
        if action == "test-print":
            return await self._test_print(request, device_id)
        actions = "ping, connect, disconnect, test-print"
        return _error(404, "unknown_action", f"no action {action!r}; use {actions}")

    async def _test_print(self, request: web.Request, device_id: str) -> web.Response:
        body = await _json_body(request)
        try:
            trans_id = await print_test_receipt(
                self.agent, self._service(), device_id, body.get("trans_id")
            )
        except ActionRefused as refused:
            return _error(refused.status, refused.code, str(refused))
        return web.json_response({"device_id": device_id, "printed": True, "trans_id": trans_id})

    # -- boarding and metrics ----------------------------------------------------------------

    async def merchants(self, request: web.Request) -> web.Response:
        receiver = _component(self.agent, "WebhookReceiver")
        if receiver is None:
            return _error(404, "not_configured", "the webhooks: section is not configured")
        return web.json_response({"merchants": receiver.merchants()})

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus: the text format, or OpenMetrics when ``Accept`` asks for it."""
        if self.prometheus is None:
            return _error(503, "unavailable", "the admin API is not started")
        body, content_type = self.prometheus.exposition(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})


# -- helpers ---------------------------------------------------------------------------------


async def _private(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer: kept by no cache (a shared laptop's browser, a proxy), never sniffed as
    another type than it says, and never handed to another origin's <script> or <img> (which
    would carry the session cookie on the same host, another port)."""
    response.headers.setdefault("Cache-Control", "no-store")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Cross-Origin-Resource-Policy", "same-origin")


def _digest(token: str) -> bytes:
    # Compare fixed-length digests: a plain compare_digest would still reveal a token's length.
    return hashlib.sha256(token.encode()).digest()


def _component(agent: Any, class_name: str) -> Any:
    """A sibling component (built by app.py), found by class name on ``agent.components``."""
    components = getattr(agent, "components", None) or []
    if isinstance(components, dict):
        components = components.values()
    return next((c for c in components if type(c).__name__ == class_name), None)


def _error(
    status: int, error: str, detail: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response({"error": error, "detail": detail}, status=status, headers=headers)


_SERVICE_STATUS: list[tuple[type[ServiceError], int]] = [
    (BadRequestError, 400),
    (NotFoundError, 404),
    (ConflictError, 409),
    (RateLimitedError, 429),
    (AuthenticationError, 502),  # our credentials, not the operator's request
    (ServiceUnreachableError, 504),
]


@web.middleware
async def _error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except _BadParameter as err:
        return _error(400, "bad_parameter", str(err))
    except BodyError as err:
        return web.json_response(
            {"error": err.error, "detail": err.message, "field": err.field}, status=err.status
        )
    except (JournalError, sqlite3.Error) as err:
        # a failing disk or a damaged journal: said in JSON, with the journal named
        return _error(503, "journal_unavailable", f"the journal cannot be used now: {err}")
    except ServiceError as err:
        status = next((code for cls, code in _SERVICE_STATUS if isinstance(err, cls)), 502)
        return _error(status, err.error or type(err).__name__, f"payment service: {err}")
    except web.HTTPMethodNotAllowed as err:
        allowed = ", ".join(sorted(err.allowed_methods))
        return _error(
            405, "method_not_allowed", f"{request.method} {request.path}: use {allowed}",
            headers={"Allow": allowed},
        )
    except web.HTTPNotFound as err:
        if err.content_type == "application/json":
            raise  # a handler's own, already in words
        return _error(404, "not_found", f"no route {request.method} {request.path}")


class _BadParameter(ValueError):
    pass


def _int_param(query: Any, name: str, default: int | None, maximum: int) -> int | None:
    raw = query.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > len(str(maximum)):
        shown = raw if len(raw) <= 40 else f"{raw[:40]}... ({len(raw)} characters)"
        raise _BadParameter(f"{name} must be a whole number 1..{maximum}, got {shown!r}")
    value = int(raw)
    if not 1 <= value <= maximum:
        raise _BadParameter(f"{name} must be 1..{maximum}, got {value}")
    return value


def _cursor(journal: Journal, sale_id: str | None) -> tuple[float, int] | None:
    """``before``: the sale a page ended with (its ``next``), as its place in the order."""
    if sale_id is None:
        return None
    place = journal.place(sale_id[:64])
    if place is None:
        raise _BadParameter(
            f"before: no sale {sale_id[:40]!r} in the journal (give a sale_id: a page's next)")
    return place


def _moment_param(query: Any, name: str) -> dt.datetime | None:
    """``since``/``until`` in the command line's grammar (:mod:`kiosk_agent.moments`): an
    ``until`` day is the whole day."""
    raw = query.get(name)
    if raw is None:
        return None
    if len(raw) > 40:
        raise _BadParameter(f"{name}: expected {MOMENT_FORMS} or Unix seconds, got {raw[:40]!r}...")
    try:
        return parse_moment(raw, end=name == "until")
    except MomentError as err:
        raise _BadParameter(f"{name}: {err}") from None


def _window(query: Any) -> tuple[dt.datetime | None, dt.datetime | None]:
    """``since`` and ``until``; an empty or backwards window is refused, as the command line
    refuses it."""
    since, until = _moment_param(query, "since"), _moment_param(query, "until")
    if since is not None and until is not None and since >= until:
        raise _BadParameter("since must be before until")
    return since, until


@contextlib.asynccontextmanager
async def _until_hung_up(request: web.Request) -> AsyncIterator[None]:
    """A streamed export whose client hangs up (a curl ended, a browser tab closed) ends there,
    in one log line: it is no error of the agent's (it was a traceback at ERROR)."""
    try:
        yield
    except ConnectionResetError:
        _LOGGER.info("%s: the client hung up before the end of the export", request.path)


# An export's pieces are sent in chunks of about this many characters, the loop let run between.
EXPORT_CHUNK = 64 * 1024


def _each_sale(first: list[SaleRecord], pages: Iterator[list[SaleRecord]]) -> Iterator[SaleRecord]:
    yield from first
    for page in pages:
        yield from page


async def _write_pieces(response: web.StreamResponse, pieces: Iterator[str]) -> None:
    """Write an export as it is made (journal pages are read as it goes), a chunk at a time."""
    chunk: list[str] = []
    size = 0
    for piece in pieces:
        chunk.append(piece)
        size += len(piece)
        if size >= EXPORT_CHUNK:
            await response.write("".join(chunk).encode())
            chunk, size = [], 0
            await asyncio.sleep(0)  # a sale's steps, a kiosk's request, the watchdog go first
    if chunk:
        await response.write("".join(chunk).encode())


def _sale_kind(raw: str) -> SaleKind:
    """``kind``, as ``kiosk-agent sales --kind`` takes it."""
    try:
        return SaleKind(raw.lower())
    except ValueError:
        raise _BadParameter(f"kind must be one of {', '.join(KIND_CHOICES)}, got {raw[:40]!r}") \
            from None


def _sale_state(raw: str) -> SaleState:
    """A state in any case, as ``kiosk-agent sales --state`` takes it."""
    try:
        return SaleState(raw.lower())
    except ValueError:
        known = ", ".join(s.value for s in SaleState)
        raise _BadParameter(f"state must be one of {known}, got {raw!r}") from None


async def _json_body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    body = await read_json(request)  # BodyError: the error middleware answers it
    if not isinstance(body, dict):
        raise _BadParameter("the body must be a JSON object")
    return body


async def _report_rows(
    first: BaseModel | None, rest: AsyncIterator[BaseModel]
) -> AsyncIterator[dict[str, object]]:
    if first is None:
        return
    yield report_values(first)
    async for record in rest:
        yield report_values(record)


async def _write_json(
    response: web.StreamResponse, kind: ReportKind, rows: AsyncIterator[dict[str, object]]
) -> None:
    export = JsonExport()  # the one JSON export (kiosk_agent.export), as the CLI writes it
    await response.write(export.start().encode())
    async for row in rows:
        await response.write(export.row(row).encode())
    await response.write(export.end().encode())


async def _write_csv(
    response: web.StreamResponse, kind: ReportKind, rows: AsyncIterator[dict[str, object]]
) -> None:
    export = CsvExport(report_columns(kind))  # the one CSV writer, as the CLI writes it
    await response.write(export.header().encode())
    async for row in rows:
        await response.write(export.row(row).encode())


def _recovery_json(status: dict[str, Any]) -> dict[str, Any]:
    """Recovery's status in JSON: when it started and finished in ISO 8601 UTC."""
    return {**status, **{key: optional_timestamp(status[key])
                         for key in ("started_at", "finished_at")}}
