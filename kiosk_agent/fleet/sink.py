"""What every heartbeat destination shares: its queue, counters, wake-up and background loop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from kiosk_agent.fleet.queue import ReportQueue
from kiosk_agent.redact import redact
from kiosk_agent.tasks import BackgroundTask

_LOGGER = logging.getLogger(__name__)

# What a sink's goodbye may take on a clean stop (the report that says `stopped`, MQTT's
# `offline`): every sink says it at once, so the whole stop waits at most this for them, within
# the stop's margin beside the drain (core/systemd.py STOP_MARGIN). A destination that does
# not answer by then is not waited for: the process must exit.
GOODBYE_TIMEOUT = 3.0


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

    def __init__(self, queue_size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.queue = ReportQueue(queue_size)
        self._trouble_clock = clock
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
        await self._loop.stop()

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
