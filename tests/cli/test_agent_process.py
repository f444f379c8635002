"""The process helpers themselves: a signal the test sends never takes a child's exit code.

asyncio (before Python 3.13) learns a child's exit code from a watcher thread blocked in
``waitpid``. A signal sent through ``Process.send_signal`` first polls the child with its own
``waitpid``; when the child has just ended, that poll can reap it before the thread, which then
reports 255 (CPython gh-87744). That is how a storm of signals sent to an agent already
exiting read 255 for its exit code, now and then, on a busy machine.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.cli.contract import CONFIG_ENV

from ..assembly.crash_driver import WarmCommands
from ..helpers import until
from .agent_process import SignalledChild


def _has_ended(pid: int) -> bool:
    """The child has exited; its status stays for whoever reaps it (WNOWAIT)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


@pytest.fixture
def slow_watcher(monkeypatch: pytest.MonkeyPatch) -> Any:
    """asyncio's watcher thread held before it reaps, as a loaded machine holds it; set the
    event to let it go. (A watcher that is not a thread is not held; the test holds anyway.)"""
    real_waitpid = os.waitpid
    release = threading.Event()

    def waitpid(pid: int, options: int) -> tuple[int, int]:
        if threading.current_thread().name.startswith("asyncio-waitpid"):
            release.wait(timeout=30)
        return real_waitpid(pid, options)

    monkeypatch.setattr(os, "waitpid", waitpid)
    try:
        yield release
    finally:
        release.set()


async def test_a_signal_to_a_child_that_has_just_ended_leaves_its_exit_code_to_asyncio(
    slow_watcher: threading.Event,
) -> None:
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", "read line; exit 7", stdin=asyncio.subprocess.PIPE
    )
    child = SignalledChild(proc)
    try:
        assert proc.stdin is not None
        proc.stdin.close()  # the child ends now, with 7
        await until(lambda: _has_ended(proc.pid), timeout=10)
        child.send(signal.SIGTERM)  # a late signal, as the storm's last ones are
        slow_watcher.set()
        assert await asyncio.wait_for(proc.wait(), timeout=10) == 7
        with pytest.raises(ProcessLookupError):  # reaped: a signal says so, reaches no one
            child.send(signal.SIGTERM)
    finally:
        slow_watcher.set()
        await child.close()


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
