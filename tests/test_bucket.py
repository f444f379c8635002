"""The token bucket behind the service's rate limiter and the local servers' accept budget."""

from __future__ import annotations

import pytest

from kiosk_agent.bucket import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_full_bucket_gives_its_capacity_at_once_then_one_token_per_period() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=4, capacity=2, clock=clock)
    assert [bucket.take(), bucket.take()] == [0.0, 0.0]
    assert bucket.take() == pytest.approx(0.25)  # empty: the next comes in 1/rate
    clock.now += 0.25
    assert bucket.take() == 0.0
    clock.now += 10  # idle: no more than the capacity saved up
    assert [bucket.take(), bucket.take()] == [0.0, 0.0]
    assert bucket.take() > 0


def test_a_look_does_not_spend_and_a_given_rate_applies_to_that_look() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=10, capacity=1, clock=clock)
    assert bucket.wait() == 0.0
    assert bucket.wait() == 0.0  # looking twice leaves the token there
    bucket.spend()
    assert bucket.wait(rate=2) == pytest.approx(0.5)  # a limiter slowed down by a storm
    clock.now += 0.5
    assert bucket.take(rate=2) == 0.0


def test_emptied_until_a_moment_no_token_comes_before_it() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=10, capacity=5, clock=clock)
    bucket.empty_until(clock.now + 3)  # Retry-After: 3 to everyone
    clock.now += 1
    assert bucket.wait() == pytest.approx(2.1)  # the pause's end, then one period
    clock.now += 2.0
    assert bucket.take() > 0  # still in the period after the pause
    clock.now += 0.11
    assert bucket.take() == 0.0
