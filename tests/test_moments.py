"""The one grammar of moments, as the command line and the admin API both read it."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.moments import MomentError, day_of, day_start, parse_moment

UTC = dt.UTC
NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "end", "moment"),
    [
        ("2026-11-22", False, dt.datetime(2026, 11, 22, tzinfo=UTC)),
        ("2026-11-22", True, dt.datetime(2026, 11, 23, tzinfo=UTC)),  # an end: the whole day
        ("2026-11-22T10:00:00", False, dt.datetime(2026, 11, 22, 10, tzinfo=UTC)),  # UTC
        ("2026-11-22T10:00:00Z", False, dt.datetime(2026, 11, 22, 10, tzinfo=UTC)),
        (
            "2026-11-22T10:00:00+02:00",
            False,
            dt.datetime(2026, 11, 22, 8, tzinfo=UTC),
        ),
        ("today", False, dt.datetime(2026, 11, 26, tzinfo=UTC)),  # the UTC day of now
        ("today", True, dt.datetime(2026, 11, 27, tzinfo=UTC)),  # to its end
        ("Yesterday", False, dt.datetime(2026, 11, 25, tzinfo=UTC)),
        ("yesterday", True, dt.datetime(2026, 11, 26, tzinfo=UTC)),
        ("90m", False, NOW - dt.timedelta(minutes=90)),
        ("2w", True, NOW - dt.timedelta(weeks=2)),
        ("1700000000", False, dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
        (" 1700000000.5 ", False, dt.datetime(2023, 11, 14, 22, 13, 20, 500000, tzinfo=UTC)),
    ],
)
def test_each_form_names_one_moment(text: str, end: bool, moment: dt.datetime) -> None:
    assert parse_moment(text, end=end, now=NOW) == moment


@pytest.mark.parametrize(
    "text", ["tomorrow", "", "7y", "2026-13-01", "-5", "999999999999", "1e10", "nan"]
)
def test_anything_else_is_refused_with_the_forms(text: str) -> None:
    with pytest.raises(MomentError, match='expected "today", "yesterday", "2026-11-22"'):
        parse_moment(text, now=NOW)


@pytest.mark.parametrize(("text", "end", "moment"), [
    ("20261122", False, dt.datetime(2026, 11, 22, tzinfo=UTC)),
    ("20261122", True, dt.datetime(2026, 11, 23, tzinfo=UTC)),  # an end: the whole day
    ("20261122.0", False, dt.datetime(1970, 8, 23, 12, 5, 22, tzinfo=UTC)),  # Unix, said so
    ("1700000000", False, dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
])
def test_a_day_in_iso_8601s_basic_form_is_that_day_not_seconds_of_1970(
    text: str, end: bool, moment: dt.datetime
) -> None:
    """`date +%Y%m%d` gives 20261122: it was read as Unix seconds, 1970-08-23, and
    `sales --since 20261122` listed every sale the journal holds, with no word of why."""
    assert parse_moment(text, end=end, now=NOW) == moment


@pytest.mark.parametrize("text", [
    "\u0663\u0663",  # Arabic-Indic 33
    "\uff11\uff17" + "\uff10" * 8,  # full-width 1700000000
    "\u0967\u0969",  # Devanagari 13
])
def test_digits_of_other_scripts_are_refused_not_read_as_unix_seconds(text: str) -> None:
    """Python's \\d and float() take Arabic-Indic and full-width digits: such a paste was
    read as Unix seconds."""
    with pytest.raises(MomentError, match='expected "today"'):
        parse_moment(text, now=NOW)


@pytest.mark.parametrize("text", ["99999999w", "9999999999999999999999d", "999999999999999m"])
def test_a_span_back_past_the_year_1_is_refused_not_an_overflow(text: str) -> None:
    with pytest.raises(MomentError, match="within the years 1 to 9999"):
        parse_moment(text, now=NOW)


def test_the_last_day_a_datetime_holds_is_a_whole_day_as_an_end() -> None:
    # its end, 10000-01-01, has no datetime: the last microsecond of the day stands for it
    end = parse_moment("9999-12-31", end=True, now=NOW)
    assert end == dt.datetime.max.replace(tzinfo=UTC)
    assert parse_moment("9999-12-31", now=NOW) == dt.datetime(9999, 12, 31, tzinfo=UTC)


@given(st.text(max_size=40))
def test_any_text_is_a_moment_or_a_clear_refusal(text: str) -> None:
    try:
        moment = parse_moment(text, now=NOW)
    except MomentError as err:
        refusal = str(err)
        assert refusal.startswith("expected "), refusal
    else:
        assert moment.tzinfo is not None


MOMENTS = st.datetimes(
    min_value=dt.datetime(1971, 1, 2), max_value=dt.datetime(9999, 12, 30), timezones=st.just(UTC)
)


@given(MOMENTS)
def test_today_is_the_day_every_face_counts_and_yesterday_ends_where_it_starts(
    now: dt.datetime,
) -> None:
    start, end = parse_moment("today", now=now), parse_moment("today", end=True, now=now)
    assert start <= now < end
    assert end - start == dt.timedelta(days=1)
    assert parse_moment("yesterday", end=True, now=now) == start
    # the day "Sales today" counts (Journal.today, Health): the same UTC day
    assert start.timestamp() == day_start(day_of(now.timestamp()))
    assert parse_moment(day_of(now.timestamp()).isoformat(), now=now) == start


@given(MOMENTS, st.sampled_from(["+09:00", "-05:00", "Z", ""]))
def test_a_time_is_utc_unless_it_says_and_lands_in_one_day(now: dt.datetime, zone: str) -> None:
    text = now.replace(tzinfo=None).isoformat() + zone
    moment = parse_moment(text, now=NOW)
    offset = {"+09:00": 9, "-05:00": -5}.get(zone, 0)
    assert moment == now - dt.timedelta(hours=offset)
    day = day_of(moment.timestamp())
    assert day_start(day) <= moment.timestamp() < day_start(day) + 86400
