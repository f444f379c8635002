"""How the sales behave: the settings of the flows, and the terminals a sale may name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field

from kiosk_agent.data_class import data_class
from kiosk_agent.money import CURRENCY as CURRENCY

# The ``sales:`` section's defaults are written once in sales/defaults.py (its schema reads
# them there, importing nothing of the sale); re-exported here for the objects they configure.
from kiosk_agent.sales.defaults import ANSWER_MARGIN as ANSWER_MARGIN
from kiosk_agent.sales.defaults import ATTENTION_RECHECK as ATTENTION_RECHECK
from kiosk_agent.sales.defaults import CARD_TIMEOUT as CARD_TIMEOUT
from kiosk_agent.sales.defaults import CHARGE_CHECK_INTERVAL as CHARGE_CHECK_INTERVAL
from kiosk_agent.sales.defaults import CHARGE_CHECK_MAX_GIVE_BACK as CHARGE_CHECK_MAX_GIVE_BACK
from kiosk_agent.sales.defaults import CHARGE_HISTORY_INTERVAL as CHARGE_HISTORY_INTERVAL
from kiosk_agent.sales.defaults import CHOICE_TIMEOUT as CHOICE_TIMEOUT
from kiosk_agent.sales.defaults import RETRIES as RETRIES
from kiosk_agent.sales.defaults import STOP_TIMEOUT as STOP_TIMEOUT
from kiosk_agent.sales.defaults import UNWRITTEN_RESTART_AFTER as UNWRITTEN_RESTART_AFTER
from kiosk_agent.sales.defaults import VEND_TIMEOUT as VEND_TIMEOUT
from kiosk_agent.sales.model import SaleRequest
from kiosk_agent.sales.model import UnknownTerminal as UnknownTerminal  # re-exported
from kiosk_agent.sales.receipts import ReceiptSettings
from kiosk_agent.sales.states import Flow
from kiosk_agent.service.timeouts import DEFAULT_TIMEOUT, INTERACTION_LIFETIME

# Card first: the pause before a trigger's next offer (a sale waiting for a card), doubled for
# each offer in a row that got no authorization (a terminal busy or offline), at most the second
OFFER_PAUSE = 0.2
OFFER_PAUSE_MOST = 30.0


@data_class(frozen=True, slots=True)
class SaleSettings:
    """How the flows behave; from the ``sales``, ``receipts`` and ``terminals`` sections."""

    mid: str
    terminals: Mapping[str, str]  # device_id -> name
    retries: int = RETRIES
    card_timeout: float = CARD_TIMEOUT
    vend_timeout: float = VEND_TIMEOUT  # sales.vend_timeout; a trigger's own replaces it
    choice_timeout: float = CHOICE_TIMEOUT  # sales.choice_timeout; a trigger's own replaces it
    currency: str = CURRENCY
    # the service's clock: a simulator with a time scale shortens the interaction lifetime
    interaction_lifetime: float = INTERACTION_LIFETIME
    stop_timeout: float = STOP_TIMEOUT
    # one money call (a charge-card request, an authorization) is given up after this long
    request_timeout: float = DEFAULT_TIMEOUT  # service.timeout
    # how long the service may still commit a call after the agent gave up on it
    answer_margin: float = ANSWER_MARGIN
    receipts: ReceiptSettings = field(default_factory=ReceiptSettings)

    def vend_timeout_for(self, request: SaleRequest) -> float:
        """The one rule of the vend timeout: how long a sale waits for its dispense outcome.

        The trigger's own ``vend_timeout`` when it sets one (a slow spiral, an app that needs
        longer), else the ``sales`` section's. The sale keeps this timer; a platform keeps none
        over it (docs/platforms.md, "Vend timeout"). A card-first choice has its own, before it
        (:meth:`choice_timeout_for`)."""
        return self.vend_timeout if request.vend_timeout is None else request.vend_timeout

    @staticmethod
    def offer_pause(unanswered: int) -> float:
        """Card first: the pause before the next offer after ``unanswered`` offers in a row got
        no authorization (0: the last one did)."""
        return min(OFFER_PAUSE_MOST, OFFER_PAUSE * (1 << min(unanswered, 16)))

    def choice_timeout_for(self, request: SaleRequest) -> float:
        """The same rule for a card-first customer's time to choose: the trigger's own (an
        ``mdb`` trigger's ``session_timeout``) else ``sales.choice_timeout``."""
        return self.choice_timeout if request.choice_timeout is None else request.choice_timeout

    @property
    def default_terminal(self) -> str:
        return next(iter(self.terminals))

    def resolve_terminal(self, wanted: str | None) -> str:
        """A device_id from a device_id, a configured terminal name, or None (the default)."""
        if wanted is None:
            return self.default_terminal
        if wanted in self.terminals:
            return wanted
        for device_id, name in self.terminals.items():
            if name == wanted:
                return device_id
        known = ", ".join(f"{d} ({n})" if n else d for d, n in self.terminals.items())
        raise UnknownTerminal(f"unknown terminal {wanted!r}; configured: {known}")

    def answer_window(self, flow: str) -> float:
        """Seconds from sending a money call until the service can no longer make it charge.

        The agent gives up on the call after ``request_timeout``; the service may still finish
        what it received for ``answer_margin`` more. A charge-card may also charge until its
        interaction expires. Until this has passed, "no charge in reporting" proves nothing.
        """
        window = self.request_timeout + self.answer_margin
        if flow == Flow.CHARGE_CARD:
            window += self.interaction_lifetime * 1.1
        return window

    def silence_bound(self, flow: str) -> float:
        """Seconds from sending a money call into a silent service until the sale has ended.

        The call's answer window (:meth:`answer_window`), then one last reporting lookup, which
        the service client gives up on after ``request_timeout`` (the service timeout T):
        2T + M, plus 1.1 x the interaction lifetime for a charge-card. docs/architecture.md
        has the table.
        """
        return self.answer_window(flow) + self.request_timeout

    def lookup_pause(self, flow: str) -> float:
        """How often to look again in reporting while a money call may still be answered."""
        return min(5.0, max(0.2, self.answer_window(flow) / 20))

    @property
    def card_wait(self) -> float:
        """How long to wait for a card: the interaction's own lifetime and a margin, at most."""
        return min(self.card_timeout, self.interaction_lifetime * 1.1 + 5.0)
