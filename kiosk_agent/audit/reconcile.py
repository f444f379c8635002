"""The machine's books against the journal: what changed between two reads, and whether the
card vends the machine counted between them are the card sales the journal holds.

Pure: figures and sales in, a verdict out (docs/audit.md, "The reconciliation rule").

The interval is (the read before, this read], both reads *clean*: no sale of the machine was in
progress while either was taken (the scheduler never starts one during a sale; a sale that
started during one makes it unclean, and the interval runs on to the next clean read). The
machine's side is the cashless device's since-initialisation counter difference (``DA2``, or
``DB2`` for device 2: every reason names the block compared), and per column ``PA7`` for that
device where the file has it; the journal's side is the sales of this machine whose vend the
journal holds between the two reads, by their order of writing (the journal's step ids, which
no clock step moves).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kiosk_agent.audit.books import ZERO, Figures
from kiosk_agent.audit.evadts import Counters, Tally
from kiosk_agent.moments import day_of, display_clock, display_time
from kiosk_agent.money import format_cents

# "books_reset": the machine's own books went back (a memory cleared, a board replaced, a cold
# start, a counter wrapped): no mismatch, a new baseline, the interval not checked
Verdict = Literal["match", "mismatch", "books_reset", "not_compared"]


@dataclass(frozen=True, slots=True)
class Change:
    """One difference between a read and the read before it."""

    kind: Literal["reset", "reinitialised", "price", "added", "removed", "machine", "device"]
    text: str
    column: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "column": self.column, "text": self.text}


def changes(before: Figures, after: Figures) -> list[Change]:
    """What changed from ``before`` to ``after``: counters reset, prices, columns."""
    found: list[Change] = []
    if before.machine and after.machine and before.machine != after.machine:
        found.append(Change("machine", f"machine serial {before.machine!r} -> {after.machine!r}"))
    if before.cashless_device != after.cashless_device:
        found.append(Change("device", f"cashless device {_cashless_block(before)} -> "
                            f"{_cashless_block(after)}"))
    for block, old, new in _blocks(before, after):
        if old is None or new is None:
            continue
        lost = _reinitialised(block, old, new)
        if lost:
            found.append(Change("reinitialised", lost))
        elif old.since_reset and new.since_reset and new.since_reset.went_down_from(
            old.since_reset
        ):
            found.append(Change("reset", f"{block} since reset went down "
                                f"({_count(old.since_reset)} -> {_count(new.since_reset)})"))
    for name in sorted(after.columns.keys() - before.columns.keys()):
        found.append(Change("added", f"column {name} added", name))
    for name in sorted(before.columns.keys() - after.columns.keys()):
        found.append(Change("removed", f"column {name} removed", name))
    for name in sorted(after.columns.keys() & before.columns.keys()):
        old_price, new_price = before.columns[name].price, after.columns[name].price
        if old_price is not None and new_price is not None and old_price != new_price:
            found.append(Change("price", f"column {name} price {format_cents(old_price)} -> "
                                f"{format_cents(new_price)}", name))
    return found


def _blocks(before: Figures, after: Figures) -> list[tuple[str, Counters | None, Counters | None]]:
    blocks = [("VA1 paid vends", before.paid, after.paid), ("CA2 cash", before.cash, after.cash)]
    if before.cashless_device == after.cashless_device:  # two devices' counters say nothing
        blocks.append((f"{_cashless_block(after)} cashless", before.cashless, after.cashless))
    return blocks


def _cashless_block(read: Figures) -> str:
    """The block the cashless figures are: DA2 (device 1) or DB2 (device 2)."""
    return f"{read.cashless_device}2"


def _count(count: Tally) -> str:
    return f"{count.count} worth {format_cents(count.value)}"


def _reinitialised(block: str, old: Counters, new: Counters) -> str:
    """How ``block``'s counters show the machine re-initialised between two reads, in words, or
    "". Its since-initialisation pair went down (or wrapped); or, with no reset between, it grew
    less than the since-reset pair: every vend adds to both, and a tech's reset only makes the
    since-initialisation pair grow more, so this is a machine re-initialised whose counters
    climbed back past the last read. A pair not sent went nowhere anyone knows."""
    before, after = old.since_init, new.since_init
    if before is None or after is None:
        return ""
    if after.went_down_from(before):
        return f"{block} since initialisation went down ({_count(before)} -> {_count(after)})"
    reset_before, reset_after = old.since_reset, new.since_reset
    if reset_before is None or reset_after is None or reset_after.went_down_from(reset_before):
        return ""
    grew, grew_since_reset = after - before, reset_after - reset_before
    if not grew.went_down_from(grew_since_reset):
        return ""
    return (f"{block} grew by {_count(grew)} since initialisation but by "
            f"{_count(grew_since_reset)} since the reset, with no reset between")


# -- the journal's side --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CardSale:
    """A sale of this machine whose vend the journal holds (the machine said it came out)."""

    sale_id: str
    vended_cents: int
    product: str | None
    state: str
    vended_at: float  # wall time of the step that journaled the vend

    def as_dict(self) -> dict[str, Any]:
        return {
            "sale_id": self.sale_id,
            "vended_cents": self.vended_cents,
            "product": self.product,
            "state": self.state,
            "vended_at": self.vended_at,
        }


@dataclass(frozen=True, slots=True)
class Side:
    """One side of the comparison, as a read or the journal tells it."""

    at: float  # wall time of the read
    figures: Figures


@dataclass(frozen=True, slots=True)
class ColumnDifference:
    column: str
    machine: Tally
    journal: Tally

    def as_dict(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "machine": self.machine.as_dict(),
            "journal": self.journal.as_dict(),
        }


@dataclass(frozen=True, slots=True)
class Comparison:
    """The verdict on one interval between two clean reads."""

    verdict: Verdict
    since: float
    until: float
    machine: Tally | None  # the machine's card vends in the interval (None: not comparable)
    journal: Tally
    sales: tuple[CardSale, ...] = ()
    columns: tuple[ColumnDifference, ...] = ()
    reason: str = ""  # why it was not compared
    currency: str = "USD"
    # why it was not compared, for programs: "reinitialised", "machine", "no_counters", "unsent",
    # "device" (the cashless device compared is not the read before's)
    cause: str = ""
    # columns whose PA7 for the cashless device sent no counts: not compared per column
    unsent_columns: tuple[str, ...] = ()

    @property
    def mismatch(self) -> bool:
        return self.verdict == "mismatch"

    def text(self) -> str:
        """For people, the same words on every face."""
        since = _clock_time(self.since)
        held = f"the journal holds {_vends(self.journal, self.currency)}"
        if self.verdict == "books_reset":
            why = (" (its memory cleared, a board replaced or a counter wrapped)"
                   if self.cause == "reinitialised" else "")
            return (f"the machine's books were reset between {since} and "
                    f"{_clock_time(self.until)}{why}: {self.reason}; the journal's "
                    f"{_vends(self.journal, self.currency)} of that interval are not checked; "
                    "no mismatch: the next read compares from this one")
        if self.machine is None:
            text = f"not compared at {_clock_time(self.until)} since {since}: {self.reason}; {held}"
            todo = _NOT_COMPARED_TODO.get(self.cause)
            return f"{text}; {todo}" if todo else text
        counted = f"the machine counted {_vends(self.machine, self.currency)}"
        return f"{counted} since {since}; {held}{self._by_column()}"

    def line(self) -> str:
        """This interval as one line of a stretch's list (``Intervals.lines``): its two ends,
        its verdict, both sides; a mismatch with the journal's sales, to look at."""
        span = _span(self.since, self.until)
        held = f"the journal holds {_vends(self.journal, self.currency)}"
        if self.verdict == "books_reset":
            return f"{span}  books reset: {self.reason}; {held}, not checked"
        if self.machine is None:
            todo = _NOT_COMPARED_TODO.get(self.cause)
            return f"{span}  not compared: {self.reason}; {held}" + (f"; {todo}" if todo else "")
        label = "match" if self.verdict == "match" else "MISMATCH"
        line = (f"{span}  {label}: the machine counted {_vends(self.machine, self.currency)}; "
                f"{held}{self._by_column()}")
        if self.mismatch:
            ids = ", ".join(s.sale_id for s in self.sales) or "none"
            line += f" (sales in the interval: {ids})"
        return line

    def _by_column(self) -> str:
        text = ""
        if self.columns:
            text += "; by column: " + ", ".join(
                f"{d.column} machine {d.machine.count} journal {d.journal.count}"
                for d in self.columns
            )
        if self.unsent_columns:
            text += (f"; not compared by column: {', '.join(self.unsent_columns)} (its PA7 for "
                     "the cashless device sent no counts)")
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "since": self.since,
            "until": self.until,
            "machine": self.machine.as_dict() if self.machine else None,
            "journal": self.journal.as_dict(),
            "sales": [s.as_dict() for s in self.sales],
            "columns": [c.as_dict() for c in self.columns],
            "reason": self.reason,
            "currency": self.currency,
            "cause": self.cause,
            "unsent_columns": list(self.unsent_columns),
            "text": self.text(),
        }

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Comparison:
        verdict = data["verdict"]
        reason = str(data.get("reason") or "")
        if verdict == "not_compared" and data.get("cause") == "reinitialised":
            # stored before a reset of the machine's books had a verdict of its own: read as one
            verdict = "books_reset"
            reason = reason.removeprefix(_OLD_REINITIALISED)
        return cls(
            verdict=verdict,
            since=float(data["since"]),
            until=float(data["until"]),
            machine=Tally.from_dict(data.get("machine")),
            journal=Tally.from_dict(data.get("journal")) or ZERO,
            sales=tuple(CardSale(**s) for s in data.get("sales") or ()),
            columns=tuple(
                ColumnDifference(
                    c["column"],
                    Tally.from_dict(c["machine"]) or ZERO,
                    Tally.from_dict(c["journal"]) or ZERO,
                )
                for c in data.get("columns") or ()
            ),
            reason=reason,
            currency=str(data.get("currency") or "USD"),
            cause=str(data.get("cause") or ""),
            unsent_columns=tuple(str(c) for c in data.get("unsent_columns") or ()),
        )


@dataclass(frozen=True, slots=True)
class Intervals:
    """The comparisons of a stretch of time (a demo's run, ``kiosk-agent audit --since``), oldest
    first, and their sums: the machine's card vends and the journal's over the intervals
    compared. A mismatched interval is named beside the sums, never folded into them (two
    opposite ones can make equal sums); an interval not checked (the books reset, a comparison
    not made) stays out of the sums, its journal side said apart."""

    since: float
    comparisons: tuple[Comparison, ...] = ()
    currency: str = "USD"
    # the journal's card sales of the stretch that no interval holds: vended before the read
    # its first interval was compared from (a first read that met a sale is no boundary)
    before: tuple[CardSale, ...] = ()

    @property
    def journal_before(self) -> Tally:
        return Tally(len(self.before), sum(s.vended_cents for s in self.before))

    @property
    def compared(self) -> tuple[Comparison, ...]:
        return tuple(c for c in self.comparisons if c.machine is not None)

    @property
    def mismatched(self) -> tuple[Comparison, ...]:
        return tuple(c for c in self.comparisons if c.mismatch)

    @property
    def not_checked(self) -> tuple[Comparison, ...]:
        return tuple(c for c in self.comparisons if c.machine is None)

    @property
    def machine(self) -> Tally:
        """The machine's card vends over the intervals compared."""
        return sum((c.machine for c in self.compared if c.machine is not None), ZERO)

    @property
    def journal(self) -> Tally:
        """The journal's card vends over the intervals compared."""
        return sum((c.journal for c in self.compared), ZERO)

    @property
    def journal_not_checked(self) -> Tally:
        """The journal's card vends over the intervals not checked."""
        return sum((c.journal for c in self.not_checked), ZERO)

    @property
    def verdict(self) -> str:
        """``mismatch`` (any interval), ``match`` (every one), ``not_checked`` (none mismatched,
        some not checked), ``none`` (no interval in the stretch)."""
        if self.mismatched:
            return "mismatch"
        if self.not_checked or self.before:
            return "not_checked"
        return "match" if self.comparisons else "none"

    def lines(self) -> list[str]:
        """Each interval, oldest first, then the sums."""
        return [c.line() for c in self.comparisons] + [self.total()]

    def total(self) -> str:
        """The sums in one line, each mismatched or unchecked interval named."""
        outside = (f"the journal's {_vends(self.journal_before, self.currency)} in no interval "
                   "(vended before a read taken while no sale of the machine ran)")
        if not self.comparisons:
            text = (f"in all since {_clock_time(self.since)}: no interval compared (a comparison "
                    "needs two reads taken while no sale of the machine ran)")
            return f"{text}; {outside}" if self.before else text
        first, last = self.comparisons[0], self.comparisons[-1]
        text = (f"in all, {_plural(len(self.comparisons), 'interval')} from "
                f"{_span(first.since, last.until)}: ")
        if self.compared:
            text += (f"the machine counted {_vends(self.machine, self.currency)}; the journal "
                     f"holds {_vends(self.journal, self.currency)}")
        else:
            text += "none compared"
        if self.mismatched:
            text += (f"; MISMATCH in {_plural(len(self.mismatched), 'interval')}: "
                     + ", ".join(_span(c.since, c.until)
                                 for c in self.mismatched))
        if self.not_checked:
            text += (f"; not checked: {_plural(len(self.not_checked), 'interval')} ("
                     + "; ".join(f"{_span(c.since, c.until)}, "
                                 f"{_UNCHECKED[c.verdict]}" for c in self.not_checked)
                     + f"), the journal's {_vends(self.journal_not_checked, self.currency)} "
                     "of them outside these sums")
        if self.before:
            text += f"; before {_clock_time(first.since)}: {outside}"
        if self.verdict == "match":
            text += ": every interval matches"
        return text

    def as_dict(self) -> dict[str, Any]:
        def span(c: Comparison) -> dict[str, Any]:
            return {"since": c.since, "until": c.until, "verdict": c.verdict, "cause": c.cause}

        return {
            "since": self.since,
            "verdict": self.verdict,
            "intervals": len(self.comparisons),
            "compared": len(self.compared),
            "machine": self.machine.as_dict(),
            "journal": self.journal.as_dict(),
            "mismatched": [span(c) for c in self.mismatched],
            "not_checked": [span(c) for c in self.not_checked],
            "journal_not_checked": self.journal_not_checked.as_dict(),
            "journal_before": self.journal_before.as_dict(),
            "before": [s.sale_id for s in self.before],
            "currency": self.currency,
            "text": self.total(),
        }


_UNCHECKED = {"books_reset": "the machine's books reset", "not_compared": "not compared"}


def _span(since: float, until: float) -> str:
    """``2026-11-30 05:49:30Z to 05:50:45Z`` (the end's day said when it is another)."""
    end = display_clock(until) if day_of(until) == day_of(since) else _clock_time(until)
    return f"{_clock_time(since)} to {end}"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _vends(count: Tally, currency: str) -> str:
    plural = "" if count.count == 1 else "s"
    return f"{count.count} card vend{plural} worth {format_cents(count.value, currency)}"


# What a tech does about a comparison not made, by its cause: said with it on every face (the
# page, health's problems, Home Assistant, `kiosk-agent audit`), as docs/audit.md's table says.
_NOT_COMPARED_TODO = {
    "machine": "check which machine the audit cable is on (or the board swapped): the next read "
               "compares from this one",
    "unsent": "set the machine's audit to a full one with the cashless device's counters since "
              "initialisation (not since-reset only)",
    "device": "set dex: cashless_device to the device the unit is on the machine's bus (DA: 1, "
              "DB: 2): the next read compares from this one",
    "no_counters": "set the machine's audit to a full one with the cashless device's counters "
                   "since initialisation (not since-reset only)",
}


def _clock_time(at: float) -> str:
    # UTC with its Z, as the command line and the status page write every time
    return display_time(at)


def compare(
    before: Side, after: Side, sales: Sequence[CardSale], *, currency: str = "USD"
) -> Comparison:
    """The machine's card vends from ``before`` to ``after`` against ``sales`` (the journal's
    vends of this machine in that interval)."""
    journal = Tally(len(sales), sum(s.vended_cents for s in sales))
    machine, cause, reason = _cashless_difference(before.figures, after.figures)
    columns: tuple[ColumnDifference, ...] = ()
    unsent: tuple[str, ...] = ()
    if machine is not None:
        columns, unsent = _column_differences(before.figures, after.figures, sales)
    verdict: Verdict = "books_reset" if cause == "reinitialised" else "not_compared"
    if machine is not None:
        verdict = "match" if machine == journal and not columns else "mismatch"
    return Comparison(
        verdict=verdict, since=before.at, until=after.at, machine=machine, journal=journal,
        sales=tuple(sales), columns=columns, reason=reason, currency=currency, cause=cause,
        unsent_columns=unsent,
    )


def books_restarted(comparison: Comparison, reason: str) -> Comparison:
    """``comparison`` as a reset of the machine's books known from outside its counters
    (``cause`` "restarted"): the agent's own virtual machine starts its books at 0 with each
    run, so an interval that spans the agent's start is no comparison of two machines' lives,
    whatever its counters say (0 then 0 with the journal's sales between is no mismatch)."""
    return Comparison(
        verdict="books_reset", since=comparison.since, until=comparison.until, machine=None,
        journal=comparison.journal, sales=comparison.sales, reason=reason,
        currency=comparison.currency, cause="restarted",
    )


def _cashless_difference(before: Figures, after: Figures) -> tuple[Tally | None, str, str]:
    """The machine's card vends between two reads, or why they cannot be known (a cause for
    programs, a reason for people)."""
    if before.machine and after.machine and before.machine != after.machine:
        return None, "machine", (
            f"another machine answered ({before.machine!r} then {after.machine!r})"
        )
    block = f"{_cashless_block(after)} (cashless)"
    if before.cashless_device != after.cashless_device:
        return None, "device", (
            f"the cashless device compared changed: {_cashless_block(before)} (cashless) then "
            f"{block}: the counters of two devices cannot be subtracted"
        )
    old, new = before.cashless, after.cashless
    if old is None or new is None:
        return None, "no_counters", f"a read has no {block} counters"
    if old.since_init is None or new.since_init is None:
        which = "this read's" if new.since_init is None else "the read before's"
        return None, "unsent", (
            f"{which} {block} has no since-initialisation counts: the machine left them "
            "empty (not sent, not 0)"
        )
    lost = _reinitialised(block, old, new)
    if not lost:
        return new.since_init - old.since_init, "", ""
    return None, "reinitialised", f"its {lost}"


# How a reset of the books was said before it had a verdict of its own (stored comparisons).
_OLD_REINITIALISED = "the machine was re-initialised (or a counter wrapped): "


def _column_differences(
    before: Figures, after: Figures, sales: Sequence[CardSale]
) -> tuple[tuple[ColumnDifference, ...], tuple[str, ...]]:
    """Per column with PA7 for the cashless device in both reads: vends that differ, and the
    columns whose PA7 sent no since-initialisation counts (not compared, never read as 0).
    Only when every sale names a column of the file: a platform whose product codes are not the
    machine's column ids (another numbering) says nothing per column."""
    if any(sale.product not in after.columns for sale in sales):
        return (), ()
    by_column: dict[str, list[CardSale]] = {}
    for sale in sales:
        by_column.setdefault(sale.product or "", []).append(sale)
    differences: list[ColumnDifference] = []
    unsent: list[str] = []
    for name in sorted(after.columns.keys() & before.columns.keys()):
        old, new = before.columns[name].cashless, after.columns[name].cashless
        if old is None or new is None:
            continue
        if old.since_init is None or new.since_init is None:
            unsent.append(name)
            continue
        if new.since_init.went_down_from(old.since_init):
            continue
        machine = new.since_init - old.since_init
        held = by_column.get(name, [])
        journal = Tally(len(held), sum(s.vended_cents for s in held))
        if machine.count != journal.count:
            differences.append(ColumnDifference(name, machine, journal))
    return tuple(differences), tuple(unsent)
