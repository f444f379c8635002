"""The clock tests move (``FakeClock``): nothing waits in real time.

A module of its own so that a running agent never loads it (tests/test_footprint.py): it was half
of sales/clock.py's code. The tests take it from ``kiosk_agent.sales.clock`` as before (that
module's ``__getattr__``) or from here.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from kiosk_agent.sales.clock import next_turn

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")


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


async def _let_run(rounds: int = 5) -> None:
    """A few turns of the event loop, so that woken tasks run up to their next wait."""
    for _ in range(rounds):
        await next_turn()
