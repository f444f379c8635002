"""Start-up of the command line: how long a field tech waits for an answer.

    python bench/start.py [--runs 5] [--no-bytecode]

Each command runs ``--runs`` times in a fresh ``python -m kiosk_agent`` (median wall time, and
the CPU time it used, from the kernel's accounting of the child: on a loaded machine the CPU
time is the steadier figure). Against floors run the same way, interleaved with the commands so
a busy machine slows both alike:

- ``--version`` against the floor of importing the CLI package alone (target: under 0.2 s);
- ``--help``, every command's ``--help`` and ``completion bash|zsh|fish`` (under 0.2 s each;
  the scripts are static: no Python runs when the user presses Tab);
- ``check-config config/demo.yaml`` (under 0.5 s) against the library floor: a Python importing
  only aiohttp, pydantic, voluptuous, PyYAML, pyserial and aiomqtt.

(start -> ready of ``kiosk-agent run`` against the library floor is ``bench/agent.py``.)

As installed: pip compiles the package to bytecode, so the runs read compiled modules from a
scratch cache (``PYTHONPYCACHEPREFIX``) filled by a first run of each command. With
``--no-bytecode`` the runs use what bytecode the environment has and write none: where the
package and its libraries have none (an editable checkout under ``PYTHONDONTWRITEBYTECODE``),
their modules are compiled from source on each run, as ``bench/agent.py`` runs without
``--bytecode``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kiosk_agent.cli import COMMAND_HELP  # noqa: E402  (the repository's package, not another)

LIBRARIES = "aiohttp, pydantic, voluptuous, yaml, serial, aiomqtt"
SHELLS = ("bash", "zsh", "fish")
QUICK_S = 0.2  # --version, --help, a command's --help, a completion script
CHECK_CONFIG_S = 0.5


def commands() -> dict[str, list[str]]:
    """figure name -> the arguments of ``python`` that run it."""
    cli = [sys.executable, "-m", "kiosk_agent"]
    runs = {
        "floor_cli_import": [sys.executable, "-c", "import kiosk_agent.cli"],
        "floor_libraries_import": [sys.executable, "-c", f"import {LIBRARIES}"],
        "version": [*cli, "--version"],
        "help": [*cli, "--help"],
    }
    for name in COMMAND_HELP:
        runs[f"help_{name.replace('-', '_')}"] = [*cli, name, "--help"]
    for shell in SHELLS:
        runs[f"completion_{shell}"] = [*cli, "completion", shell]
    runs["check_config_demo"] = [*cli, "check-config", str(ROOT / "config" / "demo.yaml")]
    return runs


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def measure(runs: int, bytecode: bool) -> dict[str, tuple[float, float]]:
    """figure -> (median wall, median CPU) over ``runs`` rounds of every command."""
    with tempfile.TemporaryDirectory(prefix="bench-start-") as cache:
        env = {**os.environ}
        env.pop("KIOSK_CONFIG", None)
        if bytecode:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = cache
        else:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        argvs = commands()
        if bytecode:
            for argv in argvs.values():  # the first run writes the bytecode, as pip would
                run_once(argv, env)
        walls: dict[str, list[float]] = {name: [] for name in argvs}
        cpus: dict[str, list[float]] = {name: [] for name in argvs}
        for _ in range(runs):  # round by round: a burst of load hits floors and commands alike
            for name, argv in argvs.items():
                wall, cpu = run_once(argv, env)
                walls[name].append(wall)
                cpus[name].append(cpu)
    return {name: (statistics.median(walls[name]), statistics.median(cpus[name]))
            for name in argvs}


def figures(measured: dict[str, tuple[float, float]]) -> dict[str, float]:
    floor_cli = measured["floor_cli_import"][0]
    floor_libraries = measured["floor_libraries_import"][0]
    result: dict[str, float] = {}
    for name, (wall, cpu) in measured.items():
        result[f"{name}_s"] = round(wall, 3)
        result[f"{name}_cpu_s"] = round(cpu, 3)
        if name.startswith("floor_"):
            continue
        floor = floor_libraries if name == "check_config_demo" else floor_cli
        result[f"{name}_above_floor_s"] = round(wall - floor, 3)
    helps = [name for name in measured if name.startswith("help_")]
    result["slowest_command_help_s"] = max(result[f"{name}_s"] for name in helps)
    result["slowest_completion_s"] = max(result[f"completion_{shell}_s"] for shell in SHELLS)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="rounds of every command (median)")
    parser.add_argument("--no-bytecode", action="store_true",
                        help="compile every module from source on each run")
    args = parser.parse_args()
    result = figures(measure(args.runs, bytecode=not args.no_bytecode))
    targets = {
        "version_s": QUICK_S, "help_s": QUICK_S, "slowest_command_help_s": QUICK_S,
        "slowest_completion_s": QUICK_S, "check_config_demo_s": CHECK_CONFIG_S,
    }  # fmt: skip
    load = os.getloadavg()[0]
    how = "bytecode as installed" if not args.no_bytecode else "no bytecode written"
    print(f"load average {load:.1f} on {os.cpu_count()} cores; {how}")
    for name, value in result.items():
        limit = targets.get(name)
        verdict = f"   (target < {limit}: {'ok' if value < limit else 'MISSED'})" if limit else ""
        print(f"{name:40} {value}{verdict}")
    extra = {"load_average": round(load, 2), "bytecode": int(not args.no_bytecode)}
    print(json.dumps(result | extra))


if __name__ == "__main__":
    main()
