"""The device's own HTTP servers (admin API, webhook receiver, kiosk API) start, stop and defend
themselves alike.

Each binds a configured host and port; port 0 takes any free one (tests, several agents on one
machine), so the port really bound is read back once listening.

Limits (the ``http:`` section, :func:`kiosk_agent.web.schema.http_schema`), the same for all:

- a new connection must send its first request's headers within ``header_timeout``;
- an idle connection, or one slow to send its next request, is closed after
  ``keepalive_timeout`` (aiohttp's own keep-alive timer);
- a body must arrive whole within ``body_timeout`` (:func:`read_body`, :func:`read_json`), and
  a client that takes nothing of its answer for ``body_timeout`` (its socket full: a report, a
  stream or a WebSocket it stopped reading) is cut;
- at most ``max_connections`` are open per server: past it a connection with no request in
  progress is closed to make room: the oldest that never started a request (told 503 first: in
  a burst its request may simply not have been read yet), else the one idle longest that did,
  so an honest client's keep-alive connection outlives a flood of newcomers that never speak;
  when every one is busy the newcomer gets 503. Both picks are O(1): the connections that never
  spoke and the idle ones are kept in order in dicts of their own;
- once ``max_connections`` are open, at most ``accept_rate_at_cap`` newcomers a second are
  accepted; the rest wait in the kernel's accept queue (:data:`LISTEN_BACKLOG`, so a real
  client waits a bounded time there, in order) until the budget refills. Of those, one
  whose request head has already arrived whole gets in (closing one of those above, or told
  503 when all are busy); a silent one gets in within :data:`SILENT_SHARE` of the rate
  (closing the oldest silent one), else it is told 503 and closed at once, without a transport
  or a request handler. A flood that reconnects as soon as it is closed would otherwise keep
  the event loop accepting and closing at full speed, and every honest request, on any port of
  the process, would wait behind that churn. Each turn of the loop accepts at most
  :data:`ACCEPTS_PER_TURN`, so a burst of connections never holds up the established ones.
  So a slow-header flood on one port holds a bounded number of descriptors and a bounded share
  of the CPU, and cannot lock a real client out for long; the other ports are not touched;
- the header deadline is kept by one timer per server, armed for the oldest connection that
  has not spoken yet, not one timer per connection;
- an event stream (a WebSocket, server-sent events) takes one of ``max_streams`` stream slots
  (:meth:`LocalSite.stream_slot`) instead of a connection slot: past that bound a new stream is
  refused (503), and however many streams are open every request still finds its
  ``max_connections``. A stream never reads more than :data:`MAX_STREAM_FRAME` from its client;
- a stop waits ``shutdown_grace`` for requests in progress, then cuts them.

A port another program holds (``EADDRINUSE``) is waited for where the server's owner asks
(``wait_for_port``: the kiosk API, the admin API with its ``/metrics``, the webhook receiver):
the server is tried again on the monotonic clock it is given, :data:`PORT_WAIT_FIRST` seconds
first and doubling to :data:`PORT_WAIT_MAX`, the holder named in the log, its status and
health's problems meanwhile (:meth:`LocalSite.waiting_problem`), and serves within one step
of the port being let go; the rest of the agent runs and sells meanwhile. An address not on the
machine yet (``EADDRNOTAVAIL``: a LAN address before DHCP has given it, at boot) is waited for
the same way, by the same code, and said so: served within one step of it appearing. So is a
host name that does not resolve yet (``socket.gaierror`` ``EAI_AGAIN``: DNS not up at boot;
``EAI_NONAME`` or ``EAI_NODATA``: a resolver that answers "no such name" before the LAN's own DNS
or mDNS is up): served within one step of it resolving (:func:`_wait_kind`).

Bodies from outside are read by :func:`read_json` (or :func:`loads_bounded` for raw bytes
already read): bounded size, time, nesting and number length, so no body can make a handler
fail with anything but a 4xx naming what was wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from kiosk_agent.bucket import TokenBucket
from kiosk_agent.data_class import data_class
from kiosk_agent.logs import RefusalLog
from kiosk_agent.text import control_character
from kiosk_agent.web.schema import http_schema

_LOGGER = logging.getLogger(__name__)

# Bounds of a JSON body from outside. No body of ours nests deeper than a few levels; 40
# characters hold any 64-bit integer or double written in full.
MAX_JSON_DEPTH = 32
MAX_NUMBER_CHARS = 40
BODY = "<body>"  # the field named when the body as a whole is wrong
# The largest frame a stream's client may send (a WebSocket's max_msg_size): the apps send
# nothing but a close, so anything above a few bytes is refused before it is buffered.
MAX_STREAM_FRAME = 1024

# New connections accepted in one turn of the event loop: the established ones are served
# between turns, so a burst of a hundred newcomers cannot hold up an answer for the whole burst.
ACCEPTS_PER_TURN = 16
# The kernel's queue of connections not accepted yet. Under a flood it is full of the flood's
# newcomers, taken at accept_rate_at_cap a second: long enough that a real client's handshake
# is never dropped (each drop costs it 1 s, then 3 s, 7 s, ... of waiting to try again; with
# asyncio's 100 one waited 0.3 s typically but 4.4 s and more now and then), so its wait is
# bounded by this over the rate: 3.4 s. Costs kernel memory only, no descriptor.
LISTEN_BACKLOG = 1024
# At the cap, the share of accept_rate_at_cap let in without a request yet (each closing the
# oldest silent connection); the other silent newcomers are told 503 at once. A newcomer whose
# request is whole always gets in: the kernel's queue drains at the full rate, so a real client
# waits there behind a flood for a fraction of a second, not for the silent ones' budget.
SILENT_SHARE = 0.25
# A request head this long without its end is a head still coming (aiohttp refuses above 8 KiB).
_PEEK_BYTES = 8192
# How long to stop accepting when the process has no descriptor left for one more.
_OUT_OF_DESCRIPTORS_PAUSE_S = 1.0

# A request whose handler failed with an unexpected error (a bug) is told to come back after
# this (503 with Retry-After): never a 500 (LocalSite._track)
UNEXPECTED_RETRY_AFTER_S = 5
UNEXPECTED_DETAIL = "the agent could not answer this request now (an unexpected error, logged)"

_OVERLOADED_BODY = b'{"error": "unavailable", "detail": "every connection is busy; retry"}'
_OVERLOADED = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    % (len(_OVERLOADED_BODY), _OVERLOADED_BODY)
)


@data_class(frozen=True, slots=True)
class HttpLimits:
    """The ``http:`` section, validated: every local server uses the same limits."""

    header_timeout: float
    body_timeout: float
    keepalive_timeout: float
    max_connections: int
    shutdown_grace: float
    max_streams: int
    accept_rate_at_cap: float

    @classmethod
    def from_config(cls, conf: dict[str, Any] | None = None) -> HttpLimits:
        """The limits of an ``http:`` section; the defaults (one place: http_schema) for None."""
        return cls(**http_schema()(dict(conf or {})))

    @classmethod
    def of(cls, agent: Any) -> HttpLimits:
        """The limits of the agent's configuration (defaults for an agent without one)."""
        config = getattr(agent, "config", None)
        conf = config.get("http") if config is not None and hasattr(config, "get") else None
        return cls.from_config(conf)


LIMITS = web.AppKey("kiosk_agent.http_limits", HttpLimits)


class ErrorCounts(Protocol):
    """Where a site's unexpected errors, and its wait for a port taken, are shown (the
    agent's health)."""

    def count_errors_of(self, part: str, count: Callable[[], int]) -> None: ...

    def report_problem_of(self, part: str, problem: Callable[[], str | None]) -> None: ...

    def problem_changed(self) -> None: ...


class Waits(Protocol):
    """The clock a site waits for its port on (the agent's; a test's FakeClock)."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class _MonotonicWaits:
    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


# A port held by another program is tried again after this long, doubling to the cap: each
# try is a bind, and the holder's name looked up again (a look through /proc/*/fd)
PORT_WAIT_FIRST = 0.5
PORT_WAIT_MAX = 5.0


# What a site waits for (PortWait.waiting_for, its status's ``waiting_for``), by the bind's error
_WAITED_FOR = {errno.EADDRINUSE: "port", errno.EADDRNOTAVAIL: "address"}
# ... and by the name look-up's (getaddrinfo's codes are negative, errno's positive). Each of
# these may end by itself at boot: EAI_AGAIN while no DNS server answers yet; EAI_NONAME and
# EAI_NODATA from a resolver that answers before the one that knows the name is up (a public
# DNS before DHCP has given the LAN's, mDNS before avahi). Waited for, not refused: a refusal
# stops the agent (an admin API's, a webhook receiver's) into systemd's start limit, every sale
# with it, where a wait costs that server alone, said in health; a name mistyped is said
# before, by check-config and doctor with its file and line, and by health all along.
_NAME_WAITED_FOR = {
    code: "name" for code in (socket.EAI_AGAIN, socket.EAI_NONAME, getattr(socket, "EAI_NODATA", 0))
    if code
}


def _wait_kind(err: BaseException) -> str | None:
    """What a failed listen waits for ("port", "address", "name"), or None: refused at once
    (a port below 1024, getaddrinfo's other failures) or, while waiting, said as an error."""
    if isinstance(err, socket.gaierror):
        return _NAME_WAITED_FOR.get(err.errno or 0)
    if isinstance(err, OSError):
        return _WAITED_FOR.get(err.errno or 0)
    return None


@data_class(slots=True)
class PortWait:
    """A site waiting for its port (another program holds it: ``held_by``) or its address (not
    on this machine yet): since when, how often tried (monotonic)."""

    held_by: str
    since: float
    tries: int = 1
    next_try_at: float = 0.0
    error: str = ""  # the last try's failure, where it was neither the port nor the address
    waiting_for: str = "port"  # or "address": the host is not one of this machine's addresses;
    # or "name": the host name does not resolve yet
    resolver_said: str = ""  # the name look-up's words, while waiting for the name


def unexpected_refusal(detail: str) -> web.Response:
    """The answer to a request whose handler failed unexpectedly, in the admin API's and the
    webhook receiver's error form (``{error, detail}``); a site whose API says its errors
    otherwise gives its own (LocalSite's ``refuse_unexpected``)."""
    return web.json_response(
        {"error": "unavailable", "detail": detail},
        status=503,
        headers={"Retry-After": str(UNEXPECTED_RETRY_AFTER_S)},
    )

_LIVE: set[LocalSite] = set()  # sites listening now, for /metrics
SITE: web.AppKey[LocalSite] = web.AppKey("kiosk_agent.local_site")
StreamSlot = contextlib.AbstractContextManager[None]


def stream_slot(request: web.BaseRequest) -> StreamSlot | None:
    """The stream slot of the site serving ``request`` (see :meth:`LocalSite.stream_slot`);
    an app not served by a LocalSite (a bare test app) streams unbounded."""
    site = request.app.get(SITE) if isinstance(request, web.Request) else None
    return contextlib.nullcontext() if site is None else site.stream_slot(request)


def client_heard(request: web.BaseRequest) -> asyncio.Future[None] | None:
    """A future set once the client of ``request``'s connection sends anything after it (or
    the connection is lost): a stream that only writes waits on it instead of a reader task.
    None where no LocalSite serves the request (a bare test app): read at once there."""
    site = request.app.get(SITE) if isinstance(request, web.Request) else None
    connection = None if site is None else site._connections.get(request.protocol)
    return None if connection is None else connection.heard()


def live_sites() -> list[LocalSite]:
    """Every site listening in this process, by name."""
    return sorted(_LIVE, key=lambda site: site.name)


class BodyError(Exception):
    """A request body refused: ``status`` (400, 408, 413, 415), a short ``error`` code, the
    ``field`` at fault (``<body>`` for the whole body) and a message for people."""

    def __init__(self, status: int, error: str, field: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.field = field
        self.message = message


# -- the server ------------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One accepted connection: aiohttp's handler inside, counted and timed by its site."""

    def __init__(self, site: LocalSite, handler: RequestHandler) -> None:
        self.site = site
        self.handler = handler
        self.transport: asyncio.BaseTransport | None = None
        self.busy = 0  # requests in progress (a WebSocket stays busy while open)
        self.streaming = False  # holds a stream slot: not counted against max_connections
        self.served = 0
        self.closing = False
        self.gone = False  # the connection is lost (its last request may still be ending)
        self._stall: asyncio.TimerHandle | None = None  # armed while the client takes nothing
        self._heard: asyncio.Future[None] | None = None  # set by the client's next bytes

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.closing:  # closed to make room before the connection was even made
            transport.close()
            return
        self.transport = transport
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.handler.data_received(data)  # parsed first: whoever hears it then reads it
        self._tell_heard()

    def heard(self) -> asyncio.Future[None]:
        """Set once the client sends anything from now on, or the connection is lost."""
        if self._heard is None or self._heard.done():
            self._heard = asyncio.get_running_loop().create_future()
            if self.gone:
                self._heard.set_result(None)
        return self._heard

    def _tell_heard(self) -> None:
        if self._heard is not None and not self._heard.done():
            self._heard.set_result(None)

    def eof_received(self) -> None:
        self.handler.eof_received()  # None: the transport closes its side

    def pause_writing(self) -> None:
        # the client takes nothing (its socket is full): it has body_timeout to start again
        self.handler.pause_writing()
        if self._stall is None:
            self._stall = asyncio.get_running_loop().call_later(
                self.site.limits.body_timeout, self._stalled
            )

    def resume_writing(self) -> None:
        self._cancel_stall()
        self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        self._tell_heard()
        self._cancel_stall()
        self.site._forget(self)
        if self.transport is not None:  # the handler saw the connection made
            self.handler.connection_lost(exc)

    def request_started(self) -> None:
        self.busy += 1
        self.served += 1
        self.site._settle(self)

    def request_ended(self) -> None:
        self.busy -= 1
        if self.busy == 0 and not (self.closing or self.gone):
            self.site._idle[self] = None  # now the one idle for the shortest time

    def close(self, *, answer: bool = False) -> None:
        """Close now (its requests, if any, see the connection go). ``answer``: first tell a
        connection that was never served that the server is full (503), so a real client whose
        request had not been read yet hears why, instead of seeing the connection drop."""
        self._mark_closing()
        if self.transport is None:
            self.site._forget(self)
            return
        if answer and isinstance(self.transport, asyncio.WriteTransport):
            self.transport.write(_OVERLOADED)
        self.handler.force_close()

    def _mark_closing(self) -> None:
        if not self.closing:
            self.closing = True
            self.site._closing += 1
            self.site._settle(self)
            if self.streaming:  # counted as closing now, no longer as a stream
                self.site._streaming -= 1

    def _cancel_stall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _stalled(self) -> None:
        """The client took nothing of its answer for body_timeout: a busy connection that can
        never be closed to make room, so enough of them would lock every caller out."""
        self._stall = None
        self.site.stalled += 1
        self.site.refusals(
            "write_stalled",
            "%s: cut a connection to %s that took nothing of its answer for %g s",
            self.site.name,
            _peer(self.transport),
            self.site.limits.body_timeout,
        )
        self._mark_closing()
        if isinstance(self.transport, asyncio.WriteTransport):
            self.transport.abort()  # close() would wait for the buffer to drain: never

    def head_late(self) -> None:
        """No request head within header_timeout (the site's sweep found it)."""
        self.site.refusals(
            "header_timeout",
            "%s: closed a connection from %s that sent no request within %g s",
            self.site.name,
            _peer(self.transport),
            self.site.limits.header_timeout,
        )
        self.close()


class _Overloaded(asyncio.Protocol):
    """Every connection is busy: answer 503 at once and close (no descriptor kept)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.WriteTransport):
            transport.write(_OVERLOADED)
        transport.close()


class ListenError(OSError):
    """A local server could not listen: says which one, where, and what to change."""

    def __init__(self, name: str, host: str, port: int, err: OSError) -> None:
        # os.strerror: asyncio's own text repeats the address ("error while attempting ...");
        # a name that does not resolve (getaddrinfo's error) has its own words, not errno's
        # ("unknown error -2")
        why = _resolver_said(err) or (os.strerror(err.errno) if err.errno else str(err))
        if isinstance(err, socket.gaierror):
            fix = "the name does not resolve here: correct the host, or write its address"
        elif err.errno == errno.EADDRINUSE:
            fix = "another program (or another agent) holds it: stop that one or change the port"
        elif err.errno == errno.EADDRNOTAVAIL:
            fix = "this machine has no such address: change the host"
        elif err.errno == errno.EACCES:
            fix = "ports below 1024 need privileges: choose a port above 1023"
        else:
            fix = "check the host and port"
        super().__init__(err.errno, f"{name}: cannot listen on {host}:{port}: {why.lower()}; {fix}")


class LocalSite:
    """One aiohttp application served on ``host:port`` until stopped, within its limits."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        name: str = "http",
        limits: HttpLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
        health: ErrorCounts | None = None,
        counted_as: str | None = None,
        refuse_unexpected: Callable[[str], web.StreamResponse] = unexpected_refusal,
        wait_for_port: bool = False,
        waits: Waits | None = None,
        resolve: Resolve | None = None,
    ) -> None:
        self.host = host
        self.name = name
        # a port in use, an address not on the machine yet, or a name that does not resolve
        # yet: tried again on ``waits`` until it binds, not refused (ListenError)
        self._wait_for_port = wait_for_port
        self._resolve = resolve  # the host's look-up (a test's resolver); getaddrinfo if None
        self._waits: Waits = waits or _MonotonicWaits()
        self.waiting: PortWait | None = None  # set while the port or the address is waited for
        self._waiter: asyncio.Task[None] | None = None
        self._told_health = False
        # a handler's unexpected error (a bug): answered refuse_unexpected(detail) (a 503 in the
        # API's own error form, never aiohttp's 500), logged, counted here and shown in
        # ``health`` (its unexpected errors) as ``counted_as``; the server goes on serving
        self.unexpected = 0
        self._refuse_unexpected = refuse_unexpected
        self._health = health
        self._counted_as = counted_as or name
        self.limits = limits or HttpLimits.from_config()
        self._clock = clock
        self._wanted_port = port
        self.port: int | None = None  # the bound port, once started
        self._runner: web.AppRunner | None = None
        # the app's handler of a request (aiohttp's Application._handle), which _track wraps
        self._app_handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]] = _unstarted
        self._listeners: list[socket.socket] = []
        self._resume: asyncio.TimerHandle | None = None  # accepting again, while paused
        # at the cap: newcomers accepted a second (each looked at), and the silent ones among
        # them let in a second (each closing the oldest silent connection)
        rate = self.limits.accept_rate_at_cap  # one second's worth saved up at most
        self._triage = TokenBucket(rate, rate, clock)
        self._room = TokenBucket(rate * SILENT_SHARE, rate * SILENT_SHARE, clock)
        self._connecting: set[asyncio.Task[None]] = set()  # accepted, transport being made
        # handler -> connection, oldest first (dicts keep insertion order)
        self._connections: dict[RequestHandler, _Connection] = {}
        # connections that never started a request -> their head's deadline, oldest first; and
        # served ones with no request in progress, the one idle longest first: each eviction
        # and each sweep takes from the front, whatever the number of connections
        self._unserved: dict[_Connection, float] = {}
        self._idle: dict[_Connection, None] = {}
        self._head_sweep: asyncio.TimerHandle | None = None
        self.refusals = RefusalLog(_LOGGER, f"http:{name}")
        self._closing = 0  # connections in _connections that are closing (kept count: a flood
        # calls open_connections on every accept)
        self.evicted = 0
        self.overloaded = 0
        self.stalled = 0  # connections cut because their client took nothing for body_timeout
        self.streams = 0  # stream slots taken now
        self._streaming = 0  # connections in _connections holding one, not closing (kept count)
        self.streams_refused = 0
        self.accept_pauses = 0  # times newcomers were left in the kernel's queue for a while
        self.turned_away = 0  # silent newcomers closed at the cap, past accept_rate_at_cap

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def open_connections(self) -> int:
        """Connections counted against ``max_connections`` (streams have their own bound)."""
        return len(self._connections) - self._closing - self._streaming

    def stream_slot(self, request: web.BaseRequest) -> StreamSlot | None:
        """A stream slot for this request's connection while the stream is open, or None when
        all ``max_streams`` are taken (the caller answers 503)."""
        if self.streams >= self.limits.max_streams:
            self.streams_refused += 1
            self.refusals(
                "streams_full",
                "%s: %d event streams open: a new one was refused with 503",
                self.name,
                self.limits.max_streams,
            )
            return None
        return _StreamHold(self, self._connections.get(request.protocol))

    async def start(self, app: web.Application, guard: Guard | None = None) -> None:
        """Serve ``app``. ``guard``, if given, stands before the app's handling of every request
        (its routes, the 404 or 405 of a target no route matches, whatever the target): an
        app's checks there cannot miss a route or a request, where a check on each route
        misses what no route matches (``OPTIONS *``, CONNECT's host:port, a path with a line
        break, a route added later), and it costs no middleware chain."""
        app[LIMITS] = self.limits
        app[SITE] = self
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=self.limits.keepalive_timeout,
            shutdown_timeout=self.limits.shutdown_grace,
        )
        await runner.setup()
        # each request counted around the app's own handling, not as a middleware of the app's:
        # an app with no middleware (the kiosk API) then runs none of aiohttp's chain (its
        # _fix_request_current_app layer, the chain's build and its cache, some 25 Python calls
        # at each kiosk API sale's two requests and its stream's wake-ups)
        server = runner.server
        if server is not None:  # made by setup()
            handler = server.request_handler
            if guard is not None:
                handler = functools.partial(guard, handler=handler)
            self._app_handler = handler
            server.request_handler = self._track
        self._runner = runner
        if self._health is not None:
            self._health.count_errors_of(self._counted_as, lambda: self.unexpected)
        try:
            self._listeners = await _listen(self.host, self._wanted_port, self._resolve)
        except OSError as err:
            if (waiting_for := _wait_kind(err)) is not None and self._wait_for_port:
                self._wait(waiting_for, _resolver_said(err))
                return
            await runner.cleanup()
            self._runner = None
            raise ListenError(self.name, self.host, self._wanted_port, err) from None
        self._serve()

    def _serve(self) -> None:
        """Listening: accept from now on."""
        self.port = int(self._listeners[0].getsockname()[1])
        self._start_accepting()
        _LIVE.add(self)
        _check_descriptors()

    def _wait(self, waiting_for: str, resolver_said: str = "") -> None:
        """The port is in use (name who holds it), the address is not on this machine yet, or
        the name does not resolve yet: try again in a task of its own."""
        now = self._waits.monotonic()
        self.waiting = PortWait(held_by=self._held_by(waiting_for), since=now,
                                next_try_at=now + PORT_WAIT_FIRST, waiting_for=waiting_for,
                                resolver_said=resolver_said)
        _LOGGER.warning(
            "%s: cannot listen on %s:%d: %s; tried again in %g s, then every %g s at most: "
            "served as soon as it %s", self.name, self.host, self._wanted_port,
            self._waited_for(self.waiting), PORT_WAIT_FIRST, PORT_WAIT_MAX,
            _SERVED_WHEN[waiting_for],
        )
        if self._health is not None:
            if not self._told_health:
                self._health.report_problem_of(f"{self._counted_as} port", self.waiting_problem)
                self._told_health = True
            self._health.problem_changed()
        self._waiter = asyncio.create_task(self._wait_for_free_port(), name=f"{self.name}-port")

    async def _wait_for_free_port(self) -> None:
        """Try the port again, each wait twice the last up to the cap, until it binds."""
        delay = PORT_WAIT_FIRST
        while (waiting := self.waiting) is not None:
            await self._waits.sleep(max(0.0, waiting.next_try_at - self._waits.monotonic()))
            try:
                self._listeners = await _listen(self.host, self._wanted_port, self._resolve)
            except Exception as err:  # still in use, or worse: said, and tried again all the same
                delay = min(PORT_WAIT_MAX, delay * 2)
                waiting.tries += 1
                waiting.next_try_at = self._waits.monotonic() + delay
                waiting_for = _wait_kind(err)
                if waiting_for is not None:  # the port, the address or the name, still
                    why, holder, said = "", self._held_by(waiting_for), _resolver_said(err)
                else:  # worse: said as the error, what was waited for kept
                    why, holder, said = (f"{type(err).__name__}: {err}", waiting.held_by,
                                         waiting.resolver_said)
                    waiting_for = waiting.waiting_for
                if (why, holder, waiting_for, said) != (waiting.error, waiting.held_by,
                                                        waiting.waiting_for, waiting.resolver_said):
                    waiting.error, waiting.held_by, waiting.waiting_for = why, holder, waiting_for
                    waiting.resolver_said = said
                    _LOGGER.warning("%s: %s:%d still not served: %s", self.name, self.host,
                                    self._wanted_port, self._waited_for(waiting),
                                    exc_info=not isinstance(err, OSError))
                continue
            waited = self._waits.monotonic() - waiting.since
            self.waiting = None
            self._serve()
            _LOGGER.warning("%s: listening on %s:%d at last, after %.1f s (%d tries)", self.name,
                            self.host, self.port, waited, waiting.tries + 1)
            if self._health is not None:
                self._health.problem_changed()

    def _held_by(self, waiting_for: str) -> str:
        """The port's holder, named, while waiting for the port; "" while waiting for another."""
        return _holder(self._wanted_port) if waiting_for == "port" else ""

    def _waited_for(self, waiting: PortWait) -> str:
        """Why the last try failed, in words: the port's holder, the address missing, or the
        error."""
        if waiting.error:
            return waiting.error
        if waiting.waiting_for == "name":
            return (f"name {self.host} does not resolve yet ({waiting.resolver_said}): DNS not "
                    "up yet at boot, or the network that serves the name not reached yet; if "
                    "it never resolves, correct the host or write its address")
        if waiting.waiting_for == "address":
            return (f"address {self.host} is not on this machine (yet): a LAN address DHCP has "
                    "not given yet, or an interface not up; if it never comes, change the host "
                    "to one of this machine's addresses (`ip -brief address` lists them)")
        return f"the port is in use by {waiting.held_by}"

    def waiting_problem(self) -> str | None:
        """Health's line while the port is held by another program, or the address is not on
        this machine yet; None once served."""
        waiting = self.waiting
        if waiting is None:
            return None
        if waiting.waiting_for in ("address", "name") and not waiting.error:
            return (f"{self._counted_as} not listening on {self.host}:{self._wanted_port}: "
                    f"{self._waited_for(waiting)} (tried {waiting.tries} time(s), again every "
                    f"{PORT_WAIT_MAX:g} s at most; served as soon as it "
                    f"{_SERVED_WHEN[waiting.waiting_for]})")
        return (f"{self._counted_as} not listening: waiting for port {self._wanted_port} on "
                f"{self.host}, " + (waiting.error if waiting.error else
                                   f"in use by {waiting.held_by}")
                + f" (tried {waiting.tries} time(s), again every {PORT_WAIT_MAX:g} s at most;"
                " served as soon as it is free)")

    def listening(self) -> dict[str, Any]:
        """The site's state for its owner's status: listening on a port, or waiting for it."""
        waiting = self.waiting
        if waiting is None:
            return {"state": "listening" if self.port else "stopped", "port": self.port}
        left = max(0.0, waiting.next_try_at - self._waits.monotonic())
        return {"state": "waiting", "waiting_for": waiting.waiting_for, "host": self.host,
                "port": self._wanted_port, "held_by": waiting.held_by,
                "error": waiting.error, "detail": self._waited_for(waiting), "tries": waiting.tries,
                "waiting_s": round(self._waits.monotonic() - waiting.since, 3),
                "next_try_in_s": round(left, 3)}

    async def stop(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
        if self.waiting is not None:
            self.waiting = None
            if self._health is not None:
                self._health.problem_changed()
        _LIVE.discard(self)
        self._stop_accepting()  # no new connections
        for listener in self._listeners:
            listener.close()
        self._listeners = []
        runner, self._runner = self._runner, None
        if runner is None:
            return
        try:
            # aiohttp waits up to the grace twice (for handlers, then for their cancellation)
            async with asyncio.timeout(self.limits.shutdown_grace * 2 + 1):
                await runner.cleanup()
        except TimeoutError:
            _LOGGER.warning("%s: requests still running after the grace; cut", self.name)
        finally:
            for connection in list(self._connections.values()):
                connection.close()
            self._connections.clear()
            self._unserved.clear()
            self._idle.clear()
            if self._head_sweep is not None:
                self._head_sweep.cancel()
                self._head_sweep = None
            self._closing = 0
            self._streaming = 0

    # -- connections -------------------------------------------------------------------------

    def _start_accepting(self) -> None:
        self._resume = None
        loop = asyncio.get_running_loop()
        for listener in self._listeners:
            loop.add_reader(listener.fileno(), self._accept_ready, listener)

    def _stop_accepting(self) -> None:
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        loop = asyncio.get_running_loop()
        for listener in self._listeners:
            loop.remove_reader(listener.fileno())

    def _pause_accepting(self, seconds: float) -> None:
        """Leave newcomers in the kernel's queue for ``seconds`` (they are not refused)."""
        self._stop_accepting()
        self.accept_pauses += 1
        self._resume = asyncio.get_running_loop().call_later(seconds, self._start_accepting)

    def _accept_ready(self, listener: socket.socket) -> None:
        """The listening socket has newcomers: take a few, within the budgets at the cap."""
        for _ in range(ACCEPTS_PER_TURN):
            full = self.open_connections >= self.limits.max_connections
            if full and (delay := self._triage.wait()) > 0:
                self._pause_accepting(delay)
                return
            try:
                sock, _address = listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return  # none left (or the one there gave up)
            except OSError as err:
                self._accept_failed(err)
                return
            sock.setblocking(False)
            if full:
                self._triage.spend()
                if not _head_arrived(sock) and self._room.take() > 0:
                    self._turn_away(sock)
                    continue
            protocol = self._accept()
            if not _transport_at_once(sock, protocol):
                task = asyncio.get_running_loop().create_task(self._connect(sock, protocol))
                self._connecting.add(task)
                task.add_done_callback(self._connecting.discard)

    def _turn_away(self, sock: socket.socket) -> None:
        """Close a silent newcomer past the budget, told 503 like an evicted one, without
        the cost of a transport and a request handler."""
        self.turned_away += 1
        self.refusals(
            "turned_away",
            "%s: %d connections open: turned away a newcomer that had sent no request yet",
            self.name,
            self.limits.max_connections,
        )
        with contextlib.suppress(OSError):
            sock.send(_OVERLOADED)
        sock.close()

    def _accept_failed(self, err: OSError) -> None:
        if err.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            _LOGGER.warning("%s: accepting a connection failed: %s", self.name, err)
            return
        # the listening socket stays readable: accepting again at once would spin
        self.refusals(
            "out_of_descriptors",
            "%s: no descriptor or memory for a new connection (%s): not accepting for %g s",
            self.name,
            os.strerror(err.errno or 0),
            _OUT_OF_DESCRIPTORS_PAUSE_S,
        )
        self._pause_accepting(_OUT_OF_DESCRIPTORS_PAUSE_S)

    async def _connect(self, sock: socket.socket, protocol: asyncio.Protocol) -> None:
        """The transport made by the loop's coroutine (a loop that cannot make it at once)."""
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(lambda: protocol, sock)
        except OSError:
            _not_connected(sock, protocol)

    def _accept(self) -> asyncio.Protocol:
        """The protocol of a connection just accepted (room made for it, or a 503)."""
        runner = self._runner
        if runner is None:
            raise RuntimeError("a connection accepted before the server started")
        if runner.server is None:
            raise RuntimeError("a connection accepted before the server started")
        if self.open_connections >= self.limits.max_connections and not self._make_room():
            self.overloaded += 1
            self.refusals(
                "overloaded",
                "%s: %d connections, all busy: a new one was refused with 503",
                self.name,
                self.limits.max_connections,
            )
            return _Overloaded()
        handler = runner.server()
        connection = _Connection(self, handler)
        self._connections[handler] = connection
        self._unserved[connection] = self._clock() + self.limits.header_timeout
        if self._head_sweep is None:
            self._arm_head_sweep()
        return connection

    def _make_room(self) -> bool:
        """Close one connection with no request in progress; False when all are busy.

        The oldest that never started a request goes first (a slow-header flood is made of
        those), and only then the one idle longest that did: an honest client's keep-alive
        connection outlives any flood of newcomers that never spoke."""
        victim = next(iter(self._unserved), None) or next(iter(self._idle), None)
        if victim is None:
            return False
        self.evicted += 1
        self.refusals(
            "connection_cap",
            "%s: %d connections open: closed the oldest idle one %s (from %s)",
            self.name,
            self.limits.max_connections,
            "that never spoke" if victim.served == 0 else "that was served",
            _peer(victim.transport),
        )
        victim.close(answer=victim.served == 0)
        return True

    def _settle(self, connection: _Connection) -> None:
        """The connection spoke, or is closing: neither silent nor idle any longer.

        The head sweep stays armed even when nobody silent is left: it lapses at its deadline
        (one wake-up, then none) instead of a timer armed and cancelled for every connection
        (one a kiosk API sale: its stream's)."""
        self._unserved.pop(connection, None)
        self._idle.pop(connection, None)

    def _arm_head_sweep(self) -> None:
        """One timer for every header deadline: the oldest silent connection's (none while
        nobody is silent)."""
        deadline = next(iter(self._unserved.values()), None)
        if deadline is not None:
            delay = max(0.0, deadline - self._clock())
            self._head_sweep = asyncio.get_running_loop().call_later(delay, self._sweep_heads)

    def _sweep_heads(self) -> None:
        """Close every connection whose head is late (the oldest are at the front)."""
        self._head_sweep = None
        now = self._clock()
        while self._unserved:
            connection, deadline = next(iter(self._unserved.items()))
            if deadline > now:
                break
            connection.head_late()  # closing: it leaves _unserved
        self._arm_head_sweep()

    def _forget(self, connection: _Connection) -> None:
        self._settle(connection)
        if self._connections.get(connection.handler) is connection:
            del self._connections[connection.handler]
            self._closing -= connection.closing
            if connection.streaming and not connection.closing:
                self._streaming -= 1
                connection.streaming = False

    async def _track(self, request: web.BaseRequest) -> web.StreamResponse:
        """The server's handler of every request: the app's own (its routes, its middlewares),
        with the request counted on its connection while it runs."""
        handler = self._app_handler
        connection = self._connections.get(request.protocol)
        if connection is not None:
            connection.request_started()
        try:
            return await handler(request)
        except (web.HTTPException, TimeoutError):
            raise  # aiohttp's own answers (404, 405, 413 ...; a timeout's 504): as they are
        except ConnectionError:
            # a client gone mid-answer (a stream's app closed its socket: the next write
            # raises), not a bug: not counted; told 503 if it still hears anything
            return self._unexpected_answer(request)
        except Exception:
            # a bug: the client told in its API's words (never a 500), the traceback logged,
            # counted and shown in health; the server goes on
            self.unexpected += 1
            _LOGGER.exception("%s: %s %s failed unexpectedly", self.name, request.method,
                              request.path)
            return self._unexpected_answer(request)
        finally:
            if connection is not None:
                connection.request_ended()

    def _unexpected_answer(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.writer is not None and request.writer.output_size > 0:
            # its answer had begun (a stream): no other can follow; the connection is ended
            raise ConnectionError(f"{self.name}: the answer had begun; the connection is ended")
        return self._refuse_unexpected(UNEXPECTED_DETAIL)


_Response = web.StreamResponse
_AppHandler = Callable[[web.Request], Awaitable[_Response]]


class Guard(Protocol):
    """A site's checks around its app's handling of a request (:meth:`LocalSite.start`)."""

    def __call__(self, request: web.Request, *, handler: _AppHandler) -> Awaitable[_Response]: ...


async def _unstarted(_request: web.BaseRequest) -> web.StreamResponse:
    raise RuntimeError("a request handled before the server started")


class _StreamHold:
    """A stream's slot while it is open (``with``): a class, not a generator context manager
    (three Python calls where that took six, at each stream a kiosk API sale opens)."""

    __slots__ = ("_connection", "_site")

    def __init__(self, site: LocalSite, connection: _Connection | None) -> None:
        self._site, self._connection = site, connection

    def __enter__(self) -> None:
        site, connection = self._site, self._connection
        site.streams += 1
        if connection is not None and not connection.closing:
            connection.streaming = True
            site._streaming += 1

    def __exit__(self, *_exc: object) -> None:
        site, connection = self._site, self._connection
        site.streams -= 1
        if connection is not None and connection.streaming:
            connection.streaming = False
            if not connection.closing:
                site._streaming -= 1


# Descriptors the agent needs besides its servers' connections: journal, serial links, the
# service's sockets, listening sockets, logs.
_DESCRIPTOR_RESERVE = 256


def _check_descriptors() -> None:
    """Warn when the servers' caps together do not fit the process's descriptor limit."""
    # the soft RLIMIT_NOFILE (glibc's sysconf reads it; -1: unlimited), without the `resource`
    # module: its extension's pages are some 24 KiB of every running agent's memory
    soft = os.sysconf("SC_OPEN_MAX")
    need = sum(s.limits.max_connections + s.limits.max_streams for s in _LIVE) + _DESCRIPTOR_RESERVE
    if soft > 0 and need > soft:
        _LOGGER.warning(
            "the HTTP servers may hold %d descriptors but the limit is %d: lower "
            "http.max_connections or raise LimitNOFILE= in the unit",
            need,
            soft,
        )


def _head_arrived(sock: socket.socket) -> bool:
    """Whether a request head has arrived whole on a connection just accepted (its bytes are
    left for the server to read): a real client sends its request at once, a slow-header
    flood never finishes one."""
    try:
        head = sock.recv(_PEEK_BYTES, socket.MSG_PEEK)
    except OSError:  # nothing yet (BlockingIOError), or reset
        return False
    return b"\r\n\r\n" in head


def _holder(port: int) -> str:
    """Who listens on ``port`` (pid and command line), or ``another process``."""
    from kiosk_agent.lock_holders import describe, listeners

    return describe(listeners(port))


_SERVED_WHEN = {"port": "is free", "address": "appears", "name": "resolves"}

# The look-up of a listen host's addresses: asyncio's getaddrinfo (in the loop's executor, so a
# resolver slow to answer at boot never holds the loop). Given: (host, port, type=, flags=).
Resolve = Callable[..., Awaitable[list[tuple[Any, ...]]]]


def _resolver_said(err: BaseException) -> str:
    """The name look-up's own words ("Temporary failure in name resolution"), or ""."""
    if isinstance(err, socket.gaierror):
        return err.strerror or str(err)
    return ""


async def _listen(host: str, port: int, resolve: Resolve | None = None) -> list[socket.socket]:
    """Listening sockets on every address ``host`` names (as asyncio's create_server binds);
    its addresses looked up by ``resolve`` (the loop's getaddrinfo unless given)."""
    if resolve is None:
        resolve = asyncio.get_running_loop().getaddrinfo
    # An ASCII name goes to getaddrinfo as bytes: given a str, the socket module encodes every
    # host with the "idna" codec, whose import (with stringprep's tables) an idle agent would
    # keep, some 0.1 MB, for an address like 127.0.0.1. A name that is not ASCII still gets it.
    name = host.encode("ascii") if host and host.isascii() else host or None
    infos = await resolve(name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    listeners: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(infos):
            listener = socket.socket(family, kind, proto)
            listeners.append(listener)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # the IPv4 address, if named, has its own socket
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listener.bind(address)
            listener.listen(LISTEN_BACKLOG)
            listener.setblocking(False)
    except OSError:
        for listener in listeners:
            listener.close()
        raise
    return listeners


def _transport_at_once(sock: socket.socket, protocol: asyncio.Protocol) -> bool:
    """Make an accepted socket's transport now, as asyncio's selector loop does inside its
    ``connect_accepted_socket`` (the protocol told ``connection_made`` on the next turn), without
    that coroutine's task, waiter and done callback: a connection a kiosk API sale. False
    where the loop has no such method (another event loop): the coroutine makes it then."""
    make = getattr(asyncio.get_running_loop(), "_make_socket_transport", None)
    if make is None:
        return False
    try:
        make(sock, protocol)
    except OSError:
        _not_connected(sock, protocol)
    return True


def _not_connected(sock: socket.socket, protocol: asyncio.Protocol) -> None:
    """The client went before its transport was made."""
    sock.close()
    if isinstance(protocol, _Connection) and protocol.transport is None:
        protocol.close()


def _peer(transport: asyncio.BaseTransport | None) -> str:
    peer = transport.get_extra_info("peername") if transport is not None else None
    return str(peer[0]) if isinstance(peer, tuple) and peer else "?"


# -- bodies ----------------------------------------------------------------------------------


async def read_body(request: web.Request) -> bytes:
    """The whole body, within the server's ``body_timeout`` and its size limit (else 408/413).

    The limits are looked up only for a body still on its way: ``config_dict`` makes a chain of
    the apps' dicts at each read (five Python calls an app's sale, whose small body is here)."""
    try:
        if request.content.is_eof():  # all of it is here (a small body mostly is): no wait to bound
            return await request.read()
        limits = request.config_dict.get(LIMITS) or HttpLimits.from_config()
        try:
            async with asyncio.timeout(limits.body_timeout):
                return await request.read()
        except TimeoutError:
            message = f"the body did not arrive within {limits.body_timeout:g} s"
            raise BodyError(408, "body_timeout", BODY, message) from None
    except web.HTTPRequestEntityTooLarge:
        limit = request.client_max_size
        message = f"the body is above the {limit} byte limit"
        raise BodyError(413, "too_large", BODY, message) from None


def is_json_type(request: web.BaseRequest) -> bool:
    if request.headers.get("Content-Type") == "application/json":  # as apps and aiohttp send it
        return True  # not parsed: aiohttp's content_type parses the header (four Python calls)
    content_type = request.content_type.lower()
    return content_type == "application/json" or content_type.endswith("+json")


async def read_json(request: web.Request, *, require_type: bool = True) -> Any:
    """The request's JSON body, bounded (see :func:`loads_bounded`); :class:`BodyError` else.

    ``require_type``: refuse (415) a body not sent as ``application/json``. A browser can send
    ``text/plain`` or a form across sites without asking first; it cannot send JSON that way.
    """
    if require_type and not is_json_type(request):
        raise BodyError(
            415,
            "unsupported_media_type",
            "Content-Type",
            f"send the body as Content-Type: application/json, not {request.content_type}",
        )
    return loads_bounded(await read_body(request))


def loads_bounded(raw: bytes) -> Any:
    """JSON from outside, bounded in time and size; :class:`BodyError` (400) names the fault.

    Refused: a body that is not UTF-8 JSON, nesting deeper than :data:`MAX_JSON_DEPTH`, a
    number written with more than :data:`MAX_NUMBER_CHARS` characters (Python's own int limit
    would raise only after 4,300 digits, and a float would turn into infinity), ``NaN`` and
    ``Infinity`` (not JSON), and strings with unpaired surrogates (they cannot be stored).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        message = f"the body is not UTF-8 (byte {err.start})"
        raise BodyError(400, "malformed", BODY, message) from None
    try:
        if text.startswith("\ufeff"):  # as json.loads refuses it
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        value = _DECODER.decode(text)
    except RecursionError:
        raise _too_deep() from None
    except json.JSONDecodeError as err:  # its message says where, never echoes the body
        raise BodyError(400, "malformed", BODY, f"the body is not JSON: {err}") from None
    if not _plainly_within_bounds(text):
        _check_tree(value)
    return value


def _plainly_within_bounds(text: str) -> bool:
    """Whether the text alone shows its tree needs no walk: a string decoded from UTF-8 holds
    a surrogate only from a ``\\u`` escape, and a tree nests no deeper than it has brackets.
    An app's sale body (``{"product": "coffee"}``: one bracket, no escape) was walked at each
    sale (a dozen calls) for faults it cannot hold. A bracket inside a string counts too: more
    walks, never fewer."""
    return "\\u" not in text and text.count("{") + text.count("[") <= MAX_JSON_DEPTH


def _too_deep() -> BodyError:
    return BodyError(400, "malformed", BODY, f"the body nests deeper than {MAX_JSON_DEPTH} levels")


def _long_number(text: str) -> BodyError:
    return BodyError(
        400,
        "malformed",
        BODY,
        f"a number written with {len(text)} characters (at most {MAX_NUMBER_CHARS})",
    )


def _parse_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _long_number(text)
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise _long_number(text)
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise BodyError(400, "malformed", BODY, f"the number {text} is out of range")
    return value


def _parse_constant(text: str) -> Any:
    raise BodyError(400, "malformed", BODY, f"{text} is not a JSON number")


# made once: json.loads with these options makes a decoder and its scanner a call (4.0 us a
# body against 1.9)
_DECODER = json.JSONDecoder(
    parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant
)


def _check_tree(value: Any) -> None:
    """Depth and strings of a decoded value, without recursion."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = [*item.keys(), *item.values()]
        elif isinstance(item, list):
            children = item
        else:
            if isinstance(item, str):
                _check_text(item)
            continue
        if depth >= MAX_JSON_DEPTH:
            raise _too_deep()
        depth += 1
        for child in children:  # a loop, not extend() over a generator: no frame per child
            stack.append((child, depth))


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        message = f"a string holds an unpaired surrogate (\\u{ord(text[err.start]):04x})"
        raise BodyError(400, "malformed", BODY, message) from None


# -- texts from outside ----------------------------------------------------------------------




def text_fault(text: str, max_chars: int) -> str | None:
    """What is wrong with a short text from outside (a name, a reason), in words; None if
    nothing: at most ``max_chars`` characters, no control character."""
    if len(text) > max_chars:
        return f"{len(text)} characters; at most {max_chars}"
    control = control_character(text)
    if control is not None:
        return f"a control character ({control}); send plain text"
    return None
