"""The seeded data set: deterministic, realistic, and consistent with itself."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.service.models.reporting import TransStatus
from kiosk_agent.sim.clock import VirtualClock, parse_iso
from kiosk_agent.sim.dataset import (
    DAY,
    MIDS,
    day_aligned_end,
    generate,
    seed_into,
)
from kiosk_agent.sim.ledger import Ledger
from kiosk_agent.sim.reporting import ReportTables
from kiosk_agent.sim.store import Store

END = day_aligned_end(1_795_000_000.0)
MASKED = re.compile(r"^\d{6}\*{5,6}\d{4}$")


def records(seed: int = 7, count: int = 3000) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for kind, row in generate(seed, count, END):
        found[kind].append(row)
    return found


@pytest.fixture(scope="module")
def data() -> dict[str, list[dict[str, Any]]]:
    return records()


def test_same_seed_same_rows_other_seed_other_rows() -> None:
    first = list(generate(3, 500, END))
    assert first == list(generate(3, 500, END))
    assert first != list(generate(4, 500, END))


def test_exactly_the_requested_number_of_transactions(data) -> None:
    assert len(data["transaction"]) == 3000
    assert len(records(count=1)["transaction"]) == 1
    assert records(count=0)["transaction"] == []


def test_rows_cover_both_mids_all_brands_and_every_status(data) -> None:
    rows = data["transaction"]
    assert {row["mid"] for row in rows} == set(MIDS)
    assert {row["card_brand_id"] for row in rows} == {1, 2, 3, 4}
    assert {row["trans_status_id"] for row in rows} == {int(s) for s in TransStatus}


def test_card_numbers_are_masked_and_dates_run_in_order(data) -> None:
    rows = data["transaction"]
    assert all(MASKED.match(row["card_number"]) for row in rows)
    dates = [parse_iso(row["trans_date"]) for row in rows]
    assert dates == sorted(dates)
    assert dates[0] >= END - 90 * DAY
    assert dates[-1] < END
    ids = [int(row["trans_id"]) for row in rows]
    assert ids == list(range(ids[0], ids[0] + len(rows)))


def test_refunds_name_their_sale_and_sum_to_its_refunded_amount(data) -> None:
    by_id = {row["trans_id"]: row for row in data["transaction"]}
    refunds = [row for row in by_id.values() if row["trans_status_id"] == TransStatus.REFUND]
    assert refunds
    for refund in refunds:
        sale = by_id[refund["related_trans_id"]]
        assert sale["order_id"] == refund["order_id"]
        assert parse_iso(refund["trans_date"]) > parse_iso(sale["trans_date"])
        assert sale["refunded_cents"] == refund["amount_cents"]
        expected = TransStatus.REFUNDED if refund["amount_cents"] == sale["amount_cents"] else (
            TransStatus.PARTIALLY_REFUNDED
        )
        assert sale["trans_status_id"] == expected
    marked = [r for r in by_id.values() if r["trans_status_id"] in (8, 9)]
    assert len(marked) == len(refunds)


def test_settled_rows_are_batched_and_deposits_add_up(data) -> None:
    rows = data["transaction"]
    net: Counter[str] = Counter()
    count: Counter[str] = Counter()
    open_from = END - DAY
    for row in rows:
        settled = row["batch_id"] is not None
        status = row["trans_status_id"]
        if status in (TransStatus.AUTHORIZED, TransStatus.CAPTURED):
            assert not settled
            assert parse_iso(row["trans_date"]) >= open_from
        if status in (TransStatus.DECLINED, TransStatus.RETRY, TransStatus.VOIDED):
            assert not settled
        if settled:
            assert parse_iso(row["settlement_date"]) > parse_iso(row["trans_date"])
            assert row["funding_master_id"].startswith("FM")
            sign = -1 if status == TransStatus.REFUND else 1
            net[row["batch_id"]] += sign * row["amount_cents"]
            count[row["batch_id"]] += 1
    deposits = data["deposit"]
    assert {d["batch_id"]: d["amount_cents"] for d in deposits} == dict(net)
    assert {d["batch_id"]: d["transaction_count"] for d in deposits} == dict(count)
    assert len({d["deposit_id"] for d in deposits}) == len(deposits)


def test_chargebacks_dispute_settled_sales_and_cost_a_fee(data) -> None:
    by_id = {row["trans_id"]: row for row in data["transaction"]}
    chargebacks = data["chargeback"]
    assert chargebacks
    for chargeback in chargebacks:
        sale = by_id[chargeback["trans_id"]]
        assert sale["batch_id"] is not None
        assert chargeback["amount_cents"] == sale["amount_cents"]
        assert chargeback["card_number"] == sale["card_number"]
        assert chargeback["status"] in ("OPEN", "WON", "LOST")
        assert parse_iso(chargeback["chargeback_date"]) < END
    fees = [a for a in data["adjustment"] if a["category"] == "chargeback_fee"]
    assert len(fees) == len(chargebacks)
    monthly = [a for a in data["adjustment"] if a["category"] == "monthly_fee"]
    assert {a["mid"] for a in monthly} == set(MIDS)
    assert all(a["amount_cents"] < 0 for a in data["adjustment"])


def test_seeding_stores_everything_and_live_ids_follow_it(tmp_path: Path) -> None:
    store = Store(tmp_path)
    clock = VirtualClock()
    ledger = Ledger(store, clock)
    tables = ReportTables(store)

    counts = seed_into(store, ledger, tables, seed=1, count=12_000, end=END)

    assert ledger.count() == 12_000 == counts["transaction"]
    # Loaded without indexes, then indexed once: every index is back, the unique one included.
    indexes = store.rows("SELECT name FROM sqlite_master WHERE type = 'index'")
    assert {"transactions_trans_id", "transactions_order_id", "transactions_mid"} <= {
        row["name"] for row in indexes
    }
    first = ledger.query({}, 1, 0)[0][0]
    assert ledger.find_order(first["mid"], first["order_id"])[0] == first
    rows, _ = ledger.query({}, 1000, 11_500)
    assert len(rows) == 500
    chargebacks, _ = tables.query_chargebacks({}, 1000, 0)
    assert len(chargebacks) == counts["chargeback"] > 0
    deposits, _ = ledger.query_deposits({}, 1000, 0)
    assert len(deposits) == counts["deposit"]
    # The seeded ids were reserved: a live charge gets the next trans_id, never a seeded one.
    last_seeded = max(int(row["trans_id"]) for row in ledger.query({}, 1000, 11_000)[0])
    assert int(ledger.new_trans_id()) == last_seeded + 1
    # Settling takes the data set's open batch (its captured rows) into new, unused batches.
    settled, new_deposits = ledger.settle_open_batch()
    assert settled > 0
    assert not {d["batch_id"] for d in new_deposits} & {d["batch_id"] for d in deposits}
    store.close()


class FailingTables(ReportTables):
    def add_chargebacks(self, rows: Any) -> None:
        raise OSError("disk full")


def test_a_seed_that_fails_half_way_leaves_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    ledger = Ledger(store, VirtualClock())

    with pytest.raises(OSError, match="disk full"):
        seed_into(store, ledger, FailingTables(store), seed=1, count=3000, end=END)

    assert ledger.count() == 0
    assert store.get_meta("seq:trans_id") is None  # the reserved id blocks are given back
    indexes = store.rows("SELECT name FROM sqlite_master WHERE type = 'index'")
    assert "transactions_trans_id" in {row["name"] for row in indexes}  # dropped, then restored
    counts = seed_into(store, ledger, ReportTables(store), seed=1, count=500, end=END)
    assert ledger.count() == counts["transaction"] == 500
    store.close()
