"""A small scripted HTTP server for answers the simulator never gives (HTML 502 pages,
truncated JSON, wrong types, dropped connections), served for real on 127.0.0.1."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

Reply = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_reply(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    async def reply(request: web.Request) -> web.StreamResponse:
        return web.json_response(data, status=status, headers=headers)

    return reply


def raw_reply(body: bytes, status: int = 200, content_type: str = "application/json") -> Reply:
    async def reply(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, status=status, content_type=content_type)

    return reply


async def drop_connection(request: web.Request) -> web.StreamResponse:
    """Read the request, then hang up without answering: the outcome is unknown to the client."""
    await request.read()
    assert request.transport is not None
    request.transport.close()
    return web.Response()  # never reaches the client


class ScriptedServer:
    """Answers each (method, path) with the next scripted reply; the last one repeats."""

    def __init__(self) -> None:
        self.replies: dict[tuple[str, str], deque[Reply]] = defaultdict(deque)
        self.requests: list[web.Request] = []
        self.bodies: list[bytes] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    def script(self, method: str, path: str, *replies: Reply) -> None:
        self.replies[(method, path)].extend(replies)

    def count(self, method: str, path: str) -> int:
        return sum(1 for r in self.requests if r.method == method and r.path == path)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request)
        self.bodies.append(await request.read())
        queue = self.replies.get((request.method, request.path))
        if not queue:
            return web.json_response({"error": "not_found"}, status=404)
        reply = queue.popleft() if len(queue) > 1 else queue[0]
        return await reply(request)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
