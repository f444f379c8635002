"""The figures of one audit read that the unit keeps: what the machine counted, in integer minor
units (cents), taken out of a parsed EVA-DTS file once and stored as they are here.

A read's figures are plain data (JSON in the journal's ``audit_reads`` table), so a read stored
by one release is compared by the next one whatever its parser has become. Each counter pair
is since initialisation (never goes down unless the machine is re-initialised) and, where the
file gives it, since the last reset (a tech's "clear counters": goes down to 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kiosk_agent.audit.evadts import AuditFile, Counters, Tally
from kiosk_agent.audit.settings import CASHLESS_DEVICE

ZERO = Tally(0, 0)


@dataclass(frozen=True, slots=True)
class Column:
    """A product column (``PA1``) and what the machine counted for it."""

    price: int | None = None
    name: str = ""
    paid: Counters | None = None  # PA2: every paid vend, cash and card
    cashless: Counters | None = None  # PA7 for the cashless device the unit is (DA by default)

    def as_dict(self) -> dict[str, Any]:
        return {
            "price": self.price,
            "name": self.name,
            "paid": self.paid.as_dict() if self.paid else None,
            "cashless": self.cashless.as_dict() if self.cashless else None,
        }

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Column:
        price = data.get("price")
        return cls(
            price=int(price) if price is not None else None,
            name=str(data.get("name") or ""),
            paid=Counters.from_dict(data.get("paid")),
            cashless=Counters.from_dict(data.get("cashless")),
        )


@dataclass(frozen=True, slots=True)
class Figures:
    """What one read says, as the unit keeps it."""

    machine: str = ""  # ID101, the machine's serial number
    currency: str = ""
    paid: Counters | None = None  # VA1: every paid vend
    cash: Counters | None = None  # CA2
    cashless: Counters | None = None  # DA2 (or DB2): the cashless device the unit is
    columns: Mapping[str, Column] = field(default_factory=dict)
    cashless_device: str = CASHLESS_DEVICE  # whose block ``cashless`` is: "DA", or "DB"

    def as_dict(self) -> dict[str, Any]:
        stored = {
            "machine": self.machine,
            "currency": self.currency,
            "paid": self.paid.as_dict() if self.paid else None,
            "cash": self.cash.as_dict() if self.cash else None,
            "cashless": self.cashless.as_dict() if self.cashless else None,
            "columns": {name: column.as_dict() for name, column in self.columns.items()},
        }
        if self.cashless_device != CASHLESS_DEVICE:  # device 1's reads stored as they always were
            stored["cashless_device"] = self.cashless_device
        return stored

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Figures:
        columns = data.get("columns") or {}
        return cls(
            machine=str(data.get("machine") or ""),
            currency=str(data.get("currency") or ""),
            paid=Counters.from_dict(data.get("paid")),
            cash=Counters.from_dict(data.get("cash")),
            cashless=Counters.from_dict(data.get("cashless")),
            columns={str(k): Column.of(v) for k, v in columns.items()},
            # a read stored before the device was: device 1, the only one then
            cashless_device=str(data.get("cashless_device") or CASHLESS_DEVICE),
        )


# -- out of a parsed file ------------------------------------------------------------------------


def figures_of(audit: AuditFile, cashless_device: str = CASHLESS_DEVICE) -> Figures:
    """The figures the unit keeps of a parsed file (``audit.evadts``), for the cashless device
    the unit is on the machine's bus (``DA``, or ``DB`` for device 2). The reader's counter
    pairs are kept as they are (``evadts.Counters``, the one counter type)."""
    columns = {
        product.column: Column(
            price=product.price,
            name=product.name.strip(),
            paid=product.paid,
            cashless=product.by_device.get(cashless_device),
        )
        for product in audit.products
    }
    return Figures(
        machine=audit.machine.serial if audit.machine else audit.sender,
        currency=audit.currency,
        paid=audit.paid_vends,
        cash=audit.cash_sales,
        cashless=audit.cashless.get(cashless_device),
        columns=columns,
        cashless_device=cashless_device,
    )
