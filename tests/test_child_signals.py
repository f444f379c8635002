"""tests/child_signals.py: a signal the test sends never takes a child's exit code.

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
from typing import Any

import pytest

from .child_signals import SignalledChild, send_signal, stop
from .helpers import until


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


async def test_a_signal_once_to_a_child_that_has_just_ended_leaves_its_exit_code_to_asyncio(
    slow_watcher: threading.Event,
) -> None:
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", "read line; exit 7", stdin=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdin is not None
        proc.stdin.close()
        await until(lambda: _has_ended(proc.pid), timeout=10)
        assert send_signal(proc, signal.SIGTERM)  # a zombie: heard by no one, reaped by no one
        slow_watcher.set()
        assert await stop(proc, signal.SIGINT) == 7  # ended: nothing sent, its own code
        assert not send_signal(proc, signal.SIGTERM)  # gone: said, not raised
    finally:
        slow_watcher.set()
        await stop(proc)


async def test_stop_asks_then_kills_a_child_that_does_not_listen() -> None:
    polite = await asyncio.create_subprocess_exec("sleep", "60")
    assert await stop(polite, signal.SIGTERM) == -signal.SIGTERM
    deaf = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", "trap '' TERM; echo deaf; exec sleep 60", stdout=asyncio.subprocess.PIPE
    )
    assert deaf.stdout is not None
    assert await asyncio.wait_for(deaf.stdout.readline(), 10) == b"deaf\n"  # the trap is set
    assert await stop(deaf, signal.SIGTERM, within=0.2) == -signal.SIGKILL


async def test_a_child_reaped_before_it_is_taken_is_taken_as_gone() -> None:
    """A warm command refused at once exits and is reaped by its server before a starved test
    process takes it (a second agent on a claimed journal: ProcessLookupError at the pidfd)."""
    proc = await asyncio.create_subprocess_exec("/bin/sh", "-c", "exit 5")
    assert await asyncio.wait_for(proc.wait(), timeout=30) == 5  # reaped: its pid is free
    child = SignalledChild(proc)
    with pytest.raises(ProcessLookupError):  # gone: a signal says so, reaches no one
        child.send(signal.SIGTERM)
    await child.close()  # nothing to stop, nothing to close
    assert proc.returncode == 5  # its exit code is its waiter's, as it was
