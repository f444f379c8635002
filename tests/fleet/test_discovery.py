"""Home Assistant discovery: one device, its entities, each config checked against the rules of
the HA releases units run."""

import datetime as dt
import json
from typing import Any

import pytest

from kiosk_agent.fleet.discovery import discovery_messages
from kiosk_agent.fleet.entities import DiscoveryOptions
from kiosk_agent.fleet.report import build_report

from . import home_assistant_rules as ha
from .helpers import settled_agent


def test_discovery_describes_one_device_with_sensors_and_status() -> None:
    messages = discovery_messages("unit-1", "1.0", "k/unit-1/state", "k/unit-1/availability", "ha")
    topics = [topic for topic, _ in messages]
    assert len(topics) == 8
    assert "ha/binary_sensor/unit-1/problem/config" in topics
    assert "ha/sensor/unit-1/sales_today_amount/config" in topics
    identifiers = {json.dumps(config["device"]["identifiers"]) for _, config in messages}
    assert identifiers == {'["kiosk_agent_unit-1"]'}
    assert all(config["availability_topic"] == "k/unit-1/availability" for _, config in messages)
    assert discovery_messages("unit-1", "1.0", "s", "a", False) == []


def _discovery(**options: Any) -> dict[str, dict[str, Any]]:
    messages = discovery_messages(
        "unit-1",
        "1.2.3",
        "kiosk-agent/unit-1/state",
        "kiosk-agent/unit-1/availability",
        "homeassistant",
        DiscoveryOptions(**options),
    )
    return {topic.split("/")[-2]: config for topic, config in messages}


@pytest.mark.parametrize("version", sorted(ha.VERSIONS))
def test_discovery_follows_home_assistants_rules(version: str) -> None:
    options = {"expire_after": 180, "configuration_url": "http://kiosk-7:8124/", "currency": "EUR"}
    messages = discovery_messages(
        "unit-1",
        "1.2.3",
        "kiosk-agent/unit-1/state",
        "kiosk-agent/unit-1/availability",
        "homeassistant",
        DiscoveryOptions(**options),
    )
    for topic, config in messages:
        assert ha.violations(topic, config, version) == [], topic


def test_the_rules_catch_what_home_assistant_would_not_take() -> None:
    """The checker itself: each of the issue's findings is caught."""
    [(topic, config)] = [
        m
        for m in discovery_messages("u", "1", "s", "a", "homeassistant")
        if m[0].endswith("/sales_today/config")
    ]
    assert ha.violations(topic, config, "2024.3") == []
    assert ha.violations(topic, {**config, "expire_after": 180.0}, "2024.3") == [
        "expire_after 180.0 is not a positive integer"
    ]
    amount = _discovery()["sales_today_amount"]
    wrong = {**amount, "state_class": "total_increasing"}
    assert ha.violations("homeassistant/sensor/u/a/config", wrong, "2026.2") == [
        "state_class 'total_increasing' is impossible with device_class 'monetary'",
        "last_reset_value_template with state_class 'total_increasing'",
    ]
    status = {k: v for k, v in _discovery()["status"].items() if k not in ("options", "origin")}
    assert ha.violations("homeassistant/sensor/u/status/config", status, "2024.3") == [
        "origin (o) is missing (device-based discovery requires it)",
        "an enum sensor without options accepts any state",
    ]
    assert (
        ha.violations(
            "homeassistant/sensor/u/x/config",
            {**status, "origin": {"name": "k"}, "typo": 1},
            "2024.3",
        )[0]
        == "unknown key 'typo' (HA drops it silently)"
    )
    abbreviated = {
        "stat_t": "s",
        "uniq_id": "u",
        "dev": {"ids": ["x"]},
        "o": {"name": "k"},
        "stat_cla": "total_increasing",
        "exp_aft": 180,
    }
    assert ha.violations("homeassistant/sensor/u/x/config", abbreviated, "2024.3") == []
    with_model_id = {**abbreviated, "dev": {"ids": ["x"], "model_id": "k1"}}
    assert ha.violations("homeassistant/sensor/u/x/config", with_model_id, "2024.3") == [
        "unknown device key 'model_id'"
    ]
    assert ha.violations("homeassistant/sensor/u/x/config", with_model_id, "2026.2") == []


def test_the_discovery_tells_what_the_issue_asked_for() -> None:
    configs = _discovery(expire_after=180, configuration_url="http://kiosk-7:8124/")
    assert configs["sales_today"]["state_class"] == "total_increasing"
    amount = configs["sales_today_amount"]
    assert (amount["device_class"], amount["state_class"]) == ("monetary", "total")
    assert amount["last_reset_value_template"] == "{{ value_json.sales.day_started }}"
    assert configs["status"]["device_class"] == "enum"
    assert configs["status"]["options"] == ["ok", "degraded", "down"]
    assert "json_attributes_topic" in configs["problem"]
    assert {c["expire_after"] for c in configs.values()} == {180}
    assert {c["origin"]["name"] for c in configs.values()} == {"kiosk-agent"}
    assert {c["device"]["configuration_url"] for c in configs.values()} == {"http://kiosk-7:8124/"}


def test_every_template_reads_fields_the_report_has() -> None:
    agent = settled_agent()
    report = build_report("unit-1", agent.health.snapshot())
    for key, config in _discovery().items():
        for name in ("value_template", "last_reset_value_template", "json_attributes_template"):
            for path in ha.template_paths(config.get(name, "")):
                value: Any = report
                for part in path:
                    assert isinstance(value, dict), (key, name, path)
                    assert part in value, (key, name, path)
                    value = value[part]
    assert report["status"] in _discovery()["status"]["options"]
    # the daily amount's last reset: local midnight, an ISO 8601 time with its offset
    day_started = dt.datetime.fromisoformat(report["sales"]["day_started"])
    assert day_started.utcoffset() is not None
    assert (day_started.hour, day_started.minute) == (0, 0)
