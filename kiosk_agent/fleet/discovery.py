"""Home Assistant MQTT discovery: the config message of each entity in ``entities``.

Full key names (HA takes them and its abbreviations alike). HA's rules kept, from its
``mqtt/sensor.py``, ``mqtt/event.py`` and ``sensor/const.py``: ``last_reset_value_template``
only with ``state_class: total``; ``options`` only with ``device_class: enum``, and then
neither a state class nor a unit; ``monetary`` only with ``state_class: total``; ``timestamp``
with neither; ``expire_after`` a positive integer, not on events; origin needs a ``name``.
What each release takes is in docs/fleet.md ("Which Home Assistant gets what"):
``HOME_ASSISTANT_RULES`` holds it, one rule set per release the configs were checked against
(its source read, kept as data in tests/fleet/home_assistant_rules.py); a key an older release
refuses (2024.3: ``extra keys not allowed @ data['device']['model_id']``, no device at all) is
sent only to a release that takes it, as the operator names it in ``upstream.home_assistant``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kiosk_agent.fleet.entities import (
    OLDEST_HOME_ASSISTANT,
    DiscoveryOptions,
    Entity,
    latin_slug,
    slug,
    unit_entities,
)
from kiosk_agent.fleet.topics import (
    OFFLINE,
    ONLINE,
    command_topic,
    discovery_topic,
    latest_version_topic,
)

PUBLISHER = "kiosk-agent"  # the origin's name: who published the configs and the manufacturer


@dataclass(frozen=True, slots=True)
class HomeAssistantRules:
    """What one Home Assistant release takes beyond what every supported one does."""

    release: str
    model_id: bool  # device model_id (2024.3's device schema refuses it: no device, no entity)
    default_entity_id: bool  # 2024.3 drops it and derives the same id from the names
    enum_options: bool  # an enum sensor's options (2024.3's MQTT sensor has none: text)
    none_timestamp: bool  # a timestamp sensor takes "None" as no value (2024.3 warns)


# One rule set per release checked (its source read: tests/fleet/home_assistant_rules.py)
HOME_ASSISTANT_RULES = {
    "2024.3": HomeAssistantRules("2024.3", False, False, False, False),
    "2026.2": HomeAssistantRules("2026.2", True, True, True, True),
}


def release_tuple(release: str) -> tuple[int, int]:
    """``"2024.3"`` (or ``"2024.3.3"``) as (2024, 3), to compare releases."""
    year, month = release.split(".")[:2]
    return int(year), int(month)


def home_assistant_rules(release: str | None) -> HomeAssistantRules:
    """The rules for the Home Assistant the operator runs: the newest checked release not newer
    than it (the oldest when unsaid: what 2024.3 refuses is never sent to a HA not named)."""
    wanted = release_tuple(release or OLDEST_HOME_ASSISTANT)
    fitting = [r for r in HOME_ASSISTANT_RULES if release_tuple(r) <= wanted]
    return HOME_ASSISTANT_RULES[max(fitting or [OLDEST_HOME_ASSISTANT], key=release_tuple)]


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
    rules = home_assistant_rules(options.home_assistant)
    device: dict[str, Any] = {
        "identifiers": [f"kiosk_agent_{device_id}"],
        "name": options.name or device_id,
        "manufacturer": PUBLISHER,
        "model": options.model,
        "sw_version": version,
    }
    if options.mac:
        device["connections"] = [["mac", options.mac]]
    optional = {
        "model_id": options.model_id if rules.model_id else None,
        "hw_version": options.hw_version,
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
    base = state_topic.rsplit("/", 1)[0]
    events = event_topic or f"{base}/event"
    messages: list[tuple[str, dict[str, Any]]] = []
    for entity in unit_entities(options):
        own = {**common, **_own_topics(entity, base, events)}
        config = _config(entity, device_id, str(device["name"]), own, options)
        messages.append(
            (discovery_topic(str(prefix), entity.component, device_id, entity.key), config)
        )
    return messages


def _own_topics(entity: Entity, base: str, event_topic: str) -> dict[str, str]:
    """The topics of the unit an entity's kind reads or writes beside its state topic."""
    if entity.component == "event":
        return {"state_topic": event_topic}
    if entity.component == "button":
        return {"command_topic": command_topic(base, entity.key)}
    if entity.component == "update":
        return {"latest_version_topic": latest_version_topic(base)}
    return {}


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
        **entity.config,
    }
    if entity.attributes:
        config["json_attributes_topic"] = config["state_topic"]
    if entity.stateless:
        config.pop("state_topic")
    if entity.expires and options.expire_after:
        config["expire_after"] = options.expire_after
    return _for_release(config, entity, home_assistant_rules(options.home_assistant))


def _for_release(
    config: dict[str, Any], entity: Entity, rules: HomeAssistantRules
) -> dict[str, Any]:
    """The config as the release takes it: nothing it refuses or drops, no value it warns of."""
    if not rules.none_timestamp and entity.no_none is not None:
        config.update(entity.no_none)
    if not rules.enum_options and "options" in config:
        config.pop("options")
        config.pop("device_class", None)  # an enum without options: a text sensor, said so
    if not rules.default_entity_id:
        config.pop("default_entity_id")
    return {key: value for key, value in config.items() if value is not None}


def _object_id(entity: Entity, device_id: str, device_name: str) -> str:
    """The entity id 2024.3 derives from the names (2025.10+ takes it as given). A name in
    another script (Cyrillic, Japanese) has no spelling here that HA would make: the device id
    (or the entity's key) stands in for it, so no two units share ``sensor.status``."""
    device = latin_slug(device_name) or slug(device_id)
    return f"{device}_{latin_slug(entity.name) or entity.key}"
