"""Recovery: on start, every sale a crash (or a stop) left open is driven to an end.

The journal's last step says what might have happened; the service says what did. The rules:

- nothing was sent yet, or only a card read: no money moved, the sale FAILED;
- a charge whose answer was lost is looked up (the interaction's status, then reporting by
  ``order_id``) before anything is sent again;
- money taken whose dispense was not confirmed is voided or refunded (REVERSED); a sale left
  dispensing is first listened for, on this boot until its vend timeout, through its trigger
  (the controller may still say how the vend ended): a success is captured, a failure or
  silence gives the money back (:meth:`Recovery._dispensing`);
- a confirmed dispense whose capture was interrupted is captured (COMPLETED);
- what cannot be decided is marked ATTENTION and reported, never guessed.

While a sale that held its terminal is being recovered, that terminal refuses new sales; a sale
that had released it (capturing, giving the money back) is recovered beside them, at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from kiosk_agent.sales.clock import Anchor
from kiosk_agent.sales.journal import Journal, JournalError, SaleMoved, SaleRecord, StepRecord
from kiosk_agent.sales.kinds import CARD_FIRST_PLATFORMS
from kiosk_agent.sales.late_vends import maybe_note
from kiosk_agent.sales.model import UNHEARD_ENDS, DispenseStatus, Flow, SaleEvent, unheard_end
from kiosk_agent.sales.runner import VEND_DENIED_UNWRITTEN, SaleRunner
from kiosk_agent.sales.states import SaleState, Step, TransitionRefused
from kiosk_agent.sales.steps import SaleContext, SaleSteps
from kiosk_agent.tasks import cancel_and_wait

if TYPE_CHECKING:
    from kiosk_agent.sales.recover_sale import HeldOrNone

_LOGGER = logging.getLogger(__name__)

# Open sales that no longer held their terminal: the dispense outcome was known and what
# remained needed only the payments API (SaleFlow.release_terminal).
TERMINAL_FREE = frozenset({SaleState.CAPTURING, SaleState.REVERSING})
# why a vend left in flight and never heard may have gone out (its late.vend's ``unsure``)
UNHEARD = "the agent stopped mid-vend; no vend result heard after the restart"


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


def unheard_vend(record: SaleRecord, steps: list[StepRecord]) -> tuple[str, int] | None:
    """The vend a sale's journal says was approved and never said how it ended: (product, the
    price it was approved for), or None: from the journal's facts, whichever path decided the
    give-back. A vend is approved by ``dispense.request`` (selection first: C,VEND;
    ``approved_by_request``), card first by the customer's choice (``dispense.chosen``, its
    price). Not when the machine said how it ended (a ``dispense.result`` other than the sale's
    own giving up, ``UNHEARD_ENDS``: a timeout is no word from the machine), the vend was
    confirmed (captured or completed), or a late vend is journaled already (told once)."""
    if record.state is SaleState.COMPLETED or record.vended_cents:
        return None
    names = {s.step for s in steps}
    said = any(s.step == Step.DISPENSE_RESULT
               and not unheard_end(s.detail.get("status"), s.detail.get("unheard"))
               for s in steps)
    if (Step.DISPENSE_REQUEST not in names or said
            or Step.LATE_VEND in names or Step.CAPTURE_REQUEST in names):
        return None
    chosen = customer_choice(steps)
    if chosen is not None:
        # not as the flow writes it: told all the same, at the sale's price (a choice was
        # journaled, so a vend may have been approved)
        return chosen.product or record.product or "", chosen.cents or record.amount_cents
    if not approved_by_request(record, steps):
        return None  # card first, nothing chosen: no vend approved
    return record.product or "", record.amount_cents


# What the sale ends with when its vend was refused because the journal took no writes: no vend
# was approved, nothing vended, the money's hold given back as any sale not dispensed.
DENIED_UNWRITTEN_WHY = ("vend refused before it was approved: the journal could not be written "
                        "(disk full or read-only); nothing vended")


class Choice(NamedTuple):
    """A card-first customer's choice, as its ``dispense.chosen`` step holds it
    (``AuthorizeCaptureFlow._chosen``): the product; the price, None unless a whole number of
    cents above nothing (the flow approves no vend of nothing: ``vend_refusal``); and when it
    was chosen on the boot that chose it (monotonic), None unless a number; and the step's
    detail as written (for the log line that says why it is not listened for)."""

    product: str
    cents: int | None
    mono: float | None
    written: Mapping[str, Any]


def customer_choice(steps: list[StepRecord]) -> Choice | None:
    """The sale's last ``dispense.chosen``, read once for recovery's two uses; None when the
    customer never chose. A step not as the flow writes it (a hand-edited journal) is still a
    choice, its unreadable fields None, and the two uses read that differently on purpose:
    telling a person of a vend that may have gone out unheard (``unheard_vend``) errs towards
    telling, at the sale's price; listening for the vend (``Recovery._hearing``), whose success
    is captured at the chosen price, needs both the price and the time, else it listens for
    nothing and the money goes back."""
    chosen = next((s.detail for s in reversed(steps) if s.step == Step.DISPENSE_CHOSEN), None)
    if chosen is None:
        return None
    cents, mono = chosen.get("cents"), chosen.get("mono")
    return Choice(
        product=str(chosen.get("product") or ""),
        cents=cents if type(cents) is int and cents > 0 else None,
        mono=float(mono) if isinstance(mono, int | float) and not isinstance(mono, bool)
        else None,
        written=chosen,
    )


def approved_by_request(record: SaleRecord, steps: list[StepRecord]) -> bool:
    """Whether the sale's ``dispense.request`` approved its vend (selection first: C,VEND),
    not a card-first session's opening (C,START), whose vend only the customer's choice
    approves (``dispense.chosen``). A charge_card sale, or one naming its product, is selection
    first; an authorize_capture sale naming none says which on its ``created`` step
    (``chosen_at_machine``, 2026-11-30; SaleRunner.start). A journal of an earlier release does
    not: the platform that made the sale says (its source, ``platform:name``): only those with
    a card-first mode (``mdb``, the demo's ``virtual``: sales.kinds) open card-first sessions;
    a kiosk app's, a serial line's sale for an amount approved its
    vend with its request (2026-11-30, i41-review-money: read as card first, such a sale was
    not listened for after a restart, its money given back at once, untold)."""
    if record.flow != Flow.AUTHORIZE_CAPTURE or record.product:
        return True
    created = next((s.detail for s in steps if s.step == Step.CREATED), {})
    said = created.get("chosen_at_machine")
    if isinstance(said, bool):
        return not said
    return record.source.partition(":")[0] not in CARD_FIRST_PLATFORMS



class Recovery:
    """Finishes the open sales of the journal; run once per start, in the background."""

    def __init__(self, context: SaleContext, runner: SaleRunner) -> None:
        self.context = context
        self.journal = context.journal
        self.runner = runner
        self.clock = context.clock
        self._task: asyncio.Task[list[SaleEvent]] | None = None
        self.started_at: float | None = None  # Unix time, for display
        self.finished_at: float | None = None
        self._started_mono = 0.0
        self.found = 0  # open sales found on start
        self.recovered = 0  # of those, driven to an end
        self._released: set[str] = set()  # of those, the ones that had let their terminal go
        # terminal -> the last of its open sales that held it (recovered last, in turn)
        self._last_holding: dict[str, str] = {}
        self.not_ours: list[str] = []  # open sales of another unit id, left as they are
        # told when a hearing ends (the agent: health.problem_changed, so the page hears it)
        self.on_listening_change: Callable[[], None] | None = None
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
                hearing = self._hearing(record)
                if hearing is not None:  # before the triggers start: their setup waits for it
                    due, cents = hearing
                    self.runner.listen_after_restart(record.sale_id, due=due, cents=cents,
                                                     terminal=record.terminal)
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
            if holding:  # the sale after which the terminal is free for the next customer
                self._last_holding[device] = holding[-1].sale_id
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

    async def recover(self, steps: SaleSteps, *, unsent: bool = False) -> SaleEvent:
        """Drive one open sale to an end (sales/recover_sale.py: imported by the first sale
        recovered, which most starts never find). ``unsent``: no money call of this sale ever
        left (sales/unwritten.py proves it), so no answer is waited for."""
        from kiosk_agent.sales.recover_sale import SaleRecoverer

        return await SaleRecoverer(self.context, dispensing=self._dispensing,
                                   unheard=self._unheard,
                                   told=self.runner.late_vends.noted).recover(steps,
                                                                              unsent=unsent)

    def _hearing(self, record: SaleRecord) -> tuple[float, int] | None:
        """Until when (this boot's monotonic time) ``record``'s vend is listened for, and the
        price it was approved for; None when there is nothing to listen for: another boot (a
        power cut: the controller restarted too, its vend is over), a machine that started anew
        with this agent (the demo's ``virtual`` one), a card-first sale whose customer had not
        chosen (no vend was approved), no dispense request journaled, a vend whose failure was
        journaled (``dispense.result``: a kill before its give-back), or its deadline passed.

        Selection first, the vend was approved in the commit that journaled the money's answer
        (``approved_for_vend``): the ``dispense.request`` step's wall time, measured from the
        money call's send (monotonic, this boot), within the call's answer window; at the price
        asked. Card first, as its choice was journaled (the ``dispense.chosen`` step, with this
        boot's monotonic time), at the chosen price. Then the trigger's ``vend_timeout``."""
        anchor = Anchor(record.sent_at or 0.0, record.sent_mono, record.sent_boot)
        if (record.sent_at is None or anchor.mono is None or not anchor.same_boot(self.clock)
                or not self.runner.hears_after_restart(record.source)):
            return None
        steps = self.journal.steps(record.sale_id)
        if any(s.step == Step.DISPENSE_RESULT for s in steps):
            return None  # the machine said the vend was not made: over, its result known
        chosen = customer_choice(steps)
        asked = [s.at for s in steps if s.step == Step.DISPENSE_REQUEST]
        if chosen is not None:
            # not as the flow writes it (no price, no time, or a time this boot had not come
            # to, nan too): not listened for
            if (chosen.cents is None or chosen.mono is None
                    or not chosen.mono <= self.clock.monotonic()):
                _LOGGER.warning("sale %s: its choice's step is not as written (%r): its vend "
                                "is not listened for", record.sale_id, chosen.written)
                return None
            approved, cents = chosen.mono, chosen.cents
        elif asked and approved_by_request(record, steps):  # else card first, nothing chosen
            window = float("inf") if record.answer_by is None else (
                record.answer_by - record.sent_at)
            approved = anchor.mono + min(max(0.0, asked[-1] - record.sent_at), max(0.0, window))
            cents = record.amount_cents
        else:
            return None
        due = approved + self.runner.vend_timeout_of(record.source)
        return (due, cents) if due > self.clock.monotonic() else None

    async def _dispensing(self, steps: SaleSteps, held_or_none: HeldOrNone) -> SaleEvent:
        """Left dispensing: listened for until its vend's deadline when the machine may still
        say how the vend ended (standing rule 13); then settled on what it said, also when it
        said so before recovery came to this sale. Silence, or nothing to listen for, gives the
        money back as before."""
        why = "interrupted before the dispense was confirmed"
        record = steps.record
        vend = self.runner.restart_vend(record.sale_id)
        try:
            if vend is None:
                if self._denied_unwritten(record.sale_id):
                    why = DENIED_UNWRITTEN_WHY
                return await self._given_back(steps, held_or_none, why)
            if not vend.heard.done():
                left = max(0.0, vend.due - self.clock.monotonic())
                _LOGGER.warning("sale %s: left dispensing; listening for its vend result for "
                                "%.1f s", record.sale_id, left)
                # a result the runner took as the deadline passed (the platform counts it
                # settled and makes no late vend of it) is settled on, not dropped as silence
                with contextlib.suppress(TimeoutError):
                    await self.clock.wait_for(asyncio.shield(vend.heard), left)
            outcome = vend.heard.result() if vend.heard.done() else None
        finally:
            self._stop_listening(record.sale_id)
        # what is left is the payments API's (a capture, or money given back): as a live sale
        # lets its terminal go before its capture, the terminal's last sale lets it go here
        if self._last_holding.get(record.terminal) == record.sale_id:
            self.runner.unblock(record.terminal, by="recovery")
        if outcome is None:
            return await self._given_back(
                steps, held_or_none,
                f"{why}: no vend result within its vend timeout after the restart")
        heard = {"status": outcome.status.value, "detail": outcome.detail,
                 "after_restart": True}
        if outcome.status is not DispenseStatus.VENDED:
            steps.step(Step.DISPENSE_RESULT, detail=heard)
            why = f"dispense {outcome.status.value} {outcome.detail} (heard after the restart)"
            if outcome.status in UNHEARD_ENDS:  # ended with no word of it (mdb: a selection)
                return await self._given_back(steps, held_or_none, why)
            return await held_or_none(steps, why)
        # the price the vend was approved for (asked, or chosen), within what the money holds
        held = record.captured_cents if record.flow == Flow.CHARGE_CARD else (
            record.authorized_cents)
        cents = min(vend.cents, held)
        if record.flow == Flow.CHARGE_CARD:
            return steps.finish(
                SaleState.COMPLETED, Step.RECOVERY_DONE,
                "dispensed (the machine said so after the restart); paid",
                vended_cents=cents, detail=heard)
        return await steps.capture(cents, heard)

    def _denied_unwritten(self, sale_id: str) -> bool:
        """The machine was told no because the vend's approval (``dispense.request``, card
        first ``dispense.chosen``) could not be journaled: the runner held that end with the
        sale (``VEND_DENIED_UNWRITTEN``), written once the journal took writes again."""
        return any(s.step == Step.DISPENSE_RESULT
                   and s.detail.get("detail") == VEND_DENIED_UNWRITTEN
                   for s in self.journal.steps(sale_id))

    async def _given_back(self, steps: SaleSteps, held_or_none: HeldOrNone,
                          why: str) -> SaleEvent:
        """A sale left dispensing whose vend no result was heard of: its money goes back, and
        a person is told the product may have gone out (``_unheard``) in the same commit as the
        give-back's request, so a kill during the give-back cannot leave it untold (2026-11-30:
        the note written after the give-back was lost to a kill after ``reverse.request``, the
        next start finishing the sale by its reversing path, told to nobody)."""
        told = self._unheard(steps.record)
        ended = await held_or_none(steps, why, told=told)
        if told is not None:
            self.runner.late_vends.noted(steps.record.sale_id, told)
        return ended

    def _unheard(self, record: SaleRecord) -> dict[str, Any] | None:
        """The maybe late vend (``late.vend`` with ``unsure``) of a sale whose vend was approved
        and whose end no agent heard (``unheard_vend``: from the journal's facts, not from the
        path that ran): the machine may have made it while no agent listened, its money going
        back. Told to a person as the runner tells a dispenser's error (health's problem until
        acknowledged, ``sales late-vends``), never silently: the chaos runs found each such sale
        vended (2026-11-30, i40-chaos). None when the vend cannot have been made unheard: the
        machine said it failed, a card-first customer never chose, or the trigger's machine
        starts anew with the agent (the demo's ``virtual``: its vend died with it); or when the
        sale is told already."""
        if not self.runner.hears_after_restart(record.source):
            return None
        vend = unheard_vend(record, self.journal.steps(record.sale_id))
        if vend is None:
            return None
        product, cents = vend
        return maybe_note(product, record.source, UNHEARD, cents)

    def _stop_listening(self, sale_id: str) -> None:
        if self.runner.stop_listening(sale_id) and self.on_listening_change:
            self.on_listening_change()

    def listening_problem(self) -> str | None:
        """Health's line while recovery listens for a vend the last stop or crash left (the
        page, the CLI and Home Assistant show it): its terminal takes no new sale until then
        (a customer is refused: TerminalBusy). None when it listens for none."""
        now = self.clock.monotonic()
        shown = [f"sale {sale_id[:8]} on terminal {vend.terminal} for {vend.due - now:.0f} s more"
                 for sale_id, vend in self.runner.restart_vends.items() if vend.due > now]
        if not shown:
            return None
        return ("recovery listens for the vend result a restart left in flight (the machine may "
                f"still say how it ended): {'; '.join(shown)}; no new sale on that terminal "
                "until then")
