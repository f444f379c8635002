"""The sections the sale domain owns: ``sales:``, ``journal:`` and ``receipts:``. Voluptuous
alone (checking a configuration imports no flow, no journal, no service model, nor the sale's
model, states and receipts); every default is the one written in sales/defaults.py, and the
configuration's core schema takes these. Built on each call, for the one load that checks with
them (config/load.py says why).
"""

from __future__ import annotations

import voluptuous as vol

from kiosk_agent.money import CURRENCY
from kiosk_agent.sales.defaults import (
    ANSWER_MARGIN,
    ATTENTION_RECHECK,
    CARD_TIMEOUT,
    CHARGE_CHECK_INTERVAL,
    CHARGE_CHECK_MAX_GIVE_BACK,
    CHARGE_HISTORY_INTERVAL,
    CHOICE_TIMEOUT,
    EMAIL,
    PRINT,
    RETRIES,
    STOP_TIMEOUT,
    UNWRITTEN_RESTART_AFTER,
    VEND_TIMEOUT,
)
from kiosk_agent.validators import positive_float

JOURNAL_PATH = "journal.db"  # beside the configuration file
KEEP_DAYS = 400  # days of finished sales kept; open and attention sales are never pruned


def journal_schema() -> vol.Schema:
    """The ``journal:`` section."""
    return vol.Schema(
        {
            vol.Optional("path", default=JOURNAL_PATH): str,
            # Days of finished sales kept; open and attention sales are never pruned.
            vol.Optional("keep_days", default=KEEP_DAYS): vol.All(int, vol.Range(min=1)),
        }
    )


def receipts_schema() -> vol.Schema:
    """The ``receipts:`` section."""
    return vol.Schema(
        {
            vol.Optional("print", default=PRINT): vol.In(["auto", "always", "never"]),
            vol.Optional("email", default=EMAIL): bool,
        }
    )


def sales_schema() -> vol.Schema:
    """The ``sales:`` section."""
    return vol.Schema(
        {
            # charge_card: how many times a B (retry) answer is asked again
            vol.Optional("retries", default=RETRIES): vol.All(int, vol.Range(min=0, max=10)),
            # how long a card may take at the terminal before the sale gives up (seconds)
            vol.Optional("card_timeout", default=CARD_TIMEOUT): positive_float,
            # authorize_capture: how long the machine may take to vend (seconds)
            vol.Optional("vend_timeout", default=VEND_TIMEOUT): positive_float,
            # card first: how long a customer may take to choose once the card is authorized
            vol.Optional("choice_timeout", default=CHOICE_TIMEOUT): positive_float,
            # ISO 4217, as the service and Home Assistant's monetary sensors take it: "usd" is USD
            vol.Optional("currency", default=CURRENCY): vol.All(
                str,
                vol.Match(r"^[A-Za-z]{3}$", msg="expected a three-letter currency code like USD"),
                vol.Upper,
            ),
            # the service's interaction lifetime (3 minutes); only a time-scaled service differs
            vol.Optional("interaction_lifetime"): positive_float,
            # on a stopping signal, how long the running sales may take to finish (the drain)
            # before what is still open is parked
            vol.Optional("stop_timeout", default=STOP_TIMEOUT): positive_float,
            # how long the service may still commit a money call after the agent gave up on it
            vol.Optional("answer_margin", default=ANSWER_MARGIN): vol.All(
                positive_float, vol.Range(max=600)
            ),
            # how often sales in ATTENTION are looked at again in reporting (seconds)
            vol.Optional("attention_recheck", default=ATTENTION_RECHECK): vol.All(
                positive_float, vol.Range(min=1, max=86400)
            ),
            # how often reporting's recent charges are compared with the journal (seconds); also
            # at every start and whenever the journal takes writes again after a fault
            vol.Optional("charge_check_interval", default=CHARGE_CHECK_INTERVAL): vol.All(
                positive_float, vol.Range(min=1, max=86400)
            ),
            # how often a charge check reads the settled charges too: each terminal's whole
            # history in reporting (seconds); also at every start and after every journal fault
            vol.Optional("charge_history_interval", default=CHARGE_HISTORY_INTERVAL): vol.All(
                positive_float, vol.Range(min=60, max=7 * 86400)
            ),
            # more charges than this, unaccounted in one check, are put to a person, not given back
            vol.Optional("charge_check_max_give_back", default=CHARGE_CHECK_MAX_GIVE_BACK): vol.All(
                int, vol.Range(min=0, max=10000)
            ),
            # a sale whose step could not be journaled for this long has the agent restarted
            # (the systemd watchdog is withheld) so that recovery finishes it (seconds)
            vol.Optional("unwritten_restart_after", default=UNWRITTEN_RESTART_AFTER): vol.All(
                positive_float, vol.Range(min=1, max=86400)
            ),
        }
    )
