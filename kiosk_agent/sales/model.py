"""What a trigger asks for and what the machine answers: the contract between platforms and flows.

A platform (MDB, GPIO, serial line, kiosk app) never talks to the payment service. It turns its
hardware's trigger into a ``SaleRequest`` and hands the sale runner a ``Dispenser`` that knows how
to make *this* machine give out the goods. The flow decides when money may move; the dispenser
says what really came out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal, Protocol

from kiosk_agent.money import CURRENCY, format_cents
from kiosk_agent.sales.states import Flow as Flow  # re-exported: a request names its flow
from kiosk_agent.sales.states import SaleState, Step


class DispenseStatus(enum.StrEnum):
    VENDED = "vended"  # the machine confirmed the product came out
    FAILED = "failed"  # the machine reported a failed dispense
    CANCELLED = "cancelled"  # the customer or controller ended the session before a vend
    TIMEOUT = "timeout"  # no result within the vend timeout: treated as not dispensed


@dataclass(frozen=True, slots=True)
class DispenseOutcome:
    status: DispenseStatus
    # What was actually dispensed, in cents. For a card-first (pre-authorized) session this is
    # the price of the product the customer then chose, which may be below the authorized funds.
    vended_cents: int = 0
    product: str | None = None
    detail: str = ""

    @property
    def dispensed(self) -> bool:
        return self.status is DispenseStatus.VENDED


@dataclass(frozen=True, slots=True)
class SaleRequest:
    """One customer's purchase, as a trigger sees it. Amounts are integer cents."""

    source: str  # the platform instance that asked, e.g. "mdb:front"
    flow: Flow
    amount_cents: int  # the price, or for card-first sessions the most the machine may vend
    product: str | None = None
    terminal: str | None = None  # device_id; None: the configured default terminal
    email: str | None = None  # where to mail the receipt, if the customer gave one
    # enroll only: start this billing plan on the vaulted card
    plan: dict[str, str] | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    # the trigger's ``max_price``: a request above it is refused before anything is journaled
    max_cents: int | None = None


class PriceAboveMaximum(ValueError):
    """A trigger asked for more than its configured ``max_price``."""


class Dispenser(Protocol):
    """Implemented by each platform for each sale: drive the machine, report what came out."""

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        """Allow the machine to vend up to ``authorized_cents`` and wait for its result.

        Must return (never raise) within the platform's vend timeout; an exception is treated as
        ``TIMEOUT``. Money is captured only for a ``VENDED`` outcome.
        """
        ...

    async def deny(self, reason: str) -> None:
        """Tell the machine not to vend (declined, card error, busy). Must not raise."""
        ...


@dataclass(frozen=True, slots=True)
class SaleEvent:
    """One step of one sale, published on the agent's event bus (live views, health, metrics).

    Carries no card data: at most the card brand and last four digits.
    """

    sale_id: str
    order_id: str
    source: str
    state: SaleState
    amount_cents: int
    captured_cents: int = 0
    reversed_cents: int = 0  # given back (void or refund), on a REVERSED sale
    product: str | None = None
    terminal: str | None = None
    message: str = ""
    at: float = 0.0  # time.time()
    step: Step | Literal[""] = ""  # the journal step announced (none: a snapshot)
    authorized_cents: int = 0
    currency: str = CURRENCY
    created_at: float = 0.0  # when the sale was created: the day it counts on (moments.day_of)

    @property
    def receipt(self) -> bool:
        """A receipt note on a completed sale (``message`` says what): not a second end."""
        return self.step == Step.RECEIPT

    @property
    def unwritten(self) -> bool:
        """Its own kind: a step of the sale *could not be written* (``message`` says why). The
        event's state and money are what the journal holds, not what the step would have made
        them; the sale is kept in memory until the journal takes it (sales/unwritten.py), or
        left to the next start, and its next published step says how it went on."""
        return self.step == Step.JOURNAL_UNWRITTEN


class SaleMoney(Protocol):
    """What :func:`money_text` reads: a journal record or a sale event."""

    @property
    def state(self) -> SaleState: ...
    @property
    def amount_cents(self) -> int: ...
    @property
    def authorized_cents(self) -> int: ...
    @property
    def captured_cents(self) -> int: ...
    @property
    def reversed_cents(self) -> int: ...
    @property
    def currency(self) -> str: ...


def money_text(sale: SaleMoney) -> str:
    """What a sale's money is now, for people: what was charged once it ended, what is held
    while it runs. Never the price asked as if it were taken (a vend captures what came out;
    a card-first session authorizes the machine's maximum)."""

    def dollars(cents: int) -> str:
        return format_cents(cents, sale.currency)

    if sale.state is SaleState.ATTENTION:
        held = sale.captured_cents or sale.authorized_cents
        if held:
            return f"{dollars(held)} held, undecided"
        return f"{dollars(sale.amount_cents)}, outcome unknown"
    if sale.state is SaleState.UNRESOLVED and not (sale.captured_cents or sale.authorized_cents):
        # the money call's answer was lost: the card may have been charged
        return f"{dollars(sale.amount_cents)} requested, outcome unknown"
    if sale.state.final:
        kept = max(0, sale.captured_cents - sale.reversed_cents)
        if not sale.reversed_cents:
            given_back = ""
        elif sale.captured_cents:  # a refund, or a captured sale voided
            given_back = f" ({dollars(sale.reversed_cents)} given back)"
        else:  # an authorization voided: the hold on the card is released
            given_back = f" ({dollars(sale.reversed_cents)} hold released)"
        if kept:
            return f"{dollars(kept)} charged{given_back}"
        return f"nothing charged{given_back}"
    if sale.captured_cents:
        return f"{dollars(sale.captured_cents)} charged"
    if sale.authorized_cents:
        return f"{dollars(sale.authorized_cents)} authorized"
    return f"{dollars(sale.amount_cents)} requested"
