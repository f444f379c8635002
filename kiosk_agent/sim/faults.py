"""Fault injection, a test helper: make calls to an endpoint fail, slow down or vanish on demand.

``POST /sim/faults`` with ``{path, method?, fault, count?, share?, delay_s?, retry_after_s?,
seed?}`` arms one fault and answers it with its ``id`` (``f1``, ``f2``, ...). ``path`` is exact,
or a prefix when it ends with ``*``; ``method`` is ``GET``, ``POST``, ``PUT``, ``DELETE`` or
``*`` (any), default ``POST``. The faults (docs/simulator.md has the table):

- ``drop_answer``: processed (a charge is made), then the connection is cut with no answer.
- ``slow_answer``: processed at once, the answer leaves ``delay_s`` later.
- ``delay``: waits ``delay_s``, then processes (the commit happens late).
- ``hold``: waits until the fault is deleted (``DELETE /sim/faults/{id}``: the release) or the
  simulator stops, then processes: a late commit whose moment the test decides, not the clock.
- ``server_error``: 500 before anything is processed; ``server_error_after_commit``: processed,
  then a 500.
- ``unavailable``: 503 with ``Retry-After: 1``; ``rate_limited``: 429 with ``Retry-After:
  retry_after_s``; nothing processed.
- ``first_poll_rate_limited``: a 429 on the first status GET of each terminal interaction.
- ``latency``: ``delay_s`` more on each matching request, before processing (adds to any other
  fault that also matches).
- ``black_hole``: the request is accepted and never answered, held until the client leaves.
- ``ws_drop_after_confirm``: the cable WebSocket is closed right after ``confirm_subscription``.

How many calls a fault takes: ``count`` (the next N matching calls); ``share`` (that share of
matching calls, drawn with a seeded RNG, until deleted; with ``count``, at most N hits). With
neither, ``count`` is 1, except for the standing conditions ``latency`` and
``first_poll_rate_limited``, which last until deleted. Every fault counts its ``hits``; a spent
fault stays listed (``remaining: 0``) so its hits can still be read.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kiosk_agent.sim.context import SimContext
from kiosk_agent.sim.http import (
    ApiError,
    Body,
    Handler,
    api_error,
    bad_request,
    json_response,
    not_found,
    read_ahead,
    read_json,
)

# Outcome faults: at most one of them decides what happens to a request.
OUTCOMES = (
    "drop_answer", "slow_answer", "delay", "hold", "server_error", "server_error_after_commit",
    "unavailable", "rate_limited", "first_poll_rate_limited", "black_hole",
)  # fmt: skip
LATENCY = "latency"
WS_DROP = "ws_drop_after_confirm"
FAULTS = (*OUTCOMES, LATENCY, WS_DROP)
# Conditions that stand until deleted when neither count nor share is given.
STANDING = frozenset((LATENCY, "first_poll_rate_limited"))
METHODS = ("GET", "POST", "PUT", "DELETE", "*")
DEFAULT_PATHS = {"first_poll_rate_limited": "/api/terminal/*", WS_DROP: "/cable*"}
CABLE_PATH = "/cable"
# A terminal interaction's status route: /api/terminal/{device_id}/{kind}/{interaction_id}
_STATUS_ROUTE = re.compile(r"^/api/terminal/[^/]+/(?:read-card|charge-card)/([^/]+)$")
# How often a held (black-holed) request looks whether its client has gone.
_HOLD_CHECK_S = 0.05


@dataclass(slots=True)
class Fault:
    id: str
    path: str
    method: str
    fault: str
    count: int | None
    share: float | None
    delay_s: float
    retry_after_s: float
    seed: int
    remaining: int | None  # None: no limit
    hits: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False)
    _polled: set[str] = field(default_factory=set, repr=False)  # first_poll: interactions seen
    released: asyncio.Event = field(default_factory=asyncio.Event, repr=False)  # hold: deleted

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id, "path": self.path, "method": self.method, "fault": self.fault,
            "count": self.count, "share": self.share, "delay_s": self.delay_s,
            "retry_after_s": self.retry_after_s, "seed": self.seed,
            "remaining": self.remaining, "hits": self.hits,
        }  # fmt: skip

    def wants(self, method: str, path: str) -> bool:
        """Whether a call is one this fault is about (before its count and share are drawn)."""
        if self.remaining == 0 or not _path_matches(self.path, path):
            return False
        if self.fault == "first_poll_rate_limited":
            found = _STATUS_ROUTE.match(path)
            if method != "GET" or found is None:
                return False
            interaction_id = found.group(1)
            if interaction_id in self._polled:
                return False
            self._polled.add(interaction_id)  # this was its first poll, hit or not
            return True
        return self.fault == WS_DROP or self.method in ("*", method)

    def draw(self) -> bool:
        """One matching call: True (and counted) when the fault applies to it."""
        if self.share is not None and self._rng.random() >= self.share:
            return False
        if self.remaining is not None:
            self.remaining -= 1
        self.hits += 1
        return True


def _path_matches(pattern: str, path: str) -> bool:
    """Exact, or a prefix when the pattern ends with ``*`` (``/api/terminal/SIM-0001/*``)."""
    if pattern.endswith("*"):
        return path.startswith(pattern[:-1])
    return path == pattern


class Faults:
    def __init__(self, seed: int = 0) -> None:
        self.armed: list[Fault] = []
        self.requests = 0  # requests seen outside /sim/ (for benches: requests per sale)
        self.held = 0  # black-holed requests still held
        self._ids = itertools.count(1)
        self._seed = seed
        self._closing = asyncio.Event()

    def take(self, method: str, path: str) -> tuple[float, Fault | None]:
        """The latency to add and the outcome fault, if any, for one call."""
        latency = 0.0
        outcome: Fault | None = None
        for fault in self.armed:
            if fault.fault == WS_DROP or not fault.wants(method, path):
                continue
            if fault.fault == LATENCY:
                if fault.draw():
                    latency += fault.delay_s
            elif outcome is None and fault.draw():
                outcome = fault
        return latency, outcome

    def drop_after_confirm(self) -> bool:
        """The cable endpoint asks after each ``confirm_subscription``: close the socket now?"""
        return any(
            fault.fault == WS_DROP and fault.wants("GET", CABLE_PATH) and fault.draw()
            for fault in self.armed
        )

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/sim/"):
            return await handler(request)
        self.requests += 1
        if not self.armed:
            return await handler(request)
        latency, fault = self.take(request.method, request.path)
        if latency:
            await asyncio.sleep(latency)
        if fault is None:
            return await handler(request)
        return await self._apply(fault, request, handler)

    async def _apply(
        self, fault: Fault, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        kind = fault.fault
        if kind == "server_error":
            return api_error(500, "server_error", "injected fault: server error")
        if kind == "unavailable":
            return api_error(
                503, "unavailable", "injected fault: service unavailable", {"Retry-After": "1"}
            )
        if kind in ("rate_limited", "first_poll_rate_limited"):
            return api_error(
                429, "rate_limited", "injected fault: rate limited",
                {"Retry-After": f"{fault.retry_after_s:g}"},
            )  # fmt: skip
        if kind == "black_hole":
            await self._hold(request)
            raise asyncio.CancelledError  # nothing is written; the connection goes
        if kind == "hold":
            await read_ahead(request)  # the body is in: committed even if the client has gone
            closing = asyncio.ensure_future(self._closing.wait())
            released = asyncio.ensure_future(fault.released.wait())
            try:
                await asyncio.wait({closing, released}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                closing.cancel()
                released.cancel()
            return await handler(request)
        if kind == "delay":
            # the body is in before the wait: the call is committed late even when the client
            # has given up (or died) meanwhile, as a slow service would
            await read_ahead(request)
            await asyncio.sleep(fault.delay_s)
            return await handler(request)
        answer = await _committed(request, handler)
        if kind == "slow_answer":
            await asyncio.sleep(fault.delay_s)
            return answer
        if kind == "server_error_after_commit":
            return api_error(500, "server_error", "injected fault: server error after commit")
        # drop_answer: the work is done, the answer is lost on the way back.
        _cut(request)
        raise asyncio.CancelledError

    async def _hold(self, request: web.Request) -> None:
        """Say nothing until the client hangs up (or the simulator stops)."""
        self.held += 1
        try:
            while not self._closing.is_set():
                transport = request.transport
                if transport is None or transport.is_closing():
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), _HOLD_CHECK_S)
            _cut(request)
        finally:
            self.held -= 1

    # -- the helper endpoints ----------------------------------------------------------------
    async def handle_arm(self, request: web.Request) -> web.Response:
        fault = self._parse(await read_json(request))
        self.armed.append(fault)
        return json_response(fault.public())

    def _parse(self, body: Body) -> Fault:
        kind = body.choice("fault", FAULTS, required=True) or ""
        path = body.text("path") or DEFAULT_PATHS.get(kind)
        if path is None:
            raise bad_request("missing required field 'path'")
        if not path.startswith("/"):
            raise bad_request("field 'path' must start with '/'")
        count = body.integer("count", minimum=1, maximum=1_000_000)
        share = _number(body, "share", None, low=0.0, high=1.0, low_open=True)
        if count is None and share is None and kind not in STANDING:
            count = 1
        seed = body.integer("seed")
        number = next(self._ids)
        seed = self._seed * 1000 + number if seed is None else seed
        return Fault(
            id=f"f{number}",
            path=path,
            method=body.choice("method", METHODS, default="POST") or "POST",
            fault=kind,
            count=count,
            share=share,
            delay_s=_number(body, "delay_s", 1.0, low=0.0, high=60.0) or 0.0,
            retry_after_s=_number(body, "retry_after_s", 1.0, low=0.0, high=3600.0) or 0.0,
            seed=seed,
            remaining=count,
            _rng=random.Random(seed),
        )

    async def handle_list(self, _: web.Request) -> web.Response:
        return json_response({"faults": [fault.public() for fault in self.armed]})

    async def handle_clear(self, _: web.Request) -> web.Response:
        for fault in self.armed:
            fault.released.set()  # a held call goes on
        self.armed.clear()
        return json_response({"faults": []})

    async def handle_delete(self, request: web.Request) -> web.Response:
        wanted = request.match_info["fault_id"]
        for fault in self.armed:
            if fault.id == wanted:
                self.armed.remove(fault)
                fault.released.set()  # a held call goes on
                return json_response(fault.public())
        raise not_found(f"no fault {wanted!r}", "fault_not_found")

    async def release(self, _: web.Application) -> None:
        """On shutdown: let every held request go."""
        self._closing.set()


async def _committed(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Process the request for real; its own error answer is what it would have said."""
    try:
        return await handler(request)
    except ApiError as err:
        return api_error(err.status, err.error, err.description, err.headers)


def _cut(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()


def _number(
    body: Body, name: str, default: float | None, *, low: float, high: float,
    low_open: bool = False,
) -> float | None:  # fmt: skip
    value = body.data.get(name)
    if value is None:
        return default
    above = "above" if low_open else "from"
    wrong = bad_request(f"field {name!r} must be a number {above} {low:g} to {high:g}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise wrong
    if value > high or value < low or (low_open and value == low):
        raise wrong
    return float(value)


def faults_of(ctx: SimContext) -> Faults | None:
    found = ctx.extras.get("faults")
    return found if isinstance(found, Faults) else None


def setup(app: web.Application, ctx: SimContext) -> None:
    faults = Faults(ctx.options.seed or 0)
    ctx.extras["faults"] = faults
    app.middlewares.append(faults.middleware)
    app.on_shutdown.append(faults.release)
    app.router.add_post("/sim/faults", faults.handle_arm)
    app.router.add_get("/sim/faults", faults.handle_list)
    app.router.add_delete("/sim/faults", faults.handle_clear)
    app.router.add_delete("/sim/faults/{fault_id}", faults.handle_delete)
