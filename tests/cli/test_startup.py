"""The command line answers at once: ``--version`` imports nothing of the agent and ``--help``
imports no command module (on a Pi Zero each heavy import costs a field tech seconds)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from kiosk_agent import __version__
from kiosk_agent.cli import COMMAND_HELP, COMMAND_MODULES, build_parser

HEAVY = ("aiohttp", "kiosk_agent.sim", "kiosk_agent.admin", "kiosk_agent.core", "pydantic")


def modules_after(argv: list[str]) -> tuple[str, set[str]]:
    """Run ``kiosk-agent ARGV`` in a fresh Python; its output and every module it imported."""
    probe = (
        "import contextlib, io, json, sys\n"
        "from kiosk_agent.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        f"    main({argv!r})\n"
        "print(json.dumps([out.getvalue(), sorted(sys.modules)]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=60)
    output, modules = json.loads(done.stdout.splitlines()[-1])
    return output, set(modules)


def imported(modules: set[str], package: str) -> list[str]:
    return sorted(m for m in modules if m == package or m.startswith(package + "."))


def test_version_imports_neither_aiohttp_nor_the_simulator_nor_the_admin_page() -> None:
    output, modules = modules_after(["--version"])
    assert output == f"kiosk-agent {__version__}\n"
    for package in HEAVY:
        assert imported(modules, package) == [], package
    assert imported(modules, "kiosk_agent.cli") == ["kiosk_agent.cli"]


@pytest.mark.parametrize("argv", [["--help"], []])
def test_the_overview_imports_no_command_module(argv: list[str]) -> None:
    output, modules = modules_after(argv)
    assert "check-config" in output
    assert "completion" in output
    for package in ("aiohttp", "kiosk_agent.sim", "kiosk_agent.admin", "kiosk_agent.core"):
        assert imported(modules, package) == [], package
    assert imported(modules, "kiosk_agent.cli") == ["kiosk_agent.cli", "kiosk_agent.cli.contract"]


def test_the_overview_says_of_each_command_what_its_module_does() -> None:
    registered = {}
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            registered = {choice.dest: choice.help for choice in action._choices_actions}
    assert registered == COMMAND_HELP
    assert set(COMMAND_MODULES) == set(COMMAND_HELP)
