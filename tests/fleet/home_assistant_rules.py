"""Home Assistant's MQTT discovery rules for ``sensor``, ``binary_sensor`` and ``event`` configs, as
HA's own source states them, for the two releases units are checked against: 2024.3 and 2026.2.

Read from home-assistant/core:
- ``components/mqtt/abbreviations.py``: ABBREVIATIONS, DEVICE_ABBREVIATIONS, ORIGIN_ABBREVIATIONS
  (a key is its full name or its abbreviation; discovery expands abbreviations first).
- ``components/mqtt/schemas.py`` (``mixins.py`` in 2024.3): MQTT_ENTITY_COMMON_SCHEMA, the
  availability keys, MQTT_ENTITY_DEVICE_INFO_SCHEMA (at least one of identifiers/connections),
  MQTT_ORIGIN_INFO_SCHEMA (``name`` required).
- ``components/mqtt/sensor.py``: DISCOVERY_SCHEMA is the platform schema with
  ``extra=vol.REMOVE_EXTRA``, so an unknown key is dropped *silently*: here it is an error.
  ``validate_sensor_state_and_device_class_config``: ``last_reset_value_template`` only with
  ``state_class: total``; ``options`` not empty, only with ``device_class: enum``, and then no
  ``state_class`` and no ``unit_of_measurement``. ``expire_after``: ``cv.positive_int``.
- ``components/mqtt/config.py`` MQTT_RO_SCHEMA: ``state_topic`` required.
- ``components/sensor/const.py``: DEVICE_CLASS_STATE_CLASSES (monetary: only total; enum: none;
  duration: any) and NON_NUMERIC_DEVICE_CLASSES (no unit, no state class).
- ``components/binary_sensor/__init__.py``: BinarySensorDeviceClass.
- ``components/mqtt/event.py``: ``event_types`` required (a list of strings), ``device_class``
  one of button/doorbell/motion, no ``expire_after``; a retained message is ignored.

Both releases' sources were read from the published wheels (homeassistant-2024.3.3 and
homeassistant-2026.2.3 on PyPI, the same files as the tags 2024.3.3 and 2026.2.3).

What changed between the two releases and matters here: the MQTT sensor's ``options`` (for an
``enum`` sensor) is not in 2024.3's schema, so 2024.3 drops it and shows Status as text;
``default_entity_id`` (2025.10, replacing the deprecated ``object_id``) is not in 2024.3 either
(dropped: the platform schemas are REMOVE_EXTRA). The device schema is *not* REMOVE_EXTRA
(2024.3.3 ``mqtt/mixins.py`` MQTT_ENTITY_DEVICE_INFO_SCHEMA, a plain ``vol.Schema``): a device
key it does not know, ``model_id`` (2026.2.3 ``mqtt/schemas.py`` has it), makes it refuse the
whole config: "extra keys not allowed @ data['device']['model_id']", no device, no entity.
``mqtt/sensor.py`` ``_update_state``: 2026.2.3 takes the payload "None" as no value before it
parses a timestamp; 2024.3.3 parses it and logs "Invalid state message" at every report;
``measurement_angle`` (2025.2) is a state class only in 2026.2; device-based discovery
(``<prefix>/device/<id>/config`` with ``cmps``, 2024.11) does not exist in 2024.3, so a unit
that must work with both announces one config topic per entity.
"""

from __future__ import annotations

import re
from typing import Any

AVAILABILITY_KEYS = {
    "availability", "availability_mode", "availability_template", "availability_topic",
    "payload_available", "payload_not_available",
}
COMMON_KEYS = AVAILABILITY_KEYS | {
    "device", "origin", "enabled_by_default", "entity_category", "entity_picture", "icon",
    "json_attributes_topic", "json_attributes_template", "object_id", "unique_id", "name",
    "encoding", "qos",
}
RO_KEYS = {"state_topic", "value_template"}
SENSOR_KEYS_2024_3 = {
    "device_class", "expire_after", "force_update", "last_reset_value_template",
    "suggested_display_precision", "state_class", "unit_of_measurement",
}
EVENT_KEYS = {"device_class", "event_types"}
EVENT_DEVICE_CLASSES = {"button", "doorbell", "motion"}
BINARY_SENSOR_KEYS = {
    "device_class", "expire_after", "force_update", "off_delay", "payload_off", "payload_on",
}
# mqtt/button.py PLATFORM_SCHEMA_MODERN (both releases): no state topic; button/__init__.py
BUTTON_KEYS = {"command_template", "command_topic", "device_class", "payload_press", "retain"}
BUTTON_DEVICE_CLASSES = {"identify", "restart", "update"}
# mqtt/update.py PLATFORM_SCHEMA_MODERN (MQTT_RO_SCHEMA: state_topic required); 2026.2.3 adds
# display_precision; update/__init__.py UpdateDeviceClass
UPDATE_KEYS = {
    "command_topic", "device_class", "entity_picture", "latest_version_template",
    "latest_version_topic", "payload_install", "release_summary", "release_url", "retain",
    "title",
}
UPDATE_DEVICE_CLASSES = {"firmware"}
DEVICE_KEYS = {
    "identifiers", "connections", "manufacturer", "model", "name", "hw_version",
    "serial_number", "sw_version", "via_device", "suggested_area", "configuration_url",
}
ORIGIN_KEYS = {"name", "sw_version", "support_url"}
# keys a later release knows and 2024.3 drops silently (and harmlessly: nothing depends on them)
NEWER_KEYS = {"options", "default_entity_id"}

# the abbreviations this project could meet (abbreviations.py has them all)
ABBREVIATIONS = {
    "avty": "availability", "avty_mode": "availability_mode",
    "avty_t": "availability_topic", "avty_tpl": "availability_template", "dev": "device",
    "dev_cla": "device_class", "e": "encoding", "en": "enabled_by_default",
    "ent_cat": "entity_category", "ent_pic": "entity_picture", "exp_aft": "expire_after",
    "frc_upd": "force_update", "ic": "icon", "json_attr_t": "json_attributes_topic",
    "json_attr_tpl": "json_attributes_template", "lrst_val_tpl": "last_reset_value_template",
    "o": "origin", "obj_id": "object_id", "def_ent_id": "default_entity_id",
    "evt_typ": "event_types", "off_dly": "off_delay", "ops": "options",
    "pl_avail": "payload_available", "pl_not_avail": "payload_not_available",
    "pl_off": "payload_off", "pl_on": "payload_on", "stat_cla": "state_class",
    "stat_t": "state_topic", "sug_dsp_prc": "suggested_display_precision",
    "uniq_id": "unique_id", "unit_of_meas": "unit_of_measurement", "val_tpl": "value_template",
}
DEVICE_ABBREVIATIONS = {
    "cns": "connections", "cu": "configuration_url", "ids": "identifiers", "mf": "manufacturer",
    "mdl": "model", "sw": "sw_version", "hw": "hw_version", "sa": "suggested_area",
    "sn": "serial_number",
}
ORIGIN_ABBREVIATIONS = {"sw": "sw_version", "url": "support_url"}

SENSOR_DEVICE_CLASSES = {
    "apparent_power", "aqi", "atmospheric_pressure", "battery", "carbon_dioxide",
    "carbon_monoxide", "current", "data_rate", "data_size", "date", "distance", "duration",
    "energy", "energy_storage", "enum", "frequency", "gas", "humidity", "illuminance",
    "irradiance", "moisture", "monetary", "nitrogen_dioxide", "nitrogen_monoxide",
    "nitrous_oxide", "ozone", "ph", "pm1", "pm10", "pm25", "power_factor", "power",
    "precipitation", "precipitation_intensity", "pressure", "reactive_power",
    "signal_strength", "sound_pressure", "speed", "sulphur_dioxide", "temperature",
    "timestamp", "volatile_organic_compounds", "volatile_organic_compounds_parts", "voltage",
    "volume", "volume_flow_rate", "volume_storage", "water", "weight", "wind_speed",
}
BINARY_SENSOR_DEVICE_CLASSES = {
    "battery", "battery_charging", "carbon_monoxide", "cold", "connectivity", "door",
    "garage_door", "gas", "heat", "light", "lock", "moisture", "motion", "moving", "occupancy",
    "opening", "plug", "power", "presence", "problem", "running", "safety", "smoke", "sound",
    "tamper", "update", "vibration", "window",
}
ALL_STATE_CLASSES = {"measurement", "total", "total_increasing"}
# sensor/const.py DEVICE_CLASS_STATE_CLASSES, for the classes a kiosk could use
DEVICE_CLASS_STATE_CLASSES = {
    "monetary": {"total"},
    "enum": set(),
    "timestamp": set(),
    "date": set(),
    "duration": ALL_STATE_CLASSES,
    "data_size": ALL_STATE_CLASSES,
    "energy": {"total", "total_increasing"},
}
NON_NUMERIC_DEVICE_CLASSES = {"date", "enum", "timestamp"}
ENTITY_CATEGORIES = {"config", "diagnostic"}

VERSIONS: dict[str, dict[str, Any]] = {
    "2024.3": {
        "state_classes": ALL_STATE_CLASSES,
        "sensor_device_classes": SENSOR_DEVICE_CLASSES,
        "device_keys": DEVICE_KEYS,
        "common_keys": COMMON_KEYS,
        "sensor_keys": SENSOR_KEYS_2024_3,
        "none_timestamp": False,  # "None" on a timestamp sensor: "Invalid state message"
    },
    "2026.2": {
        "state_classes": ALL_STATE_CLASSES | {"measurement_angle"},
        "sensor_device_classes": SENSOR_DEVICE_CLASSES | {
            "area", "blood_glucose_concentration", "conductivity", "energy_distance",
            "wind_direction",
        },
        "device_keys": DEVICE_KEYS | {"model_id"},
        "common_keys": COMMON_KEYS | {"default_entity_id"},
        "sensor_keys": SENSOR_KEYS_2024_3 | {"options"},
        "none_timestamp": True,
    },
}

# discovery.py TOPIC_MATCHER: <prefix>/<component>/[<node_id>/]<object_id>/config
DISCOVERY_TOPIC = re.compile(
    r"^[^/]+/(?P<component>\w+)/(?:[a-zA-Z0-9_-]+/)?[a-zA-Z0-9_-]+/config$"
)


def release(version: str) -> tuple[int, int]:
    year, month = version.split(".")[:2]
    return int(year), int(month)


def _expand(config: dict[str, Any], table: dict[str, str]) -> dict[str, Any]:
    return {table.get(key, key): value for key, value in config.items()}


def dropped(topic: str, payload: dict[str, Any], version: str) -> list[str]:
    """The keys of a later release that ``version`` drops silently (``options``)."""
    config = _expand(payload, ABBREVIATIONS)
    known = _known_keys(DISCOVERY_TOPIC.match(topic)["component"], VERSIONS[version])  # type: ignore[index]
    return sorted(k for k in set(config) - known if k in NEWER_KEYS)


def _known_keys(component: str, rules: dict[str, Any]) -> set[str]:
    known = rules["common_keys"] | RO_KEYS
    own = {"sensor": rules["sensor_keys"], "binary_sensor": BINARY_SENSOR_KEYS,
           "event": EVENT_KEYS, "button": BUTTON_KEYS, "update": UPDATE_KEYS}
    if component == "button":  # no state topic, no value template
        return set(rules["common_keys"] | BUTTON_KEYS)
    return set(known | own.get(component, set()))


def violations(topic: str, payload: dict[str, Any], version: str) -> list[str]:
    """What Home Assistant ``version`` would refuse, warn about or silently drop by mistake;
    empty: fine. The keys of a later release that it drops are listed by ``dropped``."""
    rules = VERSIONS[version]
    match = DISCOVERY_TOPIC.match(topic)
    if match is None:
        return [f"{topic}: not a discovery config topic"]
    component = match["component"]
    config = _expand(payload, ABBREVIATIONS)
    found: list[str] = []
    known = _known_keys(component, rules) | NEWER_KEYS
    found += [f"unknown key {k!r} (HA drops it silently)" for k in sorted(set(config) - known)]
    if "state_topic" not in config and component != "button":
        found.append("state_topic is required")
    if component == "button" and "command_topic" not in config:
        found.append("command_topic is required")
    if "unique_id" not in config:
        found.append("unique_id is needed for the entity to be managed and grouped")
    device = _expand(config.get("device", {}), DEVICE_ABBREVIATIONS)
    found += [f"extra keys not allowed @ data['device'][{k!r}] (HA refuses the config)"
              for k in sorted(set(device) - rules["device_keys"])]
    for kind, value in device.get("connections", []):
        if kind == "mac" and not re.fullmatch(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", value):
            found.append(f"device mac connection {value!r} is not as HA writes a MAC")
    if not device.get("identifiers") and not device.get("connections"):
        found.append("device needs identifiers or connections")
    url = device.get("configuration_url")
    if url is not None and not re.match(r"^(https?://|homeassistant://)\S+$", url):
        found.append(f"device configuration_url {url!r} is not a URL HA accepts")
    if "origin" in config:
        origin = _expand(config["origin"], ORIGIN_ABBREVIATIONS)
        found += [f"unknown origin key {k!r}" for k in sorted(set(origin) - ORIGIN_KEYS)]
        if not origin.get("name"):
            found.append("origin needs a name")
    else:
        found.append("origin (o) is missing (device-based discovery requires it)")
    expire = config.get("expire_after")
    if expire is not None and (not isinstance(expire, int) or isinstance(expire, bool)
                               or expire < 0):
        found.append(f"expire_after {expire!r} is not a positive integer")
    entity_id = config.get("default_entity_id")
    if entity_id is not None and not re.fullmatch(rf"{component}\.[a-z0-9_]+", entity_id):
        found.append(f"default_entity_id {entity_id!r} is not a {component} entity id")
    category = config.get("entity_category")
    if category is not None and category not in ENTITY_CATEGORIES:
        found.append(f"entity_category {category!r}")
    device_class = config.get("device_class")
    if component == "event":
        types = config.get("event_types")
        if not types or not all(isinstance(t, str) for t in types):
            found.append("event_types must be a list of strings")
        if device_class is not None and device_class not in EVENT_DEVICE_CLASSES:
            found.append(f"event device_class {device_class!r}")
        return found
    if component == "button":
        if device_class is not None and device_class not in BUTTON_DEVICE_CLASSES:
            found.append(f"button device_class {device_class!r}")
        return found
    if component == "update":
        if device_class is not None and device_class not in UPDATE_DEVICE_CLASSES:
            found.append(f"update device_class {device_class!r}")
        return found
    if component == "binary_sensor":
        if device_class is not None and device_class not in BINARY_SENSOR_DEVICE_CLASSES:
            found.append(f"binary_sensor device_class {device_class!r}")
        return found
    state_class = config.get("state_class")
    if device_class is not None and device_class not in rules["sensor_device_classes"]:
        found.append(f"sensor device_class {device_class!r}")
    if state_class is not None and state_class not in rules["state_classes"]:
        found.append(f"state_class {state_class!r}")
    allowed = DEVICE_CLASS_STATE_CLASSES.get(device_class or "", rules["state_classes"])
    if state_class is not None and state_class not in allowed:
        found.append(f"state_class {state_class!r} is impossible with device_class "
                     f"{device_class!r}")
    if "last_reset_value_template" in config and state_class != "total":
        found.append(f"last_reset_value_template with state_class {state_class!r}")
    if (device_class == "timestamp" and not rules["none_timestamp"]
            and "'None'" in config.get("value_template", "")):
        found.append("a timestamp sensor's template renders 'None': Invalid state message")
    if device_class in NON_NUMERIC_DEVICE_CLASSES and (
        state_class or config.get("unit_of_measurement")
    ):
        found.append(f"{device_class} sensors take no state_class and no unit")
    options = config.get("options")
    if options is not None:
        if not options:
            found.append("an empty options list")
        if device_class != "enum":
            found.append("options need device_class enum")
    elif device_class == "enum":
        found.append("an enum sensor without options accepts any state")
    if device_class == "monetary" and not re.fullmatch(r"[A-Z]{3}",
                                                       config.get("unit_of_measurement", "")):
        found.append("monetary needs an ISO 4217 currency as its unit")
    return found


def template_paths(template: str) -> list[list[str]]:
    """The ``value_json.a.b`` (or ``value_json.a['k'].b``) paths a template reads, to check
    them against a real report."""
    paths = []
    for path in re.findall(r"value_json((?:\.\w+|\['[^']+'\])+)", template):
        paths.append([a or b for a, b in re.findall(r"\.(\w+)|\['([^']+)'\]", path)])
    return paths


def slug_2024_3(device_name: str, entity_name: str) -> str:
    """The object id HA derives for an entity with ``has_entity_name`` (util.slugify of
    "<device name> <entity name>"), for plain ASCII names."""
    return re.sub(r"[^a-z0-9]+", "_", f"{device_name} {entity_name}".lower()).strip("_")
