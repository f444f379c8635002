import re
from decimal import Decimal

import pytest

from kiosk_agent.money import (
    MoneyError,
    cents_to_dollars,
    dollars_to_cents,
    format_cents,
    parse_price,
    reported_dollars_to_cents,
)


def test_dollar_strings_round_trip_exactly() -> None:
    assert dollars_to_cents("12.50") == 1250
    assert dollars_to_cents(Decimal("0.1")) == 10
    assert cents_to_dollars(1250) == "12.50"
    assert cents_to_dollars(5) == "0.05"


def test_sub_cent_amounts_are_refused_not_rounded() -> None:
    with pytest.raises(MoneyError, match="two decimal places"):
        dollars_to_cents("1.005")


def test_reported_float_dollars_become_exact_cents() -> None:
    assert reported_dollars_to_cents(0.1) == 10
    assert reported_dollars_to_cents(19.99) == 1999
    assert reported_dollars_to_cents(3) == 300


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
