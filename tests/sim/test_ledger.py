import json
from collections.abc import Iterable
from decimal import Decimal

import pytest

from kiosk_agent.money import MoneyError
from kiosk_agent.service.models.reporting import TransStatus
from kiosk_agent.service.models.reports import ReportKind
from kiosk_agent.sim.clock import VirtualClock
from kiosk_agent.sim.dataset import day_aligned_end, seed_into
from kiosk_agent.sim.http import dumps
from kiosk_agent.sim.ledger import (
    DEPOSIT_FIELDS,
    RESOURCE_FIELDS,
    Ledger,
    deposit_resource,
    transaction_resource,
)
from kiosk_agent.sim.reporting import ADJUSTMENT_FIELDS, CHARGEBACK_FIELDS, ReportTables
from kiosk_agent.sim.store import Store, UnknownFieldError, record_resource


@pytest.fixture
def ledger() -> Ledger:
    return Ledger(Store(), VirtualClock())


@pytest.mark.parametrize(
    ("kind", "served"),
    [
        (ReportKind.TRANSACTIONS, RESOURCE_FIELDS),
        (ReportKind.DEPOSITS, DEPOSIT_FIELDS),
        (ReportKind.CHARGEBACKS, CHARGEBACK_FIELDS),
        (ReportKind.ADJUSTMENTS, ADJUSTMENT_FIELDS),
    ],
)
def test_each_record_serves_the_fields_the_client_reads(
    kind: ReportKind, served: Iterable[str]
) -> None:
    # Two lists on purpose: the simulator's are its storage schema (kept in sim.db), the client's
    # model its reading of the interface. This keeps them naming the same fields.
    assert set(served) == set(kind.model.model_fields)


def test_added_rows_are_served_in_dollars(ledger: Ledger) -> None:
    row = ledger.add(
        {"mid": "999000000001", "order_id": "o-1", "amount_cents": 1250,
         "trans_status_id": TransStatus.CAPTURED, "interchange_rate": "0.0195"}
    )  # fmt: skip
    assert row["trans_id"]
    assert row["trans_date"].endswith("Z")
    resource = transaction_resource(row)
    assert resource["amount"] == Decimal("12.50")
    assert resource["interchange_rate"] == Decimal("0.0195")
    assert "amount_cents" not in resource


def test_query_by_resource_attributes_with_amount_in_dollars(ledger: Ledger) -> None:
    for cents in (100, 1250, 1250):
        ledger.add({"mid": "999000000001", "order_id": f"o-{cents}", "amount_cents": cents})
    rows, more = ledger.query({"mid": "999000000001", "amount": 12.5}, limit=1, offset=0)
    assert [r["amount_cents"] for r in rows] == [1250]
    assert more
    with pytest.raises(UnknownFieldError):
        ledger.query({"amount_cents": 100}, limit=10, offset=0)
    with pytest.raises(MoneyError):
        ledger.query({"amount": "lots"}, limit=10, offset=0)


def test_settlement_batches_captures_and_refunds_per_merchant(ledger: Ledger) -> None:
    sale = ledger.add({"mid": "m1", "amount_cents": 1000, "trans_status_id": TransStatus.CAPTURED})
    ledger.add({"mid": "m1", "amount_cents": 300, "trans_status_id": TransStatus.REFUND})
    ledger.add({"mid": "m2", "amount_cents": 500, "trans_status_id": TransStatus.CAPTURED})
    ledger.add({"mid": "m1", "amount_cents": 900, "trans_status_id": TransStatus.AUTHORIZED})
    settled, deposits = ledger.settle_open_batch()
    assert settled == 3
    assert [(d["mid"], d["amount_cents"], d["transaction_count"]) for d in deposits] == [
        ("m1", 700, 2),
        ("m2", 500, 1),
    ]
    after = ledger.get(sale["trans_id"])
    assert after is not None
    assert after["trans_status_id"] == TransStatus.SETTLED
    assert after["batch_id"] == deposits[0]["batch_id"]
    assert ledger.settle_open_batch() == (0, [])
    rows, _ = ledger.query_deposits({"mid": "m2"}, limit=5, offset=0)
    assert rows[0]["amount_cents"] == 500


def test_json_pages_are_byte_for_byte_the_resources(ledger: Ledger) -> None:
    """SQLite writes reporting pages; they say exactly what transaction_resource() says."""
    tables = ReportTables(ledger._store)
    seed_into(ledger._store, ledger, tables, seed=3, count=400, end=day_aligned_end(1.8e9))
    ledger.add({"mid": "999000000001", "amount_cents": 5, "interchange_rate": "0.0195"})
    ledger.add({"mid": "999000000001", "amount_cents": 100000, "custom_03": 'quote " \\ é'})

    rows, _ = ledger.query({}, limit=1000, offset=0)
    page = ledger.query_json({}, limit=1000, offset=0)
    assert page.count == 402
    # SQLite writes UTF-8 where json.dumps escapes: the last row is equal, not identical.
    expected = [transaction_resource(row) for row in rows]
    assert page.items.startswith(dumps(expected[:-1])[:-1] + ",")
    assert json.loads(page.items, parse_float=Decimal)[-1] == json.loads(
        dumps(expected[-1]), parse_float=Decimal
    )

    deposits, _ = ledger.query_deposits({}, limit=1000, offset=0)
    assert ledger.query_deposits_json({}, 1000, 0).items == dumps(
        [deposit_resource(row) for row in deposits]
    )
    for fields, python, json_page in (
        (CHARGEBACK_FIELDS, tables.query_chargebacks, tables.query_chargebacks_json),
        (ADJUSTMENT_FIELDS, tables.query_adjustments, tables.query_adjustments_json),
    ):
        records, _ = python({}, 1000, 0)
        assert records
        assert json_page({}, 1000, 0).items == dumps([record_resource(r, fields) for r in records])


def test_a_settled_row_leaves_a_filtered_walk_right(ledger: Ledger) -> None:
    for n in range(6):
        ledger.add({"mid": "m1", "amount_cents": 100 + n, "trans_status_id": TransStatus.CAPTURED})
    captured = {"trans_status_id": 2}
    assert ledger.query_json(captured, 2, 0).count == 2
    assert ledger.query_json(captured, 2, 2).count == 2  # offset 4 is now remembered
    ledger.update(ledger.query(captured, 1, 0)[0][0]["trans_id"], trans_status_id=3)
    page = ledger.query_json(captured, 2, 4)  # five captured rows are left
    assert [item["amount"] for item in json.loads(page.items, parse_float=Decimal)] == [
        Decimal("1.05")
    ]
    ledger.settle_open_batch()
    assert ledger.query_json(captured, 2, 0).count == 0
