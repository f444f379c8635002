"""Money, in one place: integer cents inside, the interface's units only at its edges.

The service speaks three units (choices.md): integer cents for charges and terminal calls,
two-place dollar strings for billing plans and hosted pages, and JSON numbers in dollars in
reporting. Everything here converts exactly through ``Decimal``; a float never holds money.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

CENT = Decimal("0.01")
# The most any amount from outside may be: nine digits of cents ($9,999,999.99). A machine's own
# ``max_price`` is the real bound; this one keeps parsing, SQLite and the service in range.
MAX_CENTS = 999_999_999
# The currency of a sale and of the `sales:` section when none is named (ISO 4217)
CURRENCY = "USD"
# ASCII digits only: ``\d`` would take Arabic-Indic and other Unicode digits.
_PRICE_TEXT = re.compile(r"\$?[ ]?([0-9]{1,7})(?:\.([0-9]{1,2}))?", re.ASCII)
# On a wire (MDB adapters, serial devices) an amount is dollars with exactly two places, or
# whole cents: no sign, exponent, underscore, spaces or other digits, and a bounded length.
_WIRE_TEXT = {
    "dollars": re.compile(r"([0-9]{1,7})\.([0-9]{2})", re.ASCII),
    "cents": re.compile(r"([0-9]{1,9})", re.ASCII),
}
_WIRE_EXAMPLE = {"dollars": '"2.50"', "cents": '"250"'}
# A machine's audit (EVA-DTS) writes amounts as whole units of 10**-places: ASCII digits only,
# and no counter of a vending machine needs more than 15 of them.
MAX_SCALED_PLACES = 6
_POWERS_OF_TEN: tuple[int, ...] = tuple(10**n for n in range(MAX_SCALED_PLACES + 1))


class MoneyError(ValueError):
    """A value that is not an exact amount of money."""


def dollars_to_cents(value: str | Decimal | int) -> int:
    """``"12.50"`` or ``Decimal("12.5")`` -> 1250; sub-cent precision is refused, not rounded."""
    if isinstance(value, (bool, float)):
        raise MoneyError(f"expected a decimal string or Decimal, got {type(value).__name__}")
    try:
        amount = Decimal(value) if not isinstance(value, Decimal) else value
    except InvalidOperation:
        raise MoneyError(f"not an amount: {value!r}") from None
    if not amount.is_finite():
        raise MoneyError(f"not an amount: {value!r}")
    cents = amount * 100
    if cents != cents.to_integral_value():
        raise MoneyError(f"{value!r} has more than two decimal places")
    return int(cents)


def cents_to_dollars(cents: int) -> str:
    """1250 -> ``"12.50"``: the interface's two-place dollar string (the digits of
    :func:`cents_to_decimal`'s, made from the integer: no Decimal for every step a stream sends)."""
    if isinstance(cents, bool) or not isinstance(cents, int):
        raise MoneyError(f"expected integer cents, got {type(cents).__name__}")
    if not -_DECIMAL_CENTS_BOUND < cents < _DECIMAL_CENTS_BOUND:  # as Decimal's precision does
        return f"{cents_to_decimal(cents):.2f}"
    if cents < 0:
        return "-" + cents_to_dollars(-cents)
    dollars, part = divmod(cents, 100)
    return f"{dollars}.{part:02d}"


_DECIMAL_CENTS_BOUND = 10**26  # 28 significant digits, two of them the cents


def cents_to_decimal(cents: int) -> Decimal:
    if isinstance(cents, bool) or not isinstance(cents, int):
        raise MoneyError(f"expected integer cents, got {type(cents).__name__}")
    return (Decimal(cents) / 100).quantize(CENT)


def reported_dollars_to_cents(value: int | float | str | Decimal) -> int:
    """Reporting sends dollars as a JSON number; parse it as text so 0.1 stays 10 cents.

    This is the one place a float may arrive (from JSON); it is turned into text at once and
    rounded half-up to the cent, never used for arithmetic.
    """
    if isinstance(value, bool):
        raise MoneyError("expected an amount, got a boolean")
    text = repr(value) if isinstance(value, float) else str(value)
    try:
        amount = Decimal(text)
        return int((amount * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP))
    except (ArithmeticError, ValueError):  # not a number, NaN, or beyond counting (1e308)
        raise MoneyError(f"not an amount: {value!r}") from None


def parse_wire_amount(text: str, unit: str) -> int:
    """An amount as a device wrote it: ``"2.50"`` (unit ``dollars``) or ``"250"`` (``cents``).

    One strict grammar for every wire; the match is anchored and bounded, so a hostile line
    (``1e999990``) costs no more than a short one.
    """
    grammar = _WIRE_TEXT.get(unit)
    if grammar is None:
        raise MoneyError(f"unknown amount unit {unit!r}")
    match = grammar.fullmatch(text) if len(text) <= 12 else None
    if match is None:
        shown = text if len(text) <= 20 else text[:17] + "..."
        raise MoneyError(f"expected {unit} like {_WIRE_EXAMPLE[unit]}, got {shown!r}")
    if unit == "cents":
        return int(match.group(1))
    return int(match.group(1)) * 100 + int(match.group(2))


def scaled_to_cents(text: str, places: int) -> int:
    """An amount as an audit writes it, ``"234850"`` with ``places`` 2 -> 234850 cents.

    ``places`` is the machine's decimal point position (EVA-DTS ``ID4``): with 1 place
    ``"125"`` is 12.5 -> 1250 cents; with 3, ``"1250"`` is 1.250 -> 125 cents, and ``"1255"``
    (a tenth of a cent) is refused, not rounded.
    """
    if not 0 <= places <= MAX_SCALED_PLACES:
        raise MoneyError(f"expected 0 to {MAX_SCALED_PLACES} decimal places, got {places}")
    if not (text.isascii() and text.isdigit() and len(text) <= 15):  # [0-9]{1,15}, quickly
        shown = text if len(text) <= 20 else text[:17] + "..."
        raise MoneyError(f"expected up to 15 digits, got {shown!r}")
    scaled = int(text)
    if places <= 2:
        return scaled * _POWERS_OF_TEN[2 - places]
    whole, rest = divmod(scaled, _POWERS_OF_TEN[places - 2])
    if rest:
        raise MoneyError(f"{text} with {places} decimal places is not a whole number of cents")
    return whole


def check_cents(cents: int) -> int:
    """Integer cents within ``0 .. MAX_CENTS``; MoneyError otherwise."""
    if cents < 0:
        raise MoneyError(f"expected a positive amount, got {cents}")
    if cents > MAX_CENTS:
        raise MoneyError(f"expected at most {cents_to_dollars(MAX_CENTS)}, got more")
    return cents


def parse_price(value: object) -> int:
    """A configured price: a string like ``"2.50"`` / ``"$2.50"`` or an integer of cents.

    Floats are refused: ``2.5`` in YAML is ambiguous between dollars and a typo, and money
    must be exact.
    """
    if isinstance(value, bool):
        raise MoneyError("expected an amount like \"2.50\", got a boolean")
    if isinstance(value, int):
        return check_cents(value)
    if isinstance(value, float):
        raise MoneyError(f'expected an amount like "{value:.2f}", got {value!r}')
    if isinstance(value, str):
        match = _PRICE_TEXT.fullmatch(value.strip()) if len(value) <= 40 else None
        if match is None:
            shown = value if len(value) <= 20 else value[:17] + "..."
            raise MoneyError(f'expected an amount like "2.50", got {shown!r}')
        whole, frac = match.group(1), (match.group(2) or "").ljust(2, "0")
        return int(whole) * 100 + int(frac)
    raise MoneyError(f'expected an amount like "2.50", got {type(value).__name__}')


def format_cents(cents: int, currency: str = "USD") -> str:
    """For people: 1250 -> ``"$12.50"`` (other currencies: ``"12.50 EUR"``)."""
    sign = "-" if cents < 0 else ""
    text = cents_to_dollars(abs(cents))
    return f"{sign}${text}" if currency == "USD" else f"{sign}{text} {currency}"
