"""Figures and journal sales for the audit tests, written as a reader would see them; and a
master of either link protocol driven through any bytes and waits."""

from __future__ import annotations

from typing import Any, Protocol

from kiosk_agent.audit.books import Column, Figures
from kiosk_agent.audit.evadts import Counters, Tally
from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.states import SaleState, Step
from tests.helpers import walk_to

MACHINE = "virtual:snacks"


def figures(
    cashless: tuple[int, int],
    *,
    columns: dict[str, tuple[int, int, int]] | None = None,
    reset: tuple[int, int] | None = None,
    cash: tuple[int, int] = (0, 0),
    machine: str = "VM-1",
) -> Figures:
    """A read: DA2 since init (count, cents) and optionally since reset; columns as
    {id: (price, paid count, cashless count)} (values at the price)."""
    cols = {
        name: Column(
            price=price,
            name=f"product {name}",
            paid=Counters(Tally(paid, paid * price)),
            cashless=Counters(Tally(card, card * price)),
        )
        for name, (price, paid, card) in (columns or {}).items()
    }
    return Figures(
        machine=machine,
        currency="USD",
        paid=Counters(Tally(cashless[0] + cash[0], cashless[1] + cash[1])),
        cash=Counters(Tally(*cash)),
        cashless=Counters(Tally(*cashless), Tally(*reset) if reset else None),
        columns=cols,
    )


_numbers = iter(range(1, 1_000_000))


def vended_sale(
    journal: Journal, cents: int, product: str | None = "A1", *, source: str = MACHINE,
    state: SaleState = SaleState.COMPLETED,
) -> SaleRecord:
    """A charge_card sale whose vend the journal holds (the machine confirmed it)."""
    n = next(_numbers)
    record = journal.create(SaleRecord(
        sale_id=f"sale-{n}", order_id=f"KA{n:06d}", source=source, flow="charge_card",
        terminal="SIM-0001", amount_cents=cents, product=product, state=SaleState.STARTED,
    ))
    record = walk_to(journal, record, SaleState.DISPENSING)
    vend: dict[str, Any] = {"status": "vended", "vended_cents": cents, "product": product}
    return journal.record(record, Step.COMPLETED, state, vended_cents=cents,
                          captured_cents=cents, detail=vend)


def unvended_sale(journal: Journal, cents: int, product: str = "A1",
                  *, source: str = MACHINE) -> SaleRecord:
    """A sale whose dispense the agent never heard confirmed: its money given back."""
    n = next(_numbers)
    record = journal.create(SaleRecord(
        sale_id=f"sale-{n}", order_id=f"KA{n:06d}", source=source, flow="charge_card",
        terminal="SIM-0001", amount_cents=cents, product=product, state=SaleState.STARTED,
    ))
    record = walk_to(journal, record, SaleState.DISPENSING)
    record = journal.record(record, Step.DISPENSE_RESULT,
                            detail={"status": "timeout", "vended_cents": 0, "product": product})
    return walk_to(journal, record, SaleState.REVERSED, reversed_cents=cents)


class LinkMaster(Protocol):
    """What the DEX/UCS and DDCMP masters share: fed bytes, told of waits run out."""

    @property
    def wait(self) -> float | None: ...

    def receive(self, data: bytes) -> bytes: ...

    def expire(self) -> bytes: ...


def hear_then_silence(
    master: LinkMaster, chunks: list[bytes], expiries: list[bool], silent_waits: int
) -> None:
    """``master`` hears each chunk in turn, or has its wait run out where ``expiries`` says, each
    answer bounded; then a silent line for up to ``silent_waits`` waits, or until it ends."""
    for chunk, expire in zip(chunks, expiries + [False] * len(chunks), strict=False):
        out = master.expire() if expire else master.receive(chunk)
        assert len(out) <= 600
    for _ in range(silent_waits):  # a silent line from here on
        if master.wait is None:
            break
        master.expire()
