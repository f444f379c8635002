"""What a trigger asks for and what the machine answers: the contract between platforms and flows.

A platform (MDB, GPIO, serial line, kiosk app) never talks to the payment service. It turns its
hardware's trigger into a ``SaleRequest`` and hands the sale runner a ``Dispenser`` that knows how
to make *this* machine give out the goods. The flow decides when money may move; the dispenser
says what really came out.
"""

from __future__ import annotations

import enum
from dataclasses import field
from typing import ClassVar, Literal, Protocol, runtime_checkable

from kiosk_agent.data_class import data_class
from kiosk_agent.money import CURRENCY, format_cents
from kiosk_agent.sales.states import Flow as Flow  # re-exported: a request names its flow
from kiosk_agent.sales.states import SaleState
from kiosk_agent.sales.states import Step as Step  # re-exported: a listener compares the step


class DispenseStatus(enum.StrEnum):
    VENDED = "vended"  # the machine confirmed the product came out
    FAILED = "failed"  # the machine reported a failed dispense
    CANCELLED = "cancelled"  # the customer or controller ended the session before a vend
    TIMEOUT = "timeout"  # no result within the vend timeout: treated as not dispensed


# The endings of an approved vend with no result heard: the machine may have vended (or still
# vend) unheard, its money going back; a person is told the product may have gone out (a
# ``late.vend`` with ``unsure``, sales/late_vends.py ``maybe_note``). Only the sale's own giving
# up: a failure or cancel the machine said, a vend never sent (the link down: "not approved"),
# or no vend approved at all (the customer cancelled first) cannot have made one.
UNHEARD_ENDS = frozenset({"timeout"})


def unheard_end(status: object, unheard: object = False) -> bool:
    """Whether a vend's end (its status, as a ``DispenseStatus`` or journaled) was no word from
    the machine of how it went: the sale gave up (``UNHEARD_ENDS``), or the platform ended it
    with the machine mid-vend and its result still to come (``DispenseOutcome.unheard``)."""
    return status in UNHEARD_ENDS or unheard is True


@data_class(frozen=True, slots=True)
class DispenseOutcome:
    status: DispenseStatus
    # What was actually dispensed, in cents. For a card-first (pre-authorized) session this is
    # the price of the product the customer then chose, which may be below the authorized funds.
    vended_cents: int = 0
    product: str | None = None
    detail: str = ""
    # ended by the platform with the approved vend in the machine's hands and no result from it
    # (a drop sensor's window that saw nothing, a controller reset mid-vend, a serial device's
    # cancel line): the machine may still make it, as after a vend timeout (``unheard_end``).
    # A class's, not a field: :class:`UnheardOutcome` says True; every other outcome, made once
    # a sale, pays nothing for it (a fifth field: 135 ns more a construction, 2026-11-30)
    unheard: ClassVar[bool] = False

    @property
    def dispensed(self) -> bool:
        return self.status is DispenseStatus.VENDED


class UnheardOutcome(DispenseOutcome):
    """An outcome the platform ended with no word from the machine of the vend's end
    (``DispenseOutcome.unheard``)."""

    __slots__ = ()
    unheard: ClassVar[bool] = True


@data_class(frozen=True, slots=True)
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
    # the trigger's own ``vend_timeout`` (seconds); None: the sales section's
    vend_timeout: float | None = None
    # card first: ``amount_cents`` is the most the customer may choose; the price comes with
    # the choice (``ChoosingDispenser.choose``), which the sale bounds
    chosen_at_machine: bool = False
    # the trigger's own time to choose (seconds); None: the sales section's (choice_timeout_for)
    choice_timeout: float | None = None


@data_class(frozen=True, slots=True)
class Selection:
    """What the customer chose at the machine (card first): the product and its price."""

    product: str | None
    amount_cents: int


def vend_refusal(price_cents: int, authorized_cents: int, product: str | None = None) -> str:
    """The money rule of a vend, the sale's: why a vend at ``price_cents`` may not go ahead on
    ``authorized_cents``, or "" when it may. Never above what the card holds (the capture could
    not take it); never for nothing (a vend of 0 reads as "the whole authorization" downstream,
    and there is nothing to charge a card for). A platform that hears the price only inside
    the dispense (card first) asks this, and tells the machine no when it says why."""
    what = f"selection {product} costs" if product else "the price is"
    if price_cents <= 0:
        return f"{what} {format_cents(price_cents)}: nothing to charge a card for"
    if price_cents > authorized_cents:
        return f"{what} {format_cents(price_cents)}, above the {format_cents(authorized_cents)}" \
            " authorized"
    return ""


class BadAmount(ValueError):
    """A sale's amount the agent refuses (not above zero, above ``max_price``): the trigger's
    amount is what was wrong, and a platform says so in its own words (the kiosk API's
    ``400 amount``). Any other ``ValueError`` out of a start is not the amount's."""


class PriceAboveMaximum(BadAmount):
    """A trigger asked for more than its configured ``max_price``."""


# Why a sale is refused at its start, as a platform hears it from ``SaleStarter.start``: the
# dispenser's side of the contract, so a platform needs nothing else from ``sales``.


class TerminalBusy(Exception):
    """A trigger arrived for a terminal that is already taking a sale; refused at once."""

    def __init__(self, terminal: str, reason: str) -> None:
        self.terminal = terminal
        self.reason = reason
        super().__init__(f"terminal {terminal} is busy: {reason}")


# Why a trigger is refused while the agent drains (logs, the machine, the kiosk app).
STOPPING = "the agent is stopping: new sales are refused until it is back"


class AgentStopping(TerminalBusy):
    """A trigger arrived while the agent drains (a stopping signal): refused at once, and the
    kiosk app is told when to ask again (``until``: the drain's end, Unix time)."""

    def __init__(self, terminal: str, until: float | None, left: float | None = None) -> None:
        self.until = until
        self.left = left  # seconds until then on the monotonic clock (a kiosk's Retry-After)
        super().__init__(terminal, STOPPING)


class RecoveryHolds(TerminalBusy):
    """A trigger arrived for a terminal recovery still holds after a restart (a sale the last
    stop or crash left open, being finished): refused at once, saying so. ``until``: when the
    hold ends at the latest (Unix time), while recovery listens for a vend that sale left in
    flight (its vend timeout); None when it finishes an open sale's money, which has no
    deadline to tell. A kiosk app shows "one moment" and asks again then."""

    def __init__(self, terminal: str, reason: str, until: float | None,
                 left: float | None = None) -> None:
        self.until = until
        self.left = left  # seconds until then on the monotonic clock (a kiosk's Retry-After)
        super().__init__(terminal, reason)


class UnknownTerminal(ValueError):
    """A sale named a terminal the configuration does not have."""


class JournalError(Exception):
    """The journal cannot be opened or written."""


class Dispenser(Protocol):
    """Implemented by each platform for each sale: drive the machine, report what came out."""

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        """Allow the machine to vend up to ``authorized_cents`` and wait for its result.

        Card first, the customer has chosen (``ChoosingDispenser.choose``): the machine vends
        that choice. The sale bounds this call by the vend timeout
        (``SaleSettings.vend_timeout_for``) and cancels it then: the outcome is ``TIMEOUT``, as
        for an exception. A platform keeps no timer of its own over it. Money is captured only
        for a ``VENDED`` outcome.
        """
        ...

    async def deny(self, reason: str) -> None:
        """Tell the machine not to vend (declined, card error, busy). Must not raise."""
        ...


@runtime_checkable
class ChoosingDispenser(Dispenser, Protocol):
    """A dispenser whose customer chooses after the card (``SaleRequest.chosen_at_machine``)."""

    async def choose(self, funds_cents: int) -> Selection | DispenseOutcome:
        """Offer ``funds_cents`` at the machine and wait for the customer's choice; the outcome
        (not dispensed) instead when the machine ended the session without one.

        No timer here: the sale bounds the choice (``SaleSettings.choice_timeout_for``),
        cancels this wait and denies. Then the sale applies its money rule to the choice
        (``vend_refusal``) and calls ``dispense`` or ``deny``.
        """
        ...


@data_class(frozen=True, slots=True)
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
    # given back (void or refund), on a REVERSED sale; on an open one, what a charge found
    # partly refunded had given back before the agent looked
    reversed_cents: int = 0
    product: str | None = None
    terminal: str | None = None
    message: str = ""
    at: float = 0.0  # time.time()
    step: Step | Literal[""] = ""  # the journal step announced (none: a snapshot)
    authorized_cents: int = 0
    currency: str = CURRENCY
    created_at: float = 0.0  # when the sale was created: the day it counts on (moments.day_of)
    # what sales.kinds reads to tell a sale from a card session with no selection
    flow: str = ""
    vended_cents: int = 0
    resolved: bool = False  # a person decided it (from attention)
    # what others gave back at the service after the sale completed (``sale_later``), if any
    later_cents: int | None = None

    @property
    def receipt(self) -> bool:
        """A receipt note on a completed sale (``message`` says what): not a second end."""
        return self.step == Step.RECEIPT

    @property
    def given_back_later(self) -> bool:
        """Its own kind: a note on a completed sale that others voided, refunded or charged
        back at the service after it ended (``later_cents``; ``message`` in words). Not a
        second end: no counter of sales or takings counts it."""
        return self.step == Step.SERVICE_LATER

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
    def vended_cents(self) -> int: ...
    @property
    def currency(self) -> str: ...
    @property
    def message(self) -> str: ...


# The words of a dispensed sale whose capture reporting shows made for $0.00 (steps'
# ``nothing_captured`` writes them; :func:`money_text` reads them): its ``captured_cents`` 0 is
# then a figure, the service's, where elsewhere 0 is "no capture yet" (the column has no null).
CAPTURED_NOTHING = "reporting shows $0.00 captured"
# The words of a sale whose charge reporting shows refunded for $0.00 (steps' ``refunded_nothing``
# writes them after the trans id; :func:`money_text` reads them): the money may still be held,
# or may be back, and the sale says "may be", not "held".
REFUNDED_NOTHING = "refunded for $0.00"
# The words of a sale whose named give-back of the rest of a charge partly refunded before the
# service refused (steps' ``_rest_refused`` writes them; the attention sweep reads them): what
# is left is a person's to decide, and no sweep moves money on it again.
REST_REFUSED = "the service refused the agent's refund of"


def money_text(sale: SaleMoney) -> str:
    """What a sale's money is now, for people: what was charged once it ended, what is held
    while it runs. Never the price asked as if it were taken (a vend captures what came out;
    a card-first session authorizes the machine's maximum)."""

    def dollars(cents: int) -> str:
        return format_cents(cents, sale.currency)

    if sale.state is SaleState.ATTENTION:
        if not sale.captured_cents and CAPTURED_NOTHING in sale.message:
            # captured, for nothing: no hold is left on the card (2026-11-29, i39-money: said
            # "$3.00 held", the authorization's, where the service holds a $0.00 capture)
            return (f"{dollars(0)} captured of {dollars(sale.vended_cents)} dispensed, "
                    "undecided")
        held = sale.captured_cents or sale.authorized_cents
        if held and REFUNDED_NOTHING in sale.message:
            # reporting shows the charge refunded for nothing: it may be held, or back (said
            # "$3.00 held" where the service shows a $3.00 refund's row and a $0.00 charge)
            return f"{dollars(held)} may be held, undecided"
        if held and sale.reversed_cents:  # a charge found partly refunded: the rest is held
            return (f"{dollars(max(0, held - sale.reversed_cents))} held, undecided "
                    f"({dollars(sale.reversed_cents)} given back)")
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
        # given back at the service by others after it completed (a person's refund at the
        # portal): said apart, never taken off what the agent charged (sales/audit.py)
        later = getattr(sale, "later_cents", None)
        if later:
            given_back += f" ({dollars(later)} given back since by others, at the service)"
        if kept:
            return f"{dollars(kept)} charged{given_back}"
        return f"nothing charged{given_back}"
    if sale.captured_cents and sale.reversed_cents:  # a charge found partly refunded, open
        return (f"{dollars(max(0, sale.captured_cents - sale.reversed_cents))} charged "
                f"({dollars(sale.reversed_cents)} given back)")
    if sale.captured_cents:
        return f"{dollars(sale.captured_cents)} charged"
    if sale.authorized_cents:
        return f"{dollars(sale.authorized_cents)} authorized"
    return f"{dollars(sale.amount_cents)} requested"
