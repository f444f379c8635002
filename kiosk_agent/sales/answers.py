"""Which customers wait for their machine's answer: back-office work waits for them, bounded.

A customer waits from their request (a vend request; card first, the card tapped, then the
choice made) until the machine is told (approve or deny written to it) or the sale ends. A
released sale's capture is back-office work: once its confirmed vend is on disk it is sent
when no customer waits, or at ``CAPTURE_WAITS_FOR_CUSTOMER_S`` on the sale clock, whichever
comes first. Back to back (a queue, two machines) the previous customer's capture exchange and
its completion's commit then run outside the next customer's vend -> approve window; a lone
customer's capture is sent at once. A stop sends every waiting capture at once.
"""

from __future__ import annotations

import asyncio
import contextlib

from kiosk_agent.sales.clock import Clock, next_turn

# Turns of the event loop from a customer's request on the wire to its sale's start: the turn
# whose select reads it, the platform's handler (mdb: the line), the sale task's first step. A
# capture (or its completion) lets them pass first, so a request that came in with the last
# answer is served before back-office work (counted: a fourth fsync in 9 and 17 of 80
# back-to-back windows with them, 26 and 31 without; a few microseconds for a lone customer).
TURNS_TO_A_SALES_START = 3
# The longest a released sale's capture waits, once its request is on disk, for no customer to
# wait for an answer: a capture never starves under a stream of customers, and the service's
# limits (an authorization's life in hours) are far off. One vend -> approve window, many times.
CAPTURE_WAITS_FOR_CUSTOMER_S = 1.0


class WaitingCustomers:
    """The sales whose customer waits for the machine's answer (one agent's, by sale id)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._waiting: set[str] = set()
        self._none_waiting = asyncio.Event()
        self._none_waiting.set()
        self._stopping = False

    def waits(self, sale_id: str) -> None:
        """The sale's customer now waits for the machine's answer."""
        self._waiting.add(sale_id)
        if not self._stopping:
            self._none_waiting.clear()

    def answered(self, sale_id: str) -> None:
        """The machine was told (or the sale ended): that customer waits no more."""
        self._waiting.discard(sale_id)
        if not self._waiting:
            self._none_waiting.set()

    def waiting(self) -> int:
        """How many customers wait for an answer now."""
        return len(self._waiting)

    def stop(self) -> None:
        """The agent stops: no wait any more, what waits goes at once (the drain sends it)."""
        self._stopping = True
        self._none_waiting.set()

    async def none_waiting(self, within: float = CAPTURE_WAITS_FOR_CUSTOMER_S) -> None:
        """Return once no customer waits for an answer, or after ``within`` seconds on the sale
        clock, whichever comes first (at once when none waits, or the agent stops). A request
        already received goes first: its sale starts within TURNS_TO_A_SALES_START turns."""
        for _ in range(TURNS_TO_A_SALES_START):
            await next_turn()
        if self._none_waiting.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await self._clock.wait_for(self._none_waiting.wait(), within)
