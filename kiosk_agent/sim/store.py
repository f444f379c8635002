"""One SQLite database for all simulator state.

``:memory:`` by default; with a data directory it is ``<data_dir>/sim.db`` in WAL mode, so a
restarted simulator loses nothing. Each simulator module creates its own tables here: plain
tables where it needs to filter (the ledger), or a :class:`Documents` collection of JSON
records where it only needs get/put by id (vault accounts, plans, interactions, ...).

The simulator runs on one event loop and SQLite answers in microseconds, so calls are made
directly from handlers rather than through a thread pool.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

DB_NAME = "sim.db"
Params = Sequence[Any] | Mapping[str, Any]


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

    def rows(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        return [dict(row) for row in self._conn.execute(sql, params)]

    def row(self, sql: str, params: Params = ()) -> dict[str, Any] | None:
        found = self._conn.execute(sql, params).fetchone()
        return None if found is None else dict(found)

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
        with self.transaction():
            value = int(self.get_meta(f"seq:{sequence}", start - 1)) + 1
            self.set_meta(f"seq:{sequence}", value)
        return value

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
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT * FROM {table}{where} ORDER BY {order_by} LIMIT ? OFFSET ?"  # noqa: S608
        found = self.rows(sql, [*params, limit + 1, offset])
        return found[:limit], len(found) > limit


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
