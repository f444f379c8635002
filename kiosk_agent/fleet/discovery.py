"""Home Assistant MQTT discovery: the config message of each entity in ``entities``."""

from __future__ import annotations

from typing import Any

from kiosk_agent.fleet.entities import DISCOVERY_ENTITIES, ORIGIN, STATUS_OPTIONS, DiscoveryOptions
from kiosk_agent.fleet.topics import OFFLINE, ONLINE, discovery_topic


def discovery_messages(
    device_id: str,
    version: str,
    state_topic: str,
    availability_topic: str,
    prefix: str | bool,
    options: DiscoveryOptions | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """Home Assistant MQTT discovery: one device, seven sensors and a Problem binary sensor.

    Full key names (HA takes them and its abbreviations alike). HA's rules kept, from its
    ``mqtt/sensor.py`` and ``sensor/const.py``: ``last_reset_value_template`` only with
    ``state_class: total``; ``options`` only with ``device_class: enum``, and then neither a
    state class nor a unit; ``monetary`` only with ``state_class: total``; ``expire_after`` a
    positive integer; origin needs a ``name``.
    """
    if not prefix:
        return []
    options = options or DiscoveryOptions()
    device: dict[str, Any] = {
        "identifiers": [f"kiosk_agent_{device_id}"],
        "name": f"Kiosk {device_id}",
        "manufacturer": "kiosk-agent",
        "model": "kiosk-agent",
        "sw_version": version,
    }
    if options.configuration_url:
        device["configuration_url"] = options.configuration_url
    common: dict[str, Any] = {
        "state_topic": state_topic,
        "availability_topic": availability_topic,
        "payload_available": ONLINE,
        "payload_not_available": OFFLINE,
        "device": device,
        "origin": {**ORIGIN, "sw_version": version},
    }
    if options.expire_after:
        common["expire_after"] = options.expire_after
    configs: dict[str, dict[str, Any]] = {
        "status": {
            "name": "Status",
            "value_template": "{{ value_json.status }}",
            "device_class": "enum",
            "options": STATUS_OPTIONS,
        },
        "uptime": {
            "name": "Uptime",
            "value_template": "{{ value_json.uptime_s | int }}",
            "unit_of_measurement": "s",
            "device_class": "duration",
            "entity_category": "diagnostic",
        },
        "terminals_online": {
            "name": "Terminals online",
            "value_template": "{{ value_json.terminals_online }}",
            "state_class": "measurement",
        },
        "sales_today": {
            # drops to 0 at local midnight: a meter reset for total_increasing, never a negative
            "name": "Sales today",
            "value_template": "{{ value_json.sales.today_count }}",
            "state_class": "total_increasing",
        },
        "sales_today_amount": {
            # cents on the wire (exact), currency units for people; monetary takes only
            # state_class total, so the midnight reset is told by last_reset
            "name": "Sales today amount",
            "value_template": "{{ (value_json.sales.today_amount_cents / 100) | round(2) }}",
            "unit_of_measurement": options.currency,
            "device_class": "monetary",
            "state_class": "total",
            "last_reset_value_template": "{{ value_json.sales.day_started }}",
        },
        "open_sales": {
            "name": "Open sales",
            "value_template": "{{ value_json.sales.open }}",
            "state_class": "measurement",
        },
        "attention_sales": {
            "name": "Sales needing attention",
            "value_template": "{{ value_json.sales.attention }}",
            "state_class": "measurement",
        },
        "problem": {
            "name": "Problem",
            "device_class": "problem",
            "value_template": "{{ 'OFF' if value_json.status == 'ok' else 'ON' }}",
            # the problems themselves, as the Problem sensor's attributes
            "json_attributes_topic": state_topic,
            "json_attributes_template": (
                "{{ {'problems': value_json.problems, "
                "'out_of_service': value_json.out_of_service | default([])} | tojson }}"
            ),
        },
    }
    messages: list[tuple[str, dict[str, Any]]] = []
    for component, key in DISCOVERY_ENTITIES:
        config = {**configs[key], "unique_id": f"kiosk_agent_{device_id}_{key}", **common}
        messages.append((discovery_topic(str(prefix), component, device_id, key), config))
    return messages

