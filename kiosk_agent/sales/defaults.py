"""The defaults of the ``sales:`` and ``receipts:`` sections, each written once: their schema
(sales/schema.py) and the objects they configure (SaleSettings, ReceiptSettings, JournalGuard,
AttentionSweeper, ChargeAudit) take them from here (tests/config/test_defaults.py). Plain
numbers: a command that only reads the configuration (`health`, `sales`, `check-config`) checks
these sections without importing the sale's model, its states, the receipts and the service's
errors (with logging and the redaction's patterns): a fifth of `health`'s CPU."""

RETRIES = 2  # charge_card: how many times a B (retry) answer is asked again
CARD_TIMEOUT = 200.0  # how long a card may take at the terminal before the sale gives up
# How long the machine may take to report a dispense, unless its trigger sets its own (seconds)
VEND_TIMEOUT = 60.0
# Card first: how long the customer may take to choose once the card is authorized (seconds)
CHOICE_TIMEOUT = 60.0
# On a stopping signal, how long the sales already running may take to finish before what is
# still open is parked (``sales.stop_timeout``; systemd/kiosk-agent.service's TimeoutStopSec is
# this plus the stop's own margin, tests/assembly/test_systemd.py keeps them in step).
STOP_TIMEOUT = 30.0
ANSWER_MARGIN = 10.0  # how long the service may still commit a call after the agent gave up
ATTENTION_RECHECK = 300.0  # how often sales in ATTENTION are looked at again in reporting
CHARGE_CHECK_INTERVAL = 900.0  # how often reporting's recent charges meet the journal
CHARGE_HISTORY_INTERVAL = 21600.0  # how often a charge check reads the settled charges too
CHARGE_CHECK_MAX_GIVE_BACK = 5  # more unaccounted charges than this go to a person
UNWRITTEN_RESTART_AFTER = 120.0  # a sale left unwritten this long has the agent restarted

# The ``receipts:`` section's
PRINT = "auto"  # print when the terminal's capabilities say it prints
EMAIL = True
