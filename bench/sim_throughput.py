"""Simulator throughput, push delay and memory.

    python bench/sim_throughput.py [--seconds 5] [--concurrency 32] [--transactions 100000]

Starts `kiosk-agent sim` as its own process (one client process drives it, as the targets
ask) and measures:
- requests/s for a simple authenticated GET (a vault account), against a bare aiohttp
  server answering the same JSON in a process of its own (the machine-independent ratio);
- requests/s for a mixed load: charges, captures/voids, reporting queries, terminal
  read-card starts and status polls;
- p50/p99 of the delay from an interaction completing to its WebSocket frame being written
  (measured inside the simulator, read from /sim/stats);
- the simulator's resident memory (now and peak) after serving the whole
  `--transactions` data set page by page through reporting, and the rate of that walk;
- the time from starting the simulator process to its READY line (it seeds the data set).
Targets on a 2-core machine: >= 2,000 simple GETs/s, push p99 < 10 ms, < 200 MB.
The last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from kiosk_agent.cli.sim import parse_ready

REPORTING = "/ords/sprint/api/3p/v1/transactions"
ACCOUNT = {
    "account_token": "9541111111114444", "name": "Bench", "account_zip": "10001",
    "address1": "1 Main St", "city": "New York", "region": "NY", "country": "US",
    "email": "bench@example.com", "phone": "5550100", "expiration": "1129",
}  # fmt: skip
BARE_SERVER = """
import sys
from aiohttp import web
async def handle(request):
    return web.json_response({"id": 1, "uuid": request.match_info["uuid"], "name": "Bench"})
app = web.Application()
app.router.add_get("/api/v1/vault_payment_accounts/{uuid}", handle)
async def main():
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    print(f"READY {{\\"base_url\\": \\"http://127.0.0.1:{port}\\"}}", flush=True)
    import asyncio
    await asyncio.Event().wait()
import asyncio
asyncio.run(main())
"""


async def start_process(*args: str) -> tuple[asyncio.subprocess.Process, dict[str, Any]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), 120)).decode()
    info = parse_ready(line)
    if info is None:
        process.kill()
        raise SystemExit(f"process did not start: {line!r}")
    return process, info


async def stop_process(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    await process.wait()


def memory_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) in MB, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


async def rate(
    seconds: float, concurrency: int, request: Callable[[int], Awaitable[int | None]]
) -> float:
    """Requests per second with ``concurrency`` workers calling ``request(n)`` in a loop.

    ``request`` returns how many HTTP requests it made (None: one).
    """
    done = 0
    deadline = time.monotonic() + seconds

    async def worker(index: int) -> None:
        nonlocal done
        while time.monotonic() < deadline:
            made = await request(index)
            done += 1 if made is None else made

    started = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return done / (time.monotonic() - started)


async def simple_gets(info: dict[str, Any], seconds: float, concurrency: int, uuid: str) -> float:
    headers = {"Authorization": f"Bearer {info.get('api_key', '')}"}
    url = f"{info['base_url']}/api/v1/vault_payment_accounts/{uuid}"
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as http:

        async def get(_: int) -> None:
            async with http.get(url) as resp:
                await resp.read()
                assert resp.status == 200, resp.status

        await rate(0.5, concurrency, get)  # warm up connections
        return await rate(seconds, concurrency, get)


async def oauth_token(http: aiohttp.ClientSession, info: dict[str, Any]) -> str:
    basic = base64.b64encode(f"{info['client_id']}:{info['client_secret']}".encode()).decode()
    async with http.post(
        f"{info['reporting_url']}/ords/sprint/oauth/token",
        data={"grant_type": "client_credentials"},
        headers={"Authorization": f"Basic {basic}"},
    ) as resp:
        return str((await resp.json())["access_token"])


async def mixed_load(info: dict[str, Any], seconds: float, concurrency: int) -> float:
    """Charges, captures and voids, reporting by order_id, and terminal interactions."""
    base = info["base_url"]
    key = {"Authorization": f"Bearer {info['api_key']}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:
        bearer = {"Authorization": f"Bearer {await oauth_token(http, info)}"}
        counter = 0

        async def step(index: int) -> int | None:
            nonlocal counter
            counter += 1
            kind = counter % 4
            if kind == 0 and index < 8:  # one worker per terminal: no 409s
                return await interaction(f"SIM-000{index + 1}")
            if kind in (0, 1):
                order = f"bench-{counter}"
                body = {
                    "account_token": "9411111111111111", "expiration": "1230",
                    "amount": 300 + counter % 50 * 100, "order_id": order, "capture": "N",
                }  # fmt: skip
                async with http.post(f"{base}/api/v1/charge", json=body, headers=key) as resp:
                    answer = await resp.json()
                follow = "/api/v1/capture" if counter % 2 else "/api/v1/void-or-refund"
                async with http.post(
                    f"{base}{follow}", json={"trans_id": answer["trans_id"]}, headers=key
                ) as resp:
                    await resp.read()
                return 2
            if kind == 2:
                query = json.dumps({"order_id": f"bench-{max(1, counter - 7)}"})
                async with http.get(
                    f"{info['reporting_url']}{REPORTING}", params={"q": query}, headers=bearer
                ) as resp:
                    await resp.read()
            else:
                async with http.get(f"{base}/api/terminal", headers=key) as resp:
                    await resp.read()
            return 1

        async def interaction(device: str) -> int:
            """Start a charge-card and poll it every 5 ms until it ends."""
            async with http.post(
                f"{base}/api/terminal/{device}/charge-card", json={"amount": 450}, headers=key
            ) as resp:
                started = await resp.json()
                if resp.status != 202:
                    return 1
            path = f"{base}/api/terminal/{device}/charge-card/{started['interaction_id']}"
            made = 1
            while True:
                await asyncio.sleep(0.005)
                async with http.get(path, headers=key) as resp:
                    made += 1
                    if (await resp.json())["status"] != "pending":
                        return made

        return await rate(seconds, concurrency, step)


async def push_delays(info: dict[str, Any], interactions: int) -> dict[str, Any]:
    """Run interactions on all eight terminals while subscribed; read the simulator's stats."""
    base = info["base_url"]
    key = {"Authorization": f"Bearer {info['api_key']}"}
    async with aiohttp.ClientSession(headers=key) as http:

        async def terminal(device: str, count: int) -> None:
            async with http.post(f"{base}/api/ws-token") as resp:
                token = (await resp.json())["token"]
            async with http.ws_connect(f"{info['ws_url']}/cable?token={token}") as ws:
                await ws.receive_json()  # welcome
                for _ in range(count):
                    async with http.post(
                        f"{base}/api/terminal/{device}/read-card", json={"amount": 100}
                    ) as resp:
                        interaction_id = (await resp.json())["interaction_id"]
                    ident = json.dumps({"channel": f"terminal_job:{interaction_id}"})
                    await ws.send_json({"command": "subscribe", "identifier": ident})
                    while True:
                        frame = await ws.receive_json(timeout=10)
                        message = frame.get("message")
                        if isinstance(message, dict) and message["status"] != "pending":
                            break

        per_terminal = max(1, interactions // 8)
        await asyncio.gather(*(terminal(f"SIM-000{n}", per_terminal) for n in range(1, 9)))
        async with http.get(f"{base}/sim/stats") as resp:
            return dict(await resp.json())


async def page_through(info: dict[str, Any], pid: int) -> tuple[int, float, float, float]:
    """Read every transaction page by page; (rows, seconds, RSS MB, peak RSS MB)."""
    async with aiohttp.ClientSession() as http:
        bearer = {"Authorization": f"Bearer {await oauth_token(http, info)}"}
        rows = 0
        offset = 0
        started = time.monotonic()
        while True:
            async with http.get(
                f"{info['reporting_url']}{REPORTING}",
                params={"limit": "1000", "offset": str(offset)},
                headers=bearer,
            ) as resp:
                page = await resp.json()
            rows += len(page["items"])
            offset += len(page["items"])
            if not page["hasMore"]:
                break
        elapsed = time.monotonic() - started
    rss, peak = memory_mb(pid)
    return rows, elapsed, rss, peak


async def main(args: argparse.Namespace) -> dict[str, Any]:
    bare, bare_info = await start_process("-c", BARE_SERVER)
    try:
        bare_rps = await simple_gets(bare_info, args.seconds, args.concurrency, "x")
    finally:
        await stop_process(bare)

    launched = time.monotonic()
    sim, info = await start_process(
        "-m", "kiosk_agent", "sim", "--port", "0", "--time-scale", "50",
        "--transactions", str(args.transactions), "--rate-limit", "1000000/1",
    )  # fmt: skip
    start_s = time.monotonic() - launched
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{info['base_url']}/api/v1/vault_payment_accounts",
                json=ACCOUNT,
                headers={"Authorization": f"Bearer {info['api_key']}"},
            ) as resp,
        ):
            uuid = (await resp.json())["uuid"]
        get_rps = await simple_gets(info, args.seconds, args.concurrency, uuid)
        mixed_rps = await mixed_load(info, args.seconds, args.concurrency)
        stats = await push_delays(info, args.interactions)
        rows, page_s, rss, peak = await page_through(info, sim.pid)
    finally:
        await stop_process(sim)

    figures = {
        "simple_get_requests_per_s": round(get_rps),
        "bare_aiohttp_get_requests_per_s": round(bare_rps),
        "simple_get_vs_bare_aiohttp_ratio": round(get_rps / bare_rps, 3),
        "mixed_requests_per_s": round(mixed_rps),
        "push_count": stats["pushes"],
        "push_p50_ms": stats["push_p50_ms"],
        "push_p99_ms": stats["push_p99_ms"],
        "paged_transactions": rows,
        "paging_s": round(page_s, 2),
        "paging_transactions_per_s": round(rows / page_s),
        "start_to_ready_s": round(start_s, 2),
        "rss_mb": round(rss, 1),
        "peak_rss_mb": round(peak, 1),
    }
    print(f"simple GETs:   {get_rps:8.0f} req/s  (bare aiohttp {bare_rps:.0f} req/s, "
          f"ratio {get_rps / bare_rps:.2f}; target >= 2000)")  # fmt: skip
    print(f"mixed load:    {mixed_rps:8.0f} req/s  (charges, captures/voids, reporting, terminal)")
    print(f"push delay:    p50 {stats['push_p50_ms']} ms, p99 {stats['push_p99_ms']} ms over "
          f"{stats['pushes']} frames (target p99 < 10 ms)")  # fmt: skip
    print(f"data set:      {rows} transactions paged in {page_s:.1f} s ({rows / page_s:,.0f}/s); "
          f"RSS {rss:.0f} MB, peak {peak:.0f} MB (target < 200 MB)")  # fmt: skip
    print(f"start:         {start_s:.2f} s from launch to READY, seeding "
          f"{args.transactions} transactions")  # fmt: skip
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each load phase")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--transactions", type=int, default=100_000)
    parser.add_argument("--interactions", type=int, default=400)
    result = asyncio.run(main(parser.parse_args()))
    print(json.dumps(result))
