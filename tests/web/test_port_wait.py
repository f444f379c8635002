"""A local server whose port another program holds: it waits for the port, named, and serves
once the port is free (web/server.py's PortWait), instead of giving up until a restart.

The holder is a real process listening on a real socket (a child Python: the name health gives
is its pid and command line); the waits run on a FakeClock the test moves, so no step of the
backoff is a real sleep and each is seen as it is asked for.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kiosk_agent.health.model import Health
from kiosk_agent.platforms.kiosk_api import KioskApi
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.states import SaleState
from kiosk_agent.web.server import PORT_WAIT_FIRST, PORT_WAIT_MAX, LocalSite

from ..helpers import until
from ..platforms.agent_rig import running_agent
from ..platforms.test_kiosk_api import TOKEN, App

# A program holding a port: listens until its standard input closes, then lets go.
_HOLDER = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", 0))
server.listen()
print(server.getsockname()[1], flush=True)
sys.stdin.read()
server.close()
"""


class PortHolder:
    """Another program on a port of 127.0.0.1 (``port``), until ``release``."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self.port = 0

    async def start(self) -> PortHolder:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _HOLDER, "holding-the-port",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        assert self.process.stdout is not None
        self.port = int(await asyncio.wait_for(self.process.stdout.readline(), 30))
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def release(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        assert process.stdin is not None
        process.stdin.close()
        await asyncio.wait_for(process.wait(), 30)


async def _hello(request: web.Request) -> web.Response:
    return web.json_response({"hello": "kiosk"})


async def _says_hello(port: int) -> bool:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/hello") as r:
        return r.status == 200 and await r.json() == {"hello": "kiosk"}


async def _waited_through(site: LocalSite, clock: FakeClock, last_try: int) -> None:
    """Each wait ``site`` asks for let pass on ``clock``, up to its try ``last_try``: each a
    step further apart, doubling from PORT_WAIT_FIRST to the cap."""
    steps = [PORT_WAIT_FIRST]
    for tries in range(2, last_try + 1):
        await until(lambda: clock.pending() == [clock.monotonic() + steps[-1]])
        await clock.advance(steps[-1])
        await until(lambda t=tries: site.listening()["tries"] == t)  # type: ignore[misc]
        steps.append(min(PORT_WAIT_MAX, steps[-1] * 2))


async def test_a_site_waits_for_its_port_held_by_another_program_then_serves_within_a_step(
) -> None:
    clock = FakeClock()
    health = Health("test")
    holder = await PortHolder().start()
    site = LocalSite("127.0.0.1", holder.port, name="kiosk_api:screen", health=health,
                     wait_for_port=True, waits=clock)
    app = web.Application()
    app.router.add_get("/hello", _hello)
    try:
        await site.start(app)  # not a ListenError: waiting
        state = site.listening()
        assert state["state"] == "waiting"
        assert state["port"] == holder.port
        assert state["held_by"].startswith(f"pid {holder.pid}: "), state
        assert "holding-the-port" in state["held_by"]  # its command line
        assert state["next_try_in_s"] == PORT_WAIT_FIRST
        [problem] = health.snapshot().problems
        assert problem.startswith(f"kiosk_api:screen not listening: waiting for port "
                                  f"{holder.port} on 127.0.0.1, in use by pid {holder.pid}: ")
        assert health.snapshot().status == "degraded"

        # still held: each try a step further apart, doubling to the cap
        await _waited_through(site, clock, 7)
        await until(lambda: len(clock.sleeps) == 7)  # the next try's wait, asked for
        assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]  # bounded, none real
        assert site.listening()["next_try_in_s"] == PORT_WAIT_MAX
        assert site.port is None

        # let go: served at the next try, one step on
        await holder.release()
        await until(lambda: clock.pending() == [clock.monotonic() + PORT_WAIT_MAX])
        await clock.advance(PORT_WAIT_MAX)
        await until(lambda: site.waiting is None)
        assert site.port == holder.port
        assert site.listening() == {"state": "listening", "port": holder.port}
        assert await _says_hello(holder.port)
        assert health.snapshot().problems == []
    finally:
        await holder.release()
        await site.stop()


async def test_a_site_stopped_while_it_waits_stops_waiting() -> None:
    clock = FakeClock()
    health = Health("test")
    holder = await PortHolder().start()
    site = LocalSite("127.0.0.1", holder.port, name="admin", counted_as="admin API",
                     health=health, wait_for_port=True, waits=clock)
    try:
        await site.start(web.Application())
        assert health.snapshot().problems[0].startswith("admin API not listening: ")
        await site.stop()
        assert clock.pending() == []  # its task ended with it
        assert site.listening() == {"state": "stopped", "port": None}
        assert health.snapshot().problems == []
    finally:
        await holder.release()


@pytest.mark.slow(seconds=5)
async def test_a_kiosk_api_whose_port_is_taken_waits_while_the_agent_sells_then_serves(
    tmp_path: Path, sim_settings: Any
) -> None:
    """Before: `trigger kiosk_api:screen cannot start: ... the port is in use by ...`, and that
    trigger never came back until the agent restarted. Now it waits, named in health and its
    status; the agent's other trigger sells meanwhile; once the program lets go, the API
    serves within one step of the backoff, and sells."""
    clock = FakeClock(wall=time.time())
    holder = await PortHolder().start()
    triggers = [
        {"platform": "kiosk_api", "name": "screen", "token": "!secret kiosk_token",
         "port": holder.port, "products": {"tea": "1.75"}},
        {"platform": "kiosk_api", "name": "till", "token": "!secret kiosk_token", "port": 0,
         "products": {"tea": "1.75"}},
    ]
    try:
        async with (
            running_agent(tmp_path, sim_settings, triggers, clock=clock,
                          secrets={"kiosk_token": TOKEN}) as agent,
            aiohttp.ClientSession() as session,
        ):
            screen, till = agent.platforms
            assert isinstance(screen, KioskApi)
            assert isinstance(till, KioskApi)
            assert agent.not_started == {}  # it runs: waiting is not "cannot start"
            listening = screen.status()["listening"]
            assert listening["state"] == "waiting"
            assert listening["held_by"].startswith(f"pid {holder.pid}: ")
            problems = agent.health.snapshot().problems
            assert any(p.startswith(f"kiosk_api:screen not listening: waiting for port "
                                    f"{holder.port} on 127.0.0.1, in use by pid {holder.pid}")
                       for p in problems), problems

            # the rest of the agent sells meanwhile
            await _sells(App(till, session))

            await holder.release()
            step = screen.status()["listening"]["next_try_in_s"]
            assert 0 < step <= PORT_WAIT_FIRST
            await clock.advance(step)  # one step of the backoff
            await until(lambda: screen.status()["listening"]["state"] == "listening")
            assert screen.port == holder.port
            await _sells(App(screen, session))
            assert not any("kiosk_api:screen" in p for p in agent.health.snapshot().problems)
    finally:
        await holder.release()


THREE_SECRETS = {"kiosk_token": TOKEN, "admin_token": "a" * 24, "hook": "h" * 16}


def _three_on(host: str, tmp_path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A kiosk API ``screen``, an admin API and a webhook receiver, the three on ``host``, and a
    kiosk API ``till`` on the usual address: the triggers and the config's other sections (the
    secrets they name: THREE_SECRETS)."""
    triggers = [
        {"platform": "kiosk_api", "name": "screen", "token": "!secret kiosk_token",
         "host": host, "port": 0, "products": {"tea": "1.75"}},
        {"platform": "kiosk_api", "name": "till", "token": "!secret kiosk_token", "port": 0,
         "products": {"tea": "1.75"}},
    ]
    sections = {"admin": {"host": host, "port": 0, "metrics_public": True,
                          "tokens": [{"name": "tech", "token": "!secret admin_token"}]},
                "webhooks": {"host": host, "port": 0, "secret": "!secret hook",
                             "store": str(tmp_path / "webhooks.db")}}
    return triggers, sections


async def _sells(app: App) -> None:
    status, started = await app.post("/sales", {"product": "tea"})
    assert status == 202, started
    sale_id = started["sale_id"]
    await until(lambda: sale_id in app.api._latest and app.api._latest[sale_id].state.final)
    assert app.api._latest[sale_id].state is SaleState.COMPLETED


async def test_an_admin_api_whose_port_is_taken_waits_and_the_agent_runs(
    tmp_path: Path, sim_settings: Any
) -> None:
    """Before: the admin API's port taken stopped the whole agent at start (ListenError, exit
    1): no sale on any trigger. Now the agent starts and sells, health says the admin API
    waits and for whom, and its page, API and /metrics come within a step of the release."""
    from kiosk_agent.admin.server import AdminServer

    clock = FakeClock(wall=time.time())
    holder = await PortHolder().start()
    triggers = [{"platform": "kiosk_api", "name": "till", "token": "!secret kiosk_token",
                 "port": 0, "products": {"tea": "1.75"}}]
    admin = {"admin": {"port": holder.port, "metrics_public": True,
                       "tokens": [{"name": "tech", "token": "!secret admin_token"}]}}
    try:
        async with (
            running_agent(tmp_path, sim_settings, triggers, clock=clock, sections=admin,
                          secrets={"kiosk_token": TOKEN, "admin_token": "a" * 24}) as agent,
            aiohttp.ClientSession() as session,
        ):
            [server] = [c for c in agent.components if isinstance(c, AdminServer)]
            problems = agent.health.snapshot().problems
            assert any(p.startswith(f"admin API not listening: waiting for port {holder.port} "
                                    f"on 127.0.0.1, in use by pid {holder.pid}: ")
                       for p in problems), problems
            [till] = agent.platforms
            assert isinstance(till, KioskApi)
            await _sells(App(till, session))  # the agent sells meanwhile

            await holder.release()
            await clock.advance(server._site.listening()["next_try_in_s"])
            await until(lambda: server.port == holder.port)
            async with session.get(f"http://127.0.0.1:{holder.port}/metrics") as answer:
                assert answer.status == 200
                assert "kiosk_agent" in await answer.text()
            assert not any(p.startswith("admin API") for p in agent.health.snapshot().problems)
    finally:
        await holder.release()
