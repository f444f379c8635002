"""Home Assistant MQTT discovery: the config message of each entity in ``entities``.

Full key names (HA takes them and its abbreviations alike). HA's rules kept, from its
``mqtt/sensor.py``, ``mqtt/event.py`` and ``sensor/const.py``: ``last_reset_value_template``
only with ``state_class: total``; ``options`` only with ``device_class: enum``, and then
neither a state class nor a unit; ``monetary`` only with ``state_class: total``; ``timestamp``
with neither; ``expire_after`` a positive integer, not on events; origin needs a ``name``.
What each release takes is in docs/fleet.md ("Which Home Assistant gets what").
"""

from __future__ import annotations

import json
from typing import Any

from kiosk_agent.fleet.entities import DiscoveryOptions, Entity, latin_slug, slug, unit_entities
from kiosk_agent.fleet.topics import OFFLINE, ONLINE, discovery_topic

PUBLISHER = "kiosk-agent"  # the origin's name: who published the configs


def unique_id(device_id: str, key: str) -> str:
    """An entity's unique id: Home Assistant's history follows it (never change it)."""
    return f"kiosk_agent_{device_id}_{key}"


def own_config(device_id: str, payload: str | bytes | bytearray) -> bool:
    """Whether a retained discovery config is one of this unit's (by its unique id). Other
    programs may share the node id: a unit's device id defaults to the host name, and a system
    monitor names its device after the host too."""
    try:
        config = json.loads(payload)
    except (ValueError, RecursionError):
        return False
    if not isinstance(config, dict):
        return False
    found = config.get("unique_id", config.get("uniq_id"))
    return isinstance(found, str) and found.startswith(unique_id(device_id, ""))


def device_info(device_id: str, version: str, options: DiscoveryOptions) -> dict[str, Any]:
    device: dict[str, Any] = {
        "identifiers": [f"kiosk_agent_{device_id}"],
        "name": options.name or device_id,
        "manufacturer": PUBLISHER,
        "model": PUBLISHER,
        "sw_version": version,
    }
    optional = {
        "model_id": options.model_id,  # HA 2024.8 and later
        "serial_number": options.serial_number,
        "suggested_area": options.suggested_area,
        "configuration_url": options.configuration_url,
    }
    device.update({key: value for key, value in optional.items() if value})
    return device


def origin_info(version: str, options: DiscoveryOptions) -> dict[str, Any]:
    origin: dict[str, Any] = {"name": PUBLISHER, "sw_version": version}
    support_url = options.support_url or options.configuration_url
    if support_url:
        origin["support_url"] = support_url
    return origin


def discovery_messages(
    device_id: str,
    version: str,
    state_topic: str,
    availability_topic: str,
    prefix: str | bool,
    options: DiscoveryOptions | None = None,
    event_topic: str | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """(topic, config) of every entity of the unit; empty when discovery is off."""
    if not prefix:
        return []
    options = options or DiscoveryOptions()
    device = device_info(device_id, version, options)
    common: dict[str, Any] = {
        "state_topic": state_topic,
        "availability_topic": availability_topic,
        "payload_available": ONLINE,
        "payload_not_available": OFFLINE,
        "device": device,
        "origin": origin_info(version, options),
    }
    events = event_topic or state_topic.rsplit("/", 1)[0] + "/event"
    messages: list[tuple[str, dict[str, Any]]] = []
    for entity in unit_entities(options, events):
        config = _config(entity, device_id, str(device["name"]), common, options)
        messages.append(
            (discovery_topic(str(prefix), entity.component, device_id, entity.key), config)
        )
    return messages


def _config(
    entity: Entity,
    device_id: str,
    device_name: str,
    common: dict[str, Any],
    options: DiscoveryOptions,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": entity.name,
        "unique_id": unique_id(device_id, entity.key),
        "default_entity_id": f"{entity.component}.{_object_id(entity, device_id, device_name)}",
        **common,
        **entity.config,  # an entity may name its own state topic (the event entity does)
    }
    if entity.attributes:
        config["json_attributes_topic"] = config["state_topic"]
    if entity.expires and options.expire_after:
        config["expire_after"] = options.expire_after
    return config


def _object_id(entity: Entity, device_id: str, device_name: str) -> str:
    """The entity id 2024.3 derives from the names (2025.10+ takes it as given). A name in
    another script (Cyrillic, Japanese) has no spelling here that HA would make: the device id
    (or the entity's key) stands in for it, so no two units share ``sensor.status``."""
    device = latin_slug(device_name) or slug(device_id)
    return f"{device}_{latin_slug(entity.name) or entity.key}"
