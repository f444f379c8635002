"""The heartbeat body: what the health model holds, nothing secret, every field a template reads."""

import json

from kiosk_agent.fleet.report import build_report

from .helpers import settled_agent


def test_report_carries_health_and_nothing_secret() -> None:
    agent = settled_agent()
    agent.health.report_link("mdb:front", "connected")
    report = build_report("unit-1", agent.health.snapshot())
    assert report["device_id"] == "unit-1"
    assert report["status"] == "ok"
    assert report["terminals_online"] == 1
    assert report["links"][0]["name"] == "mdb:front"
    assert set(report) == {
        "device_id",
        "version",
        "status",
        "problems",
        "at",
        "reported",
        "started",
        "uptime_s",
        "interval_s",
        "service",
        "sales",
        "terminals",
        "terminals_online",
        "terminal_states",
        "links",
        "journal",
        "unit",
        "availability",
        "out_of_service",
        "starting",
        "audit",  # None: this unit reads no machine audit
    }
    text = json.dumps(report)
    for word in ("api_key", "token", "secret", "password", "card_number"):
        assert word not in text


def test_report_names_the_unit_and_a_cloned_journal() -> None:
    """The fleet sees each unit's own id (in its order ids) and a journal found on another
    machine (a cloned SD card), as health holds them."""
    agent = settled_agent()
    agent.health.report_unit(id="3F9C0E12AB", machine="machine-id 0123456789ab, serial 1",
                             mismatch="unit 3F9C0E12AB: its journal was made on another machine")
    report = build_report("unit-1", agent.health.snapshot())
    assert report["unit"]["id"] == "3F9C0E12AB"
    assert report["status"] == "down"
    assert "unit 3F9C0E12AB: its journal was made on another machine" in report["problems"]
