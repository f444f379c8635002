import re
import time
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.money import (
    MAX_CENTS,
    MoneyError,
    cents_to_dollars,
    dollars_to_cents,
    format_cents,
    parse_price,
    parse_wire_amount,
    reported_dollars_to_cents,
    scaled_to_cents,
)


def test_dollar_strings_round_trip_exactly() -> None:
    assert dollars_to_cents("12.50") == 1250
    assert dollars_to_cents(Decimal("0.1")) == 10
    assert cents_to_dollars(1250) == "12.50"
    assert cents_to_dollars(5) == "0.05"


@given(cents=st.integers(min_value=-(10**30), max_value=10**30) | st.integers(-999, 999))
def test_dollar_strings_are_the_decimal_ones_made_from_the_integer(cents: int) -> None:
    """cents_to_dollars runs on every step a stream sends: made from the integer, not a
    Decimal, it must say what the Decimal said (and refuse what it refused)."""
    from kiosk_agent.money import CENT

    try:
        expected = f"{(Decimal(cents) / 100).quantize(CENT):.2f}"
    except ArithmeticError:
        with pytest.raises(ArithmeticError):
            cents_to_dollars(cents)
        return
    assert cents_to_dollars(cents) == expected


def test_sub_cent_amounts_are_refused_not_rounded() -> None:
    with pytest.raises(MoneyError, match="two decimal places"):
        dollars_to_cents("1.005")


def test_reported_float_dollars_become_exact_cents() -> None:
    assert reported_dollars_to_cents(0.1) == 10
    assert reported_dollars_to_cents(19.99) == 1999
    assert reported_dollars_to_cents(3) == 300


@pytest.mark.parametrize("value", [1e308, float("inf"), float("nan"), 10**40, "1e999999", "x"])
def test_a_reported_amount_beyond_counting_is_a_money_error(value: object) -> None:
    with pytest.raises(MoneyError, match="not an amount"):  # never a bare ArithmeticError
        reported_dollars_to_cents(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "cents"), [("2.50", 250), ("$2.5", 250), ("2", 200), (250, 250), (" 0.99 ", 99)]
)
def test_prices_from_config(value: object, cents: int) -> None:
    assert parse_price(value) == cents


@pytest.mark.parametrize("value", [2.5, "2.505", "two", True, -1, None])
def test_bad_prices_name_the_expected_form(value: object) -> None:
    with pytest.raises(MoneyError, match="expected"):
        parse_price(value)


def test_float_price_suggests_the_fix() -> None:
    with pytest.raises(MoneyError, match=re.escape('expected an amount like "2.50", got 2.5')):
        parse_price(2.5)


def test_format_for_people() -> None:
    assert format_cents(1250) == "$12.50"
    assert format_cents(-300) == "-$3.00"
    assert format_cents(100, "EUR") == "1.00 EUR"


# -- properties: every wire amount, generated ----------------------------------------------------

WIRE_TEXT = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"[0-9+\-._e ]{0,20}", fullmatch=True),
    st.from_regex(r"[0-9]{1,12}(\.[0-9]{0,4})?", fullmatch=True),
)


@given(text=WIRE_TEXT, unit=st.sampled_from(["dollars", "cents"]))
def test_a_wire_amount_is_exact_or_refused_quickly(text: str, unit: str) -> None:
    started = time.perf_counter()
    try:
        cents = parse_wire_amount(text, unit)
    except MoneyError:
        pass
    else:
        # only plain ASCII digits (and two decimals for dollars) are taken, and mean what they say
        grammar = r"[0-9]{1,7}\.[0-9]{2}" if unit == "dollars" else r"[0-9]{1,9}"
        assert re.fullmatch(grammar, text, re.ASCII)
        assert cents == int(text.replace(".", ""))
        assert 0 <= cents <= MAX_CENTS
    assert time.perf_counter() - started < 1.0


@given(cents=st.integers(min_value=0, max_value=MAX_CENTS))
def test_every_amount_round_trips_on_the_wire(cents: int) -> None:
    assert parse_wire_amount(cents_to_dollars(cents), "dollars") == cents
    assert parse_wire_amount(str(cents), "cents") == cents


@given(value=st.one_of(st.integers(), st.text(max_size=60), st.floats(), st.booleans()))
def test_a_configured_price_is_in_range_or_refused(value: object) -> None:
    try:
        cents = parse_price(value)
    except MoneyError:
        return
    assert isinstance(cents, int)
    assert 0 <= cents <= MAX_CENTS


def test_an_audit_amount_is_scaled_by_its_decimal_places_to_cents():
    assert scaled_to_cents("234850", 2) == 234850
    assert scaled_to_cents("125", 1) == 1250
    assert scaled_to_cents("7", 0) == 700
    assert scaled_to_cents("1250", 3) == 125
    for text, places in [("1255", 3), ("12.5", 2), ("-1", 2), ("1" * 16, 2), ("٢", 2), ("1", 7)]:
        with pytest.raises(MoneyError):
            scaled_to_cents(text, places)
