"""Waits a fleet takes together: reconnects spread at random below a doubling, capped ceiling;
heartbeats each on a schedule of their own."""

import random

from kiosk_agent.fleet.backoff import Backoff, jittered


def test_reconnects_spread_below_a_doubling_capped_ceiling() -> None:
    backoff = Backoff(5.0, 60.0, random.Random(7))
    ceilings = []
    for _ in range(8):
        ceiling = backoff.ceiling()
        wait = backoff.next()
        assert ceiling / 20 <= wait <= ceiling
        ceilings.append(ceiling)
    assert ceilings == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0, 60.0]
    backoff.reset()
    assert backoff.ceiling() == 5.0


def test_a_fleet_that_lost_its_broker_together_does_not_come_back_together() -> None:
    """1,000 units' first reconnect after a broker restart, each with its own random draw:
    no tenth of a second holds more than a few percent of them."""
    rng = random.Random(3)
    waits = [Backoff(5.0, 60.0, rng).next() for _ in range(1000)]
    buckets = [0] * 51
    for wait in waits:
        buckets[int(wait * 10)] += 1
    assert max(buckets) <= 40  # 2 % would be even; 4 % allowed for chance
    assert min(waits) > 0


def test_heartbeats_drift_apart() -> None:
    rng = random.Random(5)
    beats = [jittered(60.0, 0.1, rng) for _ in range(100)]
    assert all(54.0 <= beat <= 66.0 for beat in beats)
    assert len({round(beat, 3) for beat in beats}) > 90
    assert jittered(60.0, 0.0, rng) == 60.0
