"""Terminals a card read may still hold after its answer was lost.

A read-card whose answer was lost may have started: the terminal then waits for a card in an
interaction whose id the agent never learned. The interface offers no way to find or cancel it
without that id (the cancel call takes it; the terminal list and the 409 ``terminal_busy`` body
name none; disconnect is not said to end it), and that sale cannot wait for it: its customer's
card, tapped on it, gives a token nobody can fetch. So the sale fails at once (a read moves no
money), and the terminal is noted here until the interaction must have ended: created before
the agent gave up, it expires one interaction lifetime later (3 minutes), or sooner when a card
is tapped on it. The next sale on that terminal that meets ``terminal_busy`` meanwhile waits and
asks again (``SaleFlow.held_by_lost_read``) instead of failing its customer at once.
"""

from __future__ import annotations

from kiosk_agent.sales.clock import Clock


class LostReads:
    """device_id -> when a card read whose answer was lost has surely ended (monotonic)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._until: dict[str, float] = {}

    def lost(self, device: str, lifetime: float) -> None:
        """A read-card on ``device`` was sent and its answer lost (given up on now)."""
        self._until[device] = self._clock.monotonic() + lifetime

    def ended(self, device: str) -> None:
        """``device`` took a new interaction: no older one holds it any more."""
        self._until.pop(device, None)

    def left(self, device: str) -> float | None:
        """Seconds the lost read may still hold ``device``; None when it cannot any more."""
        until = self._until.get(device)
        if until is None:
            return None
        left = until - self._clock.monotonic()
        if left <= 0:
            del self._until[device]
            return None
        return left

    def held(self) -> dict[str, float]:
        """Every terminal a lost read may still hold, and for how many seconds more."""
        return {device: left for device in list(self._until)
                if (left := self.left(device)) is not None}  # fmt: skip
