"""Moments people type, one grammar wherever they are typed: the command line's ``--since`` and
``--until``, the admin API's ``since`` and ``until`` (its sales and its reports); and the one
rule of days, which "Sales today" (status page, ``health``, the heartbeat, Home Assistant,
``fleet list``) counts by too.

A day is a UTC day, as every time the agent writes is UTC: ``today``, ``yesterday`` or
``2026-11-22`` (also ``20261122``, ISO 8601's basic form; as an end, the whole day). An
ISO 8601 time is UTC unless it carries an offset (``Z`` is UTC). A span back from now
(``90m``, ``24h``, ``7d``, ``2w``) or Unix seconds.

A sale belongs to the day it was created (the customer's moment): ``created_at``, which the
journal's ``since``/``until`` filter and :meth:`Journal.today` both read.
"""

from __future__ import annotations

import datetime as dt
import re

MOMENT_FORMS = (
    '"today", "yesterday", "2026-11-22", "2026-11-22T10:00:00Z", or back from now: '
    '"90m", "24h", "7d", "2w"'
)

# ASCII digits only: Python's \d and float() also read Arabic-Indic or full-width ones
_RELATIVE = re.compile(r"^(\d+)\s*([mhdw])$", re.ASCII)
_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400, "w": 604800}
_UNIX_SECONDS = re.compile(r"^\d{1,11}(\.\d+)?$", re.ASCII)
# ISO 8601's basic form of a day (`date +%Y%m%d`): a day, never Unix seconds of 1970-1973
_BASIC_DAY = re.compile(r"^\d{8}$", re.ASCII)
_DAYS_BACK = {"today": 0, "yesterday": 1}


class MomentError(ValueError):
    """Not a moment of :data:`MOMENT_FORMS` (nor Unix seconds)."""


def day_of(unix_time: float) -> dt.date:
    """The day a moment (Unix time) belongs to: its UTC date."""
    return dt.datetime.fromtimestamp(unix_time, dt.UTC).date()


def day_start(day: dt.date) -> float:
    """Unix time of the UTC midnight that starts ``day``."""
    return dt.datetime.combine(day, dt.time(), dt.UTC).timestamp()


def day_bounds(unix_time: float) -> tuple[float, float]:
    """The UTC day a moment belongs to, as Unix times: its midnight and the next (a wall
    clock stepped back over midnight leaves sales dated on a later day: not this one's)."""
    midnight = day_start(day_of(unix_time))
    return midnight, midnight + 86_400.0  # a UTC day in Unix time: 24 hours, always


def parse_moment(text: str, *, end: bool = False, now: dt.datetime | None = None) -> dt.datetime:
    """The moment ``text`` names, timezone-aware; with ``end``, a day stands for its end."""
    text = text.strip()
    current = now or dt.datetime.now(dt.UTC)
    named = _DAYS_BACK.get(text.casefold())
    if named is not None:
        return _day_bound(current.astimezone(dt.UTC).date() - dt.timedelta(days=named), end)
    try:
        if _BASIC_DAY.match(text):
            return _day_bound(dt.date.fromisoformat(text), end)
        if _UNIX_SECONDS.match(text):
            return dt.datetime.fromtimestamp(float(text), dt.UTC)
    except (ValueError, OverflowError, OSError):  # past the year 9999
        raise MomentError(f"expected {MOMENT_FORMS}, got {text[:40]!r}") from None
    match = _RELATIVE.match(text)
    if match:
        try:
            span = dt.timedelta(seconds=int(match.group(1)) * _UNIT_SECONDS[match.group(2)])
            return current - span
        except OverflowError:  # "99999999w": before the year 1
            raise MomentError(
                f"expected {MOMENT_FORMS}, within the years 1 to 9999, got {text[:40]!r}"
            ) from None
    try:
        if len(text) == 10:
            return _day_bound(dt.date.fromisoformat(text), end)
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        raise MomentError(f"expected {MOMENT_FORMS}, got {text[:40]!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _day_bound(day: dt.date, end: bool) -> dt.datetime:
    """The UTC midnight that starts ``day``, or with ``end`` the one that ends it."""
    start = dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
    if not end:
        return start
    if day == dt.date.max:  # its end, the year 10000, has no datetime
        return dt.datetime.max.replace(tzinfo=dt.UTC)
    return start + dt.timedelta(days=1)


# -- writing moments: ISO 8601 UTC in JSON and CSV, a UTC time said so for people ----------------

Moment = dt.datetime | float | str


def in_utc(moment: Moment) -> dt.datetime:
    """A moment in UTC: Unix seconds, a datetime or the ISO 8601 text JSON holds (the agent's
    own answers read back by a command); a naive one is taken as UTC."""
    if isinstance(moment, str):
        moment = dt.datetime.fromisoformat(moment.replace("Z", "+00:00"))
    elif not isinstance(moment, dt.datetime):
        return dt.datetime.fromtimestamp(moment, dt.UTC)
    if moment.tzinfo is None:
        return moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC)


def timestamp(moment: Moment) -> str:
    """``2026-11-22T10:15:30Z``: every time in JSON and CSV (UTC, to the second)."""
    return in_utc(moment).isoformat(timespec="seconds").replace("+00:00", "Z")


def optional_timestamp(moment: Moment | None) -> str | None:
    """:func:`timestamp`, and JSON's null for no time."""
    return None if moment is None else timestamp(moment)


def display_time(moment: Moment) -> str:
    """``2026-11-22 10:15:30Z``: a time for people (tables, messages), UTC and said so."""
    return f"{in_utc(moment):%Y-%m-%d %H:%M:%SZ}"


def display_clock(moment: Moment) -> str:
    """``10:15:30Z``: a time of today for people (a live line, a deadline), UTC and said so."""
    return f"{in_utc(moment):%H:%M:%SZ}"
