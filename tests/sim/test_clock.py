import asyncio
import time
from datetime import UTC, datetime

from kiosk_agent.sim.clock import VirtualClock, iso_ms, parse_iso


def test_iso_ms_is_utc_with_milliseconds() -> None:
    moment = datetime(2026, 11, 22, 10, 15, 30, 123456, tzinfo=UTC)
    assert iso_ms(moment) == "2026-11-22T10:15:30.123Z"
    assert iso_ms(moment.timestamp()) == "2026-11-22T10:15:30.123Z"
    assert parse_iso("2026-11-22T10:15:30.123Z") == moment.replace(microsecond=123000).timestamp()


def test_virtual_time_runs_scaled() -> None:
    clock = VirtualClock(time_scale=1000, start=1_000_000.0)
    first = clock.time()
    time.sleep(0.01)
    # 10 ms of real time is about 10 simulated seconds.
    assert 9 <= clock.time() - first <= 30
    assert clock.now().tzinfo is UTC
    assert clock.real_seconds(180) == 0.18


async def test_call_later_and_sleep_use_simulated_seconds() -> None:
    clock = VirtualClock(time_scale=600)
    fired = asyncio.Event()
    started = time.monotonic()
    clock.call_later(60, fired.set)  # a simulated minute: 0.1 s real
    await asyncio.wait_for(fired.wait(), 2)
    await clock.sleep(6)
    assert 0.1 <= time.monotonic() - started < 1.0
