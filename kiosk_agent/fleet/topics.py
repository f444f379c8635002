"""Where a unit publishes: its own topics and its Home Assistant discovery configs.

``<topic_prefix>/<device_id>/state`` (the report, retained), ``.../availability`` (``online`` /
``offline``, retained; the broker's last will), ``.../event`` (Home Assistant events, not
retained) and ``<discovery_prefix>/<component>/<device_id>/<key>/config`` per entity.
"""

from __future__ import annotations

import re
from typing import Any

from kiosk_agent.fleet.entities import RETIRED, DiscoveryOptions, unit_entities

ONLINE = "online"
OFFLINE = "offline"

# A device id is one topic level of plain characters: never an MQTT wildcard (+ #) or a "/".
DEVICE_ID = re.compile(r"^[A-Za-z0-9_-]+$")
DEVICE_ID_RULE = "letters, digits, '-' and '_' only"
# A prefix is one or more topic levels a unit publishes under: no wildcard (a publish to one is
# refused), no empty level, not a broker's own ($SYS/...), no NUL.
# (A lone surrogate, which YAML's "\ud800" makes, cannot be sent as UTF-8.)
# The `upstream.mqtt:` prefixes' defaults, written once (tests/config/test_defaults.py)
DEFAULT_TOPIC_PREFIX = "kiosk-agent"
DEFAULT_DISCOVERY_PREFIX = "homeassistant"  # Home Assistant's own default

TOPIC_PREFIX = re.compile(
    r"^[^/+#$\x00\ud800-\udfff][^/+#\x00\ud800-\udfff]*(/[^/+#\x00\ud800-\udfff]+)*$"
)
TOPIC_PREFIX_RULE = (
    "expected topic levels joined by '/' (fleet/eu-west), without the wildcards + and #, an empty "
    "level, a leading $ or a NUL"
)


def discovery_topic(prefix: str, component: str, device_id: str, key: str) -> str:
    return f"{prefix}/{component}/{device_id}/{key}/config"


def command_topic(base: str, key: str) -> str:
    """Where Home Assistant's button ``key`` of the unit at ``base`` publishes its press."""
    return f"{base}/command/{key}"


def latest_version_topic(base: str) -> str:
    """Where the operator publishes the newest version, retained, for the whole prefix."""
    return f"{base.rsplit('/', 1)[0]}/latest_version"


def unit_base_topic(mqtt: dict[str, Any], device_id: str) -> str:
    """Where a unit's own topics live: ``<topic_prefix>/<device_id>``."""
    return f"{mqtt.get('topic_prefix', DEFAULT_TOPIC_PREFIX)}/{device_id}"


def discovery_topics(mqtt: dict[str, Any], device_id: str) -> list[str]:
    """The config topics of a unit's entities (without its terminals') and retired ones."""
    prefix = mqtt.get("discovery_prefix", DEFAULT_DISCOVERY_PREFIX)
    if not prefix:
        return []
    keys = [(e.component, e.key) for e in unit_entities(DiscoveryOptions())] + RETIRED
    return [discovery_topic(prefix, c, device_id, key) for c, key in keys]


def unit_topics(mqtt: dict[str, Any], device_id: str) -> list[str]:
    """Every retained topic a unit publishes: state, availability, each discovery config."""
    base = unit_base_topic(mqtt, device_id)
    return [f"{base}/state", f"{base}/availability", *discovery_topics(mqtt, device_id)]
