"""Waits that a fleet takes together without moving as a herd.

After a broker restart every unit loses its connection in the same second; with a fixed or a
plainly doubling delay they would all come back in the same second too, again and again.
``Backoff`` draws each wait at random below a ceiling that doubles up to a cap ("full jitter"),
so a fleet's reconnects spread evenly over the ceiling.
"""

from __future__ import annotations

import random


class Backoff:
    """Capped exponential back-off with full jitter: wait ``n`` is uniform in
    ``[floor, min(cap, first * 2**n)]``; ``reset()`` after a success."""

    def __init__(self, first: float, cap: float, rng: random.Random | None = None) -> None:
        self.first = first
        self.cap = max(cap, first)
        self.attempts = 0
        self._rng = rng or random.Random()

    def ceiling(self) -> float:
        return float(min(self.cap, self.first * 2.0 ** min(self.attempts, 32)))

    def next(self) -> float:
        ceiling = self.ceiling()
        self.attempts += 1
        return self._rng.uniform(ceiling / 20, ceiling)  # never quite zero: no busy loop

    def reset(self) -> None:
        self.attempts = 0


def jittered(interval: float, spread: float, rng: random.Random) -> float:
    """``interval`` moved by up to ``spread`` (a fraction) either way: a heartbeat schedule of
    its own per unit, so a fleet started together drifts apart instead of beating in step."""
    return interval * (1.0 + rng.uniform(-spread, spread))
