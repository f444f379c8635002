"""Fault injection, a test helper: make the next calls to an endpoint fail in a chosen way.

``POST /sim/faults`` with ``{path, method?, fault, count?, delay_s?}`` arms a fault for the next
``count`` matching requests (default 1):

- ``drop_answer``: the request is fully processed (a charge is made) and then the connection is
  cut before any answer: the client cannot know the outcome and must reconcile by order_id.
- ``server_error``: a 500 before anything is processed.
- ``unavailable``: a 503 with ``Retry-After: 1`` before anything is processed.
- ``delay``: the answer comes ``delay_s`` real seconds late (for client timeouts).

``GET /sim/faults`` lists what is armed; ``DELETE /sim/faults`` disarms everything.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass

from aiohttp import web

from kiosk_agent.sim.context import SimContext
from kiosk_agent.sim.http import (
    Handler,
    api_error,
    bad_request,
    json_response,
    read_ahead,
    read_json,
)

FAULTS = ("drop_answer", "server_error", "unavailable", "delay")
METHODS = ("GET", "POST", "PUT", "DELETE")


@dataclass(slots=True)
class Fault:
    path: str
    method: str
    fault: str
    remaining: int
    delay_s: float

    def matches(self, request: web.Request) -> bool:
        return (
            self.remaining > 0
            and request.method == self.method
            and _path_matches(self.path, request.path)
        )


def _path_matches(pattern: str, path: str) -> bool:
    """Exact, or a prefix when the pattern ends with ``*`` (``/api/terminal/SIM-0001/*``)."""
    if pattern.endswith("*"):
        return path.startswith(pattern[:-1])
    return path == pattern


class Faults:
    def __init__(self) -> None:
        self.armed: list[Fault] = []

    def take(self, request: web.Request) -> Fault | None:
        if request.path.startswith("/sim/"):
            return None
        for fault in self.armed:
            if fault.matches(request):
                fault.remaining -= 1
                if fault.remaining == 0:
                    self.armed.remove(fault)
                return fault
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        fault = self.take(request) if self.armed else None
        if fault is None:
            return await handler(request)
        if fault.fault == "server_error":
            return api_error(500, "server_error", "injected fault: server error")
        if fault.fault == "unavailable":
            return api_error(
                503, "unavailable", "injected fault: service unavailable", {"Retry-After": "1"}
            )
        if fault.fault == "delay":
            # the body is in before the wait: the call is committed late even when the client
            # has given up (or died) meanwhile, as a slow service would
            await read_ahead(request)
            await asyncio.sleep(fault.delay_s)
            return await handler(request)
        # drop_answer: the work is done, the answer is lost on the way back.
        await handler(request)
        if request.transport is not None:
            request.transport.abort()
        raise asyncio.CancelledError  # nothing is written; aiohttp drops the connection

    async def handle_arm(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        path = body.req_text("path")
        if not path.startswith("/"):
            raise bad_request("field 'path' must start with '/'")
        fault = Fault(
            path=path,
            method=body.choice("method", METHODS, default="POST") or "POST",
            fault=body.choice("fault", FAULTS, required=True) or "",
            remaining=body.integer("count", minimum=1, maximum=1000) or 1,
            delay_s=_delay(body.data.get("delay_s")),
        )
        self.armed.append(fault)
        return json_response(asdict(fault))

    async def handle_list(self, _: web.Request) -> web.Response:
        return json_response({"faults": [asdict(fault) for fault in self.armed]})

    async def handle_clear(self, _: web.Request) -> web.Response:
        self.armed.clear()
        return json_response({"faults": []})


def _delay(value: object) -> float:
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 60:
        raise bad_request("field 'delay_s' must be a number of seconds from 0 to 60")
    return float(value)


def setup(app: web.Application, ctx: SimContext) -> None:
    faults = Faults()
    ctx.extras["faults"] = faults
    app.middlewares.append(faults.middleware)
    app.router.add_post("/sim/faults", faults.handle_arm)
    app.router.add_get("/sim/faults", faults.handle_list)
    app.router.add_delete("/sim/faults", faults.handle_clear)
