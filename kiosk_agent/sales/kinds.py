"""What a sale is, on every face: the one rule, here.

A card-first machine (an MDB controller in ``card_first`` mode, the demo's coffee machine)
opens a card session before anyone chooses: the agent waits for a card, authorizes the most the
machine may vend, and only the customer's choice names the product and the price. A session
that ended with nothing chosen and nothing kept (no one came, or the customer walked away: the
hold is released) is a **card session with no selection**, not a sale. Every other sale in the
journal is a sale, whatever its end (completed, declined, failed, reversed, attention).

The journal holds such a session as a sale of a vending machine controller's trigger
(``mdb:``, ``virtual:``: the platforms with a card-first mode) in ``authorize_capture`` with no
product, nothing vended or captured, ended ``cancelled``, ``reversed``, ``failed`` or
``declined``, and no person's decision on it (a sale a person resolved stays a sale). A kiosk
app or a serial device may name no product: its sales are sales, whatever they kept. The demo's
summary, ``kiosk-agent sales`` (table, CSV, JSON), ``GET /api/sales`` (and its exports) and the
status page's recent sales list sales only and count those sessions apart ("2 card sessions
ended with no selection, $0 kept"); ``--kind no_selection`` (``kind=no_selection``) lists them,
``--kind all`` both. "Sales today" (the page, ``health``, Home Assistant's ``sales_today``)
counts completed sales, which a session with no selection never is.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import field
from typing import Protocol

from kiosk_agent.data_class import data_class
from kiosk_agent.money import format_cents
from kiosk_agent.sales.states import Flow, SaleState

# Ends of a session with no selection: no money kept (a released hold is "reversed").
_NO_SELECTION_ENDS = (
    SaleState.CANCELLED,
    SaleState.REVERSED,
    SaleState.FAILED,
    SaleState.DECLINED,
)


class SaleKind(enum.StrEnum):
    """Which journal rows a face lists: the sales (the default), the card sessions that ended
    with no selection, or both."""

    SALE = "sale"
    NO_SELECTION = "no_selection"
    ALL = "all"


KIND_CHOICES = tuple(k.value for k in SaleKind)
# What a face says of one such session (`sales show`, `events`, the status page's live events).
NOT_A_SALE = "card session ended with no selection: not a sale"


# The platforms with a card-first mode: a sale's source is "<platform>:<trigger name>".
CARD_FIRST_PLATFORMS = ("mdb", "virtual")


class _Row(Protocol):
    @property
    def source(self) -> str: ...
    @property
    def resolved(self) -> bool: ...
    @property
    def flow(self) -> str: ...
    @property
    def product(self) -> str | None: ...
    @property
    def vended_cents(self) -> int: ...
    @property
    def captured_cents(self) -> int: ...
    @property
    def state(self) -> SaleState: ...


def no_selection(row: _Row) -> bool:
    """A card session that ended with nothing chosen and nothing kept: not a sale."""
    return (
        row.flow == Flow.AUTHORIZE_CAPTURE
        and row.source.partition(":")[0] in CARD_FIRST_PLATFORMS
        and not row.resolved
        and not row.product
        and row.vended_cents == 0
        and row.captured_cents == 0
        and row.state in _NO_SELECTION_ENDS
    )


# The same rule over the journal's ``sales`` table (every value a literal of ours).
_FROM_CARD_FIRST_PLATFORMS = " OR ".join(f"source LIKE '{p}:%'" for p in CARD_FIRST_PLATFORMS)
NO_SELECTION_SQL = (
    f"(flow = '{Flow.AUTHORIZE_CAPTURE.value}' AND COALESCE(product, '') = ''"
    f" AND ({_FROM_CARD_FIRST_PLATFORMS})"
    " AND resolution IS NULL"
    " AND vended_cents = 0 AND captured_cents = 0"
    f" AND +state IN ({', '.join(repr(s.value) for s in _NO_SELECTION_ENDS)}))"
)


def kind_sql(kind: SaleKind | None) -> str:
    """The WHERE condition of ``kind`` (empty: every row)."""
    if kind is SaleKind.SALE:
        return f"NOT {NO_SELECTION_SQL}"
    if kind is SaleKind.NO_SELECTION:
        return NO_SELECTION_SQL
    return ""


def sessions_text(count: int) -> str:
    """The sessions counted apart, as every face says it."""
    sessions = "card session" if count == 1 else "card sessions"
    return f"{count:,} {sessions} ended with no selection, {format_cents(0)} kept"


@data_class
class Tally:
    """Sales by how they ended, what they captured, and the sessions counted apart: the demo's
    running total and summary, read from the journal by this module's rule."""

    ends: Counter[SaleState] = field(default_factory=Counter)
    captured_cents: int = 0
    apart: int = 0

    def add(self, row: _Row) -> None:
        if no_selection(row):
            self.apart += 1
            return
        self.ends[row.state] += 1
        self.captured_cents += row.captured_cents

    @property
    def sales(self) -> int:
        return sum(self.ends.values())

    def text(self) -> str:
        """``7 sales, 6 completed, 1 failed; captured $16.35`` and the sessions apart."""
        parts = [f"{self.sales:,} {'sale' if self.sales == 1 else 'sales'}"]
        parts += [f"{n} {state.value}" for state, n in sorted(self.ends.items())]
        text = f"{', '.join(parts)}; captured {format_cents(self.captured_cents)}"
        return f"{text}; {sessions_text(self.apart)}" if self.apart else text
