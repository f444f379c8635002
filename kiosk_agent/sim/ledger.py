"""The transaction ledger: one row per charge, capture, void and refund, as reporting shows it.

Rows carry the fields of the interface's Transaction resource. Amounts are kept as integer
cents (``amount_cents``) and turned into the reporting interface's dollars only by
:func:`transaction_resource`. Payments and the terminal write here; reporting reads through
:meth:`Ledger.query`; settlement moves captured rows into a batch and makes deposits.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from decimal import Decimal
from operator import itemgetter
from typing import Any

from kiosk_agent.money import cents_to_decimal
from kiosk_agent.service.models.reporting import TransStatus
from kiosk_agent.sim.clock import VirtualClock
from kiosk_agent.sim.store import (
    IdSequence,
    JsonPage,
    JsonPager,
    Store,
    UnknownFieldError,
    dollars_sql,
    json_object_sql,
    record_json_sql,
    record_resource,
    stored_filters,
)

# The ledger's id sequences. The seeded data set reserves blocks from them, so ids made later
# by live charges and settlements never collide with seeded ones.
TRANS_IDS = IdSequence("trans_id", 700000000001)
BATCH_IDS = IdSequence("batch_id", 500001)
FUNDING_IDS = IdSequence("funding_master_id", 90001)
DEPOSIT_IDS = IdSequence("deposit_id", 3000001)


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
"""
# Secondary indexes: the lookups of payments (trans_id, order) and the common reporting filters.
_TRANSACTION_INDEXES = {
    "transactions_trans_id": "UNIQUE INDEX IF NOT EXISTS transactions_trans_id "
    "ON transactions (trans_id)",
    "transactions_order_id": "INDEX IF NOT EXISTS transactions_order_id "
    "ON transactions (order_id, mid)",
    "transactions_mid": "INDEX IF NOT EXISTS transactions_mid ON transactions (mid)",
    "transactions_status": "INDEX IF NOT EXISTS transactions_status "
    "ON transactions (trans_status_id)",
    "transactions_batch": "INDEX IF NOT EXISTS transactions_batch ON transactions (batch_id)",
    "transactions_funding": "INDEX IF NOT EXISTS transactions_funding "
    "ON transactions (funding_master_id)",
}

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

# The resources as SQLite writes them for reporting pages: the same fields, in the same order
# and with the same values as transaction_resource() and deposit_resource() below.
TRANSACTION_JSON = json_object_sql(
    [
        *((name, name) for name in (*TEXT_FIELDS, *INT_FIELDS)),
        ("amount", dollars_sql("amount_cents")),
        *((name, f"json({name})") for name in DECIMAL_FIELDS),
    ]
)
DEPOSIT_JSON = record_json_sql(DEPOSIT_FIELDS)


class Ledger:
    def __init__(self, store: Store, clock: VirtualClock) -> None:
        self._store = store
        self._clock = clock
        store.create(_TRANSACTIONS_DDL)
        self._create_indexes()
        store.create(_DEPOSITS_DDL)
        self._transactions = JsonPager(
            store, "transactions", "seq", _TRANSACTION_COLUMNS, TRANSACTION_JSON
        )
        self._deposits = JsonPager(store, "deposits", "deposit_id", _DEPOSIT_COLUMNS, DEPOSIT_JSON)

    def _create_indexes(self) -> None:
        # One execute each: Store.create's executescript would commit a bulk load half way.
        for ddl in _TRANSACTION_INDEXES.values():
            self._store.execute(f"CREATE {ddl}")

    @contextlib.contextmanager
    def bulk_load(self) -> Iterator[None]:
        """Insert many rows without the secondary indexes, then build each once at the end.

        Cheaper than updating six indexes row by row; all of it is one transaction, so a
        failure leaves neither rows nor dropped indexes behind.
        """
        with self._store.transaction():
            for name in _TRANSACTION_INDEXES:
                self._store.execute(f"DROP INDEX IF EXISTS {name}")
            yield
            self._create_indexes()

    # -- writing ---------------------------------------------------------------------------
    def new_trans_id(self) -> str:
        return str(self._store.next_id(*TRANS_IDS))

    def add(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """Insert one transaction; ``trans_id`` and ``trans_date`` are filled in when absent."""
        record = dict(row)
        record.setdefault("trans_id", self.new_trans_id())
        record.setdefault("trans_date", self._clock.iso_now())
        record.setdefault("authorized_cents", record.get("amount_cents", 0))
        self._insert([record])
        return self.get(str(record["trans_id"])) or record

    def add_many(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Bulk insert (the seeded data set); each row must carry its ``trans_id``."""
        records = [
            row if "authorized_cents" in row else {**row, "authorized_cents": row["amount_cents"]}
            for row in rows
        ]
        self._insert(records)
        return len(records)

    def _insert(self, records: list[Mapping[str, Any]]) -> None:
        # One positional statement per distinct field order: the seeded rows all share one,
        # so 100,000 of them are one executemany of plain tuples.
        by_columns: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
        for record in records:
            by_columns.setdefault(tuple(record), []).append(record)
        with self._store.transaction():
            for columns, group in by_columns.items():
                unknown = set(columns) - _TRANSACTION_COLUMNS
                if unknown:
                    raise UnknownFieldError(sorted(unknown)[0])
                sql = (
                    f"INSERT INTO transactions ({', '.join(columns)}) "  # noqa: S608
                    f"VALUES ({', '.join('?' * len(columns))})"
                )
                self._store.executemany(sql, map(_values_of(columns), group))

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
        self._transactions.forget_positions()  # the row may now match other filters
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
            "transactions", _TRANSACTION_COLUMNS, stored_filters(filters, RESOURCE_FIELDS),
            limit, offset, order_by="seq",
        )  # fmt: skip

    def query_json(self, filters: Mapping[str, Any], limit: int, offset: int) -> JsonPage:
        """Like :meth:`query`, the page's items already as the resources' JSON text."""
        stored = stored_filters(filters, RESOURCE_FIELDS)
        return self._transactions.page(stored, limit, offset)

    def count(self) -> int:
        found = self._store.row("SELECT COUNT(*) AS n FROM transactions")
        return int(found["n"]) if found else 0

    def query_deposits(
        self, filters: Mapping[str, Any], limit: int, offset: int
    ) -> tuple[list[dict[str, Any]], bool]:
        return self._store.page(
            "deposits", _DEPOSIT_COLUMNS, stored_filters(filters, frozenset(DEPOSIT_FIELDS)),
            limit, offset, order_by="deposit_id",
        )  # fmt: skip

    def query_deposits_json(
        self, filters: Mapping[str, Any], limit: int, offset: int
    ) -> JsonPage:
        stored = stored_filters(filters, frozenset(DEPOSIT_FIELDS))
        return self._deposits.page(stored, limit, offset)

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
        now = self._clock.iso_now()
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
                batch_id = str(self._store.next_id(*BATCH_IDS))
                funding_master_id = f"FM{self._store.next_id(*FUNDING_IDS)}"
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
                    "deposit_id": self._store.next_id(*DEPOSIT_IDS),
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
            if settled:
                self._transactions.forget_positions()
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
    return record_resource(row, DEPOSIT_FIELDS)


def _values_of(columns: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """A record's values in ``columns`` order, as a tuple even for a single column."""
    if len(columns) == 1:
        (name,) = columns
        return lambda record: (record[name],)
    return itemgetter(*columns)


def new_order_id() -> str:
    return f"SIM-{uuid.uuid4().hex[:16].upper()}"


