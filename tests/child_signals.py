"""Signals to a test's asyncio child processes that never take their exit code from asyncio.

Before Python 3.13, ``Process.send_signal`` (and ``terminate``, ``kill``) call
``Popen.send_signal``, which first polls the child (``waitpid(pid, WNOHANG)``): a child that has
just exited is reaped there, before asyncio's watcher thread can, and the watcher then reports
255 for its exit code (CPython gh-87744). A test that stops a child which may be ending by itself
then reads 255 now and then on a busy machine. Here a signal goes through a pidfd: it reaps
nothing, and reaches no other process that reuses the pid.

    child = SignalledChild(proc)      # held for the child's life: every signal through it
    send_signal(proc, signal.SIGINT)  # once; False when the child is already gone
    await stop(proc)                  # SIGKILL (or another) unless it ended, then wait
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Protocol


class Child(Protocol):
    """What a signalled child is: an asyncio process, or a command forked from the warm
    interpreter (tests/assembly/crash_driver.WarmCommand)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


class SignalledChild:
    """An asyncio child process signalled through a pidfd, never through
    ``Process.send_signal``: before Python 3.13 that calls ``Popen.send_signal``, whose poll
    (``waitpid(pid, WNOHANG)``) reaps a child that has just exited before asyncio's child
    watcher thread can, and the watcher then reports 255 for its exit code (CPython
    gh-87744). A pidfd names this one process: signalling it reaps nothing and cannot reach
    another process that reuses its pid. Once the child is reaped, a signal raises
    ProcessLookupError, as ``os.kill`` would.

    A child may be reaped before it is taken here: a warm command refused at once (a second
    agent on a claimed journal) exits and is reaped by the warm server while a starved test
    process has not yet run this line. It is taken as gone: every signal to it raises
    ProcessLookupError, and its exit code is still its waiter's (the server's word)."""

    def __init__(self, proc: Child) -> None:
        self.proc = proc
        try:
            self._pidfd: int | None = os.pidfd_open(proc.pid)
        except ProcessLookupError:
            self._pidfd = None  # reaped already: it ended

    def send(self, signum: int) -> None:
        if self._pidfd is None:
            raise ProcessLookupError(f"child {self.proc.pid} was reaped before it was signalled")
        signal.pidfd_send_signal(self._pidfd, signum)

    async def close(self) -> None:
        """Nothing left running, and the pidfd closed."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                self.send(signal.SIGKILL)
            await self.proc.wait()
        if self._pidfd is not None:
            os.close(self._pidfd)


def send_signal(proc: asyncio.subprocess.Process, signum: int) -> bool:
    """Signal ``proc`` once through a pidfd (see ``SignalledChild``); False when it is gone
    (reaped, or its exit code known), where ``Process.send_signal`` would have taken it."""
    if proc.returncode is not None:
        return False
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:  # reaped by asyncio's watcher, its exit code on the way
        return False
    try:
        signal.pidfd_send_signal(pidfd, signum)
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)
    return True


async def stop(
    proc: asyncio.subprocess.Process, signum: int = signal.SIGKILL, within: float = 30.0
) -> int:
    """``signum`` to ``proc`` unless it has ended, then its exit code (as asyncio learned it);
    SIGKILL if ``signum`` did not end it ``within`` seconds."""
    send_signal(proc, signum)
    if signum != signal.SIGKILL:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                return await proc.wait()
        send_signal(proc, signal.SIGKILL)
    return await proc.wait()
