"""Service client benchmark: streaming, per-call overhead, and interaction wait latency.

    python bench/clients.py [--transactions 100000] [--calls 2000] [--ws 150] [--polls 60]

1. Transactions per second streamed from the simulator (in its own process, over real HTTP)
   through ``svc.reporting.transactions()`` into models, with this process's resident memory
   sampled every 10,000 records (flat means streaming, not buffering) and its peak; and the
   gain of asking for the next page before this one's records are built, against asking page
   after page, on loopback and with 20 ms of network latency added.
2. The cost of one client call against a bare aiohttp request on the same loop and the same
   endpoint (``GET`` of a vault payment account): ``call_overhead_ratio`` is
   client time / bare time, a machine-independent figure (target <= 1.3).
3. Completion-to-``wait()`` latency of terminal interactions, with the simulator in this
   process so the moment an interaction completes is known exactly: over the WebSocket
   (including the status endpoint's confirming GET) and by polling only (default interval).

The last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import aiohttp

from kiosk_agent.cli.sim import parse_ready, settings_from_ready
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import VaultAccountRequest
from kiosk_agent.service.models.reporting import Page, Transaction
from kiosk_agent.service.transport import Auth, MidPlacement

NO_LIMIT = "1000000/1"  # the benchmark measures the client, not the service's rate limit


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def start_sim_process(transactions: int) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    command = [
        sys.executable, "-m", "kiosk_agent", "sim", "--port", "0", "--seed", "1",
        "--transactions", str(transactions), "--rate-limit", NO_LIMIT,
    ]  # fmt: skip
    sim = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert sim.stdout is not None
    for line in sim.stdout:
        if (info := parse_ready(line)) is not None:
            return sim, info
    sim.kill()
    raise RuntimeError("the simulator exited before it was ready")


async def stream(info: dict[str, Any], wanted: int) -> dict[str, float]:
    samples: list[tuple[int, float]] = []
    async with ServiceClient(settings_from_ready(info)) as svc:
        count = 0
        started = time.perf_counter()
        cpu_started = time.process_time()
        while count < wanted:  # a data set smaller than asked is streamed again
            before = count
            records = svc.reporting.transactions(page_size=1000)
            async with contextlib.aclosing(records):
                async for _transaction in records:
                    count += 1
                    if count % 10_000 == 0:
                        samples.append((count, rss_mb()))
                    if count >= wanted:
                        break
            if count == before:
                raise RuntimeError("the simulator has no transactions")
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        bare_cpu_per_s = await bare_pages_cpu_rate(svc, pages=20)
    per_s = count / elapsed
    cpu_per_s = count / cpu
    first, last = samples[0][1], samples[-1][1]
    print(f"streamed {count} transactions in {elapsed:.2f} s: {per_s:,.0f}/s end to end")
    # The simulator (another process) serves pages one at a time; this says what the client
    # alone could take: records per second of this process's own CPU time.
    print(f"  client CPU: {cpu:.2f} s, {cpu_per_s:,.0f} transactions per CPU second; "
          f"bare aiohttp + json.loads of the same pages: {bare_cpu_per_s:,.0f}")  # fmt: skip
    print("  RSS by count: " + ", ".join(f"{n // 1000}k={mb:.1f} MB" for n, mb in samples))
    return {
        "stream_transactions": count,
        "stream_transactions_per_s": round(per_s),
        "stream_client_cpu_transactions_per_s": round(cpu_per_s),
        "stream_bare_json_cpu_transactions_per_s": round(bare_cpu_per_s),
        "stream_cpu_ratio_vs_bare_json": round(bare_cpu_per_s / cpu_per_s, 2),
        "stream_rss_growth_mb": round(last - first, 1),
        "stream_rss_end_mb": round(last, 1),
    }


async def bare_pages_cpu_rate(svc: ServiceClient, pages: int) -> float:
    """Baseline in the same process: the same pages fetched and json.loads-ed, no models."""
    url = svc.transport.reporting_url("/ords/sprint/api/3p/v1/transactions")
    headers = {"Authorization": f"Bearer {await svc.transport.oauth.token()}"}
    count = 0
    cpu_started = time.process_time()
    for page in range(pages):
        params = {"limit": 1000, "offset": page * 1000}
        async with svc.transport.session.get(url, params=params, headers=headers) as resp:
            count += len(json.loads(await resp.read())["items"])
    return count / (time.process_time() - cpu_started)


async def lookahead(info: dict[str, Any], pages: int) -> dict[str, float]:
    """The gain of asking for the next page before this one's records are built, against the
    same pages into the same models asked for one after another (the iterator before its
    lookahead), in the same process: on loopback, and with 20 ms of network latency added to
    each request as a remote service would have."""
    figures: dict[str, float] = {}
    for latency_ms in (0, 20):
        trace = aiohttp.TraceConfig()

        async def delay(*_: Any, latency: float = latency_ms / 1000) -> None:
            # The round trip, counted from the request really written, without using CPU.
            await asyncio.sleep(latency)

        trace.on_request_headers_sent.append(delay)
        async with (
            aiohttp.ClientSession(trace_configs=[trace]) as session,
            ServiceClient(settings_from_ready(info), session=session) as svc,
        ):
            sequential_s, lookahead_s = await _page_timings(svc, pages)
        speedup = sequential_s / lookahead_s
        print(f"{pages} pages of 1000, {latency_ms} ms added latency: {lookahead_s:.2f} s with "
              f"the next page asked for early, {sequential_s:.2f} s page after page: "
              f"x{speedup:.2f}")  # fmt: skip
        figures[f"lookahead_speedup_ratio_{latency_ms}ms_latency"] = round(speedup, 2)
    return figures


async def _page_timings(svc: ServiceClient, pages: int) -> tuple[float, float]:
    """Seconds for ``pages`` pages page after page, and with the lookahead; best of three."""
    url = svc.transport.reporting_url("/ords/sprint/api/3p/v1/transactions")

    async def sequential() -> None:
        for page in range(pages):
            params: dict[str, str | int] = {"limit": 1000, "offset": page * 1000}
            got = await svc.transport.request_model(Page[Transaction], "GET", url, params=params,
                                                    auth=Auth.OAUTH, mid=MidPlacement.NONE)
            for _transaction in got.items:
                pass

    async def ahead() -> None:
        async for _transaction in svc.reporting.transactions(page_size=1000, limit=pages * 1000):
            pass

    times: dict[str, list[float]] = {"sequential": [], "ahead": []}
    for _ in range(3):  # interleaved, so drift hits both alike
        for name, run in (("sequential", sequential), ("ahead", ahead)):
            started = time.perf_counter()
            await run()
            times[name].append(time.perf_counter() - started)
    return min(times["sequential"]), min(times["ahead"])


async def overhead(info: dict[str, Any], calls: int) -> dict[str, float]:
    async with ServiceClient(settings_from_ready(info)) as svc:
        request = VaultAccountRequest(
            account_token="9412345678901111", name="Bench", account_zip="10001",  # noqa: S106
            address1="1 Main St", city="New York", region="NY", country="US",
            email="bench@example.com", phone="5555550100",
        )  # fmt: skip
        account = await svc.vault.create(request)
        url = f"{info['base_url']}/api/v1/vault_payment_accounts/{account.uuid}"
        headers = {"Authorization": f"Bearer {info['api_key']}"}
        session = svc.transport.session

        async def bare() -> None:
            async with session.get(url, headers=headers) as resp:
                await resp.json()

        async def client() -> None:
            await svc.vault.get(account.uuid)

        for _ in range(100):  # warm both paths
            await bare()
            await client()
        bare_times: list[float] = []
        client_times: list[float] = []
        for _ in range(calls):  # interleaved, so drift hits both alike
            t0 = time.perf_counter()
            await bare()
            t1 = time.perf_counter()
            await client()
            t2 = time.perf_counter()
            bare_times.append(t1 - t0)
            client_times.append(t2 - t1)
    bare_ms = statistics.median(bare_times) * 1000
    client_ms = statistics.median(client_times) * 1000
    ratio = client_ms / bare_ms
    print(f"one call: client {client_ms:.3f} ms, bare aiohttp {bare_ms:.3f} ms, ratio {ratio:.2f}")
    return {
        "call_client_ms": round(client_ms, 3),
        "call_bare_aiohttp_ms": round(bare_ms, 3),
        "call_overhead_ratio": round(ratio, 3),
    }


async def wait_latency(count: int, *, websocket: bool) -> list[float]:
    # imported here so the peak memory measured before this is the client's alone
    from kiosk_agent.sim.server import SimOptions, SimServer

    options = SimOptions(port=0, time_scale=50, seed=1, transactions=10, rate_limit=NO_LIMIT)
    sim = SimServer(options)
    await sim.start()
    assert sim.ctx is not None
    terminals = sim.ctx.terminals
    settings = settings_from_ready(sim.ready_info(), websocket=websocket, rate_limit=1e6)
    latencies: list[float] = []
    try:
        async with ServiceClient(settings) as svc:
            for n in range(count):
                device = f"SIM-000{n % 8 + 1}"
                handle = await svc.terminal.charge_card(device, 1000 + n % 50 * 10)
                completed: list[float] = []

                def on_change(record: dict[str, Any], changed_at: float) -> None:
                    if record["status"] != "pending":
                        completed.append(changed_at)  # noqa: B023 (one interaction per loop)

                unsubscribe = terminals.subscribe(handle.interaction_id, on_change)
                try:
                    await handle.wait(timeout=30)
                    done = time.monotonic()
                finally:
                    unsubscribe()
                if completed:  # finished before we listened: no exact moment, skip it
                    latencies.append((done - completed[0]) * 1000)
    finally:
        await sim.stop()
    return latencies


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


async def latencies(ws_count: int, poll_count: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    for name, count, websocket in (("ws", ws_count, True), ("poll", poll_count, False)):
        values = await wait_latency(count, websocket=websocket)
        p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
        how = "WebSocket" if websocket else "polling only (interval 0.25 s)"
        print(f"completion to wait(), {how}: p50 {p50:.2f} ms, p99 {p99:.2f} ms "
              f"over {len(values)} interactions")  # fmt: skip
        figures[f"wait_{name}_p50_ms"] = round(p50, 2)
        figures[f"wait_{name}_p99_ms"] = round(p99, 2)
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--transactions", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--ws", type=int, default=150, help="interactions waited on by WebSocket")
    parser.add_argument("--polls", type=int, default=60, help="interactions waited on by polling")
    args = parser.parse_args()

    sim, info = start_sim_process(args.transactions)
    try:
        figures = await stream(info, args.transactions)
        figures.update(await lookahead(info, pages=20))
        figures.update(await overhead(info, args.calls))
    finally:
        sim.terminate()
        sim.wait(timeout=10)
    figures["client_peak_rss_mb"] = round(peak_rss_mb(), 1)
    print(f"peak RSS of this process (client only so far): {figures['client_peak_rss_mb']} MB")
    figures.update(await latencies(args.ws, args.polls))
    print(json.dumps(figures))


if __name__ == "__main__":
    asyncio.run(main())
