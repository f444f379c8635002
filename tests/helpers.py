"""Small waiting and port helpers shared by the test folders."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any


async def until(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    """Wait until ``predicate()`` is true; TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


def free_port() -> int:
    """A loopback port free right now, for a server that must come back on the same port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def sim_call(sim: Any, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """A simulator test helper (``/sim/...``, no auth): its JSON answer; fails unless 200."""
    import aiohttp

    async with aiohttp.ClientSession() as http, http.request(
        method, f"{sim.base_url}{path}", json=body
    ) as response:
        assert response.status == 200, await response.text()
        return await response.json()
