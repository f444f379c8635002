"""The ``upstream:`` component: a heartbeat every ``interval`` to each configured sink.

The first heartbeat waits until the agent has settled (serial links connected, the first checks
made) or ``start_grace`` has passed, so a start is not reported as a problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from typing import Any

from kiosk_agent.core.health import Health
from kiosk_agent.fleet.entities import DiscoveryOptions
from kiosk_agent.fleet.http import HttpSink
from kiosk_agent.fleet.loopback import is_loopback_host
from kiosk_agent.fleet.mqtt import MqttSink
from kiosk_agent.fleet.report import build_report
from kiosk_agent.fleet.schema import UPSTREAM_SCHEMA
from kiosk_agent.fleet.sink import Sink
from kiosk_agent.tasks import BackgroundTask, cancel_and_wait

_LOGGER = logging.getLogger(__name__)


def configuration_url(agent: Any, conf: dict[str, Any]) -> str | None:
    """The status page's address for HA: configured, else the admin API's when reachable."""
    if conf.get("configuration_url"):
        return str(conf["configuration_url"])
    config = getattr(agent, "config", None)
    admin = config.get("admin") if config is not None else None
    if not admin:
        return None
    host = str(admin.get("host", "127.0.0.1"))
    if is_loopback_host(host):
        return None  # loopback only: nobody else can open it
    if host in ("0.0.0.0", "::"):  # noqa: S104 - reading the configuration, not binding
        host = socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{admin.get('port', 8124)}/"


class Upstream:
    """The `upstream:` component: a heartbeat every `interval` to each configured sink."""

    def __init__(self, agent: Any, conf: dict[str, Any]) -> None:
        conf = UPSTREAM_SCHEMA(conf)
        self._health: Health = agent.health
        self.device_id: str = conf.get("device_id") or host_device_id()
        self._interval: float = conf["interval"]
        self._start_grace: float = conf["start_grace"]
        self.sinks: list[Sink] = []
        if "http" in conf:
            self.sinks.append(HttpSink(conf["http"], conf["queue_size"]))
        if "mqtt" in conf:
            settings = getattr(agent, "settings", None)
            discovery = DiscoveryOptions(
                # three heartbeats missed: the unit is frozen even if its connection is open
                expire_after=max(1, round(3 * self._interval)),
                configuration_url=configuration_url(agent, conf),
                currency=str(getattr(settings, "currency", "USD")),
            )
            self.sinks.append(
                MqttSink(
                    conf["mqtt"], conf["queue_size"], self.device_id, self._health.version,
                    discovery,
                )
            )
        self._loop = BackgroundTask(self._run, "upstream-heartbeat")
        self.heartbeats = 0
        self.first_report_waited_s: float | None = None
        # a terminal going out of (or back into) service is reported at once, not next interval
        self._availability: Any = getattr(agent, "availability", None)
        self._changed = asyncio.Event()

    async def start(self) -> None:
        for sink in self.sinks:
            await sink.start()
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        for sink in self.sinks:
            await sink.stop()

    async def _run(self) -> None:
        changes = getattr(self._availability, "changes", None)
        async with contextlib.AsyncExitStack() as stack:
            if changes is not None:
                queue = await stack.enter_async_context(changes.subscribe())
                follower = asyncio.ensure_future(self._follow(queue))
                stack.push_async_callback(cancel_and_wait, follower)
            await self._settle()
            while True:
                self._changed.clear()
                self.heartbeat()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self._interval)

    async def _follow(self, queue: asyncio.Queue[Any]) -> None:
        while True:
            await queue.get()
            self._changed.set()

    async def _settle(self) -> None:
        """Before the first report: wait for the links and first checks, or the start grace."""
        started = time.monotonic()
        deadline = started + max(0.0, self._start_grace - self._health.uptime)
        while True:
            pending = self._health.settling()
            if not pending:
                break
            if time.monotonic() >= deadline:
                _LOGGER.info("upstream: first report after the start grace; still settling: %s",
                             ", ".join(pending))
                break
            await asyncio.sleep(0.05)
        self.first_report_waited_s = round(time.monotonic() - started, 3)

    def heartbeat(self) -> dict[str, Any]:
        """Queue one report on every sink and wake them; returns the report."""
        report = build_report(self.device_id, self._health.snapshot())
        for sink in self.sinks:
            sink.queue.put(report)
            sink.wake()
        self.heartbeats += 1
        return report

    def stats(self) -> dict[str, dict[str, float]]:
        """Per-sink counters for metrics and the admin API."""
        return {
            sink.name: {
                "sent": sink.sent,
                "queued": len(sink.queue),
                "dropped": sink.queue.dropped,
                "failures": sink.failures,
                "last_sent_at": sink.last_sent_at or 0.0,
            }
            for sink in self.sinks
        }


def host_device_id() -> str:
    """The default ``upstream.device_id``: the host name, in the characters topics allow."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname())
