"""Where a unit publishes: its own topics and its Home Assistant discovery configs."""

from __future__ import annotations

from typing import Any

from kiosk_agent.fleet.entities import DISCOVERY_ENTITIES

ONLINE = "online"
OFFLINE = "offline"


def discovery_topic(prefix: str, component: str, device_id: str, key: str) -> str:
    return f"{prefix}/{component}/{device_id}/{key}/config"


def unit_base_topic(mqtt: dict[str, Any], device_id: str) -> str:
    """Where a unit's own topics live: ``<topic_prefix>/<device_id>``."""
    return f"{mqtt.get('topic_prefix', 'kiosk-agent')}/{device_id}"


def unit_topics(mqtt: dict[str, Any], device_id: str) -> list[str]:
    """Every retained topic a unit publishes: state, availability, each discovery config."""
    base = unit_base_topic(mqtt, device_id)
    topics = [f"{base}/state", f"{base}/availability"]
    prefix = mqtt.get("discovery_prefix", "homeassistant")
    if prefix:
        topics += [discovery_topic(prefix, c, device_id, key) for c, key in DISCOVERY_ENTITIES]
    return topics

