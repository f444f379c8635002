"""The machine's books in Home Assistant: columns low, a mismatch as a problem, the last audit."""

from __future__ import annotations

from typing import Any

import pytest

from kiosk_agent.fleet.discovery import discovery_messages
from kiosk_agent.fleet.entities import DiscoveryOptions
from kiosk_agent.fleet.report import build_report
from kiosk_agent.health.model import AuditHealth

from . import home_assistant_rules as ha
from .helpers import settled_agent


def _discovery(audit: bool, home_assistant: str = "2026.2") -> dict[str, dict[str, Any]]:
    messages = discovery_messages("unit-1", "1.2.3", "k/unit-1/state", "k/unit-1/availability",
                                  "homeassistant",
                                  DiscoveryOptions(audit=audit, home_assistant=home_assistant))
    return {topic.split("/")[-2]: config for topic, config in messages}


def test_a_unit_reading_its_machines_books_announces_three_entities_more() -> None:
    added = _discovery(True).keys() - _discovery(False).keys()
    assert added == {"columns_low", "audit_mismatch", "last_audit"}
    assert _discovery(True)["audit_mismatch"]["device_class"] == "problem"
    assert _discovery(True)["last_audit"]["device_class"] == "timestamp"
    # HA 2024.3's timestamp sensor refuses 'None' on every report: a text sensor saying unknown
    older = _discovery(True, home_assistant="2024.3")["last_audit"]
    assert "device_class" not in older
    assert "'unknown'" in older["value_template"]


@pytest.mark.parametrize("version", sorted(ha.VERSIONS))
def test_they_follow_home_assistants_rules(version: str) -> None:
    messages = discovery_messages("unit-1", "1.2.3", "k/unit-1/state", "k/unit-1/availability",
                                  "homeassistant",
                                  DiscoveryOptions(audit=True, home_assistant=version))
    for topic, config in messages:
        assert ha.violations(topic, config, version) == [], topic


def test_their_templates_read_what_the_report_holds() -> None:
    agent = settled_agent()
    agent.health.report_audit(AuditHealth(
        machine="snacks", last_read_at=1_764_324_000.0, last_outcome="ok",
        mismatches=["the machine counted 2 card vends worth $3.00 since ..."],
        low=["A1"], sold_out=["B2"], not_compared="not compared at ...: another machine ...",
    ))
    report = build_report("unit-1", agent.health.snapshot(), 60.0)
    attributes = _discovery(True)["audit_mismatch"]["json_attributes_template"]
    assert "value_json.audit.not_compared" in attributes  # said beside the mismatch sensor
    assert report["audit"]["columns_low"] == 2
    assert report["audit"]["mismatch"] is True
    for key in ("columns_low", "audit_mismatch", "last_audit"):
        config = _discovery(True)[key]
        for name in ("value_template", "json_attributes_template"):
            for path in ha.template_paths(config.get(name, "")):
                value: Any = report
                for part in path:
                    assert part in value, (key, path)
                    value = value[part]
    assert build_report("unit-1", settled_agent().health.snapshot())["audit"] is None


def test_the_machines_books_reset_are_an_attribute_beside_the_mismatch_never_a_problem() -> None:
    from kiosk_agent.audit.reconcile import Side, compare
    from tests.audit.helpers import figures

    agent = settled_agent()
    reset = compare(Side(1_764_324_000.0, figures((40, 6000))),
                    Side(1_764_327_600.0, figures((1, 150))), [])
    agent.health.report_audit(AuditHealth(machine="snacks", books_reset=reset.text()))
    snapshot = agent.health.snapshot()
    report = build_report("unit-1", snapshot, 60.0)
    assert report["audit"]["books_reset"] == reset.text()
    assert report["audit"]["mismatch"] is False
    assert snapshot.problems == []
    assert report["problems"] == []
    attributes = _discovery(True)["audit_mismatch"]["json_attributes_template"]
    assert "'books_reset': value_json.audit.books_reset" in attributes
