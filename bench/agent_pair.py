"""Two agents, this tree's and another worktree's, each on its own simulator, measured in
alternating blocks of kiosk API sales (issue 33): what a change does to a sale's CPU, where the
machine's load moves a single `bench/agent.py` run by more than the change.

    python bench/agent_pair.py --other /work/base-NAME [--blocks 20] [--per-block 30]
                               [--log-level WARNING|INFO]

Both agents run the bench's configuration (bench/agent.py's ``config_text``) as processes under
the systemd unit's environment (``unit_environment``, as bench/agent.py's agent), the
other one from its own tree (bench/agent.py's ``--agent-path`` way: that tree first on its path
and as its working directory), and are driven by the same driver (``kiosk_sales_cpu``: each sale
followed on its own WebSocket, as the app does). Block n measures both, in the order this, other
on even blocks and other, this on odd ones, so that neither always meets the minute after the
other. Printed: each block's pair on stderr, then the medians of each agent's blocks and the
median of the blocks' ratios (this over other: below 1, this tree spends less), with the spread
of the ratios; the last line is one JSON object of those figures. Two agents of the same code
read 0.96-1.06 on the shared machine (docs/architecture.md): a change that moves a sale by less
than that is not shown by this, and its own figures (counts, a function's time) say more.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # loaded from a test too, as agent.py
import agent as bench  # bench/agent.py: its configuration, driver and spawner
from _support import free_port, unit_environment  # the agent as its systemd unit runs it


async def spawn(tree: Path | None, directory: Path, info: dict[str, Any]) -> tuple[Any, int]:
    """One agent (from ``tree``, or this one) on the simulator ``info``: (process, port)."""
    port = free_port()
    (directory / "config.yaml").write_text(
        bench.config_text(info, port, bench.PROCESS_TIME_SCALE)
    )
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(directory / "notify.sock"))
    listener.setblocking(False)
    env = {
        **os.environ,
        **unit_environment(),  # both agents as their systemd unit runs them, as bench/agent.py's
        "NOTIFY_SOCKET": str(directory / "notify.sock"),
        "BENCH_API_KEY": info["api_key"],
        "BENCH_CLIENT_SECRET": info["client_secret"],
        "BENCH_KIOSK_TOKEN": bench.KIOSK_TOKEN,
    }
    os.environ.pop("BENCH_AGENT_PATH", None)
    if tree is not None:
        os.environ["BENCH_AGENT_PATH"] = str(tree)
    try:
        proc, _, _ = await bench.spawn_agent(directory / "config.yaml", env, listener)
    finally:
        os.environ.pop("BENCH_AGENT_PATH", None)
        listener.close()
    return proc, port


def summary(this_ms: list[float], other_ms: list[float]) -> dict[str, float]:
    """The figures of paired blocks: each agent's median, and the median of the ratios."""
    ratios = [mine / theirs for mine, theirs in zip(this_ms, other_ms, strict=True)]
    return {
        "this_sale_cpu_ms": round(statistics.median(this_ms), 2),
        "other_sale_cpu_ms": round(statistics.median(other_ms), 2),
        "this_over_other": round(statistics.median(ratios), 3),
        "block_ratio_min": round(min(ratios), 3),
        "block_ratio_max": round(max(ratios), 3),
    }


async def measure(
    other: Path, scratch: Path, blocks: int, per_block: int
) -> dict[str, float]:
    """Both agents in ``scratch`` (a directory each), measured in alternating blocks."""
    this_ms: list[float] = []
    other_ms: list[float] = []
    async with bench.field_simulator() as this_info, bench.field_simulator() as other_info:
        this, this_port = await spawn(None, scratch / "this", this_info)
        try:
            that, that_port = await spawn(other, scratch / "other", other_info)
            try:
                await asyncio.sleep(1.0)  # start-up work settles first
                for n in range(blocks):
                    warm_up = 5 if n == 0 else 1
                    pair = [(this, this_port, this_ms), (that, that_port, other_ms)]
                    for proc, port, into in pair if n % 2 == 0 else pair[::-1]:
                        into.append(
                            await bench.kiosk_sales_cpu(proc.pid, port, per_block,
                                                        warm_up=warm_up)
                        )  # fmt: skip
                    print(f"block {n + 1}: this {this_ms[-1]:.2f} ms, other "
                          f"{other_ms[-1]:.2f} ms a sale", file=sys.stderr)  # fmt: skip
            finally:
                that.terminate()
                await that.wait()
        finally:
            this.terminate()
            await this.wait()
    return summary(this_ms, other_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, required=True, metavar="DIR",
                        help="the other agent's worktree (e.g. a copy of main)")
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--per-block", type=int, default=30, help="sales in each block")
    parser.add_argument("--log-level", choices=("WARNING", "INFO"), default="WARNING",
                        help="both agents' logging level (INFO: a unit's default)")
    args = parser.parse_args()
    bench.LOG_LEVELS["level"] = args.log_level
    other = args.other.resolve()
    print(f"the other agent: {bench.agent_imported_from(other)}")
    before = bench.load_average()
    with tempfile.TemporaryDirectory(prefix="bench-pair-") as scratch:
        for name in ("this", "other"):
            Path(scratch, name).mkdir()
        # the unit's -OO reads .opt-2.pyc files: compiled at each agent's first start into a
        # cache of the run's own (as bench/agent.py does), not into either tree
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["PYTHONPYCACHEPREFIX"] = str(Path(scratch, "bytecode"))
        figures = asyncio.run(measure(other, Path(scratch), args.blocks, args.per_block))
    figures |= {"load_average_before": before, "load_average_after": bench.load_average()}
    for name, value in figures.items():
        print(f"{name:20} {value}")
    print(json.dumps({**figures, "log_level": args.log_level}))


if __name__ == "__main__":
    main()
