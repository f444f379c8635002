"""The one clock the sale code reads: wall time for records, monotonic time for every wait.

A Raspberry Pi has no real-time clock: its wall clock starts from a saved file and NTP then steps
it, by hours or days, either way. So inside a run every wait, deadline, lifetime, back-off and
sweep is measured on the monotonic clock, and the wall clock only dates records for people.

Across a restart a deadline is re-anchored from what the journal kept when it was set: the wall
time, the monotonic time and the boot id (:class:`Anchor`). On the same boot the monotonic
difference is the exact elapsed time. On another boot (or an unknown one) it cannot be known, so
:func:`remaining` waits what the wall clock says is left, never less than the time this boot
cannot account for, and at most one full window.

:class:`SystemClock` is the real one; ``FakeClock`` (sales/fake_clock.py, imported by the tests
from here too) is moved by tests (``advance`` fires due sleeps in order; ``step_wall`` steps the
wall clock alone, as NTP does).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Coroutine, Generator
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from kiosk_agent.data_class import data_class

# asyncio is imported where a wait is made: a command that reads the journal (`sales`) imports
# this module and never waits, and asyncio's import was a third of that command's start

T = TypeVar("T")

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


class Clock(Protocol):
    """What the sale code asks of time; one object per agent, injected."""

    def time(self) -> float:
        """Wall time (Unix seconds): for records and display only, never for a duration."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never steps: every wait and deadline inside a run."""
        ...

    def since_boot(self) -> float | None:
        """Real seconds since this boot began, at least (None: unknown)."""
        ...

    def boot_id(self) -> str | None:
        """This boot's id (None: unknown): monotonic times compare only within one boot."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    async def wait_for(self, awaitable: Awaitable[T], seconds: float) -> T:
        """``awaitable``'s result, or TimeoutError (and it is cancelled) after ``seconds``."""
        ...


class SystemClock:
    """The machine's clocks."""

    def __init__(self, boot_id_path: Path = BOOT_ID_PATH) -> None:
        self._boot_id = _read_boot_id(boot_id_path)

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def since_boot(self) -> float | None:
        boottime = getattr(time, "CLOCK_BOOTTIME", None)
        if boottime is None or self._boot_id is None:
            return None
        return time.clock_gettime(boottime)

    def boot_id(self) -> str | None:
        return self._boot_id

    async def sleep(self, seconds: float) -> None:
        import asyncio

        await asyncio.sleep(seconds)

    async def wait_for(self, awaitable: Awaitable[T], seconds: float) -> T:
        import asyncio

        # asyncio.timeout, not asyncio.wait_for: on 3.11 wait_for runs the awaitable in a task
        # of its own (two more loop turns per money call and card wait), and can swallow a
        # cancel that lands with the result
        async with asyncio.timeout(seconds):
            return await awaitable


async def wait_at_most(clock: Clock, work: Coroutine[Any, Any, T], seconds: float) -> T:
    """``clock.wait_for(work, seconds)``, with nothing armed for work that ends at its first step.

    ``work`` runs here to its first wait: ended there (a dispenser whose outcome is known at
    once, an app that does not confirm its dispense), its result is returned and no timeout is
    entered, no timer armed and cancelled (some fifteen Python calls a kiosk API sale). Else it
    goes on from that wait under the bound, cancelled by it as ``wait_for`` cancels; the bound
    counts from its first wait, microseconds after the call."""
    try:
        waiting_on = work.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    return await clock.wait_for(_Resumed(work, waiting_on), seconds)


class _Resumed(Generic[T]):
    """A coroutine run by hand to its first wait, awaited from there: what ``await`` does with
    a fresh one (PEP 380's ``yield from``: sends, throws and closes passed on)."""

    __slots__ = ("_waiting_on", "_work")

    def __init__(self, work: Coroutine[Any, Any, T], waiting_on: Any) -> None:
        self._work, self._waiting_on = work, waiting_on

    def __await__(self) -> Generator[Any, Any, T]:
        work, waiting_on = self._work, self._waiting_on
        while True:
            try:
                sent = yield waiting_on
            except GeneratorExit:
                work.close()
                raise
            except BaseException as thrown:  # noqa: BLE001  # a cancel (the bound's): the work handles it
                try:
                    waiting_on = work.throw(thrown)
                except StopIteration as done:
                    result: T = done.value
                    return result
            else:
                try:
                    waiting_on = work.send(sent)
                except StopIteration as done:
                    result = done.value
                    return result


def _read_boot_id(path: Path) -> str | None:
    # bytes decoded, not a text file: ``open(encoding="ascii")`` looks the codec up by name and
    # imports ``encodings.ascii`` for this one read (some 25 KiB an idle agent kept); ``decode``
    # knows ASCII without the codec registry
    try:
        text = path.read_bytes().decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


SYSTEM_CLOCK = SystemClock()


@data_class(frozen=True, slots=True)
class Anchor:
    """One moment as the journal keeps it, to measure from after a restart."""

    wall: float
    mono: float | None = None
    boot: str | None = None

    @classmethod
    def now(cls, clock: Clock) -> Anchor:
        return cls(clock.time(), clock.monotonic(), clock.boot_id())

    def same_boot(self, clock: Clock) -> bool:
        return self.mono is not None and self.boot is not None and self.boot == clock.boot_id()


def elapsed_at_least(clock: Clock, anchor: Anchor) -> float:
    """Real seconds since ``anchor``, or a lower bound of them when they cannot be known.

    Same boot: exact (monotonic). Another boot: at least as long as this boot has run. Wall time
    is never trusted for it: a step of any size either way would count.
    """
    if anchor.same_boot(clock):
        if anchor.mono is None:
            raise RuntimeError("an anchor of this boot without its monotonic time")
        return max(0.0, clock.monotonic() - anchor.mono)
    return clock.since_boot() or 0.0


def remaining(clock: Clock, anchor: Anchor, window: float) -> float:
    """Seconds still to wait of a ``window`` that began at ``anchor``.

    Same boot: exact. Otherwise what the wall clock says is left, but never less than the part of
    the window this boot cannot account for (so a forward step cannot shorten it), and at most one
    full window (so a backward step cannot stretch it).
    """
    if anchor.same_boot(clock):
        return max(0.0, window - elapsed_at_least(clock, anchor))
    by_wall = anchor.wall + window - clock.time()
    floor = window - elapsed_at_least(clock, anchor)
    return min(window, max(by_wall, floor, 0.0))


async def next_turn() -> None:
    """Let the event loop run what else is ready, once (a sale's step, a request): no time
    passes, on any clock, so a module of sales/ may call it without reading a real one."""
    import asyncio

    await asyncio.sleep(0)


def __getattr__(name: str) -> Any:
    """``FakeClock``, where the tests take it, from the module of its own it lives in: a test's
    clock is no part of a running agent (its code was half of this module's)."""
    if name == "FakeClock":
        from kiosk_agent.sales.fake_clock import FakeClock

        return FakeClock
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
