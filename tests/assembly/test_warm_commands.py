"""The warm command server (crash_driver.WarmCommands) that AgentProcess and the crash drivers
fork agents from: each command a process of its own."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from kiosk_agent.cli.contract import CONFIG_ENV

from ..child_signals import SignalledChild
from ..helpers import until
from .crash_driver import WarmCommands


async def test_a_warm_command_is_a_process_of_its_own_run_side_by_side(tmp_path: Path) -> None:
    """What AgentProcess relies on in WarmCommands: each command a new process (neither the
    server nor this one) with its own environment and output files, several at once, each exit
    code its own, a SIGKILL's too. (Its SIGHUP as `nohup` leaves it: test_agent_signals.py.)"""
    commands = WarmCommands.shared()
    env = dict(os.environ)
    sim = commands.start(["sim", "--port", "0"], env, tmp_path / "sim.err",
                         stdout=tmp_path / "sim.out")
    said = tmp_path / "sim.out"
    await until(lambda: said.exists() and "READY " in said.read_text(), 30)
    assert sim.pid not in (os.getpid(), commands.proc.pid)
    assert sim.returncode is None  # still running, while the next one runs and ends
    # its configuration named only in the environment it was given
    missing = commands.start(["check-config"], {**env, CONFIG_ENV: str(tmp_path / "missing.yaml")},
                             tmp_path / "check.err")
    assert await missing.wait() != 0
    assert "missing.yaml" in (tmp_path / "check.err").read_text()
    child = SignalledChild(sim)
    child.send(signal.SIGKILL)
    assert await sim.wait() == -signal.SIGKILL
    await child.close()
