"""RFC 5545 recurrence text for billing plans: a DTSTART line and an RRULE line.

The text is built here from plain arguments, then parsed back with dateutil so a rule the service
would misread (UNTIL before the start, a zero interval) is refused before it leaves the device.
"""

from __future__ import annotations

import enum
from datetime import UTC, date, datetime

from dateutil.rrule import rrulestr


class Frequency(enum.StrEnum):
    DAILY = "DAILY"
    WEEKLY = "WEEKLY"
    MONTHLY = "MONTHLY"
    YEARLY = "YEARLY"


def build_rrule(
    start: datetime | date,
    frequency: Frequency | str,
    interval: int = 1,
    until: datetime | date | None = None,
) -> str:
    """``DTSTART:20261201T090000Z\\nRRULE:FREQ=MONTHLY;INTERVAL=1[;UNTIL=...]`` (UNTIL inclusive).

    Naive datetimes are taken as UTC; a date means midnight UTC of that day (for ``until``, the
    end of that day, so the last day is included).
    """
    freq = Frequency(str(frequency).upper())
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ValueError(f"interval must be a positive integer, got {interval!r}")
    start_at = _utc(start, end_of_day=False)
    parts = [f"FREQ={freq.value}", f"INTERVAL={interval}"]
    if until is not None:
        until_at = _utc(until, end_of_day=True)
        if until_at < start_at:
            raise ValueError(f"until ({until_at:%Y-%m-%d}) is before start ({start_at:%Y-%m-%d})")
        parts.append(f"UNTIL={until_at:%Y%m%dT%H%M%SZ}")
    text = f"DTSTART:{start_at:%Y%m%dT%H%M%SZ}\nRRULE:{';'.join(parts)}"
    validate_rrule(text)
    return text


def validate_rrule(text: str) -> None:
    """Refuse text that is not a DTSTART line and an RRULE line dateutil can expand."""
    lines = text.split("\n")
    if len(lines) != 2 or not lines[0].startswith("DTSTART") or not lines[1].startswith("RRULE:"):
        raise ValueError("a billing rule is a DTSTART line and an RRULE line, separated by \\n")
    try:
        rule = rrulestr(text)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a valid RFC 5545 rule: {exc}") from None
    if next(iter(rule), None) is None:
        raise ValueError("the rule never produces a payment")


def _utc(moment: datetime | date, *, end_of_day: bool) -> datetime:
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            return moment.replace(tzinfo=UTC, microsecond=0)
        return moment.astimezone(UTC).replace(microsecond=0)
    hour, minute, second = (23, 59, 59) if end_of_day else (0, 0, 0)
    return datetime(moment.year, moment.month, moment.day, hour, minute, second, tzinfo=UTC)
