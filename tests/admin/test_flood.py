"""A slow-header flood against the running agent, under the descriptor limit systemd gives by
default (1,024): sales go on and ``/api/status`` answers, whichever port is flooded."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.app import load_agent
from kiosk_agent.web.server import LISTEN_BACKLOG, SILENT_SHARE, live_sites

from ..child_signals import stop
from .conftest import ADMIN_TOKEN, KIOSK_TOKEN, write_config

FLOOD = 1100
FLOOD_ANSWER_S = 120.0  # the flood process's answers (READY, STATS): a hang's guard
KIOSK = """
triggers:
  - platform: kiosk_api
    name: screen
    token: !secret kiosk_token
    port: 0
    products: {coffee: "2.50"}
"""


@contextlib.contextmanager
def descriptor_limit(soft: int) -> Iterator[None]:
    """This process (the agent) gets systemd's default soft limit for the test's length."""
    old_soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (old_soft, hard))


@contextlib.asynccontextmanager
async def slowloris(port: int, count: int) -> AsyncIterator[asyncio.subprocess.Process]:
    """The flood, from its own process (its descriptors are not the agent's)."""
    script = Path(__file__).with_name("slowloris.py")
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(script), "127.0.0.1", str(port), str(count),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        ready = await asyncio.wait_for(process.stdout.readline(), FLOOD_ANSWER_S)
        assert ready.startswith(b"READY"), ready
        yield process
    finally:
        if process.returncode is None:
            assert process.stdin is not None
            process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                await stop(process)


async def flood_stats(process: asyncio.subprocess.Process) -> tuple[int, int, int]:
    assert process.stdin is not None
    assert process.stdout is not None
    process.stdin.write(b"stats\n")
    # a hang's guard: the flood's 1,100 connections each wake once a second, and at load 11-15
    # (the flood niced as the tests are) its loop ran more than 10 s behind its stdin
    line = (await asyncio.wait_for(process.stdout.readline(), FLOOD_ANSWER_S)).split()
    return int(line[1]), int(line[2]), int(line[3])


@pytest.fixture
async def agent(tmp_path: Path, sim_settings: Any) -> AsyncIterator[Any]:
    agent = load_agent(write_config(tmp_path, KIOSK), sim_settings, systemd=False)
    await agent.start()
    yield agent
    await agent.stop()


def _admin(agent: Any) -> Any:
    return next(c for c in agent.components if type(c).__name__ == "AdminServer")


async def _status(session: aiohttp.ClientSession, url: str) -> float:
    started = time.monotonic()
    async with session.get(
        f"{url}/api/status", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    ) as response:
        assert response.status == 200
        assert (await response.json())["version"]
    return time.monotonic() - started


async def _kiosk_status(session: aiohttp.ClientSession, port: int) -> None:
    async with session.get(
        f"http://127.0.0.1:{port}/api/v1/status",
        headers={"Authorization": f"Bearer {KIOSK_TOKEN}"},
    ) as response:
        assert response.status == 200, await response.text()


async def _sale(session: aiohttp.ClientSession, port: int) -> str:
    base = f"http://127.0.0.1:{port}/api/v1"
    headers = {"Authorization": f"Bearer {KIOSK_TOKEN}"}
    async with session.post(f"{base}/sales", json={"product": "coffee"}, headers=headers) as r:
        assert r.status == 202, await r.text()
        sale_id = (await r.json())["sale_id"]
    for _ in range(400):
        async with session.get(f"{base}/sales/{sale_id}", headers=headers) as r:
            step = await r.json()
        if step.get("final"):
            return str(step["state"])
        await asyncio.sleep(0.05)
    raise AssertionError(f"sale {sale_id} did not end: {step}")


@pytest.mark.parametrize("flooded", ["kiosk_api", "admin"])
async def test_a_slow_header_flood_on_one_port_stops_no_sale_and_no_status(
    agent: Any, flooded: str
) -> None:
    admin = _admin(agent)
    [kiosk] = agent.platforms
    port = kiosk.port if flooded == "kiosk_api" else admin.port
    site = kiosk._site if flooded == "kiosk_api" else admin._site
    with descriptor_limit(1024):
        async with aiohttp.ClientSession() as session:
            # the admin and the touchscreen app are connected before the flood, as they run
            await _status(session, admin.url)
            await _kiosk_status(session, kiosk.port)
            began = time.monotonic()
            async with slowloris(port, FLOOD) as flood:
                latencies = [await _status(session, admin.url) for _ in range(5)]
                assert await _sale(session, kiosk.port) == "completed"
                latencies += [await _status(session, admin.url) for _ in range(5)]
                # a client that connects now waits in the kernel's queue behind the flood's
                # newcomers (at most LISTEN_BACKLOG of them, taken at accept_rate_at_cap a
                # second), then gets in: its request is whole when it is accepted
                async with aiohttp.ClientSession() as newcomer:
                    started = time.monotonic()
                    if flooded == "kiosk_api":
                        await _kiosk_status(newcomer, kiosk.port)
                    else:
                        await _status(newcomer, admin.url)
                    newcomer_s = time.monotonic() - started
                open_now, closed, refused = await flood_stats(flood)
                evicted, turned_away = site.evicted, site.turned_away
                took = time.monotonic() - began
                held = max(site.open_connections for site in live_sites())
                descriptors = len(os.listdir("/proc/self/fd"))
                async with session.get(
                    f"{admin.url}/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
                ) as response:
                    metrics = await response.text()
    print(f"flood on {flooded}: status max {max(latencies) * 1000:.0f} ms, a newcomer's "
          f"{newcomer_s * 1000:.0f} ms; the agent holds "
          f"{held} connections, {descriptors} descriptors; attacker: {open_now} open, "
          f"cut {closed} times, refused {refused}; in {took:.1f} s {evicted} evicted, "
          f"{turned_away} turned away")
    # The server kept at most its cap of the attacker's connections; the rest were closed or
    # wait in the kernel's queue, holding no descriptor of the agent's.
    assert held <= 256
    assert descriptors < 700
    assert closed >= 256
    assert max(latencies) < 5.0  # generous: a busy 2-core machine, not a timeout
    rate = site.limits.accept_rate_at_cap
    assert newcomer_s < LISTEN_BACKLOG / rate + 5  # 3.4 s, and 5 s more for a busy machine
    # The churn is bounded: past the cap, newcomers are accepted at accept_rate_at_cap (300) a
    # second, a second's worth saved up, and the silent ones among them let in at a quarter of
    # that (the others told 503 at once); the rest of the flood waits in the kernel's queue.
    assert evicted + turned_away <= rate * (took + 1)
    assert evicted <= rate * SILENT_SHARE * (took + 1)
    server = "kiosk_api:screen" if flooded == "kiosk_api" else "admin"
    sample = f'kiosk_agent_refusals_total{{reason="connection_cap",source="http:{server}"}}'
    assert sample in metrics
    assert "kiosk_agent_http_connections" in metrics
