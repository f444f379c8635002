import asyncio
import time
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from kiosk_agent.sim import clock as clock_module
from kiosk_agent.sim.clock import VirtualClock, iso_ms, parse_iso


def test_iso_ms_is_utc_with_milliseconds() -> None:
    moment = datetime(2026, 11, 22, 10, 15, 30, 123456, tzinfo=UTC)
    assert iso_ms(moment) == "2026-11-22T10:15:30.123Z"
    assert iso_ms(moment.timestamp()) == "2026-11-22T10:15:30.123Z"
    assert parse_iso("2026-11-22T10:15:30.123Z") == moment.replace(microsecond=123000).timestamp()


def test_virtual_time_runs_scaled(monkeypatch: pytest.MonkeyPatch) -> None:
    # the real clock stepped by the test: a real 10 ms sleep read 9-30 simulated seconds on a
    # quiet machine and more at load 11-15 (the process waited for a core)
    real = SimpleNamespace(now=500.0)
    monkeypatch.setattr(
        clock_module, "time", SimpleNamespace(monotonic=lambda: real.now, time=time.time)
    )
    clock = VirtualClock(time_scale=1000, start=1_000_000.0)
    assert clock.time() == 1_000_000.0
    real.now += 0.01
    # 10 ms of real time is 10 simulated seconds
    assert clock.time() == pytest.approx(1_000_010.0)
    assert clock.now().tzinfo is UTC
    assert clock.real_seconds(180) == 0.18


async def test_call_later_and_sleep_use_simulated_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # what the loop is asked for, not how long a loaded machine took (a bound of 1 s real)
    clock = VirtualClock(time_scale=600)
    loop = asyncio.get_running_loop()
    fired = asyncio.Event()
    before = loop.time()
    handle = clock.call_later(60, fired.set)  # a simulated minute: 0.1 s real
    after = loop.time()
    assert before + 0.1 <= handle.when() <= after + 0.1
    await asyncio.wait_for(fired.wait(), 60)  # a hang's guard, not a bound
    assert loop.time() >= handle.when()
    asked: list[float] = []

    async def recorded(seconds: float) -> None:
        asked.append(seconds)

    with monkeypatch.context() as patch:
        patch.setattr(clock_module.asyncio, "sleep", recorded)
        await clock.sleep(6)
    assert asked == [0.01]
