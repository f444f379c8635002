"""A local HTTP and WebSocket API for the kiosk's own touchscreen app.

The app starts a sale, follows it live and may cancel it; the agent does the payment. Loopback only
unless configured otherwise; every request carries ``Authorization: Bearer <token>`` (only a
WebSocket handshake may send ``?token=`` instead, since a browser cannot set its headers).

As a browser would meet it: a POST must be ``Content-Type: application/json`` (a cross-site form
or ``text/plain`` post is refused with 415: a page cannot send JSON across sites without a CORS
preflight, which this API never grants); the ``Host`` must be one of ``allowed_hosts`` (a DNS
rebinding page names its own host: 403); an ``Origin``, when sent, must match ``allowed_origins``
(403). Both default to loopback.

    POST   /api/v1/sales                  {product?, amount?, flow?, terminal?, email?,
                                          customer?, plan?} -> 202
                                          (503 out_of_service while the terminal cannot take
                                          cards: {error, field, message, reason, terminal};
                                          503 stopping while the agent drains: {error, field,
                                          message, until}, Retry-After)
    GET    /api/v1/sales/{sale_id}        the sale's latest step
    POST   /api/v1/sales/{sale_id}/cancel -> 202 {cancelled}
    POST   /api/v1/sales/{sale_id}/dispensed {status: vended|failed, detail?}  (confirm_dispense)
    GET    /api/v1/sales/{sale_id}/events WebSocket: each step as JSON, closed after the last
    GET    /api/v1/events                 WebSocket: every step of every sale from this app
                                          (a reader that fell behind gets {gap: true, missed,
                                          sale_id, message} where steps were lost)
    GET    /api/v1/status                 the platform's status

``amount`` is a string of dollars (``"2.50"``) or integer cents; configured ``products`` give the
price by name. Bad bodies get 400 with ``{error, field, message}`` naming the field.

An ``enroll`` sale saves the card in the vault, which keeps the customer's details: it needs
``email`` and ``customer`` {name, account_zip, address1, address2?, city, region, country? (US),
phone}, and may start ``plan`` {name?, amount, rrule}; ``amount`` (what the reader shows while it
reads the card; nothing is charged) defaults to the plan's. Each is checked before the card is
read (``customer.account_zip`` names the field).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import json
import json.encoder
import logging
import math
import re
import sqlite3
import struct
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import voluptuous as vol
from aiohttp import WSMsgType, web

from kiosk_agent.bus import EventBus, Subscription
from kiosk_agent.config.load import PLATFORM_SCHEMA as BASE_PLATFORM_SCHEMA
from kiosk_agent.config.load import max_price_check, positive_float, price_map, schema_built_on_read
from kiosk_agent.logs import RefusalLog
from kiosk_agent.money import MoneyError, cents_to_dollars, parse_price
from kiosk_agent.platforms.base import Dispenser, LateVends, instance_name
from kiosk_agent.sales.model import (
    STOPPING,
    AgentStopping,
    BadAmount,
    DispenseOutcome,
    DispenseStatus,
    Flow,
    JournalError,
    RecoveryHolds,
    SaleEvent,
    SaleRequest,
    Step,
    TerminalBusy,
    UnknownTerminal,
)
from kiosk_agent.tasks import cancel_and_wait
from kiosk_agent.web.hosts import listen_host
from kiosk_agent.web.server import (
    MAX_STREAM_FRAME,
    UNEXPECTED_RETRY_AFTER_S,
    BodyError,
    HttpLimits,
    LocalSite,
    client_heard,
    read_json,
    stream_slot,
    text_fault,
)

_LOGGER = logging.getLogger(__name__)

_KEPT_SALES = 500  # latest step of this many recent sales, for GET and late WebSocket joins
# notes on a completed sale, not steps of it the app waits for: a receipt, and what others
# gave back at the service later (its own kind: SaleEvent.given_back_later)
_NOT_TO_THE_APP = frozenset({Step.RECEIPT, Step.SERVICE_LATER})


def _token(value: Any) -> str:
    if not isinstance(value, str) or len(value) < 16:
        raise vol.Invalid("expected a token of at least 16 characters (use !secret)")
    return value


_ANY_ADDRESS = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 - bound to all: not a Host name
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
LOOPBACK_ORIGINS = ("http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*")


def _names(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise vol.Invalid("expected a list of names")
    return [v.strip().lower() for v in value]


__getattr__ = schema_built_on_read(__name__, lambda: _platform_schema())


def _platform_schema() -> vol.All:
    return vol.All(BASE_PLATFORM_SCHEMA.extend(
        {
            vol.Required("token"): _token,
            vol.Optional("host", default="127.0.0.1"): listen_host,
            vol.Optional("port", default=8765): vol.All(int, vol.Range(min=0, max=65535)),
            vol.Optional("products", default={}): price_map,  # each bad price at its product
            # only configured products may be sold (no free amounts from the app)
            vol.Optional("products_only", default=False): bool,
            # the app confirms what came out (POST .../dispensed); otherwise payment is the product
            vol.Optional("confirm_dispense", default=False): bool,
            # its own bound on a dispense; none: sales.vend_timeout (docs/platforms.md)
            vol.Optional("vend_timeout"): positive_float,
            # Host header names accepted (DNS rebinding); the bound host is always accepted too
            vol.Optional("allowed_hosts", default=list(LOOPBACK_HOSTS)): _names,
            # Origin headers accepted from browsers: exact, or "scheme://host:*" for any port;
            # a request with no Origin (not a browser page) is not checked
            vol.Optional("allowed_origins", default=list(LOOPBACK_ORIGINS)): _names,
        }
    ), max_price_check("products{}"))


# Texts from the app that people read later (status page, CLI, journal): short, plain.
MAX_PRODUCT_CHARS = 100
MAX_NAME_CHARS = 64
MAX_EMAIL_CHARS = 254
MAX_DETAIL_CHARS = 500


def _plain(field: str, value: str | None, max_chars: int) -> None:
    fault = None if value is None else text_fault(value, max_chars)
    if fault is not None:
        raise BadRequest(field, fault)


# What the vault keeps of a customer (the interface requires each but address2), as the
# app asks them: field -> (required, most characters, what a right value looks like or None).
CUSTOMER_FIELDS: dict[str, tuple[bool, int, re.Pattern[str] | None, str]] = {
    "name": (True, MAX_NAME_CHARS, None, ""),
    "account_zip": (True, 10, re.compile(r"[A-Za-z0-9][A-Za-z0-9 -]{1,9}"),
                    "a ZIP or postal code (letters, digits, spaces, hyphens)"),
    "address1": (True, 100, None, ""),
    "address2": (False, 100, None, ""),
    "city": (True, 64, None, ""),
    "region": (True, 64, None, ""),
    "country": (False, 8, re.compile(r"[A-Z]{2}"), 'a two-letter country code ("US")'),
    "phone": (True, 20, re.compile(r"\+?[0-9 ().-]{7,20}"), "a phone number (digits, +, -)"),
}


def _enrollment(body: dict[str, Any], flow: Flow) -> tuple[dict[str, str], dict[str, str] | None]:
    """The customer's details (and plan) an enroll sale saves with the card; the vault refuses
    an account without them, so they are required here, before the card is read."""
    if flow is not Flow.ENROLL:
        for key in ("customer", "plan"):
            if key in body:
                raise BadRequest(key, "only an enroll sale saves a customer's card and plan")
        return {}, None
    if body.get("email") is None:
        raise BadRequest("email", "required to save a card (the vault keeps the customer's)")
    customer = body.get("customer")
    if customer is None:
        names = ", ".join(n for n, (required, *_) in CUSTOMER_FIELDS.items() if required)
        raise BadRequest("customer", f"required to save a card: an object with {names}")
    if not isinstance(customer, dict):
        raise BadRequest("customer", "expected an object")
    unknown = sorted(set(customer) - set(CUSTOMER_FIELDS))
    if unknown:
        raise BadRequest(f"customer.{unknown[0]}",
                         f"unknown field; expected {', '.join(CUSTOMER_FIELDS)}")
    details = {"country": "US"}
    for name, (required, max_chars, pattern, shape) in CUSTOMER_FIELDS.items():
        value = customer.get(name)
        field = f"customer.{name}"
        if value is None or value == "":
            if required:
                raise BadRequest(field, "required to save a card")
            continue
        if not isinstance(value, str):
            raise BadRequest(field, "expected text")
        _plain(field, value, max_chars)
        if not value.strip():
            raise BadRequest(field, "required to save a card (it is blank)")
        if pattern is not None and not pattern.fullmatch(value):
            raise BadRequest(field, f"expected {shape}, got {value[:max_chars]!r}")
        details[name] = value.strip()
    return details, _plan(body.get("plan"))


def _plan(plan: Any) -> dict[str, str] | None:
    """A billing plan to start on the saved card: ``{name?, amount, rrule}``."""
    from kiosk_agent.service.rrule import validate_rrule

    if plan is None:
        return None
    if not isinstance(plan, dict):
        raise BadRequest("plan", "expected an object {name?, amount, rrule}")
    unknown = sorted(set(plan) - {"name", "amount", "rrule"})
    if unknown:
        raise BadRequest(f"plan.{unknown[0]}", "unknown field; expected name, amount, rrule")
    name = plan.get("name")
    if name is not None and not isinstance(name, str):
        raise BadRequest("plan.name", "expected text")
    _plain("plan.name", name, MAX_NAME_CHARS)
    if "amount" not in plan:
        raise BadRequest("plan.amount", 'required: what each payment takes ("9.99")')
    try:
        cents = parse_price(plan["amount"])
    except MoneyError as err:
        raise BadRequest("plan.amount", str(err)) from None
    if cents <= 0:
        raise BadRequest("plan.amount", "expected an amount above zero")
    rrule = plan.get("rrule")
    if not isinstance(rrule, str):
        raise BadRequest("plan.rrule", "required: a DTSTART line and an RRULE line")
    _plain("plan.rrule", rrule.replace("\n", " "), 500)  # its one line end is the format's
    try:
        validate_rrule(rrule)
    except ValueError as err:
        raise BadRequest("plan.rrule", str(err)) from None
    return {"amount": cents_to_dollars(cents), "rrule": rrule, **({"name": name} if name else {})}


class BadRequest(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class AppDispenser(Dispenser):
    """The app is the machine: it dispenses when told, or payment itself is the product."""

    def __init__(self, request: SaleRequest, confirm: bool) -> None:
        super().__init__(request)
        self.confirm = confirm
        self.waiting = False

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        self.vend_cents = authorized_cents  # what the app sells is what the card paid
        if not self.confirm:
            return self.end(DispenseStatus.VENDED, "paid")
        self.waiting = True
        try:
            return await self.wait()
        finally:
            self.waiting = False

    async def deny(self, reason: str) -> None:
        # The app follows the sale's steps; a denial is a final step it sees there.
        _LOGGER.debug("app sale denied: %s", reason)

    def confirm_result(self, status: DispenseStatus, detail: str) -> bool:
        if not self.waiting or self.ended:
            return False
        self.end(status, detail)
        return True


def event_json(event: SaleEvent) -> dict[str, Any]:
    return {
        "sale_id": event.sale_id,
        "order_id": event.order_id,
        "state": event.state._value_,  # the text itself: .value is two Python calls a frame
        "final": event.state.final,
        "amount": _dollars(event.amount_cents),
        "amount_cents": event.amount_cents,
        "captured_cents": event.captured_cents,
        "reversed_cents": event.reversed_cents,  # given back: what the app tells its customer
        "product": event.product,
        "terminal": event.terminal,
        "message": event.message,
        "at": event.at,
        # its own kind: a step that could not be written; state is what the journal holds
        "unwritten": event.unwritten,
    }


# the amount of a sale, as each of its frames shows it: made once, not at each of its steps
# (typed: True is refused as cents, never taken for a cached 1)
_dollars = functools.lru_cache(maxsize=256, typed=True)(cents_to_dollars)


def event_text(event: SaleEvent) -> str:
    """A step as the app reads it: :func:`event_json`, encoded."""
    return "".join(_encode(event_json(event), 0))


def _json_encoder() -> Callable[[Any, int], Any]:
    """``json.dumps`` with its defaults, as one C encoder made once (its chunks, joined by the
    caller): ``json.dumps`` makes one a call, a third of a frame's encoding (4.9 us against
    3.4). No circular check: a frame is a flat dict made here."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # a Python without the C accelerator
        return lambda value, _level: (json.dumps(value),)
    encode: Callable[[Any, int], Any] = make(
        None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None,
        ": ", ", ", False, False, True,
    )  # fmt: skip
    return encode


_encode = _json_encoder()

# A step of this app's and its text, encoded once for every stream that sends it: made only
# for a step a stream follows (its sale's own, or the app-wide one), which sends every one
# handed to it, so it is encoded at once, in the listener (a plain pair: no frame object)
_Frame = tuple[SaleEvent, str]

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def gap_json(missed: int, sale_id: str | None) -> dict[str, Any]:
    """Said in a stream where steps were lost (the app read slower than the agent wrote)."""
    where = f"GET /api/v1/sales/{sale_id}" if sale_id else "GET /api/v1/sales/{sale_id}"
    return {
        "gap": True,
        "missed": missed,
        "sale_id": sale_id,
        "message": f"{missed} step(s) missed here (this reader fell behind); {where} has the "
        "latest",
    }


class KioskApi:
    def __init__(self, agent: Any, config: dict[str, Any]) -> None:
        self.agent = agent
        self.config = config
        # the flow of a sale that names none (most): made once, not an enum lookup a sale
        self._default_flow = Flow(config["flow"])
        self.name = instance_name(config, "kiosk")
        self._token_digest = hashlib.sha256(config["token"].encode()).digest()
        self._latest: OrderedDict[str, SaleEvent] = OrderedDict()
        self._dispensers: dict[str, AppDispenser] = {}
        # a "vended" reported after its sale stopped waiting is a product gone out unpaid
        self.late = LateVends(self.name, getattr(agent, "sales", None))
        self._site = LocalSite(
            config["host"], config["port"], name=self.name,
            limits=HttpLimits.of(agent),
            health=getattr(agent, "health", None),  # a test's stand-in agent may have none
            refuse_unexpected=_unexpected,
            # its port held by another program (a tech's agent): waited for on the agent's
            # clock, the rest of the agent selling meanwhile, not given up until a restart
            wait_for_port=True, waits=getattr(agent, "clock", None),
            resolve=getattr(agent, "listen_resolve", None),
        )
        self._hosts = {*config["allowed_hosts"], config["host"].lower()} - _ANY_ADDRESS
        # Host headers already found allowed, as sent ("127.0.0.1:8090"): an app sends the same
        # one at each request, read here without parsing it again (a few, so that headers sent
        # by outsiders, refused, never fill it)
        self._hosts_seen: set[str] = set()
        self._origins: list[str] = config["allowed_origins"]
        self._refused = RefusalLog(_LOGGER, "kiosk_api")
        self._unfollow: Callable[[], None] = lambda: None  # stops _follow
        # this app's steps, each encoded once by _follow, for the open streams (a step is JSON
        # as many times as it is published, not once per stream that sends it)
        self._frames: EventBus[_Frame] = EventBus()
        self._sockets: set[web.WebSocketResponse] = set()
        self.requests = 0
        self.rejected = 0
        self.refused_out_of_service = 0  # sales refused at once: the terminal was out of service
        self.refused_stopping = 0  # sales refused at once: the agent was stopping (draining)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        # Every request passes the checks (_auth) before anything else, whatever its target:
        # the site runs them around the app's own handling (its routes, aiohttp's 404 and 405
        # for a target no route matches), not as a middleware, so aiohttp runs no middleware
        # chain at each request (some 25 Python calls a sale), and not on each route, which
        # missed the targets no route matches (OPTIONS *, CONNECT's host:port, a path with a
        # line break): those were answered unchecked and uncounted
        app = web.Application(client_max_size=64 * 1024)
        app.router.add_post("/api/v1/sales", self._start_sale)
        app.router.add_get("/api/v1/sales/{sale_id}", self._get_sale)
        app.router.add_post("/api/v1/sales/{sale_id}/cancel", self._cancel_sale)
        app.router.add_post("/api/v1/sales/{sale_id}/dispensed", self._dispensed)
        app.router.add_get("/api/v1/sales/{sale_id}/events", self._stream)
        app.router.add_get("/api/v1/events", self._stream)
        app.router.add_get("/api/v1/status", self._status)
        # a port in use is waited for (web/server.py's PortWait: named in the log and health)
        await self._site.start(app, guard=self._auth)
        self._unfollow = self.agent.events.listen(self._follow)
        if self._site.waiting is None:
            _LOGGER.info("%s: kiosk API on %s:%d", self.name, self.config["host"], self.port)

    async def stop(self) -> None:
        for dispenser in self._dispensers.values():
            # Nobody can confirm through a closed API: nothing counts as dispensed.
            dispenser.confirm_result(DispenseStatus.CANCELLED, "kiosk API stopping")
        for ws in list(self._sockets):
            await ws.close(code=1001, message=b"agent stopping")
        self._unfollow()
        await self._site.stop()

    @property
    def port(self) -> int:
        """The bound port once started (0 before: the configured one may be 0, any free port)."""
        return self._site.port or 0

    def status(self) -> dict[str, Any]:
        return {
            "host": self.config["host"],
            "port": self.port,
            "listening": self._site.listening(),  # or waiting: its port held, its address missing
            "requests": self.requests,
            "rejected": self.rejected,
            "unexpected": self._site.unexpected,  # requests a handler failed (a bug)
            "refused_out_of_service": self.refused_out_of_service,
            "refused_stopping": self.refused_stopping,
            "live_sockets": len(self._sockets),
            "sales_known": len(self._latest),
            "card_payment": self.card_payment(),
            **self.late.status(),
        }

    def card_payment(self) -> dict[str, Any]:
        """Whether a card sale can work now on this kiosk's terminal, and why not (the app shows
        "card payment unavailable" instead of letting a customer try)."""
        availability = getattr(self.agent, "availability", None)
        if availability is None:
            return {"available": True, "reason": "", "terminal": self.config.get("terminal")}
        state = availability.state(self.config.get("terminal"))
        shown = {"available": state.available, "reason": state.reason,
                 "terminal": state.device_id, "since": state.since, "recovering": False}
        holds = getattr(self.agent.sales, "recovery_hold", None)
        hold = holds(state.device_id) if holds is not None and state.available else None
        if hold is not None:  # in service, but a sale there is refused (409) until it ends
            shown.update(available=False, reason=hold.reason, recovering=True,
                         until=None if hold.until is None else round(hold.until, 3))
        return shown

    def _follow(self, event: SaleEvent) -> None:
        """Keep this app's latest step of each sale (a listener: called as each is published)."""
        # the step compared here, not through SaleEvent.receipt: a property is a Python call on
        # each of a sale's six steps, in each of the listeners every step calls
        if event.source != self.name or event.step in _NOT_TO_THE_APP:
            return
        self._latest[event.sale_id] = event
        self._latest.move_to_end(event.sale_id)
        while len(self._latest) > _KEPT_SALES:
            self._latest.popitem(last=False)
        if event.state.final:
            dispenser = self._dispensers.pop(event.sale_id, None)
            if dispenser is not None:
                self.late.gave_up(dispenser)
        if self._frames.reaches(event.sale_id):  # a stream of its own or the app-wide one
            self._frames.publish((event, event_text(event)), event.sale_id)

    # -- auth ----------------------------------------------------------------------------------

    async def _auth(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        self.requests += 1
        refusal = self._refusal(request)
        if refusal is not None:
            self.rejected += 1
            status, error, field, message = refusal
            self._refused(error, "%s: refused %s %s: %s", self.name, request.method,
                          request.path, message)
            return _error(status, error, field, message)
        try:
            response: web.StreamResponse = await handler(request)
        except BadRequest as err:
            return _error(400, "bad_request", err.field, err.message)
        except BodyError as err:
            return _error(err.status, err.error, err.field, err.message)
        except (JournalError, sqlite3.Error) as err:
            # the journal cannot hold a sale: out of service, said as the app expects it
            return self._journal_refusal(err)
        # any other error (a bug) is the site's to answer: 503 in this API's words
        # (_unexpected), logged, counted and shown in health (LocalSite._track)
        return response

    def _refusal(self, request: web.Request) -> tuple[int, str, str | None, str] | None:
        """Why a request is refused before its handler runs (status, error, field, message)."""
        header = request.headers.get("Host", "")
        if header not in self._hosts_seen:
            host = _host_name(header)
            if host not in self._hosts:
                allowed = ", ".join(sorted(self._hosts))
                return 403, "bad_host", "Host", f"Host {host or '(none)'!r} is not one of {allowed}"
            if len(self._hosts_seen) < _HOSTS_SEEN_KEPT:
                self._hosts_seen.add(header)
        origin = request.headers.get("Origin")
        if origin is not None and not _origin_allowed(origin.strip().lower(), self._origins):
            return 403, "bad_origin", "Origin", f"Origin {origin[:100]!r} is not allowed"
        given = request.headers.get("Authorization", "")
        if given.startswith("Bearer "):
            token = given[7:]
        elif _is_websocket_handshake(request):
            token = request.query.get("token", "")
        else:
            token = ""
        digest = hashlib.sha256(token.encode("utf-8", "replace")).digest()
        if not token or not hmac.compare_digest(digest, self._token_digest):
            return 401, "unauthorized", None, "a valid bearer token is required"
        return None

    # -- handlers ------------------------------------------------------------------------------

    async def _start_sale(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        sale_request = self._sale_request(body)
        if getattr(self.agent.sales, "stopping", False):
            sales = self.agent.sales
            return self._stopping(getattr(sales, "stopping_until", None),
                                  getattr(sales, "stopping_left", None))
        refused = self._out_of_service(sale_request.terminal)
        if refused is not None:
            return refused
        dispenser = AppDispenser(sale_request, self.config["confirm_dispense"])
        try:
            sale = await self.agent.sales.start(sale_request, dispenser)
        except AgentStopping as err:  # the stop began while this request was read
            return self._stopping(err.until, err.left)
        except RecoveryHolds as err:  # a sale the last stop or crash left there, finished
            return self._recovering(err)
        except TerminalBusy as err:  # another sale, or recovery
            return _error(409, "terminal_busy", "terminal", str(err))
        except UnknownTerminal as err:
            raise BadRequest("terminal", str(err)) from None
        except BadAmount as err:  # zero, or above max_price: the app's amount, by name
            raise BadRequest("amount", str(err)) from None
        # any other error out of the start (a ValueError too) is not the app's amount: the
        # site's counted 503 "unavailable" (_unexpected), logged, never a field it did not send
        self._dispensers[sale.sale_id] = dispenser
        dispenser.sale_id = sale.sale_id
        return _json_response(
            {
                "sale_id": sale.sale_id,
                "order_id": sale.order_id,
                "amount": _dollars(sale_request.amount_cents),
                "events": f"/api/v1/sales/{sale.sale_id}/events",
            },
            status=202,
        )

    def _stopping(self, until: float | None, left: float | None = None) -> web.Response:
        """503 while the agent drains (a restart, an upgrade): no new sale; the sales already
        running go on, and their confirmations and reads are still taken. Retry-After: the
        drain's end at the latest."""
        self.refused_stopping += 1
        self._refused("stopping", "%s: sale refused: %s", self.name, STOPPING,
                      level=logging.INFO)
        if left is None:  # the seconds left on the monotonic clock: none known, ask in one
            left = 1.0
        body: dict[str, Any] = {"error": "stopping", "field": None,
                                "message": f"card payment unavailable: {STOPPING}"}
        if until is not None:
            body["until"] = round(until, 3)  # Unix time, as each step's "at"
        return web.json_response(
            body, status=503, headers={"Retry-After": str(max(1, math.ceil(left)))}
        )

    def _recovering(self, err: RecoveryHolds) -> web.Response:
        """409 ``terminal_busy`` while recovery holds the terminal after a restart, saying so
        (``recovering: true``, ``reason``) and, while it listens for a vend the last run left in
        flight, until when (``until``, Unix time; ``Retry-After``): the app shows "one moment"
        and asks again then, not "card payment unavailable"."""
        body: dict[str, Any] = {"error": "terminal_busy", "field": "terminal",
                                "message": str(err), "recovering": True,
                                "reason": err.reason, "terminal": err.terminal}
        headers = {}
        if err.until is not None:
            body["until"] = round(err.until, 3)  # Unix time, as each step's "at"
        if err.left is not None:  # on the monotonic clock: a step of the wall clock moves none
            headers["Retry-After"] = str(max(1, math.ceil(err.left)))
        return web.json_response(body, status=409, headers=headers)

    def _journal_refusal(self, err: Exception) -> web.Response:
        self.refused_out_of_service += 1
        reason = f"journal not writable: {err}"
        self._refused("out_of_service", "%s: refused: %s", self.name, reason)
        retry = max(1, math.ceil(getattr(self.agent.availability, "recheck_interval", 1.0)))
        return web.json_response(
            {"error": "out_of_service", "field": None, "reason": reason,
             "message": f"card payment unavailable: {reason}"},
            status=503, headers={"Retry-After": str(retry)},
        )

    def _out_of_service(self, terminal: str | None) -> web.Response | None:
        """503 at once while the sale's terminal is out of service (``health.availability``):
        the app tells the customer now, and no sale is journaled only to fail at the terminal."""
        availability = getattr(self.agent, "availability", None)
        if availability is None:
            return None
        try:
            availability.device_id(terminal)
        except ValueError:
            return None  # not a configured terminal: the runner's 400 names the known ones
        state = availability.state(terminal)
        if state.available:
            return None
        self.refused_out_of_service += 1
        message = f"card payment unavailable on {state.device_id}: {state.reason}"
        self._refused("out_of_service", "%s: sale refused: %s", self.name, message,
                      level=logging.INFO)
        retry = max(1, math.ceil(availability.recheck_interval))
        return web.json_response(
            {"error": "out_of_service", "field": "terminal", "message": message,
             "reason": state.reason, "terminal": state.device_id},
            status=503, headers={"Retry-After": str(retry)},
        )

    def _sale_request(self, body: dict[str, Any]) -> SaleRequest:
        products: dict[str, int] = self.config["products"]
        product = body.get("product")
        if product is not None and not isinstance(product, str):
            raise BadRequest("product", "expected a string")
        _plain("product", product, MAX_PRODUCT_CHARS)  # shown to people: page, CLI, receipts
        asked = body.get("flow")
        flow = self._default_flow if asked is None else self._flow(asked)
        if flow is Flow.ENROLL or "customer" in body or "plan" in body:
            customer, plan = _enrollment(body, flow)
        else:  # a plain sale (most): what _enrollment finds for it, without the call
            customer, plan = {}, None
        amount = self._amount(body, product, products, flow, plan)
        if "terminal" in body:  # the app's text: checked as every text from it
            terminal = body["terminal"]
            if terminal is not None and not isinstance(terminal, str):
                raise BadRequest("terminal", "expected a device id or terminal name")
            _plain("terminal", terminal, MAX_NAME_CHARS)
        else:  # the configured one, checked against the terminals when the config was read
            terminal = self.config.get("terminal")
        email = body.get("email")
        if email is not None:
            if not isinstance(email, str) or "@" not in email:
                raise BadRequest("email", "expected an e-mail address")
            _plain("email", email, MAX_EMAIL_CHARS)
        return SaleRequest(
            source=self.name,
            flow=flow,
            amount_cents=amount,
            product=product,
            terminal=terminal,
            email=email,
            plan=plan,
            metadata=customer,
            max_cents=self.config["max_price"],
            vend_timeout=self.config.get("vend_timeout"),
        )

    def _flow(self, value: Any) -> Flow:
        try:
            return Flow(value)
        except ValueError:
            known = ", ".join(f.value for f in Flow)
            raise BadRequest("flow", f"expected one of {known}, got {value!r}") from None

    def _amount(
        self, body: dict[str, Any], product: str | None, products: dict[str, int], flow: Flow,
        plan: dict[str, str] | None,
    ) -> int:
        listed = products.get(product) if product is not None else None
        if self.config["products_only"] and listed is None:
            raise BadRequest("product", f"expected one of {', '.join(sorted(products)) or 'none'}")
        if "amount" not in body:
            if listed is not None:
                return listed
            if flow is Flow.ENROLL and plan is not None:
                return parse_price(plan["amount"])  # what the reader shows: the plan's payment
            if flow is Flow.ENROLL:
                # the reader shows an amount while it reads the card; no money is taken
                raise BadRequest("amount", "required for an enrollment without a plan: the "
                                 "reader shows it while it reads the card (nothing is charged)")
            raise BadRequest("amount", "required (or a configured product)")
        try:
            cents = parse_price(body["amount"])
        except MoneyError as err:
            raise BadRequest("amount", str(err)) from None
        if listed is not None and cents != listed:
            price, asked = cents_to_dollars(listed), cents_to_dollars(cents)
            raise BadRequest("amount", f"{product} costs {price}, not {asked}")
        if cents <= 0:
            raise BadRequest("amount", "expected an amount above zero")
        return cents

    async def _get_sale(self, request: web.Request) -> web.Response:
        event = self._latest.get(request.match_info["sale_id"])
        if event is None:
            return _error(404, "not_found", "sale_id", "no such sale from this kiosk")
        return web.json_response(text=event_text(event))

    async def _cancel_sale(self, request: web.Request) -> web.Response:
        sale_id = request.match_info["sale_id"]
        if sale_id not in self._latest and sale_id not in self._dispensers:
            return _error(404, "not_found", "sale_id", "no such sale from this kiosk")
        dispenser = self._dispensers.get(sale_id)
        if dispenser is not None:
            # a sale waiting for the app to dispense: the customer gave up, nothing came out
            dispenser.confirm_result(DispenseStatus.CANCELLED, "cancelled by the app")
        cancelled = bool(await self.agent.sales.cancel(sale_id))
        return web.json_response({"sale_id": sale_id, "cancelled": cancelled}, status=202)

    async def _dispensed(self, request: web.Request) -> web.Response:
        sale_id = request.match_info["sale_id"]
        body = await _json_body(request)
        status_text = body.get("status")
        if status_text not in ("vended", "failed"):
            raise BadRequest("status", f'expected "vended" or "failed", got {status_text!r}')
        detail = body.get("detail", "")
        if not isinstance(detail, str):
            raise BadRequest("detail", "expected a string")
        _plain("detail", detail, MAX_DETAIL_CHARS)
        dispenser = self._dispensers.get(sale_id)
        if dispenser is None and sale_id not in self._latest and not self.late.keeps(sale_id):
            # another trigger's sale (a second app's, a machine's): never this app's word
            return _error(404, "not_found", "sale_id", "no such sale from this kiosk")
        if dispenser is None and self.late.restart_result(
                DispenseStatus(status_text), detail, sale_id):
            # left dispensing by the last stop or crash; recovery listened until its vend timeout
            return web.json_response({"sale_id": sale_id, "status": status_text}, status=202)
        if dispenser is None or not dispenser.confirm_result(DispenseStatus(status_text), detail):
            if status_text == "vended" and self._late(sale_id, dispenser):
                return _error(409, "not_dispensing", "sale_id", (
                    "this sale stopped waiting for the dispense at its vend timeout and gives "
                    "its money back: the product went out unpaid"))  # fmt: skip
            if dispenser is not None:  # a sale given up on: its failure closes its maybe
                self.late.gave_up(dispenser)
            if status_text == "failed" and self.late.failed(sale_id, detail or "failed"):
                return _error(409, "not_dispensing", "sale_id", (
                    "this sale stopped waiting for the dispense at its vend timeout and gave "
                    "its money back: noted that nothing went out"))  # fmt: skip
            return _error(409, "not_dispensing", "sale_id", "this sale is not waiting to dispense")
        return web.json_response({"sale_id": sale_id, "status": status_text}, status=202)

    def _late(self, sale_id: str, dispenser: AppDispenser | None) -> bool:
        """Whether a "vended" for ``sale_id`` came after the sale gave up on it."""
        if dispenser is not None:
            self.late.gave_up(dispenser)
        return self.late.heard(sale_id)

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        """A WebSocket of steps: one sale's (``/sales/{sale_id}/events``, closed after its last)
        or every sale's of this app (``/events``). One coroutine for both routes, its slot held
        in it: each wake-up of a stream resumes every coroutine the handler awaits in, so two
        fewer of them are two Python calls fewer at each."""
        sale_id = request.match_info.get("sale_id")
        if sale_id is not None and sale_id not in self._latest and sale_id not in self._dispensers:
            return _error(404, "not_found", "sale_id", "no such sale from this kiosk")
        slot = stream_slot(request)
        if slot is None:
            return _error(503, "too_many_streams", None,
                          "every event stream slot is taken; retry, or poll the sale")
        # the app sends nothing but a close: a larger frame is refused before it is buffered.
        # No permessage-deflate (a browser offers it): a step is a few hundred bytes on the
        # kiosk's own machine, and zlib on each would cost more CPU than the bytes it saves.
        # A sale's own stream ends with its sale, whose deadlines bound it: no heartbeat (its
        # timer armed and re-armed on every sale); the app-wide stream lives on, and pings.
        with slot:
            ws = web.WebSocketResponse(
                heartbeat=None if sale_id else 15.0, max_msg_size=MAX_STREAM_FRAME, compress=False
            )
            heard = client_heard(request)  # before the 101: the app may speak only after it
            await ws.prepare(request)
            self._sockets.add(ws)
            reader: asyncio.Task[None] | None = None
            try:
                # only this app's steps are queued (_follow): a busy bus elsewhere costs nothing
                # here; a sale's own stream is handed its sale's steps by key, none filtered out
                async with self._frames.subscribe(key=sale_id) as queue:
                    # the follower filed every step published before (a listener: at once)
                    latest = self._latest.get(sale_id) if sale_id else None
                    if latest is not None:
                        await ws.send_str(event_text(latest))
                        if latest.state.final:
                            return ws
                    written = _write_at_once(queue, ws, request, heard) if sale_id else None
                    while not ws.closed:
                        # what the app sends (its close, a ping) is read from the first byte it
                        # sends: until then no reader task waits beside the stream
                        if reader is None and (heard is None or heard.done()):
                            reader = asyncio.create_task(_drain(ws))
                        listening = reader or heard
                        if listening is None:
                            raise RuntimeError("a sale's event stream with nothing to listen to")
                        ends = (listening,) if written is None else (listening, written)
                        frame = await queue.next(*ends)
                        if frame is None:
                            if written is not None and written.done():
                                break  # the sale's end went out at once: nothing more to send
                            if reader is None:
                                continue  # the app spoke: read it from now on
                            break  # the app closed the socket
                        missed = queue.take_missed()
                        if missed:  # the app fell behind: it must not take a hole for a whole
                            await ws.send_json(gap_json(missed, sale_id))
                        event, text = frame
                        await ws.send_str(text)
                        if sale_id is not None and event.state.final:
                            break
            finally:
                await cancel_and_wait(reader)
                self._sockets.discard(ws)
                await ws.close()
            return ws

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response({"name": self.name, **self.status()})


def _write_at_once(
    queue: Subscription[_Frame], ws: web.WebSocketResponse, request: web.Request,
    heard: asyncio.Future[None] | None,
) -> asyncio.Future[None] | None:
    """Have a sale's own stream write each of its steps as it is published, from the listener
    itself, while nothing waits before it: no queue, no wake-up of the handler and the six
    coroutines it awaits in, no aiohttp send coroutines (some 50 Python calls a sale). Only while
    the app has sent nothing (nothing of aiohttp's then writes on the socket: no heartbeat on a
    sale's stream, no pong, no close) and the socket has taken every byte so far; else the step is
    queued and the handler sends it as before (a slow app: its bound, its gaps). The future
    returned is set once the sale's end went out that way: the handler then closes."""
    transport = request.transport
    if heard is None or transport is None:
        return None  # a bare test app: the handler sends all
    written: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def write(frame: _Frame) -> bool:
        if heard.done() or ws.closed or transport.is_closing():
            return False
        if transport.get_write_buffer_size():  # the app is behind: queued, bounded, as before
            return False
        event, text = frame
        transport.write(text_frame(text))
        if event.state.final and not written.done():
            written.set_result(None)
        return True

    queue.deliver = write
    return written


_FRAME_HEAD_SHORT = struct.Struct("!BB").pack
_FRAME_HEAD_16 = struct.Struct("!BBH").pack
_FRAME_HEAD_64 = struct.Struct("!BBQ").pack


def text_frame(text: str) -> bytes:
    """A WebSocket text message in one frame as a server sends it (RFC 6455 5.2: FIN, opcode 1,
    unmasked, no extension), the bytes aiohttp's writer makes of ``send_str`` on a stream
    without compression (tests/platforms/test_kiosk_api.py holds it to them)."""
    payload = text.encode("utf-8")
    size = len(payload)
    if size < 126:
        return _FRAME_HEAD_SHORT(0x81, size) + payload
    if size < 65536:
        return _FRAME_HEAD_16(0x81, 126, size) + payload
    return _FRAME_HEAD_64(0x81, 127, size) + payload


async def _drain(ws: web.WebSocketResponse) -> None:
    """Read (and ignore) what the app sends, so a close from its side is noticed."""
    async for message in ws:
        if message.type in (WSMsgType.CLOSE, WSMsgType.ERROR):
            break


async def _json_body(request: web.Request) -> dict[str, Any]:
    body = await read_json(request)  # BodyError: the middleware answers it
    if not isinstance(body, dict):
        raise BadRequest("body", "expected a JSON object")
    return body


# allowed Host headers kept as sent (KioskApi._hosts_seen): an app's few spellings of its host
_HOSTS_SEEN_KEPT = 16


def _is_websocket_handshake(request: web.Request) -> bool:
    return request.method == "GET" and request.headers.get("Upgrade", "").lower() == "websocket"


def _host_name(header: str) -> str:
    """The name in a Host header, without its port: ``[::1]:80`` -> ``::1``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    name, _, port = header.rpartition(":")
    return name if name and port.isdigit() else header


def _origin_allowed(origin: str, allowed: list[str]) -> bool:
    for pattern in allowed:
        if pattern.endswith(":*"):
            base = pattern[:-2]
            if origin == base or (
                origin.startswith(base + ":") and origin[len(base) + 1 :].isdigit()
            ):
                return True
        elif origin == pattern:
            return True
    return False


def _error(status: int, error: str, field: str | None, message: str) -> web.Response:
    return _json_response({"error": error, "field": field, "message": message}, status=status)


def _unexpected(detail: str) -> web.Response:
    """A handler's unexpected error (a bug), said in this API's error form (LocalSite)."""
    response = _error(503, "unavailable", None, detail)
    response.headers["Retry-After"] = str(UNEXPECTED_RETRY_AFTER_S)
    return response


def _json_response(body: dict[str, Any], status: int) -> web.Response:
    """``web.json_response`` of a flat body made here, by the frames' encoder (the same text
    as ``json.dumps``: three Python calls fewer, at every sale's 202)."""
    return web.json_response(text="".join(_encode(body, 0)), status=status)


async def async_setup_platform(agent: Any, config: dict[str, Any]) -> KioskApi:
    api = KioskApi(agent, config)
    await api.start()
    return api
