"""The status page for the field tech, served at the admin API's ``/``.

Plain HTML, CSS and a little JavaScript from ``admin/static/`` (package data: no build step,
nothing fetched from outside). The page reads the same API as everyone else, with a session
cookie instead of a bearer token:

    GET    /                   the page (public: it holds no data and asks to log in)
    GET    /static/{name}      its stylesheet and script (public)
    POST   /session            log in: {"token": ...} -> session cookie; answers {role, csrf}
    GET    /session            the current session {role, csrf}; both null without one
    DELETE /session            log out
    GET    /api/page           everything the page shows, in one answer
    GET    /api/events         server-sent events: health changes and sale steps as they happen
    GET    /api/doctor         the last run of the doctor's checks
    POST   /api/doctor         run them now (admin): answers at once (202), ?wait=S for the end

Authentication never puts a token in a URL: the login form posts the token once, and the
answer sets ``kiosk_session``, an HttpOnly, SameSite=Strict cookie (Secure over HTTPS) naming a
random session held in memory. A cookie-authenticated request that changes anything must carry
the session's CSRF token in ``X-CSRF-Token`` and come from the page's own origin (``Origin``);
the login itself must come from that origin too. Roles are the API's: a session gets the role of
the token that opened it, and the admin API's auth middleware applies the same rules to both.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import re
import secrets
import shlex
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from kiosk_agent.card_brands import card_brand_name
from kiosk_agent.doctor import Report, Verdict, check_running
from kiosk_agent.health.model import UNIX_TIMES
from kiosk_agent.health.readers import availability, held_by_recovery
from kiosk_agent.logs import RefusalLog
from kiosk_agent.moments import day_bounds
from kiosk_agent.money import format_cents
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sales.journal import SaleRecord, StepRecord
from kiosk_agent.sales.kinds import SaleKind, no_selection, sessions_text
from kiosk_agent.sales.late_vends import late_vend_of
from kiosk_agent.sales.model import SaleEvent, money_text
from kiosk_agent.sales.unit import others_open
from kiosk_agent.tasks import BackgroundTask
from kiosk_agent.web.server import read_json, stream_slot

_LOGGER = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
COOKIE = "kiosk_session"
CSRF_HEADER = "X-CSRF-Token"
SESSION_LIFETIME_S = 12 * 3600.0  # one long shift; then log in again
MAX_SESSIONS = 32  # the oldest session goes when a new one would pass this
MAX_STREAMS = 16  # event streams open at once; more are refused with 503
HEALTH_POLL_S = 0.2  # how often a stream looks for a health change (the page is <= 1 s behind)
KEEPALIVE_S = 10.0  # a comment line on a quiet stream, so a gone client is noticed
# A stream whose client takes nothing for this long (its socket full) is cut: a client that
# never reads must not hold one of the MAX_STREAMS slots, nor its buffers, for ever. Counted on
# the agent's clock (StatusPage.clock), as its other deadlines are: a test moves it.
STREAM_WRITE_TIMEOUT_S = 10.0
# The kernel's send buffer of a stream's socket: a client that never reads holds at most this
# (the kernel doubles it) besides aiohttp's 64 KiB, where autotuning let each stream hold up to
# 4 MB (MAX_STREAMS of them: 64 MB on a small unit). A stream sends a few KB a minute.
STREAM_SEND_BUFFER = 64 * 1024
# Wrong tokens (login or bearer) one address may present in GUESS_WINDOW_S; then 429 until the
# oldest is that old. A token has >= 24 characters: this only keeps a script from trying.
GUESSES_ALLOWED = 10
GUESS_WINDOW_S = 60.0
_GUESSERS_KEPT = 1024  # addresses remembered; the quietest goes first
RECENT_SALES = 20
DOCTOR_WITHIN_S = 10.0
# POST /api/doctor?wait=S: the longest a caller may wait for the run's verdicts
DOCTOR_WAIT_MAX_S = 60.0
RECONNECT_MS = 1000  # how long a browser waits before it opens a lost stream again
REPLAY_LIMIT = 1000  # steps a reconnecting follower is sent from the journal

_PUBLIC = frozenset({"/", "/session"})
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_CONTENT_TYPES = {".css": "text/css", ".js": "text/javascript", ".html": "text/html"}
# The page runs nothing but its own script and style, and cannot be framed.
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

TokenFor = Callable[[str | None], tuple[str | None, str | None]]  # header -> (name, role)


@dataclass(slots=True)
class _Session:
    role: str
    csrf: str
    expires_at: float  # monotonic: a wall-clock step neither ends nor stretches a session
    token: str = ""  # the name of the token that opened it


class TokenGuesses:
    """Wrong tokens by address, in a sliding window: a guessing script is slowed to
    :data:`GUESSES_ALLOWED` a :data:`GUESS_WINDOW_S`, and while it waits even the right token is
    not looked at (else the answer would still tell it when it guessed right)."""

    def __init__(self) -> None:
        self._wrong: dict[str, list[float]] = {}

    def wait(self, address: str | None) -> float:
        """Seconds the address must wait before its next token is looked at (0: go ahead)."""
        times = self._recent(_client(address))
        if len(times) < GUESSES_ALLOWED:
            return 0.0
        return max(0.0, times[0] + GUESS_WINDOW_S - time.monotonic())

    def wrong(self, address: str | None) -> None:
        key = _client(address)
        times = self._recent(key)
        times.append(time.monotonic())
        self._wrong.pop(key, None)
        self._wrong[key] = times[-GUESSES_ALLOWED:]  # newest last: the dict's end
        while len(self._wrong) > _GUESSERS_KEPT:
            del self._wrong[next(iter(self._wrong))]

    def refusal(self, address: str | None) -> web.Response:
        wait = self.wait(address)
        return web.json_response(
            {
                "error": "too_many_guesses",
                "detail": f"{GUESSES_ALLOWED} wrong tokens from {address} within "
                f"{GUESS_WINDOW_S:g} s; try again in {math.ceil(wait)} s",
            },
            status=429,
            headers={"Retry-After": str(max(1, math.ceil(wait))), **_NO_STORE},
        )

    def clear(self) -> None:
        self._wrong.clear()

    def _recent(self, key: str) -> list[float]:
        since = time.monotonic() - GUESS_WINDOW_S
        return [t for t in self._wrong.get(key, []) if t > since]


def _client(address: str | None) -> str:
    """Whom wrong tokens are counted against: an IPv4 address, or an IPv6 address's /64 (one
    host picks any address in it)."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return address or "?"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:  # an IPv4 client on a dual-stack socket
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class StatusPage:
    """The page's routes and sessions; the admin API asks it for a cookie's role."""

    def __init__(self, agent: Any, token_for: TokenFor, guesses: TokenGuesses) -> None:
        self.agent = agent
        # the agent's clock (injected; a test's FakeClock): a stream's write timeout waits on it
        self.clock: Clock = getattr(agent, "clock", SYSTEM_CLOCK)
        self._token_for = token_for  # the admin API's: "Bearer <token>" -> (name, role)
        self._guesses = guesses  # the admin API's: wrong tokens count the same at either door
        self.stalled_streams = 0  # event streams cut because their client took nothing
        # anyone can repeat a refused login or a cross-site post: logged as a summary, counted
        self.refused = RefusalLog(_LOGGER, "status_page")
        self._sessions: dict[bytes, _Session] = {}  # by the digest of the cookie's value
        self._static = {
            p.name: p.read_bytes() for p in STATIC_DIR.iterdir() if p.suffix in _CONTENT_TYPES
        }
        self._closing = asyncio.Event()
        self._streams = 0
        self.doctor: Report | None = None
        self._doctor_task = BackgroundTask(self._run_doctor, "status-page-doctor")
        self._doctor_done = asyncio.Event()
        self._doctor_problems: list[str] = []  # the health's problems when the checks began
        self._doctor_run = Report()  # the run under way (or the last): its checks so far

    def add_routes(self, app: web.Application) -> None:
        self._closing = asyncio.Event()
        router = app.router
        router.add_get("/", self.index)
        router.add_get("/static/{name}", self.static)
        router.add_post("/session", self.login)
        router.add_get("/session", self.session)
        router.add_delete("/session", self.logout)
        router.add_get("/api/page", self.overview)
        router.add_get("/api/events", self.events)
        router.add_get("/api/doctor", self.doctor_report)
        router.add_post("/api/doctor", self.run_doctor)
        app.on_shutdown.append(self._on_shutdown)

    async def _on_shutdown(self, app: web.Application) -> None:
        self._closing.set()  # open event streams end now, not at the server's shutdown timeout
        await self._doctor_task.stop()

    # -- authentication ----------------------------------------------------------------------

    def public(self, request: web.Request) -> bool:
        """Routes that need no token: the page itself, its files, and the login."""
        return request.path in _PUBLIC or request.path.startswith("/static/")

    def session_auth(self, request: web.Request) -> tuple[str | None, str | None]:
        """(caller, role) of the request's session cookie, or (None, None); a cross-site action
        is refused. The caller names the token that opened the session, for the journal."""
        session = self._session(request)
        if session is None:
            return None, None
        if "Origin" in request.headers or request.method not in _SAFE_METHODS:
            self._check_origin(request)  # a read from another site's script is refused too
        if request.method not in _SAFE_METHODS:
            presented = request.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(presented.encode(), session.csrf.encode()):
                raise _forbidden("csrf", f"send the session's {CSRF_HEADER} header")
        return f"{session.token}, status page" if session.token else "status page", session.role

    def _session(self, request: web.Request) -> _Session | None:
        value = request.cookies.get(COOKIE)
        if not value:
            return None
        key = _digest(value)
        session = self._sessions.get(key)
        if session is None:
            return None
        if session.expires_at <= time.monotonic():
            del self._sessions[key]
            return None
        return session

    async def login(self, request: web.Request) -> web.Response:
        self._check_origin(request)
        body = await read_json(request)  # bounded; a BodyError is the error middleware's 4xx
        token = body.get("token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token.strip():
            return _error(400, "bad_parameter", 'send {"token": "..."} with the admin API token')
        if self._guesses.wait(request.remote):
            self.refused("guessing", "status page: %s is guessing tokens", request.remote)
            return self._guesses.refusal(request.remote)
        name, role = self._token_for(f"Bearer {token.strip()}")
        if role is None:
            self._guesses.wrong(request.remote)
            self.refused(
                "login", "status page: refused a login from %s: no such token", request.remote
            )
            return _error(401, "unauthorized", "that token is not configured for this unit")
        value = secrets.token_urlsafe(32)
        expires_at = time.monotonic() + SESSION_LIFETIME_S
        session = _Session(role, secrets.token_urlsafe(24), expires_at, name or "")
        self._forget_expired()
        while len(self._sessions) >= MAX_SESSIONS:
            # the oldest of this token's own sessions: a script logging in again and again with
            # one token (a read token, say) never logs the tech out; else the oldest of all
            own = [k for k, s in self._sessions.items() if s.token == session.token]
            oldest = min(own or self._sessions, key=lambda k: self._sessions[k].expires_at)
            del self._sessions[oldest]
        self._sessions[_digest(value)] = session
        _LOGGER.info("status page: %s session opened from %s", role, request.remote)
        response = web.json_response({"role": role, "csrf": session.csrf}, headers=_NO_STORE)
        response.set_cookie(
            COOKIE,
            value,
            max_age=int(SESSION_LIFETIME_S),
            path="/",
            httponly=True,
            samesite="Strict",
            # behind a TLS proxy (which says so) too; a client that lies only hides its cookie
            secure=request.secure or _forwarded_https(request),
        )
        return response

    async def session(self, request: web.Request) -> web.Response:
        session = self._session(request)
        if session is not None and "Origin" in request.headers:
            self._check_origin(request)  # its CSRF token is for the page's own script only
        if session is None:  # not an error: the page asks before it shows the login form
            return web.json_response({"role": None, "csrf": None}, headers=_NO_STORE)
        return web.json_response({"role": session.role, "csrf": session.csrf}, headers=_NO_STORE)

    async def logout(self, request: web.Request) -> web.Response:
        if self._session(request) is not None:
            self.session_auth(request)  # logging out is an action: same CSRF rules
            self._sessions.pop(_digest(request.cookies[COOKIE]), None)
        response = web.json_response({"logged_out": True}, headers=_NO_STORE)
        response.del_cookie(COOKIE, path="/")
        return response

    def _check_origin(self, request: web.Request) -> None:
        """A browser names the page that sent a POST; it must be this server's own."""
        origin = request.headers.get("Origin")
        if origin is None:
            raise _forbidden("origin", "a browser action must carry its Origin")
        if urlsplit(origin).netloc != request.host:
            self.refused(
                "origin",
                "status page: refused %s %s from origin %r",
                request.method,
                request.path,
                origin,
            )
            raise _forbidden("origin", "actions are only taken from this unit's own status page")

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for key in [k for k, s in self._sessions.items() if s.expires_at <= now]:
            del self._sessions[key]

    # -- the page and its files --------------------------------------------------------------

    async def index(self, request: web.Request) -> web.Response:
        return self._file("index.html")

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self._static or name == "index.html":
            return _error(404, "not_found", f"no file {name!r}")
        return self._file(name)

    def _file(self, name: str) -> web.Response:
        content_type = _CONTENT_TYPES[Path(name).suffix]
        return web.Response(
            body=self._static[name],
            headers={**_PAGE_HEADERS, "Content-Type": f"{content_type}; charset=utf-8"},
        )

    # -- what the page shows -----------------------------------------------------------------

    async def overview(self, request: web.Request) -> web.Response:
        """Everything on the page in one answer (the event stream keeps it fresh)."""
        snapshot = self.agent.health.snapshot().model_dump(mode="json", context=UNIX_TIMES)
        journal = getattr(self.agent, "journal", None)
        recent: list[dict[str, Any]] = []
        open_sales: list[dict[str, Any]] = []
        attention: list[dict[str, Any]] = []
        apart = ""  # today's card sessions of no selection, said under "Sales today"
        if journal is not None:
            midnight, next_midnight = day_bounds(journal.clock.time())  # the rule of days
            sessions = journal.count(since=midnight, until=next_midnight,
                                     kind=SaleKind.NO_SELECTION)
            apart = f"not sales: {sessions_text(sessions)}" if sessions else ""
            # sales only (sales.kinds): a card-first machine's idle sessions are no sale
            for record in journal.query(limit=RECENT_SALES, kind=SaleKind.SALE):
                held = journal.steps(record.sale_id)
                steps = [
                    {"at": s.at, "step": s.step, "state": s.state.value, "detail": s.detail}
                    for s in held
                ]
                # a late vend's sale reads "reversed": its line says the product went out
                vend = late_vend_of(held)
                recent.append({**sale_view(record), "steps": steps,
                               "late_vend": vend.text() if vend is not None else None})
            # an open sale of another unit id needs a person too: the agent will not finish it
            others = others_open(journal)
            theirs = {r.sale_id for r, _ in others}
            open_sales = [sale_view(r) for r in journal.open_sales() if r.sale_id not in theirs]
            attention = [{**sale_view(r), "why": why} for r, why in others]
            attention += [sale_view(r) for r in journal.attention_sales()]
        if self.doctor is None and not self._doctor_task.started:
            self._start_doctor()  # the first look runs the checks once, in the background
        return web.json_response(
            {
                **health_view(snapshot, self._config_path()),
                "platforms": self._platforms(),
                "recent": recent,
                "open": open_sales,
                "attention": attention,
                "no_selection_today": apart,
                "doctor": self._doctor_view(),
            },
            headers=_NO_STORE,
        )

    def _config_path(self) -> str | None:
        path = getattr(getattr(self.agent, "config", None), "path", None)
        return str(path) if path is not None else None

    def _platforms(self) -> list[dict[str, Any]]:
        platforms = []
        for platform in getattr(self.agent, "platforms", []):
            try:
                status = dict(platform.status())
            except Exception as err:  # noqa: BLE001 - one platform's status must not break the page
                status = {"error": f"{type(err).__name__}: {err}"}
            platforms.append({"name": str(platform.name), "status": _jsonable(status)})
        for name, why in getattr(self.agent, "not_started", {}).items():
            # a configured trigger that is not running is shown, with why, not left out
            platforms.append({"name": name, "status": {"available": False, "cannot_start": why}})
        return platforms

    # -- live events -------------------------------------------------------------------------

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: ``health`` (whenever it changes), ``note`` and ``sale`` lines."""
        if self._streams >= MAX_STREAMS:
            return _error(503, "busy", f"{MAX_STREAMS} event streams are open already")
        slot = stream_slot(request)  # the server's own bound: streams never take request slots
        if slot is None:
            return _error(503, "busy", "every event stream slot of this server is taken")
        self._streams += 1
        try:
            with slot:
                return await self._events(request)
        finally:
            self._streams -= 1

    async def _events(self, request: web.Request) -> web.StreamResponse:
        since = _since(request)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        _bound_send_buffer(request)
        try:
            await self._write(response, f"retry: {RECONNECT_MS}\n\n".encode())  # a browser's wait
            await self._stream(response, self._alive(request), since)
        except _Stalled:
            self.stalled_streams += 1
            self.refused(
                "stalled_stream",
                "status page: cut an event stream to %s: it took nothing for %g s",
                request.remote,
                STREAM_WRITE_TIMEOUT_S,
            )
            if request.transport is not None:
                request.transport.abort()  # its unsent buffer goes with it
        return response

    def _alive(self, request: web.Request) -> Callable[[], bool]:
        """Whether the request's authentication still holds: a stream opened with the session
        cookie ends with its session (logged out, expired, replaced); a bearer token's does not
        (tokens change with the configuration, which restarts the agent)."""
        if self._token_for(request.headers.get("Authorization"))[1] is not None:
            return lambda: True
        session = self._session(request)
        return lambda: session is not None and self._session(request) is session

    async def _stream(
        self, response: web.StreamResponse, alive: Callable[[], bool], since: float | None = None
    ) -> None:
        last_health: dict[str, Any] | None = None
        last_platforms: list[dict[str, Any]] | None = None
        quiet_since = time.monotonic()
        doctor_seen: object = _NOT_SENT  # the first round sends it: the page may hold an old one
        try:
            async with self.agent.events.subscribe() as queue:
                # subscribed first: a step journaled while the journal is read comes live too
                replayed = await self._replay(response, since) if since is not None else set()
                while not self._closing.is_set() and alive():
                    snapshot = self.agent.health.snapshot().model_dump(
                        mode="json", context=UNIX_TIMES)  # its times are the stream's cursor
                    # a platform's reader and machine change with availability, not with a
                    # sale step: they go in the same event as the health they follow
                    platforms = self._platforms()
                    if health_changed(last_health, snapshot) or platforms != last_platforms:
                        for note in health_changes(last_health, snapshot):
                            await self._send(response, "note", {"at": snapshot["at"], **note})
                        await self._send(
                            response, "health",
                            {**health_view(snapshot, self._config_path()), "platforms": platforms},
                        )
                        last_health, last_platforms = snapshot, platforms
                        quiet_since = time.monotonic()
                    await self._doctor_follows(snapshot["problems"])
                    # a run starting says so too: the card shows its checks are being made again
                    doctor_now = (self.doctor, self._doctor_running())
                    if doctor_now != doctor_seen:
                        doctor_seen = doctor_now
                        await self._send(response, "doctor", self._doctor_view())
                    try:
                        async with asyncio.timeout(HEALTH_POLL_S):
                            event = await queue.get()
                    except TimeoutError:
                        event = None
                    if event is not None:
                        missed = queue.take_missed()
                        if missed:  # this reader fell behind: its history has a hole here
                            await self._send(response, "gap", gap_view(missed))
                        view = sale_event_view(event)
                        if _step_key(view) not in replayed:  # sent already from the journal
                            await self._send(response, "sale", view)
                        quiet_since = time.monotonic()
                    elif time.monotonic() - quiet_since > KEEPALIVE_S:
                        await self._write(response, b": keepalive\n\n")
                        quiet_since = time.monotonic()
        except (ConnectionResetError, ConnectionError):
            return  # the page went away

    async def _replay(self, response: web.StreamResponse, since: float) -> set[tuple[Any, ...]]:
        """The sale steps journaled since ``since`` (a follower that lost its connection: what
        it missed), each a ``sale`` event with ``replayed: true``, then ``replayed`` with how
        many; past REPLAY_LIMIT a ``gap`` says how many more the journal has."""
        journal = getattr(self.agent, "journal", None)
        steps = journal.steps_since(since, REPLAY_LIMIT + 1) if journal is not None else []
        sent: set[tuple[Any, ...]] = set()
        records: dict[str, SaleRecord | None] = {}
        for step in steps[:REPLAY_LIMIT]:
            if step.sale_id not in records:
                records[step.sale_id] = journal.get(step.sale_id) if journal else None
            record = records[step.sale_id]
            if record is None:
                continue
            view = {**step_event_view(record, step), "replayed": True}
            sent.add(_step_key(view))
            await self._send(response, "sale", view)
        if len(steps) > REPLAY_LIMIT:
            await self._send(response, "gap", gap_view(len(steps) - REPLAY_LIMIT))
        await self._send(
            response, "replayed", {"count": len(sent), "since": since, "at": time.time()}
        )
        return sent

    async def _send(self, response: web.StreamResponse, event: str, data: dict[str, Any]) -> None:
        # a sale step's time is its id: a browser reconnecting sends it back (Last-Event-ID), and
        # the steps journaled from then come first
        stamp = f"id: {data['at']!r}\n" if event == "sale" else ""
        await self._write(response, f"{stamp}event: {event}\ndata: {json.dumps(data)}\n\n".encode())

    async def _write(self, response: web.StreamResponse, data: bytes) -> None:
        """One write to a stream; :class:`_Stalled` when the client takes nothing for
        STREAM_WRITE_TIMEOUT_S on the agent's clock."""
        try:
            await self.clock.wait_for(response.write(data), STREAM_WRITE_TIMEOUT_S)
        except TimeoutError:
            raise _Stalled from None

    # -- doctor ------------------------------------------------------------------------------

    async def doctor_report(self, request: web.Request) -> web.Response:
        return web.json_response(self._doctor_view(), headers=_NO_STORE)

    async def run_doctor(self, request: web.Request) -> web.Response:
        """Run the doctor's checks now (admin), or follow the run under way: answers at once,
        202 with the run's progress beside the last run's verdicts (its journal check alone,
        SQLite's quick check of a year's file, takes a second of a core); ``?wait=S`` waits up
        to S seconds for this run's verdicts (200 once it ended). GET /api/doctor and the
        page's stream say when it has."""
        text = request.query.get("wait", "0")
        try:
            wait = float(text)
        except ValueError:
            wait = math.nan
        if not 0 <= wait <= DOCTOR_WAIT_MAX_S:  # NaN too
            return _error(400, "bad_parameter", f"wait is seconds from 0 to "
                          f"{DOCTOR_WAIT_MAX_S:g}, got {text[:40]!r}")
        if not self._doctor_running():
            await self._doctor_task.stop()  # the finished run's task
            self._start_doctor()
        if wait:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._doctor_done.wait()
        status = 202 if self._doctor_running() else 200
        return web.json_response(self._doctor_view(), status=status, headers=_NO_STORE)

    async def _doctor_follows(self, problems: list[str]) -> None:
        """The checks again once the health's problems are not those they ran beside: a Doctor
        card saying "0 failed" under a DOWN status would be a report of another moment. Only
        while a page watches, and one run at a time (a change during a run: one more after)."""
        if self.doctor is None or _shapes(self._doctor_problems) == _shapes(problems):
            return  # a count or a countdown moving ("API key expires in 3599 s") is no change
        if self._doctor_running():
            return  # running: the next look after it ends sees the difference
        await self._doctor_task.stop()  # the finished run's task
        self._start_doctor()

    def _start_doctor(self) -> None:
        self._doctor_problems = list(self.agent.health.snapshot().problems)
        self._doctor_done = asyncio.Event()
        self._doctor_run = Report()  # its checks as they are made: the run's progress
        self._doctor_task.start()

    async def _run_doctor(self) -> None:
        done = self._doctor_done
        try:
            links = {link.name: link for link in self.agent.health.snapshot().links}
            self.doctor = await check_running(
                self.agent.config, self.agent.service, within=DOCTOR_WITHIN_S, links=links,
                report=self._doctor_run,
            )
        except Exception as err:
            _LOGGER.exception("status page: the doctor's checks failed")
            report = Report()
            report.add("doctor", Verdict.FAIL, f"the checks broke: {type(err).__name__}: {err}")
            report.finished_at = time.time()
            self.doctor = report
        finally:
            done.set()

    def _doctor_running(self) -> bool:
        return self._doctor_task.started and not self._doctor_done.is_set()

    def _doctor_view(self) -> dict[str, Any]:
        """The last run's verdicts (its ``finished_at`` says how old they are) and, while a run
        is under way, ``run``: when it began and the checks it has made so far."""
        running = self._doctor_running()
        view: dict[str, Any] = {"running": running, "checks": [], "failed": 0,
                                "finished_at": None}
        if self.doctor is not None:
            view = {**self.doctor.as_dict(), "running": running}
        if running:
            view["run"] = {"started_at": self._doctor_run.started_at,
                           "checked": [c.name for c in self._doctor_run.checks]}
        return view


# -- views -------------------------------------------------------------------------------------


def sale_view(record: SaleRecord) -> dict[str, Any]:
    """One journal record for the page: its fields plus what people read (the page does no
    money arithmetic): ``money`` says what was charged once it ended, what is held while it
    runs; ``card`` names the brand (``Mastercard 2397``)."""
    data = record.as_dict()
    data["amount"] = format_cents(record.amount_cents, record.currency)
    data["captured"] = format_cents(record.captured_cents, record.currency)
    data["money"] = money_text(record)
    brand = card_brand_name(record.card_brand)
    data["card"] = " ".join(part for part in (brand, record.last_four) if part) or None
    return data


def sale_event_view(event: SaleEvent) -> dict[str, Any]:
    return {
        "sale_id": event.sale_id,
        "order_id": event.order_id,
        "state": event.state.value,
        "step": event.step,
        "terminal": event.terminal,
        "product": event.product,
        "source": event.source,
        "amount": format_cents(event.amount_cents, event.currency),
        "money": money_text(event),
        "kind": _kind(event),
        "message": event.message,
        "at": event.at or time.time(),
        "unwritten": event.unwritten,  # a step that could not be written (state: the journal's)
    }


def step_event_view(record: SaleRecord, step: StepRecord) -> dict[str, Any]:
    """A journaled step as the ``sale`` event it was published as (its money as the sale
    holds it now)."""
    message = step.detail.get("message") if isinstance(step.detail, dict) else None
    return {
        **_sale_fields(record),
        "state": step.state.value,
        "step": step.step,
        "message": message if isinstance(message, str) else "",
        "at": step.at,
    }


def _sale_fields(record: SaleRecord) -> dict[str, Any]:
    return {
        "sale_id": record.sale_id,
        "order_id": record.order_id,
        "terminal": record.terminal,
        "product": record.product,
        "source": record.source,
        "amount": format_cents(record.amount_cents, record.currency),
        "money": money_text(record),
        "kind": _kind(record),
    }


def _kind(sale: SaleRecord | SaleEvent) -> str:
    """``sale``, or ``no_selection``: a card session that ended with nothing chosen (the
    rule of every face, sales.kinds); the page and `events` say it is not a sale."""
    return (SaleKind.NO_SELECTION if no_selection(sale) else SaleKind.SALE).value


def _step_key(view: dict[str, Any]) -> tuple[Any, ...]:
    return (view["sale_id"], view["step"], view["state"], round(float(view["at"]), 3))


def _since(request: web.Request) -> float | None:
    """``?since=`` (Unix seconds), else the ``Last-Event-ID`` a reconnecting browser sends:
    the steps journaled from then are sent first."""
    text = request.query.get("since")
    if text is None:
        last = request.headers.get("Last-Event-ID", "")
        with contextlib.suppress(ValueError):
            if math.isfinite(float(last)) and float(last) >= 0:
                return float(last)
        return None  # no id, or not one this server sent: live events only
    try:
        since = float(text)
    except ValueError:
        since = math.nan
    if not math.isfinite(since) or since < 0:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "bad_parameter",
                             "detail": f"since must be a time in Unix seconds, got {text[:40]!r}"}),
            content_type="application/json",
        )  # fmt: skip
    return since


def gap_view(missed: int) -> dict[str, Any]:
    """The marker of steps a slow reader of the event stream lost (its queue was full): said
    where they were lost, so no one reads a history with a hole as if it were whole."""
    return {
        "missed": missed,
        "at": time.time(),
        "text": f"{missed} event(s) missed here: this reader fell behind the agent "
        "(the journal has every step: the sales list, `kiosk-agent sales`)",
    }


def health_view(snapshot: dict[str, Any], config: str | None = None) -> dict[str, Any]:
    """The health snapshot as the page shows it (the page never does arithmetic on money)."""
    return {
        "health": snapshot,
        "unit": unit_view(snapshot.get("unit") or {}, config),
        "availability": availability(snapshot),
        "today_amount": format_cents(int(snapshot["sales"]["today_amount_cents"])),
        # of those sales, what others gave back later at the service ("" none), in money_text's
        # words beside the day's takings, which stay what the sales captured
        "today_given_back": _given_back_today(snapshot["sales"]),
    }


def _given_back_today(sales: dict[str, Any]) -> str:
    cents = sales.get("today_given_back_cents")
    if type(cents) is not int or cents <= 0:
        return ""
    return f"{format_cents(cents)} given back since by others, at the service"


def unit_view(unit: dict[str, Any], config: str | None = None) -> dict[str, Any]:
    """The unit as the page shows it (health's ``unit``, read from the journal's ``unit_ids``):
    its id, the machine its journal was made on, and, while it is not confirmed on this
    machine, the banner a person acts on with the command to copy. The unit's key is never in
    health, so never here."""
    refusal = str(unit.get("mismatch") or "")  # why it takes no customer (empty: it does)
    elsewhere = str(unit.get("made_elsewhere") or "")  # what tells the machines apart
    command = "kiosk-agent unit adopt" + (f" -c {shlex.quote(config)}" if config else "")
    if elsewhere:
        banner = (f"This unit takes no customer until a person runs {command} here: its "
                  f"journal was made on another machine ({elsewhere}). Adopting gives it a new "
                  "id; the charges under the old id stay the original unit's.")
    else:
        banner = f"This unit takes no customer: {refusal}" if refusal else ""
    return {
        "id": unit.get("id") or "",
        "machine": unit.get("machine") or "",
        "made_at": unit.get("made_at"),
        "confirmed": not refusal,
        "made_elsewhere": elsewhere,
        "banner": banner,
        "command": command if elsewhere else "",
    }


def health_notes(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """What changed, in words, for the event log: status, problems raised and cleared."""
    return [note["text"] for note in health_changes(before, after)]


def health_changes(before: dict[str, Any] | None, after: dict[str, Any]) -> list[dict[str, Any]]:
    """What changed, each as ``{kind, text, device_id}``: ``status`` (ok -> degraded),
    ``problem`` (raised), ``cleared``, ``availability`` (a reader can or cannot take cards),
    ``audit`` (the machine's books reset: a new baseline, no problem).
    ``kiosk-agent events`` filters on the kind and the terminal."""
    if before is None:
        return []
    notes: list[dict[str, Any]] = []
    if before["status"] != after["status"]:
        notes.append(_note("status", f"status {before['status']} -> {after['status']}"))
    old, new = set(before["problems"]), set(after["problems"])
    devices = _devices(before) | _devices(after)
    raised = [p for p in after["problems"] if p not in old]
    cleared = [p for p in before["problems"] if p not in new]
    # a count that moved ("2 sale(s) need attention" -> 1) is one change, said as what cleared
    counted, raised, cleared = _counts_moved(cleared, raised)
    notes += counted
    notes += [_note("problem", f"problem: {p}", _named(p, devices)) for p in raised]
    notes += [_note("cleared", _cleared_text(p), _named(p, devices)) for p in cleared]
    was = {a["device_id"]: a for a in before.get("availability") or []}
    for state in after.get("availability") or []:
        device, earlier = state["device_id"], was.get(state["device_id"])
        if earlier is None or _takes(earlier) == _takes(state):
            continue
        if held_by_recovery(state):  # in service, held: no sale
            text = f"{device} cannot take cards: {state['recovering']}"
        elif state.get("available"):
            text = f"{device} can take cards" + ("" if earlier.get("starting") else " again")
        elif state.get("starting"):
            text = f"{device} cannot take cards yet: starting: {state.get('reason')}"
        else:
            text = f"{device} cannot take cards: {state.get('reason') or 'unavailable'}"
        notes.append(_note("availability", text, device))
    # the machine's books reset: no problem, so said here, once, as health holds it
    reset = (after.get("audit") or {}).get("books_reset") or ""
    if reset and reset != ((before.get("audit") or {}).get("books_reset") or ""):
        notes.append(_note("audit", f"{after['audit']['machine']}: {reset}"))
    return notes


def _takes(state: dict[str, Any]) -> tuple[bool, str]:
    """Whether a reader takes cards, and what recovery holds it for (health's availability):
    a change of either is one the event log says."""
    return bool(state.get("available")), str(state.get("recovering") or "")


_ATTENTION = re.compile(r"^(\d+) sale\(s\) need attention$")


def _shapes(problems: list[str]) -> set[str]:
    """Problems with their numbers left out: what they are about, not how many."""
    return {re.sub(r"\d+", "#", p) for p in problems}


def _counts_moved(
    cleared: list[str], raised: list[str]
) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """The problems that are one count moving (the same words, another number), each said as
    one note; the rest of ``cleared`` and ``raised`` as they were."""
    notes: list[dict[str, Any]] = []
    shape = {re.sub(r"\d+", "#", p): p for p in cleared}
    for now in list(raised):
        was = shape.get(re.sub(r"\d+", "#", now))
        if was is None:
            continue
        raised.remove(now)
        cleared.remove(was)
        notes.append(_count_note(was, now))
    return notes, raised, cleared


def _cleared_text(problem: str) -> str:
    """What cleared, in words: the problem that is gone, or the sales a person no longer
    needs to decide."""
    attention = _ATTENTION.match(problem)
    if attention:
        return f"cleared: {attention[1]} sale(s) resolved; none needs a person now"
    return f"cleared: {problem}"


def _count_note(was: str, now: str) -> dict[str, Any]:
    old_match, new_match = _ATTENTION.match(was), _ATTENTION.match(now)
    if old_match and new_match:
        before, after = int(old_match[1]), int(new_match[1])
        if after < before:
            return _note("cleared", f"cleared: {before - after} sale(s) resolved; {after} "
                         "still need(s) a person")
        return _note("problem", f"problem: {after} sale(s) need attention ({after - before} more)")
    return _note("problem", f"problem: {now} (was: {was})")


def _devices(snapshot: dict[str, Any]) -> set[str]:
    return {t["device_id"] for t in snapshot.get("terminals") or []} | {
        a["device_id"] for a in snapshot.get("availability") or []
    }


def _named(problem: str, devices: set[str]) -> str | None:
    """The terminal a problem is about (``terminal SIM-0001 offline``): `events --terminal`
    keeps it."""
    words = set(re.split(r"[\s:;,()]+", problem))
    return next((d for d in sorted(devices) if d in words), None)


def _note(kind: str, text: str, device_id: str | None = None) -> dict[str, Any]:
    return {"kind": kind, "text": text, "device_id": device_id}


def health_changed(before: dict[str, Any] | None, after: dict[str, Any]) -> bool:
    """Whether the health itself changed (not its clock, uptime or key countdown): the rule the
    stream sends ``health`` by, and the one `health --watch` prints by. The stream sends it also
    when only the page's platforms moved (a machine's tally, each customer), which health does
    not show."""
    return before is None or _stable(before) != _stable(after)


def _stable(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A snapshot without the fields that move every instant (clock, uptime, key countdown)."""
    service = {k: v for k, v in snapshot["service"].items() if k != "key_expires_in_s"}
    skip = {"at", "uptime_s", "service"}
    return {**{k: v for k, v in snapshot.items() if k not in skip}, "service": service}


class _Stalled(Exception):
    """A stream's client took nothing for STREAM_WRITE_TIMEOUT_S."""


def _bound_send_buffer(request: web.Request) -> None:
    """STREAM_SEND_BUFFER for the stream's socket (none in a test's mocked request)."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):  # a socket already closed: the stream ends anyway
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SEND_BUFFER)


def _forwarded_https(request: web.Request) -> bool:
    """A TLS proxy in front says the browser's side is HTTPS (X-Forwarded-Proto, Forwarded)."""
    proto = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    forwarded = request.headers.get("Forwarded", "").lower().replace(" ", "")
    return proto == "https" or "proto=https" in forwarded


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


_NO_STORE = {"Cache-Control": "no-store"}
_NOT_SENT = object()


def _forbidden(error: str, detail: str) -> web.HTTPForbidden:
    return web.HTTPForbidden(
        text=json.dumps({"error": error, "detail": detail}), content_type="application/json"
    )


def _error(status: int, error: str, detail: str) -> web.Response:
    return web.json_response({"error": error, "detail": detail}, status=status, headers=_NO_STORE)
