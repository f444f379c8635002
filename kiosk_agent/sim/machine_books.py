"""The virtual machine's own books: EVA-DTS counters for every vend it makes, card and cash,
written as the audit file a real machine answers over DEX (``audit.evadts.render_audit``).

Counted as a real controller counts: when the product drops (a card vend the agent was told
failed still counts if it dropped), per column (PA2, and PA7 per payment device) and in total
(VA1, CA2 for cash, DA2 for the cashless device the agent is). ``reset()`` is a tech clearing
the since-reset counters; the since-initialisation ones go down only at ``cold_start()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from kiosk_agent.audit.evadts import render_audit
from kiosk_agent.audit.virtual import VirtualDexPort
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock

Payment = Literal["cash", "cashless"]
# EVA-DTS payment device of each kind (PA7): cash and cashless device 1
_DEVICE: dict[Payment, str] = {"cash": "CA", "cashless": "DA"}


@dataclass(slots=True)
class _Pair:
    count: int = 0
    value: int = 0

    def add(self, value: int) -> None:
        self.count += 1
        self.value += value


@dataclass(slots=True)
class _Counters:
    since_init: _Pair = field(default_factory=_Pair)
    since_reset: _Pair = field(default_factory=_Pair)

    def add(self, value: int) -> None:
        self.since_init.add(value)
        self.since_reset.add(value)

    def reset(self) -> None:
        self.since_reset = _Pair()

    def values_first(self) -> tuple[str, str, str, str]:  # VA1, CA2, DA2
        i, r = self.since_init, self.since_reset
        return str(i.value), str(i.count), str(r.value), str(r.count)

    def counts_first(self) -> tuple[str, str, str, str]:  # PA2, PA7's last four
        i, r = self.since_init, self.since_reset
        return str(i.count), str(i.value), str(r.count), str(r.value)


class MachineBooks:
    """What the machine counted, and its audit file."""

    def __init__(self, products: Mapping[str, int], serial: str = "VM0000001") -> None:
        self.products = dict(products)
        self.serial = serial
        self.paid = _Counters()
        self.by_payment: dict[Payment, _Counters] = {"cash": _Counters(), "cashless": _Counters()}
        self.columns: dict[str, _Counters] = {code: _Counters() for code in self.products}
        self.by_column: dict[tuple[str, Payment], _Counters] = {}

    def vend(self, product: str, price: int, payment: Payment) -> None:
        """A product dropped, paid by ``payment``: every counter it belongs to."""
        for counters in (
            self.paid,
            self.by_payment[payment],
            self.columns.setdefault(product, _Counters()),
            self.by_column.setdefault((product, payment), _Counters()),
        ):
            counters.add(price)

    def reset(self) -> None:
        """A tech clears the since-reset counters (the since-initialisation ones stay)."""
        for counters in (self.paid, *self.by_payment.values(), *self.columns.values(),
                         *self.by_column.values()):
            counters.reset()

    def cold_start(self) -> None:
        """The machine's memory cleared (a board replaced, a cold start): every counter, since
        initialisation too, starts again from 0, as the demo's machine does each run."""
        self.paid = _Counters()
        self.by_payment = {"cash": _Counters(), "cashless": _Counters()}
        self.columns = {code: _Counters() for code in self.products}
        self.by_column = {}

    def vends(self, payment: Payment) -> int:
        return self.by_payment[payment].since_init.count

    def audit_file(self) -> bytes:
        """The audit a real machine would answer now: DXS ... DXE, with G85."""
        body: list[tuple[str, ...]] = [
            ("ID1", self.serial, "VIRTUAL", "", "", "", ""),
            ("ID4", "2", "840", "USD"),
            ("VA1", *self.paid.values_first()),
            ("CA2", *self.by_payment["cash"].values_first()),
            ("DA1", "KIOSK-AGENT", "VIRTUAL", ""),
            ("DA2", *self.by_payment["cashless"].values_first()),
        ]
        for code in sorted(self.columns):
            body.append(("PA1", code, str(self.products.get(code, 0)), code))
            body.append(("PA2", *self.columns[code].counts_first()))
            for payment, device in _DEVICE.items():
                counters = self.by_column.get((code, payment))
                if counters is not None:
                    body.append(("PA7", code, device, "0", str(self.products.get(code, 0)),
                                 *counters.counts_first()))
        return render_audit(body, sender=self.serial)


def dex_port(books: MachineBooks, clock: Clock = SYSTEM_CLOCK) -> VirtualDexPort:
    """The machine's DEX port on a pty (``.port``), answering each read with ``books`` as they
    are when it starts; start() it."""
    return VirtualDexPort(books.audit_file, clock=clock)
