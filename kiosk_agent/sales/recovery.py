"""Recovery: on start, every sale a crash (or a stop) left open is driven to an end.

The journal's last step says what might have happened; the service says what did. The rules:

- nothing was sent yet, or only a card read: no money moved, the sale FAILED;
- a charge whose answer was lost is looked up (the interaction's status, then reporting by
  ``order_id``) before anything is sent again;
- money taken whose dispense was not confirmed is voided or refunded (REVERSED);
- a confirmed dispense whose capture was interrupted is captured (COMPLETED);
- what cannot be decided is marked ATTENTION and reported, never guessed.

While a sale that held its terminal is being recovered, that terminal refuses new sales; a sale
that had released it (capturing, giving the money back) is recovered beside them, at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from kiosk_agent.sales.journal import Journal, JournalError, SaleMoved, SaleRecord
from kiosk_agent.sales.model import Flow, SaleEvent
from kiosk_agent.sales.runner import SaleRunner
from kiosk_agent.sales.states import SaleState, Step, TransitionRefused
from kiosk_agent.sales.steps import SaleContext, SaleSteps
from kiosk_agent.tasks import cancel_and_wait

if TYPE_CHECKING:
    pass

_LOGGER = logging.getLogger(__name__)

# Open sales that no longer held their terminal: the dispense outcome was known and what
# remained needed only the payments API (SaleFlow.release_terminal).
TERMINAL_FREE = frozenset({SaleState.CAPTURING, SaleState.REVERSING})


def released_its_terminal(record: SaleRecord, journal: Journal) -> bool:
    """Whether the open sale had let its terminal go: capturing or giving money back, or an
    authorization's lost answer being found out (the card was read; SaleFlow._answer_lost),
    UNRESOLVED or still AUTHORIZING while reporting's first answer was awaited. A charge-card's
    lost answer keeps it: its interaction may still be live."""
    if record.flow == Flow.AUTHORIZE_CAPTURE and record.state is SaleState.AUTHORIZING:
        return any(s.step == Step.AUTHORIZE_LOST for s in journal.steps(record.sale_id))
    if record.state is SaleState.UNRESOLVED:
        return record.flow == Flow.AUTHORIZE_CAPTURE
    return record.state in TERMINAL_FREE


class Recovery:
    """Finishes the open sales of the journal; run once per start, in the background."""

    def __init__(self, context: SaleContext, runner: SaleRunner) -> None:
        self.context = context
        self.service = context.service
        self.journal = context.journal
        self.settings = context.settings
        self.runner = runner
        self.clock = context.clock
        self._task: asyncio.Task[list[SaleEvent]] | None = None
        self.started_at: float | None = None  # Unix time, for display
        self.finished_at: float | None = None
        self._started_mono = 0.0
        self.found = 0  # open sales found on start
        self.recovered = 0  # of those, driven to an end
        self._released: set[str] = set()  # of those, the ones that had let their terminal go
        self.not_ours: list[str] = []  # open sales of another unit id, left as they are
        # waited for before any money moves: False when the journal's file is found damaged
        # (core/journal_guard.py reads it whole after it opened)
        self.before_money: Callable[[], Awaitable[bool]] | None = None

    @property
    def state(self) -> str:
        """``idle`` (not started), ``running``, or ``done``: outside tools wait for ``done``."""
        if self.started_at is None:
            return "idle"
        return "done" if self.finished_at is not None else "running"

    def status(self) -> dict[str, object]:
        return {
            "state": self.state,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "sales_found": self.found,
            "sales_recovered": self.recovered,
        }

    def start(self) -> list[SaleRecord]:
        """Block the terminals of open sales and start finishing them; return those sales."""
        open_sales = self._own(self.journal.open_sales())
        by_terminal: dict[str, list[SaleRecord]] = defaultdict(list)
        for record in open_sales:
            by_terminal[record.terminal].append(record)
            if record.state is SaleState.DISPENSING:  # the machine may still report its vend
                self.runner.was_dispensing(record)
            if released_its_terminal(record, self.journal):
                self._released.add(record.sale_id)
            else:
                self.runner.block(
                    record.terminal, f"recovering sale {record.sale_id}", by="recovery"
                )
        if open_sales:
            _LOGGER.warning("recovering %d open sale(s) from the journal", len(open_sales))
        self.started_at = self.clock.time()
        self._started_mono = self.clock.monotonic()
        self.found = len(open_sales)
        if not open_sales:  # nothing to wait for: ready at once
            self.finished_at = self.started_at
            _LOGGER.info("recovery finished: no open sales in the journal")
            return open_sales
        self._task = asyncio.create_task(self._run(by_terminal), name="recovery")
        return open_sales

    def _own(self, open_sales: list[SaleRecord]) -> list[SaleRecord]:
        """The open sales this unit may finish: another unit's (a journal cloned, adopted under
        a new id) stay as they are, their money that unit's (sales/unit.py)."""
        unit = self.context.unit
        own = [r for r in open_sales if unit.owns_sale(r.order_id)]
        self.not_ours = [r.sale_id for r in open_sales if not unit.owns_sale(r.order_id)]
        if self.not_ours:
            _LOGGER.warning("recovery: %d open sale(s) of the journal are not unit %s's (%s) "
                            "and are left as they are: a person decides", len(self.not_ours),
                            unit.id, unit.mismatch or "made under another unit id")
        return own

    async def wait(self) -> list[SaleEvent]:
        """Until every open sale found on start has ended."""
        if self._task is None:
            return []
        return await asyncio.shield(self._task)

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            await cancel_and_wait(self._task)

    async def _run(self, by_terminal: dict[str, list[SaleRecord]]) -> list[SaleEvent]:
        if self.before_money is not None and not await self.before_money():
            _LOGGER.error("recovery: the journal's file is damaged; its %d open sale(s) are "
                          "left to the start that moves it aside", self.found)
            return []
        results = await asyncio.gather(
            *(self._terminal(device, records) for device, records in by_terminal.items())
        )
        events = [event for events in results for event in events]
        self.recovered = sum(1 for event in events if event.state.final)
        self.finished_at = self.clock.time()
        _LOGGER.info(
            "recovery finished: %d of %d open sale(s) ended in %.0f ms",
            self.recovered,
            self.found,
            (self.clock.monotonic() - self._started_mono) * 1000,
        )
        return events

    async def _terminal(self, device: str, records: list[SaleRecord]) -> list[SaleEvent]:
        """One terminal's open sales. Those that held it are finished one after the other, the
        terminal refusing new sales meanwhile; those that had released it (a capture, money
        given back: the payments API only) each at once, neither waiting behind a sale that may
        take until its money call's deadline nor holding the terminal."""
        holding = [r for r in records if r.sale_id not in self._released]
        released = [r for r in records if r.sale_id in self._released]

        async def in_turn() -> list[SaleEvent]:
            try:
                return await self._in_turn(holding)
            finally:
                self.runner.unblock(device, by="recovery")

        lanes = await asyncio.gather(in_turn(), *(self._in_turn([r]) for r in released))
        return [event for lane in lanes for event in lane]

    async def _in_turn(self, records: list[SaleRecord]) -> list[SaleEvent]:
        events = []
        for record in records:
            steps = SaleSteps(record, self.context)
            try:
                events.append(await self.recover(steps))
            except JournalError:
                keep = self.context.on_unwritten
                if steps.unwritten is None or keep is None:
                    raise
                keep(steps)  # finished once the journal takes writes again
            except SaleMoved as err:  # another writer decided it meanwhile: theirs stands
                _LOGGER.warning("sale %s: left as the journal has it: %s", record.sale_id, err)
            except Exception as err:  # a person decides: better than a guess or a stuck sale
                _LOGGER.exception("sale %s: recovery failed", record.sale_id)
                try:
                    events.append(
                        steps.finish(
                            SaleState.ATTENTION,
                            Step.RECOVERY_ERROR,
                            f"recovery could not decide: {err}",
                        )
                    )
                except (SaleMoved, TransitionRefused) as refused:  # the others go on
                    _LOGGER.error("sale %s: not marked attention: %s", record.sale_id, refused)
        return events

    async def recover(self, steps: SaleSteps) -> SaleEvent:
        """Drive one open sale to an end (sales/recover_sale.py: imported by the first sale
        recovered, which most starts never find)."""
        from kiosk_agent.sales.recover_sale import SaleRecoverer

        return await SaleRecoverer(self.context).recover(steps)
