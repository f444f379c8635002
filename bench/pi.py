"""A Pi Zero-class run: the agent alone under a small CPU and memory budget.

    python bench/pi.py [--cpu-percent 10] [--period-ms 10] [--memory-mb 128] [--sales 200]
                       [--idle-seconds 20] [--log-level INFO] [--agent-path DIR]

A Raspberry Pi Zero 2 W runs Python roughly ten times slower than a desktop core and has 512 MB
for everything. This bench puts ``kiosk-agent run`` (and only it: the simulator, the virtual
vending machine and the bench itself run outside) in a cgroup of its own with a CPU limit of
``--cpu-percent`` of one core over a short scheduling period (``--period-ms``: with the default
100 ms period a throttled process waits whole periods, which turns every sale's latency into
100 ms steps) and ``--memory-mb`` of memory. cgroup v2 (``cpu.max``, ``memory.max``) or v1
(``cpu.cfs_quota_us``/``cpu.cfs_period_us``, ``memory.limit_in_bytes``), as the machine has;
it needs root, and refuses with a clear message where the cgroups cannot be written.

The sale is real but for the card: an MDB trigger on a virtual vending machine over a pty, the
simulator over HTTP/WebSocket (time scale 1000, the card time subtracted as in hardware.py), the
journal on disk with synchronous=FULL. The agent logs at INFO, as a unit does by default (a line
at each sale's end); ``--log-level WARNING`` gives the figures read before 2026-11-29 13:00 UTC.

The agent runs as installed: its modules and its libraries' compiled to bytecode beforehand (a
scratch ``PYTHONPYCACHEPREFIX`` filled by a first run outside the budget, as pip compiles on
install); ``--from-source`` runs it as the environment is (in a tree whose bytecode is not
written, every start compiles every module, which at 10 % of a core takes seconds).

Figures: start -> ready (spawn to systemd READY=1) and the agent's CPU by then (``start_cpu_s``:
at a tenth of a core the wall time is about ten times it; what the wall time holds beyond that,
``start_wall_beyond_cpu_s``, is a wait on the way to READY=1, and ``periods_throttled_to_ready``
the periods the quota stopped it meanwhile); beside them, in the same budget
before the agent starts, bench/agent.py's floor of the libraries in use (``floor_start_s``,
``floor_start_cpu_s``: their imports, one model, one web application, one WAL database) and the
start above it (``start_above_floor_s``), which do not depend on the machine's speed as the
start alone does; vend request -> approve p50/p99
(target p99 < 100 ms), sales a minute on one terminal, idle CPU (% of one core, target < 0.1),
peak RSS (VmHWM), and how often the limit throttled the agent. Targets (issue 33): start -> ready
< 5 s, back-to-back p99 < 150 ms. Beside each latency, the agent's CPU inside each customer's
window (vend request -> approve, every thread's, from the scheduler's account:
``vend_window_agent_cpu_*``): at a tenth of a core a millisecond of it is some ten of the wait,
and unlike the wait the machine's load does not move it, so a tail's cause shows in it. The last
line is one JSON object of the figures, with the load average before and after. ``--agent-path
DIR`` measures the agent (only it) of another worktree, as bench/agent.py's does. ``--profile
FILE`` profiles the agent over the back-to-back sales (through bench/agent_probe.py) and prints
its top functions and event loop turns a sale.

The sales run twice. First ``--sales`` customers back to back: sales a minute, CPU per sale, and
the vend -> approve of customers who queue behind each other (``back_to_back_*``): at 10 % of a
core that many saturate the budget, and the agent's client also paces its terminal requests to
the service's 20 a second (choices.md), so those figures are the queue's. Then as many customers
one at a time, each ``--gap-ms`` after the one before was served (a real machine serves one
customer at a time, seconds apart): ``vend_answer_*``, what each customer waits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from kiosk_agent.sim.machine import ControllerOptions, VirtualController, VisitOutcome
from kiosk_agent.sim.server import SimOptions, SimServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import agent_probe  # the launcher that profiles the agent from outside
from _support import unit_environment  # the unit's Environment= lines
from agent import (  # the sibling bench's
    IN_USE_CODE,
    _cpu_ns,
    agent_imported_from,
    library_floor,
    load_average,
    percentile,
    print_profile,
)

TIME_SCALE = 1000.0
CARD_DELAY_SIM_S = 1.5  # choices.md: a card is presented 1.5 simulated seconds after the start
PRODUCTS = {"A1": 150, "A2": 250, "B1": 325}
API_KEY_ENV, SECRET_ENV = "PI_BENCH_API_KEY", "PI_BENCH_CLIENT_SECRET"


class CgroupUnavailable(RuntimeError):
    """The machine's cgroups cannot give the agent its budget (named in the message)."""


class Budget:
    """One cgroup (v2) or a cpu and a memory cgroup (v1) holding the agent alone."""

    def __init__(self, cpu_percent: float, period_ms: float, memory_mb: int) -> None:
        self.period_us = int(period_ms * 1000)
        self.quota_us = max(1000, int(self.period_us * cpu_percent / 100))
        self.memory_bytes = memory_mb * 1024 * 1024
        self.version = 2 if Path("/sys/fs/cgroup/cgroup.controllers").exists() else 1
        self.name = f"kiosk-agent-pi-bench-{os.getpid()}"
        self.dirs: list[Path] = []

    def create(self) -> None:
        try:
            if self.version == 2:
                self._create_v2()
            else:
                self._create_v1()
        except OSError as err:
            self.remove()
            raise CgroupUnavailable(
                f"cannot set up a cgroup {self.version} budget ({err.strerror}: "
                f"{err.filename}); run as root on a machine whose cgroup filesystem is "
                "writable (not in an unprivileged container)"
            ) from None

    def _create_v2(self) -> None:
        parent = Path("/sys/fs/cgroup") / _own_cgroup("")
        enabled = (parent / "cgroup.subtree_control").read_text().split()
        for controller in ("cpu", "memory"):
            if controller not in enabled:
                try:
                    (parent / "cgroup.subtree_control").write_text(f"+{controller}")
                except OSError as err:
                    raise CgroupUnavailable(
                        f"the {controller} controller is not enabled for {parent} and cannot be "
                        f"({err.strerror}); a cgroup v2 parent with processes of its own cannot "
                        "delegate it: run the bench from a cgroup of its own "
                        "(systemd-run --scope -p Delegate=yes ...)"
                    ) from None
        group = parent / self.name
        group.mkdir()
        self.dirs = [group]
        (group / "cpu.max").write_text(f"{self.quota_us} {self.period_us}")
        (group / "memory.max").write_text(str(self.memory_bytes))

    def _create_v1(self) -> None:
        cpu = _v1_mount("cpu") / _own_cgroup("cpu").lstrip("/") / self.name
        memory = _v1_mount("memory") / _own_cgroup("memory").lstrip("/") / self.name
        for group in (cpu, memory):
            group.mkdir()
            self.dirs.append(group)
        (cpu / "cpu.cfs_period_us").write_text(str(self.period_us))
        (cpu / "cpu.cfs_quota_us").write_text(str(self.quota_us))
        (memory / "memory.limit_in_bytes").write_text(str(self.memory_bytes))

    def enter(self) -> None:
        """Move the calling process in (a child between fork and exec)."""
        for group in self.dirs:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    def throttled(self) -> int:
        """Periods in which the agent was stopped by its quota."""
        stat = self.dirs[0] / "cpu.stat"
        for line in stat.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "nr_throttled":
                return int(value)
        return 0

    def remove(self) -> None:
        for group in reversed(self.dirs):
            with contextlib.suppress(OSError):
                group.rmdir()
        self.dirs = []


def _own_cgroup(controller: str) -> str:
    """This process's cgroup path for ``controller`` ("" is v2's unified hierarchy)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _id, names, path = line.split(":", 2)
        if (controller == "" and names == "") or controller in names.split(","):
            return path.lstrip("/")
    raise CgroupUnavailable(f"this process is in no {controller or 'v2'} cgroup")


def _v1_mount(controller: str) -> Path:
    for line in Path("/proc/mounts").read_text().splitlines():
        _dev, where, kind, opts, *_ = line.split()
        if kind == "cgroup" and controller in opts.split(","):
            return Path(where)
    raise CgroupUnavailable(f"no cgroup v1 {controller} controller is mounted")


class WindowCpu:
    """The agent's CPU while each customer waited (the controller's vend request -> the agent's
    approve), read from the scheduler's account of every thread of the agent at the two
    moments the controller tells its observers. At a tenth of a core each millisecond of it is
    some ten of the customer's wait, whatever else the machine runs: what a tail is made of, in
    a figure the machine's load does not move (the wall-clock latency it does)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._at_request: dict[int, int] = {}
        self.ms: dict[int, float] = {}  # visit number -> CPU ms in its window

    def __call__(self, what: str, visit: Any) -> None:
        if what == "selects":  # just before the request goes out
            self._at_request[visit.number] = _cpu_ns(self.pid)
        elif what == "approved" and visit.number in self._at_request:  # just after the answer
            self.ms[visit.number] = (_cpu_ns(self.pid) - self._at_request.pop(visit.number)) / 1e6

    def of(self, visits: list[Any]) -> list[float]:
        return [self.ms[v.number] for v in visits if v.number in self.ms]


def _config(
    sim: SimServer, controller: VirtualController, scratch: Path, log_level: str
) -> Path:
    info = sim.ready_info()
    document = {
        "service": {
            "base_url": info["base_url"], "reporting_url": info["reporting_url"],
            "ws_url": info["ws_url"], "mid": info["mid"], "client_id": info["client_id"],
            "api_key": f"!env_var {API_KEY_ENV}", "client_secret": f"!env_var {SECRET_ENV}",
        },
        "terminals": [{"device_id": "SIM-0001"}],
        "journal": {"path": str(scratch / "journal.db")},
        "receipts": {"print": "never", "email": False},
        "sales": {"interaction_lifetime": 180 / TIME_SCALE},
        "logging": {"level": log_level},
        "triggers": [{"platform": "mdb", "name": "pi", "port": controller.port,
                      "flow": "authorize_capture"}],
    }
    text = yaml.safe_dump(document, sort_keys=False)
    for env in (API_KEY_ENV, SECRET_ENV):  # tags, not strings
        text = text.replace(f"'!env_var {env}'", f"!env_var {env}")
    path = scratch / "pi.yaml"
    path.write_text(text)
    return path


@contextlib.contextmanager
def _notify_socket(scratch: Path) -> Iterator[socket.socket]:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(scratch / "notify.sock"))
    listener.setblocking(False)
    try:
        yield listener
    finally:
        listener.close()


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    return 0


async def run(args: argparse.Namespace, budget: Budget) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-pi-") as scratch_dir:
        scratch = Path(scratch_dir)
        if not args.from_source:
            os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
            os.environ["PYTHONPYCACHEPREFIX"] = str(scratch / "bytecode")
        sim = SimServer(SimOptions(port=0, time_scale=TIME_SCALE, rate_limit="100000/1"))
        await sim.start()
        controller = VirtualController(ControllerOptions(products=PRODUCTS, dispense_time=0.0))
        await controller.start()
        try:
            with _notify_socket(scratch) as listener:
                return await _measure(args, budget, sim, controller, scratch, listener)
        finally:
            await controller.stop()
            await sim.stop()


async def _measure(
    args: argparse.Namespace, budget: Budget, sim: SimServer, controller: VirtualController,
    scratch: Path, listener: socket.socket,
) -> dict[str, Any]:
    info = sim.ready_info()
    env = {**os.environ, "NOTIFY_SOCKET": str(scratch / "notify.sock"),
           API_KEY_ENV: info["api_key"], SECRET_ENV: info["client_secret"]}
    config = _config(sim, controller, scratch, args.log_level)
    loop = asyncio.get_running_loop()
    if not args.from_source:
        await _write_bytecode(config, env, listener)
    # the libraries in use alone (bench/agent.py's floor), in the same budget before the agent:
    # what any agent on these libraries needs before it can be ready at this share of a core;
    # run once outside it first, as the agent is, so its bytecode is written (as installed)
    if not args.from_source:
        await library_floor(IN_USE_CODE)
    floor_s, _, floor_cpu_s = await library_floor(IN_USE_CODE, preexec_fn=budget.enter)
    probe = scratch / "probe"
    launcher = [agent_probe.LAUNCHER, str(probe)] if args.profile else ["-m", "kiosk_agent"]
    probe.mkdir()
    throttled_at_spawn = budget.throttled()
    spawned = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *launcher, "run", "--config", str(config),
        env=_agent_env(env), stdout=asyncio.subprocess.DEVNULL, preexec_fn=budget.enter,
        cwd=os.environ.get("BENCH_AGENT_PATH"),
    )
    try:
        while not (await asyncio.wait_for(loop.sock_recv(listener, 1024), 60)).startswith(
            b"READY=1"
        ):
            pass
        ready_s = time.perf_counter() - spawned
        # the agent's CPU by then: at a tenth of a core a start is about ten times it, so this
        # says what a cut of CPU moved where one start's wall time is too noisy to
        ready_cpu_s = _cpu_ns(proc.pid) / 1e9
        throttled_to_ready = budget.throttled() - throttled_at_spawn
        await asyncio.wait_for(controller.wait_enabled(), 30)
        await asyncio.sleep(2.0)  # start-up work settles (first pings, recovery)
        cpu_before, wall_before = _cpu_ns(proc.pid) / 1e9, time.perf_counter()
        await asyncio.sleep(args.idle_seconds)
        idle = (_cpu_ns(proc.pid) / 1e9 - cpu_before) / (time.perf_counter() - wall_before)

        window_cpu = WindowCpu(proc.pid)
        controller.observers.append(window_cpu)
        rng = random.Random(1)
        throttled_before = budget.throttled()
        if args.profile:
            await agent_probe.request(probe, "profile.start")
        cpu_before, started = _cpu_ns(proc.pid) / 1e9, time.perf_counter()
        for _ in range(args.sales):  # back to back: how many a minute the budget serves
            await asyncio.wait_for(controller.customer(rng.choice(sorted(PRODUCTS))), 30)
        elapsed = time.perf_counter() - started
        if args.profile:
            await agent_probe.request(probe, "profile.stop", within_s=120)
            shutil.copy(probe / "profile.pstats", args.profile)
        sale_cpu = (_cpu_ns(proc.pid) / 1e9 - cpu_before) / args.sales
        throttled = budget.throttled() - throttled_before
        back_to_back = _latencies(controller.visits)
        back_to_back_cpu = window_cpu.of(controller.visits)
        first_alone = len(controller.visits)
        for _ in range(args.sales):  # one at a time: what each customer waits
            await asyncio.sleep(args.gap_ms / 1000)
            await asyncio.wait_for(controller.customer(rng.choice(sorted(PRODUCTS))), 30)
        alone = _latencies(controller.visits[first_alone:])
        alone_cpu = window_cpu.of(controller.visits[first_alone:])
        peak_mb = _status_kb(proc.pid, "VmHWM") / 1024
    finally:
        proc.terminate()
        await proc.wait()
    return {
        "cgroup_version": budget.version,
        "cpu_limit_percent": round(budget.quota_us / budget.period_us * 100, 1),
        "cpu_period_ms": budget.period_us / 1000,
        "memory_limit_mb": budget.memory_bytes // (1024 * 1024),
        "start_to_ready_s": round(ready_s, 3),
        "start_cpu_s": round(ready_cpu_s, 3),  # user + system, spawn to READY=1
        # the start's wall time beyond its CPU at the budget's share (a sleep, a retry, a wait
        # for the service on the way to READY=1), and the periods the quota stopped it meanwhile
        "start_wall_beyond_cpu_s": round(ready_s - ready_cpu_s * budget.period_us / budget.quota_us,
                                         3),
        "periods_throttled_to_ready": throttled_to_ready,
        "floor_start_s": round(floor_s, 3),  # the libraries in use alone, in the same budget
        "floor_start_cpu_s": round(floor_cpu_s, 3),
        "start_above_floor_s": round(ready_s - floor_s, 3),
        "vend_answer_p50_ms": round(percentile(alone, 0.5), 1),
        "vend_answer_p99_ms": round(percentile(alone, 0.99), 1),
        "vend_answer_max_ms": round(max(alone), 1),
        "back_to_back_vend_answer_p50_ms": round(percentile(back_to_back, 0.5), 1),
        "back_to_back_vend_answer_p99_ms": round(percentile(back_to_back, 0.99), 1),
        "vend_window_agent_cpu_p50_ms": round(percentile(alone_cpu, 0.5), 2),
        "vend_window_agent_cpu_p99_ms": round(percentile(alone_cpu, 0.99), 2),
        "back_to_back_vend_window_agent_cpu_p50_ms": round(percentile(back_to_back_cpu, 0.5), 2),
        "back_to_back_vend_window_agent_cpu_p99_ms": round(percentile(back_to_back_cpu, 0.99), 2),
        "sales_vended": len(back_to_back) + len(alone),
        "sales_per_minute_one_terminal": round(args.sales / elapsed * 60, 1),
        "agent_cpu_ms_per_sale": round(sale_cpu * 1000, 1),
        "idle_cpu_percent": round(idle * 100, 3),
        "peak_rss_mb": round(peak_mb, 1),
        "bytecode": int(not args.from_source),  # 1: as installed
        "periods_throttled_during_sales": throttled,
        "load_average_after": load_average(),  # the machine's, beside the figures it moves
    }


def _latencies(visits: list[Any]) -> list[float]:
    """Vend request -> approve of each vended visit, ms, the card's time taken off."""
    card_s = CARD_DELAY_SIM_S / TIME_SCALE
    answered = [v for v in visits
                if v.outcome is VisitOutcome.VENDED and v.answered_at and v.requested_at]
    if not answered:
        raise RuntimeError("no vend was approved: is the agent running? (see its log above)")
    return [((v.answered_at or 0) - (v.requested_at or 0) - card_s) * 1000 for v in answered]


async def _write_bytecode(config: Path, env: dict[str, str], listener: socket.socket) -> None:
    """One run outside the budget, to READY=1 and a second more: it writes the bytecode of
    what a run imports, as pip's install would have."""
    loop = asyncio.get_running_loop()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kiosk_agent", "run", "--config", str(config),
        env=_agent_env(env), stdout=asyncio.subprocess.DEVNULL,
        cwd=os.environ.get("BENCH_AGENT_PATH"),
    )
    try:
        while not (await asyncio.wait_for(loop.sock_recv(listener, 1024), 60)).startswith(
            b"READY=1"
        ):
            pass
        await asyncio.sleep(1.0)
    finally:
        proc.terminate()
        await proc.wait()


def _agent_env(env: dict[str, str]) -> dict[str, str]:
    """``--agent-path``: that tree first on the agent's path (and its working directory, where
    the spawn runs: ``-m`` puts the working directory first)."""
    other_tree = os.environ.get("BENCH_AGENT_PATH")
    return {**env, "PYTHONPATH": other_tree} if other_tree else env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-percent", type=float, default=10.0)
    parser.add_argument("--period-ms", type=float, default=10.0)
    parser.add_argument("--memory-mb", type=int, default=128)
    # 200: the p99 is then the second slowest sale, not the slowest (as with 60)
    parser.add_argument("--log-level", choices=("WARNING", "INFO"), default="INFO",
                        help="the agent's logging level (INFO: a unit's default, a line a sale; "
                             "figures before 2026-11-29 13:00 UTC were read at WARNING)")
    parser.add_argument("--sales", type=int, default=200)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--gap-ms", type=float, default=150.0,
                        help="between one customer's vend and the next one's, when timed alone")
    parser.add_argument("--from-source", action="store_true",
                        help="the agent as the environment is, not compiled beforehand")
    parser.add_argument("--profile", type=Path, default=None, metavar="FILE",
                        help="cProfile the agent over the back-to-back sales (its loop's thread), "
                             "statistics to FILE; prints the top functions and the event loop's "
                             "turns per sale (the figures then carry the profiler's cost)")
    parser.add_argument("--agent-path", type=Path, default=None, metavar="DIR",
                        help="the measured agent (only it) from the kiosk_agent in DIR, a "
                             "worktree of another commit: the same bench, simulator and "
                             "controller read an older agent (as bench/agent.py's)")
    args = parser.parse_args()
    os.environ.update(unit_environment())  # the agent as its systemd unit runs it
    if args.agent_path:
        os.environ["BENCH_AGENT_PATH"] = str(args.agent_path.resolve())
        print(f"the measured agent: {agent_imported_from(args.agent_path.resolve())}")
    budget = Budget(args.cpu_percent, args.period_ms, args.memory_mb)
    load_before = load_average()
    try:
        budget.create()
    except CgroupUnavailable as err:
        print(f"bench/pi.py: {err}", file=sys.stderr)
        print(json.dumps({"error": str(err)}))
        return 2
    try:
        figures = asyncio.run(run(args, budget)) | {"load_average_before": load_before}
    finally:
        budget.remove()
    targets = {"start_to_ready_s": 5, "vend_answer_p99_ms": 100,
               "back_to_back_vend_answer_p99_ms": 150, "idle_cpu_percent": 0.1}
    if args.profile:
        print_profile(args.profile, args.sales)
    print(f"kiosk-agent run in a cgroup v{budget.version}: {figures['cpu_limit_percent']} % of "
          f"one core per {figures['cpu_period_ms']:g} ms, {figures['memory_limit_mb']} MB")
    for name, value in figures.items():
        limit = targets.get(name)
        verdict = f"   (target < {limit}: {'ok' if value < limit else 'MISSED'})" if limit else ""
        print(f"  {name:34} {value}{verdict}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
