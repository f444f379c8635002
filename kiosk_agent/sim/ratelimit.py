"""The per-credential rate limit shared by all terminal endpoints: a token bucket in real time."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from kiosk_agent.sim.http import ApiError


@dataclass(frozen=True, slots=True)
class RateLimit:
    """``requests`` per ``seconds``; bursts up to ``burst`` (default: twice the per-second rate)."""

    requests: float
    seconds: float
    burst: float

    @classmethod
    def of(cls, requests: float, seconds: float) -> RateLimit:
        """R requests per S seconds, bursts of twice the per-second rate (at least 1)."""
        return cls(requests, seconds, max(1.0, 2 * requests / seconds))

    @classmethod
    def parse(cls, text: str) -> RateLimit:
        """``"R/S"``: R requests per S seconds, e.g. ``"20/1"`` or ``"5/2"``."""
        requests_text, _, seconds_text = text.partition("/")
        try:
            requests = float(requests_text)
            seconds = float(seconds_text or "1")
        except ValueError:
            raise ValueError(f"rate limit must look like R/S (e.g. 20/1), got {text!r}") from None
        if requests <= 0 or seconds <= 0:
            raise ValueError(f"rate limit must be positive, got {text!r}")
        return cls.of(requests, seconds)

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


DEFAULT_RATE_LIMIT = RateLimit(20, 1, 40)


class RateLimiter:
    def __init__(self, limit: RateLimit = DEFAULT_RATE_LIMIT) -> None:
        self.limit = limit
        # credential -> (tokens, last refill, monotonic)
        self._buckets: dict[str, tuple[float, float]] = {}

    def change(self, limit: RateLimit) -> None:
        """A new limit from now on; every credential starts with a full bucket of it."""
        self.limit = limit
        self._buckets.clear()

    def check(self, credential: str) -> None:
        """Take one token for ``credential`` or raise the 429 with ``Retry-After``."""
        now = time.monotonic()
        tokens, last = self._buckets.get(credential, (self.limit.burst, now))
        tokens = min(self.limit.burst, tokens + (now - last) * self.limit.rate)
        if tokens < 1:
            self._buckets[credential] = (tokens, now)
            wait = (1 - tokens) / self.limit.rate
            raise ApiError(
                429, "rate_limited", f"over {self.limit.requests:g} requests per "
                f"{self.limit.seconds:g} s for this key; retry in {wait:.2f} s",
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )  # fmt: skip
        self._buckets[credential] = (tokens - 1, now)
