"""A local server whose address is not on the machine yet (EADDRNOTAVAIL: a LAN address before
DHCP has given it, at boot): it waits for the address, said so, and serves once the address
appears (web/server.py's PortWait, the same wait as a port held), instead of a kiosk API down
until a restart or an admin API that stopped the agent (exit 1) until systemd gave up.

The address is a real one of TEST-NET-2 or -3 (198.51.100.0/24, 203.0.113.0/24, RFC 5737),
which no machine has: a bind to it really fails. It appears as a /32 on ``lo`` (``ip addr
add``) where the test may (root, or CAP_NET_ADMIN), and is taken away after; elsewhere the
tests that need it are skipped.
The waits run on a FakeClock the test moves: no step of the backoff is a real sleep.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import shutil
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kiosk_agent.health.model import Health
from kiosk_agent.platforms.kiosk_api import KioskApi
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.web.server import PORT_WAIT_FIRST, LocalSite

from ..helpers import until
from ..platforms.agent_rig import running_agent
from ..platforms.test_kiosk_api import App
from .test_port_wait import THREE_SECRETS, _hello, _sells, _three_on, _waited_through


def _not_here() -> str:
    """An address of TEST-NET-2 or -3 this machine does not have now (a bind to it is refused).
    Each test worker draws from its own part of them, so a test that adds its address to
    ``lo`` never makes another worker's "not here" one appear."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker.removeprefix("gw")) if worker.startswith("gw") else 0
    mine = [f"{net}.{host}" for net in ("198.51.100", "203.0.113") for host in range(1, 255)
            ][index::max(1, workers)]
    for _ in range(50):
        address = random.choice(mine)
        with socket.socket() as probe:
            try:
                probe.bind((address, 0))
            except OSError as err:
                if err.errno == errno.EADDRNOTAVAIL:
                    return address
                raise
    pytest.fail("every address of 198.51.100.0/24 and 203.0.113.0/24 tried is on this machine")


async def _ip(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        "ip", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), 30)
    return process.returncode or 0, out.decode(errors="replace").strip()


class Address:
    """An address not on the machine (``host``), until ``appear`` puts it on ``lo``."""

    def __init__(self) -> None:
        self.host = _not_here()
        self.added = False

    async def appear(self) -> None:
        if shutil.which("ip") is None:
            pytest.skip("no `ip` here to add an address with")
        code, out = await _ip("addr", "add", f"{self.host}/32", "dev", "lo")
        if code != 0:
            pytest.skip(f"cannot add an address here (root or CAP_NET_ADMIN needed): {out}")
        self.added = True

    async def remove(self) -> None:
        if self.added:
            self.added = False
            code, out = await _ip("addr", "del", f"{self.host}/32", "dev", "lo")
            assert code == 0, out


@pytest.fixture
async def address() -> AsyncIterator[Address]:
    missing = Address()
    try:
        yield missing
    finally:
        await missing.remove()


async def _says_hello(host: str, port: int) -> bool:
    async with aiohttp.ClientSession() as http, http.get(f"http://{host}:{port}/hello") as r:
        return r.status == 200 and await r.json() == {"hello": "kiosk"}


async def _waits_for_the_address(site: LocalSite, health: Health, address: Address,
                                 clock: FakeClock) -> None:
    state = site.listening()
    assert state["state"] == "waiting"
    assert state["waiting_for"] == "address"
    assert state["host"] == address.host
    assert state["held_by"] == ""  # no program to name: nothing holds it
    assert state["detail"].startswith(f"address {address.host} is not on this machine (yet)")
    assert "change the host" in state["detail"]  # what to do if it never comes
    assert state["next_try_in_s"] == PORT_WAIT_FIRST
    [problem] = health.snapshot().problems
    assert problem.startswith(f"kiosk_api:screen not listening on {address.host}:0: address "
                              f"{address.host} is not on this machine (yet): "), problem
    assert problem.endswith("served as soon as it appears)"), problem
    assert health.snapshot().status == "degraded"
    assert site.port is None


async def test_a_site_waits_for_an_address_not_on_the_machine_yet_and_says_so() -> None:
    """No root needed: the wait, its words and its backoff, and a stop that ends it."""
    clock = FakeClock()
    health = Health("test")
    address = Address()
    site = LocalSite(address.host, 0, name="kiosk_api:screen", health=health,
                     wait_for_port=True, waits=clock)
    try:
        await site.start(web.Application())  # not a ListenError: waiting
        await _waits_for_the_address(site, health, address, clock)
        await _waited_through(site, clock, 6)
        await until(lambda: len(clock.sleeps) == 6)
        assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]  # bounded, none real
        assert site.listening()["waiting_for"] == "address"  # still the same words
        assert "tried 6 time(s)" in health.snapshot().problems[0]
        await site.stop()
        assert clock.pending() == []
        assert site.listening() == {"state": "stopped", "port": None}
        assert health.snapshot().problems == []
    finally:
        await site.stop()


async def test_a_site_serves_within_a_step_of_its_address_appearing(address: Address) -> None:
    clock = FakeClock()
    health = Health("test")
    site = LocalSite(address.host, 0, name="kiosk_api:screen", health=health,
                     wait_for_port=True, waits=clock)
    app = web.Application()
    app.router.add_get("/hello", _hello)
    try:
        await site.start(app)
        await _waits_for_the_address(site, health, address, clock)
        for step in (PORT_WAIT_FIRST, PORT_WAIT_FIRST * 2):  # two tries more, still missing
            await until(lambda s=step: clock.pending() == [clock.monotonic() + s])  # type: ignore[misc]
            await clock.advance(step)
        await until(lambda: site.listening()["tries"] == 3)

        await address.appear()  # DHCP gives it: served at the next try, one step on
        step = site.listening()["next_try_in_s"]
        assert step == PORT_WAIT_FIRST * 4
        await until(lambda: clock.pending() == [clock.monotonic() + step])
        await clock.advance(step)
        await until(lambda: site.waiting is None)
        assert site.port
        assert site.listening() == {"state": "listening", "port": site.port}
        assert await _says_hello(address.host, site.port)
        assert health.snapshot().problems == []
    finally:
        await site.stop()


@pytest.mark.slow(seconds=5)
async def test_the_agent_s_servers_wait_for_their_address_while_the_agent_sells(
    tmp_path: Path, sim_settings: Any, address: Address
) -> None:
    """Before: the kiosk API there was `cannot start` until a restart, and an admin API or a
    webhook receiver there stopped the whole agent (ListenError, exit 1; systemd restarted it
    and gave up after its start limit), no sale at all. Now the agent starts and sells on its
    other trigger while the three wait, said in health and the kiosk API's status; once the
    address appears all serve within one step, and the kiosk API there sells."""
    from kiosk_agent.admin.server import AdminServer
    from kiosk_agent.admin.webhooks import WebhookReceiver

    clock = FakeClock(wall=time.time())
    triggers, admin = _three_on(address.host, tmp_path)
    async with (
        running_agent(tmp_path, sim_settings, triggers, clock=clock, sections=admin,
                      secrets=THREE_SECRETS) as agent,
        aiohttp.ClientSession() as session,
    ):
        screen, till = agent.platforms
        assert isinstance(screen, KioskApi)
        assert isinstance(till, KioskApi)
        [server] = [c for c in agent.components if isinstance(c, AdminServer)]
        [hooks] = [c for c in agent.components if isinstance(c, WebhookReceiver)]
        assert agent.not_started == {}  # it runs: waiting is not "cannot start"
        listening = screen.status()["listening"]
        assert listening["state"] == "waiting"
        assert listening["waiting_for"] == "address"
        problems = agent.health.snapshot().problems
        for part in ("kiosk_api:screen", "admin API", "webhook receiver"):
            assert any(p.startswith(f"{part} not listening on {address.host}:0: address "
                                    f"{address.host} is not on this machine (yet)")
                       for p in problems), problems

        await _sells(App(till, session))  # the rest of the agent sells meanwhile

        await address.appear()
        step = max(site.listening()["next_try_in_s"]
                   for site in (screen._site, server._site, hooks._site))
        assert 0 < step <= PORT_WAIT_FIRST
        await clock.advance(step)  # one step of the backoff
        await until(lambda: screen.status()["listening"]["state"] == "listening")
        await until(lambda: server._site.listening()["state"] == "listening")
        await until(lambda: hooks._site.listening()["state"] == "listening")
        app = App(screen, session)
        app.base = f"http://{address.host}:{screen.port}/api/v1"
        await _sells(app)
        async with session.get(f"http://{address.host}:{server.port}/metrics") as answer:
            assert answer.status == 200
            assert "kiosk_agent" in await answer.text()
        async with session.post(f"http://{address.host}:{hooks.port}{hooks.path}",
                                data=b"{}") as answer:
            assert answer.status == 401  # heard: an unsigned delivery refused
        assert not any(address.host in p for p in agent.health.snapshot().problems)
