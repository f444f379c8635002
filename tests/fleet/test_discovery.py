"""Home Assistant discovery: one device, its entities, each config checked against the rules of
the HA releases units run (2024.3 and 2026.2), and what each of them drops."""

import ast
import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.fleet import entities
from kiosk_agent.fleet.discovery import discovery_messages
from kiosk_agent.fleet.entities import EVENT_TYPES, DiscoveryOptions
from kiosk_agent.fleet.report import build_report

from . import home_assistant_rules as ha
from .helpers import settled_agent

STATE = "kiosk-agent/unit-1/state"
AVAILABILITY = "kiosk-agent/unit-1/availability"
FULL = {
    "expire_after": 198,
    "configuration_url": "http://kiosk-7:8124/",
    "currency": "EUR",
    "suggested_area": "Lobby",
    "serial_number": "PI-00042",
    "model_id": "vm-mdb",
    "model": "Coffee machine",
    "hw_version": "Raspberry Pi 4 Model B Rev 1.4",
    "mac": "dc:a6:32:01:02:03",
    "terminals": (("SIM-0001", "front"), ("SIM-0002", "")),
    "commands": True,
}


def _messages(device_id: str = "unit-1", **options: Any) -> list[tuple[str, dict[str, Any]]]:
    return discovery_messages(
        device_id, "1.2.3", STATE, AVAILABILITY, "homeassistant", DiscoveryOptions(**options)
    )


def _discovery(**options: Any) -> dict[str, dict[str, Any]]:
    return {topic.split("/")[-2]: config for topic, config in _messages(**options)}


def test_discovery_describes_one_device_with_its_entities() -> None:
    messages = discovery_messages("unit-1", "1.0", "k/unit-1/state", "k/unit-1/availability", "ha")
    topics = [topic for topic, _ in messages]
    assert len(topics) == 19
    assert "ha/binary_sensor/unit-1/problem/config" in topics
    assert "ha/sensor/unit-1/sales_today_amount/config" in topics
    # what others gave back later of the day's sales, beside the day's takings
    assert "ha/sensor/unit-1/given_back_today_amount/config" in topics
    assert "ha/sensor/unit-1/given_back_today/config" in topics
    assert "ha/event/unit-1/alert/config" in topics
    assert "ha/sensor/unit-1/uptime/config" not in topics  # retired: "Started at" instead
    identifiers = {json.dumps(config["device"]["identifiers"]) for _, config in messages}
    assert identifiers == {'["kiosk_agent_unit-1"]'}
    assert all(config["availability_topic"] == "k/unit-1/availability" for _, config in messages)
    assert discovery_messages("unit-1", "1.0", "s", "a", False) == []


@pytest.mark.parametrize(
    ("running", "version"),
    [(None, "2024.3"), (None, "2026.2"), ("2024.3", "2024.3"), ("2024.3", "2026.2"),
     ("2026.2", "2026.2")],
)
def test_discovery_follows_home_assistants_rules(running: str | None, version: str) -> None:
    """Every optional field set, for a Home Assistant the operator names (or none): each config
    is one that release takes whole, no key refused, none dropped, no value it warns of. A
    release newer than the one named (2026.2 given 2024.3's configs) takes them too."""
    for topic, config in _messages(**FULL, home_assistant=running or "2024.3"):
        assert ha.violations(topic, config, version) == [], topic
        if running == version:
            assert ha.dropped(topic, config, version) == [], topic


def test_the_configs_for_a_newer_home_assistant_are_what_2024_3_refuses() -> None:
    """The issue's findings on 2024.3, caught by its rules: the model id makes it refuse the
    whole config (no device, no entity), the expiry's 'None' a warning at every report."""
    found = {topic.split("/")[-2]: ha.violations(topic, config, "2024.3")
             for topic, config in _messages(**FULL, home_assistant="2026.2")}
    refused = "extra keys not allowed @ data['device']['model_id'] (HA refuses the config)"
    assert all(refused in problems for problems in found.values())
    assert "a timestamp sensor's template renders 'None': Invalid state message" in (
        found["api_key_expires"])


@pytest.mark.parametrize(
    ("running", "rules"),
    [(None, "2024.3"), ("2024.3", "2024.3"), ("2025.12", "2024.3"), ("2026.2", "2026.2"),
     ("2027.1", "2026.2")],
)
def test_which_home_assistant_gets_what(running: str | None, rules: str) -> None:
    """The newest rules checked that are not newer than the release named; unnamed: 2024.3's.
    2026.2 gets the model id, the Status options (an enum) and the default entity ids; 2024.3
    gets Status as text, the ids it derives itself from the names, the expiry as text that
    says "unknown" when there is none (its timestamp sensor warns of any other word)."""
    options = {**FULL, **({"home_assistant": running} if running else {})}
    configs = {topic.split("/")[-2]: config for topic, config in _messages(**options)}
    newest = rules == "2026.2"
    assert ("model_id" in configs["status"]["device"]) is newest
    assert ("options" in configs["status"]) is newest
    assert all(("default_entity_id" in c) is newest for c in configs.values())
    expiry = configs["api_key_expires"]
    if newest:
        assert expiry["device_class"] == "timestamp"
        assert expiry["value_template"].endswith("or 'None' }}")
    else:
        assert "device_class" not in expiry
        assert "device_class" not in configs["status"]
        assert expiry["value_template"] == "{{ value_json.service.key_expires or 'unknown' }}"


def test_names_follow_has_entity_name_and_entity_ids_are_stable() -> None:
    """The entity's name is its own part; 2024.3 makes `<domain>.<device>_<name>` of them, and
    2026.2 is told the same id, so both releases give `sensor.kiosk_a1_status`, not the
    `sensor.kiosk_kiosk_a1_status` a device called "Kiosk kiosk-a1" gave."""
    configs = {topic: config for topic, config in _messages("kiosk-a1", home_assistant="2026.2")}
    status = configs["homeassistant/sensor/kiosk-a1/status/config"]
    assert (status["device"]["name"], status["name"]) == ("kiosk-a1", "Status")
    assert status["default_entity_id"] == "sensor.kiosk_a1_status"
    for config in configs.values():
        derived = ha.slug_2024_3(config["device"]["name"], config["name"])
        assert config["default_entity_id"].split(".", 1)[1] == derived
        assert config["unique_id"].startswith("kiosk_agent_kiosk-a1_")  # history kept
    named = _discovery(name="Lobby kiosk", home_assistant="2026.2")["status"]
    assert named["default_entity_id"] == "sensor.lobby_kiosk_status"


@pytest.mark.parametrize(
    ("name", "entity_id"),
    [
        ("Café Nord", "sensor.cafe_nord_status"),  # as HA's slugify: accents dropped
        ("Kiosk Straße 5", "sensor.kiosk_strasse_5_status"),
        ("Киоск 7", "sensor.unit_1_status"),  # no Latin spelling: the device id, never
        ("販売機", "sensor.unit_1_status"),  # a bare `sensor.status` shared by every unit
    ],
)
def test_a_name_in_another_script_gives_an_entity_id_of_its_own(name: str, entity_id: str) -> None:
    """Before: the entity id dropped every letter outside ASCII, so "Café Nord" gave
    `sensor.caf_nord_status` (HA's own slugify: `cafe_nord`), and a name in Cyrillic or
    Japanese gave `sensor.status`, `sensor.problem`...: the same ids for every such unit."""
    status = _discovery(name=name, home_assistant="2026.2")["status"]
    assert status["default_entity_id"] == entity_id


def test_what_a_home_assistant_user_expects() -> None:
    configs = _discovery(**FULL, home_assistant="2026.2")
    # per terminal: connectivity and card payments, named after the terminal
    assert configs["terminal_sim_0001"]["name"] == "Terminal front"
    assert configs["terminal_sim_0001"]["device_class"] == "connectivity"
    assert configs["card_payments_sim_0002"]["name"] == "Card payments SIM-0002"
    assert configs["card_payments_sim_0002"]["device_class"] == "running"
    assert configs["journal_problem"]["device_class"] == "problem"  # on: takes no writes
    assert configs["status"]["device_class"] == "enum"
    # alerts a person must act on, as an event entity on its own (not retained) topic
    alert = configs["alert"]
    assert alert["event_types"] == EVENT_TYPES
    assert alert["state_topic"] == "kiosk-agent/unit-1/event"
    assert "expire_after" not in alert
    # icons, units on counts, display precision on amounts
    assert all(c.get("icon", "mdi:").startswith("mdi:") for c in configs.values())
    assert configs["sales_today"]["unit_of_measurement"] == "sales"
    assert configs["terminals_online"]["unit_of_measurement"] == "terminals"
    assert configs["sales_today_amount"]["suggested_display_precision"] == 2
    # timestamps instead of an uptime that changes every heartbeat
    for key in ("started_at", "last_heartbeat", "api_key_expires"):
        assert configs[key]["device_class"] == "timestamp"
    assert configs["service"]["device_class"] == "connectivity"
    assert configs["version"]["value_template"] == "{{ value_json.version }}"
    # diagnostics marked so, the noisy one off by default
    diagnostic = {k for k, c in configs.items() if c.get("entity_category") == "diagnostic"}
    assert diagnostic == {"journal_problem", "started_at", "last_heartbeat", "api_key_expires",
                          "version"}
    assert [k for k, c in configs.items() if c.get("enabled_by_default") is False] == [
        "started_at", "last_heartbeat", "version"
    ]
    # device info and origin: the model is the unit's, the manufacturer the project
    device = configs["status"]["device"]
    assert (device["serial_number"], device["model_id"], device["suggested_area"]) == (
        "PI-00042", "vm-mdb", "Lobby"
    )
    assert (device["manufacturer"], device["model"]) == ("kiosk-agent", "Coffee machine")
    assert device["hw_version"] == "Raspberry Pi 4 Model B Rev 1.4"
    assert device["connections"] == [["mac", "dc:a6:32:01:02:03"]]
    plain = _discovery()["status"]["device"]
    assert plain["model"] == "card payment kiosk"
    assert "connections" not in plain
    assert "hw_version" not in plain
    assert configs["status"]["origin"] == {
        "name": "kiosk-agent", "sw_version": "1.2.3", "support_url": "http://kiosk-7:8124/"
    }
    assert _discovery(support_url="https://help.example/")["status"]["origin"]["support_url"] == (
        "https://help.example/"
    )


def test_the_rules_catch_what_home_assistant_would_not_take() -> None:
    """The checker itself: each of the issue's findings is caught."""
    config = _discovery()["sales_today"]
    topic = "homeassistant/sensor/u/sales_today/config"
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
    status = {k: v for k, v in _discovery(home_assistant="2026.2")["status"].items()
              if k not in ("options", "origin")}
    assert ha.violations("homeassistant/sensor/u/status/config", status, "2024.3") == [
        "origin (o) is missing (device-based discovery requires it)",
        "an enum sensor without options accepts any state",
    ]
    typo = {**status, "origin": {"name": "k"}, "typo": 1}
    assert ha.violations("homeassistant/sensor/u/x/config", typo, "2024.3")[0] == (
        "unknown key 'typo' (HA drops it silently)"
    )
    started = _discovery()["started_at"]
    assert ha.violations("homeassistant/sensor/u/s/config", {**started, "unit_of_measurement": "s"},
                         "2026.2") == ["timestamp sensors take no state_class and no unit"]
    alert = _discovery()["alert"]
    assert ha.violations("homeassistant/event/u/alert/config", {**alert, "expire_after": 9},
                         "2026.2") == ["unknown key 'expire_after' (HA drops it silently)"]
    abbreviated = {"stat_t": "s", "uniq_id": "u", "dev": {"ids": ["x"]}, "o": {"name": "k"},
                   "stat_cla": "total_increasing", "exp_aft": 180}
    assert ha.violations("homeassistant/sensor/u/x/config", abbreviated, "2024.3") == []
    with_model_id = {**abbreviated, "dev": {"ids": ["x"], "model_id": "k1"}}
    assert ha.violations("homeassistant/sensor/u/x/config", with_model_id, "2024.3") == [
        "extra keys not allowed @ data['device']['model_id'] (HA refuses the config)"
    ]
    assert ha.violations("homeassistant/sensor/u/x/config", with_model_id, "2026.2") == []
    with_options = {**abbreviated, "ops": ["a"], "dev_cla": "enum", "stat_cla": None}
    assert ha.dropped("homeassistant/sensor/u/x/config", with_options, "2024.3") == ["options"]


def test_every_template_reads_fields_the_report_has() -> None:
    agent = settled_agent()
    agent.health.report_key_expiry(4102444800.0)
    report = build_report("unit-1", agent.health.snapshot(), 60.0)
    for key, config in _discovery(terminals=(("SIM-0001", "front"),),
                                  home_assistant="2026.2").items():
        for name in ("value_template", "last_reset_value_template", "json_attributes_template"):
            for path in ha.template_paths(config.get(name, "")):
                value: Any = report
                for part in path:
                    assert isinstance(value, dict), (key, name, path)
                    assert part in value, (key, name, path)
                    value = value[part]
    assert report["status"] in _discovery(home_assistant="2026.2")["status"]["options"]
    # the daily amount's last reset: the UTC midnight the day began (one rule of days), in ISO
    # 8601 UTC as every time in the report
    assert report["sales"]["day_started"].endswith("T00:00:00Z")
    for stamp in (report["started"], report["reported"], report["service"]["key_expires"]):
        assert stamp.endswith("Z")
        assert dt.datetime.fromisoformat(stamp).utcoffset() == dt.timedelta(0)
    assert report["terminal_states"] == {"SIM-0001": {
        "online": True, "available": None, "takes_cards": None, "reason": "", "until": None}}


def test_terminals_whose_ids_slug_alike_keep_an_entity_each() -> None:
    """Before: SIM-0001 and sim_0001 both made `terminal_sim_0001` (one topic, one unique id:
    the second overwrote the first in HA), and an id of no ASCII letters made `terminal_`."""
    messages = _messages(terminals=(("SIM-0001", "a"), ("sim_0001", "b"), ("ÄÖ", "c"),
                                    ("ÜÜ", "d")))
    topics = [topic for topic, _ in messages]
    unique_ids = [config["unique_id"] for _, config in messages]
    assert len(set(topics)) == len(topics) == len(set(unique_ids))
    configs = {topic.split("/")[-2]: config for topic, config in messages}
    assert configs["terminal_sim_0001"]["name"] == "Terminal a"  # the first keeps its id
    [second] = [k for k in configs if k.startswith("terminal_sim_0001_")]
    assert configs[second]["name"] == "Terminal b"
    assert "terminal_" not in configs


def test_commands_are_buttons_and_an_update_on_the_units_own_topics() -> None:
    """Like an ESPHome device, when upstream.commands is on: restart, ping and test print each
    reader, the installed and newest version; none without it."""
    assert not {k for k in _discovery() if k.startswith(("restart", "ping_", "test_print_"))}
    configs = _discovery(**FULL)
    restart = configs["restart"]
    assert restart["command_topic"] == "kiosk-agent/unit-1/command/restart"
    assert restart["device_class"] == "restart"
    assert "state_topic" not in restart
    assert "expire_after" not in restart
    assert configs["ping_sim_0001"]["name"] == "Ping front"
    assert configs["test_print_sim_0002"]["command_topic"] == (
        "kiosk-agent/unit-1/command/test_print_sim_0002")
    update = configs["update"]
    assert update["latest_version_topic"] == "kiosk-agent/latest_version"
    assert update["value_template"] == "{{ value_json.version }}"
    assert update["device_class"] == "firmware"


def test_the_entities_are_data_described_once_at_module_level() -> None:
    """Home Assistant's EntityDescription style: every description is a frozen instance made
    when fleet/entities.py is imported, and that module imports nothing of the fleet (the
    commands read their keys from it; before, it imported fleet/commands.py back inside a
    function, a circle)."""
    source = Path(entities.__file__).read_text()
    imported = [
        node.module for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module
    ] + [
        alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import)
        for alias in node.names
    ]
    assert not [name for name in imported if name.startswith("kiosk_agent")]
    descriptions = [*entities.UNIT_ENTITIES, *entities.AUDIT_ENTITIES, *entities.UNIT_COMMANDS,
                    *entities.TERMINAL_ENTITIES, *entities.TERMINAL_COMMANDS]
    for description in descriptions:
        with pytest.raises(dataclasses.FrozenInstanceError):
            description.component = "switch"  # type: ignore[misc]
    options = DiscoveryOptions(terminals=(("SIM-0001", "front"),), commands=True)
    built = entities.unit_entities(options)
    # what is not per terminal is the module's own instance, not one built per call
    assert all(b is d for b, d in zip(built, entities.UNIT_ENTITIES, strict=False)
               if not d.currency)  # the currency's is filled in from the configuration
    assert all(any(e is d for e in built) for d in entities.UNIT_COMMANDS)
    assert [e.key for e in built[-2:]] == ["ping_sim_0001", "test_print_sim_0001"]
