"""The voluptuous validators every section's schema shares (prices, durations): a leaf, so
that each section's schema can live with the module that owns it (sales/schema.py,
web/schema.py, ...) without importing the configuration's loader."""

from __future__ import annotations

from typing import Any

import voluptuous as vol

from kiosk_agent.money import MoneyError, parse_price


def price(value: Any) -> int:
    """A voluptuous validator: ``"2.50"`` or integer cents -> integer cents."""
    try:
        return parse_price(value)
    except MoneyError as err:
        raise vol.Invalid(str(err)) from None


def positive_price(value: Any) -> int:
    cents = price(value)
    if cents <= 0:
        raise vol.Invalid(f"expected an amount above zero, got {value!r}")
    return cents


def price_map(value: Any) -> dict[str, int]:
    """A voluptuous validator: ``{product: price}`` -> cents; every bad price is reported."""
    if not isinstance(value, dict):
        raise vol.Invalid('expected a map of product to price, like {coffee: "2.50"}')
    prices: dict[str, int] = {}
    errors: list[vol.Invalid] = []
    for name, amount in value.items():
        try:
            prices[str(name)] = positive_price(amount)
        except vol.Invalid as err:
            errors.append(vol.Invalid(err.msg, path=[name]))
    if errors:
        raise vol.MultipleInvalid(errors)
    return prices


def positive_float(value: Any) -> float:
    """Durations and scales (not money): a number above zero."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise vol.Invalid(f"expected a number, got {value!r}")
    if value <= 0:
        raise vol.Invalid(f"expected a number above zero, got {value!r}")
    return float(value)
