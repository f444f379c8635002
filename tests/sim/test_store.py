import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.money import cents_to_decimal
from kiosk_agent.sim.store import (
    JsonPage,
    JsonPager,
    Store,
    UnknownFieldError,
    dollars_sql,
    json_object_sql,
)


def test_documents_round_trip_and_survive_a_reopen(tmp_path: Path) -> None:
    store = Store(tmp_path)
    plans = store.documents("plans")
    plans.put(1, {"name": "gold", "status": "ACTIVE"})
    plans.put(2, {"name": "silver", "status": "CANCELLED"})
    plans.put(1, {"name": "gold", "status": "PAUSED"})
    assert store.next_id("plan") == 1
    assert store.next_id("plan") == 2
    store.close()

    reopened = Store(tmp_path)
    plans = reopened.documents("plans")
    assert plans.get(1) == {"name": "gold", "status": "PAUSED"}
    assert [p["name"] for p in plans.all()] == ["gold", "silver"]
    assert plans.find("status", "CANCELLED") == [{"name": "silver", "status": "CANCELLED"}]
    assert len(plans) == 2
    assert reopened.next_id("plan") == 3
    assert (tmp_path / "sim.db").exists()
    reopened.close()


def test_memory_store_is_not_persistent() -> None:
    store = Store()
    assert not store.persistent
    store.set_meta("k", {"a": 1})
    assert store.get_meta("k") == {"a": 1}
    assert store.get_meta("missing", 7) == 7


def test_page_filters_and_reports_more() -> None:
    store = Store()
    store.create("CREATE TABLE t (id INTEGER PRIMARY KEY, colour TEXT)")
    store.executemany("INSERT INTO t (colour) VALUES (?)", [("red",), ("blue",), ("red",)] * 2)
    rows, more = store.page("t", {"id", "colour"}, {"colour": "red"}, limit=3, offset=0)
    assert [r["colour"] for r in rows] == ["red"] * 3
    assert more
    rows, more = store.page("t", {"id", "colour"}, {"colour": "red"}, limit=3, offset=3)
    assert len(rows) == 1
    assert not more
    with pytest.raises(UnknownFieldError, match="'shape'"):
        store.page("t", {"id", "colour"}, {"shape": "x"}, limit=3, offset=0)


def test_a_failed_transaction_leaves_nothing() -> None:
    store = Store()
    store.create("CREATE TABLE t (id INTEGER PRIMARY KEY)")

    def insert_then_fail() -> None:
        with store.transaction():
            store.execute("INSERT INTO t (id) VALUES (1)")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        insert_then_fail()
    assert store.rows("SELECT * FROM t") == []


def test_reserve_takes_consecutive_blocks_from_the_start_value() -> None:
    store = Store()
    assert store.reserve("ticket", 10, start=500) == 500
    assert store.reserve("ticket", 5, start=500) == 510
    assert store.next_id("ticket", start=500) == 515


@pytest.mark.parametrize("cents", [0, 1, 9, 10, 99, 100, 1250, -1, -50, -995, -100000, 10**13 + 7])
def test_dollars_sql_writes_what_cents_to_decimal_says(cents: int) -> None:
    store = Store()
    (text,) = store.tuples(f"SELECT {dollars_sql('?1')}", (cents,))[0]
    assert json.loads(text, parse_float=Decimal) == cents_to_decimal(cents)
    assert text == f"{cents_to_decimal(cents):f}"  # the exact text, two places


def colour_pager(rows: int) -> tuple[Store, JsonPager]:
    store = Store()
    store.create("CREATE TABLE t (id INTEGER PRIMARY KEY, colour TEXT, cents INTEGER)")
    store.executemany(
        "INSERT INTO t (colour, cents) VALUES (?, ?)",
        [("red" if n % 3 else "blue", n * 5) for n in range(rows)],
    )
    item = json_object_sql([("id", "id"), ("colour", "colour"), ("amount", dollars_sql("cents"))])
    return store, JsonPager(store, "t", "id", {"id", "colour", "cents"}, item)


def walk(pager: JsonPager, filters: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """Every item by offset, the way an ORDS client follows its next links."""
    items: list[dict[str, Any]] = []
    while True:
        page = pager.page(filters, limit, len(items))
        found = json.loads(page.items, parse_float=Decimal)
        assert page.count == len(found)
        items.extend(found)
        if not page.has_more:
            return items


def test_json_pager_pages_as_sqlite_writes_them() -> None:
    _, pager = colour_pager(10)
    page = pager.page({"colour": "blue"}, limit=2, offset=1)
    assert json.loads(page.items, parse_float=Decimal) == [
        {"id": 4, "colour": "blue", "amount": Decimal("0.15")},
        {"id": 7, "colour": "blue", "amount": Decimal("0.30")},
    ]
    assert (page.count, page.has_more) == (2, True)
    last = pager.page({"colour": "blue"}, limit=2, offset=3)
    assert last.items == '[{"id":10,"colour":"blue","amount":0.45}]'
    assert (last.count, last.has_more) == (1, False)
    assert pager.page({}, limit=5, offset=50) == JsonPage("[]", 0, False)
    with pytest.raises(UnknownFieldError, match="'shape'"):
        pager.page({"shape": "x"}, limit=3, offset=0)


def test_json_pager_sequential_walk_matches_offsets_while_rows_are_appended() -> None:
    store, pager = colour_pager(50)
    walked = walk(pager, {"colour": "red"}, limit=7)
    assert [item["id"] for item in walked] == [n + 1 for n in range(50) if n % 3]

    # Rows appended after a walk sort after every remembered position: a second walk over
    # the same offsets (now keyset lookups) still agrees with a fresh OFFSET query.
    store.execute("INSERT INTO t (colour, cents) VALUES ('red', 1)")
    again = walk(pager, {"colour": "red"}, limit=7)
    assert again[:-1] == walked
    assert again[-1]["id"] == 51
    fresh = JsonPager(store, "t", "id", {"id", "colour", "cents"}, "json_object('id', id)")
    for offset in range(0, len(again), 7):
        remembered = json.loads(pager.page({"colour": "red"}, 7, offset).items)
        assert [i["id"] for i in remembered] == [
            i["id"] for i in json.loads(fresh.page({"colour": "red"}, 7, offset).items)
        ]


def test_json_pager_forgets_positions_after_updates() -> None:
    store, pager = colour_pager(30)
    walk(pager, {"colour": "blue"}, limit=4)  # positions remembered for offsets 4, 8, ...
    store.execute("UPDATE t SET colour = 'blue' WHERE id = 2")  # now blue, before offset 4
    pager.forget_positions()
    ids = [item["id"] for item in json.loads(pager.page({"colour": "blue"}, 4, 4).items)]
    assert ids == [10, 13, 16, 19]  # 1, 2, 4, 7 are the first four now
