"""The kiosk API's checks (Host, Origin, token) stand before every request it answers: every
route of its app (each method, HEAD and OPTIONS too, the streams' handshakes, a route added
later), and a request no route matches, whatever its target (``*``, an absolute URL with no
path, CONNECT's host:port, a path with a line break). An outsider learns nothing of which paths
exist, and each refusal is counted in the API's status."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kiosk_agent.platforms.kiosk_api import KioskApi

from .test_kiosk_api import TOKEN, App, _app

_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_WEBSOCKET = ("Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n")


@pytest.fixture
async def app(tmp_path: Path, sim_settings: Any) -> AsyncIterator[App]:
    async for a in _app(tmp_path, sim_settings):
        yield a


def _router(api: KioskApi) -> web.UrlDispatcher:
    runner = api._site._runner
    assert runner is not None
    return runner.app.router


async def _raw(api: KioskApi, method: str, target: str, headers: str) -> tuple[int, bytes]:
    """One request as written on the wire (no client to tidy its target): status and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", api.port)
    try:
        writer.write(f"{method} {target} HTTP/1.1\r\n{headers}Connection: close\r\n\r\n".encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _targets(api: KioskApi) -> list[tuple[str, str]]:
    """(method, target) for each route of the app (a variable part filled in), each method a
    route of any method takes, and the targets no route matches."""
    asked: list[tuple[str, str]] = []
    for route in _router(api).routes():
        target = re.sub(r"\{[^}]*\}", "x", route.resource.canonical if route.resource else "/")
        methods = _METHODS if route.method == "*" else (route.method,)
        asked += [(method, target) for method in methods]
    asked += [(m, "/nope") for m in _METHODS]
    asked += [("OPTIONS", "*"), ("GET", "http://evil.example"), ("CONNECT", "evil.example:443"),
              ("GET", "/nope%0Abar"), ("GET", "/api/v1/status%0A"), ("GET", "/api/v1/%0A/sales")]
    return asked


async def test_every_route_and_every_target_refuses_a_wrong_host_origin_or_token(
    app: App,
) -> None:
    """Enumerated from the app's router: a route added without the checks fails here."""
    api = app.api
    good = f"Host: 127.0.0.1:{api.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
    wrong = {
        401: [f"Host: 127.0.0.1:{api.port}\r\n",
              f"Host: 127.0.0.1:{api.port}\r\nAuthorization: Bearer not-{TOKEN}\r\n"],
        403: [f"Host: evil.example\r\nAuthorization: Bearer {TOKEN}\r\n",
              good + "Origin: http://evil.example\r\n"],
    }
    asked = _targets(api)
    assert len(asked) > 20
    for method, target in asked:
        for websocket in ("", _WEBSOCKET):
            for status, headers in wrong.items():
                for header in headers:
                    rejected = api.rejected
                    said, body = await _raw(api, method, target, header + websocket)
                    assert said == status, (method, target, header, websocket)
                    if method != "HEAD":
                        assert json.loads(body)["error"] in ("unauthorized", "bad_host",
                                                             "bad_origin")
                    assert api.rejected == rejected + 1, (method, target)  # counted


async def test_a_route_added_later_is_checked_too(app: App) -> None:
    """A route put on the kiosk API's app after it started (a platform's, a later change's)
    is behind the same checks as the API's own."""
    api = app.api
    router = _router(api)
    router._frozen = False  # as a later route would be, had it been added before the start
    try:
        called: list[str] = []

        async def extra(request: web.Request) -> web.Response:
            called.append(request.path)
            return web.json_response({})

        router.add_get("/extra", extra)
    finally:
        router._frozen = True
    said, _ = await _raw(api, "GET", "/extra", f"Host: 127.0.0.1:{api.port}\r\n")
    assert said == 401
    assert called == []
    said, _ = await _raw(api, "GET", "/extra",
                         f"Host: 127.0.0.1:{api.port}\r\nAuthorization: Bearer {TOKEN}\r\n")
    assert said == 200
    assert called == ["/extra"]


async def test_a_handlers_unexpected_error_is_a_clear_503_counted_and_shown_in_health(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in a handler (here the card payment's look-up raising) answers the app a 503 in
    the API's own JSON (never a 500: rule 10), is logged with its traceback and counted, and
    health shows it as the agent's other parts' unexpected errors."""
    api = app.api

    def broken() -> dict[str, Any]:
        raise RuntimeError("a bug in a handler")

    api.card_payment = broken  # type: ignore[method-assign]
    status, body = await app.get("/status")
    del api.card_payment
    assert status == 503
    assert body["error"] == "unavailable"
    assert "RuntimeError" not in body["message"]  # the app is told, not the traceback
    assert api.status()["unexpected"] == 1
    [logged] = [r for r in caplog.records
                if r.exc_info and r.name == "kiosk_agent.web.server"]
    assert "GET /api/v1/status" in logged.getMessage()
    assert TOKEN not in logged.getMessage()
    problems = api.agent.health.snapshot().problems
    assert any("unexpected errors" in p and f"{api.name} 1" in p for p in problems), problems
    # the refusals and the API's own answers are not unexpected
    status, _ = await app.get("/status")
    assert status == 200
    said, _ = await _raw(api, "GET", "/nope", f"Host: 127.0.0.1:{api.port}\r\n"
                         f"Authorization: Bearer {TOKEN}\r\n")
    assert said == 404
    assert api.status()["unexpected"] == 1


@pytest.mark.parametrize("gone", [ConnectionResetError, TimeoutError])
async def test_a_client_gone_or_a_timeout_is_not_counted_a_bug(
    app: App, gone: type[Exception]
) -> None:
    """A stream's app that closed its socket makes the next write raise ConnectionResetError
    in the handler: that request ends (503 if the client still hears), and health counts no
    bug (a kiosk app closing its streams would otherwise show the unit DEGRADED). A timeout
    is aiohttp's 504, as before. Never a 500."""
    api = app.api

    def leaving() -> dict[str, Any]:
        raise gone("the client is gone")

    api.card_payment = leaving  # type: ignore[method-assign]
    async with app.session.get(app.base + "/status",
                               headers={"Authorization": f"Bearer {TOKEN}"}) as response:
        assert response.status == (503 if gone is ConnectionResetError else 504)
    del api.card_payment
    assert api.status()["unexpected"] == 0
    assert not [p for p in api.agent.health.snapshot().problems if "unexpected" in p]
