"""Fleet operations benchmark: webhook intake and heartbeat cost.

    python bench/operations.py [--events 4000] [--concurrency 32] [--heartbeats 300]

1. Boarding webhooks accepted per second through the real receiver (the sender runs in a process
   of its own, as the service would): HMAC verification, parsing,
   a durable SQLite commit (WAL, synchronous=FULL) of each event under its idempotency key, and
   the merchant reducer; 10% of deliveries are duplicates. p50/p99 latency per delivery.
   Baseline, same process: a bare aiohttp handler that answers 200 at once, so
   ``webhook_vs_bare_http_ratio`` says what verification and durability cost on any machine.
2. Under a slow-connection flood: the real agent (admin API + kiosk API, on the simulator) under
   ``--flood`` slow-header connections on its kiosk API port, sent by a process of its own
   (``tests/admin/slowloris.py``), the agent limited to 1,024 descriptors as systemd gives by
   default. The honest clients, each on its keep-alive connection: the touchscreen app selling
   and the admin polling ``/api/status``; and a newcomer asking the kiosk API's status on a
   fresh connection every quarter second. First for ``--quiet-seconds`` without the flood (the
   baseline of this machine in this run), then for ``--flood-seconds`` under it: status p50/p99,
   sales completed of those tried and every failure counted, the newcomer's wait, and the CPU of
   the agent's process (agent, simulator and clients: compare with the quiet phase), of the
   flooder, and of the whole machine (from /proc), so a loaded machine shows; and the
   connections, descriptors and churn of the agent.
3. Heartbeat cost: CPU milliseconds of this process per heartbeat, building the report from a
   realistic health model, and sending it over HTTP (to a local receiver) and over MQTT (to a
   Mosquitto broker in its own process, when installed).

The last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import shutil
import socket
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web

from kiosk_agent.admin.webhooks import WebhookReceiver
from kiosk_agent.fleet.component import Upstream
from kiosk_agent.fleet.report import build_report
from kiosk_agent.health.model import Health
from kiosk_agent.service.webhooks import sign
from kiosk_agent.web.server import LocalSite

SECRET = "bench-webhook-secret"  # noqa: S105 - a throwaway signing key for the bench


def _envelope(n: int) -> bytes:
    body = {
        "event_type": "merchant.sent_for_signature",
        "source_id": str(n),
        "timestamp": "2026-11-22T10:00:00.000Z",
        "payload": {
            "merchant_id": n % 500,
            "mid": None,
            "rep_code_id": 1,
            "customer_id": 2,
            "dba_name": f"Merchant {n}",
            "merchant_status_id": 2,
            "trigger": "api",
            "reason": "sent_for_signature",
            "timestamp": f"2026-11-22T10:{n // 60 % 60:02d}:{n % 60:02d}.000+00:00",
        },
        "metadata": {"webhook_id": f"wh-{n}", "attempt": 1, "idempotency_key": f"idem-{n}"},
    }
    return json.dumps(body).encode()


async def _blast(
    url: str, bodies: list[bytes], concurrency: int
) -> tuple[float, list[float], dict[int, int]]:
    """POST every body with `concurrency` workers; (seconds, latencies, status counts)."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                headers = {"X-Webhook-Signature-256": sign(body, SECRET)}
                start = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    statuses[response.status] = statuses.get(response.status, 0) + 1
                latencies.append(time.perf_counter() - start)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return elapsed, latencies, statuses


def _blast_sync(
    url: str, bodies: list[bytes], concurrency: int
) -> tuple[float, list[float], dict[int, int]]:
    return asyncio.run(_blast(url, bodies, concurrency))


class LoadGenerator:
    """Sends from its own process: the receiver's event loop is measured, not the client's."""

    def __init__(self) -> None:
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))

    async def blast(
        self, url: str, bodies: list[bytes], concurrency: int
    ) -> tuple[float, list[float], dict[int, int]]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, _blast_sync, url, bodies, concurrency)

    def close(self) -> None:
        self._pool.shutdown()


def _count(failures: dict[str, int], what: str) -> None:
    failures[what] = failures.get(what, 0) + 1


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def bench_webhooks(events: int, concurrency: int, directory: Path) -> dict[str, float]:
    load = LoadGenerator()
    try:
        return await _bench_webhooks(load, events, concurrency, directory)
    finally:
        load.close()


async def _bench_webhooks(
    load: LoadGenerator, events: int, concurrency: int, directory: Path
) -> dict[str, float]:
    unique = [_envelope(n) for n in range(events)]
    bodies = unique + unique[: events // 10]  # 10% duplicates, delivered again later

    async def bare(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"status": "accepted"})

    app = web.Application()
    app.router.add_post("/hook", bare)
    site = LocalSite("127.0.0.1", 0)
    await site.start(app)
    await load.blast(f"{site.url}/hook", bodies[:200], concurrency)  # warm up
    bare_s, _, _ = await load.blast(f"{site.url}/hook", bodies, concurrency)
    await site.stop()

    receiver = WebhookReceiver(
        SimpleNamespace(), {"secret": SECRET, "port": 0, "store": str(directory / "hooks.db")}
    )
    await receiver.start()
    try:
        elapsed, latencies, statuses = await load.blast(receiver.url, bodies, concurrency)
        serial_s, serial_lat, _ = await load.blast(
            receiver.url, [_envelope(events + n) for n in range(200)], 1
        )
        stored = len(receiver.store)
        commits = receiver.store.commits
    finally:
        await receiver.stop()
    assert statuses == {200: len(bodies)}, statuses
    assert stored == events + 200, stored
    accepted_per_s = len(bodies) / elapsed
    bare_per_s = len(bodies) / bare_s
    print(f"webhooks: {len(bodies)} deliveries ({events} unique) at concurrency {concurrency}")
    print(
        f"  accepted {accepted_per_s:,.0f}/s   p50 {_p(latencies, 0.5):.2f} ms"
        f"   p99 {_p(latencies, 0.99):.2f} ms   ({commits} commits)"
    )
    print(f"  bare aiohttp baseline {bare_per_s:,.0f}/s -> ratio {accepted_per_s / bare_per_s:.2f}")
    print(
        f"  one at a time: {200 / serial_s:,.0f}/s, p99 {_p(serial_lat, 0.99):.2f} ms "
        "(each answer waits for its own fsync)"
    )
    return {
        "webhook_accepted_per_s": round(accepted_per_s, 1),
        "webhook_p50_ms": round(_p(latencies, 0.5), 3),
        "webhook_p99_ms": round(_p(latencies, 0.99), 3),
        "webhook_serial_accepted_per_s": round(200 / serial_s, 1),
        "bare_http_per_s": round(bare_per_s, 1),
        "webhook_vs_bare_http_ratio": round(accepted_per_s / bare_per_s, 3),
    }


def _fleet_health() -> Health:
    health = Health("1.0.0")
    for n in range(1, 9):
        health.report_terminal(
            f"SIM-{n:04d}", online=n != 3, connected=True, latency_ms=12.5, pinged=True
        )
    for name in ("mdb:front", "serial:door", "gpio:buttons"):
        health.report_link(name, "connected")
    health.report_service(True)
    health.report_key_expiry(time.time() + 3000)
    return health


async def _heartbeats(upstream: Upstream, count: int, sent: Any) -> float:
    """CPU ms of this process per heartbeat, from queueing to delivery."""
    await upstream.start()  # sends its first heartbeat at once: wait for it (connection made)
    try:
        deadline = time.monotonic() + 10
        while sent() < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("the first heartbeat was never delivered")
            await asyncio.sleep(0.01)
        start_count = sent()
        cpu = time.process_time()
        for _ in range(count):
            upstream.heartbeat()
            target = sent() + 1
            # spin on the loop: a timer here would add its own CPU to the figure
            while sent() < target:  # noqa: ASYNC110
                await asyncio.sleep(0)
        used = time.process_time() - cpu
        assert sent() - start_count >= count
    finally:
        await upstream.stop()
    return used / count * 1000


def _start_broker() -> tuple[subprocess.Popen[bytes], int] | None:
    """A throwaway Mosquitto on a free loopback port, or None when it is not installed."""
    broker = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(broker).exists():
        return None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    conf = Path(tempfile.mkdtemp()) / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n")
    proc = subprocess.Popen(
        [broker, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return proc, port


async def bench_heartbeats(count: int) -> dict[str, float]:
    agent = SimpleNamespace(health=_fleet_health())
    cpu = time.process_time()
    for _ in range(count * 10):
        json.dumps(build_report("unit-1", agent.health.snapshot()))
    build_ms = (time.process_time() - cpu) / (count * 10) * 1000
    print(f"heartbeat: build + encode {build_ms:.3f} ms CPU")
    figures = {"heartbeat_build_cpu_ms": round(build_ms, 4)}

    received = 0

    async def receive(request: web.Request) -> web.Response:
        nonlocal received
        await request.read()
        received += 1
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hb", receive)
    site = LocalSite("127.0.0.1", 0)
    await site.start(app)
    http = Upstream(agent, {"interval": 3600, "http": {"url": f"{site.url}/hb"}})
    http_ms = await _heartbeats(http, count, lambda: http.sinks[0].sent)
    await site.stop()
    print(f"heartbeat: over HTTP {http_ms:.3f} ms CPU (includes the local receiver's share)")
    figures["heartbeat_http_cpu_ms"] = round(http_ms, 4)

    broker = _start_broker()
    if broker is None:
        print("heartbeat: MQTT skipped (mosquitto not installed)")
        return figures
    proc, mqtt_port = broker
    try:
        await asyncio.sleep(0.3)
        mqtt = Upstream(agent, {"interval": 3600, "mqtt": {"host": "127.0.0.1", "port": mqtt_port}})
        mqtt_ms = await _heartbeats(mqtt, count, lambda: mqtt.sinks[0].sent)
    finally:
        proc.terminate()
        proc.wait(5)
    print(f"heartbeat: over MQTT {mqtt_ms:.3f} ms CPU (broker in its own process)")
    figures["heartbeat_mqtt_cpu_ms"] = round(mqtt_ms, 4)
    return figures


FLOOD_CONFIG = """
service:
  simulator: {time_scale: 50}
terminals: [{device_id: SIM-0001, name: front}]
journal: {path: journal.db}
health: {ping_interval: 3600}
http: {accept_rate_at_cap: %(accept_rate)s}
admin:
  port: 0
  tokens: [{name: ops, token: !secret admin_token}]
triggers:
  - platform: kiosk_api
    name: screen
    token: !secret kiosk_token
    port: 0
    products: {coffee: "2.50"}
"""
SLOWLORIS = Path(__file__).resolve().parents[1] / "tests" / "admin" / "slowloris.py"
ADMIN_TOKEN = "bench-admin-token-0123456789"  # noqa: S105 - throwaway tokens for the bench
KIOSK_TOKEN = "bench-kiosk-token-0123456789"  # noqa: S105


@dataclass
class Phase:
    """What the honest clients saw over one stretch, and what it cost."""

    seconds: float = 0.0
    status_s: list[float] = field(default_factory=list)
    status_failed: int = 0
    newcomer_s: list[float] = field(default_factory=list)  # a fresh connection's request
    newcomer_failed: int = 0
    tried: int = 0
    completed: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # what went wrong, counted
    agent_cpu_s: float = 0.0  # user + system of this process (agent, simulator, clients)
    flooder_cpu_s: float = 0.0
    machine_busy: float = 0.0  # of every core, from /proc/stat
    load: float = 0.0  # load average (1 min) at the end

    def pct(self, cpu_s: float) -> float:
        return cpu_s / self.seconds * 100


def _process_cpu(pid: int | None = None) -> float:
    """User + system seconds of this process, or of ``pid``, from /proc."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of every core, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


class HonestClients:
    """The touchscreen app selling and the admin polling status, each on one keep-alive
    connection as they run, and a newcomer asking the kiosk API's status on a fresh connection
    every quarter second. Every failure is counted: the bench never dies on one."""

    def __init__(self, kiosk_port: int, admin_url: str, flooder: int | None = None) -> None:
        self.base = f"http://127.0.0.1:{kiosk_port}/api/v1"
        self.admin_url = admin_url
        self.flooder = flooder
        self.admin_auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        self.kiosk_auth = {"Authorization": f"Bearer {KIOSK_TOKEN}"}

    async def run(self, seconds: float) -> Phase:
        phase = Phase()
        sessions = [
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)),  # the app
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)),  # the admin
            aiohttp.ClientSession(  # a newcomer each time
                connector=aiohttp.TCPConnector(force_close=True),
                timeout=aiohttp.ClientTimeout(total=10),
            ),
        ]
        app_http, admin_http, new_http = sessions
        cpu, flooder_cpu, ticks = _process_cpu(), self._flooder_cpu(), _machine_ticks()
        began = time.monotonic()
        pollers = [
            asyncio.create_task(self._statuses(admin_http, phase)),
            asyncio.create_task(self._newcomers(new_http, phase)),
        ]
        try:
            while time.monotonic() - began < seconds:
                phase.tried += 1
                try:
                    outcome = await self._sale(app_http)
                except (aiohttp.ClientError, TimeoutError) as err:
                    outcome = f"{type(err).__name__}: {err}"
                if outcome == "completed":
                    phase.completed += 1
                else:
                    _count(phase.failures, f"sale: {outcome}")
        finally:
            for poller in pollers:
                poller.cancel()
            await asyncio.gather(*pollers, return_exceptions=True)
            phase.seconds = time.monotonic() - began
            phase.agent_cpu_s = _process_cpu() - cpu
            phase.flooder_cpu_s = self._flooder_cpu() - flooder_cpu
            busy, total = (now - then for now, then in zip(_machine_ticks(), ticks, strict=True))
            phase.machine_busy = busy / max(total, 1)
            phase.load = os.getloadavg()[0]
            for session in sessions:
                await session.close()
        return phase

    def _flooder_cpu(self) -> float:
        return 0.0 if self.flooder is None else _process_cpu(self.flooder)

    async def _statuses(self, http: aiohttp.ClientSession, phase: Phase) -> None:
        while True:
            started = time.perf_counter()
            try:
                async with http.get(f"{self.admin_url}/api/status", headers=self.admin_auth) as r:
                    await r.read()
                    ok = r.status == 200
            except (aiohttp.ClientError, TimeoutError) as err:
                ok = False
                _count(phase.failures, f"status: {type(err).__name__}: {err}")
            phase.status_s.append(time.perf_counter() - started)
            phase.status_failed += not ok
            await asyncio.sleep(0.05)

    async def _newcomers(self, http: aiohttp.ClientSession, phase: Phase) -> None:
        while True:
            started = time.perf_counter()
            try:
                async with http.get(f"{self.base}/status", headers=self.kiosk_auth) as r:
                    await r.read()
                    ok = r.status == 200
                    if not ok:
                        _count(phase.failures, f"newcomer: answered {r.status}")
            except (aiohttp.ClientError, TimeoutError) as err:
                ok = False
                _count(phase.failures, f"newcomer: {type(err).__name__}: {err}")
            if ok:
                phase.newcomer_s.append(time.perf_counter() - started)
            phase.newcomer_failed += not ok
            await asyncio.sleep(0.25)

    async def _sale(self, http: aiohttp.ClientSession) -> str:
        """One kiosk API sale to its end: its final state, or what went wrong."""
        async with http.post(
            f"{self.base}/sales", json={"product": "coffee"}, headers=self.kiosk_auth
        ) as r:
            if r.status != 202:
                return f"POST /sales answered {r.status}"
            sale_id = (await r.json())["sale_id"]
        for _ in range(200):
            async with http.get(f"{self.base}/sales/{sale_id}", headers=self.kiosk_auth) as r:
                step = await r.json()
            if step.get("final"):
                return str(step["state"])
            await asyncio.sleep(0.02)
        return "no final state within 200 polls"


def _print_phase(name: str, phase: Phase) -> None:
    p50, p99 = _p(phase.status_s, 0.5), _p(phase.status_s, 0.99)
    print(f"  {name}: /api/status p50 {p50:.1f} ms, p99 {p99:.1f} ms ({len(phase.status_s)} "
          f"requests, {phase.status_failed} failed); sales completed {phase.completed} of "
          f"{phase.tried}")
    if phase.newcomer_s:
        print(f"    a newcomer's request on a fresh connection: p50 "
              f"{_p(phase.newcomer_s, 0.5):.1f} ms, max {max(phase.newcomer_s) * 1000:.0f} ms "
              f"({len(phase.newcomer_s)} answered, {phase.newcomer_failed} failed)")
    print(f"    CPU: agent process {phase.pct(phase.agent_cpu_s):.0f} % of a core, flooder "
          f"{phase.pct(phase.flooder_cpu_s):.0f} %; the machine {phase.machine_busy:.0%} busy "
          f"(every core), load average {phase.load:.1f}")
    for what, count in sorted(phase.failures.items()):
        print(f"    failed x{count}: {what}")


async def bench_flood(
    connections: int, seconds: float, quiet_seconds: float, accept_rate: float, directory: Path
) -> dict[str, float]:
    import sys

    from kiosk_agent.app import load_agent
    from kiosk_agent.cli.sim import settings_from_ready
    from kiosk_agent.sim.server import SimOptions, SimServer
    from kiosk_agent.web.server import live_sites

    (directory / "secrets.yaml").write_text(
        f"admin_token: {ADMIN_TOKEN}\nkiosk_token: {KIOSK_TOKEN}\n"
    )
    (directory / "secrets.yaml").chmod(0o600)
    (directory / "flood.yaml").write_text(FLOOD_CONFIG % {"accept_rate": accept_rate})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    sim = SimServer(SimOptions(port=0, time_scale=50, transactions=50, rate_limit="1000/1"))
    await sim.start()
    agent = load_agent(directory / "flood.yaml", settings_from_ready(sim.ready_info()),
                       systemd=False)
    await agent.start()
    [kiosk] = agent.platforms
    admin = next(c for c in agent.components if type(c).__name__ == "AdminServer")
    # the same honest load first without the flood: the baseline of this machine, this run
    quiet = await HonestClients(kiosk.port, admin.url).run(quiet_seconds)
    flood = await asyncio.create_subprocess_exec(
        sys.executable, str(SLOWLORIS), "127.0.0.1", str(kiosk.port), str(connections),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    assert flood.stdout is not None and flood.stdin is not None  # noqa: PT018
    try:
        await asyncio.wait_for(flood.stdout.readline(), 60)
        site = kiosk._site
        evicted, turned_away, flood_started = site.evicted, site.turned_away, time.monotonic()
        flooded = await HonestClients(kiosk.port, admin.url, flood.pid).run(seconds)
        held = max(site.open_connections for site in live_sites())
        took = time.monotonic() - flood_started
        churn = (site.evicted - evicted) / took
        turned = (site.turned_away - turned_away) / took
        descriptors = len(os.listdir("/proc/self/fd"))
    finally:
        flood.stdin.close()
        await flood.wait()
        await agent.stop()
        await sim.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print(f"flood: {connections} slow-header connections on the kiosk API for {seconds:g} s "
          f"(after {quiet_seconds:g} s without), the agent at 1,024 descriptors")
    _print_phase("without the flood", quiet)
    _print_phase("under the flood", flooded)
    print(f"  the agent held {held} connections, {descriptors} descriptors; "
          f"{churn:,.0f} flood connections evicted a second, {turned:,.0f} turned away at once")
    p99, quiet_p99 = _p(flooded.status_s, 0.99), _p(quiet.status_s, 0.99)
    return {
        "flood_connections": connections,
        "flood_status_p50_ms": round(_p(flooded.status_s, 0.5), 2),
        "flood_status_p99_ms": round(p99, 2),
        "flood_status_requests": len(flooded.status_s),
        "flood_quiet_status_p50_ms": round(_p(quiet.status_s, 0.5), 2),
        "flood_quiet_status_p99_ms": round(quiet_p99, 2),
        "flood_status_p99_vs_quiet_ratio": round(p99 / quiet_p99, 2),
        "flood_sales_tried": flooded.tried,
        "flood_sales_completed": flooded.completed,
        "flood_sales_failed": flooded.tried - flooded.completed,
        "flood_status_failed": flooded.status_failed,
        "flood_newcomer_p50_ms": round(_p(flooded.newcomer_s, 0.5), 1) if flooded.newcomer_s
        else None,
        "flood_newcomer_max_ms": round(max(flooded.newcomer_s, default=0) * 1000, 1),
        "flood_newcomer_failed": flooded.newcomer_failed,
        "flood_quiet_newcomer_p50_ms": round(_p(quiet.newcomer_s, 0.5), 1),
        "flood_agent_cpu_pct_of_core": round(flooded.pct(flooded.agent_cpu_s), 1),
        "flood_quiet_agent_cpu_pct_of_core": round(quiet.pct(quiet.agent_cpu_s), 1),
        "flood_flooder_cpu_pct_of_core": round(flooded.pct(flooded.flooder_cpu_s), 1),
        "flood_machine_busy_pct": round(flooded.machine_busy * 100, 1),
        "flood_load_average": round(flooded.load, 2),
        "flood_agent_connections_held": held,
        "flood_evictions_per_s": round(churn),
        "flood_turned_away_per_s": round(turned),
        "flood_agent_descriptors": descriptors,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--heartbeats", type=int, default=300)
    parser.add_argument("--flood", type=int, default=1100, help="slow-header connections")
    parser.add_argument("--flood-seconds", type=float, default=10.0)
    parser.add_argument("--accept-rate", type=float, default=300.0,
                        help="the agent's http.accept_rate_at_cap (default: the default)")
    parser.add_argument("--quiet-seconds", type=float, default=5.0,
                        help="the same honest load without the flood first (the baseline)")
    parser.add_argument("--only", choices=["webhooks", "flood", "heartbeats"],
                        help="run one part alone")
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    if args.only in (None, "webhooks"):
        with tempfile.TemporaryDirectory() as tmp:
            figures |= await bench_webhooks(args.events, args.concurrency, Path(tmp))
    if args.only in (None, "flood"):
        with tempfile.TemporaryDirectory() as tmp:
            figures |= await bench_flood(
                args.flood, args.flood_seconds, args.quiet_seconds, args.accept_rate, Path(tmp)
            )
    if args.only in (None, "heartbeats"):
        figures |= await bench_heartbeats(args.heartbeats)
    print(json.dumps(figures))


if __name__ == "__main__":
    asyncio.run(main())
