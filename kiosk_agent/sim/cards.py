"""Simulated cards: tokens, brands, masks and the test outcomes chosen by an amount's cents.

A token looks like a real gateway's: 16 digits, ``9``, then the first digit of the card
number, then random digits, then the card's last four. No card number is ever kept.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

# First digit of the card number -> card_brand_id (1..4).
_BRAND_BY_FIRST_DIGIT = {"4": 1, "5": 2, "3": 3, "6": 4}
_FIRST_DIGIT_BY_BRAND = {brand: digit for digit, brand in _BRAND_BY_FIRST_DIGIT.items()}
# Card-number prefixes the simulator treats as credit, and so surcharges (debit: 6).
_CREDIT_FIRST_DIGITS = frozenset("345")
SURCHARGE_PERCENT = "3.00"


class Outcome(enum.Enum):
    """What a simulated card does, chosen by the last two digits of the amount in cents."""

    APPROVED = "approved"
    RETRY = "retry"  # ..01: result B
    DECLINED = "declined"  # ..02: result C
    NO_CARD = "no_card"  # ..05: nobody presents a card; the interaction expires
    DEVICE_FAULT = "device_fault"  # ..07: the terminal fails

    @classmethod
    def for_cents(cls, cents: int) -> Outcome:
        return _OUTCOME_BY_CENTS.get(cents % 100, cls.APPROVED)


_OUTCOME_BY_CENTS = {
    1: Outcome.RETRY,
    2: Outcome.DECLINED,
    5: Outcome.NO_CARD,
    7: Outcome.DEVICE_FAULT,
}


@dataclass(frozen=True, slots=True)
class SimCard:
    token: str
    card_brand_id: int
    last_four: str
    expiration: str  # MMYY


def tokenize(card_number: str, rng: random.Random) -> str:
    """A token for a card number (the hosted page's form); the number itself is dropped."""
    digits = "".join(ch for ch in card_number if ch.isdigit())
    middle = "".join(rng.choice("0123456789") for _ in range(10))
    return f"9{digits[:1] or '4'}{middle}{digits[-4:].rjust(4, '0')}"


def presented_card(rng: random.Random, year: int) -> SimCard:
    """The card a customer taps on a simulated terminal."""
    brand = rng.choice((1, 1, 1, 2, 2, 3, 4))
    last_four = f"{rng.randrange(10_000):04d}"
    token = tokenize(_FIRST_DIGIT_BY_BRAND[brand] + "0" * 11 + last_four, rng)
    expiration = f"{rng.randrange(1, 13):02d}{(year + rng.randrange(1, 5)) % 100:02d}"
    return SimCard(token, brand, last_four, expiration)


def first_digit(token_or_bin: str) -> str:
    """The card number's first digit, from a simulator token or a BIN."""
    if len(token_or_bin) == 16 and token_or_bin.startswith("9"):
        return token_or_bin[1]
    return token_or_bin[:1]


def brand_of(token: str) -> int:
    return _BRAND_BY_FIRST_DIGIT.get(first_digit(token), 1)


def last_four_of(token: str) -> str:
    tail = token[-4:]
    return tail if tail.isdigit() else "0000"


def masked(token: str) -> str:
    """The reporting interface's masked card number."""
    return "X" * 12 + last_four_of(token)


def is_credit(token_or_bin: str) -> bool:
    return first_digit(token_or_bin) in _CREDIT_FIRST_DIGITS


def surcharge_cents(amount_cents: int) -> int:
    """3.00 % of the amount, rounded half up to the cent (integer arithmetic, no float)."""
    return (amount_cents * 3 + 50) // 100
