"""Helpers for the agent's tests: scripted dispensers, configs and settings for the simulator."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

from kiosk_agent.sales.clock import Clock
from kiosk_agent.sales.model import DispenseOutcome, DispenseStatus

# Large enough that a card arrives in ~5 ms and an interaction expires in under a second.
TIME_SCALE = 300
# The agents' service timeout in tests: with ``answer_margin`` 0.5 below, an authorization
# whose answer was lost is believed uncharged 5.5 s after it was sent.
REQUEST_TIMEOUT = 5.0
# The service client's retry-safe calls wait 0.2, 0.4, 0.8 and 1.6 s (and jitter) between tries
# by default: 3 s of real time each time a test's service is down, for no test's meaning (the
# backoff itself is tested in tests/service). The agents in tests retry as often, sooner.
BACKOFF = {"backoff_base": 0.01, "backoff_max": 0.05}


class ScriptedDispenser:
    """A machine that answers as told and remembers what it was asked."""

    def __init__(
        self,
        status: DispenseStatus = DispenseStatus.VENDED,
        vended_cents: int = 0,
        delay: float = 0.0,
        clock: Clock | None = None,  # the agent's, when the delay is to pass on it
    ) -> None:
        self.status = status
        self.vended_cents = vended_cents
        self.delay = delay
        self.clock = clock
        self.authorized: list[int] = []
        self.denied: list[str] = []
        self.started = asyncio.Event()
        self.gave_up_at: float | None = None  # on the clock: when the sale stopped waiting

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        self.authorized.append(authorized_cents)
        self.started.set()
        if self.delay:
            try:
                await (self.clock.sleep(self.delay) if self.clock else asyncio.sleep(self.delay))
            except asyncio.CancelledError:
                self.gave_up_at = self.clock.monotonic() if self.clock else None
                raise
        return DispenseOutcome(self.status, vended_cents=self.vended_cents, product="A1")

    async def deny(self, reason: str) -> None:
        self.denied.append(reason)


def write_config(
    directory: Path, extra: str = "", time_scale: float = TIME_SCALE, answer_margin: float = 0.5
) -> Path:
    path = directory / "config.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            service:
              simulator: {{time_scale: {time_scale}}}
            terminals:
              - device_id: SIM-0001
                name: front
              - device_id: SIM-0007
                name: printer
            journal: {{path: journal.db}}
            sales: {{retries: 2, vend_timeout: 2, stop_timeout: 2, answer_margin: {answer_margin}}}
            """
        )
        + textwrap.dedent(extra)
    )
    return path
