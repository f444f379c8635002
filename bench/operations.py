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
   default: ``/api/status`` p50/p99 and kiosk API sales completed of those tried, for
   ``--flood-seconds``; and the connections and descriptors the agent holds.
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
import shutil
import socket
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web

from kiosk_agent.admin.webhooks import WebhookReceiver
from kiosk_agent.core.health import Health
from kiosk_agent.core.web import LocalSite
from kiosk_agent.fleet.component import Upstream
from kiosk_agent.fleet.report import build_report
from kiosk_agent.service.webhooks import sign

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


async def bench_flood(connections: int, seconds: float, directory: Path) -> dict[str, float]:
    import os
    import resource
    import sys

    from kiosk_agent.app import load_agent
    from kiosk_agent.cli.sim import settings_from_ready
    from kiosk_agent.core.web import live_sites
    from kiosk_agent.sim.server import SimOptions, SimServer

    (directory / "secrets.yaml").write_text(
        f"admin_token: {ADMIN_TOKEN}\nkiosk_token: {KIOSK_TOKEN}\n"
    )
    (directory / "secrets.yaml").chmod(0o600)
    (directory / "flood.yaml").write_text(FLOOD_CONFIG)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    sim = SimServer(SimOptions(port=0, time_scale=50, transactions=50, rate_limit="1000/1"))
    await sim.start()
    agent = load_agent(directory / "flood.yaml", settings_from_ready(sim.ready_info()),
                       systemd=False)
    await agent.start()
    [kiosk] = agent.platforms
    admin = next(c for c in agent.components if type(c).__name__ == "AdminServer")
    flood = await asyncio.create_subprocess_exec(
        sys.executable, str(SLOWLORIS), "127.0.0.1", str(kiosk.port), str(connections),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    assert flood.stdout is not None and flood.stdin is not None  # noqa: PT018
    try:
        await asyncio.wait_for(flood.stdout.readline(), 60)
        evicted_before, flood_started = kiosk._site.evicted, time.monotonic()
        status_s: list[float] = []
        failures: dict[str, int] = {}  # what went wrong, counted: the bench never dies on one
        tried = completed = status_failed = 0
        admin_auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        kiosk_auth = {"Authorization": f"Bearer {KIOSK_TOKEN}"}
        base = f"http://127.0.0.1:{kiosk.port}/api/v1"
        # the touchscreen app and the admin: each one keep-alive connection, as they run
        app_http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
        admin_http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
        try:

            async def statuses() -> None:
                nonlocal status_failed
                while True:
                    started = time.perf_counter()
                    try:
                        async with admin_http.get(
                            f"{admin.url}/api/status", headers=admin_auth
                        ) as r:
                            await r.read()
                            ok = r.status == 200
                    except (aiohttp.ClientError, TimeoutError) as err:
                        ok = False
                        _count(failures, f"status: {type(err).__name__}: {err}")
                    status_s.append(time.perf_counter() - started)
                    status_failed += not ok
                    await asyncio.sleep(0.05)

            async def sale() -> str:
                """One kiosk API sale to its end: its final state, or what went wrong."""
                async with app_http.post(f"{base}/sales", json={"product": "coffee"},
                                         headers=kiosk_auth) as r:
                    if r.status != 202:
                        return f"POST /sales answered {r.status}"
                    sale_id = (await r.json())["sale_id"]
                for _ in range(200):
                    async with app_http.get(f"{base}/sales/{sale_id}", headers=kiosk_auth) as r:
                        step = await r.json()
                    if step.get("final"):
                        return str(step["state"])
                    await asyncio.sleep(0.02)
                return "no final state within 200 polls"

            poller = asyncio.create_task(statuses())
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                tried += 1
                try:
                    outcome = await sale()
                except (aiohttp.ClientError, TimeoutError) as err:
                    outcome = f"{type(err).__name__}: {err}"
                if outcome == "completed":
                    completed += 1
                else:
                    _count(failures, f"sale: {outcome}")
            held = max(site.open_connections for site in live_sites())
            churn = (kiosk._site.evicted - evicted_before) / (time.monotonic() - flood_started)
            descriptors = len(os.listdir("/proc/self/fd"))
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
        finally:
            await app_http.close()
            await admin_http.close()
    finally:
        flood.stdin.close()
        await flood.wait()
        await agent.stop()
        await sim.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    p50, p99 = _p(status_s, 0.5), _p(status_s, 0.99)  # in ms
    print(f"flood: {connections} slow-header connections on the kiosk API for {seconds:g} s, "
          f"the agent at 1,024 descriptors")
    print(f"  /api/status p50 {p50:.1f} ms, p99 {p99:.1f} ms ({len(status_s)} requests)")
    print(f"  sales completed {completed} of {tried}; status calls failed {status_failed}; "
          f"the agent held {held} connections, {descriptors} descriptors; "
          f"{churn:,.0f} flood connections evicted a second")
    for what, count in sorted(failures.items()):
        print(f"  failed x{count}: {what}")
    return {
        "flood_connections": connections,
        "flood_status_p50_ms": round(p50, 2),
        "flood_status_p99_ms": round(p99, 2),
        "flood_status_requests": len(status_s),
        "flood_sales_tried": tried,
        "flood_sales_completed": completed,
        "flood_sales_failed": tried - completed,
        "flood_status_failed": status_failed,
        "flood_agent_connections_held": held,
        "flood_evictions_per_s": round(churn),
        "flood_agent_descriptors": descriptors,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--heartbeats", type=int, default=300)
    parser.add_argument("--flood", type=int, default=1100, help="slow-header connections")
    parser.add_argument("--flood-seconds", type=float, default=10.0)
    parser.add_argument("--only", choices=["webhooks", "flood", "heartbeats"],
                        help="run one part alone")
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    if args.only in (None, "webhooks"):
        with tempfile.TemporaryDirectory() as tmp:
            figures |= await bench_webhooks(args.events, args.concurrency, Path(tmp))
    if args.only in (None, "flood"):
        with tempfile.TemporaryDirectory() as tmp:
            figures |= await bench_flood(args.flood, args.flood_seconds, Path(tmp))
    if args.only in (None, "heartbeats"):
        figures |= await bench_heartbeats(args.heartbeats)
    print(json.dumps(figures))


if __name__ == "__main__":
    asyncio.run(main())
