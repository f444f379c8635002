"""What a sale's money is, in words (the status page, `kiosk-agent sales`, events)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kiosk_agent.money import format_cents
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.journal import SaleRecord
from kiosk_agent.sales.model import CAPTURED_NOTHING, SaleEvent, money_text, vend_refusal
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.sales.steps import event_of, nothing_captured


def _sale(state: SaleState, **cents: int) -> SaleRecord:
    return SaleRecord(
        sale_id="s1", order_id="KA1", source="kiosk_api:app", flow="charge_card",
        terminal="SIM-0001", amount_cents=cents.pop("amount", 500), state=state, **cents,
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "cents", "said"),
    [
        (SaleState.CHARGING, {}, "$5.00 requested"),
        (SaleState.DISPENSING, {"authorized_cents": 500}, "$5.00 authorized"),
        (SaleState.DISPENSING, {"captured_cents": 500}, "$5.00 charged"),
        # the charge's answer was lost: "$5.00 requested" read as if nothing could be taken
        (SaleState.UNRESOLVED, {}, "$5.00 requested, outcome unknown"),
        (SaleState.UNRESOLVED, {"authorized_cents": 500}, "$5.00 authorized"),
        (SaleState.COMPLETED, {"authorized_cents": 500, "captured_cents": 180}, "$1.80 charged"),
        (SaleState.REVERSED, {"captured_cents": 300, "reversed_cents": 300},
         "nothing charged ($3.00 given back)"),
        (SaleState.REVERSED, {"authorized_cents": 500, "reversed_cents": 500},
         "nothing charged ($5.00 hold released)"),
        (SaleState.DECLINED, {}, "nothing charged"),
        (SaleState.ATTENTION, {"captured_cents": 666}, "$6.66 held, undecided"),
        (SaleState.ATTENTION, {}, "$5.00, outcome unknown"),
        # a charge found partly refunded ($1.00 of $3.00 before the agent looked): the rest is
        # what is held, not the whole charge
        (SaleState.ATTENTION, {"captured_cents": 300, "reversed_cents": 100},
         "$2.00 held, undecided ($1.00 given back)"),
        (SaleState.REVERSING, {"captured_cents": 300, "reversed_cents": 100},
         "$2.00 charged ($1.00 given back)"),
    ],
)
def test_money_says_what_was_taken_held_or_is_unknown(
    state: SaleState, cents: dict[str, int], said: str
) -> None:
    assert money_text(_sale(state, **cents)) == said


@pytest.mark.parametrize(("price", "authorized", "why"), [
    (150, 150, ""),
    (150, 500, ""),
    (250, 125, "selection A1 costs $2.50, above the $1.25 authorized"),
    (0, 500, "selection A1 costs $0.00: nothing to charge a card for"),
    (-5, 500, "selection A1 costs -$0.05: nothing to charge a card for"),
])
def test_the_vend_money_rule_is_the_sales(price: int, authorized: int, why: str) -> None:
    """One rule, in sales: a vend never above what the card holds, never for nothing."""
    assert vend_refusal(price, authorized, "A1") == why


def test_without_a_product_the_rule_names_the_price() -> None:
    assert vend_refusal(300, 200) == "the price is $3.00, above the $2.00 authorized"


@pytest.mark.parametrize("updated_at", [1_790_000_123.25, None])
def test_a_steps_event_is_its_record_field_for_field(updated_at: float | None) -> None:
    """event_of (made by one straight function, not the frozen __init__) carries every field
    the record has, its step, and the record's last write as its date (none yet: the clock's)."""
    record = SaleRecord(
        sale_id="s1", order_id="KA1", source="kiosk_api:app", flow="authorize_capture",
        terminal="SIM-0002", amount_cents=500, state=SaleState.DISPENSING, product="tea",
        currency="CAD", captured_cents=180, reversed_cents=20, authorized_cents=500,
        vended_cents=180, message="vending", created_at=1_790_000_000.5, updated_at=updated_at,
        resolution='{"by": "a person"}',
    )  # type: ignore[arg-type]
    event = event_of(record, Step.DISPENSE_REQUEST, clock=FakeClock(wall=1_790_000_999.0))
    assert event == SaleEvent(
        sale_id="s1", order_id="KA1", source="kiosk_api:app", state=SaleState.DISPENSING,
        amount_cents=500, captured_cents=180, reversed_cents=20, product="tea",
        terminal="SIM-0002", message="vending", at=updated_at or 1_790_000_999.0,
        step=Step.DISPENSE_REQUEST, authorized_cents=500, currency="CAD",
        created_at=1_790_000_000.5, flow="authorize_capture", vended_cents=180,
        resolved=record.resolved,
    )
    assert event.resolved  # read off the record (a property there), not the default


def test_a_capture_of_nothing_is_said_as_captured_not_held() -> None:
    """An attention sale whose capture reporting shows made for $0.00 (its words, written by
    steps.nothing_captured) holds no authorization any more: "$0.00 captured of the $1.75
    dispensed", not "$5.00 held" (its authorization). A capture that failed still holds it."""
    words = nothing_captured(175, "at 10:00:00Z")
    assert f"reporting shows {format_cents(0)} captured" == CAPTURED_NOTHING
    assert CAPTURED_NOTHING in words
    shown = _sale(SaleState.ATTENTION, authorized_cents=500, vended_cents=175)
    assert money_text(replace(shown, message=words)) == (
        "$0.00 captured of $1.75 dispensed, undecided")
    failed = replace(shown, message="dispensed, but the capture failed twice")
    assert money_text(failed) == "$5.00 held, undecided"


def test_a_charge_shown_refunded_for_nothing_reads_may_be_held() -> None:
    """Reporting shows the sale's charge refunded for $0.00 (and, often, a refund's row for all
    of it): the money may be held or back. Before, every face said "$3.00 held, undecided", a
    certainty the journal's own words ("may still be held") do not have."""
    words = ("already given back; reporting shows 7001 refunded for $0.00: a refund of nothing "
             "gives nothing back, so the $3.00 may still be held")
    sale = replace(_sale(SaleState.ATTENTION, authorized_cents=300, amount=300), message=words)
    assert money_text(sale) == "$3.00 may be held, undecided"
