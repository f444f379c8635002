"""The real agent (admin API, webhook receiver, kiosk API) on the simulator, in a thread of its
own, so that synchronous property tests (hypothesis) can talk to it over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kiosk_agent.app import load_agent
from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.cli.virtual import simulated_machines
from kiosk_agent.sim.server import SimOptions, SimServer


class AgentThread:
    def __init__(self, config: Path) -> None:
        self.config = config
        self.ports: dict[str, int] = {}
        self.agent: Any = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="agent", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:
            self._error = err
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        sim = SimServer(SimOptions(port=0, time_scale=50, transactions=50, rate_limit="1000/1"))
        await sim.start()
        try:
            agent = load_agent(self.config, settings_from_ready(sim.ready_info()), systemd=False,
                               machines=simulated_machines)
            await agent.start()
            try:
                self.agent = agent
                for part in [*agent.components, *agent.platforms]:
                    port = getattr(part, "port", None)
                    if port:
                        self.ports[type(part).__name__] = int(port)
                self._ready.set()
                await self._stop.wait()
            finally:
                await agent.stop()
        finally:
            await sim.stop()

    def request(
        self, server: str, method: str, path: str, body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """One request over a fresh connection: (status, decoded JSON or the raw text)."""
        status, answer, _ = self.exchange(server, method, path, body, headers)
        return status, answer

    def exchange(
        self, server: str, method: str, path: str, body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any, http.client.HTTPMessage]:
        """:meth:`request`, and the answer's headers."""
        connection = http.client.HTTPConnection("127.0.0.1", self.ports[server], timeout=30)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            raw = response.read()
        finally:
            connection.close()
        try:
            return response.status, json.loads(raw), response.headers
        except ValueError:
            return response.status, raw.decode("utf-8", "replace"), response.headers


@contextlib.contextmanager
def agent_thread(config: Path) -> Iterator[AgentThread]:
    rig = AgentThread(config)
    rig._thread.start()
    rig._ready.wait(60)
    if rig._error is not None:
        raise rig._error
    try:
        yield rig
    finally:
        if rig._loop is not None and rig._stop is not None:
            rig._loop.call_soon_threadsafe(rig._stop.set)
        rig._thread.join(60)
