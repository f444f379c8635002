"""Sales whose step could not be journaled: kept in memory, written and finished once it can.

A step that fails to write stops its flow before the call the step announces (the rule of the
journal); but the call before it may have moved money (the card was charged, and the
``charged`` step could not be written). Such a sale is not left to a person nor to the next
start: it is kept here, its terminal refuses new sales, and every ``retry`` seconds the whole
sale is written again (``Journal.restore``: the row as memory holds it, with a
``journal.restored`` step). The first write that works hands it to recovery's rules, which
finish it the way a restart would (money not confirmed dispensed is given back, a confirmed vend
is captured).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from kiosk_agent.sales.journal import Journal, JournalError, SaleRecord
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.recovery import Recovery
from kiosk_agent.sales.runner import SaleRunner
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.sales.steps import SaleSteps
from kiosk_agent.tasks import BackgroundTask

_LOGGER = logging.getLogger(__name__)

RESTORED_STEP = Step.JOURNAL_RESTORED


class UnwrittenSales:
    """Keeps the sales the journal could not take, and finishes each once it takes writes."""

    def __init__(
        self,
        journal: Journal,
        runner: SaleRunner,
        recovery: Recovery,
        *,
        retry: float = 0.5,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.journal = journal
        self.runner = runner
        self.recovery = recovery
        self.retry = retry
        self.on_change = on_change
        self._kept: dict[str, tuple[SaleSteps, float]] = {}  # sale_id -> (steps, kept since)
        self._wakeup = asyncio.Event()
        self.finished = 0
        self._loop = BackgroundTask(self._run, "unwritten-sales")

    # -- what others see -----------------------------------------------------------------------

    @property
    def sale_ids(self) -> list[str]:
        return list(self._kept)

    @property
    def records(self) -> list[SaleRecord]:
        return [steps.record for steps, _ in self._kept.values()]

    def oldest_age(self, now: float | None = None) -> float:
        """Seconds the oldest kept sale has waited for the journal (0 when none waits)."""
        if not self._kept:
            return 0.0
        since = min(at for _, at in self._kept.values())
        return (now if now is not None else time.monotonic()) - since

    # -- keeping and finishing -----------------------------------------------------------------

    def keep(self, steps: SaleSteps) -> None:
        """A sale whose step failed to write (``steps.unwritten`` holds it as it should be)."""
        sale_id = steps.record.sale_id
        since = self._kept[sale_id][1] if sale_id in self._kept else time.monotonic()
        self._kept[sale_id] = (steps, since)
        self.runner.block(steps.device, f"sale {sale_id} is not journaled yet", by="unwritten")
        self._changed()
        self._wakeup.set()

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    def wake(self) -> None:
        """Try now (the journal just took a write)."""
        if self._kept:
            self._wakeup.set()

    async def _run(self) -> None:
        while True:
            self._wakeup.clear()
            for steps, _since in list(self._kept.values()):
                await self._finish(steps)
            wait = self.retry if self._kept else None
            # asyncio.timeout, not wait_for: on 3.11 a wake-up that lands with a stop's cancel
            # makes wait_for return and swallow the cancel (the stop then waits a whole round)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wakeup.wait()

    async def _finish(self, steps: SaleSteps) -> SaleEvent | None:
        sale_id = steps.record.sale_id
        wanted = steps.unwritten or steps.record
        try:
            steps.record = self.journal.restore(
                wanted, RESTORED_STEP, {"state": wanted.state.value}
            )
        except JournalError:
            return None  # still not writable: the next round tries again
        steps.unwritten = None
        _LOGGER.warning("sale %s: written to the journal again (%s); finishing it",
                        sale_id, wanted.state.value)
        event: SaleEvent | None = None
        try:
            if steps.record.state.final:
                event = steps.publish(RESTORED_STEP)
            else:
                event = await self.recovery.recover(steps)
        except JournalError:  # the journal failed again: kept, tried again
            self.keep(steps)
            return None
        except Exception as err:
            _LOGGER.exception("sale %s: finishing after the journal came back failed", sale_id)
            with contextlib.suppress(JournalError):
                event = steps.finish(
                    SaleState.ATTENTION, Step.RECOVERY_ERROR, f"recovery could not decide: {err}"
                )
        self._kept.pop(sale_id, None)
        if not any(s.device == steps.device for s, _ in self._kept.values()):
            self.runner.unblock(steps.device, by="unwritten")
        self.finished += 1
        self._changed()
        return event

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
