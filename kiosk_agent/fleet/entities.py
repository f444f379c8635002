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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# The statuses the Status sensor can have (Home Assistant device_class enum options).
STATUS_OPTIONS = ["ok", "degraded", "down"]

# The kinds of events the Alert event entity fires ("event_types").
EVENT_SALE_ATTENTION = "sale_needs_attention"
EVENT_OUT_OF_SERVICE = "terminal_out_of_service"
EVENT_BACK_IN_SERVICE = "terminal_back_in_service"
EVENT_TYPES = [EVENT_SALE_ATTENTION, EVENT_OUT_OF_SERVICE, EVENT_BACK_IN_SERVICE]

# Configs announced by earlier versions and no longer: cleared on connect and by `fleet forget`.
RETIRED = [("sensor", "uptime")]  # replaced by "Started at", which does not change every beat

_ON_OFF = "{{{{ {{true: 'ON', false: 'OFF'}}.get({value}, 'None') }}}}"


@dataclass(frozen=True, slots=True)
class DiscoveryOptions:
    """What Home Assistant's discovery says beyond the topics (from the agent's configuration)."""

    expire_after: int | None = None  # seconds; a frozen unit's values go unavailable after it
    configuration_url: str | None = None  # the unit's status page ("Visit" in HA)
    currency: str = "USD"  # the daily amount's unit (ISO 4217, as HA's monetary class wants)
    name: str | None = None  # the device's name in HA; default: the device id
    suggested_area: str | None = None
    serial_number: str | None = None
    model_id: str | None = None
    support_url: str | None = None  # the origin's support link; default: configuration_url
    # configured terminals: (device_id, name) -> connectivity and card-payment entities each
    terminals: Sequence[tuple[str, str]] = field(default_factory=tuple)
    audit: bool = False  # the unit reads the machine's books (a `dex:` section)


@dataclass(frozen=True, slots=True)
class Entity:
    """One entity: its HA component, its key (in topics and unique ids), name and own keys."""

    component: str
    key: str
    name: str
    config: dict[str, Any]
    expires: bool = True  # takes expire_after (an event entity has no state to expire)
    attributes: bool = False  # json_attributes_template reads the state topic too


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


def unit_entities(options: DiscoveryOptions, event_topic: str) -> list[Entity]:
    """The unit's own entities, then two per configured terminal."""
    diagnostic = {"entity_category": "diagnostic"}
    count = {
        "state_class": "measurement",
        "unit_of_measurement": "sales",
        "suggested_display_precision": 0,
    }
    entities = [
        Entity(
            "sensor",
            "status",
            "Status",
            {
                "value_template": "{{ value_json.status }}",
                "device_class": "enum",
                "options": STATUS_OPTIONS,  # HA 2024.3 drops them (its MQTT sensor has none)
                "icon": "mdi:storefront-check",
            },
        ),
        Entity(
            "binary_sensor",
            "problem",
            "Problem",
            {
                "device_class": "problem",
                "value_template": "{{ 'OFF' if value_json.status == 'ok' else 'ON' }}",
                # the problems themselves, as the Problem sensor's attributes
                "json_attributes_template": (
                    "{{ {'problems': value_json.problems, "
                    "'out_of_service': value_json.out_of_service | default([])} | tojson }}"
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
                # drops to 0 at UTC midnight: a meter reset for total_increasing, never a negative
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
                # state_class total, so the midnight reset is told by last_reset
                "value_template": "{{ (value_json.sales.today_amount_cents / 100) | round(2) }}",
                "unit_of_measurement": options.currency,
                "device_class": "monetary",
                "state_class": "total",
                "suggested_display_precision": 2,
                "last_reset_value_template": "{{ value_json.sales.day_started }}",
            },
        ),
        Entity(
            "sensor",
            "open_sales",
            "Open sales",
            {
                "value_template": "{{ value_json.sales.open }}",
                **count,
                "icon": "mdi:timer-sand",
            },
        ),
        Entity(
            "sensor",
            "attention_sales",
            "Sales needing attention",
            {
                "value_template": "{{ value_json.sales.attention }}",
                **count,
                "icon": "mdi:alert-circle-outline",
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
            "journal",
            "Journal writable",
            {
                "value_template": _ON_OFF.format(value="value_json.journal.writable"),
                "icon": "mdi:database-check",
                **diagnostic,
            },
        ),
        Entity(
            "sensor",
            "started_at",
            "Started at",
            {
                "value_template": "{{ value_json.started }}",
                "device_class": "timestamp",
                **diagnostic,
            },
        ),
        Entity(
            "sensor",
            "last_heartbeat",
            "Last heartbeat",
            {
                "value_template": "{{ value_json.reported }}",
                "device_class": "timestamp",
                # a new value every heartbeat: off unless wanted, to spare the recorder
                "enabled_by_default": False,
                **diagnostic,
            },
        ),
        Entity(
            "sensor",
            "api_key_expires",
            "API key expires",
            {
                "value_template": "{{ value_json.service.key_expires or 'None' }}",
                "device_class": "timestamp",
                "icon": "mdi:key-chain",
                **diagnostic,
            },
        ),
        Entity(
            "sensor",
            "version",
            "Version",
            {
                "value_template": "{{ value_json.version }}",
                "icon": "mdi:tag-outline",
                **diagnostic,
            },
        ),
        Entity(
            "event",
            "alert",
            "Alert",
            {
                "state_topic": event_topic,
                "event_types": EVENT_TYPES,
                "icon": "mdi:bell-alert",
            },
            expires=False,
        ),
    ]
    if options.audit:
        entities += AUDIT_ENTITIES
    keys: set[str] = set()
    for device_id, name in options.terminals:
        key = terminal_key(device_id, keys)
        keys.add(key)
        entities += terminal_entities(device_id, name or device_id, key)
    return entities


# The machine's books (docs/audit.md): read from the report's `audit` part.
AUDIT_ENTITIES = [
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
            "json_attributes_template": (
                "{{ {'mismatches': value_json.audit.mismatches} | tojson"
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
            "entity_category": "diagnostic",
        },
    ),
]


def terminal_key(device_id: str, taken: set[str]) -> str:
    """The terminal's part of its entities' keys (topics, unique ids): its id's slug, which
    history in HA follows; a short digest of the id is added when that slug is empty or an
    earlier terminal has it (``SIM-0001`` and ``sim_0001`` would share one entity)."""
    key = slug(device_id)
    if key and key not in taken:
        return key
    digest = hashlib.sha256(device_id.encode()).hexdigest()[:8]
    return f"{key}_{digest}" if key else digest


def terminal_entities(device_id: str, name: str, key: str | None = None) -> list[Entity]:
    """A terminal's connectivity and whether it takes cards now (out of service: off)."""
    state = f"value_json.terminal_states[{device_id!r}]"
    key = key or slug(device_id)
    return [
        Entity(
            "binary_sensor",
            f"terminal_{key}",
            f"Terminal {name}",
            {
                "device_class": "connectivity",
                "value_template": _ON_OFF.format(value=f"{state}.online"),
                "icon": "mdi:credit-card-wireless-outline",
            },
        ),
        Entity(
            "binary_sensor",
            f"card_payments_{key}",
            f"Card payments {name}",
            {
                "value_template": _ON_OFF.format(value=f"{state}.available"),
                "icon": "mdi:credit-card-check-outline",
            },
        ),
    ]
