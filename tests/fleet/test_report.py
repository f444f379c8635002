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
        "time_zone",
        "service",
        "sales",
        "terminals",
        "terminals_online",
        "terminal_states",
        "links",
        "journal",
        "availability",
        "out_of_service",
    }
    text = json.dumps(report)
    for word in ("api_key", "token", "secret", "password", "card_number"):
        assert word not in text
