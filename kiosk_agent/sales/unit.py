"""The unit's identity, and which money is provably its own.

Every unit has an id (10 hex digits) kept in its journal's ``unit_ids`` table, a table the
previous release never reads, and copied beside the journal (``journal.db.unit``) so that a
journal lost or damaged and begun anew keeps the id. Every order id the unit makes carries it:
``KA`` + unit id + ``-`` + 16 hex digits of the sale + an 8 hex digit tag
(``KA3F9C0E12AB-9F3C0A77D21B4E551A2B3C4D``), ``-N`` for a retried attempt, ``-held`` for the
sale the charge check gives a charge back under. The tag is an HMAC of the rest under a key
kept only in ``journal.db.unit`` (mode 0600; never in the journal, a log or a report): another
program on a shared reader that writes this unit's id into its order ids still cannot make
this unit take its charges for its own. So a charge's order id alone proves whose it is,
whatever the journal holds.

The rule (docs/journal.md, "Whose money"): the unit moves only money whose order id carries its
own id, or, for an order id of the older form (``KA`` + 18 hex, no unit id), a sale its journal
holds while the unit keeps the journal's first id. Anything else on its terminals belongs to
another program or unit: reported, never reversed.

The journal also records the machine it was made on (``sales/machine.py``). Found on another
machine (a cloned SD card), the unit is *not confirmed*: it owns nothing, takes no customer and
moves no money until a person adopts it (``kiosk-agent unit adopt``), which gives it a new id:
the charges under the old id stay the original unit's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import re
import secrets
import sqlite3
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING

from kiosk_agent import durable
from kiosk_agent.data_class import data_class
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sales.machine import Machine

if TYPE_CHECKING:
    from kiosk_agent.sales.journal import Journal, SaleRecord

UNIT_TABLE = "unit_ids"
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {UNIT_TABLE} (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    unit_id  TEXT NOT NULL,
    machine  TEXT NOT NULL,
    made_at  REAL NOT NULL,
    why      TEXT NOT NULL DEFAULT ''
)
"""
UNIT_FILE_SUFFIX = ".unit"
_UNIT_ID = re.compile(r"[0-9A-F]{10}")
# KA + unit id + '-' + the sale's 16 hex digits + the tag; '-N' an attempt, '-held' a give-back's
OWN_ORDER_ID = re.compile(r"(KA([0-9A-F]{10})-([0-9A-F]{16})([0-9A-F]{8}))(?:-([0-9]+|held))?")
# the form before unit ids: KA + 18 hex digits of the sale (all matched whole: fullmatch)
LEGACY_ORDER_ID = re.compile(r"(KA[0-9A-F]{18})(?:-([0-9]+|held))?")


def new_unit_id() -> str:
    return secrets.token_hex(5).upper()


def unit_of(order_id: str | None) -> str | None:
    """The unit id an order id carries; None for any other form (the older one included)."""
    match = OWN_ORDER_ID.fullmatch(order_id or "")
    return match.group(2) if match else None


def split_order_id(order_id: str | None) -> tuple[str, str] | None:
    """``(base, suffix)`` of an order id of either form the agent makes; None for others."""
    match = OWN_ORDER_ID.fullmatch(order_id or "")
    if match:
        return match.group(1), match.group(5) or ""
    match = LEGACY_ORDER_ID.fullmatch(order_id or "")
    if match:
        return match.group(1), match.group(2) or ""
    return None


def not_this_units(history: list[UnitRow], order_id: str | None) -> str:
    """Why a sale of the journal is not this unit's to finish (empty: it is), by the journal's
    own record of its ids (``unit_ids``, oldest first), as :meth:`OwnUnit.owns_sale` judges it
    once confirmed: what ``sales attention``, the status page and ``sales resolve`` say."""
    if not history:
        return ""  # a journal of an older release: one unit, its own
    current = history[-1].unit_id
    owner = unit_of(order_id) or history[0].unit_id  # the older form: the journal's first id
    if owner == current:
        return ""
    if owner in {row.unit_id for row in history[:-1]}:
        made = f"made by unit {owner} before this journal was adopted"
    else:
        made = f"made by unit {owner}, not this unit ({current})"
    return f"{made}: its money is that unit's; the agent will not move it"


def new_key() -> str:
    return secrets.token_hex(16)


def _tag(key: str, unit_id: str, sale_part: str) -> str:
    mac = hmac.new(bytes.fromhex(key), f"{unit_id}-{sale_part}".encode(), hashlib.sha256)
    return mac.hexdigest()[:8].upper()


def make_order_id(unit_id: str, key: str, sale_id: str) -> str:
    sale_part = sale_id[:16].upper()
    return f"KA{unit_id}-{sale_part}{_tag(key, unit_id, sale_part)}"


@data_class(slots=True)
class OwnUnit:
    """This unit as the sale code sees it: its id, and whether its money is its own to move.

    One object per agent, shared: an adoption while the agent runs changes it in place."""

    id: str
    # the order ids' tag key (hex): in journal.db.unit only, never shown
    key: str = field(default_factory=new_key, repr=False)
    # the journal's first id: sales of the older order id form in it are this unit's
    legacy: bool = True
    machine: Machine = field(default_factory=Machine)
    made_at: float = 0.0
    # the journal was made on another machine: what differs (empty: it was made here)
    mismatch: str = ""
    # the id could not be read or kept (a journal that takes no writes): nothing is its own
    fault: str = ""

    @classmethod
    def fresh(cls) -> OwnUnit:
        """A unit of its own (a bare test rig, a sale context built without an agent)."""
        return cls(new_unit_id())

    @property
    def confirmed(self) -> bool:
        return not self.mismatch and not self.fault

    @property
    def copyable(self) -> bool:
        """Its journal was made on a machine with no hardware id (no serial, no physical
        network interface): a copy of its card on another such machine, at the same path,
        carries its machine-id, id and key and is not told apart (``Machine.differs``), so a
        charge under its id that the journal does not hold may be that twin's: the charge
        check gives none back (2026-11-30, i42-money-attack)."""
        return not self.machine.hardware

    def order_id(self, sale_id: str) -> str:
        return make_order_id(self.id, self.key, sale_id)

    def made_here(self, order_id: str | None) -> bool:
        """Provably this unit's by the order id alone (no journal needed): its id, and the tag
        only its key makes."""
        match = OWN_ORDER_ID.fullmatch(order_id or "")
        if not self.confirmed or match is None or match.group(2) != self.id:
            return False
        return hmac.compare_digest(match.group(4), _tag(self.key, self.id, match.group(3)))

    def owns_sale(self, order_id: str) -> bool:
        """Whether a sale the journal holds is this unit's to finish, capture or give back."""
        if not self.confirmed:
            return False
        owner = unit_of(order_id)
        if owner is not None:
            return owner == self.id
        return self.legacy  # the older form: the journal's own, while it keeps its first id

    def refusal(self) -> str:
        if self.fault:
            return (f"unit id unknown: {self.fault}; no customer until the journal holds it "
                    "(looked at again every second)")
        return (f"unit {self.id}: its journal was made on another machine ({self.mismatch}); "
                "a person must confirm it: `kiosk-agent unit adopt`")

    def as_dict(self) -> dict[str, object]:
        return {"id": self.id, "machine": self.machine.describe(), "made_at": self.made_at,
                "confirmed": self.confirmed, "mismatch": self.mismatch}


@data_class(frozen=True, slots=True)
class UnitRow:
    unit_id: str
    machine: Machine
    made_at: float
    why: str
    key: str = field(default="", repr=False)  # from journal.db.unit only


def unit_file(journal_path: Path) -> Path:
    return journal_path.with_name(journal_path.name + UNIT_FILE_SUFFIX)


def rows(db: sqlite3.Connection) -> list[UnitRow]:
    """Every id the journal has had, oldest first (none: a journal of an older release)."""
    try:
        found = db.execute(
            "SELECT unit_id, machine, made_at, why FROM unit_ids ORDER BY seq"
        ).fetchall()
    except sqlite3.OperationalError:  # no such table
        return []
    return [UnitRow(r[0], Machine.from_text(r[1]), float(r[2]), r[3]) for r in found]


def load(
    db: sqlite3.Connection, journal_path: Path, here: Machine, clock: Clock = SYSTEM_CLOCK
) -> OwnUnit:
    """The unit of this journal, made on its first open (or taken from the copy beside a
    journal begun anew), judged against the machine it runs on now."""
    here = here.at(journal_path)
    history = rows(db)
    if not history:
        kept = _read_unit_file(unit_file(journal_path))
        if kept is not None:
            _insert(db, dataclasses.replace(
                kept, why="kept beside the journal: the journal was begun anew"))
        else:
            _insert(db, UnitRow(new_unit_id(), here, clock.time(), "made with this journal"))
        history = rows(db)
    current = history[-1]
    kept = _read_unit_file(unit_file(journal_path))
    # the key beside the journal, else a new one: order ids made under a lost key are the
    # unit's still when its journal holds them, and cannot be proven when it does not
    key = kept.key if kept is not None and kept.unit_id == current.unit_id and kept.key else ""
    current = dataclasses.replace(current, key=key or new_key())
    _write_unit_file(unit_file(journal_path), current)
    return OwnUnit(
        id=current.unit_id,
        key=current.key,
        legacy=current.unit_id == history[0].unit_id,
        machine=current.machine,
        made_at=current.made_at,
        mismatch=current.machine.differs(here),
    )


def adopt(
    db: sqlite3.Connection, journal_path: Path, here: Machine, clock: Clock = SYSTEM_CLOCK
) -> tuple[UnitRow, UnitRow]:
    """A person confirms this journal on this machine: a new id for the unit (its future
    order ids differ), the old id's charges left to the unit that made them.
    Returns (the former row, the new one)."""
    here = here.at(journal_path)
    history = rows(db)
    if not history:
        raise ValueError("the journal has no unit yet: start the agent once, it makes one")
    former = history[-1]
    fresh = UnitRow(
        new_unit_id(), here, clock.time(),
        f"adopted on {here.describe()}: the journal was unit {former.unit_id}, made on "
        f"{former.machine.describe()}", new_key(),
    )
    _insert(db, fresh)
    _write_unit_file(unit_file(journal_path), fresh)
    return former, fresh


def current(db: sqlite3.Connection) -> UnitRow | None:
    history = rows(db)
    return history[-1] if history else None


def _insert(db: sqlite3.Connection, row: UnitRow) -> None:
    with db:
        db.execute(_SCHEMA)
        db.execute(
            "INSERT INTO unit_ids (unit_id, machine, made_at, why) VALUES (?, ?, ?, ?)",
            (row.unit_id, row.machine.to_text(), row.made_at, row.why),
        )


def _read_unit_file(path: Path) -> UnitRow | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        unit_id = str(data["unit_id"])
        if not _UNIT_ID.fullmatch(unit_id):
            return None
        key = str(data.get("key", ""))
        bytes.fromhex(key)  # hex, or refused as a whole
        return UnitRow(unit_id, Machine.from_text(json.dumps(data["machine"])),
                       float(data["made_at"]), "", key)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none, or not one this release wrote: a new id is made


def _write_unit_file(path: Path, row: UnitRow) -> None:
    """Atomically, and only when it differs; a disk that cannot take it leaves it for later."""
    text = json.dumps({"unit_id": row.unit_id, "machine": json.loads(row.machine.to_text()),
                       "made_at": row.made_at, "key": row.key}, sort_keys=True)
    with contextlib.suppress(OSError):
        if path.read_text(encoding="utf-8") == text:
            return
    scratch = path.with_name(path.name + ".new")
    try:
        descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
        durable.replace(scratch, path)
    except OSError:
        with contextlib.suppress(OSError):
            scratch.unlink()


def others_open(journal: Journal) -> list[tuple[SaleRecord, str]]:
    """The journal's open sales that are not this unit's (made under another unit id: a
    journal adopted under a new id holds the original unit's), each with why. The agent never
    finishes them nor moves their money: a person decides (``sales resolve``). Here, not in
    the attention sweeper: `sales attention` lists them without the service's models."""
    history = rows(journal.db)
    return [(r, why) for r in journal.open_sales()
            if (why := not_this_units(history, r.order_id))]
