"""Moments people type, one grammar wherever they are typed: the command line's ``--since`` and
``--until``, the admin API's ``since`` and ``until``.

A day (``2026-11-22``; as an end, the whole day), an ISO 8601 time (UTC unless it carries an
offset; ``Z`` is UTC), a span back from now (``90m``, ``24h``, ``7d``, ``2w``) or Unix seconds.
"""

from __future__ import annotations

import datetime as dt
import re

MOMENT_FORMS = '"2026-11-22", "2026-11-22T10:00:00Z", or back from now: "90m", "24h", "7d", "2w"'

_RELATIVE = re.compile(r"^(\d+)\s*([mhdw])$")
_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400, "w": 604800}
_UNIX_SECONDS = re.compile(r"^\d{1,11}(\.\d+)?$")


class MomentError(ValueError):
    """Not a moment of :data:`MOMENT_FORMS` (nor Unix seconds)."""


def parse_moment(text: str, *, end: bool = False, now: dt.datetime | None = None) -> dt.datetime:
    """The moment ``text`` names, timezone-aware; with ``end``, a day stands for its end."""
    text = text.strip()
    try:
        if _UNIX_SECONDS.match(text):
            return dt.datetime.fromtimestamp(float(text), dt.UTC)
    except (ValueError, OverflowError, OSError):  # past the year 9999
        raise MomentError(f"expected {MOMENT_FORMS}, got {text[:40]!r}") from None
    match = _RELATIVE.match(text)
    if match:
        current = now or dt.datetime.now(dt.UTC)
        try:
            span = dt.timedelta(seconds=int(match.group(1)) * _UNIT_SECONDS[match.group(2)])
            return current - span
        except OverflowError:  # "99999999w": before the year 1
            raise MomentError(
                f"expected {MOMENT_FORMS}, within the years 1 to 9999, got {text[:40]!r}"
            ) from None
    try:
        if len(text) == 10:
            day = dt.date.fromisoformat(text)
            start = dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
            if end and day == dt.date.max:  # its end, the year 10000, has no datetime
                return dt.datetime.max.replace(tzinfo=dt.UTC)
            return start + dt.timedelta(days=1) if end else start
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        raise MomentError(f"expected {MOMENT_FORMS}, got {text[:40]!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
