import pytest

from kiosk_agent.sim.http import ApiError
from kiosk_agent.sim.ratelimit import DEFAULT_RATE_LIMIT, RateLimit, RateLimiter


def test_parse_r_per_s_with_a_burst_of_two_seconds() -> None:
    assert RateLimit.parse("20/1") == RateLimit(20, 1, 40) == DEFAULT_RATE_LIMIT
    assert RateLimit.parse("5/2").rate == 2.5
    assert RateLimit.parse("5/2").burst == 5
    for bad in ("fast", "0/1", "5/0", "-1/1", "a/b"):
        with pytest.raises(ValueError, match="rate limit"):
            RateLimit.parse(bad)


def test_buckets_are_per_credential() -> None:
    limiter = RateLimiter(RateLimit(1, 60, 2))
    limiter.check("a")
    limiter.check("a")
    with pytest.raises(ApiError) as refused:
        limiter.check("a")
    assert refused.value.status == 429
    assert refused.value.headers["Retry-After"] == "60"
    limiter.check("b")
