"""The fleet as the broker holds it: units read from retained topics alone."""

import json
import time

from kiosk_agent.fleet.inventory import Unit, units
from kiosk_agent.fleet.report import build_report

from .helpers import settled_agent


def _state(device_id: str, **changes: object) -> str:
    report = build_report(device_id, settled_agent().health.snapshot(), 60.0)
    return json.dumps({**report, **changes})


def test_units_from_state_and_availability_topics() -> None:
    found = {
        "kiosk-agent/a1/state": _state("a1"),
        "kiosk-agent/a1/availability": "online",
        "kiosk-agent/b2/availability": "offline",  # its state was cleared
        "kiosk-agent/c3/state": "not json",  # a foreign payload: listed, report unknown
        "kiosk-agent/eu/d4/state": _state("d4"),  # another shard's prefix
        "other/e5/state": _state("e5"),
    }
    fleet = units("kiosk-agent", found)
    assert [u.device_id for u in fleet] == ["a1", "b2", "c3"]
    now = time.time()
    assert [u.status(now) for u in fleet] == ["ok", "offline", "unknown"]
    assert [u.device_id for u in units("kiosk-agent/eu", found)] == ["d4"]


def test_a_unit_whose_reports_stopped_is_stale_and_yesterdays_sales_are_not_today() -> None:
    report = json.loads(_state("a1"))
    unit = Unit("a1", "online", report)
    now = report["at"]
    assert unit.status(now + 60) == "ok"
    assert unit.status(now + 3 * 60 * 1.1 + 1) == "stale"  # three beats missed, connection open
    assert unit.sales_today(now) == (0, 0)
    day_after = report["sales"]["day_started_at"] + 86400 + 3600
    assert unit.sales_today(day_after) is None
    summary = unit.summary(day_after)
    assert (summary["sales_today"], summary["version"], summary["online"]) == (None, "9.9.9", True)
