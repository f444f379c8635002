"""The token bucket: the one behind the service client's rate limiter and the local servers'
accept budget at their connection cap."""

from __future__ import annotations

from collections.abc import Callable


class TokenBucket:
    """Tokens come at ``rate`` a second on ``clock`` (monotonic), at most ``capacity`` saved
    up; full to begin with. A rate may be given per look, for a limiter whose rate moves."""

    def __init__(self, rate: float, capacity: float, clock: Callable[[], float]) -> None:
        self.rate = rate
        self.capacity = capacity
        self._clock = clock
        self._tokens = float(capacity)
        self._updated = clock()

    def wait(self, rate: float | None = None) -> float:
        """Seconds until a token is here: 0 when one is."""
        rate = self.rate if rate is None else rate
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._updated) * rate)
        self._updated = now
        return 0.0 if self._tokens >= 1.0 else (1.0 - self._tokens) / rate

    def spend(self) -> None:
        """Use a token (after :meth:`wait` said one is here)."""
        self._tokens -= 1.0

    def empty_until(self, moment: float) -> None:
        """No token before ``moment`` (on the clock); they come again from then."""
        self._tokens = 0.0
        self._updated = moment

    def take(self, rate: float | None = None) -> float:
        """Use a token and return 0, or return how long to wait for one."""
        delay = self.wait(rate)
        if delay == 0.0:
            self.spend()
        return delay
