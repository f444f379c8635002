"""The command line's waits and long pulls on its status line (stderr, :data:`contract.STATUS`):
``waiting for the service at ...: 3 s`` while a call is slow, ``scanned 12,000 transactions``
while a report is pulled. Imported by the commands that wait on the service, the simulator or a
unit (and by ``report`` for its progress), not by ``run``: an agent draws no status line."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from kiosk_agent.cli.contract import STATUS, StatusLine, plural

T = TypeVar("T")

WAIT_LINE_AFTER_S = 1.0  # a call quicker than this draws no waiting line


def _waiting_line(what: str, waited: float, limit_s: float) -> str:
    return (f"waiting for {what}: {waited:.0f} s (gives up after {limit_s:g} s per request, "
            "--timeout)")


@contextlib.asynccontextmanager
async def waiting(
    what: str, limit_s: float, status: StatusLine | None = None
) -> AsyncIterator[None]:
    """While the block runs, after a second: ``waiting for <what>: 3 s (gives up after 10 s
    per request, --timeout)`` on ``status`` (the command's, :data:`contract.STATUS`, unless
    given); wiped when the block ends."""
    line = status or STATUS
    if not line.live:
        yield
        return
    import asyncio

    task = asyncio.create_task(_tick(line, what, limit_s))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        line.clear()


def wait_in_thread(
    what: str, limit_s: float, call: Callable[[], T], status: StatusLine | None = None
) -> T:
    """``call()`` in a thread of its own, for a command without an event loop: bounded by
    ``limit_s`` (TimeoutError after it; the thread is left to end on its own), with the
    waiting line :func:`waiting` draws shown meanwhile."""
    import threading

    line = status or STATUS
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(call())
        except BaseException as err:  # noqa: BLE001 - raised on the waiting thread
            errors.append(err)

    worker = threading.Thread(target=run, name="command-request", daemon=True)
    worker.start()
    started = time.monotonic()
    pause = WAIT_LINE_AFTER_S
    try:
        while True:
            worker.join(max(0.0, min(pause, started + limit_s - time.monotonic())))
            if not worker.is_alive():
                break
            waited = time.monotonic() - started
            if waited >= limit_s:
                raise TimeoutError(f"no answer within {limit_s:g} s")
            line.show(_waiting_line(what, waited, limit_s))
            pause = 1.0
    finally:
        line.clear()
    if errors:
        raise errors[0]
    return results[0]


async def _tick(line: StatusLine, what: str, limit_s: float) -> None:
    import asyncio

    started = time.monotonic()
    await asyncio.sleep(WAIT_LINE_AFTER_S)
    while True:
        line.show(_waiting_line(what, time.monotonic() - started, limit_s))
        await asyncio.sleep(1.0)


class Progress:
    """A long pull on stderr: ``scanned 12,000 transactions, matched 340 (8,100/s)`` redrawn on a
    terminal, a line every few seconds in a log; then one clean final line."""

    INTERVAL_S = 0.5  # redraw on a terminal
    PLAIN_INTERVAL_S = 5.0  # one line per this many seconds when stderr is a file or pipe

    def __init__(self, noun: str, *, quiet: bool = False, status: StatusLine | None = None) -> None:
        self.noun = noun
        self.quiet = quiet
        self.status = status or STATUS
        self.started = time.monotonic()
        self._shown = self.started
        self.scanned = 0
        self.matched = 0

    def tick(self, *, scanned: int, matched: int) -> None:
        self.scanned, self.matched = scanned, matched
        if self.quiet or scanned % 64:  # the clock is read every 64 records, not each one
            return
        now = time.monotonic()
        live = self.status.live
        if now - self._shown < (self.INTERVAL_S if live else self.PLAIN_INTERVAL_S):
            return
        self._shown = now
        line = f"{self._counts()} ({scanned / max(now - self.started, 1e-9):,.0f}/s)"
        if live:
            self.status.show(line)
        else:
            self.status.done(line)

    def done(self) -> None:
        if self.quiet:
            return
        elapsed = time.monotonic() - self.started
        self.status.done(f"{self._counts()} in {elapsed:.1f} s")

    def _counts(self) -> str:
        if self.scanned == self.matched:
            return plural(self.matched, self.noun)
        return f"scanned {plural(self.scanned, self.noun)}, matched {self.matched:,}"
