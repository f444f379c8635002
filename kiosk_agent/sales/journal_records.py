"""What the journal holds, as the code reads it: a sale's row and its steps.

The records and how a row of ``sales`` (with the facts kept beside it) becomes one; shared by the
journal's store (journal.py), its reads (journal_reads.py) and its prune (journal_prune.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import operator
import sqlite3
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from kiosk_agent.data_class import data_class, maker_from
from kiosk_agent.money import CURRENCY
from kiosk_agent.sales.states import SaleState, Step

# A sale's facts kept beside it, not as columns of ``sales``: the previous release reads every
# column of ``sales`` into its own record and stops at one it does not know, so new facts go
# into tables of their own (docs/operations.md, "Rolling back"). Table -> its columns.
_BESIDE = {
    # the money call's send, to re-anchor its deadline after a restart (sales/clock.py)
    "sale_sends": ("sent_at", "sent_mono", "sent_boot"),
    # what the service holds now of a completed sale's charge that someone else gave back
    # after the sale ended (a person at the portal, another program): sales/audit.py
    "sale_later": ("later_cents", "later_status", "later_by", "later_at"),
}


class Later(NamedTuple):
    """What the service holds now of a completed sale's charge given back by others after it
    (``sale_later``'s columns, in order)."""

    cents: int | None
    status: str | None
    by: str | None
    at: float | None


@data_class(frozen=True, slots=True)
class SaleRecord:
    """One row of the sales table."""

    sale_id: str
    order_id: str
    source: str
    flow: str
    terminal: str
    amount_cents: int
    state: SaleState
    product: str | None = None
    currency: str = CURRENCY
    attempt: int = 1
    interaction_id: str | None = None
    interaction_kind: str | None = None
    trans_id: str | None = None
    authorized_cents: int = 0
    vended_cents: int = 0
    captured_cents: int = 0
    reversed_cents: int = 0
    reverse_trans_id: str | None = None
    card_brand: str | None = None
    last_four: str | None = None
    vault_uuid: str | None = None
    plan_id: str | None = None
    message: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    finished_at: float | None = None
    # When the service can no longer answer the money call in flight (Unix time): written once,
    # with the request step. Before it, "no charge in reporting" proves nothing.
    answer_by: float | None = None
    # A person's decision on an ATTENTION sale, as JSON {as, why, by, at}.
    resolution: str | None = None
    # When the money call in flight was sent: wall time, monotonic time and the boot id, written
    # with ``answer_by``. After a restart on the same boot the monotonic difference is the exact
    # time since; wall time alone cannot say it (NTP steps it).
    sent_at: float | None = None
    sent_mono: float | None = None
    sent_boot: str | None = None
    # Given back by others after the sale completed, as reporting shows it now (the charge
    # check, sales/audit.py), kept beside the sale (``sale_later``): one field, not four, on the
    # write path's copy of a record (a step's): ``Later``'s four, or None
    later: Later | None = None

    @property
    def later_cents(self) -> int | None:
        """The cents voided, refunded or charged back by others (never the agent's own
        give-back, ``reversed_cents``, nor taken off ``captured_cents``)."""
        return None if self.later is None else self.later.cents

    @property
    def later_status(self) -> str | None:
        """The charge's status there: ``voided``, ``refunded``, ``partly_refunded``,
        ``chargeback_open|lost|won``, several joined with ``, ``."""
        return None if self.later is None else self.later.status

    @property
    def later_by(self) -> str | None:
        """Who did it, as reporting names them (``user_identifier``; "" none named)."""
        return None if self.later is None else self.later.by

    @property
    def later_at(self) -> float | None:
        """The service's date of the latest of it, else when the check found it (Unix time)."""
        return None if self.later is None else self.later.at

    @property
    def resolved(self) -> bool:
        """A person decided it (from ``attention``)."""
        return self.resolution is not None

    def attempt_order_id(self, attempt: int | None = None) -> str:
        """The order_id sent for one attempt: the sale's own for the first, suffixed after."""
        n = self.attempt if attempt is None else attempt
        return self.order_id if n <= 1 else f"{self.order_id}-{n}"

    def all_order_ids(self) -> list[str]:
        return [self.attempt_order_id(n) for n in range(1, self.attempt + 1)]

    def row(self) -> dict[str, Any]:
        """The sale as stored: column name -> SQLite value."""
        # every field is a plain value: a shallow read (asdict deep-copies each, on every sale)
        data = dict(zip(_COLUMNS, _FIELDS(self), strict=True))
        data["state"] = self.state._value_  # .value: two Python calls (enum's property)
        return data

    def as_dict(self) -> dict[str, Any]:
        """The sale for people and APIs: the resolution as an object, what others gave back
        later as its four fields."""
        data = self.row()
        data["resolution"] = json.loads(self.resolution) if self.resolution else None
        del data["later"]
        data.update(zip(LATER_COLUMNS, self.later or (None,) * len(LATER_COLUMNS), strict=True))
        return data


@data_class(frozen=True, slots=True)
class StepRecord:
    sale_id: str
    at: float
    step: str  # a Step's value (read as stored: an older journal may hold a retired name)
    state: SaleState
    detail: dict[str, Any]


_COLUMNS = tuple(f.name for f in dataclasses.fields(SaleRecord))
_COLUMN_SET = frozenset(_COLUMNS)
_FIELDS = operator.attrgetter(*_COLUMNS)  # every field's value at once, in _COLUMNS' order
# ``later``: the record's one field for sale_later's four columns (never a column of sales)
_BESIDE_COLUMNS = frozenset(c for columns in _BESIDE.values() for c in columns) | {"later"}
_SALES_COLUMNS = tuple(c for c in _COLUMNS if c not in _BESIDE_COLUMNS)
# every read of a sale: its row and what is kept beside it
# What is noted of a completed sale given back at the service after it (sales/audit.py): a few
# sales a year, so not joined into every read (its four columns cost a read of 50,000 sales
# 18 % more CPU, 1.70-1.80 s against 1.41-1.52 s); the reads that serve the faces add it
# (JournalReads._with_later), one query a page
LATER_TABLE = "sale_later"
LATER_COLUMNS = _BESIDE[LATER_TABLE]
_JOINED = {table: columns for table, columns in _BESIDE.items() if table != LATER_TABLE}
_SELECT_SALES = "SELECT sales.*, " + ", ".join(  # noqa: S608 - names from this module
    f"{table}.{column}" for table, columns in _JOINED.items() for column in columns
) + " FROM sales" + "".join(
    f" LEFT JOIN {table} ON {table}.sale_id = sales.sale_id" for table in _JOINED
)


@data_class(frozen=True, slots=True)
class HeldStep:
    """A step memory took while the journal could not (``SaleSteps.held``): written later by
    :meth:`Journal.restore`, in order, through the same check as every write."""

    step: Step
    state: SaleState | None = None
    detail: Mapping[str, Any] | None = None
    changes: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def _record(row: sqlite3.Row) -> SaleRecord:
    # columns a newer release added are left out: this one reads what it knows
    data = {k: row[k] for k in row.keys() if k in _COLUMN_SET}  # noqa: SIM118 - not a mapping
    data["state"] = SaleState(data["state"])
    return SaleRecord(**data)


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction on the journal's database (``isolation_level=None``): taken at
    once (``BEGIN IMMEDIATE``), committed at the end, rolled back on any exception: in the
    writes, in a COMMIT that failed and left it open (SQLite rolls back on most of its errors,
    not all), an interrupt right after its BEGIN. Else every later write on the connection is
    refused."""
    try:
        db.execute("BEGIN IMMEDIATE")
        yield db
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
        raise


def replaced(sale: SaleRecord, **changes: Any) -> SaleRecord:
    """``dataclasses.replace`` for the write path, which makes one record a step: that one
    checks each field's kind and calls the frozen ``__init__`` (a ``__setattr__`` call a
    field), a third of a step's Python. Same result; an unknown name raises AttributeError."""
    made = _copied(sale)
    for name, value in changes.items():
        _SET(made, name, value)
    return made


_SET = object.__setattr__  # the record is frozen to its users, not to the one making it
# a copy of a record, every field set by name in one straight function (made once): a loop
# over the fields with zip and a getter cost a third more a step
_copied = maker_from(SaleRecord, _COLUMNS)
