"""Start-up of the command line: how long a field tech waits for an answer.

    python bench/start.py [--runs 5] [--from-source]

Each command runs ``--runs`` times in a fresh ``python -m kiosk_agent`` (median wall time, and
the CPU time it used, from the kernel's accounting of the child: on a loaded machine the CPU
time is the steadier figure), round by round with the floors so a busy machine slows both
alike (each wall time is printed with the load average while it ran and the share of it the
process ran, ``cpu/wall``: well under 1, the wall time is the machine's load), in the venv as
``./dev`` makes it (its modules and the project's compiled to bytecode) and two environments:
``PYTHONDONTWRITEBYTECODE=1`` (as in many container images: bytecode is read, never written)
and without it. Targets (issue 32):

- ``check-config``, ``sales``, ``terminals``, ``health`` and ``doctor --help``: under 0.3 s
  each. ``terminals -c config/demo.yaml`` (its admin API on a port where no agent listens)
  says at once that no agent runs on it and names its readers, exit 4 (no simulator is started
  for it: docs/cli.md); ``terminals_agent`` is the same command on a unit whose agent runs
  meanwhile (it asks that agent); ``health`` asks a running agent's admin API, here one that
  is not running (the command's answer then: exit 4 at once); ``sales`` reads a journal;
- ``--version``, ``--help``, every command's ``--help`` and ``completion bash|zsh|fish``: under
  0.2 s each (the scripts are static: no Python runs when the user presses Tab).

Floors: ``python -c pass``, ``import kiosk_agent``, ``import aiohttp`` and the libraries the
commands may use; ``*_over_python`` is a command's wall time over ``python -c pass``'s and
``*_over_aiohttp_import`` over ``python -c "import aiohttp"``'s, figures that travel between
machines (and between a quiet and a loaded minute of a shared one).
``--from-source`` gives each run an empty bytecode cache it cannot write
(``PYTHONPYCACHEPREFIX``, ``PYTHONDONTWRITEBYTECODE``): every module compiled at every start, as
before ``./dev`` compiled them, the standard library's too (which a distribution ships compiled:
an upper bound, and ``python -c pass`` is no floor there).

(start -> ready of ``kiosk-agent run`` against the library floor is ``bench/agent.py``.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kiosk_agent.cli import COMMAND_HELP  # noqa: E402  (the repository's package, not another)

LIBRARIES = "aiohttp, pydantic, voluptuous, yaml, serial, aiomqtt"
SHELLS = ("bash", "zsh", "fish")
QUICK_S = 0.2  # --version, --help, a command's --help, a completion script
COMMAND_S = 0.3  # check-config, sales, terminals, health, doctor --help
TIMED_COMMANDS = ("check_config", "sales", "terminals", "terminals_agent", "health", "doctor_help")
# exit codes a run may end with and still be the command's answer
ANSWERS = {"terminals": (4,), "terminals_agent": (0, 1), "health": (4,)}
ENVIRONMENTS = {"dontwrite": {"PYTHONDONTWRITEBYTECODE": "1"}, "default": {}}


def commands(config: Path, agents: Path) -> dict[str, list[str]]:
    """figure name -> the arguments of ``python`` that run it (``agents``: the configuration
    of the agent running meanwhile)."""
    cli = [sys.executable, "-m", "kiosk_agent"]
    runs = {
        "floor_python": [sys.executable, "-c", "pass"],
        "floor_package_import": [sys.executable, "-c", "import kiosk_agent"],
        "floor_cli_import": [sys.executable, "-c", "import kiosk_agent.cli"],
        "floor_libraries_import": [sys.executable, "-c", f"import {LIBRARIES}"],
        "floor_aiohttp_import": [sys.executable, "-c", "import aiohttp"],
        "check_config": [*cli, "check-config", str(config)],
        "sales": [*cli, "sales", "-c", str(config)],
        "terminals": [*cli, "terminals", "-c", str(config)],
        "terminals_agent": [*cli, "terminals", "-c", str(agents)],
        "health": [*cli, "health", "-c", str(config), "--timeout", "5"],
        "doctor_help": [*cli, "doctor", "--help"],
        "version": [*cli, "--version"],
        "help": [*cli, "--help"],
    }
    for name in COMMAND_HELP:
        runs[f"help_{name.replace('-', '_')}"] = [*cli, name, "--help"]
    for shell in SHELLS:
        runs[f"completion_{shell}"] = [*cli, "completion", shell]
    return runs


def demo_unit(directory: Path) -> Path:
    """config/demo.yaml with its journal (made, empty) in ``directory`` and an admin API on a
    port where no agent listens."""
    from kiosk_agent.sales.journal import Journal

    journal = directory / "journal.db"
    opened = Journal(journal)
    opened.open()
    opened.close()
    config = directory / "demo.yaml"
    text = (ROOT / "config" / "demo.yaml").read_text()
    text = text.replace("path: ~/.local/state/kiosk-agent/demo-journal.db", f"path: {journal}")
    config.write_text(f"{text}\nadmin:\n  port: 9\n  tokens: [{{name: bench, token: !env_var "
                      f"KIOSK_BENCH_TOKEN}}]\n")
    os.environ["KIOSK_BENCH_TOKEN"] = secrets.token_urlsafe(24)  # made for the run
    return config


def agent_unit(directory: Path) -> Path:
    """A unit on the embedded simulator whose agent runs while the figures are taken:
    ``terminals_agent`` asks it for its simulator's readers (without it, the command would say
    that no agent runs, as ``terminals`` does here)."""
    with socket.socket() as probe:  # a free port for its admin API
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = directory / "agent.yaml"
    config.write_text(
        "service: {simulator: {time_scale: 60}}\n"
        "terminals: [{device_id: SIM-0001, name: front}]\n"
        f"journal: {{path: {directory / 'agent-journal.db'}}}\n"
        "logging: {level: WARNING}\n"
        f"admin: {{port: {port}, tokens: [{{name: bench, token: !env_var KIOSK_BENCH_TOKEN}}]}}\n"
    )
    return config


@contextlib.contextmanager
def running_agent(config: Path) -> Iterator[None]:
    """``kiosk-agent run`` on ``config`` for as long as the block runs, its admin API answering."""
    agent = subprocess.Popen([sys.executable, "-m", "kiosk_agent", "run", "-c", str(config)],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = int(config.read_text().split("admin: {port: ")[1].split(",")[0])
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if agent.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the agent on {config} did not start") from None
                time.sleep(0.2)
        yield
    finally:
        agent.terminate()
        agent.wait(timeout=60)


# Run in a fresh Python: the commands given (JSON), then every module they imported from a .py
# file whose bytecode is missing or older than it: each is compiled from source at every start
# where PYTHONDONTWRITEBYTECODE is set (./dev compiles the venv's and the checkout's).
UNCOMPILED_PROBE = """\
import contextlib, importlib.util, io, json, os, sys
from kiosk_agent.cli import main
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        with contextlib.suppress(SystemExit):
            main(argv)
stale = []
for name, module in list(sys.modules.items()):
    source = getattr(module, "__file__", None) or ""
    if not source.endswith(".py"):
        continue
    compiled = importlib.util.cache_from_source(source)
    if not os.path.exists(compiled) or os.path.getmtime(compiled) < os.path.getmtime(source):
        stale.append(name)
print(json.dumps(sorted(stale)))
"""


def uncompiled(argvs: dict[str, list[str]]) -> list[str]:
    """The modules the timed commands import that have no up-to-date bytecode."""
    commands = [argv[3:] for name, argv in argvs.items() if name in TIMED_COMMANDS]
    env = environment("dontwrite", None)
    done = subprocess.run([sys.executable, "-c", UNCOMPILED_PROBE, json.dumps(commands)],
                          env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    stale: list[str] = json.loads(done.stdout.splitlines()[-1])
    return stale


def run_once(name: str, argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in ANSWERS.get(name, (0,)):
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def environment(name: str, cache: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE",
                                                            "PYTHONPYCACHEPREFIX", "KIOSK_CONFIG")}
    env.update(ENVIRONMENTS[name])
    if cache is not None:  # --from-source: an empty cache, never written
        env.update(PYTHONPYCACHEPREFIX=str(cache), PYTHONDONTWRITEBYTECODE="1")
    return env


def measure(argvs: dict[str, list[str]], runs: int, from_source: bool) -> dict[str, float]:
    """figure -> value: each command's median wall and CPU time in each environment."""
    with tempfile.TemporaryDirectory(prefix="bench-start-cache-") as scratch:
        cache = Path(scratch) if from_source else None
        envs = {name: environment(name, cache) for name in ENVIRONMENTS}
        walls: dict[str, list[float]] = {}
        cpus: dict[str, list[float]] = {}
        loads: dict[str, list[float]] = {}
        for _ in range(runs):  # round by round: a burst of load hits floors and commands alike
            for env_name, env in envs.items():
                for name, argv in argvs.items():
                    wall, cpu = run_once(name, argv, env)
                    walls.setdefault(f"{name}_{env_name}", []).append(wall)
                    cpus.setdefault(f"{name}_{env_name}", []).append(cpu)
                    loads.setdefault(f"{name}_{env_name}", []).append(os.getloadavg()[0])
    result: dict[str, float] = {}
    for key in walls:
        result[f"{key}_s"] = round(statistics.median(walls[key]), 3)
        result[f"{key}_cpu_s"] = round(statistics.median(cpus[key]), 3)
        # the share of its wall time the process ran: near 1 on a quiet machine; well under it,
        # the wall time is the machine's load, not the command's own work
        ratios = [cpu / wall for cpu, wall in zip(cpus[key], walls[key], strict=True) if wall]
        result[f"{key}_cpu_over_wall"] = round(statistics.median(ratios), 2)
        result[f"{key}_load_average"] = round(statistics.median(loads[key]), 2)
    for env_name in ENVIRONMENTS:
        python = result[f"floor_python_{env_name}_s"]
        aiohttp = result[f"floor_aiohttp_import_{env_name}_s"]
        for name in argvs:
            if not name.startswith("floor_python"):
                ratio = result[f"{name}_{env_name}_s"] / python
                result[f"{name}_{env_name}_over_python"] = round(ratio, 1)
            if name in TIMED_COMMANDS:  # a figure that travels: python's start and aiohttp's
                ratio = result[f"{name}_{env_name}_s"] / aiohttp
                result[f"{name}_{env_name}_over_aiohttp_import"] = round(ratio, 2)
        helps = [n for n in argvs if n.startswith("help_")]
        if helps:
            result[f"slowest_command_help_{env_name}_s"] = max(
                result[f"{n}_{env_name}_s"] for n in helps)
        timed = [n for n in TIMED_COMMANDS if n in argvs]
        if timed:
            result[f"slowest_timed_command_{env_name}_s"] = max(
                result[f"{n}_{env_name}_s"] for n in timed)
    return result


def measured_under(result: dict[str, float], name: str) -> str:
    """A wall time's circumstances: the load average while it ran, and the share of it the
    process itself ran (CPU over wall)."""
    key = name.removesuffix("_s")
    if f"{key}_load_average" not in result:
        return ""
    return (f"   [load {result[f'{key}_load_average']}, cpu/wall "
            f"{result[f'{key}_cpu_over_wall']}]")


def targets() -> dict[str, float]:
    limits: dict[str, float] = {}
    for env_name in ENVIRONMENTS:
        for name in TIMED_COMMANDS:
            limits[f"{name}_{env_name}_s"] = COMMAND_S
        for name in ("version", "help", "slowest_command_help"):
            limits[f"{name}_{env_name}_s"] = QUICK_S
        for shell in SHELLS:
            limits[f"completion_{shell}_{env_name}_s"] = QUICK_S
    return limits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="rounds of every command (median)")
    parser.add_argument("--from-source", action="store_true",
                        help="an empty bytecode cache, never written: every module compiled")
    parser.add_argument("--only", metavar="NAMES",
                        help="these figures alone (comma-separated: check_config,sales,...; "
                        "the floors always run): a quick look at a few commands")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-start-") as scratch:
        argvs = commands(demo_unit(Path(scratch)), agent_unit(Path(scratch)))
        if args.only:
            wanted = set(args.only.split(",")) - set(argvs)
            if wanted:
                raise SystemExit(f"--only: no such figure: {', '.join(sorted(wanted))}")
            argvs = {name: argv for name, argv in argvs.items()
                     if name.startswith("floor_") or name in args.only.split(",")}
        with running_agent(Path(scratch) / "agent.yaml") if "terminals_agent" in argvs else (
                contextlib.nullcontext()):
            stale = uncompiled(argvs)  # before the runs without the variable write any
            result = measure(argvs, args.runs, args.from_source)
    load = os.getloadavg()[0]
    how = "from source (every module compiled)" if args.from_source else "bytecode as ./dev makes"
    print(f"load average {load_before:.1f} before, {load:.1f} after, on {os.cpu_count()} cores "
          f"(a loaded machine slows every figure: read the ratios to python -c pass and to "
          f"import aiohttp); {how}; median of {args.runs}")
    limits = targets()
    for name, value in result.items():
        if name.endswith(("_cpu_over_wall", "_load_average")):
            continue  # printed with their figure
        limit = limits.get(name)
        verdict = f"   (target < {limit}: {'ok' if value < limit else 'MISSED'})" if limit else ""
        print(f"{name:48} {value}{verdict}{measured_under(result, name)}")
    missed = sorted(name for name, limit in limits.items()
                    if name in result and result[name] >= limit)
    print(f"modules the timed commands import without up-to-date bytecode: {len(stale)}"
          + (f" ({', '.join(stale)}; ./dev compiles them)" if stale else ""))
    print(f"targets missed: {', '.join(missed) or 'none'}")
    extra = {"load_average": round(load, 2), "load_average_before": round(load_before, 2),
             "from_source": int(args.from_source), "uncompiled_modules": len(stale),
             "targets_missed_count": len(missed)}
    print(json.dumps(result | extra))


if __name__ == "__main__":
    main()
