"""Virtual time: every duration of the simulated service runs ``time_scale`` times faster.

Tests live through a 3-minute interaction expiry or a 30-day signature sweep in moments by
starting the simulator with a large scale. Only simulated durations are scaled; the WebSocket
ping period and the rate limit are real time (choices.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any


class VirtualClock:
    """Unix time that advances ``time_scale`` simulated seconds per real second."""

    def __init__(self, time_scale: float = 1.0, start: float | None = None) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        self.time_scale = time_scale
        self._real_origin = time.monotonic()
        self._virtual_origin = time.time() if start is None else start

    def time(self) -> float:
        """Simulated Unix time, in seconds."""
        return self._virtual_origin + (time.monotonic() - self._real_origin) * self.time_scale

    def now(self) -> datetime:
        """Simulated time as an aware UTC datetime."""
        return datetime.fromtimestamp(self.time(), UTC)

    def iso_now(self) -> str:
        """Simulated time as the interface writes it (ISO 8601 UTC, milliseconds)."""
        return iso_ms(self.time())

    def real_seconds(self, sim_seconds: float) -> float:
        """How long ``sim_seconds`` of simulated time last on the wall clock."""
        return max(0.0, sim_seconds / self.time_scale)

    async def sleep(self, sim_seconds: float) -> None:
        await asyncio.sleep(self.real_seconds(sim_seconds))

    def call_later(
        self, sim_seconds: float, callback: Callable[..., Any], *args: Any
    ) -> asyncio.TimerHandle:
        """Run ``callback`` after ``sim_seconds`` of simulated time (on the running loop)."""
        loop = asyncio.get_running_loop()
        return loop.call_later(self.real_seconds(sim_seconds), callback, *args)

    def call_at(
        self, sim_time: float, callback: Callable[..., Any], *args: Any
    ) -> asyncio.TimerHandle:
        """Run ``callback`` once the simulated clock reads ``sim_time`` (at once if it passed)."""
        return self.call_later(sim_time - self.time(), callback, *args)


def iso_ms(moment: float | datetime) -> str:
    """ISO 8601 UTC with milliseconds, the interface's form: ``2026-11-22T10:15:30.123Z``."""
    if isinstance(moment, datetime):
        when = moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    else:
        when = datetime.fromtimestamp(moment, UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def parse_iso(text: str) -> float:
    """The inverse of :func:`iso_ms` (also takes offsets): Unix seconds."""
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()
