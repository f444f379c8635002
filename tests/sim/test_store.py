from pathlib import Path

import pytest

from kiosk_agent.sim.store import Store, UnknownFieldError


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
