"""build_rrule: RFC 5545 DTSTART + RRULE text for billing plans, checked with dateutil."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from dateutil.rrule import rrulestr

from kiosk_agent.service.rrule import Frequency, build_rrule, validate_rrule


def test_monthly_rule_without_end() -> None:
    text = build_rrule(datetime(2026, 12, 1, 9, 0), Frequency.MONTHLY)
    assert text == "DTSTART:20261201T090000Z\nRRULE:FREQ=MONTHLY;INTERVAL=1"


def test_until_is_inclusive_of_its_whole_day() -> None:
    text = build_rrule(date(2026, 12, 1), "weekly", interval=2, until=date(2027, 1, 12))
    assert text == "DTSTART:20261201T000000Z\nRRULE:FREQ=WEEKLY;INTERVAL=2;UNTIL=20270112T235959Z"
    dates = [d.date() for d in rrulestr(text)]
    assert dates[0] == date(2026, 12, 1)
    assert dates[-1] == date(2027, 1, 12)  # the last day counts
    assert len(dates) == 4


def test_aware_start_is_converted_to_utc() -> None:
    start = datetime(2026, 12, 1, 9, 0, tzinfo=timezone(timedelta(hours=-5)))
    assert build_rrule(start, Frequency.DAILY).startswith("DTSTART:20261201T140000Z\n")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"frequency": "HOURLY"}, "HOURLY"),
        ({"frequency": "DAILY", "interval": 0}, "interval"),
        ({"frequency": "DAILY", "until": date(2026, 11, 1)}, "before start"),
    ],
)
def test_bad_rules_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_rrule(datetime(2026, 12, 1, tzinfo=UTC), **kwargs)  # type: ignore[arg-type]


def test_validate_refuses_text_that_is_not_two_lines() -> None:
    with pytest.raises(ValueError, match="DTSTART line and an RRULE line"):
        validate_rrule("RRULE:FREQ=DAILY")
    with pytest.raises(ValueError, match="RFC 5545"):
        validate_rrule("DTSTART:20261201T000000Z\nRRULE:FREQ=SOMETIMES")
