"""Products dispensed after their sale gave up waiting: each reaches a person.

A machine that reports a vend after the sale's vend timeout (MDB vend success, a kiosk app's
late ``vended``, a drop sensor after its window, a serial device's line) dispensed a product
whose money went back (or was never captured): the operator lost the sale and the machine's
stock is off. The agent never moves money on it (no capture after a give-back: the customer's
card was told the money is back). It says so where a person looks:

- the sale it belongs to gets a ``late.vend`` step with the product and the trigger (a note: the
  sale's state, money and message are as they were; the bus hears nothing, since no listener
  must count a second end);
- health shows a problem (DEGRADED; the status page, the upstream heartbeat and Home Assistant
  show it) naming the sale and the product, until a person acknowledges it
  (``kiosk-agent sales late-vends --ack``, journaled as ``late.vend.seen`` with who) or
  ``LATE_VEND_SHOWN`` has passed since it was heard.

The problem is read from the journal (the two steps have a partial index of their own), so a
restart keeps showing it and an acknowledgement made by another process is seen at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kiosk_agent.data_class import data_class
from kiosk_agent.moments import day_of, display_clock, display_time
from kiosk_agent.sales.journal import JournalError
from kiosk_agent.sales.states import Step

if TYPE_CHECKING:
    from kiosk_agent.sales.clock import Clock
    from kiosk_agent.sales.journal import Journal, StepRecord

_LOGGER = logging.getLogger(__name__)

# how long a late vend stays a problem in health unless a person acknowledges it first
LATE_VEND_SHOWN = 24 * 3600.0
ACK = "kiosk-agent sales late-vends --ack"
# who closed a maybe when the machine said later that its vend failed (``late.vend.seen``'s by)
MACHINE = "the machine"


@data_class(frozen=True, slots=True)
class LateVend:
    sale_id: str
    product: str
    source: str
    at: float  # when it was heard (Unix time)
    # not heard but possible: why the product may have gone out (a dispenser that raised after
    # its relay may have fired, a vend in flight when the agent stopped:
    # ``LateVendWatch.noted``); "" for a vend heard
    unsure: str = ""
    # the price of the vend in cents (recovery's maybe: the price the vend was approved for,
    # the customer's choice card first); None where the note names none (a vend heard, a note
    # written before 2026-11-30)
    cents: int | None = None
    # a maybe the machine closed: what it said later (its vend failed: nothing went out; a
    # ``late.vend.seen`` by ``MACHINE``, ``LateVendWatch.not_vended``); "" while open
    not_vended: str = ""
    # the service's time of the charge of a maybe whose sale the journal lost (the charge
    # check's, sales/audit.py ``lost_sale_note``): where the machine's books are looked up
    charged_at: float | None = None

    def text(self) -> str:
        """Said on its sale (the sales table, `sales show`, the page's sale line), where the
        sale's state alone reads as "nothing went out"."""
        if self.not_vended:
            return (f"{self.product or 'product unnamed'} not dispensed: the machine said so "
                    f"after the sale gave up waiting ({self.not_vended}); the money went back")
        if self.unsure:
            return (f"may have dispensed {self.product or 'product unnamed'} "
                    f"{display_time(self.at)} ({self.unsure}); the money went back")
        return (f"late vend: {self.product or 'product unnamed'} dispensed "
                f"{display_time(self.at)}, after the sale gave up waiting (unpaid)")


def counted(late: Iterable[LateVend]) -> tuple[int, int]:
    """(heard, maybe): the heard late vends, and those only possible (a dispenser's error, or a
    vend in flight when the agent stopped; a person checks either the same way). Health's
    figures and its words both count here."""
    late = list(late)
    heard = sum(1 for vend in late if not vend.unsure)
    return heard, len(late) - heard


def _counted(late: list[LateVend]) -> str:
    """Health's count of unseen late vends, in words."""
    heard, maybe = counted(late)
    # why a maybe: a dispenser's error (the runner's), a vend in flight when the agent stopped
    # (recovery's), or a vend the sale gave up on unheard (its vend timeout, a drop sensor's
    # window, a controller reset mid-vend: the give-back's): said as such when all are of one
    # kind, else "not heard"
    kinds = {_why(vend.unsure) for vend in late if vend.unsure}
    why = kinds.pop() if len(kinds) == 1 else "not heard"
    said = []
    if heard:
        said.append(f"{heard} product(s) dispensed after the sale gave up waiting")
    if maybe:
        said.append(f"{maybe} product(s) that may have been dispensed ({why})")
    return " and ".join(said)


def _why(unsure: str) -> str:
    """A maybe's kind, in health's words."""
    if unsure.startswith("dispenser error"):
        return "a dispenser's error"
    if "stopped mid-vend" in unsure:
        return "the agent stopped mid-vend"
    if unsure.startswith("the journal lost its sale"):  # the charge check's (sales/audit.py)
        return "the journal lost its sale"
    return "no vend result heard"


def late_vend_of(steps: Iterable[StepRecord]) -> LateVend | None:
    """The last late vend among one sale's steps (acknowledged or not), or None."""
    found = None
    for step in steps:
        found = _next(found, step)
    return found


def _next(found: LateVend | None, step: StepRecord) -> LateVend | None:
    """A sale's late vend so far, after one more of its steps: a late vend replaces it (the
    last is what every face shows), the machine's word that the vend failed closes a maybe."""
    if step.step == Step.LATE_VEND:
        return _late_vend(step)
    if (found is not None and found.unsure and step.step == Step.LATE_VEND_SEEN
            and step.detail.get("not_vended")):
        return dataclasses.replace(found, not_vended=str(step.detail["not_vended"]))
    return found


def _late_vend(step: StepRecord) -> LateVend:
    facts = step.detail
    cents = facts.get("cents")
    charged = facts.get("charged_at")
    return LateVend(step.sale_id, str(facts.get("product") or ""),
                    str(facts.get("source") or ""), step.at, str(facts.get("unsure") or ""),
                    cents if type(cents) is int else None,
                    charged_at=float(charged) if isinstance(charged, int | float) else None)


def maybe_note(product: str | None, source: str, why: str, cents: int) -> dict[str, Any]:
    """The detail of a ``late.vend`` step for a vend that may have been made unheard (``why``):
    what a sale (the flows' ``not_dispensed``, recovery: sales/recovery.py) journals in the very
    commit of its give-back, the vend's price with it, then tells :meth:`LateVendWatch.noted`."""
    return {"product": product or "", "source": source, "unsure": why[:200], "cents": cents}


def late_vended(journal: Journal) -> dict[str, LateVend]:
    """Every sale the journal holds a late vend for, acknowledged or not, by sale id (its last
    one): what the sales list, ``sales show`` and the export say of the sale. The steps come
    from their own partial index (a handful in a journal of years)."""
    found: dict[str, LateVend] = {}
    for step in journal.late_vend_steps(0.0):
        late = _next(found.get(step.sale_id), step)
        if late is not None:
            found[step.sale_id] = late
    return found


class LateVendWatch:
    """Journals each late vend on its sale and shows the ones not yet seen in health."""

    def __init__(self, journal: Journal, clock: Clock,
                 on_change: Callable[[], None] | None = None) -> None:
        self.journal = journal
        self.clock = clock
        self.on_change = on_change  # health's: the page and the heartbeat hear of it at once
        self.heard_count = 0  # since start
        # the sales whose late vends health showed at the last look (``look``)
        self._shown: tuple[str, ...] = ()

    def heard(self, sale_id: str, product: str | None, source: str) -> None:
        """A vend success for ``sale_id`` after its sale gave up waiting: a note on the sale."""
        self._note(sale_id, {"product": product or "", "source": source})

    def noted(self, sale_id: str, detail: Mapping[str, Any]) -> None:
        """``sale_id``'s vend may have been made unheard: its dispenser raised after it may have
        moved the machine (a relay fired first), its vend timeout passed, or recovery found it
        in flight and heard no result. The sale journaled the note itself (:func:`maybe_note`),
        in the commit that decided to give its money back (``SaleSteps.told_in_one_commit``):
        here it is said in the log and told to health. Not heard, so not said as dispensed,
        but told to a person as a late vend is (a problem in health until acknowledged), never
        silently."""
        _LOGGER.warning("sale %s: %s; the money goes back, and the product %s may have gone "
                        "out: told to a person", sale_id, detail.get("unsure"),
                        detail.get("product") or "(unnamed)")
        self.heard_count += 1
        self._tell()

    def not_vended(self, sale_id: str, source: str, why: str) -> None:
        """The machine said ``sale_id``'s vend failed after the sale gave up on it: a maybe a
        person was told of (its last late vend, not yet seen) is closed on the sale, journaled
        as seen by ``MACHINE`` with what it said: health and `sales late-vends` no longer show
        it, the sale's line says nothing went out. A late vend heard, or none: left as it is."""
        try:
            steps = self.journal.steps(sale_id)
            record = self.journal.get(sale_id)
        except (JournalError, sqlite3.Error) as err:
            _LOGGER.error("sale %s: its failed vend could not be read: %s", sale_id, err)
            return
        # its last late vend, unless a person or the machine has seen it since
        last = next((s for s in reversed(steps) if s.step in (
            Step.LATE_VEND, Step.LATE_VEND_SEEN)), None)
        late = None if last is None or last.step != Step.LATE_VEND else _late_vend(last)
        if record is None or late is None or not late.unsure:
            return  # no maybe open on it (heard, seen, or never told)
        try:
            self.journal.record(record, Step.LATE_VEND_SEEN,
                                detail={"by": MACHINE, "not_vended": why[:200]})
        except (JournalError, sqlite3.Error) as err:  # the maybe stays for a person
            _LOGGER.error("sale %s: its failed vend could not be journaled: %s", sale_id, err)
            return
        _LOGGER.info("sale %s: %s said its vend failed (%s): the %s did not go out; no person "
                     "needed", sale_id, source, why, late.product or "product")
        self._tell()

    def _note(self, sale_id: str, detail: dict[str, str]) -> None:
        source = detail["source"]
        record = self.journal.get(sale_id)
        if record is None:
            _LOGGER.error("%s: late vend for sale %s, which the journal does not hold",
                          source, sale_id)
            return
        try:
            self.journal.record(record, Step.LATE_VEND, detail=detail)
        except (JournalError, sqlite3.Error) as err:  # the journal's own health says why
            _LOGGER.error("sale %s: the late vend could not be journaled: %s", sale_id, err)
        self.heard_count += 1
        self._tell()

    def look(self) -> None:
        """The agent's look each second (its journal watch): health reads the late vends at
        each snapshot, but the heartbeat (Home Assistant) hears only of a change it is told of.
        An acknowledgement by another process (`sales late-vends --ack`) or a late vend's 24
        hours passing changes what is shown with no call here: told once, when it is seen.
        One read through the late-vend index (some 13 us with none to show)."""
        try:
            shown = tuple(v.sale_id for v in self.unseen())
        except (sqlite3.Error, JournalError):  # the journal's own health says why
            return
        if shown != self._shown:
            self._shown = shown
            if self.on_change is not None:
                self.on_change()

    def _tell(self) -> None:
        with contextlib.suppress(sqlite3.Error, JournalError):  # the next look compares again
            self._shown = tuple(v.sale_id for v in self.unseen())
        if self.on_change is not None:
            self.on_change()

    def unseen(self) -> list[LateVend]:
        """The late vends heard within ``LATE_VEND_SHOWN`` that no person acknowledged, oldest
        first."""
        late: dict[str, LateVend] = {}
        for step in self.journal.late_vend_steps(self.clock.time() - LATE_VEND_SHOWN):
            if step.step == Step.LATE_VEND_SEEN:
                late.pop(step.sale_id, None)
            else:
                late[step.sale_id] = _late_vend(step)
        return list(late.values())

    def counts(self) -> tuple[int, int]:
        """(heard, maybe dispensed) among the unseen late vends: health's figures (the
        heartbeat's ``sales.late_vends`` and ``sales.maybe_dispensed``, Home Assistant's
        entities); (0, 0) while the journal cannot be read (its own health says why)."""
        try:
            return counted(self.unseen())
        except (sqlite3.Error, JournalError) as err:
            _LOGGER.debug("late vends: cannot read the journal: %s", err)
            return 0, 0

    def problem(self) -> str | None:
        """Health's line while any late vend is unseen; None when none is."""
        try:
            late = self.unseen()
        except (sqlite3.Error, JournalError) as err:
            _LOGGER.debug("late vends: cannot read the journal: %s", err)
            return None
        if not late:
            return None
        today = day_of(self.clock.time())

        def when(at: float) -> str:  # shown for 24 h: yesterday's time of day needs its date
            return display_clock(at) if day_of(at) == today else display_time(at)

        shown = "; ".join(
            f"sale {v.sale_id[:8]} ({v.product or 'product unnamed'} on {v.source}, "
            f"{when(v.at)}{', maybe: ' + v.unsure if v.unsure else ''})" for v in late[-3:]
        )
        more = f" and {len(late) - 3} more" if len(late) > 3 else ""
        return (f"{_counted(late)}, unpaid (the money went back): {shown}{more}; check the "
                f"stock and the sale, then `{ACK}`")

    def acknowledge(self, sale_id: str, by: str) -> list[str]:
        """A person saw the late vends (of ``sale_id``, or all with ``"all"``): journaled on each
        sale as ``late.vend.seen`` with who. The sale ids acknowledged. ``sale_id`` is a sale
        id, a unique start of one or an order id (Journal.find): a start of several sales (an
        empty one starts them all) is SaleNotFound, never all of them, so one person's look
        at one sale hides no other sale's unpaid product from health."""
        named = None if sale_id == "all" else self.journal.find(sale_id).sale_id
        done = []
        for vend in self.unseen():
            if named not in (None, vend.sale_id):
                continue
            record = self.journal.get(vend.sale_id)
            if record is None:
                continue
            self.journal.record(record, Step.LATE_VEND_SEEN, detail={"by": by})
            done.append(vend.sale_id)
        return done

