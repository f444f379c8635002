"""The one grammar of moments, as the command line and the admin API both read it."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.moments import MomentError, parse_moment

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
        ("90m", False, NOW - dt.timedelta(minutes=90)),
        ("2w", True, NOW - dt.timedelta(weeks=2)),
        ("1700000000", False, dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
        (" 1700000000.5 ", False, dt.datetime(2023, 11, 14, 22, 13, 20, 500000, tzinfo=UTC)),
    ],
)
def test_each_form_names_one_moment(text: str, end: bool, moment: dt.datetime) -> None:
    assert parse_moment(text, end=end, now=NOW) == moment


@pytest.mark.parametrize(
    "text", ["yesterday", "", "7y", "2026-13-01", "-5", "999999999999", "1e10", "nan"]
)
def test_anything_else_is_refused_with_the_forms(text: str) -> None:
    with pytest.raises(MomentError, match='expected "2026-11-22"'):
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
