"""The entities a unit shows in Home Assistant, and what each one reads from the report.

Naming follows HA's ``has_entity_name`` rules: each entity's ``name`` is only its own part
("Status"), the device's name comes first in the UI, and the default entity id is
``<domain>.<device>_<name>`` in both the releases units run. 2024.3 derives it from those names;
2025.10 and later take ``default_entity_id``, sent so that a device renamed later keeps its ids.

Unique ids stay ``kiosk_agent_<device_id>_<key>`` (history in HA follows them); an entity that
is no longer announced is listed in ``RETIRED`` so its retained config is cleared.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

# The statuses the Status sensor can have (Home Assistant device_class enum options);
# "stopped": the last report of a unit stopped on purpose.
STATUS_OPTIONS = ["ok", "degraded", "down", "stopped"]

# The kinds of events the Alert event entity fires ("event_types").
EVENT_SALE_ATTENTION = "sale_needs_attention"
EVENT_OUT_OF_SERVICE = "terminal_out_of_service"
EVENT_BACK_IN_SERVICE = "terminal_back_in_service"
EVENT_TYPES = [EVENT_SALE_ATTENTION, EVENT_OUT_OF_SERVICE, EVENT_BACK_IN_SERVICE]

# Configs announced by earlier versions and no longer: cleared on connect and by `fleet forget`.
RETIRED = [
    ("sensor", "uptime"),  # replaced by "Started at", which does not change every beat
    ("binary_sensor", "journal"),  # "Journal writable" without a device class: now "Journal"
]

DEFAULT_MODEL = "card payment kiosk"  # the device's model unless `upstream.model` says
OLDEST_HOME_ASSISTANT = "2024.3"  # the rules used unless `upstream.home_assistant` says

# 'None': HA's MQTT binary sensor's word for no value (not checked yet)
_ON_OFF = "{{{{ {{true: 'ON', false: 'OFF'}}.get({value}, 'None') }}}}"
_OFF_ON = "{{{{ {{true: 'OFF', false: 'ON'}}.get({value}, 'None') }}}}"


@dataclass(frozen=True, slots=True)
class DiscoveryOptions:
    """What Home Assistant's discovery says beyond the topics (from the agent's configuration)."""

    expire_after: int | None = None  # seconds; a frozen unit's values go unavailable after it
    configuration_url: str | None = None  # the unit's status page ("Visit" in HA)
    currency: str = "USD"  # the daily amount's unit (ISO 4217, as HA's monetary class wants)
    name: str | None = None  # the device's name in HA; default: the device id
    suggested_area: str | None = None
    serial_number: str | None = None
    model: str = DEFAULT_MODEL  # the device's model (the manufacturer is the project)
    model_id: str | None = None
    hw_version: str | None = None  # the board the unit runs on
    mac: str | None = None  # the unit's network address: HA's "mac" connection
    support_url: str | None = None  # the origin's support link; default: configuration_url
    # the Home Assistant release the configs are for (discovery.HOME_ASSISTANT_RULES)
    home_assistant: str = OLDEST_HOME_ASSISTANT
    # configured terminals: (device_id, name) -> connectivity and card-payment entities each
    terminals: Sequence[tuple[str, str]] = field(default_factory=tuple)
    audit: bool = False  # the unit reads the machine's books (a `dex:` section)
    commands: bool = False  # buttons and the update entity (upstream.commands)


@dataclass(frozen=True, slots=True)
class Entity:
    """One entity, described as data: its HA component, its key (in topics and unique ids),
    name and own keys. Adding an entity is adding one of these to ``UNIT_ENTITIES``."""

    component: str
    key: str
    name: str
    config: dict[str, Any]
    expires: bool = True  # takes expire_after (an event entity has no state to expire)
    attributes: bool = False  # json_attributes_template reads the state topic too
    # what a release whose timestamp sensor refuses the text "None" (2024.3: "Invalid state
    # message" on every report) gets instead: a plain text sensor that says "unknown"
    no_none: dict[str, Any] | None = None
    currency: bool = False  # its unit is the configured currency
    stateless: bool = False  # a button: no state topic, nothing to expire


def slug(text: str) -> str:
    """HA's entity id slug for plain names: lower case, each run of other characters one ``_``."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


# Latin letters that no Unicode decomposition takes to ASCII, spelt as HA's slugify spells them
_LATIN = str.maketrans({"ß": "ss", "æ": "ae", "Æ": "AE", "ø": "o", "Ø": "O", "œ": "oe",
                        "Œ": "OE", "đ": "d", "Đ": "D", "ł": "l", "Ł": "L", "þ": "th",
                        "Þ": "Th"})


def latin_slug(text: str) -> str | None:
    """``slug`` of a name in Latin letters with accents as HA spells it (``Café`` ->
    ``cafe``); None when letters of another script are left (HA transliterates those its own
    way: no id made here would be the one it makes)."""
    plain = unicodedata.normalize("NFKD", text.translate(_LATIN))
    plain = "".join(c for c in plain if not unicodedata.combining(c))
    if any(not c.isascii() and c.isalnum() for c in plain):
        return None
    return slug(plain)


_DIAGNOSTIC = {"entity_category": "diagnostic"}
# off until a person turns it on, as HA's own integrations ship such diagnostics (ESPHome's
# uptime, Shelly's RSSI): nothing a person acts on, a recorder row at every change
_HIDDEN = {"entity_category": "diagnostic", "enabled_by_default": False}
_COUNT = {
    "state_class": "measurement",
    "unit_of_measurement": "sales",
    "suggested_display_precision": 0,
}
_VENDS = {
    "state_class": "measurement",
    "unit_of_measurement": "vends",
    "suggested_display_precision": 0,
}

UNIT_ENTITIES: tuple[Entity, ...] = (
    Entity(
        "sensor",
        "status",
        "Status",
        {
            "value_template": "{{ value_json.status }}",
            "device_class": "enum",
            "options": STATUS_OPTIONS,  # HA 2024.3 has none (its MQTT sensor takes no options)
            "icon": "mdi:storefront-check",
        },
    ),
    Entity(
        "binary_sensor",
        "problem",
        "Problem",
        {
            "device_class": "problem",
            # a unit stopped on purpose has no problem: it is unavailable (availability)
            "value_template": "{{ 'OFF' if value_json.status in ('ok', 'stopped') else 'ON' }}",
            # the problems themselves, as the Problem sensor's attributes
            "json_attributes_template": (
                "{{ {'problems': value_json.problems, "
                "'out_of_service': value_json.out_of_service | default([]), "
                "'starting': value_json.starting | default([])} | tojson }}"
            ),
        },
        attributes=True,
    ),
    Entity(
        "sensor",
        "terminals_online",
        "Terminals online",
        {
            "value_template": "{{ value_json.terminals_online }}",
            "state_class": "measurement",
            "unit_of_measurement": "terminals",
            "suggested_display_precision": 0,
            "icon": "mdi:credit-card-wireless",
        },
    ),
    Entity(
        "sensor",
        "sales_today",
        "Sales today",
        {
            # drops at midnight UTC (the one rule of days): a meter reset for total_increasing
            "value_template": "{{ value_json.sales.today_count }}",
            "state_class": "total_increasing",
            "unit_of_measurement": "sales",
            "suggested_display_precision": 0,
            "icon": "mdi:cart-check",
        },
    ),
    Entity(
        "sensor",
        "sales_today_amount",
        "Sales today amount",
        {
            # cents on the wire (exact), currency units for people; monetary takes only
            # state_class total, so the midnight reset is told by last_reset. What the day's
            # completed sales captured (the agent's takings), not net of what others gave back
            # later at the service: that is "Given back today" beside it
            "value_template": "{{ (value_json.sales.today_amount_cents / 100) | round(2) }}",
            "device_class": "monetary",
            "state_class": "total",
            "suggested_display_precision": 2,
            "last_reset_value_template": "{{ value_json.sales.day_started }}",
        },
        currency=True,
    ),
    Entity(
        "sensor",
        "given_back_today_amount",
        "Given back today amount",
        {
            # of the same sales, what others (a person at the portal, another program) voided,
            # refunded or charged back at the service after they completed, as the journal
            # holds it: "Sales today amount" less this is what the service still holds of them
            # (a release before it sends none: 0)
            "value_template": (
                "{{ ((value_json.sales.today_given_back_cents | default(0)) / 100) | round(2) }}"
            ),
            "device_class": "monetary",
            "state_class": "total",
            "suggested_display_precision": 2,
            "last_reset_value_template": "{{ value_json.sales.day_started }}",
            "icon": "mdi:cash-refund",
        },
        currency=True,
    ),
    Entity(
        "sensor",
        "given_back_today",
        "Given back today",
        {
            # the sales of those with anything given back by others (a refund noted twice, in
            # part then whole, is one sale); a later give-back can come, or a chargeback be won
            # back, at any time: measurement, not a meter
            "value_template": "{{ value_json.sales.today_given_back_count | default(0) }}",
            **_COUNT,
            "icon": "mdi:cash-refund",
        },
    ),
    Entity(
        "sensor",
        "open_sales",
        "Open sales",
        {"value_template": "{{ value_json.sales.open }}", **_COUNT, "icon": "mdi:timer-sand"},
    ),
    Entity(
        "sensor",
        "attention_sales",
        "Sales needing attention",
        {
            "value_template": "{{ value_json.sales.attention }}",
            **_COUNT,
            "icon": "mdi:alert-circle-outline",
        },
    ),
    Entity(
        "sensor",
        "attention_amount",
        "Attention amount",
        {
            # the prices of the sales in attention, summed once by health (its
            # sales.attention_cents): up and down, so no state class (monetary takes only total)
            "value_template": "{{ (value_json.sales.attention_cents / 100) | round(2) }}",
            "device_class": "monetary",
            "suggested_display_precision": 2,
            "icon": "mdi:cash-lock",
        },
        currency=True,
    ),
    Entity(
        "sensor",
        "late_vends",
        "Late vends",
        {
            # products dispensed after their sale gave up waiting, not yet acknowledged
            "value_template": "{{ value_json.sales.late_vends }}",
            **_VENDS,
            "icon": "mdi:package-variant-closed-remove",
        },
    ),
    Entity(
        "sensor",
        "maybe_dispensed",
        "Maybe dispensed",
        {
            # products a dispenser's error may have let out, not yet acknowledged
            "value_template": "{{ value_json.sales.maybe_dispensed }}",
            **_VENDS,
            "icon": "mdi:package-variant-closed-check",
        },
    ),
    Entity(
        "binary_sensor",
        "service",
        "Service",
        {
            "device_class": "connectivity",
            "value_template": _ON_OFF.format(value="value_json.service.reachable"),
        },
    ),
    Entity(
        "binary_sensor",
        "journal_problem",
        "Journal",
        {
            # on: the journal takes no writes (HA: "Problem"); "Journal writable" before
            "device_class": "problem",
            "value_template": _OFF_ON.format(value="value_json.journal.writable"),
            "icon": "mdi:database-alert",
            **_DIAGNOSTIC,
        },
    ),
    Entity(
        "sensor",
        "started_at",
        "Started at",
        {"value_template": "{{ value_json.started }}", "device_class": "timestamp", **_HIDDEN},
    ),
    Entity(
        "sensor",
        "last_heartbeat",
        "Last heartbeat",
        # a new value every heartbeat: off unless wanted, to spare the recorder
        {"value_template": "{{ value_json.reported }}", "device_class": "timestamp", **_HIDDEN},
    ),
    Entity(
        "sensor",
        "api_key_expires",
        "API key expires",
        {
            # "None": HA's MQTT sensor's word for no value (2024.6 and later take it here)
            "value_template": "{{ value_json.service.key_expires or 'None' }}",
            "device_class": "timestamp",
            "icon": "mdi:key-chain",
            **_DIAGNOSTIC,
        },
        no_none={
            "value_template": "{{ value_json.service.key_expires or 'unknown' }}",
            "device_class": None,
        },
    ),
    Entity(
        "sensor",
        "version",
        "Version",
        # the device's own sw_version says it too
        {"value_template": "{{ value_json.version }}", "icon": "mdi:tag-outline", **_HIDDEN},
    ),
    Entity(
        "event",
        "alert",
        "Alert",
        {"event_types": EVENT_TYPES, "icon": "mdi:bell-alert"},  # state_topic: the event topic
        expires=False,
    ),
)


def unit_entities(options: DiscoveryOptions) -> list[Entity]:
    """The unit's own entities, then those of each configured terminal, then its commands.
    The topics each reads or writes are the unit's: discovery.py fills them in."""
    entities = [_resolved(entity, options) for entity in UNIT_ENTITIES]
    if options.audit:
        entities += [_resolved(entity, options) for entity in AUDIT_ENTITIES]
    terminals = list(_terminal_keys(options.terminals))
    entities += [description.for_terminal(device_id, name, key)
                 for device_id, name, key in terminals for description in TERMINAL_ENTITIES]
    if options.commands:
        entities += UNIT_COMMANDS
        entities += [description.for_terminal(device_id, name, key)
                     for device_id, name, key in terminals for description in TERMINAL_COMMANDS]
    return entities


def _resolved(entity: Entity, options: DiscoveryOptions) -> Entity:
    """A description with what depends on the unit's configuration: the currency."""
    if not entity.currency:
        return entity
    return replace(entity, config={**entity.config, "unit_of_measurement": options.currency})


# The machine's books (docs/audit.md): read from the report's `audit` part.
AUDIT_ENTITIES: tuple[Entity, ...] = (
    Entity(
        "sensor",
        "columns_low",
        "Columns low",
        {
            "value_template": "{{ value_json.audit.columns_low if value_json.audit else 'None' }}",
            "state_class": "measurement",
            "unit_of_measurement": "columns",
            "suggested_display_precision": 0,
            "icon": "mdi:package-variant",
            "json_attributes_template": (
                "{{ {'low': value_json.audit.low, 'sold_out': value_json.audit.sold_out} | tojson"
                " if value_json.audit else '{}' }}"
            ),
        },
        attributes=True,
    ),
    Entity(
        "binary_sensor",
        "audit_mismatch",
        "Audit mismatch",
        {
            "device_class": "problem",
            "value_template": _ON_OFF.format(
                value="(value_json.audit.mismatch if value_json.audit else None)"
            ),
            # off also while the latest comparison was not made: what was not checked, and
            # what to do, beside it (the report's audit.not_compared, "" once compared again);
            # off after the machine's books were reset, said beside it (audit.books_reset)
            "json_attributes_template": (
                "{{ {'mismatches': value_json.audit.mismatches,"
                " 'not_compared': value_json.audit.not_compared,"
                " 'books_reset': value_json.audit.books_reset} | tojson"
                " if value_json.audit else '{}' }}"
            ),
        },
        attributes=True,
    ),
    Entity(
        "sensor",
        "last_audit",
        "Last audit",
        {
            "value_template": "{{ (value_json.audit.last_read if value_json.audit else None)"
            " or 'None' }}",
            "device_class": "timestamp",
            "icon": "mdi:clipboard-text-clock",
            **_DIAGNOSTIC,
        },
        no_none={
            "value_template": "{{ (value_json.audit.last_read if value_json.audit else None)"
            " or 'unknown' }}",
            "device_class": None,
        },
    ),
)


def terminal_key(device_id: str, taken: set[str]) -> str:
    """The terminal's part of its entities' keys (topics, unique ids): its id's slug, which
    history in HA follows; a short digest of the id is added when that slug is empty or an
    earlier terminal has it (``SIM-0001`` and ``sim_0001`` would share one entity)."""
    key = slug(device_id)
    if key and key not in taken:
        return key
    digest = hashlib.sha256(device_id.encode()).hexdigest()[:8]
    return f"{key}_{digest}" if key else digest


def _terminal_keys(terminals: Sequence[tuple[str, str]]) -> Iterator[tuple[str, str, str]]:
    """(device id, name shown, key) of each configured terminal, in order."""
    taken: set[str] = set()
    for device_id, name in terminals:
        key = terminal_key(device_id, taken)
        taken.add(key)
        yield device_id, name or device_id, key


def terminal_of(key: str, terminals: Sequence[tuple[str, str]],
                descriptions: Sequence[TerminalEntity]) -> str | None:
    """The terminal (device id) whose entity of one of ``descriptions`` has the key ``key``."""
    for device_id, _, own in _terminal_keys(terminals):
        if any(key == f"{d.key_prefix}{own}" for d in descriptions):
            return device_id
    return None


@dataclass(frozen=True, slots=True)
class TerminalEntity:
    """An entity each configured terminal has, described once (as Home Assistant's
    EntityDescription): its key and name are the prefix and the terminal's own."""

    component: str
    key_prefix: str
    name_prefix: str
    config: dict[str, Any]
    # the field of the report's terminal_states[<terminal>] shown, as ON/OFF; None: no state
    reads: str | None = None
    # fields of the report's terminal_states[<terminal>] shown as the entity's attributes
    attributes: tuple[str, ...] = ()

    def for_terminal(self, device_id: str, name: str, key: str) -> Entity:
        config = dict(self.config)
        if self.reads is not None:
            state = f"value_json.terminal_states[{device_id!r}].{self.reads}"
            config["value_template"] = _ON_OFF.format(value=state)
        if self.attributes:
            # default(None): a report of an older version, retained, has no such field
            fields = ", ".join(f"{field!r}: value_json.terminal_states[{device_id!r}].{field}"
                               " | default(None)" for field in self.attributes)
            config["json_attributes_template"] = f"{{{{ {{{fields}}} | tojson }}}}"
        stateless = self.reads is None
        return Entity(self.component, f"{self.key_prefix}{key}", f"{self.name_prefix}{name}",
                      config, expires=not stateless, stateless=stateless,
                      attributes=bool(self.attributes))


# A terminal's connectivity and whether it takes cards now (out of service: off).
TERMINAL_ENTITIES: tuple[TerminalEntity, ...] = (
    TerminalEntity(
        "binary_sensor",
        "terminal_",
        "Terminal ",
        {"device_class": "connectivity", "icon": "mdi:credit-card-wireless-outline"},
        reads="online",
    ),
    TerminalEntity(
        "binary_sensor",
        "card_payments_",
        "Card payments ",
        # running: takes cards now; off while out of service, and while recovery holds the
        # terminal after a restart (a sale there is refused): why, and until when, as attributes
        {"device_class": "running", "icon": "mdi:credit-card-check-outline"},
        reads="takes_cards",
        attributes=("reason", "until"),
    ),
)

# -- commands (upstream.commands; fleet/commands.py does them) ----------------------------------

PRESS = "PRESS"  # what Home Assistant's button publishes
_BUTTON = {"payload_press": PRESS, "entity_category": "config"}  # command_topic: discovery's

RESTART_BUTTON = Entity("button", "restart", "Restart", {"device_class": "restart", **_BUTTON},
                        expires=False, stateless=True)
UNIT_COMMANDS: tuple[Entity, ...] = (
    RESTART_BUTTON,
    Entity(
        "update",
        "update",
        "Firmware",
        {
            # installed: the report's; newest: latest_version_topic (discovery's), retained
            "value_template": "{{ value_json.version }}",
            "device_class": "firmware",
            "title": "kiosk-agent",
        },
        expires=False,  # its platform takes no expire_after
    ),
)
PING_BUTTON = TerminalEntity("button", "ping_", "Ping ",
                             {"icon": "mdi:access-point-check", **_BUTTON})
TEST_PRINT_BUTTON = TerminalEntity("button", "test_print_", "Test print ",
                                   {"icon": "mdi:printer-check", **_BUTTON})
TERMINAL_COMMANDS: tuple[TerminalEntity, ...] = (PING_BUTTON, TEST_PRINT_BUTTON)
