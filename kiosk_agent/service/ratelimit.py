"""The client's side of the service's per-credential rate limit: a token bucket that also obeys
``Retry-After``.

Every terminal call made with one credential goes through the same limiter, so eight readers and
a field tech's CLI cannot together trip the service's limit. Clients of one process that use the
same credential (the agent's and the admin API's) share one limiter through
:func:`shared_limiter`.

What a 429 costs (:meth:`RateLimiter.refused`):

- an isolated 429 costs its ``Retry-After`` once, to the call that heard it; nobody else waits
  and the rate stays where it is (a service may refuse one call for reasons of its own);
- a sustained run is a storm: :data:`STORM_RUN` 429s in a row with no other answer between
  them, or, with callers interleaved, at least that many within :data:`STORM_WINDOW_S` seconds
  making up :data:`STORM_SHARE` or more of the answers heard then. The limit is real: every
  caller waits out the ``Retry-After`` and the rate is halved (never below :data:`MIN_SHARE` of
  the configured one);
- once the 429s stop, the lowered rate doubles every :data:`RECOVERY_DOUBLING_S` seconds from
  the last one (or the end of its pause), so the full rate is back within seconds (4.3 s from
  the floor).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import secrets
import time
import weakref
from collections import deque
from collections.abc import Callable

from kiosk_agent.bucket import TokenBucket

STORM_RUN = 3  # 429 answers in a row that make a storm
STORM_WINDOW_S = 2.0  # ... or this many 429s within this window,
STORM_SHARE = 0.5  # ... when they are at least this share of the answers in it
MIN_SHARE = 0.05  # the lowest rate a storm leaves, as a share of the configured one
RECOVERY_DOUBLING_S = 1.0  # after the last 429, a lowered rate doubles every this many seconds


class RateLimiter:
    """Token bucket: ``rate`` requests per second with bursts of ``burst``; FIFO for waiters."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_rate = rate
        self.burst = burst
        self._clock = clock
        self._bucket = TokenBucket(rate, burst, clock)
        self._paused_until = 0.0
        self._lock = asyncio.Lock()
        self._in_line = 0  # callers of acquire() waiting for the lock or holding it
        self._floor = rate  # the rate the last storm left
        self._last_refused = -math.inf
        self._run = 0  # 429s heard in a row
        self._recent: deque[tuple[float, bool]] = deque()  # (when, was a 429) in the window
        self.storms = 0  # diagnostics

    @property
    def rate(self) -> float:
        """The rate now: the configured one, or a storm's lowered rate on its way back."""
        return self._rate_at(self._clock())

    def _rate_at(self, now: float) -> float:
        if self._floor >= self.max_rate:
            return self.max_rate
        since = max(0.0, now - max(self._last_refused, self._paused_until))
        climbed: float = self._floor * 2.0 ** (since / RECOVERY_DOUBLING_S)
        return min(self.max_rate, climbed)

    async def acquire(self) -> None:
        """Wait for the right to send one request."""
        # nobody before this call and a token here (every call of a kiosk's sale, short of a
        # burst or a storm): taken at once, without the lock's enter and exit (five Python
        # calls a request); else in line behind the callers already in it
        if not self._in_line and self._take() <= 0:
            return
        self._in_line += 1
        try:
            async with self._lock:  # one waiter at a time keeps the order of arrival
                while (delay := self._take()) > 0:  # noqa: ASYNC110 (a timed wait, not an event)
                    await asyncio.sleep(delay)
        finally:
            self._in_line -= 1

    def refused(self, retry_after: float) -> bool:
        """The service answered 429 with ``retry_after`` seconds.

        False: an isolated 429; the caller waits ``retry_after`` itself. True: a storm; the
        limiter now holds every caller (the one that heard it too) and runs at a lower rate.
        """
        now = self._clock()
        rate = self._rate_at(now)
        self._run += 1
        self._last_refused = now
        self._heard(now, refused=True)
        refusals = sum(1 for _, refused in self._recent if refused)
        sustained = refusals >= STORM_RUN and refusals >= STORM_SHARE * len(self._recent)
        if self._run < STORM_RUN and not sustained:
            self._floor = rate  # a lowered rate does not climb back while 429s still come
            return False
        if now >= self._paused_until:  # one storm halves the rate once, not per answer
            self._floor = max(self.max_rate * MIN_SHARE, rate / 2)
            self.storms += 1
        self.pause(retry_after)
        return True

    def pause(self, seconds: float) -> None:
        """Nobody sends for ``seconds`` (the service said Retry-After to everyone)."""
        self._paused_until = max(self._paused_until, self._clock() + seconds)
        self._bucket.empty_until(self._paused_until)

    def succeeded(self) -> None:
        """An answer that was not a 429: a run of 429s is over."""
        self._run = 0
        self._heard(self._clock(), refused=False)

    def _heard(self, now: float, *, refused: bool) -> None:
        recent = self._recent
        recent.append((now, refused))
        while recent and recent[0][0] < now - STORM_WINDOW_S:
            recent.popleft()

    @property
    def paused_for(self) -> float:
        return max(0.0, self._paused_until - self._clock())

    def _take(self) -> float:
        """Take a token and return 0, or return how long to wait for one."""
        now = self._clock()
        if now < self._paused_until:
            return self._paused_until - now
        return self._bucket.take(self._rate_at(now))


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
