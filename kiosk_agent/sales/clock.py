"""The one clock the sale code reads: wall time for records, monotonic time for every wait.

A Raspberry Pi has no real-time clock: its wall clock starts from a saved file and NTP then steps
it, by hours or days, either way. So inside a run every wait, deadline, lifetime, back-off and
sweep is measured on the monotonic clock, and the wall clock only dates records for people.

Across a restart a deadline is re-anchored from what the journal kept when it was set: the wall
time, the monotonic time and the boot id (:class:`Anchor`). On the same boot the monotonic
difference is the exact elapsed time. On another boot (or an unknown one) it cannot be known, so
:func:`remaining` waits what the wall clock says is left, never less than the time this boot
cannot account for, and at most one full window.

:class:`SystemClock` is the real one; :class:`FakeClock` is moved by tests (``advance`` fires due
sleeps in order; ``step_wall`` steps the wall clock alone, as NTP does).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from kiosk_agent.data_class import data_class

# asyncio is imported where a wait is made: a command that reads the journal (`sales`) imports
# this module and never waits, and asyncio's import was a third of that command's start
if TYPE_CHECKING:
    import asyncio

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
    try:
        text = path.read_text(encoding="ascii").strip()
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


class _Sleeper:
    """A test's sleep, due at ``due``: the heap orders sleeps by due, then by when they began.

    A plain class: as ``dataclass(order=True)`` it compiled seven methods at every start of the
    agent (about 1 ms of CPU here), for a clock only tests use."""

    __slots__ = ("bounds_work", "due", "future", "seq")

    def __init__(
        self, due: float, seq: int, future: asyncio.Future[None], bounds_work: bool = False
    ) -> None:
        self.due = due
        self.seq = seq
        self.future = future
        self.bounds_work = bounds_work  # a wait_for's timeout, not a pause

    def __lt__(self, other: _Sleeper) -> bool:
        return (self.due, self.seq) < (other.due, other.seq)


class FakeClock:
    """A clock tests move: nothing waits in real time.

    ``advance(s)`` moves both clocks forward and wakes every sleep due on the way, in order, giving
    each woken task a chance to run before the next. ``step_wall(s)`` moves only the wall clock
    (NTP stepping it). A ``wait_for`` timeout is due like a sleep but is not a pause:
    :meth:`run` jumps to pauses by itself, timeouts only when a test advances to them.
    """

    def __init__(
        self,
        wall: float = 1_800_000_000.0,
        monotonic: float = 1_000.0,
        boot_id: str | None = "fake-boot-1",
        booted_at: float = 0.0,
    ) -> None:
        import asyncio

        self._wall = wall
        self._mono = monotonic
        self._boot = boot_id
        self._booted_at = booted_at  # the monotonic reading at boot
        self._sleepers: list[_Sleeper] = []
        self._seq = itertools.count()
        self._changed = asyncio.Event()
        self.sleeps: list[float] = []  # every pause asked for, in seconds (tests read it)

    # -- reading ---------------------------------------------------------------------------------

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def since_boot(self) -> float | None:
        return None if self._boot is None else self._mono - self._booted_at

    def boot_id(self) -> str | None:
        return self._boot

    def reboot(
        self, boot_id: str | None, *, wall: float | None = None, uptime: float = 20.0
    ) -> None:
        """A new boot (a new process reads the journal): monotonic restarts, the id changes."""
        self._boot = boot_id
        self._booted_at = 0.0
        self._mono = uptime
        if wall is not None:
            self._wall = wall

    # -- waiting ---------------------------------------------------------------------------------

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await self._wait_until(self._mono + max(0.0, seconds), False)

    async def wait_for(self, awaitable: Awaitable[T], seconds: float) -> T:
        import asyncio

        task = asyncio.ensure_future(awaitable)
        timer = asyncio.ensure_future(self._wait_until(self._mono + max(0.0, seconds), True))
        timed_out = False
        try:
            await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
            timed_out = not task.done()
        finally:
            timer.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if timed_out:
            raise TimeoutError(f"no result within {seconds:g} s (fake clock)")
        return task.result()

    async def _wait_until(self, due: float, bounds_work: bool) -> None:
        import asyncio

        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        sleeper = _Sleeper(due, next(self._seq), future, bounds_work)
        heapq.heappush(self._sleepers, sleeper)
        self._changed.set()
        try:
            await future
        finally:
            if not future.done():
                future.cancel()

    # -- moving time (tests) ---------------------------------------------------------------------

    def step_wall(self, seconds: float) -> None:
        """The wall clock steps by ``seconds`` (either sign); monotonic time does not move."""
        self._wall += seconds

    def pending(self, *, pauses_only: bool = False) -> list[float]:
        """When the live waits are due (monotonic), soonest first."""
        self._drop_cancelled()
        return sorted(
            s.due for s in self._sleepers if not (pauses_only and s.bounds_work)
        )

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass: every wait due meanwhile wakes, in order."""
        await self.advance_to(self._mono + max(0.0, seconds))

    async def advance_to(self, target: float) -> None:
        while True:
            self._drop_cancelled()
            if not self._sleepers or self._sleepers[0].due > target:
                break
            sleeper = heapq.heappop(self._sleepers)
            self._move(max(self._mono, sleeper.due))
            sleeper.future.set_result(None)
            await _let_run()
        self._move(max(self._mono, target))
        await _let_run()

    async def next_due(
        self, *, pauses_only: bool = True, horizon: float = 60.0, real_timeout: float = 10.0
    ) -> float:
        """Wait (in real time, bounded) until some task waits on this clock for at most
        ``horizon`` seconds (a pause, or any wait); when it is due."""
        import asyncio

        async with asyncio.timeout(real_timeout):
            while True:
                due = [
                    d for d in self.pending(pauses_only=pauses_only) if d <= self._mono + horizon
                ]
                if due:
                    return due[0]
                self._changed.clear()
                await self._changed.wait()

    async def run(
        self,
        awaitable: Awaitable[T],
        *,
        horizon: float = 60.0,
        on_pause: Callable[[int], None] | None = None,
        real_timeout: float = 20.0,
    ) -> T:
        """Await ``awaitable`` while jumping time to each pause due within ``horizon``.

        Only pauses are jumped to: a ``wait_for`` that bounds real work (an HTTP call) fires only
        when time reaches it on the way to a pause, or when a test advances to it. A background
        pause further off than ``horizon`` (the attention sweep, every few minutes) is left
        alone: a sale's own pauses are seconds.
        ``on_pause(n)`` runs before the n-th jump (a test steps the wall clock there).
        """
        import asyncio

        task = asyncio.ensure_future(awaitable)
        jumps = 0
        async with asyncio.timeout(real_timeout):
            while not task.done():
                changed = asyncio.ensure_future(self._pause_within(horizon))
                await asyncio.wait({task, changed}, return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
                pauses = self._pauses_within(horizon)
                if pauses and not task.done():
                    if on_pause is not None:
                        on_pause(jumps)
                    jumps += 1
                    await self.advance_to(pauses[0])
        return task.result()

    def _pauses_within(self, horizon: float) -> list[float]:
        return [due for due in self.pending(pauses_only=True) if due <= self._mono + horizon]

    async def _pause_within(self, horizon: float) -> None:
        while not self._pauses_within(horizon):
            self._changed.clear()
            await self._changed.wait()

    def _move(self, mono: float) -> None:
        self._wall += mono - self._mono
        self._mono = mono

    def _drop_cancelled(self) -> None:
        live = [s for s in self._sleepers if not s.future.done()]
        if len(live) != len(self._sleepers):
            self._sleepers = live
            heapq.heapify(self._sleepers)


async def next_turn() -> None:
    """Let the event loop run what else is ready, once (a sale's step, a request): no time
    passes, on any clock, so a module of sales/ may call it without reading a real one."""
    import asyncio

    await asyncio.sleep(0)


async def _let_run(rounds: int = 5) -> None:
    """A few turns of the event loop, so that woken tasks run up to their next wait."""
    for _ in range(rounds):
        await next_turn()
