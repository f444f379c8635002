"""What every heartbeat destination shares: its queue, counters, wake-up and background loop."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from kiosk_agent.fleet.queue import ReportQueue
from kiosk_agent.redact import redact
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.tasks import BackgroundTask

_LOGGER = logging.getLogger(__name__)

# What a sink's goodbye may take on a clean stop (the report that says `stopped`, MQTT's
# `offline`): every sink says it at once, so the whole stop waits at most this for them, within
# the stop's margin beside the drain (core/systemd.py STOP_MARGIN). A destination that does
# not answer by then is not waited for: the process must exit.
GOODBYE_TIMEOUT = 3.0
# What the sink's loop is given to end once the stop cancels it (on the sink's clock). A loop
# that has not ended by then (a library that lost the cancel, or waits out a timeout of its own
# on the way out: aiomqtt's 10 s for a disconnect) is left behind, said at ERROR: the process
# must exit.
LOOP_END_TIMEOUT = 1.0


class Sink(Protocol):
    name: str
    queue: ReportQueue
    sent: int
    failures: int
    unexpected: int
    last_sent_at: float | None
    last_error: str

    def trouble(self, grace: float) -> str | None: ...

    def wake(self) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class SinkBase:
    name = "sink"

    def __init__(self, queue_size: int, clock: Clock = SYSTEM_CLOCK) -> None:
        self.queue = ReportQueue(queue_size)
        self._clock = clock  # the trouble's grace and the loop's end are measured on it
        self._trouble_clock = clock.monotonic
        self.failing_since: float | None = None  # the first failure since the last success
        self.sent = 0
        self.failures = 0
        self.last_sent_at: float | None = None
        self.last_error = ""
        self.unexpected = 0  # errors no code path expected (a bug): logged, counted in health
        self._wakeup = asyncio.Event()
        self._loop = BackgroundTask(self._run, f"upstream-{self.name}")

    def wake(self) -> None:
        self._wakeup.set()

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        """The loop ends; one that has not within ``LOOP_END_TIMEOUT`` is left, said, counted."""
        if not await self._loop.stop_within(LOOP_END_TIMEOUT, self._clock.wait_for):
            self.unexpected += 1
            _LOGGER.error("upstream %s: its loop did not end within %g s of the stop; left "
                          "behind (the process exits anyway)", self.name, LOOP_END_TIMEOUT)

    async def _run(self) -> None:
        raise NotImplementedError

    def _sent_one(self) -> None:
        self.queue.pop()
        self.sent += 1
        self.last_sent_at = time.time()
        self._reached()

    def _reached(self) -> None:
        """The destination took the unit (a report, a connection): no trouble now."""
        self.last_error = ""
        self.failing_since = None

    def trouble(self, grace: float) -> str | None:
        """What health shows while the destination has failed for ``grace`` seconds or more
        (unreachable, a certificate that does not verify, a password refused); None else. A
        broker restart, back within the grace, is not a problem."""
        if self.failing_since is None or self._trouble_clock() - self.failing_since < grace:
            return None
        return f"upstream {self.name} failing: {self.last_error}"

    def _unexpected(self, err: Exception) -> None:
        """A bug met while sending: logged with its traceback and counted; the loop goes on."""
        self.unexpected += 1
        self.failures += 1
        _LOGGER.error("upstream %s: unexpected %s (%d queued); trying again",
                      self.name, type(err).__name__, len(self.queue), exc_info=err)

    def _failed(self, error: str) -> None:
        error = redact(error)  # a URL or broker message may carry a credential
        self.failures += 1
        if self.failing_since is None:
            self.failing_since = self._trouble_clock()
        if error != self.last_error:
            _LOGGER.warning("upstream %s: %s (%d queued)", self.name, error, len(self.queue))
        self.last_error = error
