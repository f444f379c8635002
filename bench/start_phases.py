"""Where a start's CPU goes: `kiosk-agent run` timed phase by phase, library floor to READY=1.

    python bench/start_phases.py [--starts 6] [--compare DIR] [--latency-ms 0]

Each start is a real `kiosk-agent run` of bench/agent.py's kiosk configuration (eight terminals,
a kiosk API trigger) on a simulator of its own, under the systemd unit's environment (``-OO``, as
bench/agent.py runs it), spawned through this file as its launcher: the
launcher imports the library floor (the six libraries bench/agent.py's floor imports), then runs
the command with marks of the process's CPU (user + system) at each phase: the configuration's
module and its read, the agent's modules, the agent assembled, the journal opened, the terminal
list, the first charge check, the triggers, READY=1 (the wall time of the start's waits beside
them; with no sale to recover the first check begins while the terminals are listed, so its
marks are what the start still waits for it after the list). Medians of ``--starts`` starts,
after one discarded start that writes the bytecode (as installed: a scratch
``PYTHONPYCACHEPREFIX``).

``--compare DIR`` alternates each start with one of the worktree DIR's agent (another commit),
for before/after pairs in the same minutes. ``--latency-ms`` puts a proxy between the agent and
the simulator's HTTP endpoints that holds each answer that long (a round trip over the internet):
what the start's waits for the service cost in the field. The last line is one JSON object of the
figures (milliseconds, with the load average before and after).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import runpy
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

FLOOR = ("aiohttp", "pydantic", "voluptuous", "yaml", "serial", "aiomqtt")  # bench/agent.py's
HERE = Path(__file__).resolve()  # this file: the bench, and the agent's launcher
SPAWN_TO_READY = "spawn to READY=1, floor included"  # the process's whole CPU, and the wall
# (module, attribute path) of each phase's function: its CPU and wall from call to return
PHASES = {
    "config.load imported": ("kiosk_agent.config.load", None),
    "configuration read and checked": ("kiosk_agent.config.load", "load_config"),
    "agent's modules imported": ("kiosk_agent.app", None),
    "agent assembled": ("kiosk_agent.assembly.agent", "Agent.__init__"),
    "journal opened": ("kiosk_agent.sales.journal_guard", "JournalGuard.open_journal"),
    "terminal list": ("kiosk_agent.assembly.agent", "Agent.refresh_terminals"),
    # what the triggers wait for (a tree before 2026-11-30 waited for the whole first check)
    "first charge check": ("kiosk_agent.sales.journal_guard",
                           "JournalGuard.before_triggers JournalGuard.first_check"),
    "triggers": ("kiosk_agent.assembly.agent", "Agent._start_platforms"),
}


def launch(out: str, argv: list[str]) -> None:
    """The agent's process: the floor, then `kiosk-agent ARGV` with the phases marked; the marks
    to ``out`` (JSON) when READY=1 is sent."""
    import functools
    import importlib.machinery
    import inspect

    for name in FLOOR:
        __import__(name)
    floor = time.process_time()
    marks: dict[str, tuple[float, float]] = {}  # phase -> (CPU ms, wall ms)

    def timed(phase: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def mark(cpu: float, wall: float) -> None:
            cpu_ms, wall_ms = time.process_time() - cpu, time.perf_counter() - wall
            marks[phase] = (cpu_ms * 1000, wall_ms * 1000)

        if inspect.iscoroutinefunction(function):
            @functools.wraps(function)
            async def waited(*args: Any, **kwargs: Any) -> Any:
                cpu, wall = time.process_time(), time.perf_counter()
                try:
                    return await function(*args, **kwargs)
                finally:
                    mark(cpu, wall)
            return waited

        @functools.wraps(function)
        def called(*args: Any, **kwargs: Any) -> Any:
            cpu, wall = time.process_time(), time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                mark(cpu, wall)
        return called

    class Marker:
        """Wraps each phase's function as its module is imported (its import timed too)."""

        def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
            if not any(module == name for module, _ in PHASES.values()):
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run_body = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                cpu, wall = time.process_time(), time.perf_counter()
                run_body(module)
                for phase, (owner, attribute) in PHASES.items():
                    if owner != name:
                        continue
                    if attribute is None:
                        marks[phase] = ((time.process_time() - cpu) * 1000,
                                        (time.perf_counter() - wall) * 1000)
                        continue
                    for each in attribute.split():  # the first of them the tree has
                        *outer, last = each.split(".")
                        holder = module
                        for part in outer:
                            holder = getattr(holder, part)
                        if hasattr(holder, last):
                            setattr(holder, last, timed(phase, getattr(holder, last)))
                            break

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Marker())
    from kiosk_agent.assembly import systemd

    notify = systemd.SystemdNotifier.notify

    def notified(self: Any, *fields: str) -> bool:
        if any(f.startswith("READY=1") for f in fields):
            marks["READY=1, above the floor"] = ((time.process_time() - floor) * 1000, 0.0)
            Path(out).write_text(json.dumps(marks))
        return notify(self, *fields)

    systemd.SystemdNotifier.notify = notified  # type: ignore[method-assign]
    sys.argv = ["kiosk-agent", *argv]
    runpy.run_module("kiosk_agent", run_name="__main__", alter_sys=True)


async def _held_answers(base_url: str, seconds: float) -> tuple[asyncio.Server, str]:
    """A TCP proxy to ``base_url``'s host that holds each chunk of its answers ``seconds``."""
    target = urlsplit(base_url)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hold: float) -> None:
        try:
            while data := await reader.read(65536):
                if hold:
                    await asyncio.sleep(hold)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def serve(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(target.hostname, target.port)
        await asyncio.gather(pipe(client_r, server_w, 0.0), pipe(server_r, client_w, seconds))

    proxy = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]
    return proxy, f":{port}"


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    import agent as bench_agent  # the sibling bench: its simulator and configuration
    from _support import free_port, unit_environment

    trees = [HERE.parent.parent] + ([args.compare.resolve()] if args.compare else [])
    for tree in trees[1:]:
        bench_agent.agent_imported_from(tree)
    found: dict[Path, list[dict[str, list[float]]]] = {tree: [] for tree in trees}
    with tempfile.TemporaryDirectory(prefix="bench-start-phases-") as scratch_dir:
        scratch = Path(scratch_dir)
        async with bench_agent.field_simulator() as ready_info:
            info = dict(ready_info)
            proxy = None
            if args.latency_ms:
                proxy, at = await _held_answers(info["base_url"], args.latency_ms / 1000)
                port = f":{urlsplit(info['base_url']).port}"
                for key in ("base_url", "reporting_url"):
                    info[key] = info[key].replace(port, at)
            config = scratch / "config.yaml"
            config.write_text(
                bench_agent.config_text(info, free_port(), bench_agent.PROCESS_TIME_SCALE)
            )
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            listener.bind(str(scratch / "notify.sock"))
            listener.setblocking(False)
            env = {
                **os.environ,
                **unit_environment(),  # as its systemd unit runs it (-OO), as bench/agent.py does
                "NOTIFY_SOCKET": str(scratch / "notify.sock"),
                "BENCH_API_KEY": info["api_key"], "BENCH_CLIENT_SECRET": info["client_secret"],
                "BENCH_KIOSK_TOKEN": bench_agent.KIOSK_TOKEN,
                "PYTHONPYCACHEPREFIX": str(scratch / "bytecode"),  # as installed
            }
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            try:
                for start in range(args.starts + 1):  # the first writes the bytecode
                    for tree in trees:
                        marks = await _one_start(tree, config, env, listener, scratch)
                        if start:
                            found[tree].append(marks)
            finally:
                listener.close()
                if proxy is not None:
                    proxy.close()
    return {tree: _medians(starts) for tree, starts in found.items()}


async def _one_start(
    tree: Path, config: Path, env: dict[str, str], listener: socket.socket, scratch: Path
) -> dict[str, list[float]]:
    import agent as bench_agent

    out = scratch / "marks.json"
    out.unlink(missing_ok=True)
    loop = asyncio.get_running_loop()
    spawned = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(HERE), "--launch", str(out),
        "run", "--config", str(config),
        env={**env, "PYTHONPATH": str(tree)}, cwd=tree,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        while not (await asyncio.wait_for(loop.sock_recv(listener, 1024), 60)).startswith(
            b"READY=1"
        ):
            pass
        whole = (bench_agent._cpu_ns(proc.pid) / 1e6, (time.perf_counter() - spawned) * 1000)
        for _ in range(100):  # written just before READY=1 is sent
            if out.exists():
                break
            await asyncio.sleep(0.01)
        marks = {phase: list(both) for phase, both in json.loads(out.read_text()).items()}
        return {**marks, SPAWN_TO_READY: list(whole)}
    finally:
        proc.terminate()
        await proc.wait()


def _medians(starts: list[dict[str, list[float]]]) -> dict[str, tuple[float, float]]:
    phases = [*PHASES, "READY=1, above the floor", SPAWN_TO_READY]
    return {
        phase: (
            statistics.median(s[phase][0] for s in starts if phase in s),
            statistics.median(s[phase][1] for s in starts if phase in s),
        )
        for phase in phases
        if any(phase in s for s in starts)
    }


def key(phase: str) -> str:
    """A phase's name as a JSON key: ``READY=1, above the floor`` -> ``ready_1_above_the_floor``."""
    return re.sub(r"\W+", "_", phase.lower().replace("'s", "")).strip("_")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=6)
    parser.add_argument("--compare", type=Path, default=None, metavar="DIR")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args()
    before = os.getloadavg()[0]
    results = await measure(args)
    figures: dict[str, Any] = {}
    for index, (tree, medians) in enumerate(results.items()):
        print(f"{tree} (medians of {args.starts} starts; CPU ms, wall ms)")
        for phase, (cpu, wall) in medians.items():
            print(f"  {phase:34s} {cpu:8.1f} {wall:8.1f}")
            prefix = "compared_" if index else ""
            figures[f"{prefix}{key(phase)}_cpu_ms"] = round(cpu, 1)
            if wall:
                figures[f"{prefix}{key(phase)}_wall_ms"] = round(wall, 1)
    figures["latency_ms"] = args.latency_ms
    figures["load_average_before"] = round(before, 2)
    figures["load_average_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--launch":
        del sys.path[0]  # this directory: no bench's name may shadow a module the agent imports
        launch(sys.argv[2], sys.argv[3:])
    else:
        sys.path.insert(0, str(HERE.parent))
        asyncio.run(main())
