"""Sales whose step could not be journaled: kept in memory, written and finished once it can.

A step that fails to write stops its flow before the call the step announces (the rule of the
journal); but the call before it may have moved money (the card was charged, and the
``charged`` step could not be written). Such a sale is not left to a person nor to the next
start: it is kept here, its terminal refuses new sales, and every ``retry`` seconds its steps
are written again (``Journal.restore``: each step memory took, replayed from the sale on disk
through the transition table as any write, then a ``journal.restored`` step). The first write
that works hands it to recovery's rules, which finish it the way a restart would (money not
confirmed dispensed is given back, a confirmed vend is captured).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from kiosk_agent.sales.journal import Journal, JournalError, SaleMoved, SaleRecord
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.recovery import Recovery
from kiosk_agent.sales.runner import SaleRunner
from kiosk_agent.sales.states import REQUEST_STEPS, SaleState, Step, TransitionRefused
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
        self._refused: set[str] = set()  # kept: their steps cannot be written (said once)
        self.unexpected = 0  # bugs caught while writing a sale again (health counts them)
        self.finished = 0
        self._loop = BackgroundTask(self._run, "unwritten-sales")

    # -- what others see -----------------------------------------------------------------------

    @property
    def sale_ids(self) -> list[str]:
        return list(self._kept)

    @property
    def records(self) -> list[SaleRecord]:
        """Each kept sale as memory holds it (its unwritten step applied)."""
        return [steps.unwritten or steps.record for steps, _ in self._kept.values()]

    def oldest_age(self, now: float | None = None) -> float:
        """Seconds the oldest kept sale has waited for the journal (0 when none waits)."""
        if not self._kept:
            return 0.0
        since = min(at for _, at in self._kept.values())
        return (now if now is not None else self.journal.clock.monotonic()) - since

    # -- keeping and finishing -----------------------------------------------------------------

    def keep(self, steps: SaleSteps) -> None:
        """A sale whose step failed to write (``steps.unwritten`` holds it as it should be)."""
        sale_id = steps.record.sale_id
        since = self._kept[sale_id][1] if sale_id in self._kept else self.journal.clock.monotonic()
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
                try:
                    await self._finish(steps)
                except Exception:  # a bug: said and counted; the sale stays kept, tried again
                    self.unexpected += 1
                    _LOGGER.exception("sale %s: writing it again failed", steps.record.sale_id)
            if not self._kept:
                await self._wakeup.wait()
                continue
            # the journal's clock (a FakeClock in tests); its wait_for is asyncio.timeout, not
            # asyncio.wait_for, which on 3.11 swallows a stop's cancel landing with a wake-up
            with contextlib.suppress(TimeoutError):
                await self.journal.clock.wait_for(self._wakeup.wait(), self.retry)

    async def _finish(self, steps: SaleSteps) -> SaleEvent | None:
        sale_id = steps.record.sale_id
        wanted = steps.unwritten or steps.record
        unsent = self._never_sent(steps)
        try:
            steps.record = self.journal.restore(
                sale_id, steps.held, RESTORED_STEP, {"state": wanted.state.value}
            )
        except JournalError:
            return None  # still not writable: the next round tries again
        except SaleMoved as moved:
            return self._decided_elsewhere(steps, moved)
        except TransitionRefused as err:
            # memory's steps do not follow from what the disk holds: nothing written; kept
            # (its terminal out of service, health names it) for a person to decide
            if sale_id not in self._refused:
                self._refused.add(sale_id)
                _LOGGER.error("sale %s: its steps cannot be written again: %s; kept for a "
                              "person", sale_id, err)
            return None
        self._refused.discard(sale_id)
        steps.unwritten, steps.held = None, []
        _LOGGER.warning("sale %s: written to the journal again (%s); finishing it",
                        sale_id, wanted.state.value)
        event: SaleEvent | None = None
        try:
            if steps.record.state.final:
                event = steps.publish(RESTORED_STEP)
            else:
                event = await self.recovery.recover(steps, unsent=unsent)
        except JournalError:  # the journal failed again: kept, tried again
            self.keep(steps)
            return None
        except Exception as err:
            _LOGGER.exception("sale %s: finishing after the journal came back failed", sale_id)
            with contextlib.suppress(JournalError):
                event = steps.finish(
                    SaleState.ATTENTION, Step.RECOVERY_ERROR, f"recovery could not decide: {err}"
                )
        self._let_go(steps)
        return event

    def _never_sent(self, steps: SaleSteps) -> bool:
        """Memory holds the sale's money request (``REQUEST_STEPS``) and the journal holds none
        of its own before this restore: that call never left, as every money call is sent only
        once its step is on disk. A request on disk, from this attempt or an earlier one, may
        have been sent: then not (recovery waits its answer's deadline, as after a crash); so
        too when the journal cannot be read."""
        if not any(held.step in REQUEST_STEPS for held in steps.held):
            return False
        try:
            on_disk = self.journal.steps(steps.record.sale_id)
        except JournalError:
            return False
        return not any(step.step in REQUEST_STEPS for step in on_disk)

    def _decided_elsewhere(self, steps: SaleSteps, moved: SaleMoved) -> SaleEvent | None:
        """Another writer (``kiosk-agent sales resolve``, a tech's shell) decided the sale on
        disk while memory held it: that decision stands, as recovery leaves it. A sale the
        journal does not hold at all stays kept, for a person."""
        sale_id = steps.record.sale_id
        held = self.journal.get(sale_id)
        if held is None:
            if sale_id not in self._refused:
                self._refused.add(sale_id)
                _LOGGER.error("sale %s: not in the journal any more (%s); kept for a person",
                              sale_id, moved)
            return None
        _LOGGER.warning("sale %s: decided elsewhere meanwhile (%s): left as the journal has it",
                        sale_id, held.state.value)
        steps.record, steps.unwritten, steps.held = held, None, []
        event = steps.publish()
        self._let_go(steps)
        return event

    def _let_go(self, steps: SaleSteps) -> None:
        self._refused.discard(steps.record.sale_id)
        self._kept.pop(steps.record.sale_id, None)
        if not any(s.device == steps.device for s, _ in self._kept.values()):
            self.runner.unblock(steps.device, by="unwritten")
        self.finished += 1
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
