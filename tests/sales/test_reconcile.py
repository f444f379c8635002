"""The reconciler's reading of reporting's statuses, kept without importing reporting's models."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiosk_agent.sales.reconcile import _HELD, _NONE_HELD, _PARTLY_HELD, _REVERSED, Reconciler
from kiosk_agent.service.models.reporting import Transaction, TransStatus
from kiosk_agent.service.trans_ids import trans_key


def test_held_and_reversed_are_reportings_statuses_by_name() -> None:
    assert frozenset({TransStatus.AUTHORIZED, TransStatus.CAPTURED, TransStatus.SETTLED}) == _HELD
    assert frozenset({TransStatus.VOIDED, TransStatus.REFUNDED}) == _REVERSED


def test_the_reconciler_reads_every_status_by_the_one_contract_and_each_once() -> None:
    """The service's statuses have one contract (TransStatus): the reconciler's sets hold its
    members, not bare ints that equal them (a 4 meant VOIDED only by a comment), and every
    status the interface names is read one way: held, partly held, given back or none held."""
    groups = [_HELD, {_PARTLY_HELD}, _REVERSED, _NONE_HELD]
    named = [status for group in groups for status in group]
    assert all(type(status) is TransStatus for status in named), named
    assert sorted(named) == sorted(TransStatus)  # each once, none left out


def test_the_statuses_are_read_without_the_reporting_models() -> None:
    """Naming the statuses at import costs no pydantic model: reporting's are built at the
    first lookup, not with every agent."""
    code = ("import sys; import kiosk_agent.sales.reconcile; "
            "print('kiosk_agent.service.models.reporting' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# -- a reporting answer that disagrees with its question (rule 13: only money the unit can
# prove is its own) ------------------------------------------------------------------------------

MID = "887000003193"
ASKED = "KA3F9C0E12AB-9F3C0A77D21B4E551A2B3C4D"


def _row(trans_id: str, order_id: str, status: TransStatus, **fields: object) -> Transaction:
    return Transaction.model_validate({"trans_id": trans_id, "order_id": order_id, "mid": MID,
                                       "trans_status_id": int(status), "amount": 3.0, **fields})


class _Reporting:
    """Reporting that answers every question with the same rows, whatever it was asked."""

    def __init__(self, *rows: Transaction) -> None:
        self.rows = rows

    async def transactions(self, query: object, **_: object) -> AsyncIterator[Transaction]:
        for row in self.rows:
            yield row


def _reconciler(*rows: Transaction) -> Reconciler:
    return Reconciler(SimpleNamespace(reporting=_Reporting(*rows)), MID)  # type: ignore[arg-type]


async def test_a_charge_under_another_order_id_is_not_taken_for_the_one_asked_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Asked by a sale's order id, reporting answered a row of another sale (another unit's
    # charge of the same amount, a filter it dropped, a next page's link that lost the filter).
    # Found, it was given back as the sale's own: another customer's money moved.
    other = _row("700000000009", "KA3F9C0E12AB-0000000000000001DEADBEEF", TransStatus.CAPTURED)
    lookup = await _reconciler(other).find_charge([ASKED])
    assert not lookup.approved
    assert lookup.trans_id is None
    assert f"reporting answered 1 row(s) that are not {ASKED}: left out" in caplog.text
    mine = _row("700000000001", ASKED, TransStatus.AUTHORIZED)
    found = await _reconciler(other, mine).find_charge([ASKED])
    assert (found.approved, found.trans_id) == (True, "700000000001")


async def test_a_charge_of_another_merchant_under_the_same_order_id_is_not_taken() -> None:
    theirs = _row("700000000009", ASKED, TransStatus.CAPTURED, mid="887000009999")
    lookup = await _reconciler(theirs).find_charge([ASKED])
    assert not lookup.approved
    assert not lookup.reversed


async def test_a_transaction_asked_by_its_id_is_read_only_from_its_own_row() -> None:
    other = _row("700000000009", ASKED, TransStatus.CAPTURED)
    state = await _reconciler(other).transaction_state("700000000001")
    assert not state.known
    assert not state.captured
    # a give-back's row names the charge it gave back; another's is not this one's
    voided = _row("700000000001", ASKED, TransStatus.VOIDED)
    stranger = _row("700000000010", "x", TransStatus.VOIDED, related_trans_id="700000000005")
    given_back = await _reconciler(voided, stranger).transaction_state("700000000001")
    assert given_back.known
    assert given_back.reversed
    assert given_back.reverse_trans_id == "700000000001"  # no row of its give-back: its own id


@pytest.mark.parametrize("written", [" {}", "00{}", "{} ", "{}"], ids=["space", "zeros",
                                                                     "trailing", "same"])
async def test_a_transaction_written_otherwise_is_compared_as_the_charge_check_does(
    written: str,
) -> None:
    """Asked by its trans id, reporting wrote the charge otherwise (a string: whitespace,
    leading zeros): it is the one asked about (reconcile.trans_key, the charge check's
    comparison too), and its refund, whose row names it otherwise, is a refund."""
    charge = _row(written.format("700000000001"), ASKED, TransStatus.REFUNDED)
    refund = _row("700000000002", ASKED, TransStatus.REFUND,
                  related_trans_id=written.format("700000000001"))
    state = await _reconciler(charge, refund).transaction_state("700000000001")
    assert state.known
    assert state.reversed
    assert state.refunded
    assert state.reverse_trans_id == "700000000002"
    assert trans_key(written.format("700000000001")) == trans_key("700000000001")
    assert trans_key("700000000001") != trans_key("700000000002")


async def test_a_refund_is_a_refund_by_its_status_when_its_row_is_not_shown() -> None:
    """Reporting shows the charge refunded but not (yet) the refund's own row: still a
    refund, never read as a void (which releases the whole hold)."""
    charge = _row("700000000001", ASKED, TransStatus.REFUNDED)
    state = await _reconciler(charge).transaction_state("700000000001")
    assert (state.reversed, state.refunded) == (True, True)
    voided = await _reconciler(_row("700000000001", ASKED, TransStatus.VOIDED)).transaction_state(
        "700000000001")
    assert (voided.reversed, voided.refunded) == (True, False)


# -- attacked with any reporting answer: what a lookup takes for the sale's is provably its own --

_ORDER_IDS = st.sampled_from([ASKED, f"{ASKED}-2", "KA3F9C0E12AB-0000000000000001DEADBEEF",
                              "someone-at-the-terminal", ""])
_TRANS_IDS = st.sampled_from(["700000000001", " 0700000000001", "700000000002",
                              "7000000000010", "T-1", ""])
_ROWS = st.lists(st.builds(
    lambda trans_id, order_id, status, mid, cents, related: Transaction.model_validate({
        "trans_id": trans_id, "order_id": order_id, "mid": mid, "trans_status_id": status,
        "amount": cents / 100, "related_trans_id": related}),
    _TRANS_IDS, _ORDER_IDS, st.sampled_from([*map(int, TransStatus), 0, 42]),
    st.sampled_from([MID, "887000009999", ""]), st.integers(-500, 10_000),
    st.one_of(st.none(), _TRANS_IDS),
), max_size=6)


@settings(max_examples=200, deadline=None)
@given(rows=_ROWS)
async def test_whatever_reporting_answers_a_lookup_takes_only_what_was_asked_about(
    rows: list[Transaction],
) -> None:
    """Reporting answers any rows to any question (a dropped filter, another unit's, another
    merchant's, a person's charge at the terminal, ids written otherwise, unknown statuses).
    A charge found for the sale is one of its own order ids' rows of its merchant, holding money
    and no negative figure;
    "no charge" is said only when no such row could hold money or be of unknown status; a
    transaction's state is read only from its own row."""
    asked = [ASKED, f"{ASKED}-2"]
    ours = [r for r in rows if r.order_id in asked and r.mid in (MID, "")]
    found = await _reconciler(*rows).find_charge(asked)
    holding = {TransStatus.AUTHORIZED, TransStatus.CAPTURED, TransStatus.SETTLED,
               TransStatus.PARTIALLY_REFUNDED}
    if found.approved:
        assert any(r.trans_id == found.trans_id and r.status in holding
                   and r.amount_cents >= 0 for r in ours)
        assert found.amount_cents is not None
        assert found.amount_cents >= 0  # no negative figure is ever acted on
        # partly refunded: what its own refunds' rows (of the merchant) gave back before,
        # more than nothing and less than the charge
        before = found.refunded_before_cents
        refunds = [r for r in rows if r.status is TransStatus.REFUND and r.mid in (MID, "")
                   and trans_key(r.related_trans_id) == trans_key(found.trans_id)]
        assert before == 0 or (0 < before < found.amount_cents
                               and before == sum(r.amount_cents for r in refunds))
    elif not found.unknown:
        assert not any(r.status in holding or r.status is None for r in ours)
    if found.reversed:
        assert any(r.trans_id == found.trans_id and r.status in _REVERSED for r in ours)
    state = await _reconciler(*rows).transaction_state("700000000001")
    own = [r for r in rows if trans_key(r.trans_id) == trans_key("700000000001")
           and r.mid in (MID, "")]
    assert state.known == (bool(own) and own[0].amount_cents >= 0)
    if state.known:
        first = own[0]
        assert state.captured == (first.status in (TransStatus.CAPTURED, TransStatus.SETTLED))
        assert state.refunded == (first.status is TransStatus.REFUNDED)
        if state.reverse_trans_id is not None:
            # a refund's own row, else (a void, or its row not shown) the charge's own id
            assert state.reverse_trans_id in {*(r.trans_id for r in rows), "700000000001"}


async def test_a_charge_found_partly_refunded_names_what_its_refunds_gave_back() -> None:
    """A $3.00 charge under the sale's order id, partly refunded: its refund's row ($1.00,
    naming it) is what was given back before the agent looked; the rest is held."""
    charge = _row("700000000001", ASKED, TransStatus.PARTIALLY_REFUNDED, amount=3.00)
    refund = _row("700000000002", ASKED, TransStatus.REFUND, amount=1.00,
                  related_trans_id="700000000001")
    found = await _reconciler(charge, refund).find_charge([ASKED])
    assert (found.approved, found.trans_id) == (True, "700000000001")
    assert (found.amount_cents, found.refunded_before_cents) == (300, 100)


@pytest.mark.parametrize("refunded", [[], [3.00], [2.00, 1.50]])
async def test_a_charge_partly_refunded_whose_refunds_do_not_say_so_decides_nothing(
    refunded: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    """Partly refunded, and its refunds' rows give back nothing, or all of it or more: what
    it still holds cannot be told, so the lookup says unknown and a person decides."""
    charge = _row("700000000001", ASKED, TransStatus.PARTIALLY_REFUNDED, amount=3.00)
    refunds = [_row(f"70000000001{n}", ASKED, TransStatus.REFUND, amount=amount,
                    related_trans_id="700000000001") for n, amount in enumerate(refunded)]
    found = await _reconciler(charge, *refunds).find_charge([ASKED])
    assert found.unknown
    assert not found.approved
    assert "partly refunded" in caplog.text
