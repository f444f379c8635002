"""The kiosk API under a flood of event streams: sales served, memory bounded and given back.

    python bench/stream_flood.py [--sockets 300] [--big 30]

The agent (``kiosk-agent run``, its own process, the embedded simulator, a ``kiosk_api``
trigger) is flooded with ``--sockets`` WebSockets on ``/api/v1/events`` that never read, of
which ``--big`` also start sending a 4 MiB frame and stall (as in issue 22). Meanwhile the
honest app asks for sales. Figures: the agent's RSS idle, under the flood and after the
sockets closed (from /proc), the sockets the agent took and refused (``http.max_streams``), the
sale requests answered and their time. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from _support import free_port  # shared with the tests, without the test tree

TOKEN = "bench-kiosk-token-0123456789"  # noqa: S105 - a local bench's own token


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def start_agent(directory: Path, port: int) -> asyncio.subprocess.Process:
    (directory / "config.yaml").write_text(
        f"""service:
  simulator: {{time_scale: 50}}
terminals: [{{device_id: SIM-0001}}]
journal: {{path: journal.db}}
receipts: {{print: never, email: false}}
logging: {{level: WARNING}}
triggers:
  - {{platform: kiosk_api, name: screen, port: {port}, token: !env_var KIOSK_BENCH_TOKEN,
     products: {{coffee: "2.50"}}}}
"""
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kiosk_agent", "run", "--config", str(directory / "config.yaml"),
        stdout=asyncio.subprocess.DEVNULL, stderr=(directory / "agent.log").open("w"),
        cwd=directory, env={**os.environ, "KIOSK_BENCH_TOKEN": TOKEN},
    )
    async with aiohttp.ClientSession() as session, asyncio.timeout(60):
        while True:
            try:
                async with session.get(f"http://127.0.0.1:{port}/api/v1/status",
                                       headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                    if r.status == 200 and (await r.json())["card_payment"]["available"]:
                        return proc
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)


async def open_stream(port: int, big: bool) -> asyncio.StreamWriter | None:
    """A raw WebSocket that never reads; ``big``: it starts a 4 MiB frame and stalls."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"GET /api/v1/events?token={TOKEN} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        if b" 101 " not in head.split(b"\r\n")[0]:
            writer.close()
            return None
        if big:
            size = 4 * 1024 * 1024
            writer.write(bytes([0x82, 0xFF]) + struct.pack(">Q", size) + b"\0\0\0\0")
            writer.write(b"x" * (size - 4096))  # most of it, then stall
        return writer
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return None


async def sale(session: aiohttp.ClientSession, port: int) -> tuple[int, float]:
    """One sale asked for (the answer timed), then followed by polling to its end."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    began = time.monotonic()
    async with session.post(f"http://127.0.0.1:{port}/api/v1/sales",
                            json={"product": "coffee"}, headers=headers) as response:
        body = await response.json()
        answered = (response.status, time.monotonic() - began)
    if response.status == 202:
        async with asyncio.timeout(30):
            while True:
                async with session.get(f"http://127.0.0.1:{port}/api/v1/sales/"
                                       f"{body['sale_id']}", headers=headers) as latest:
                    if (await latest.json()).get("final"):
                        break
                await asyncio.sleep(0.05)
    return answered


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=300)
    parser.add_argument("--big", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="flood-") as scratch:
        port = free_port()
        agent = await start_agent(Path(scratch), port)
        try:
            await asyncio.sleep(1.0)
            idle = rss_mib(agent.pid)
            opened = await asyncio.gather(
                *(open_stream(port, n < args.big) for n in range(args.sockets))
            )
            taken = [w for w in opened if w is not None]
            await asyncio.sleep(1.0)
            flooded = rss_mib(agent.pid)
            async with aiohttp.ClientSession() as session:
                answers = [await sale(session, port) for _ in range(5)]
                await asyncio.sleep(1.0)
            during = max(flooded, rss_mib(agent.pid))
            for writer in taken:
                writer.close()
            await asyncio.sleep(2.0)
            after = rss_mib(agent.pid)
        finally:
            agent.terminate()
            await agent.wait()
    served = [t for status, t in answers if status == 202]
    figures = {
        "sockets_opened": args.sockets,
        "streams_taken": len(taken),
        "streams_refused": args.sockets - len(taken),
        "sales_asked": len(answers),
        "sales_served_202": len(served),
        "sale_answer_median_s": round(statistics.median(served), 3) if served else None,
        "rss_idle_mib": round(idle, 1),
        "rss_flood_mib": round(during, 1),
        "rss_after_mib": round(after, 1),
        "rss_after_over_idle_ratio": round(after / idle, 2) if idle else None,
    }
    print(f"streams taken {len(taken)} of {args.sockets} ({args.big} sending a 4 MiB frame)")
    print(f"sales served  {len(served)} of {len(answers)}, median answer "
          f"{figures['sale_answer_median_s']} s")
    print(f"RSS           idle {idle:.1f} MiB, flooded {during:.1f} MiB, after {after:.1f} MiB")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(asyncio.run(main()))
