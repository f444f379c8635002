"""The device's small HTTP servers: any free port, told back; stopped means not listening."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from kiosk_agent.core.web import LocalSite


async def test_a_site_on_port_0_learns_its_port_and_stops_listening() -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"hello": "kiosk"})

    app = web.Application()
    app.router.add_get("/hello", hello)
    site = LocalSite("127.0.0.1", 0)
    assert site.port is None
    await site.start(app)
    assert site.port
    assert site.url == f"http://127.0.0.1:{site.port}"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{site.url}/hello") as response:
            assert await response.json() == {"hello": "kiosk"}
        await site.stop()
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.get(f"{site.url}/hello")
    await site.stop()  # a second stop is harmless
