"""A local server whose host is a name that does not resolve yet (DNS not up at boot:
``socket.gaierror`` EAI_AGAIN; a resolver answering "no such name" before the one that knows it:
EAI_NONAME): it waits for the name, said so, and serves within one step of it resolving
(web/server.py's PortWait, the same wait as a port held or an address not here yet), instead of
an admin API or a webhook receiver that stopped the agent (exit 1) until systemd gave up.

The resolver is the test's (:class:`Dns`), given as the site's look-up step (LocalSite's
``resolve``, the agent's ``listen_resolve``): down, it fails as glibc does; up, it hands the
name's address to the real getaddrinfo, and the site binds and serves a real socket there.
The waits run on a FakeClock the test moves: no step of the backoff is a real sleep.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kiosk_agent.health.model import Health
from kiosk_agent.platforms.kiosk_api import KioskApi
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.web.server import PORT_WAIT_FIRST, PORT_WAIT_MAX, ListenError, LocalSite

from ..helpers import until
from ..platforms.agent_rig import running_agent
from ..platforms.test_kiosk_api import App
from .test_port_wait import THREE_SECRETS, _hello, _says_hello, _sells, _three_on

NAME = "kiosk-shop.lan"
DOWN = "Temporary failure in name resolution"  # glibc's words for EAI_AGAIN
UNKNOWN = "Name or service not known"  # ... and for EAI_NONAME


class Dns:
    """The machine's resolver as the test sets it: ``down`` (EAI_AGAIN), ``unknown`` (EAI_NONAME)
    or ``up`` (``NAME`` is 127.0.0.1: the real getaddrinfo of that address); any other host
    (an address) goes to the real getaddrinfo as ever."""

    def __init__(self) -> None:
        self.state = "down"
        self.asked: list[Any] = []

    async def __call__(self, host: Any, port: Any, **kw: Any) -> list[tuple[Any, ...]]:
        loop = asyncio.get_running_loop()
        if host != NAME.encode():  # an address (another trigger's 127.0.0.1): as ever
            return await loop.getaddrinfo(host, port, **kw)
        self.asked.append(host)
        if self.state == "down":
            raise socket.gaierror(socket.EAI_AGAIN, DOWN)
        if self.state == "unknown":
            raise socket.gaierror(socket.EAI_NONAME, UNKNOWN)
        if self.state == "failing":
            raise socket.gaierror(socket.EAI_FAIL, "Non-recoverable failure in name resolution")
        return await loop.getaddrinfo(b"127.0.0.1", port, **kw)


async def _step(clock: FakeClock, site: LocalSite, step: float) -> None:
    """One step of the backoff: the wait armed for ``step`` s, then passed."""
    await until(lambda: clock.pending() == [clock.monotonic() + step])
    tries = site.listening()["tries"]
    await clock.advance(step)
    await until(lambda: site.waiting is None or site.listening()["tries"] == tries + 1)


async def test_a_site_waits_for_a_name_dns_does_not_answer_yet_then_serves_within_a_step(
) -> None:
    clock = FakeClock()
    health = Health("test")
    dns = Dns()
    site = LocalSite(NAME, 0, name="admin", health=health, counted_as="admin API",
                     wait_for_port=True, waits=clock, resolve=dns)
    app = web.Application()
    app.router.add_get("/hello", _hello)
    try:
        await site.start(app)  # not a ListenError: waiting
        state = site.listening()
        assert (state["state"], state["waiting_for"], state["host"]) == ("waiting", "name", NAME)
        assert (state["held_by"], state["error"]) == ("", "")
        assert state["detail"].startswith(f"name {NAME} does not resolve yet ({DOWN}): DNS not "
                                          "up yet at boot"), state
        assert state["detail"].endswith("correct the host or write its address"), state
        assert state["next_try_in_s"] == PORT_WAIT_FIRST
        [problem] = health.snapshot().problems
        assert problem.startswith(f"admin API not listening on {NAME}:0: name {NAME} does not "
                                  f"resolve yet ({DOWN})"), problem
        assert problem.endswith("(tried 1 time(s), again every 5 s at most; served as soon as "
                                "it resolves)"), problem
        assert health.snapshot().status == "degraded"

        steps = [PORT_WAIT_FIRST * 2 ** n for n in range(4)] + [PORT_WAIT_MAX] * 2
        for step in steps:  # 0.5, 1, 2, 4, 5, 5: bounded, none real
            await _step(clock, site, step)
        assert site.listening()["tries"] == 7
        assert len(dns.asked) == 7
        assert "tried 7 time(s)" in health.snapshot().problems[0]

        dns.state = "up"  # DNS answers: served at the next try, one step on
        await _step(clock, site, PORT_WAIT_MAX)
        assert site.waiting is None
        assert site.port
        assert site.listening() == {"state": "listening", "port": site.port}
        assert await _says_hello(site.port)
        assert health.snapshot().problems == []
        assert clock.pending() == []  # no wait left behind
    finally:
        await site.stop()


async def test_no_such_name_waits_too_in_its_own_words_and_a_name_then_known_is_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """EAI_NONAME at runtime waits, not refuses: at boot a resolver may answer "no such name"
    before the one that knows it is up (a public DNS before DHCP gives the LAN's, mDNS before
    avahi); a refusal would stop an admin API's agent, every sale with it. Each change of the
    answer is said once in the log, not at every try."""
    clock = FakeClock()
    health = Health("test")
    dns = Dns()
    dns.state = "unknown"
    site = LocalSite(NAME, 0, name="webhooks", health=health, counted_as="webhook receiver",
                     wait_for_port=True, waits=clock, resolve=dns)
    try:
        with caplog.at_level("WARNING", logger="kiosk_agent.web.server"):
            await site.start(web.Application())
            assert site.listening()["detail"].startswith(
                f"name {NAME} does not resolve yet ({UNKNOWN})")
            await _step(clock, site, PORT_WAIT_FIRST)
            await _step(clock, site, PORT_WAIT_FIRST * 2)
            dns.state = "down"  # the answer changes: said once
            await _step(clock, site, PORT_WAIT_FIRST * 4)
            await _step(clock, site, PORT_WAIT_FIRST * 8)
            [problem] = health.snapshot().problems
            assert f"name {NAME} does not resolve yet ({DOWN})" in problem, problem
            dns.state = "up"
            await _step(clock, site, PORT_WAIT_MAX)
        assert site.waiting is None
        assert site.port
        said = [r.getMessage() for r in caplog.records]
        assert sum(UNKNOWN in line for line in said) == 1, said
        assert sum(DOWN in line for line in said) == 1, said
        assert said[-1].startswith(f"webhooks: listening on {NAME}:{site.port} at last, after "
                                   "12.5 s (6 tries)"), said
        assert health.snapshot().problems == []
    finally:
        await site.stop()


async def test_a_resolver_failure_that_is_not_temporary_is_still_refused_in_words() -> None:
    """Only "not yet" is waited for: getaddrinfo's other failures (EAI_FAIL here) are refused
    at start as before, naming the server, the host and what to change."""
    site = LocalSite(NAME, 0, name="admin", wait_for_port=True, waits=FakeClock(),
                     resolve=Dns())
    site._resolve.state = "failing"  # type: ignore[attr-defined]
    with pytest.raises(ListenError) as refused:
        await site.start(web.Application())
    assert str(refused.value).startswith(
        f"[Errno {socket.EAI_FAIL}] admin: cannot listen on {NAME}:0: non-recoverable failure")
    assert site.waiting is None


async def test_a_stop_ends_the_wait_for_a_name() -> None:
    clock = FakeClock()
    health = Health("test")
    site = LocalSite(NAME, 0, name="admin", health=health, counted_as="admin API",
                     wait_for_port=True, waits=clock, resolve=Dns())
    await site.start(web.Application())
    await _step(clock, site, PORT_WAIT_FIRST)
    await site.stop()
    assert clock.pending() == []
    assert site.listening() == {"state": "stopped", "port": None}
    assert health.snapshot().problems == []


@pytest.mark.slow(seconds=5)
async def test_the_agent_s_servers_wait_for_their_name_while_the_agent_sells(
    tmp_path: Path, sim_settings: Any
) -> None:
    """Before: an admin API or a webhook receiver on a name DNS did not answer yet stopped the
    whole agent (ListenError, exit 1; systemd restarted it and gave up after its start limit),
    no sale at all, and a kiosk API there was `cannot start` until a restart. Now the agent
    starts and sells on its other trigger while the three wait, said in health and the kiosk
    API's status; once the name resolves all serve within one step, and the kiosk API sells."""
    from kiosk_agent.admin.server import AdminServer
    from kiosk_agent.admin.webhooks import WebhookReceiver

    clock = FakeClock(wall=time.time())
    dns = Dns()
    triggers, admin = _three_on(NAME, tmp_path)
    async with (
        running_agent(tmp_path, sim_settings, triggers, clock=clock, sections=admin,
                      secrets=THREE_SECRETS, listen_resolve=dns) as agent,
        aiohttp.ClientSession() as session,
    ):
        screen, till = agent.platforms
        assert isinstance(screen, KioskApi)
        assert isinstance(till, KioskApi)
        [server] = [c for c in agent.components if isinstance(c, AdminServer)]
        [hooks] = [c for c in agent.components if isinstance(c, WebhookReceiver)]
        assert agent.not_started == {}  # it runs: waiting is not "cannot start"
        listening = screen.status()["listening"]
        assert (listening["state"], listening["waiting_for"]) == ("waiting", "name")
        problems = agent.health.snapshot().problems
        for part in ("kiosk_api:screen", "admin API", "webhook receiver"):
            assert any(p.startswith(f"{part} not listening on {NAME}:0: name {NAME} does not "
                                    f"resolve yet ({DOWN})") for p in problems), problems

        await _sells(App(till, session))  # the rest of the agent sells meanwhile

        dns.state = "up"
        sites = (screen._site, server._site, hooks._site)
        step = max(site.listening()["next_try_in_s"] for site in sites)
        assert 0 < step <= PORT_WAIT_FIRST
        await clock.advance(step)  # one step of the backoff
        await until(lambda: all(site.listening()["state"] == "listening" for site in sites))
        await _sells(App(screen, session))  # its Host, 127.0.0.1, is one of allowed_hosts
        async with session.get(f"http://127.0.0.1:{server.port}/metrics") as answer:
            assert answer.status == 200
            assert "kiosk_agent" in await answer.text()
        async with session.post(f"http://127.0.0.1:{hooks.port}{hooks.path}",
                                data=b"{}") as answer:
            assert answer.status == 401  # heard: an unsigned delivery refused
        assert not any(NAME in p for p in agent.health.snapshot().problems)
