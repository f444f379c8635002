import random

from kiosk_agent.sim import cards
from kiosk_agent.sim.cards import Outcome


def test_outcomes_by_the_cents() -> None:
    assert [Outcome.for_cents(c) for c in (1001, 2, 105, 7, 1000, 1099)] == [
        Outcome.RETRY,
        Outcome.DECLINED,
        Outcome.NO_CARD,
        Outcome.DEVICE_FAULT,
        Outcome.APPROVED,
        Outcome.APPROVED,
    ]


def test_tokens_keep_the_brand_digit_and_last_four_only() -> None:
    token = cards.tokenize("5500 0000 0000 0004", random.Random(1))
    assert len(token) == 16
    assert token.startswith("95")
    assert token.endswith("0004")
    assert "5500000000000004" not in token
    assert (cards.brand_of(token), cards.last_four_of(token), cards.masked(token)) == (
        2,
        "0004",
        "XXXXXXXXXXXX0004",
    )


def test_presented_cards_repeat_for_a_seed() -> None:
    first = cards.presented_card(random.Random(7), 2026)
    assert first == cards.presented_card(random.Random(7), 2026)
    assert first.token.endswith(first.last_four)
    assert len(first.expiration) == 4


def test_surcharge_is_integer_cents_rounded_half_up() -> None:
    assert cards.surcharge_cents(1000) == 30
    assert cards.surcharge_cents(50) == 2  # 1.5 cents rounds up
    assert cards.is_credit("411111")
    assert not cards.is_credit("601100")
