"""One SQLite database for all simulator state.

``:memory:`` by default; with a data directory it is ``<data_dir>/sim.db`` in WAL mode, so a
restarted simulator loses nothing. Each simulator module creates its own tables here: plain
tables where it needs to filter (the ledger), or a :class:`Documents` collection of JSON
records where it only needs get/put by id (vault accounts, plans, interactions, ...).

The simulator runs on one event loop and SQLite answers in microseconds, so calls are made
directly from handlers rather than through a thread pool.

Reporting pages are the one hot read: :class:`JsonPager` has SQLite build each item's JSON text,
so a 1,000-row page never becomes Python dicts, and it turns the ORDS ``offset`` of a sequential
walk into a keyset condition (``key > last key served``) instead of skipping rows.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from kiosk_agent.money import MoneyError, cents_to_decimal, reported_dollars_to_cents

DB_NAME = "sim.db"
Params = Sequence[Any] | Mapping[str, Any]
# Offsets remembered per pager: enough for many clients walking different filters at once.
_REMEMBERED_POSITIONS = 256


class IdSequence(NamedTuple):
    """A named integer sequence of the store and its first value."""

    name: str
    start: int


class UnknownFieldError(ValueError):
    """A filter named an attribute the collection does not have."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown attribute {name!r}")
        self.name = name


class Store:
    def __init__(self, data_dir: Path | str | None = None) -> None:
        if data_dir is None:
            self.path: Path | None = None
            self._conn = sqlite3.connect(":memory:", isolation_level=None)
        else:
            directory = Path(data_dir)
            directory.mkdir(parents=True, exist_ok=True)
            self.path = directory / DB_NAME
            self._conn = sqlite3.connect(self.path, isolation_level=None)
            self._conn.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL survives a process crash; only an OS crash may lose the last commits.
            self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.row_factory = sqlite3.Row
        self._depth = 0
        self.create("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")

    @property
    def persistent(self) -> bool:
        return self.path is not None

    def close(self) -> None:
        self._conn.close()

    def create(self, ddl: str) -> None:
        """Run table/index definitions (``CREATE ... IF NOT EXISTS``)."""
        self._conn.executescript(ddl)

    def execute(self, sql: str, params: Params = ()) -> sqlite3.Cursor:
        return self._conn.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any] | Mapping[str, Any]]) -> None:
        with self.transaction():
            self._conn.executemany(sql, rows)

    def tuples(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        """Plain tuples: the cheapest form when the caller knows the columns."""
        cursor = self._conn.cursor()
        cursor.row_factory = None
        return cursor.execute(sql, params).fetchall()

    def rows(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        cursor = self._conn.cursor()
        # zip over plain tuples: several times cheaper than dict(sqlite3.Row) per row.
        cursor.row_factory = None
        found = cursor.execute(sql, params).fetchall()
        names = [column[0] for column in cursor.description or ()]
        return [dict(zip(names, values, strict=True)) for values in found]

    def row(self, sql: str, params: Params = ()) -> dict[str, Any] | None:
        """The first row only (the rest are never read)."""
        cursor = self._conn.cursor()
        cursor.row_factory = None
        values = cursor.execute(sql, params).fetchone()
        if values is None:
            return None
        return dict(zip([column[0] for column in cursor.description], values, strict=True))

    @contextlib.contextmanager
    def bulk_load(self) -> Iterator[None]:
        """One transaction for a large insert, committed without waiting for the disk.

        Only for data that can be made again (the seeded data set, loaded on a first start while
        the database holds nothing else): a process crash rolls it back, so the data set has no
        ``meta`` mark and is seeded anew; only an OS crash in that window could cost the file.
        Nested use joins the outer load.
        """
        relax = self.persistent and not self._depth  # SQLite refuses it inside a transaction
        if relax:
            self._conn.execute("PRAGMA synchronous=OFF")
        try:
            with self.transaction():
                yield
        finally:
            if relax:
                self._conn.execute("PRAGMA synchronous=NORMAL")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """All or nothing; nested use joins the outer transaction."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        else:
            self._conn.execute("COMMIT")
        finally:
            self._depth = 0

    def get_meta(self, key: str, default: Any = None) -> Any:
        found = self.row("SELECT value FROM meta WHERE key = ?", (key,))
        return default if found is None else json.loads(found["value"])

    def set_meta(self, key: str, value: Any) -> None:
        self.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, json.dumps(value)),
        )

    def next_id(self, sequence: str, start: int = 1) -> int:
        """The next integer of a named sequence (record ids the interface types as integers)."""
        return self.reserve(sequence, 1, start)

    def reserve(self, sequence: str, count: int, start: int = 1) -> int:
        """Take ``count`` consecutive integers of a named sequence; returns the first.

        ``start`` is the sequence's first value, used when nothing has been taken yet.
        """
        key = f"seq:{sequence}"
        with self.transaction():
            first = int(self.get_meta(key, start - 1)) + 1
            self.set_meta(key, first + count - 1)
        return first

    def documents(self, kind: str) -> Documents:
        return Documents(self, kind)

    def page(
        self,
        table: str,
        columns: Collection[str],
        filters: Mapping[str, Any],
        limit: int,
        offset: int,
        order_by: str = "rowid",
    ) -> tuple[list[dict[str, Any]], bool]:
        """Equality filters combined with AND, one page; also says whether more rows follow.

        ``table``, ``columns`` and ``order_by`` come from code, never from a request; filter names
        do, so each is checked against ``columns`` before it reaches the SQL text.
        """
        clauses, params = equality_clauses(filters, columns)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT * FROM {table}{where} ORDER BY {order_by} LIMIT ? OFFSET ?"  # noqa: S608
        found = self.rows(sql, [*params, limit + 1, offset])
        return found[:limit], len(found) > limit


def equality_clauses(
    filters: Mapping[str, Any], columns: Collection[str]
) -> tuple[list[str], list[Any]]:
    """SQL conditions and parameters for ``filters``; names are checked against ``columns``."""
    clauses: list[str] = []
    params: list[Any] = []
    for name, value in filters.items():
        if name not in columns:
            raise UnknownFieldError(name)
        if value is None:
            clauses.append(f"{name} IS NULL")
        else:
            clauses.append(f"{name} = ?")
            params.append(value)
    return clauses, params


def json_object_sql(fields: Iterable[tuple[str, str]]) -> str:
    """``json_object(...)`` of ``(name, SQL expression)`` pairs, in the order given.

    An expression already wrapped in ``json(...)`` is embedded as JSON (a number kept as its
    exact text); any other is a JSON string, number or null as SQLite holds it.
    """
    pairs = ", ".join(f"'{name}', {expression}" for name, expression in fields)
    return f"json_object({pairs})"


def dollars_sql(cents_column: str) -> str:
    """SQL for integer cents as an exact two-place JSON number of dollars (``-0.50``, ``12.00``).

    Integer arithmetic and text only, never a float: the same value as
    :func:`kiosk_agent.money.cents_to_decimal`, written where SQLite builds the JSON.
    """
    c = cents_column
    return (
        f"json(CASE WHEN {c} < 0 THEN '-' ELSE '' END || (abs({c}) / 100) || '.' "
        f"|| substr('0' || (abs({c}) % 100), -2))"
    )


# Reported records (transactions, deposits, chargebacks, adjustments) serve ``amount`` in dollars
# and store it as integer ``amount_cents``; the three helpers below are that one mapping.


def stored_filters(filters: Mapping[str, Any], fields: Collection[str]) -> dict[str, Any]:
    """Equalities on a record's ``fields`` as stored columns (``amount`` dollars ->
    ``amount_cents``); another name is an :class:`UnknownFieldError`."""
    stored: dict[str, Any] = {}
    for name, value in filters.items():
        if name not in fields:
            raise UnknownFieldError(name)
        if name == "amount":
            if value is None:
                raise MoneyError("amount filter must be a number")
            stored["amount_cents"] = reported_dollars_to_cents(value)
        else:
            stored[name] = value
    return stored


def record_json_sql(fields: Iterable[str]) -> str:
    """The SQL writing a stored row as :func:`record_resource` serves it."""
    return json_object_sql(
        [
            *((name, name) for name in fields if name != "amount"),
            ("amount", dollars_sql("amount_cents")),
        ]
    )


def record_resource(row: Mapping[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """A stored row as served: its ``fields``, ``amount`` in dollars (Decimal)."""
    resource = {name: row.get(name) for name in fields if name != "amount"}
    resource["amount"] = cents_to_decimal(int(row["amount_cents"]))
    return resource


@dataclass(frozen=True, slots=True)
class JsonPage:
    """One page as JSON text: ``items`` is a JSON array built by SQLite."""

    items: str
    count: int
    has_more: bool


class JsonPager:
    """Serves one table page by page, each item's JSON text made by SQLite in C.

    ``key`` is a unique integer column that orders the table and only grows (a rowid alias):
    after serving a page the pager remembers the key of its last row for the offset that
    follows it, so the next page of a sequential walk is ``key > remembered`` instead of an
    ``OFFSET`` that steps over every earlier row. Rows appended later sort after every
    remembered position and leave them right; an update may change which rows match a
    filter, so the table's owner calls :meth:`forget_positions` whenever it updates rows.
    """

    def __init__(
        self, store: Store, table: str, key: str, columns: Collection[str], item_sql: str
    ) -> None:
        self._store = store
        self._table = table
        self._key = key
        self._columns = columns
        self._select = f"SELECT {key}, {item_sql} FROM {table}"  # noqa: S608
        # (filters, offset) -> key of the last row before that offset
        self._positions: dict[tuple[tuple[tuple[str, Any], ...], int], int] = {}

    def page(self, filters: Mapping[str, Any], limit: int, offset: int) -> JsonPage:
        """Rows matching every equality in ``filters`` (stored column names), ``key`` order."""
        clauses, params = equality_clauses(filters, self._columns)
        walk = tuple(sorted(filters.items(), key=lambda item: item[0]))
        after = self._positions.get((walk, offset)) if offset else None
        if after is not None:
            clauses.append(f"{self._key} > ?")
            params.append(after)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"{self._select}{where} ORDER BY {self._key} LIMIT ?"
        params.append(limit + 1)
        if offset and after is None:
            sql += " OFFSET ?"
            params.append(offset)
        found = self._store.tuples(sql, params)
        served = found[:limit]
        if served:
            self._remember((walk, offset + len(served)), served[-1][0])
        items = f"[{','.join(item for _, item in served)}]"
        return JsonPage(items, len(served), len(found) > limit)

    def forget_positions(self) -> None:
        self._positions.clear()

    def _remember(self, position: tuple[tuple[tuple[str, Any], ...], int], key: int) -> None:
        if position not in self._positions and len(self._positions) >= _REMEMBERED_POSITIONS:
            del self._positions[next(iter(self._positions))]  # the oldest
        self._positions[position] = key


class Documents:
    """A collection of JSON records keyed by a string id, in table ``doc_<kind>``."""

    def __init__(self, store: Store, kind: str) -> None:
        if not kind.isidentifier():
            raise ValueError(f"bad collection name {kind!r}")
        self._store = store
        self._table = f"doc_{kind}"
        store.create(
            f"CREATE TABLE IF NOT EXISTS {self._table} (id TEXT PRIMARY KEY, body TEXT NOT NULL)"
        )

    def put(self, record_id: str | int, body: Mapping[str, Any]) -> None:
        # An upsert keeps the row's rowid, which therefore orders records by first storage.
        self._store.execute(
            f"INSERT INTO {self._table} (id, body) VALUES (?, ?) "  # noqa: S608
            "ON CONFLICT(id) DO UPDATE SET body = excluded.body",
            (str(record_id), json.dumps(body)),
        )

    def get(self, record_id: str | int) -> dict[str, Any] | None:
        sql = f"SELECT body FROM {self._table} WHERE id = ?"  # noqa: S608
        found = self._store.row(sql, (str(record_id),))
        return None if found is None else dict(json.loads(found["body"]))

    def delete(self, record_id: str | int) -> None:
        self._store.execute(f"DELETE FROM {self._table} WHERE id = ?", (str(record_id),))  # noqa: S608

    def all(self) -> list[dict[str, Any]]:
        """Every record, in the order first stored."""
        return [
            dict(json.loads(row["body"]))
            for row in self._store.rows(f"SELECT body FROM {self._table} ORDER BY rowid")  # noqa: S608
        ]

    def find(self, field: str, value: Any) -> list[dict[str, Any]]:
        """Records whose top-level ``field`` equals ``value``."""
        if not field.isidentifier():
            raise UnknownFieldError(field)
        sql = (
            f"SELECT body FROM {self._table} "  # noqa: S608
            f"WHERE json_extract(body, '$.{field}') = ? ORDER BY rowid"
        )
        return [dict(json.loads(row["body"])) for row in self._store.rows(sql, (value,))]

    def __len__(self) -> int:
        found = self._store.row(f"SELECT COUNT(*) AS n FROM {self._table}")  # noqa: S608
        return int(found["n"]) if found else 0
