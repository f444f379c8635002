"""The sale's one clock: the fake one tests move, and re-anchoring a window across a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.sales.clock import (
    Anchor,
    FakeClock,
    SystemClock,
    elapsed_at_least,
    remaining,
    wait_at_most,
)

WINDOW = 240.0
DAY = 86_400.0


async def test_advancing_wakes_due_sleeps_in_order_and_no_sooner() -> None:
    clock = FakeClock()
    woke: list[tuple[str, float]] = []

    async def nap(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.monotonic()))

    start = clock.monotonic()
    naps = [asyncio.create_task(nap(n, s)) for n, s in (("late", 30), ("soon", 10), ("mid", 20))]
    await asyncio.sleep(0)
    await clock.advance(15)
    assert woke == [("soon", start + 10)]
    await clock.advance(15)
    assert woke == [("soon", start + 10), ("mid", start + 20), ("late", start + 30)]
    await asyncio.gather(*naps)


async def test_a_wall_step_moves_no_sleep_and_no_monotonic_time() -> None:
    clock = FakeClock()
    nap = asyncio.create_task(clock.sleep(60))
    await asyncio.sleep(0)
    before = clock.monotonic()
    for step in (3 * DAY, -7 * DAY):
        clock.step_wall(step)
        await asyncio.sleep(0)
        assert not nap.done()
        assert clock.monotonic() == before
    await clock.advance(60)
    assert nap.done()


async def test_wait_for_times_out_on_the_fake_clock_and_cancels_the_work() -> None:
    clock = FakeClock()
    never = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(clock.wait_for(never, 30))
    await asyncio.sleep(0)
    await clock.advance(29)
    assert not waiting.done()
    await clock.advance(1)
    with pytest.raises(TimeoutError):
        await waiting
    assert never.cancelled()
    assert await clock.wait_for(asyncio.sleep(0, "answer"), 30) == "answer"


async def test_run_jumps_to_pauses_but_never_to_a_timeout_alone() -> None:
    clock = FakeClock()

    async def polls() -> float:
        for _ in range(10):
            await clock.sleep(5)
        return clock.monotonic()

    start = clock.monotonic()
    assert await clock.run(polls()) == start + 50  # in milliseconds of real time
    answer = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.05, answer.set_result, "late but in time")
    # a timeout bounding real work is not jumped to: the work finishes first
    assert await clock.run(clock.wait_for(answer, 1)) == "late but in time"


async def test_run_fires_a_timeout_due_on_the_way_to_a_pause() -> None:
    clock = FakeClock()
    never = asyncio.get_running_loop().create_future()
    bounded = asyncio.create_task(clock.wait_for(never, 3))
    await clock.run(clock.sleep(10))
    with pytest.raises(TimeoutError):
        await bounded


class _CountedWaits(FakeClock):
    """A fake clock that counts the bounds entered (wait_for)."""

    def __init__(self) -> None:
        super().__init__()
        self.bounds = 0

    async def wait_for(self, awaitable: Any, seconds: float) -> Any:
        self.bounds += 1
        return await super().wait_for(awaitable, seconds)


async def test_wait_at_most_enters_no_bound_for_work_that_ends_at_its_first_step() -> None:
    # an app that does not confirm its dispense knows its outcome at once: its vend timeout
    # was a timeout entered and a timer armed and cancelled, each sale, for nothing
    clock = _CountedWaits()

    async def at_once() -> str:
        return "vended"

    assert await wait_at_most(clock, at_once(), 30) == "vended"
    assert clock.bounds == 0

    async def refused() -> str:
        raise ValueError("the machine refused")

    with pytest.raises(ValueError, match="refused"):
        await wait_at_most(clock, refused(), 30)
    assert clock.bounds == 0


async def test_wait_at_most_bounds_work_that_waits_and_cancels_it_at_the_bound() -> None:
    clock = _CountedWaits()
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def waits(on: asyncio.Future[str]) -> str:
        seen.append("asked")
        try:
            got = await on
            await asyncio.sleep(0)  # more than one wait, each passed through
            return f"{got} after {len(seen)}"
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    waiting = asyncio.create_task(wait_at_most(clock, waits(answer), 30))
    await asyncio.sleep(0)
    assert seen == ["asked"]
    assert clock.bounds == 1
    answer.set_result("vended")
    assert await waiting == "vended after 1"

    never: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    bounded = asyncio.create_task(wait_at_most(clock, waits(never), 30))
    await asyncio.sleep(0)
    await clock.advance(29)
    assert not bounded.done()
    await clock.advance(1)
    with pytest.raises(TimeoutError):
        await bounded
    assert seen[-1] == "cancelled"
    assert never.cancelled()


async def test_wait_at_most_on_the_system_clock_times_out_and_passes_errors_on() -> None:
    clock = SystemClock()
    never: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def waits() -> str:
        return await never

    with pytest.raises(TimeoutError):
        await wait_at_most(clock, waits(), 0.01)
    assert never.cancelled()

    async def fails_after_a_wait() -> str:
        await asyncio.sleep(0)
        raise LookupError("no such product")

    with pytest.raises(LookupError, match="no such product"):
        await wait_at_most(clock, fails_after_a_wait(), 5)

    async def caught_cancel() -> str:  # work that answers its cancel with an outcome
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            return "timed out, said so"
        return "never"

    outer = asyncio.create_task(wait_at_most(clock, caught_cancel(), 5))
    await asyncio.sleep(0)
    outer.cancel()  # a cancel from outside reaches the work, which returns: as with await
    assert await outer == "timed out, said so"


def test_the_system_clock_reads_this_boot(tmp_path: Path) -> None:
    clock = SystemClock()
    assert clock.monotonic() <= clock.monotonic()
    if Path("/proc/sys/kernel/random/boot_id").exists():
        assert clock.boot_id()
        assert (clock.since_boot() or 0) > 0
    assert SystemClock(tmp_path / "nothing").boot_id() is None
    assert SystemClock(tmp_path / "nothing").since_boot() is None


@pytest.mark.parametrize("step", [-30 * DAY, -2 * 3600.0, -1.0, 0.0, 1.0, 2 * 3600.0, 30 * DAY])
def test_on_the_same_boot_what_is_left_is_exact_whatever_the_wall_did(step: float) -> None:
    clock = FakeClock()
    sent = Anchor.now(clock)
    clock.step_wall(step)
    assert remaining(clock, sent, WINDOW) == WINDOW
    clock._move(clock.monotonic() + 100)
    assert remaining(clock, sent, WINDOW) == WINDOW - 100
    assert elapsed_at_least(clock, sent) == 100


@pytest.mark.parametrize("step", [-30 * DAY, -2 * 3600.0, 0.0, 2 * 3600.0, 30 * DAY])
@pytest.mark.parametrize("gap", [0.0, 30.0, 1000.0])  # real seconds between the send and the boot
@pytest.mark.parametrize("uptime", [5.0, 60.0, 600.0])
def test_after_a_reboot_the_wait_is_never_short_and_never_above_one_window(
    step: float, gap: float, uptime: float
) -> None:
    clock = FakeClock()
    sent = Anchor.now(clock)
    clock.reboot("fake-boot-2", wall=sent.wall + gap + uptime + step, uptime=uptime)
    left = remaining(clock, sent, WINDOW)
    real_elapsed_when_judged = gap + uptime + left
    assert real_elapsed_when_judged >= WINDOW  # never judged before the window is over
    assert 0.0 <= left <= WINDOW  # and never more than one full window from now
    # never less than the wall clock says is left, nor than this boot cannot account for
    assert left >= min(WINDOW, WINDOW - gap - uptime - step)
    assert left >= WINDOW - uptime


def test_an_unknown_boot_waits_a_full_window_unless_the_wall_says_more_is_left() -> None:
    clock = FakeClock(boot_id=None)
    sent = Anchor.now(clock)
    clock.step_wall(10 * DAY)
    assert remaining(clock, sent, WINDOW) == WINDOW
    legacy = Anchor(clock.time() - 100)  # a journal row from before anchors were kept
    assert remaining(clock, legacy, WINDOW) == WINDOW


@given(
    window=st.floats(min_value=0.0, max_value=DAY),
    gap=st.floats(min_value=0.0, max_value=30 * DAY),
    uptime=st.floats(min_value=0.0, max_value=30 * DAY),
    step=st.floats(min_value=-365 * DAY, max_value=365 * DAY),
)
def test_any_reboot_and_any_step_keep_the_window_and_its_bound(
    window: float, gap: float, uptime: float, step: float
) -> None:
    clock = FakeClock()
    sent = Anchor.now(clock)
    clock.reboot("fake-boot-2", wall=sent.wall + gap + uptime + step, uptime=uptime)
    left = remaining(clock, sent, window)
    assert gap + uptime + left >= window - 1e-6  # never judged before the window is over
    assert 0.0 <= left <= window  # at most one full window from the restart


async def test_wait_for_passes_on_a_cancellation_from_inside_as_asyncio_does() -> None:
    clock = FakeClock()
    inner = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(clock.wait_for(inner, 30))
    await asyncio.sleep(0)
    inner.cancel()  # someone else cancels the work: not a timeout
    with pytest.raises(asyncio.CancelledError):
        await waiting
