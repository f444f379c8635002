"""The client's rate limiter: bursts, a steady rate after them, and Retry-After pauses."""

from __future__ import annotations

import asyncio
import time

from kiosk_agent.service.ratelimit import RateLimiter


async def test_burst_passes_at_once_then_the_rate_holds() -> None:
    limiter = RateLimiter(rate=50, burst=5)
    started = time.monotonic()
    for _ in range(5):
        await limiter.acquire()
    assert time.monotonic() - started < 0.02
    for _ in range(5):
        await limiter.acquire()
    # five more at 50/s take about 0.1 s
    assert 0.08 <= time.monotonic() - started < 0.3


async def test_pause_holds_every_caller() -> None:
    limiter = RateLimiter(rate=1000, burst=10)
    limiter.pause(0.15)
    started = time.monotonic()
    await asyncio.gather(*(limiter.acquire() for _ in range(3)))
    assert time.monotonic() - started >= 0.14
    assert limiter.paused_for == 0
