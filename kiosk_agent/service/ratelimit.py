"""The client's side of the service's per-credential rate limit: a token bucket that also obeys
``Retry-After``.

Every terminal call made with one credential goes through the same limiter, so eight readers and
a field tech's CLI cannot together trip the service's limit; when the service still answers 429,
its ``Retry-After`` pauses everyone, not just the caller that saw it. Clients of one process that
use the same credential (the agent's and the admin API's) share one limiter through
:func:`shared_limiter`.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
import weakref
from collections.abc import Callable

# After a 429 the rate is halved (never below MIN_SHARE of the configured one) and each answer
# that follows wins back RECOVERY_SHARE of it: the client settles just under a service limit it
# was not told about, instead of tripping it again after every pause.
MIN_SHARE = 0.05
RECOVERY_SHARE = 0.02


class RateLimiter:
    """Token bucket: ``rate`` requests per second with bursts of ``burst``; FIFO for waiters."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_rate = rate
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._updated = clock()
        self._paused_until = 0.0
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        """Wait for the right to send one request."""
        async with self._lock:  # one waiter at a time keeps the order of arrival
            while (delay := self._take()) > 0:  # noqa: ASYNC110 (a timed wait, not an event)
                await asyncio.sleep(delay)

    def pause(self, seconds: float) -> None:
        """The service said Retry-After: nobody sends for ``seconds``, then at a lower rate."""
        now = self._clock()
        if now >= self._paused_until:  # one 429 storm halves the rate once, not per answer
            self.rate = max(self.max_rate * MIN_SHARE, self.rate / 2)
        self._paused_until = max(self._paused_until, now + seconds)
        self._tokens = 0.0
        self._updated = self._paused_until

    def succeeded(self) -> None:
        """An answer that was not a 429: win back some of the rate."""
        if self.rate < self.max_rate:
            self.rate = min(self.max_rate, self.rate + self.max_rate * RECOVERY_SHARE)

    @property
    def paused_for(self) -> float:
        return max(0.0, self._paused_until - self._clock())

    def _take(self) -> float:
        """Take a token and return 0, or return how long to wait for one."""
        now = self._clock()
        if now < self._paused_until:
            return self._paused_until - now
        self._tokens = min(float(self.burst), self._tokens + (now - self._updated) * self.rate)
        self._updated = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate


# The process's limiters by (event loop, service address, credential fingerprint). Weakly held: a
# limiter lives while a client uses it. The loop is part of the key because the limiter's lock
# belongs to one event loop.
_SHARED: weakref.WeakValueDictionary[tuple[asyncio.AbstractEventLoop, str, str], RateLimiter] = (
    weakref.WeakValueDictionary()
)
# Keyed per process, so a fingerprint names a credential here and is useless anywhere else.
_FINGERPRINT_KEY = secrets.token_bytes(16)


def credential_fingerprint(credential: str) -> str:
    """A keyed digest that identifies ``credential`` within this process without holding it."""
    digest = hashlib.blake2b(credential.encode(), digest_size=16, key=_FINGERPRINT_KEY)
    return digest.hexdigest()


def shared_limiter(base_url: str, credential: str, rate: float, burst: int) -> RateLimiter:
    """The limiter of ``credential`` on the service at ``base_url``, made on first use.

    Must be called in the event loop the limiter will serve. The first client of a credential
    sets ``rate`` and ``burst``: the service has one limit per credential, not one per client.
    """
    key = (asyncio.get_running_loop(), base_url, credential_fingerprint(credential))
    limiter = _SHARED.get(key)
    if limiter is None:
        limiter = _SHARED[key] = RateLimiter(rate, burst)
    return limiter


def share_limiter(base_url: str, credential: str, limiter: RateLimiter) -> None:
    """File ``limiter`` under ``credential`` too: a rotated key keeps its limiter."""
    key = (asyncio.get_running_loop(), base_url, credential_fingerprint(credential))
    _SHARED.setdefault(key, limiter)
