"""The transaction ledger: one row per charge, capture, void and refund, as reporting shows it.

Rows carry the fields of the interface's Transaction resource. Amounts are kept as integer
cents (``amount_cents``) and turned into the reporting interface's dollars only by
:func:`transaction_resource`. Payments and the terminal write here; reporting reads through
:meth:`Ledger.query`; settlement moves captured rows into a batch and makes deposits.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from kiosk_agent.money import MoneyError, cents_to_decimal, reported_dollars_to_cents
from kiosk_agent.sim.clock import VirtualClock, iso_ms
from kiosk_agent.sim.store import Store, UnknownFieldError


class TransStatus(enum.IntEnum):
    """``trans_status_id`` values (choices.md)."""

    AUTHORIZED = 1
    CAPTURED = 2
    SETTLED = 3
    VOIDED = 4
    REFUND = 5  # the refund's own row
    DECLINED = 6
    RETRY = 7
    PARTIALLY_REFUNDED = 8
    REFUNDED = 9


CUSTOM_FIELDS = tuple(f"custom_{n:02d}" for n in range(1, 11))

# Transaction resource fields stored as they are served.
TEXT_FIELDS = (
    "trans_id", "mid", "order_id", "account_token", "auth_code", "avs_resp", "batch_id",
    "card_number", "cvv_resp", "expiration", "funded_batch_id", "funding_master_id", "name",
    "related_trans_id", "resp_code", "resp_text", "result", "settlement_date", "terminal_id",
    "trans_date", "user_identifier", *CUSTOM_FIELDS,
)  # fmt: skip
INT_FIELDS = ("card_brand_id", "trans_status_id", "vault_id")
# Reporting numbers in dollars, kept as exact decimal text.
DECIMAL_FIELDS = ("interchange_per_item", "interchange_rate")
# Present in the resource as ``amount`` (dollars); stored as cents.
RESOURCE_FIELDS = frozenset((*TEXT_FIELDS, *INT_FIELDS, *DECIMAL_FIELDS, "amount"))
# Simulator bookkeeping, never served.
INTERNAL_FIELDS = ("amount_cents", "authorized_cents", "refunded_cents", "currency")

_TRANSACTIONS_DDL = f"""
CREATE TABLE IF NOT EXISTS transactions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    {", ".join(f"{name} TEXT" for name in TEXT_FIELDS)},
    {", ".join(f"{name} INTEGER" for name in INT_FIELDS)},
    {", ".join(f"{name} TEXT" for name in DECIMAL_FIELDS)},
    amount_cents INTEGER NOT NULL,
    authorized_cents INTEGER NOT NULL DEFAULT 0,
    refunded_cents INTEGER NOT NULL DEFAULT 0,
    currency TEXT NOT NULL DEFAULT 'USD'
);
CREATE UNIQUE INDEX IF NOT EXISTS transactions_trans_id ON transactions (trans_id);
CREATE INDEX IF NOT EXISTS transactions_order_id ON transactions (order_id, mid);
CREATE INDEX IF NOT EXISTS transactions_mid ON transactions (mid);
CREATE INDEX IF NOT EXISTS transactions_status ON transactions (trans_status_id);
CREATE INDEX IF NOT EXISTS transactions_batch ON transactions (batch_id);
CREATE INDEX IF NOT EXISTS transactions_funding ON transactions (funding_master_id);
"""

DEPOSIT_FIELDS = (
    "deposit_id", "mid", "deposit_date", "amount", "transaction_count", "batch_id",
    "funding_master_id", "status",
)  # fmt: skip
_DEPOSITS_DDL = """
CREATE TABLE IF NOT EXISTS deposits (
    deposit_id INTEGER PRIMARY KEY,
    mid TEXT NOT NULL,
    deposit_date TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    transaction_count INTEGER NOT NULL,
    batch_id TEXT NOT NULL,
    funding_master_id TEXT NOT NULL,
    status TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS deposits_mid ON deposits (mid);
"""
_DEPOSIT_COLUMNS = frozenset((*DEPOSIT_FIELDS, "amount_cents"))
_TRANSACTION_COLUMNS = frozenset((*TEXT_FIELDS, *INT_FIELDS, *DECIMAL_FIELDS, *INTERNAL_FIELDS))


class Ledger:
    def __init__(self, store: Store, clock: VirtualClock) -> None:
        self._store = store
        self._clock = clock
        store.create(_TRANSACTIONS_DDL)
        store.create(_DEPOSITS_DDL)

    # -- writing ---------------------------------------------------------------------------
    def new_trans_id(self) -> str:
        return str(self._store.next_id("trans_id", start=700000000001))

    def add(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """Insert one transaction; ``trans_id`` and ``trans_date`` are filled in when absent."""
        record = dict(row)
        record.setdefault("trans_id", self.new_trans_id())
        record.setdefault("trans_date", iso_ms(self._clock.time()))
        record.setdefault("authorized_cents", record.get("amount_cents", 0))
        self._insert([record])
        return self.get(str(record["trans_id"])) or record

    def add_many(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Bulk insert (the seeded data set); each row must carry its ``trans_id``."""
        records = [dict(row) for row in rows]
        for record in records:
            record.setdefault("authorized_cents", record.get("amount_cents", 0))
        self._insert(records)
        return len(records)

    def _insert(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        for record in records:
            unknown = set(record) - _TRANSACTION_COLUMNS
            if unknown:
                raise UnknownFieldError(sorted(unknown)[0])
        # One statement per distinct column set keeps executemany fast for uniform bulk rows.
        by_columns: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for record in records:
            by_columns.setdefault(tuple(sorted(record)), []).append(record)
        with self._store.transaction():
            for columns, group in by_columns.items():
                sql = (
                    f"INSERT INTO transactions ({', '.join(columns)}) "  # noqa: S608
                    f"VALUES ({', '.join(':' + name for name in columns)})"
                )
                self._store.executemany(sql, group)

    def get(self, trans_id: str) -> dict[str, Any] | None:
        return self._store.row("SELECT * FROM transactions WHERE trans_id = ?", (trans_id,))

    def find_order(self, mid: str, order_id: str) -> list[dict[str, Any]]:
        """Every row of one order, oldest first (charges, then their voids and refunds)."""
        return self._store.rows(
            "SELECT * FROM transactions WHERE mid = ? AND order_id = ? ORDER BY seq",
            (mid, order_id),
        )

    def update(self, trans_id: str, **changes: Any) -> dict[str, Any]:
        unknown = set(changes) - _TRANSACTION_COLUMNS
        if unknown:
            raise UnknownFieldError(sorted(unknown)[0])
        assignments = ", ".join(f"{name} = :{name}" for name in changes)
        self._store.execute(
            f"UPDATE transactions SET {assignments} WHERE trans_id = :trans_id",  # noqa: S608
            {**changes, "trans_id": trans_id},
        )
        updated = self.get(trans_id)
        if updated is None:
            raise KeyError(trans_id)
        return updated

    # -- reading (reporting) ---------------------------------------------------------------
    def query(
        self, filters: Mapping[str, Any], limit: int, offset: int
    ) -> tuple[list[dict[str, Any]], bool]:
        """Transactions matching every ``filters`` equality, as stored rows, plus has_more.

        Filter names are Transaction resource attributes; ``amount`` is in dollars as reporting
        sends it. An unknown attribute raises :class:`UnknownFieldError`; a bad amount
        :class:`MoneyError`.
        """
        return self._store.page(
            "transactions", _TRANSACTION_COLUMNS, _stored_filters(filters, RESOURCE_FIELDS),
            limit, offset, order_by="seq",
        )  # fmt: skip

    def count(self) -> int:
        found = self._store.row("SELECT COUNT(*) AS n FROM transactions")
        return int(found["n"]) if found else 0

    def query_deposits(
        self, filters: Mapping[str, Any], limit: int, offset: int
    ) -> tuple[list[dict[str, Any]], bool]:
        return self._store.page(
            "deposits", _DEPOSIT_COLUMNS, _stored_filters(filters, frozenset(DEPOSIT_FIELDS)),
            limit, offset, order_by="deposit_id",
        )  # fmt: skip

    def add_deposits(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Bulk insert deposits (the seeded data set); amounts in ``amount_cents``."""
        self._store.executemany(
            "INSERT INTO deposits (deposit_id, mid, deposit_date, amount_cents, "
            "transaction_count, batch_id, funding_master_id, status) VALUES (:deposit_id, :mid, "
            ":deposit_date, :amount_cents, :transaction_count, :batch_id, :funding_master_id, "
            ":status)",
            rows,
        )

    # -- settlement ------------------------------------------------------------------------
    def settle_open_batch(self) -> tuple[int, list[dict[str, Any]]]:
        """Settle every captured transaction and unsettled refund; one deposit per merchant.

        Returns the number of transactions settled and the new deposit rows.
        """
        now = iso_ms(self._clock.time())
        deposits: list[dict[str, Any]] = []
        settled = 0
        with self._store.transaction():
            open_rows = self._store.rows(
                "SELECT trans_id, mid, amount_cents, trans_status_id FROM transactions "
                "WHERE batch_id IS NULL AND trans_status_id IN (?, ?) ORDER BY seq",
                (TransStatus.CAPTURED, TransStatus.REFUND),
            )
            by_mid: dict[str, list[dict[str, Any]]] = {}
            for row in open_rows:
                by_mid.setdefault(row["mid"], []).append(row)
            for mid, rows in sorted(by_mid.items()):
                batch_id = str(self._store.next_id("batch_id", start=500001))
                funding_master_id = f"FM{self._store.next_id('funding_master_id', start=90001)}"
                net = 0
                for row in rows:
                    is_refund = row["trans_status_id"] == TransStatus.REFUND
                    net += -row["amount_cents"] if is_refund else row["amount_cents"]
                    self._store.execute(
                        "UPDATE transactions SET batch_id = ?, funded_batch_id = ?, "
                        "funding_master_id = ?, settlement_date = ?, trans_status_id = ? "
                        "WHERE trans_id = ?",
                        (
                            batch_id, batch_id, funding_master_id, now,
                            TransStatus.REFUND if is_refund else TransStatus.SETTLED,
                            row["trans_id"],
                        ),
                    )  # fmt: skip
                deposit = {
                    "deposit_id": self._store.next_id("deposit_id", start=3000001),
                    "mid": mid,
                    "deposit_date": now,
                    "amount_cents": net,
                    "transaction_count": len(rows),
                    "batch_id": batch_id,
                    "funding_master_id": funding_master_id,
                    "status": "FUNDED",
                }
                self.add_deposits([deposit])
                deposits.append(deposit)
                settled += len(rows)
        return settled, deposits


def transaction_resource(row: Mapping[str, Any]) -> dict[str, Any]:
    """A stored row as the reporting interface serves it: ``amount`` in dollars (Decimal)."""
    resource: dict[str, Any] = {name: row.get(name) for name in (*TEXT_FIELDS, *INT_FIELDS)}
    resource["amount"] = cents_to_decimal(int(row["amount_cents"]))
    for name in DECIMAL_FIELDS:
        value = row.get(name)
        resource[name] = None if value is None else Decimal(value)
    return resource


def deposit_resource(row: Mapping[str, Any]) -> dict[str, Any]:
    resource = {name: row[name] for name in DEPOSIT_FIELDS if name != "amount"}
    resource["amount"] = cents_to_decimal(int(row["amount_cents"]))
    return resource


def new_order_id() -> str:
    return f"SIM-{uuid.uuid4().hex[:16].upper()}"


def _stored_filters(filters: Mapping[str, Any], allowed: frozenset[str]) -> dict[str, Any]:
    stored: dict[str, Any] = {}
    for name, value in filters.items():
        if name not in allowed:
            raise UnknownFieldError(name)
        if name == "amount":
            if value is None:
                raise MoneyError("amount filter must be a number")
            stored["amount_cents"] = reported_dollars_to_cents(value)
        else:
            stored[name] = value
    return stored
