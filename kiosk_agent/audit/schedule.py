"""Reads of the machine's audit on a schedule: never during a sale, retried with back-off.

``AuditSchedule.run`` reads every ``interval`` seconds (the ``dex:`` section). A read waits until
no sale is in progress on the machine (``busy()``, asked every ``busy_poll`` seconds) and is
stopped, not failed, when one starts meanwhile: some controllers do not vend while their DEX
port talks. A failed read is retried after a capped exponential back-off. Each read that
arrives whole is parsed and handed to ``on_audit`` (the books keep it); a handler that fails is
counted and shown, never the end of the schedule. ``status()`` is what health shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kiosk_agent.audit.evadts import AuditError, AuditFile, parse_audit
from kiosk_agent.audit.link import LinkError, LinkRead, LinkSettings, read_audit
from kiosk_agent.platforms.serial import backoff_delay
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock

_LOGGER = logging.getLogger(__name__)

AuditHandler = Callable[[AuditFile, LinkRead], Awaitable[None]]


class ReadState(enum.StrEnum):
    IDLE = "idle"
    WAITING = "waiting for the machine to be idle"
    READING = "reading"
    BACKING_OFF = "backing off after a failed read"


@dataclass
class ScheduleStats:
    reads_ok: int = 0
    reads_failed: int = 0
    reads_stopped: int = 0  # a sale started meanwhile
    handler_errors: int = 0
    consecutive_failures: int = 0
    last_ok_at: float | None = None  # wall time, for people
    last_error: str = ""


class AuditSchedule:
    def __init__(
        self,
        settings: LinkSettings,
        *,
        interval: float,
        busy: Callable[[], bool],
        on_audit: AuditHandler | None = None,
        clock: Clock = SYSTEM_CLOCK,
        retry_min: float = 30.0,
        busy_poll: float = 0.2,
    ) -> None:
        self.settings = settings
        self.interval = interval
        self.retry_min = min(retry_min, interval)
        self.busy_poll = busy_poll
        self.stats = ScheduleStats()
        self._busy = busy
        self._on_audit = on_audit
        self._clock = clock
        self.state = ReadState.IDLE

    def _set(self, state: ReadState) -> None:
        self.state = state

    async def run(self) -> None:
        """Read, wait, read again, for ever (cancel to stop)."""
        while True:
            ok = await self.run_once()
            await self._clock.sleep(self.next_delay(ok))

    def next_delay(self, ok: bool) -> float:
        if ok or not self.stats.consecutive_failures:
            return self.interval
        self._set(ReadState.BACKING_OFF)
        attempt = self.stats.consecutive_failures - 1
        return backoff_delay(attempt, self.retry_min, self.interval)

    async def run_once(self) -> bool:
        """One read when the machine is idle; True when an audit arrived and was handed on."""
        self._set(ReadState.WAITING)
        while self._busy():
            await self._clock.sleep(self.busy_poll)
        self._set(ReadState.READING)
        try:
            read = await self._read_unless_a_sale_starts()
        finally:
            self._set(ReadState.IDLE)
        if read is None:
            return False
        try:
            audit = parse_audit(read.audit)
        except AuditError as err:
            self._failed(f"the machine's audit is malformed: {err}")
            return False
        self.stats.reads_ok += 1
        self.stats.consecutive_failures = 0
        self.stats.last_ok_at = self._clock.time()
        await self._hand_on(audit, read)
        return True

    async def _read_unless_a_sale_starts(self) -> LinkRead | None:
        reading = asyncio.ensure_future(read_audit(self.settings, clock=self._clock))
        try:
            while not reading.done():
                await asyncio.sleep(0)  # let it run before each look
                if reading.done():
                    break
                if self._busy():
                    reading.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await reading
                    self.stats.reads_stopped += 1
                    _LOGGER.info("audit read on %s stopped: a sale started", self.settings.port)
                    return None
                waiting = asyncio.ensure_future(self._clock.sleep(self.busy_poll))
                await asyncio.wait({reading, waiting}, return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
            return reading.result()
        except LinkError as err:
            self._failed(str(err))
            return None
        finally:
            if not reading.done():
                reading.cancel()

    def _failed(self, reason: str) -> None:
        self.stats.reads_failed += 1
        self.stats.consecutive_failures += 1
        self.stats.last_error = reason
        _LOGGER.warning("audit read on %s failed: %s", self.settings.port, reason)

    async def _hand_on(self, audit: AuditFile, read: LinkRead) -> None:
        if self._on_audit is None:
            return
        try:
            await self._on_audit(audit, read)
        except Exception as err:  # counted and shown: the next read still comes
            self.stats.handler_errors += 1
            self.stats.last_error = f"keeping the audit failed: {type(err).__name__}: {err}"
            _LOGGER.exception("audit read on %s: keeping it failed", self.settings.port)

    def status(self) -> dict[str, object]:
        """For health: how the reads go."""
        stats = self.stats
        return {
            "state": self.state.value,
            "port": self.settings.port,
            "reads_ok": stats.reads_ok,
            "reads_failed": stats.reads_failed,
            "reads_stopped_for_a_sale": stats.reads_stopped,
            "consecutive_failures": stats.consecutive_failures,
            "handler_errors": stats.handler_errors,
            "last_ok_at": stats.last_ok_at,
            "last_error": stats.last_error,
        }
