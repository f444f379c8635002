from decimal import Decimal

import pytest

from kiosk_agent.money import MoneyError
from kiosk_agent.sim.clock import VirtualClock
from kiosk_agent.sim.ledger import Ledger, TransStatus, transaction_resource
from kiosk_agent.sim.store import Store, UnknownFieldError


@pytest.fixture
def ledger() -> Ledger:
    return Ledger(Store(), VirtualClock())


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
