"""The machine's audit: a 10 kB audit's wire time and parse time, and what an endless answer costs.

    python bench/dex.py [--parses 300]

- wire: a 10 kB EVA-DTS audit read with DEX/UCS, then with DDCMP, from the virtual machine's
  port over a real pty, the port paced as 9600 baud 8N1 would (10 bits a byte), on the real
  clock;
- parse: ``parse_audit`` of the same 10 kB file, median and 95th percentile of ``--parses``
  runs, wall and CPU (``time.process_time``) (target: at most 5 ms). Beside it, in the same
  process and interleaved with it, a baseline: the same file split into lines
  (``bytes.split``) and each line into elements (``str.split('*')``), the least any reader
  does. The parse's CPU median over the baseline's is a ratio that holds on any machine;
- endless: the port offers a 10 MB audit, block after valid block (DEX/UCS, then DDCMP); the
  read must stop at its byte budget (``LinkSettings.max_bytes``, 2 MiB) with a LinkError, and
  the Python memory the read allocated at its peak (tracemalloc, the port's own 10 MB
  excluded) must stay near it;
- flood: the port answers with bytes that never end a block: the read stops at 512 bytes.

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kiosk_agent.audit import parse_audit, render_audit
from kiosk_agent.audit.link import LinkError, read_link
from kiosk_agent.audit.link_settings import LinkProtocol, LinkSettings
from kiosk_agent.audit.virtual import PortFaults, VirtualDexPort

TARGET_PARSE_MS = 5.0
BASELINE_REPEAT = 10


def ten_kilobytes() -> bytes:
    """An audit like a 60-column snack machine's: products with PA2 and PA7 by device."""
    body: list[tuple[str, ...]] = [
        ("ID1", "SN0012345678", "SNACK60", "1", "Lobby 2", "", "A-0042"),
        ("ID4", "2", "840", "USD"),
        ("ID5", "20261128", "1930"),
        ("CB1", "VMC-77", "VMC2", "0400"),
        ("VA1", "1254350", "5017", "125400", "502"),
        ("CA2", "752350", "3017", "75200", "302"),
        ("DA2", "502000", "2000", "50200", "200"),
    ]
    column = 0
    while len(render_audit(body)) < 10_000:
        column += 1
        body += [
            ("PA1", str(column), "250", f"Product number {column:02d}"),
            ("PA2", "84", "21000", "8", "2000"),
            ("PA7", str(column), "CA", "0", "250", "50", "12500", "5", "1250"),
            ("PA7", str(column), "DA", "0", "250", "34", "8500", "3", "750"),
        ]
    return render_audit(body)


@dataclass
class ParseTimes:
    """Each run's wall time and CPU time (ms), the parse's and the baseline's: on a shared, busy
    machine the wall time counts the other processes' turns too."""

    wall: list[float]
    cpu: list[float]
    baseline_cpu: list[float]

    @property
    def ratio(self) -> float:
        """The parse's CPU median over the baseline's: the same on a fast or a slow machine."""
        return statistics.median(self.cpu) / max(statistics.median(self.baseline_cpu), 1e-9)


def split_only(audit: bytes) -> None:
    """The baseline: the file split into lines, each line decoded and split into elements."""
    for line in audit.split(b"\n"):
        line.decode("latin-1").split("*")


def parse_times(audit: bytes, runs: int) -> ParseTimes:
    """``runs`` parses, each followed by ``BASELINE_REPEAT`` baselines (timed together, then
    divided: one baseline is too short for the CPU clock on its own)."""
    times = ParseTimes([], [], [])
    for _ in range(5):
        parse_audit(audit)  # warm: the CRC's pair table, the caches
    for _ in range(runs):
        cpu, wall = time.process_time(), time.perf_counter()
        parse_audit(audit)
        times.wall.append((time.perf_counter() - wall) * 1000)
        times.cpu.append((time.process_time() - cpu) * 1000)
        cpu = time.process_time()
        for _ in range(BASELINE_REPEAT):
            split_only(audit)
        times.baseline_cpu.append((time.process_time() - cpu) * 1000 / BASELINE_REPEAT)
    return times


async def wire_read(audit: bytes, protocol: LinkProtocol) -> tuple[float, int, int]:
    async with VirtualDexPort(audit, baud_delay=True) as port:
        started = time.monotonic()
        read = await read_link(LinkSettings(port=port.port, protocol=protocol))
        took = time.monotonic() - started
        assert read.audit == audit
        return took, read.bytes_heard, port.bytes_heard


async def endless_read(protocol: LinkProtocol = LinkProtocol.DEX) -> tuple[int, float, str]:
    offered = bytes(range(32, 127)) * (10_000_000 // 95)  # 10 MB, never ending in time
    async with VirtualDexPort(offered) as port:
        tracemalloc.start()
        try:
            await read_link(LinkSettings(port=port.port, protocol=protocol, deadline=600))
        except LinkError as err:
            reason = str(err)
        else:
            reason = "read to its end (not bounded!)"
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return port.bytes_sent, peak / (1 << 20), reason


async def flood_read() -> tuple[int, str]:
    async with VirtualDexPort(b"", port_faults=PortFaults(flood=True)) as port:
        try:
            await read_link(LinkSettings(port=port.port))
        except LinkError as err:
            return port.bytes_sent, str(err)
        return port.bytes_sent, "no error (not bounded!)"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parses", type=int, default=300)
    args = parser.parse_args()
    audit = ten_kilobytes()
    times = parse_times(audit, args.parses)
    median = statistics.median(times.wall)
    p95 = statistics.quantiles(times.wall, n=20)[-1]
    cpu_ms = statistics.median(times.cpu)
    cpu_p95 = statistics.quantiles(times.cpu, n=20)[-1]
    baseline_ms = statistics.median(times.baseline_cpu)
    load = os.getloadavg()[0]
    print(f"audit         {len(audit):,} bytes, {audit.count(b'PA1*')} columns")
    print(
        f"parse         median {median:.2f} ms, p95 {p95:.2f} ms; CPU median {cpu_ms:.2f} ms, "
        f"p95 {cpu_p95:.2f} ms; {args.parses} runs (target <= {TARGET_PARSE_MS:g} ms; "
        f"load average {load:.1f})"
    )
    print(
        f"parse/split   {times.ratio:.1f} x the CPU of splitting the same file into lines and "
        f"elements ({baseline_ms:.3f} ms), measured beside it"
    )
    wire_s, heard, sent_by_master = await wire_read(audit, LinkProtocol.DEX)
    print(
        f"wire (DEX/UCS) {wire_s:.2f} s at 9600 baud for {heard:,} bytes heard, "
        f"{sent_by_master} sent (10 bits a byte: {heard * 10 / 9600:.2f} s of line)"
    )
    ddcmp_s, ddcmp_heard, ddcmp_sent = await wire_read(audit, LinkProtocol.DDCMP)
    print(
        f"wire (DDCMP)  {ddcmp_s:.2f} s at 9600 baud for {ddcmp_heard:,} bytes heard, "
        f"{ddcmp_sent} sent (10 bits a byte: {ddcmp_heard * 10 / 9600:.2f} s of line)"
    )
    offered_sent, peak_mib, reason = await endless_read()
    print(
        f"endless       the port got {offered_sent:,} bytes out before the read ended: "
        f"{reason}; peak {peak_mib:.1f} MiB allocated by the read"
    )
    ddcmp_offered_sent, ddcmp_peak_mib, ddcmp_reason = await endless_read(LinkProtocol.DDCMP)
    print(
        f"endless DDCMP the port got {ddcmp_offered_sent:,} bytes out before the read ended: "
        f"{ddcmp_reason}; peak {ddcmp_peak_mib:.1f} MiB allocated by the read"
    )
    flood_sent, flood_reason = await flood_read()
    print(f"flood         ended after the port sent {flood_sent:,} bytes: {flood_reason}")
    print(
        json.dumps(
            {
                "audit_bytes": len(audit),
                "parse_median_ms": round(median, 3),
                "parse_p95_ms": round(p95, 3),
                "parse_cpu_median_ms": round(cpu_ms, 3),
                "parse_cpu_p95_ms": round(cpu_p95, 3),
                "split_baseline_cpu_ms": round(baseline_ms, 4),
                "parse_to_split_ratio": round(times.ratio, 1),
                "load_average": round(load, 1),
                "parse_target_ms": TARGET_PARSE_MS,
                "parse_within_target": min(median, cpu_ms) <= TARGET_PARSE_MS,
                "wire_dex_9600_s": round(wire_s, 2),
                "wire_dex_bytes": heard,
                "wire_ddcmp_9600_s": round(ddcmp_s, 2),
                "wire_ddcmp_bytes": ddcmp_heard,
                "endless_offered_bytes": 10_000_000,
                "endless_bytes_sent_before_stop": offered_sent,
                "endless_peak_mib": round(peak_mib, 2),
                "endless_ddcmp_bytes_sent_before_stop": ddcmp_offered_sent,
                "endless_ddcmp_peak_mib": round(ddcmp_peak_mib, 2),
                "flood_bytes_sent_before_stop": flood_sent,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
