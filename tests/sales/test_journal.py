"""The journal on disk: WAL, one transaction per step, queries for the CLI, recovery and health."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import datetime as dt
import errno
import itertools
import os
import resource
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiosk_agent import durable
from kiosk_agent.moments import parse_moment
from kiosk_agent.sales import journal as journal_module
from kiosk_agent.sales import journal_prune
from kiosk_agent.sales.clock import Anchor, FakeClock
from kiosk_agent.sales.journal import (
    ASIDE_CACHE_KIB,
    CACHE_KIB,
    CHARGE_LOOKBACK_S,
    FSYNC_SHARED_TURNS,
    UNSYNCED_STEPS,
    WAL_RESERVE_BYTES,
    WAL_ROOM_NEEDED,
    HeldStep,
    Journal,
    JournalError,
    SaleMoved,
    SaleRecord,
    integrity,
    side_files,
    transaction,
)
from kiosk_agent.sales.journal_records import replaced
from kiosk_agent.sales.kinds import SaleKind
from kiosk_agent.sales.states import SaleState, Step, TransitionRefused
from tests.helpers import PythonCalls, walk_to


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    opened = Journal(tmp_path / "var" / "journal.db")
    opened.open()
    yield opened
    opened.close()


def new_sale(n: int, **fields: object) -> SaleRecord:
    base = dict(
        sale_id=f"s{n}",
        order_id=f"KA{n:06d}",
        source="virtual:front",
        flow="charge_card",
        terminal="SIM-0001",
        amount_cents=250,
        state=SaleState.STARTED,
    )
    base.update(fields)
    return SaleRecord(**base)  # type: ignore[arg-type]


def test_the_file_is_private_and_in_wal_mode(journal: Journal) -> None:
    assert stat.S_IMODE(journal.path.stat().st_mode) == 0o600
    assert journal.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert journal.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_a_step_is_visible_to_another_connection_as_soon_as_it_returns(journal: Journal) -> None:
    sale = journal.create(new_sale(1))
    sale = journal.record(
        sale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING, detail={"order_id": sale.order_id}
    )
    other = sqlite3.connect(journal.path)  # what a crash would leave: only committed rows
    state, steps = other.execute(
        "SELECT state, (SELECT COUNT(*) FROM steps WHERE sale_id = 's1') FROM sales"
    ).fetchone()
    other.close()
    assert (state, steps) == ("charging", 2)


def test_record_returns_the_updated_sale_and_keeps_every_step(journal: Journal) -> None:
    sale = journal.create(new_sale(1))
    sale = journal.record(sale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
    sale = journal.record(sale, Step.CHARGE_CARD_ACCEPTED, interaction_id="ix-1")
    sale = journal.record(sale, Step.DISPENSE_REQUEST, SaleState.DISPENSING, trans_id="T1")
    sale = journal.record(
        sale, Step.COMPLETED, SaleState.COMPLETED, captured_cents=250, message="paid"
    )
    assert journal.get("s1") == sale
    assert sale.finished_at is not None
    assert [s.step for s in journal.steps("s1")] == [
        "created", "charge_card.request", "charge_card.accepted", "dispense.request", "completed"
    ]
    assert journal.by_order_id("KA000001") == sale


def test_secret_detail_keys_never_reach_the_file(journal: Journal) -> None:
    sale = journal.create(new_sale(1))
    secret = {"token": "tok_secret_card", "last_four": "4242"}
    journal.record(sale, Step.READ_CARD_DONE, detail=secret)
    journal.close()
    assert b"tok_secret_card" not in journal.path.read_bytes()
    journal.open()
    assert journal.steps("s1")[-1].detail == {"last_four": "4242"}


def test_a_step_is_one_update_and_one_insert_in_its_transaction(journal: Journal) -> None:
    sale = journal.create(new_sale(1))
    said: list[str] = []
    journal.db.set_trace_callback(said.append)
    sale = journal.record(sale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING,
                          detail={"order_id": sale.order_id})
    sale = journal.record(sale, Step.CHARGE_CARD_ACCEPTED, interaction_id="ix-1")
    journal.db.set_trace_callback(None)
    verbs = [s.split()[0] for s in said]
    assert verbs == ["BEGIN", "UPDATE", "INSERT", "COMMIT"] * 2


def test_a_steps_detail_is_stored_sorted_without_forbidden_keys(journal: Journal) -> None:
    sale = journal.create(new_sale(1))
    sale = journal.record(sale, Step.READ_CARD_DONE, detail={"b": 1, "a": dt.date(2026, 1, 2),
                                                             "secret": "x"})
    sale = journal.record(sale, Step.READ_CARD_DONE, detail={"secret": "x"})
    sale = journal.record(sale, Step.READ_CARD_DONE)
    stored = [r[0] for r in journal.db.execute("SELECT detail FROM steps ORDER BY id")]
    assert stored == ["{}", '{"a": "2026-01-02", "b": 1}', "{}", "{}"]


@settings(max_examples=60, deadline=None)
@given(st.fixed_dictionaries({}, optional={
    "attempt": st.integers(1, 9),
    "trans_id": st.none() | st.text(max_size=8),
    "captured_cents": st.integers(0, 10**6),
    "message": st.text(max_size=20),
    "sent_mono": st.none() | st.floats(allow_nan=False),
    "state": st.sampled_from(list(SaleState)),
}))
def test_the_write_paths_replace_is_dataclasses_replace(changes: dict[str, object]) -> None:
    sale = new_sale(1, answer_by=12.5, sent_boot="boot")
    made = replaced(sale, **changes)
    assert made == dataclasses.replace(sale, **changes)  # type: ignore[arg-type]
    assert made.row() == dataclasses.replace(sale, **changes).row()  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.message = "changed"  # type: ignore[misc]


def test_unknown_fields_are_refused(journal: Journal) -> None:
    sale = journal.create(new_sale(1))
    with pytest.raises(ValueError, match="not journal fields: card_number"):
        journal.record(sale, Step.READ_CARD_DONE, card_number="4111111111111111")


def test_open_and_attention_sales_for_recovery_and_health(journal: Journal) -> None:
    first = journal.create(new_sale(1))
    journal.record(first, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
    second = journal.create(new_sale(2))
    walk_to(journal, second, SaleState.ATTENTION, Step.REVERSE_FAILED)
    third = journal.create(new_sale(3))
    walk_to(journal, third, SaleState.COMPLETED, captured_cents=175)
    assert [s.sale_id for s in journal.open_sales()] == ["s1"]
    assert [s.sale_id for s in journal.attention_sales()] == ["s2"]
    assert journal.today() == (1, 175)


def test_today_counts_the_sales_created_since_the_utc_midnight_as_since_today_lists(
    tmp_path: Path,
) -> None:
    """One rule of days (kiosk_agent.moments): a sale begun at 23:59 UTC and paid after
    midnight is the old day's, in "Sales today" as in `sales --since today`."""
    midnight = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)
    clock = FakeClock(wall=midnight.timestamp() - 60)
    journal = Journal(tmp_path / "journal.db", clock)
    journal.open()
    try:
        straddles = journal.create(new_sale(1))
        clock.step_wall(120)  # midnight passes while it is paid
        walk_to(journal, straddles, SaleState.COMPLETED, captured_cents=250)
        todays = journal.create(new_sale(2))
        walk_to(journal, todays, SaleState.COMPLETED, captured_cents=175)
        assert journal.today() == (1, 175)
        since_today = parse_moment("today", now=dt.datetime.fromtimestamp(clock.time(), dt.UTC))
        listed = journal.query(since=since_today.timestamp(), states=[SaleState.COMPLETED])
        assert [s.sale_id for s in listed] == ["s2"]
    finally:
        journal.close()


def test_order_states_reads_many_order_ids_at_once_beyond_one_statements_limit(
    journal: Journal,
) -> None:
    """The charge check's read: the sale and state of each order id the journal holds, a
    chunk of reporting's rows in one statement (more than SQLite binds in one: in parts)."""
    with journal.batch():
        for n in range(1203):
            journal.create(new_sale(n))
    walk_to(journal, journal.by_order_id("KA000007") or new_sale(7), SaleState.COMPLETED)
    asked = [f"KA{n:06d}" for n in range(0, 1203, 2)] + ["KA000007", "KA999999", "KA000000"]
    found = journal.order_states(iter(asked))  # read as it comes, each once
    assert len(found) == 603  # 602 even ones and KA000007; no KA999999
    assert found["KA000007"] == ("s7", SaleState.COMPLETED, "virtual:front", 1, None)
    assert found["KA001202"] == ("s1202", SaleState.STARTED, "virtual:front", 1, None)
    assert "KA999999" not in found
    assert journal.order_states([]) == {}


def test_the_sales_under_an_order_base_are_its_own_and_its_suffixed_forms_only(
    journal: Journal,
) -> None:
    """The charge check's read of the give-backs of one sale's order ids: the base, ``-2``,
    ``-held``; not another order id that merely starts with the same characters, nor one
    just beside it in the index, and the order id's index searched, not every sale."""
    orders = ["KA0001", "KA0001-2", "KA0001-held", "KA00011", "KA0001!", "KA0001.", "KA0000",
              "KA0002-held"]
    for n, order_id in enumerate(orders):
        journal.create(new_sale(n, order_id=order_id))
    statements: list[str] = []
    journal.db.set_trace_callback(statements.append)
    try:
        found = journal.under_order_base("KA0001")
    finally:
        journal.db.set_trace_callback(None)
    assert sorted(r.order_id for r in found) == ["KA0001", "KA0001-2", "KA0001-held"]
    assert journal.under_order_base("KA0003") == []
    [statement] = statements  # the ids bound, as run
    plan = " ".join(str(tuple(r)) for r in journal.db.execute(f"EXPLAIN QUERY PLAN {statement}"))
    assert "SEARCH sales USING INDEX" in plan, plan
    assert "SCAN sales" not in plan, plan


def test_query_filters_by_time_and_state_newest_first(journal: Journal) -> None:
    for n in range(1, 5):
        sale = journal.create(new_sale(n))
        if n % 2 == 0:
            walk_to(journal, sale, SaleState.COMPLETED)
    assert [s.sale_id for s in journal.query()] == ["s4", "s3", "s2", "s1"]
    assert [s.sale_id for s in journal.query(states=[SaleState.COMPLETED])] == ["s4", "s2"]
    assert journal.query(since=time.time() + 60) == []
    assert len(journal.query(limit=3)) == 3


def test_last_trans_id_is_the_newest_completed_sales(journal: Journal) -> None:
    assert journal.last_trans_id() is None
    walk_to(journal, journal.create(new_sale(1)), SaleState.COMPLETED, trans_id="T1")
    walk_to(journal, journal.create(new_sale(2)), SaleState.COMPLETED, trans_id="T2")
    walk_to(journal, journal.create(new_sale(3)), SaleState.REVERSED, trans_id="T3")
    enrolled = journal.create(new_sale(4, flow="enroll"))
    walk_to(journal, enrolled, SaleState.COMPLETED)
    assert journal.last_trans_id() == "T2"


def test_query_filters_by_the_last_step_in_the_same_query(journal: Journal) -> None:
    # s1 ended on "charge_card.none"; s2 passed through it and went on; s3 never did
    first = walk_to(journal, journal.create(new_sale(1)), SaleState.CHARGING)
    journal.record(first, Step.CHARGE_CARD_NONE, SaleState.FAILED)
    second = walk_to(journal, journal.create(new_sale(2)), SaleState.CHARGING)
    second = journal.record(second, Step.CHARGE_CARD_NONE)  # a step that ended nothing here
    journal.record(second, Step.CHARGE_CARD_REVERSED, SaleState.REVERSED)
    walk_to(journal, journal.create(new_sale(3)), SaleState.DECLINED)
    ended = journal.query(last_steps=[Step.CHARGE_CARD_NONE, Step.AUTHORIZE_NONE])
    assert [s.sale_id for s in ended] == [first.sale_id]
    assert journal.query(states=[SaleState.REVERSED], last_steps=[Step.CHARGE_CARD_NONE]) == []


def test_prune_keeps_open_and_attention_sales(journal: Journal) -> None:
    done = journal.create(new_sale(1))
    walk_to(journal, done, SaleState.COMPLETED)
    attention = journal.create(new_sale(2))
    walk_to(journal, attention, SaleState.ATTENTION)
    journal.create(new_sale(3))
    assert journal.prune(keep_days=1, now=time.time() + 10 * 86400) == 1
    assert {s.sale_id for s in journal.query()} == {"s2", "s3"}


DAY = 86400.0


def test_prune_never_forgets_a_sale_the_charge_check_still_sees(journal: Journal) -> None:
    """The charge check gives back every charge of its last 7 days the journal does not hold:
    with ``keep_days: 1`` a vended sale of 2 days ago, pruned, was refunded at the next start."""
    done = journal.create(new_sale(1))
    walk_to(journal, done, SaleState.COMPLETED)
    journal.create(new_sale(99))  # open, so kept: the sale of the newest step (the prune keeps it)
    assert journal.prune(keep_days=1, now=time.time() + 2 * DAY) == 0
    assert journal.prune(keep_days=1, now=time.time() + CHARGE_LOOKBACK_S - 1) == 0
    assert journal.prune(keep_days=1, now=time.time() + CHARGE_LOOKBACK_S + 1.5 * DAY) == 1


def test_prune_keeps_a_sale_dated_back_by_a_clock_not_yet_set(tmp_path: Path) -> None:
    """A unit that sold before NTP set its clock dated those sales years back; its clock now
    right, they are not old: written after a young sale, or sent on this boot."""
    clock = FakeClock(wall=1_800_000_000.0, monotonic=5_000.0)
    journal = Journal(tmp_path / "journal.db", clock)
    journal.open()
    try:
        young = journal.create(new_sale(1))
        walk_to(journal, young, SaleState.COMPLETED)
        clock.step_wall(-3 * 365 * DAY)  # the saved clock of a unit stored for years
        stale = journal.create(new_sale(2))
        walk_to(journal, stale, SaleState.COMPLETED)
        clock.step_wall(3 * 365 * DAY)  # NTP
        assert journal.prune(keep_days=400) == 0
        assert {s.sale_id for s in journal.query()} == {"s1", "s2"}
    finally:
        journal.close()


def test_prune_keeps_the_only_sale_dated_back_while_its_send_is_young_on_this_boot(
    tmp_path: Path,
) -> None:
    clock = FakeClock(wall=1_800_000_000.0 - 3 * 365 * DAY, monotonic=5_000.0)
    journal = Journal(tmp_path / "journal.db", clock)
    journal.open()
    try:
        sale = journal.create(new_sale(1))
        sent = Anchor.now(clock)
        sale = walk_to(journal, sale, SaleState.CHARGING, sent_at=sent.wall,
                       sent_mono=sent.mono, sent_boot=sent.boot)
        walk_to(journal, sale, SaleState.COMPLETED)
        clock.step_wall(3 * 365 * DAY)  # NTP
        journal.create(new_sale(99))  # open, so kept: the sale of the newest step (kept too)
        assert journal.prune(keep_days=400) == 0
        clock.reboot("fake-boot-2")  # another boot: only the wall can tell, and says old
        assert journal.prune(keep_days=400) == 1
    finally:
        journal.close()


def test_prune_deletes_in_batches_of_its_own_and_stops_when_told(journal: Journal) -> None:
    """The agent prunes in a worker thread after it is ready: a batch a transaction, on a
    connection of its own, each chosen after the last; none after ``stopping`` says so."""
    for n in range(7):
        walk_to(journal, journal.create(new_sale(n)), SaleState.COMPLETED)
    walk_to(journal, journal.create(new_sale(7)), SaleState.ATTENTION)  # kept, amid them
    later = time.time() + 30 * DAY
    transactions: list[str] = []

    def stop_after_two() -> bool:
        transactions.append("batch")
        return len(transactions) == 2

    assert journal.prune(keep_days=1, now=later, batch=2, stopping=stop_after_two) == 4
    assert len(journal.query()) == 4
    assert journal.prune(keep_days=1, now=later, batch=2) == 3
    assert [s.sale_id for s in journal.query()] == ["s7"]


def test_prune_waits_for_no_sale_running_before_each_batch_at_most_idle_wait(
    journal: Journal,
) -> None:
    """A batch holds the journal's write lock, and a sale's step waited for it with the whole
    event loop (a year's prune doubled a kiosk sale, 70 -> 170 ms): each batch begins once no
    sale runs, or after ``idle_wait`` all the same (a unit that never stops selling prunes)."""
    for n in range(6):
        walk_to(journal, journal.create(new_sale(n)), SaleState.COMPLETED)
    journal.create(new_sale(99))  # open, so kept: the sale of the newest step (the prune keeps it)
    later = time.time() + 30 * DAY
    seen: list[str] = []  # what happened, in order
    selling = iter([True, True, False, True, True, True, True, True, False])

    def idle() -> bool:
        busy = next(selling, False)
        seen.append("busy" if busy else "idle")
        return not busy

    def sleep(seconds: float) -> None:  # the thread's waits, counted (no real time passes)
        seen.append(f"sleep {seconds:g}")

    pruned = journal.prune(keep_days=1, now=later, batch=2, pause=0.02, idle=idle,
                           idle_wait=0.05, sleep=sleep)

    assert pruned == 6
    assert seen == [
        "busy", "sleep 0.02", "busy", "sleep 0.02", "idle",  # batch 1 once idle
        "sleep 0.02",  # its pause
        "busy", "sleep 0.02", "busy", "sleep 0.02", "busy", "sleep 0.02",  # 0.06 >= 0.05:
        "sleep 0.02",  # batch 2 all the same, then its pause
        "busy", "sleep 0.02", "busy", "sleep 0.02", "idle",  # batch 3 once idle
        "sleep 0.02",  # its pause
        "idle",  # the batch that finds none left
    ]
    assert [s.sale_id for s in journal.query()] == ["s99"]


def test_prune_stops_while_it_waits_for_the_sales(journal: Journal) -> None:
    walk_to(journal, journal.create(new_sale(1)), SaleState.COMPLETED)
    asked: list[str] = []

    def stopping() -> bool:
        asked.append("stopping")
        return len(asked) >= 2

    pruned = journal.prune(keep_days=1, now=time.time() + 30 * DAY, idle=lambda: False,
                           idle_wait=60.0, stopping=stopping, sleep=lambda _s: None)
    assert pruned == 0  # told to stop before any batch: the next start goes on
    assert len(journal.query()) == 1


def test_a_batch_of_the_prune_gives_way_to_the_agents_own_write(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch holds the journal's write lock; a sale that began meanwhile waited for it with
    the whole event loop (SQLite's busy wait, in sleeps of up to 100 ms: 40-680 ms at load 7-9).
    The batch rolls back at the write's word and is done again after it. Here the batch stands
    still holding the lock until the write asks: without giving way, the write waits out the
    busy timeout (5 s) and fails "database is locked". And the next batch begins only once the
    write holds the lock: begun again at once, it took the lock back while the write slept in
    its busy wait, and held it (CI, 2026-11-29)."""
    for n in range(4):
        walk_to(journal, journal.create(new_sale(n)), SaleState.COMPLETED)
    picked = journal_prune._picked
    holding = threading.Event()  # the first batch has picked its sales, the write lock held
    stood: list[bool] = []  # whether the write asked while the first batch held the lock
    write_seen: list[bool] = []  # by each batch after the first: the write was in before it

    def standing_still(db: sqlite3.Connection) -> tuple[int, tuple[float, int]]:
        if not stood:
            holding.set()
            give_up_at = time.monotonic() + 30
            while not journal._way_asked and time.monotonic() < give_up_at:
                time.sleep(0.001)
            stood.append(journal._way_asked)
            time.sleep(0.05)  # the write's busy wait sleeps longer each time it looks
        else:
            found = db.execute("SELECT COUNT(*) FROM sales WHERE sale_id = 's9'").fetchone()
            write_seen.append(found[0] == 1)
        return picked(db)

    monkeypatch.setattr(journal_prune, "_picked", standing_still)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pruning = pool.submit(journal.prune, keep_days=1, now=time.time() + 30 * DAY, batch=2)
        assert holding.wait(timeout=30)
        written = journal.create(new_sale(9))  # the agent's own write: it goes first
        assert pruning.result(timeout=60) == 4  # then the prune, whole

    assert stood == [True]
    assert write_seen == [True, True, True]  # the batch done again, the next, and the last
    assert [s.sale_id for s in journal.query()] == [written.sale_id]


def test_a_prune_gives_way_at_most_three_batches_in_a_row(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit that never stops selling still prunes: the fourth batch in a row holds its turn."""
    for n in range(2):
        walk_to(journal, journal.create(new_sale(n)), SaleState.COMPLETED)
    journal.create(new_sale(99))  # open, so kept: the sale of the newest step (the prune keeps it)
    picked = journal_prune._picked
    may_give_way: list[bool] = []  # each batch's

    def a_sale_writes_each_time(db: sqlite3.Connection) -> tuple[int, tuple[float, int]]:
        may_give_way.append(journal._pruning is not None)
        way_taken = journal.prune_gives_way()  # a sale's write, while the batch holds the lock
        if way_taken is not None:
            way_taken.set()  # as the write does once it holds the lock
        return picked(db)

    monkeypatch.setattr(journal_prune, "_picked", a_sale_writes_each_time)
    assert journal.prune(keep_days=1, now=time.time() + 30 * DAY, batch=5) == 2
    assert may_give_way == [True, True, True, False]
    assert [s.sale_id for s in journal.query()] == ["s99"]


def test_a_prunes_commit_does_not_fsync_inside_the_write_lock(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A COMMIT cannot give way: the prune's connection commits without an fsync of its own
    (synchronous=NORMAL); the agent's next commit, FULL, makes its frames durable."""
    walk_to(journal, journal.create(new_sale(1)), SaleState.COMPLETED)
    journal.create(new_sale(99))  # open, so kept: the sale of the newest step (the prune keeps it)
    connect = sqlite3.connect
    said: list[str] = []

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        db = connect(*args, **kwargs)
        db.set_trace_callback(said.append)
        return db

    monkeypatch.setattr(journal_prune.sqlite3, "connect", traced)
    assert journal.prune(keep_days=1, now=time.time() + 30 * DAY) == 1
    assert [s for s in said if "synchronous" in s] == ["PRAGMA synchronous=NORMAL"]
    assert said.index("PRAGMA synchronous=NORMAL") < said.index("BEGIN IMMEDIATE")
    monkeypatch.undo()
    assert journal.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # the agent's: FULL


def reading_a_card(journal: Journal, n: int = 1) -> SaleRecord:
    """An authorize_capture sale whose read-card request is journaled (its answer not yet)."""
    sale = journal.create(new_sale(n, flow="authorize_capture"))
    return journal.record(sale, Step.READ_CARD_REQUEST, SaleState.READING_CARD)


def test_the_card_reads_interaction_id_is_committed_without_an_fsync_of_its_own(
    journal: Journal,
) -> None:
    """The accepted step moves no money and announces no call: its one transaction runs at
    synchronous=NORMAL (no fsync: a kill keeps it, the next commit makes it durable); every
    other step, the card read and the authorization's request after it, at FULL."""
    sale = reading_a_card(journal)
    said: list[str] = []
    journal.db.set_trace_callback(said.append)
    sale = journal.record(sale, Step.READ_CARD_ACCEPTED, interaction_id="ix-1",
                          interaction_kind="read_card")
    accepted = said[:]
    with journal.batch():
        sale = journal.record(sale, Step.READ_CARD_DONE, last_four="4242")
        journal.record(sale, Step.AUTHORIZE_REQUEST, SaleState.AUTHORIZING)
    journal.db.set_trace_callback(None)
    assert accepted[0] == "PRAGMA synchronous=NORMAL"
    assert accepted[1] == "BEGIN IMMEDIATE"
    assert accepted[-2:] == ["COMMIT", "PRAGMA synchronous=FULL"]
    assert [s for s in said if "synchronous" in s] == accepted[:1] + accepted[-1:]
    assert journal.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again
    # docs/journal.md names them: the card read's id, a card-first customer's choice
    assert {Step.READ_CARD_ACCEPTED, Step.DISPENSE_CHOSEN} == UNSYNCED_STEPS
    other = sqlite3.connect(journal.path)  # committed: what a killed process leaves
    assert other.execute("SELECT interaction_id FROM sales").fetchone() == ("ix-1",)
    other.close()


def test_an_unsynced_write_that_fails_leaves_the_connection_fsyncing(
    journal: Journal,
) -> None:
    """Whether its BEGIN, its check or its COMMIT fails, the connection is FULL again after
    the accepted step's write: no later write (a money step) commits without an fsync."""
    sale = reading_a_card(journal)
    other = sqlite3.connect(journal.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock: the BEGIN fails
    journal.db.execute("PRAGMA busy_timeout=0")
    with pytest.raises(JournalError, match="locked"):
        journal.record(sale, Step.READ_CARD_ACCEPTED, interaction_id="ix-1")
    assert journal.db.execute("PRAGMA synchronous").fetchone()[0] == 2
    other.execute("UPDATE sales SET state = 'failed'")  # ... then moves the sale itself
    other.execute("COMMIT")
    other.close()
    with pytest.raises(SaleMoved):  # rolled back inside its transaction
        journal.record(sale, Step.READ_CARD_ACCEPTED, interaction_id="ix-1")
    assert journal.db.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert not journal.db.in_transaction


def test_an_unsynced_commit_that_fails_is_undone_and_fsyncs_again(journal: Journal) -> None:
    """A COMMIT that fails may leave its transaction open, where SQLite refuses to change the
    safety level: it is rolled back first, then the connection is FULL again."""
    sale = reading_a_card(journal)
    real = journal.db

    class CommitFails:  # the connection, whose COMMIT fails as a disk that went bad does
        def __init__(self) -> None:
            self.in_transaction = False

        def execute(self, sql: str, *args: Any) -> Any:
            if sql == "COMMIT":
                raise sqlite3.OperationalError("disk I/O error")
            found = real.execute(sql, *args)
            self.in_transaction = real.in_transaction
            return found

    journal._db = CommitFails()  # type: ignore[assignment]
    try:
        with pytest.raises(JournalError, match="disk I/O error"):
            journal.record(sale, Step.READ_CARD_ACCEPTED, interaction_id="ix-1")
    finally:
        journal._db = real
    assert not real.in_transaction
    assert real.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert journal.get(sale.sale_id) == sale  # nothing of it kept


class _InterruptedAfter:
    """The journal's connection, where a signal's exception (or a task's cancellation) arrives
    right after its ``nth`` statement returned (or the first ``statement``): once, the
    statement itself done."""

    def __init__(
        self,
        real: sqlite3.Connection,
        nth: int,
        interrupt: type[BaseException],
        statement: str | None = None,
    ) -> None:
        self.real, self.nth, self.interrupt, self.statement = real, nth, interrupt, statement
        self.said: list[str] = []

    @property
    def in_transaction(self) -> bool:
        return self.real.in_transaction

    @property
    def total_changes(self) -> int:
        return self.real.total_changes

    def execute(self, sql: str, *args: Any) -> Any:
        found = self.real.execute(sql, *args)
        self.said.append(sql)
        if len(self.said) == self.nth or sql == self.statement:
            self.nth, self.statement = 0, None
            raise self.interrupt()
        return found


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, asyncio.CancelledError])
def test_an_interrupt_after_any_statement_of_an_unsynced_write_leaves_the_connection_fsyncing(
    journal: Journal, interrupt: type[BaseException]
) -> None:
    """Whichever statement of the accepted step's write (NORMAL, in one transaction) an
    interrupt follows, the connection is FULL again and out of any transaction: the money step
    written next is fsynced (no PRAGMA of its own, at FULL)."""
    statements = 0
    for nth in range(1, 12):
        sale = reading_a_card(journal, nth)
        real = journal.db
        journal._db = shim = _InterruptedAfter(real, nth, interrupt)  # type: ignore[assignment]
        try:
            journal.record(sale, Step.READ_CARD_ACCEPTED, interaction_id=f"ix-{nth}")
        except interrupt:
            statements = max(statements, nth)
        finally:
            journal._db = real
        assert not real.in_transaction, shim.said
        assert real.execute("PRAGMA synchronous").fetchone()[0] == 2, shim.said
        said: list[str] = []
        real.set_trace_callback(said.append)
        journal.record(journal.get(sale.sale_id) or sale, Step.READ_CARD_CANCELLED,
                       SaleState.CANCELLED)
        real.set_trace_callback(None)
        assert not [s for s in said if "synchronous" in s]
    assert statements >= 5  # the PRAGMA, BEGIN, the write's statements, COMMIT, the PRAGMA


def test_an_interrupt_after_any_statement_of_a_money_steps_write_leaves_no_transaction_open(
    journal: Journal,
) -> None:
    """Whichever statement of a FULL write, alone or in a batch, an interrupt follows (its
    BEGIN among them), no transaction is left open on the connection: the next write goes in."""
    for nth, batched in itertools.product(range(1, 8), (False, True)):
        sale = reading_a_card(journal, nth * 2 + batched)
        real = journal.db
        journal._db = shim = _InterruptedAfter(real, nth, KeyboardInterrupt)  # type: ignore[assignment]
        alone_or_batched = journal.batch() if batched else contextlib.nullcontext()
        with contextlib.suppress(KeyboardInterrupt), alone_or_batched:
            journal.record(sale, Step.READ_CARD_DONE, last_four="4242")
        journal._db = real
        assert not real.in_transaction, shim.said
        journal.record(journal.get(sale.sale_id) or sale, Step.READ_CARD_CANCELLED,
                       SaleState.CANCELLED)


def test_an_interrupt_during_the_undoing_of_a_failed_unsynced_commit_leaves_it_fsyncing(
    journal: Journal,
) -> None:
    """The accepted step's COMMIT fails, and a signal's exception arrives as its ROLLBACK
    returns: the connection is FULL again all the same."""
    sale = reading_a_card(journal)
    real = journal.db

    class CommitFails(_InterruptedAfter):
        def execute(self, sql: str, *args: Any) -> Any:
            if sql == "COMMIT":
                raise sqlite3.OperationalError("disk I/O error")
            return super().execute(sql, *args)

    journal._db = shim = CommitFails(real, 0, KeyboardInterrupt, "ROLLBACK")  # type: ignore[assignment]
    try:
        with pytest.raises(KeyboardInterrupt):
            journal.record(sale, Step.READ_CARD_ACCEPTED, interaction_id="ix-1")
    finally:
        journal._db = real
    assert shim.said[-2:] == ["ROLLBACK", "PRAGMA synchronous=FULL"]
    assert not real.in_transaction
    assert real.execute("PRAGMA synchronous").fetchone()[0] == 2


async def test_a_shared_fsync_write_is_durable_with_another_sales_commit_in_its_turns(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync_shared(): committed at synchronous=NORMAL; fsynced() returns with the next fsynced
    commit made within FSYNC_SHARED_TURNS turns of the loop (it fdatasyncs the whole WAL), and
    the journal then makes no fsync of its own; an unsynced commit does not count."""
    flushed: list[Path] = []
    monkeypatch.setattr(journal_module, "_fdatasync", flushed.append)
    await journal.fsynced()  # nothing owed
    first, second = reading_a_card(journal, 1), reading_a_card(journal, 2)
    said: list[str] = []
    journal.db.set_trace_callback(said.append)
    with journal.fsync_shared():
        journal.record(first, Step.READ_CARD_CANCELLED, SaleState.CANCELLED)
    journal.db.set_trace_callback(None)
    assert said[0] == "PRAGMA synchronous=NORMAL"
    assert said[-1] == "PRAGMA synchronous=FULL"
    waiting = asyncio.ensure_future(journal.fsynced())
    await asyncio.sleep(0)  # it waits, counting turns
    second = journal.record(second, Step.READ_CARD_ACCEPTED, interaction_id="ix-2")
    await asyncio.sleep(0)
    assert not waiting.done()  # the accepted step fsyncs nothing either
    journal.record(second, Step.READ_CARD_DONE, last_four="4242")  # FULL: the WAL fsynced
    await asyncio.wait_for(waiting, 1)
    for _ in range(FSYNC_SHARED_TURNS + 2):
        await asyncio.sleep(0)
    assert flushed == []  # shared: no fsync of its own


async def test_a_shared_fsync_write_that_none_shares_is_fsynced_on_the_loop_after_its_turns(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushed: list[tuple[str, bool]] = []  # (file, on the loop's thread)

    def witnessed(path: Path) -> None:
        flushed.append((path.name, threading.current_thread() is threading.main_thread()))

    monkeypatch.setattr(journal_module, "_fdatasync", witnessed)
    sale = reading_a_card(journal)
    with journal.fsync_shared():
        journal.record(sale, Step.READ_CARD_CANCELLED, SaleState.CANCELLED)
    await asyncio.wait_for(journal.fsynced(), 1)
    assert flushed == [("journal.db-wal", True)]
    await journal.fsynced()  # durable now: nothing owed
    assert len(flushed) == 1


async def test_a_failed_fsync_of_a_shared_write_is_a_failed_write(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(path: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(journal_module, "_fdatasync", failing)
    told: list[JournalError | None] = []
    journal.on_write = told.append
    with journal.fsync_shared():
        journal.record(reading_a_card(journal), Step.READ_CARD_CANCELLED, SaleState.CANCELLED)
    with pytest.raises(JournalError, match="Input/output error"):
        await journal.fsynced()
    assert isinstance(told[-1], JournalError)  # the unit goes out of service on it


class FailingCommits:
    """The journal's connection, whose COMMIT fails as a disk that went bad does."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self.real = real
        self.in_transaction = False
        self.total_changes = real.total_changes

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT":
            raise sqlite3.OperationalError("disk I/O error")
        found = self.real.execute(sql, *args)
        self.in_transaction = self.real.in_transaction
        self.total_changes = self.real.total_changes
        return found


@contextlib.contextmanager
def commits_failing(journal: Journal) -> Iterator[sqlite3.Connection]:
    """Inside, the journal's every COMMIT fails as on a disk gone bad; the real connection
    (given) is put back after."""
    real = journal.db
    journal._db = FailingCommits(real)  # type: ignore[assignment]
    try:
        yield real
    finally:
        journal._db = real


def test_a_commit_that_fails_and_leaves_its_transaction_open_is_undone(journal: Journal) -> None:
    """SQLite rolls a transaction back on most errors of its COMMIT, not on all: a money
    step's (FULL) left open would refuse every later write ("cannot start a transaction within
    a transaction") until the process ends. It is rolled back, and the next write goes in."""
    sale = reading_a_card(journal)
    with commits_failing(journal) as real, pytest.raises(JournalError, match="disk I/O error"):
        journal.record(sale, Step.READ_CARD_DONE, last_four="4242")
    assert not real.in_transaction
    assert journal.get(sale.sale_id) == sale  # nothing of it kept
    written = journal.record(sale, Step.READ_CARD_DONE, last_four="4242")
    assert journal.get(sale.sale_id) == written


def test_a_transaction_whose_commit_fails_and_leaves_it_open_is_undone(journal: Journal) -> None:
    """transaction() (the agent's events, the audit store) after a COMMIT that failed and
    left its transaction open, or an interrupt after any of its statements: rolled back, so
    the journal's next write can begin."""
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"), transaction(
        FailingCommits(journal.db)
    ):
        pass
    assert not journal.db.in_transaction
    assert journal.create(new_sale(1)).state is SaleState.STARTED
    for nth in range(1, 4):  # BEGIN, the write, COMMIT
        shim = _InterruptedAfter(journal.db, nth, KeyboardInterrupt)
        with contextlib.suppress(KeyboardInterrupt), transaction(shim) as db:  # type: ignore[arg-type]
            db.execute("UPDATE sales SET message = 'interrupted'")
        assert not journal.db.in_transaction, shim.said
    assert journal.create(new_sale(2)).state is SaleState.STARTED


async def test_a_commit_that_fails_while_a_shared_write_waits_fails_it_too(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another sale's FULL commit fails while a capture request waits for its fsync: the wait
    fails as its own fsync would, and the capture is not sent. A COMMIT that fails at its
    fsync means the disk lost written pages, the waiter's among them (the WAL is one file);
    Linux reports a writeback error once, so the journal's own fdatasync after it could
    succeed over pages that were never written."""
    flushed: list[Path] = []
    monkeypatch.setattr(journal_module, "_fdatasync", flushed.append)  # would succeed
    first, second = reading_a_card(journal, 1), reading_a_card(journal, 2)
    with journal.fsync_shared():
        journal.record(first, Step.READ_CARD_CANCELLED, SaleState.CANCELLED)
    waiting = asyncio.ensure_future(journal.fsynced())
    await asyncio.sleep(0)
    with commits_failing(journal), pytest.raises(JournalError, match="disk I/O error"):
        journal.record(second, Step.READ_CARD_DONE, last_four="4242")
    with pytest.raises(JournalError, match="disk I/O error"):
        await asyncio.wait_for(waiting, 1)
    assert flushed == []  # no fsync of its own was trusted after the failure


async def test_a_busy_journal_does_not_fail_a_shared_write_that_waits(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write refused for the lock (another process holds it) touched no page: the waiter
    is made durable by the journal's own fsync as before."""
    flushed: list[Path] = []
    monkeypatch.setattr(journal_module, "_fdatasync", flushed.append)
    first, second = reading_a_card(journal, 1), reading_a_card(journal, 2)
    with journal.fsync_shared():
        journal.record(first, Step.READ_CARD_CANCELLED, SaleState.CANCELLED)
    waiting = asyncio.ensure_future(journal.fsynced())
    await asyncio.sleep(0)  # it waits
    other = sqlite3.connect(journal.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    journal.db.execute("PRAGMA busy_timeout=0")
    with pytest.raises(JournalError, match="locked"):
        journal.record(second, Step.READ_CARD_DONE, last_four="4242")
    other.execute("ROLLBACK")
    other.close()
    await asyncio.wait_for(waiting, 1)
    assert flushed == [side_files(journal.path)[0]]


async def test_a_batch_that_wrote_nothing_does_not_make_a_shared_write_durable(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A COMMIT with no page to write fsyncs nothing (SQLite syncs the WAL when it appends
    frames): the waiter still gets the journal's own fdatasync. So does one after a batch that
    rolled back, or a single write that did."""
    flushed: list[Path] = []
    monkeypatch.setattr(journal_module, "_fdatasync", flushed.append)
    first, second = reading_a_card(journal, 1), reading_a_card(journal, 2)
    with journal.fsync_shared():
        journal.record(first, Step.READ_CARD_CANCELLED, SaleState.CANCELLED)
    waiting = asyncio.ensure_future(journal.fsynced())
    await asyncio.sleep(0)
    with journal.batch():
        pass

    def a_batch_whose_caller_fails() -> None:
        with journal.batch():
            journal.record(second, Step.READ_CARD_DONE, last_four="4242")
            raise RuntimeError("the batch's caller failed")

    with pytest.raises(RuntimeError):
        a_batch_whose_caller_fails()
    with pytest.raises(TransitionRefused):  # rolled back inside its transaction
        journal.record(second, Step.COMPLETED, SaleState.COMPLETED)
    await asyncio.wait_for(waiting, 1)
    assert flushed == [side_files(journal.path)[0]]


async def test_a_shared_write_checkpointed_and_the_wal_begun_again_before_its_fsync_is_kept(
    journal: Journal,
) -> None:
    """The aside checkpoint (PASSIVE then RESTART, on a worker thread) runs between a capture
    request's NORMAL commit and its fsync, and the next commit writes the WAL from its
    beginning, over the request's frames. The request is kept all the same: a checkpoint
    fdatasyncs the WAL before it copies a frame (its connection is FULL, SQLite's default;
    checked with strace), then copies them into the database and fdatasyncs that, and SQLite
    begins the WAL again only once every frame of it is in the database. So the request is in
    the database file itself, durable before the wait ends; the waiter's own fdatasync of the
    new WAL is then one fsync more, never one less. (A power cut cannot be simulated here: the
    database file alone, read without its WAL, is what the checkpoint made durable.)"""
    journal.checkpoint_aside()
    first, second = reading_a_card(journal, 1), reading_a_card(journal, 2)
    with journal.fsync_shared():
        journal.record(first, Step.READ_CARD_CANCELLED, SaleState.CANCELLED)
    waiting = asyncio.ensure_future(journal.fsynced())
    await asyncio.to_thread(journal.checkpoint)
    journal.record(second, Step.READ_CARD_ACCEPTED, interaction_id="ix-2")  # the WAL anew
    await asyncio.wait_for(waiting, 1)
    wal = side_files(journal.path)[0]
    assert wal.stat().st_size > 0
    header = wal.read_bytes()[:32]
    assert int.from_bytes(header[12:16], "big") >= 1  # checkpoint sequence: begun again
    alone = journal.path.parent / "alone"
    alone.mkdir()
    (alone / journal.path.name).write_bytes(journal.path.read_bytes())  # no WAL beside it
    db = sqlite3.connect(alone / journal.path.name)
    try:
        rows = db.execute("SELECT sale_id, state FROM sales ORDER BY sale_id").fetchall()
    finally:
        db.close()
    assert (first.sale_id, "cancelled") in rows


async def test_a_shared_write_whose_journal_is_put_back_while_it_waits_is_kept(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal's file is removed under it (a person cleaning up) between a capture
    request's NORMAL commit and its fsync, and put back: the request was committed, so the
    copy written back (VACUUM INTO, which fsyncs what it writes) holds it, and the wait ends
    with the new file's WAL fsynced; nothing committed is left behind in the removed file."""
    flushed: list[Path] = []
    fdatasync = journal_module._fdatasync

    def witnessed(path: Path) -> None:
        flushed.append(path)
        fdatasync(path)

    monkeypatch.setattr(journal_module, "_fdatasync", witnessed)
    sale = reading_a_card(journal)
    with journal.fsync_shared():
        journal.record(sale, Step.READ_CARD_CANCELLED, SaleState.CANCELLED)
    waiting = asyncio.ensure_future(journal.fsynced())
    await asyncio.sleep(0)  # it waits
    journal.path.unlink()
    assert journal.put_back() is not None
    await asyncio.wait_for(waiting, 1)
    assert flushed == [side_files(journal.path)[0]]
    again = Journal(journal.path)
    again.open_to_read()
    try:
        kept = again.get(sale.sale_id)
    finally:
        again.close()
    assert kept is not None
    assert kept.state is SaleState.CANCELLED


async def test_a_shared_write_whose_journal_closes_while_it_waits_is_refused_and_kept(
    journal: Journal,
) -> None:
    """The journal is closed (the agent stopping) between a capture request's NORMAL commit
    and its fsync: the wait ends refused, never hanging and never claiming an fsync it did
    not see, so the capture is not sent; the request is on disk (the last connection's close
    checkpoints the WAL into the database and fsyncs it) for the next start to capture."""
    sale = reading_a_card(journal)
    with journal.fsync_shared():
        journal.record(sale, Step.READ_CARD_CANCELLED, SaleState.CANCELLED)
    told: list[JournalError | None] = []
    journal.on_write = told.append
    waiting = asyncio.ensure_future(journal.fsynced())
    await asyncio.sleep(0)  # it waits
    journal.close()
    with pytest.raises(JournalError, match="closed before an fsync"):
        await asyncio.wait_for(waiting, 1)
    assert told == []  # a stop is no fault of the disk's
    assert not side_files(journal.path)[0].exists()  # checkpointed whole at close
    journal.open()
    kept = journal.get(sale.sale_id)
    assert kept is not None
    assert kept.state is SaleState.CANCELLED


# What a connection may do while capture requests wait for their shared fsync (hypothesis).
_WAIT_OPS = ("shared", "unsynced", "full", "batch", "empty_batch", "rolled_back_batch",
             "busy", "io_error", "checkpoint", "turn")


class _SharedFsyncRun:
    """One journal on disk driven through ``ops``; ``log`` is what the disk saw, in order:
    ("normal", n) a commit with no fsync, "fsync" one that fdatasyncs the WAL (a FULL commit
    that wrote rows, the journal's own fdatasync), "io_error" a commit that failed at it."""

    def __init__(self, directory: Path, ops: list[str], log: list[str | tuple[str, int]]) -> None:
        self.journal = Journal(directory / "journal.db")
        self.journal.open()
        self.journal.checkpoint_aside()
        self.pool = [reading_a_card(self.journal, n) for n in range(len(ops) + 1)]
        self.log = log  # the journal's own fdatasyncs are logged there too
        self.log.clear()
        self.waiters: dict[int, asyncio.Future[None]] = {}  # the log's index of each one's commit

    def next_sale(self) -> SaleRecord:
        return self.pool.pop()

    async def do(self, op: str) -> None:
        journal = self.journal
        if op == "shared":
            with journal.fsync_shared():
                journal.record(self.next_sale(), Step.READ_CARD_CANCELLED, SaleState.CANCELLED)
            self.log.append(("normal", len(self.log)))
            self.waiters[len(self.log) - 1] = asyncio.ensure_future(journal.fsynced())
        elif op == "unsynced":
            journal.record(self.next_sale(), Step.READ_CARD_ACCEPTED, interaction_id="ix")
            self.log.append(("normal", len(self.log)))
        elif op == "full":
            journal.record(self.next_sale(), Step.READ_CARD_DONE, last_four="4242")
            self.log.append("fsync")
        elif op == "batch":
            with journal.batch():
                journal.record(self.next_sale(), Step.READ_CARD_DONE, last_four="4242")
            self.log.append("fsync")
        elif op == "empty_batch":
            with journal.batch():
                pass
        elif op == "rolled_back_batch":
            with contextlib.suppress(TransitionRefused), journal.batch():
                journal.record(self.pool[-1], Step.COMPLETED, SaleState.COMPLETED)
        elif op == "busy":
            self.refused_for_the_lock()
        elif op == "io_error":
            with commits_failing(journal), contextlib.suppress(JournalError):
                journal.record(self.pool[-1], Step.READ_CARD_DONE, last_four="4242")
            self.log.append("io_error")
        elif op == "checkpoint":
            journal.checkpoint()
        await asyncio.sleep(0)  # a turn of the loop after each: the waiters count them

    def refused_for_the_lock(self) -> None:
        other = sqlite3.connect(self.journal.path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        self.journal.db.execute("PRAGMA busy_timeout=0")
        try:
            with contextlib.suppress(JournalError):
                self.journal.record(self.pool[-1], Step.READ_CARD_DONE, last_four="4242")
        finally:
            self.journal.db.execute("PRAGMA busy_timeout=5000")
            other.execute("ROLLBACK")
            other.close()

    def durable_by(self, commit: int, upto: int) -> bool:
        """An fsync came after the commit, with no failed one between (the pages it lost may
        be the commit's, and Linux reports the failure once)."""
        for event in self.log[commit + 1 : upto]:
            if event == "io_error":
                return False
            if event == "fsync":
                return True
        return False


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.sampled_from(_WAIT_OPS), min_size=1, max_size=10))
def test_a_capture_request_is_released_only_once_an_fsync_after_it_held(
    ops: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Whatever the connection does meanwhile, a wait in fsynced() ends well only after an
    fsync of the WAL that followed its commit, none failing between; and it always ends."""

    log: list[str | tuple[str, int]] = []
    fdatasync = journal_module._fdatasync

    def logged(path: Path) -> None:
        fdatasync(path)
        log.append("fsync")

    async def run() -> tuple[_SharedFsyncRun, dict[int, int]]:
        driven = _SharedFsyncRun(tmp_path_factory.mktemp("fsynced"), ops, log)
        ended_at: dict[int, int] = {}  # each waiter's commit: the log's length when it ended
        try:
            for op in [*ops, *["turn"] * (FSYNC_SHARED_TURNS + 2)]:
                await driven.do(op)
                for commit, waiter in driven.waiters.items():
                    if waiter.done() and commit not in ended_at:
                        ended_at[commit] = len(driven.log)
        finally:
            driven.journal.close()
        return driven, ended_at

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(journal_module, "_fdatasync", logged)
        driven, ended_at = asyncio.run(run())
    for commit, waiter in driven.waiters.items():
        assert waiter.done(), f"still waiting: {ops}"
        if waiter.exception() is None:
            assert driven.durable_by(commit, ended_at[commit]), (ops, driven.log)
        else:
            assert "io_error" in driven.log[commit:], (ops, driven.log)


def test_retry_attempts_get_their_own_order_ids() -> None:
    sale = new_sale(7, attempt=3)
    assert sale.all_order_ids() == ["KA000007", "KA000007-2", "KA000007-3"]


def test_the_wal_is_private_too(journal: Journal) -> None:
    journal.create(new_sale(1))
    wal = journal.path.with_name("journal.db-wal")
    assert stat.S_IMODE(wal.stat().st_mode) == 0o600


def test_an_unwritable_place_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(JournalError, match="cannot open the journal at"):
        Journal(blocker / "journal.db").open()


def committed_state(journal: Journal, sale_id: str) -> tuple[str, int]:
    """The sale's state and step count as another connection (a crash) would find them."""
    other = sqlite3.connect(journal.path)
    try:
        state, steps = other.execute(
            "SELECT state, (SELECT COUNT(*) FROM steps WHERE sale_id = ?) FROM sales "
            "WHERE sale_id = ?",
            (sale_id, sale_id),
        ).fetchone()
    finally:
        other.close()
    return str(state), int(steps)


def test_a_step_checks_the_state_on_disk_by_its_write_reading_nothing(journal: Journal) -> None:
    sale = journal.create(new_sale(1))
    statements: list[str] = []
    journal.db.set_trace_callback(statements.append)
    sale = journal.record(sale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
    journal.db.set_trace_callback(None)
    assert not [s for s in statements if s.lstrip().upper().startswith("SELECT")], statements
    [update] = [s for s in statements if s.startswith("UPDATE sales")]
    assert update.endswith("AND state = 'started'")  # the compare, in the write itself
    other = sqlite3.connect(journal.path)  # another writer moves the sale on
    with other:
        other.execute("UPDATE sales SET state = 'failed' WHERE sale_id = 's1'")
    other.close()
    with pytest.raises(SaleMoved, match="is failed now"):
        journal.record(sale, Step.CHARGE_CARD_ACCEPTED, interaction_id="I1")
    assert [s.step for s in journal.steps("s1")] == ["created", "charge_card.request"]


def test_a_batch_commits_its_steps_at_once_at_its_end(journal: Journal) -> None:
    sale = journal.create(new_sale(1))
    sale = journal.record(sale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
    statements: list[str] = []
    journal.db.set_trace_callback(statements.append)
    with journal.batch():
        sale = journal.record(sale, Step.CHARGE_CARD_APPROVED, trans_id="T1")
        assert committed_state(journal, "s1") == ("charging", 2)  # nothing seen before the end
        sale = journal.record(sale, Step.DISPENSE_REQUEST, SaleState.DISPENSING)
    journal.db.set_trace_callback(None)
    assert committed_state(journal, "s1") == ("dispensing", 4)
    assert statements.count("COMMIT") == 1
    assert journal.get("s1") == sale


def test_a_batch_that_fails_leaves_the_sale_as_before_its_first_step(journal: Journal) -> None:
    sale = journal.create(new_sale(1))
    sale = journal.record(sale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)

    def approve_then_fail() -> None:
        with journal.batch():
            journal.record(sale, Step.CHARGE_CARD_APPROVED, trans_id="T1")
            raise RuntimeError("the vend never came")

    with pytest.raises(RuntimeError, match="the vend never came"):
        approve_then_fail()
    assert committed_state(journal, "s1") == ("charging", 2)
    assert journal.get("s1") == sale  # no trans_id: recovery reconciles by order_id
    # and the journal takes the next write as usual
    assert journal.record(sale, Step.CHARGE_CARD_APPROVED, trans_id="T1").trans_id == "T1"


def test_batches_do_not_nest(journal: Journal) -> None:
    with pytest.raises(RuntimeError, match="do not nest"), journal.batch(), journal.batch():
        pass


def test_a_batch_is_entered_and_left_in_a_few_python_calls(journal: Journal) -> None:
    # a generator context manager took six calls of contextlib and the generator's own around
    # the batch's work, at each of a kiosk API sale's four batches
    sale = journal.create(new_sale(1))
    with PythonCalls() as calls, journal.batch():
        pass
    # batch, __init__, __enter__, db, prune_gives_way, __exit__, _tell, _committed: none of
    # contextlib's; nothing written, so nothing committed to tell (no _committed)
    assert "helper" not in calls
    assert len(calls) <= 7, calls
    assert journal.get("s1") == sale


def _wal(journal: Journal) -> Path:
    return journal.path.with_name(journal.path.name + "-wal")


def test_the_wal_is_grown_ahead_so_commits_overwrite_it_in_place(journal: Journal) -> None:
    sale = journal.create(SaleRecord(sale_id="s1", order_id="KAS1", source="t",
                                     flow="charge_card", terminal="SIM-0001",
                                     amount_cents=100, state=SaleState.STARTED))
    assert journal.reserve_wal() is True
    grown = _wal(journal).stat().st_size
    assert grown >= WAL_RESERVE_BYTES
    for n in range(20):  # commits after it land inside the file: it does not get longer
        sale = journal.record(sale, Step.CHARGE_CARD_REQUEST if n == 0 else Step.CHARGE_CARD_ANSWER,
                              SaleState.CHARGING)
    assert _wal(journal).stat().st_size == grown
    tables = {r[0] for r in journal.db.execute("SELECT name FROM sqlite_master")}
    assert "wal_reserve" not in tables  # the scratch table was never committed
    assert journal.get("s1").state is SaleState.CHARGING  # type: ignore[union-attr]
    assert journal.reserve_wal() is False  # grown already: nothing more this run


def test_growing_the_wal_writes_it_once_and_leaves_the_database_as_it_was(
    journal: Journal,
) -> None:
    journal.create(new_sale(1))
    journal.close()  # the last connection: SQLite checkpoints and removes the WAL
    journal.open()
    size = journal.path.stat().st_size
    written = _written_bytes()
    assert journal.reserve_wal() is True
    # the reserve itself and little more: committed chunks, their checkpoint and the file
    # system's journal wrote 16.7 MB (4 MB into the database as free pages)
    assert _written_bytes() - written < 1.5 * WAL_RESERVE_BYTES
    journal.close()
    assert journal.path.stat().st_size == size  # no free pages left behind
    journal.open()
    assert [s.sale_id for s in journal.query()] == [new_sale(1).sale_id]


def test_a_journal_whose_wal_was_grown_is_read_whole_after_a_crash(tmp_path: Path) -> None:
    """The reserve's frames belong to no commit: read back after the process died (the WAL
    left as it was, here a copy of it), the journal holds its sales and no scratch table."""
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    journal.create(new_sale(1))
    journal.reserve_wal()
    journal.create(new_sale(2))  # committed over the reserve's first frames
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    for part in ("journal.db", "journal.db-wal"):  # as the disk holds them: no checkpoint
        (crashed / part).write_bytes((tmp_path / part).read_bytes())
    journal.close()
    reopened = Journal(crashed / "journal.db")
    reopened.open()
    assert sorted(s.sale_id for s in reopened.query()) == sorted(
        [new_sale(1).sale_id, new_sale(2).sale_id])
    tables = {r[0] for r in reopened.db.execute("SELECT name FROM sqlite_master")}
    assert "wal_reserve" not in tables
    assert reopened.db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    reopened.close()


def test_a_process_killed_while_the_wal_grows_leaves_its_sales_and_nothing_else(
    tmp_path: Path,
) -> None:
    """The process dies with half the filler spilled into the WAL (os._exit from inside the
    insert's rows): the next open finds the sales committed before it, whole, and no table."""
    path = tmp_path / "journal.db"
    script = f"""
import itertools, os
from kiosk_agent.sales import journal as module
from tests.sales.test_journal import new_sale
journal = module.Journal({str(path)!r})
journal.open()
journal.create(new_sale(1))
def dying(rows, times):
    for n, row in enumerate(itertools.repeat(rows, times)):
        if n == 500:
            os._exit(9)  # the filler's first 500 pages are in the WAL, none committed
        yield row
module.itertools = type("It", (), {{"repeat": staticmethod(dying)}})
journal.reserve_wal()
os._exit(0)
"""
    died = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[2],
                          check=False, timeout=60)
    assert died.returncode == 9
    assert _wal(Journal(path)).stat().st_size > 400 * 4096  # the spilled frames are there
    reopened = Journal(path)
    reopened.open()
    assert [s.sale_id for s in reopened.query()] == [new_sale(1).sale_id]
    tables = {r[0] for r in reopened.db.execute("SELECT name FROM sqlite_master")}
    assert "wal_reserve" not in tables
    assert reopened.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    reopened.create(new_sale(2))
    reopened.close()


def test_a_scratch_table_an_older_release_left_is_dropped(journal: Journal) -> None:
    journal.db.execute("CREATE TABLE wal_reserve (filler BLOB)")  # its growth stopped midway
    journal.close()
    _wal(journal).unlink(missing_ok=True)
    journal.open()
    journal.reserve_wal()
    tables = {r[0] for r in journal.db.execute("SELECT name FROM sqlite_master")}
    assert "wal_reserve" not in tables


def test_on_a_tight_disk_the_wal_is_not_grown(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.statvfs(journal.path.parent)

    class Tight:
        f_frsize = real.f_frsize
        f_bavail = (WAL_ROOM_NEEDED - 1) // real.f_frsize
        f_flag = real.f_flag

    monkeypatch.setattr("kiosk_agent.sales.journal.os.statvfs", lambda path: Tight())
    assert journal.reserve_wal() is False
    assert not _wal(journal).exists() or _wal(journal).stat().st_size < WAL_RESERVE_BYTES


def test_growing_the_wal_keeps_the_page_cache_as_it_was(journal: Journal) -> None:
    before = journal.db.execute("PRAGMA cache_size").fetchone()[0]
    journal.reserve_wal()
    assert journal.db.execute("PRAGMA cache_size").fetchone()[0] == before


def test_a_disk_that_fails_while_the_wal_grows_leaves_the_journal_writable(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The filler fails midway (a disk error): the transaction is rolled back, the journal
    takes the next sale, and the cache has its size back."""
    before = journal.db.execute("PRAGMA cache_size").fetchone()[0]
    real = journal.db

    class FailingFiller:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def executemany(self, sql: str, rows: object) -> None:
            raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(journal, "_db", FailingFiller())
    assert journal.reserve_wal() is False
    monkeypatch.setattr(journal, "_db", real)
    assert not real.in_transaction
    assert real.execute("PRAGMA cache_size").fetchone()[0] == before
    journal.create(new_sale(3))
    assert journal.get(new_sale(3).sale_id) is not None


def _written_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_oublock * 512


def test_pages_give_querys_sales_in_its_order_a_page_at_a_time(journal: Journal) -> None:
    for n in range(23):  # three sales to each moment: a page may end inside a tie
        sale = journal.create(new_sale(n, created_at=1_700_000_000 + n // 3))
        if n % 4:
            walk_to(journal, sale, SaleState.DECLINED)
    whole = [s.sale_id for s in journal.query()]
    for size in (1, 2, 5, 23, 100):
        pages = list(journal.pages(size=size))
        assert [s.sale_id for page in pages for s in page] == whole, size
        assert all(len(page) <= size for page in pages)
    assert [s.sale_id for p in journal.pages(size=4, limit=7) for s in p] == whole[:7]
    declined = [s.sale_id for s in journal.query(states=[SaleState.DECLINED])]
    assert [s.sale_id for p in journal.pages(size=3, states=[SaleState.DECLINED])
            for s in p] == declined
    # a sale made while pages are read is newer than the next page's: neither repeated nor
    # shifting the rest
    pages = journal.pages(size=5)
    seen = [s.sale_id for s in next(pages)]
    journal.create(new_sale(99, created_at=1_800_000_000))
    seen += [s.sale_id for page in pages for s in page]
    assert seen == whole


def test_open_to_read_writes_nothing_even_to_a_journal_of_an_older_schema(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.open()
    walk_to(journal, journal.create(new_sale(1)), SaleState.COMPLETED)
    journal.close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE sale_sends")  # as an older release left it: read from a copy
    db.close()
    journal.marker.unlink()
    before = path.read_bytes()
    reader = Journal(path)
    reader.open_to_read()
    try:
        assert [s.sale_id for s in reader.query()] == ["s1"]
        with pytest.raises(sqlite3.Error):  # the copy refuses writes too
            reader.db.execute("DELETE FROM sales")
    finally:
        reader.close()
    assert path.read_bytes() == before
    assert not journal.marker.exists()


def test_put_back_writes_a_removed_journal_whole_and_reopens_it_until_it_opens(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    walk_to(journal, journal.create(new_sale(1)), SaleState.COMPLETED)
    assert journal.put_back() is None  # where it was: nothing to do
    journal.path.unlink()
    walk_to(journal, journal.create(new_sale(2)), SaleState.COMPLETED)  # into the removed file
    real_open = Journal.open
    monkeypatch.setattr(Journal, "open", lambda self: (_ for _ in ()).throw(JournalError("x")))
    with pytest.raises(JournalError):
        journal.put_back()
    assert journal.path.exists()
    monkeypatch.setattr(Journal, "open", real_open)
    assert journal.put_back() is not None  # opened there now
    assert {s.sale_id for s in journal.query()} == {"s1", "s2"}
    journal.create(new_sale(3))
    reader = sqlite3.connect(journal.path)
    assert reader.execute("SELECT COUNT(*) FROM sales").fetchone()[0] == 3
    reader.close()
    assert journal.put_back() is None


def test_put_back_keeps_a_file_moved_over_the_journal_beside_it(journal: Journal) -> None:
    """A backup moved over the running agent's journal: the agent went on writing the replaced
    file, and the next start read the backup, every sale since missing."""
    walk_to(journal, journal.create(new_sale(1)), SaleState.COMPLETED)
    backup = journal.path.with_name("backup.db")
    old = Journal(backup)
    old.open()
    old.close()
    backup.replace(journal.path)
    walk_to(journal, journal.create(new_sale(2)), SaleState.COMPLETED)
    done = journal.put_back()
    assert done is not None
    assert "was replaced by another file" in done
    [kept] = journal.path.parent.glob("journal.db.replaced-*Z")
    assert str(kept) in done
    reader = sqlite3.connect(journal.path)
    assert reader.execute("SELECT COUNT(*) FROM sales").fetchone()[0] == 2
    reader.close()
    assert journal.put_back() is None



def test_put_back_has_the_written_back_journal_and_its_name_on_disk_before_going_on(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power cut after the put back must not leave the directory without the journal's name
    (the next start would find it lost and give back vended sales' charges): the copy's
    content, then the directory holding the rename, are fsynced before the old file goes."""
    walk_to(journal, journal.create(new_sale(1)), SaleState.COMPLETED)
    journal.path.unlink()
    synced: list[tuple[bool, int]] = []
    real_fsync = os.fsync

    def fsync(descriptor: int) -> None:
        info = os.fstat(descriptor)
        synced.append((stat.S_ISDIR(info.st_mode), info.st_ino))
        real_fsync(descriptor)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    assert journal.put_back() is not None
    assert synced == [(False, journal.path.stat().st_ino),
                      (True, journal.path.parent.stat().st_ino)]

# -- restore: the steps memory took while the journal could not, through the table ---------------


def test_restore_replays_the_held_steps_in_order_each_through_the_table(
    journal: Journal,
) -> None:
    charging = walk_to(journal, journal.create(new_sale(1)), SaleState.CHARGING)
    held = [  # a charge's approval and its dispense request, whose one commit failed
        HeldStep(Step.CHARGE_CARD_APPROVED, None, None,
                 {"trans_id": "T1", "authorized_cents": 250, "captured_cents": 250}),
        HeldStep(Step.DISPENSE_REQUEST, SaleState.DISPENSING, None, {"message": "vend $2.50"}),
    ]  # fmt: skip
    restored = journal.restore(charging.sale_id, held, Step.JOURNAL_RESTORED,
                               {"state": "dispensing"})
    assert (restored.state, restored.trans_id, restored.captured_cents) == (
        SaleState.DISPENSING, "T1", 250)
    assert journal.get("s1") == restored
    steps = [(s.step, s.state) for s in journal.steps("s1")][-3:]
    assert steps == [("journal.restored", SaleState.CHARGING),
                     ("charge_card.approved", SaleState.CHARGING),
                     ("dispense.request", SaleState.DISPENSING)]


def test_restore_refuses_a_move_the_table_does_not_allow_and_writes_nothing(
    journal: Journal,
) -> None:
    """It was one write beside the table (the whole row, any state): a sale memory held
    charging could be written completed without ever dispensing."""
    charging = walk_to(journal, journal.create(new_sale(1)), SaleState.CHARGING)
    before = journal.steps("s1")
    held = [HeldStep(Step.COMPLETED, SaleState.COMPLETED, None, {"captured_cents": 250})]
    with pytest.raises(TransitionRefused, match="not a move from charging"):
        journal.restore(charging.sale_id, held, Step.JOURNAL_RESTORED)
    assert journal.get("s1") == charging
    assert journal.steps("s1") == before  # not even the note


def test_restore_leaves_a_sale_decided_by_another_writer_as_the_journal_has_it(
    journal: Journal,
) -> None:
    charging = walk_to(journal, journal.create(new_sale(1)), SaleState.CHARGING)
    # a person (another process) decided it while memory held its unwritten step
    decided = walk_to(journal, charging, SaleState.ATTENTION)
    held = [HeldStep(Step.CHARGE_CARD_APPROVED, None, None, {"trans_id": "T1"})]
    with pytest.raises(TransitionRefused):
        journal.restore("s1", held, Step.JOURNAL_RESTORED)
    assert journal.get("s1") == decided
    with pytest.raises(SaleMoved):
        journal.restore("s404", [], Step.JOURNAL_RESTORED)  # not held at all: not made up
def a_busy_journal(journal: Journal, sales: int) -> None:
    """``sales`` sales over as many minutes, written as flows write them (one commit for all):
    most completed, one in fifty left charging, one in a hundred in attention."""
    clock = FakeClock(wall=1_700_000_000.0)
    journal.clock = clock
    with journal.batch():
        for n in range(sales):
            clock.step_wall(60)
            sale = journal.create(new_sale(n, sale_id=f"{n:08x}{'e' * 24}"))
            sale = journal.record(sale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
            if n % 50 == 7:
                continue
            if n % 100 == 3:
                journal.record(sale, Step.CHARGE_CARD_UNKNOWN, SaleState.ATTENTION)
                continue
            sale = journal.record(
                sale, Step.DISPENSE_REQUEST, SaleState.DISPENSING, trans_id=f"T{n}"
            )
            journal.record(sale, Step.COMPLETED, SaleState.COMPLETED, captured_cents=250)


def statements_of(journal: Journal, read: Callable[[], object]) -> list[str]:
    """Every statement ``read`` ran on the journal's connection, as SQLite traced it."""
    statements: list[str] = []
    journal.db.set_trace_callback(statements.append)
    try:
        read()
    finally:
        journal.db.set_trace_callback(None)
    return statements


def plans_of(journal: Journal, read: Callable[[], object]) -> list[str]:
    """SQLite's plan of every statement ``read`` ran, one line a step of it."""
    return [
        str(row[3])
        for sql in statements_of(journal, read)
        for row in journal.db.execute(f"EXPLAIN QUERY PLAN {sql}")
    ]


def test_the_hot_reads_of_a_years_journal_use_an_index(journal: Journal) -> None:
    """What start-up, the status page, the admin API and the commands read on every use, looked
    up in an index (or read newest first and stopped at the page's end), never a walk through
    every sale: on a journal of 200,000 sales one such walk held the agent for a second. Each
    plan is SQLite's own (EXPLAIN QUERY PLAN of the statement the method ran)."""
    a_busy_journal(journal, 3000)
    now = 1_700_000_000.0 + 3000 * 60
    wanted = {
        # start-up, recovery, health, the page: the few open and attention sales
        "open": (journal.open_sales, "SEARCH sales USING INDEX sales_state_created (state=?)"),
        "attention": (journal.attention_sales,
                      "SEARCH sales USING INDEX sales_state_created (state=?)"),
        # health's count of today, at start
        "today": (lambda: journal.today(now),
                  "SEARCH sales USING INDEX sales_created (created_at>? AND created_at<?)"),
        # `sales`, /api/sales, the page: newest first, a page of them
        "list": (lambda: journal.query(limit=100), "SCAN sales USING INDEX sales_created"),
        "today's list": (lambda: journal.query(since=now - 86400),
                         "SEARCH sales USING INDEX sales_created (created_at>?)"),
        # the same with the card sessions of no selection apart (sales.kinds), and their count
        "sales only": (lambda: journal.query(limit=100, kind=SaleKind.SALE),
                       "SCAN sales USING INDEX sales_created"),
        # the admin API's next page (?before=), and how many more after it
        "a page after a cursor": (
            lambda: journal.query(limit=100, kind=SaleKind.SALE, older_than=(now - 600, 1)),
            "SEARCH sales USING INDEX sales_created (created_at<?)"),
        "more after a cursor": (
            lambda: journal.count(kind=SaleKind.SALE, older_than=(now - 600, 1)),
            "SEARCH sales USING INDEX sales_no_selection (created_at<?)"),
        "sessions apart": (lambda: journal.count(since=now - 86400, kind=SaleKind.NO_SELECTION),
                           "SEARCH sales USING INDEX sales_no_selection (created_at>?)"),
        "sales counted": (lambda: journal.count(since=now - 86400, kind=SaleKind.SALE),
                          "SEARCH sales USING INDEX sales_no_selection (created_at>?)"),
        "completed": (lambda: journal.query(states=[SaleState.COMPLETED], limit=20),
                      "SEARCH sales USING INDEX sales_state_created (state=?)"),
        # `sales show 0000a1`, /api/sales/{id} by a prefix of it
        "by prefix": (
            lambda: journal.with_id_prefix("00000a1"),
            "SEARCH sales USING INDEX sqlite_autoindex_sales_1 (sale_id>? AND sale_id<?)",
        ),
        # the charge check: each charge of reporting's window by its order id
        "by order id": (lambda: journal.by_order_id("KA000123"),
                        "SEARCH sales USING INDEX sqlite_autoindex_sales_2 (order_id=?)"),
        "steps": (lambda: journal.steps("000000a1" + "e" * 24),
                  "SEARCH steps USING INDEX steps_sale (sale_id=?)"),
        # health's late vends, at every snapshot (sales/late_vends.py): their own partial index
        "late vends": (lambda: journal.late_vend_steps(now - 86400),
                       "SEARCH steps USING INDEX steps_late_vend (at>?)"),
    }
    for name, (read, plan) in wanted.items():
        found = plans_of(journal, read)
        assert plan in found, (name, found)
        assert not [p for p in found if p.startswith("SCAN") and p != plan], (name, found)
        assert "USE TEMP B-TREE FOR ORDER BY" not in found or name == "open", (name, found)
    # and they answer what they did before
    assert len(journal.open_sales()) == 60
    assert len(journal.attention_sales()) == 30
    midnight = now - now % 86400  # the UTC day's start: the one rule of days
    completed_today = [
        s for s in journal.query(states=[SaleState.COMPLETED]) if s.created_at >= midnight
    ]
    assert completed_today
    assert journal.today(now) == (len(completed_today), 250 * len(completed_today))
    assert [s.sale_id[:8] for s in journal.with_id_prefix("00000a1", limit=20)] == [
        f"00000a1{d:x}" for d in range(16)
    ]


def test_a_journal_of_the_previous_schema_loses_its_retired_index_on_open(
    tmp_path: Path,
) -> None:
    """sales_state is covered by sales_state_created: kept, every step's write would keep two
    indexes of the state."""
    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.open()
    journal.db.execute("CREATE INDEX sales_state ON sales(state)")
    journal.close()
    journal.open()
    names = {r[0] for r in journal.db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    journal.close()
    assert "sales_state" not in names
    assert {"sales_state_created", "sales_created"} <= names


def test_prune_makes_no_file_where_the_journal_was_removed(journal: Journal) -> None:
    """It runs after ready, on a connection of its own: a journal removed meanwhile must be
    written back whole by put_back, not met by an empty file made in its place."""
    journal.path.unlink()
    with pytest.raises(sqlite3.Error):
        journal.prune(keep_days=1)
    assert not journal.path.exists()


def test_a_running_agents_commits_leave_the_checkpoint_to_a_connection_aside(
    journal: Journal,
) -> None:
    """SQLite checkpoints inside the commit that passes 1,000 pages of WAL (10 ms and more: the
    pages copied and the database fsynced), and the agent commits on its event loop. With
    checkpoints aside, no commit copies anything into the database; ``checkpoint`` does, on a
    connection of its own, once enough rows were written."""
    from kiosk_agent.sales.journal import CHECKPOINT_AFTER_ROWS
    from kiosk_agent.sales.states import SaleState

    journal.checkpoint_aside()
    database = journal.path.stat().st_size
    wal = journal.path.with_name(journal.path.name + "-wal")
    n, due = 0, False
    # past where SQLite would have checkpointed on its own (due on the way: CHECKPOINT_AFTER_ROWS
    # keeps a running agent's WAL under it)
    while not (due and wal.stat().st_size > 1000 * 4096):
        n += 1
        walk_to(journal, journal.create(new_sale(n)), SaleState.COMPLETED)
        due = journal.checkpoint_due() or due
    assert journal.db.total_changes >= CHECKPOINT_AFTER_ROWS
    assert journal.path.stat().st_size == database  # and nothing was copied by a commit
    assert journal.checkpoint() > 1000
    assert journal.path.stat().st_size > database
    assert not journal.checkpoint_due()
    assert journal.get(f"s{n}").state is SaleState.COMPLETED  # every step still there


def test_a_checkpoint_aside_begins_the_wal_again_though_its_pass_left_frames_behind(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A WAL is written from its beginning again only after a checkpoint that left nothing
    behind; with sales and the prune writing, frames were always left behind by the PASSIVE
    pass, and the WAL of a year's journal grew to 1.1 GB (and its index in the agent's RSS).
    Here a reader (a page, a command) holds the pass back and leaves right after it: the
    checkpoint still leaves the WAL whole in the database, and the next commit writes it from
    its beginning."""
    journal.checkpoint_aside()
    n = 0
    while not journal.checkpoint_due():
        n += 1
        walk_to(journal, journal.create(new_sale(n)), SaleState.COMPLETED)
    reader = sqlite3.connect(journal.path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT COUNT(*) FROM sales").fetchone()  # its snapshot: the pass stops there
    for more in range(n + 1, n + 4):
        walk_to(journal, journal.create(new_sale(more)), SaleState.COMPLETED)
    connect = sqlite3.connect

    def the_reader_leaves_after_the_pass(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        aside = connect(*args, **kwargs)

        def said(sql: str) -> None:
            if sql == "PRAGMA busy_timeout=0":  # the PASSIVE pass is over
                reader.execute("COMMIT")
        aside.set_trace_callback(said)
        return aside

    monkeypatch.setattr(sqlite3, "connect", the_reader_leaves_after_the_pass)
    assert journal.checkpoint() > 500  # the rows of a due checkpoint (CHECKPOINT_AFTER_ROWS)
    monkeypatch.undo()
    reader.close()
    walk_to(journal, journal.create(new_sale(n + 9)), SaleState.COMPLETED)  # the next commits
    look = sqlite3.connect(journal.path)
    try:
        _busy, frames, _copied = look.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    finally:
        look.close()
    assert frames < 100, frames  # those commits' frames alone, from the WAL's beginning


def test_the_commit_that_makes_a_checkpoint_due_says_so(journal: Journal) -> None:
    """A running agent checkpoints when a commit makes one due, not at its next look a second
    later (customers back to back ran the WAL past its reserve meanwhile): ``on_checkpoint_due``
    is told from the commit that reaches CHECKPOINT_AFTER_ROWS on, until ``checkpoint_due`` is
    asked; never before, and never without checkpoints aside."""
    from kiosk_agent.sales.journal import CHECKPOINT_AFTER_ROWS

    told: list[int] = []
    journal.on_checkpoint_due = lambda: told.append(journal.db.total_changes)
    for n in range(1, 40):  # SQLite's own checkpoints: nobody is told
        walk_to(journal, journal.create(new_sale(n)), SaleState.COMPLETED)
    assert told == []
    journal.checkpoint_aside()
    began, n = journal.db.total_changes, 100
    while not told:
        n += 1
        with journal.batch():  # a batch's commit tells as a single write's does
            record = journal.create(new_sale(n))
        walk_to(journal, record, SaleState.COMPLETED)
        assert told or journal.db.total_changes - began < CHECKPOINT_AFTER_ROWS + 20
    assert told[0] - began >= CHECKPOINT_AFTER_ROWS
    walk_to(journal, journal.create(new_sale(n + 1)), SaleState.COMPLETED)
    assert len(told) > 1  # each commit until it is asked
    assert journal.checkpoint_due()
    count = len(told)
    walk_to(journal, journal.create(new_sale(n + 2)), SaleState.COMPLETED)
    assert len(told) == count  # asked: the count starts again


def test_a_checkpoint_begins_the_wal_again_once_a_reader_leaves_after_its_first_restart(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A RESTART that cannot now (a reader still in an older snapshot, a write under way) is
    tried again, waiting for nobody each time, instead of leaving the WAL to run on past its
    reserve until the next checkpoint (customers back to back: a write under way much of the
    time). Here a reader leaves only after the first RESTART found it there."""
    journal.checkpoint_aside()
    for n in range(1, 20):
        walk_to(journal, journal.create(new_sale(n)), SaleState.COMPLETED)
    reader = sqlite3.connect(journal.path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT COUNT(*) FROM sales").fetchone()  # its snapshot: the pass stops there
    for more in range(20, 23):
        walk_to(journal, journal.create(new_sale(more)), SaleState.COMPLETED)
    connect = sqlite3.connect

    def the_reader_leaves_after_the_first_restart(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        aside = connect(*args, **kwargs)
        restarts: list[str] = []

        def said(sql: str) -> None:
            if sql == "PRAGMA wal_checkpoint(RESTART)":
                restarts.append(sql)
                if len(restarts) == 2:
                    reader.execute("COMMIT")
        aside.set_trace_callback(said)
        return aside

    monkeypatch.setattr(sqlite3, "connect", the_reader_leaves_after_the_first_restart)
    assert journal.checkpoint() > 100
    monkeypatch.undo()
    reader.close()
    walk_to(journal, journal.create(new_sale(99)), SaleState.COMPLETED)  # the next commits
    look = sqlite3.connect(journal.path)
    try:
        _busy, frames, _copied = look.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    finally:
        look.close()
    assert frames < 50, frames  # those commits' frames alone, from the WAL's beginning


def test_growing_the_wal_ahead_makes_no_checkpoint_due(journal: Journal) -> None:
    """reserve_wal's filler is rolled back: its rows leave no frame to copy, so they do not
    count towards a checkpoint (else one ran right after every start, for nothing)."""
    journal.checkpoint_aside()
    changes = journal.db.total_changes
    assert journal.reserve_wal()
    assert journal.db.total_changes > changes  # SQLite counts the rolled-back rows
    assert not journal.checkpoint_due()


def test_without_checkpoints_aside_sqlite_checkpoints_in_a_commit(journal: Journal) -> None:
    """What the test above changes: a journal's own connection (a command's) still lets SQLite
    checkpoint as it commits, and never says a checkpoint is due."""
    from kiosk_agent.sales.states import SaleState

    database = journal.path.stat().st_size
    for n in range(1, 120):
        walk_to(journal, journal.create(new_sale(n)), SaleState.COMPLETED)
    assert journal.path.stat().st_size > database
    assert not journal.checkpoint_due()


# SQLite's memory is the process's: read in a process of its own, so that no other test's
# thread (a prune or a check left running) counts in it
_SQLITE_MEMORY = """
import ctypes, sqlite3, sys
from pathlib import Path
from kiosk_agent.sales.journal import Journal, integrity
sqlite = ctypes.CDLL("libsqlite3.so.0")
sqlite.sqlite3_memory_used.restype = ctypes.c_int64
sqlite.sqlite3_memory_highwater.restype = ctypes.c_int64
version = sqlite3.sqlite_version_info
if sqlite.sqlite3_libversion_number() != version[0] * 1000000 + version[1] * 1000 + version[2]:
    print("other")  # Python's sqlite3 is linked with another SQLite
    sys.exit()
path = Path(sys.argv[2])
if sys.argv[1] == "agent":  # every page read through the journal's own connection
    journal = Journal(path)
    journal.open()
    before = sqlite.sqlite3_memory_used()
    journal.db.execute("CREATE TABLE filler (b BLOB)")
    journal.db.execute("BEGIN")
    journal.db.executemany("INSERT INTO filler VALUES (zeroblob(3000))", [()] * 1024)
    journal.db.execute("COMMIT")
    read = journal.db.execute("SELECT COUNT(*) FROM filler WHERE b != x''").fetchone()[0]
    assert read == 1024, read
    print(sqlite.sqlite3_memory_used() - before)
else:  # the whole file's check, as a worker thread makes it
    made = sqlite3.connect(path, isolation_level=None)
    made.execute("CREATE TABLE filler (b BLOB)")
    made.execute("BEGIN")
    made.executemany("INSERT INTO filler VALUES (zeroblob(3000))", [()] * 1024)
    made.execute("COMMIT")
    made.close()
    before = sqlite.sqlite3_memory_used()
    sqlite.sqlite3_memory_highwater(1)
    assert integrity(path, quick=True) == ["no sales table: the journal is empty"]
    print(sqlite.sqlite3_memory_highwater(1) - before)
"""


def _sqlite_memory(kind: str, path: Path) -> int:
    """SQLite's memory (bytes) a pass over 4 MiB of pages left held (``agent``) or took at its
    peak (``check``), read in a process of its own."""
    try:
        ctypes.CDLL("libsqlite3.so.0")
    except OSError:
        pytest.skip("Python's sqlite3 is not the shared libsqlite3 here")
    done = subprocess.run([sys.executable, "-c", _SQLITE_MEMORY, kind, str(path)],
                          capture_output=True, text=True, check=True, timeout=120)
    if done.stdout.strip() == "other":
        pytest.skip("Python's sqlite3 is linked with another SQLite")
    return int(done.stdout)


def test_the_agents_connection_keeps_a_small_page_cache_whatever_it_reads(
    tmp_path: Path,
) -> None:
    """SQLite's default page cache (2,000 KiB) filled with a year's pages as the agent sold and
    stayed: SQLite's memory grew 1.7 -> 2.3 MB after the first 1,000 sales of
    bench/journal.py."""
    held = _sqlite_memory("agent", tmp_path / "journal.db")
    assert held < (CACHE_KIB + 256) * 1024, held  # its cache, and little else


def test_the_whole_files_check_reads_it_with_a_cache_of_a_few_pages(tmp_path: Path) -> None:
    """The quick check (a running agent's doctor, the start's file read in its thread) reads
    each page once: the 2 MB its cache filled stayed in the worker thread's malloc arena."""
    peak = _sqlite_memory("check", tmp_path / "journal.db")
    assert peak < (ASIDE_CACHE_KIB + 256) * 1024, peak


def test_every_pass_on_a_connection_aside_holds_a_small_page_cache(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prune, the checkpoint and the integrity check each open a connection of their own
    in a worker thread: each asks for the small cache before it reads anything."""
    walk_to(journal, journal.create(new_sale(1)), SaleState.COMPLETED)
    opened: list[list[str]] = []
    connect = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        db = connect(*args, **kwargs)
        if str(journal.path) in str(args[0]):  # this journal's passes, no other thread's
            statements: list[str] = []
            db.set_trace_callback(statements.append)
            opened.append(statements)
        return db

    monkeypatch.setattr(sqlite3, "connect", traced)
    journal.prune(keep_days=1, now=time.time() + 30 * DAY)
    journal.checkpoint()
    integrity(journal.path, quick=True)
    assert len(opened) == 3
    kibs = (ASIDE_CACHE_KIB, journal_prune.PRUNE_CACHE_KIB)  # the checks' and the prune's
    small = {f"PRAGMA cache_size=-{kib}" for kib in kibs}
    for statements in opened:
        reads = [n for n, s in enumerate(statements) if s.startswith(("SELECT", "INSERT",
                                                                       "DELETE", "PRAGMA wal",
                                                                       "PRAGMA quick"))]
        asked = [n for n, s in enumerate(statements) if s in small]
        assert asked, statements
        assert asked[0] < min(reads, default=len(statements))


@pytest.mark.parametrize("raised", [asyncio.CancelledError, KeyboardInterrupt, ValueError])
def test_a_batch_rolls_back_whatever_is_raised_inside_and_nests_nothing(
    journal: Journal, raised: type[BaseException]
) -> None:
    """An attack on 363a65f (Journal.batch a class, not a generator context manager): a cancel,
    an interrupt or a bug raised inside rolls every write of the batch back and leaves the
    connection out of any transaction, taking the next write (fsynced) at once; a batch begun
    inside another is refused, and the outer one still commits whole."""
    def two_writes_then_raised() -> None:
        with journal.batch():
            journal.create(new_sale(1))
            journal.create(new_sale(2))
            raise raised

    with pytest.raises(raised):
        two_writes_then_raised()
    assert journal.get("s1") is None
    assert journal.get("s2") is None
    assert not journal.db.in_transaction
    assert not journal._batching
    journal.create(new_sale(3))
    assert not journal._fsync_owed
    with journal.batch():
        journal.create(new_sale(4))
        with pytest.raises(RuntimeError, match="do not nest"), journal.batch():
            pass  # pragma: no cover
        journal.create(new_sale(5))
    assert [journal.get(f"s{n}") is not None for n in (3, 4, 5)] == [True, True, True]
    assert not journal.db.in_transaction


async def test_a_raising_checkpoint_callback_is_counted_after_the_commits_fsync_bookkeeping(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``on_checkpoint_due`` is told after a commit's fsync bookkeeping, and a callback that
    raises (a bug) is counted, never the commit's failure: before, the raise left the fsync
    owed (the commit looked not durable, or durable when it was not) and ``fsynced()``'s
    waiters were never woken, and the write that had committed raised to its sale."""
    from kiosk_agent.sales.journal import CHECKPOINT_AFTER_ROWS

    monkeypatch.setattr(journal_module, "_fdatasync", lambda path: None)
    journal.checkpoint_aside()
    told: list[int] = []

    def broken() -> None:
        told.append(journal.db.total_changes)
        raise RuntimeError("a bug in the checkpoint's callback")

    journal.on_checkpoint_due = broken
    began, n = journal.db.total_changes, 0
    while journal.db.total_changes - began < CHECKPOINT_AFTER_ROWS - 10:  # just short of due
        n += 1
        walk_to(journal, journal.create(new_sale(n)), SaleState.COMPLETED)
    assert told == []
    shared = reading_a_card(journal, n + 1)
    with journal.fsync_shared():
        journal.record(shared, Step.READ_CARD_CANCELLED, SaleState.CANCELLED)
    waiting = asyncio.ensure_future(journal.fsynced())
    await asyncio.sleep(0)
    assert not waiting.done()
    while not told:  # the fsynced commit that makes it due: taken, its waiter woken
        n += 1
        walk_to(journal, journal.create(new_sale(n + 1)), SaleState.COMPLETED)
    await asyncio.wait_for(waiting, 1)
    assert journal.checkpoint_due_errors == len(told) >= 1
    assert journal.get(shared.sale_id) is not None


def test_a_sale_created_in_a_batch_is_written_once_in_its_state_after_the_batchs_steps(
    journal: Journal,
) -> None:
    """A flow's opening commit (the sale and its first step, SaleFlow.open) was an INSERT of the
    sale, an UPDATE of it (its state index too) and an INSERT per step: now the row is written
    once at the batch's end, in its last state, and its steps in one INSERT. What the disk holds
    after the commit is the same; nothing of it before."""
    statements: list[str] = []
    journal.db.set_trace_callback(statements.append)
    with journal.batch():
        sale = journal.create(new_sale(1, flow="authorize_capture"), {"product": "A2"})
        sale = journal.record(sale, Step.READ_CARD_REQUEST, SaleState.READING_CARD,
                              message="present a card on SIM-0001")
        other = sqlite3.connect(journal.path)  # as a crash would find it: nothing yet
        assert other.execute("SELECT COUNT(*) FROM sales").fetchone() == (0,)
        other.close()
    journal.db.set_trace_callback(None)
    assert [s.split(" (")[0] for s in statements] == [
        "BEGIN IMMEDIATE", "INSERT INTO sales", "INSERT INTO steps", "COMMIT"]
    assert committed_state(journal, "s1") == ("reading_card", 2)
    assert journal.get("s1") == sale
    assert [(s.step, s.state, s.detail) for s in journal.steps("s1")] == [
        ("created", SaleState.STARTED, {"product": "A2"}),
        ("read_card.request", SaleState.READING_CARD, {}),
    ]


def test_a_sale_created_in_a_batch_is_there_for_every_other_statement_of_it(
    journal: Journal,
) -> None:
    """Held until the batch's end, the new sale goes in first whenever the batch reads the
    journal or writes another sale (in order, so the steps' order is the writes'); a step the
    table refuses or one written from another state than the held row's goes the usual way."""
    with journal.batch():
        first = journal.create(new_sale(1))
        assert journal.get("s1") == first  # a read inside the batch sees it
        first = journal.record(first, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
        second = journal.create(new_sale(2))
        journal.record(first, Step.CHARGE_CARD_ACCEPTED, interaction_id="I1")
        second = journal.record(second, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
        with pytest.raises(TransitionRefused):
            journal.record(second, Step.COMPLETED, SaleState.COMPLETED)
        with pytest.raises(SaleMoved, match="is charging now"):
            journal.record(second, Step.CHARGE_CARD_ACCEPTED, if_state=SaleState.STARTED)
    steps = journal.db.execute("SELECT sale_id, step FROM steps ORDER BY id").fetchall()
    assert [tuple(row) for row in steps] == [
        ("s1", "created"), ("s1", "charge_card.request"), ("s2", "created"),
        ("s1", "charge_card.accepted"), ("s2", "charge_card.request")]
    assert committed_state(journal, "s2") == ("charging", 2)


def test_a_batch_whose_created_sale_cannot_be_written_fails_whole_and_leaves_none_open(
    journal: Journal,
) -> None:
    """The held sale's INSERT fails at the batch's end (here another sale has its order id):
    the batch's writes roll back, the caller hears a JournalError as from a failed commit, and
    the journal takes the next write. An exception inside the batch leaves nothing either."""
    journal.create(new_sale(1))
    with pytest.raises(JournalError, match="UNIQUE"), journal.batch():
        journal.record(journal.create(new_sale(2, order_id="KA000001")),
                       Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
    assert not journal.db.in_transaction
    with contextlib.suppress(RuntimeError), journal.batch():
        journal.create(new_sale(3))
        raise RuntimeError("the caller failed")
    assert journal.get("s2") is None
    assert journal.get("s3") is None
    journal.create(new_sale(4))
    assert committed_state(journal, "s4") == ("started", 1)
def test_find_names_a_sale_by_any_prefix_of_its_id_wildcards_read_as_themselves(
    journal: Journal,
) -> None:
    # The agent's sale ids are 32 lowercase hex digits (sales/runner.py new_ids: uuid4().hex,
    # the only maker since the first release), but a journal's ids are whatever it holds (a
    # test's, a tool's): a prefix with a dash, or GLOB's own *, ? and [, names its sale as typed
    from kiosk_agent.sales.journal_reads import SaleNotFound
    from kiosk_agent.sales.runner import new_ids
    from kiosk_agent.sales.unit import OwnUnit

    made, _ = new_ids(OwnUnit.fresh())
    assert len(made) == 32, made
    assert set(made) <= set("0123456789abcdef"), made
    ids = ["sale-1", "sale-10", "sale_2", "a*b", "a?c", "k[1]x", "k]2", made]
    for n, sale_id in enumerate(ids):
        journal.create(new_sale(n, sale_id=sale_id))
    for sale_id in ids:
        assert journal.find(sale_id).sale_id == sale_id  # its whole id
    assert journal.find("sale_").sale_id == "sale_2"
    assert journal.find("k[").sale_id == "k[1]x"
    assert journal.find("k]").sale_id == "k]2"
    assert journal.find(made[:8]).sale_id == made
    assert [s.sale_id for s in journal.with_id_prefix("a*", limit=5)] == ["a*b"]  # not "a?c"
    assert [s.sale_id for s in journal.with_id_prefix("a?", limit=5)] == ["a?c"]
    assert journal.find("sale-1").sale_id == "sale-1"  # a whole id, though sale-10's prefix
    with pytest.raises(SaleNotFound, match="names 2 sales"):
        journal.find("sale-")
    with pytest.raises(SaleNotFound, match="no sale"):
        journal.find("*")  # no sale's id begins with a star
    assert journal.with_id_prefix("") == []


def test_a_batchs_steps_of_a_sale_on_disk_are_one_update_and_one_insert(
    journal: Journal,
) -> None:
    """The vend window's two later commits (the card read with the authorization's request,
    the approval with the dispense request) were an UPDATE of the sale and an INSERT per step:
    now the sale's changes are one UPDATE at the batch's end, checked against the state its
    first step found, the row kept beside it written once, and its steps one INSERT. What the
    disk holds after the commit is what the steps one by one wrote."""
    sale = journal.create(new_sale(1, flow="authorize_capture"))
    sale = journal.record(sale, Step.READ_CARD_REQUEST, SaleState.READING_CARD)
    statements: list[str] = []
    journal.db.set_trace_callback(statements.append)
    with journal.batch():
        sale = journal.record(sale, Step.READ_CARD_DONE, card_brand="2", last_four="4242")
        sale = journal.record(sale, Step.AUTHORIZE_REQUEST, SaleState.AUTHORIZING,
                              detail={"order_id": "KA000001", "amount_cents": 250},
                              message="authorizing $2.50", sent_at=1.5, sent_mono=2.5,
                              sent_boot="b")
        assert committed_state(journal, "s1") == ("reading_card", 2)  # nothing before the end
    journal.db.set_trace_callback(None)
    assert [s.split(" (")[0].split(" SET")[0] for s in statements] == [
        "BEGIN IMMEDIATE", "UPDATE sales", "INSERT INTO sale_sends", "INSERT INTO steps",
        "COMMIT"]
    assert statements[1].endswith("AND state = 'reading_card'")  # the state the batch found
    assert committed_state(journal, "s1") == ("authorizing", 4)
    assert journal.get("s1") == sale
    assert (sale.card_brand, sale.last_four, sale.sent_at, sale.sent_boot) == (
        "2", "4242", 1.5, "b")
    assert [(s.step, s.state, s.detail) for s in journal.steps("s1")][2:] == [
        ("read_card.done", SaleState.READING_CARD, {}),
        ("authorize.request", SaleState.AUTHORIZING,
         {"order_id": "KA000001", "amount_cents": 250}),
    ]


def test_a_sale_moved_before_the_batch_fails_it_whole_at_its_end(journal: Journal) -> None:
    """The batch holds the write lock from its BEGIN, so a sale it did not write can only have
    moved before it: found by its UPDATE at the end, SaleMoved then, and nothing of the batch
    written (another sale's steps in it neither). A step from another state than the batch
    itself left the sale in is refused at once."""
    first = journal.create(new_sale(1))
    stale = journal.create(new_sale(2))
    journal.record(stale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)  # moved on

    def both() -> None:
        with journal.batch():
            journal.record(first, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
            journal.record(stale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)  # held: no read

    with pytest.raises(SaleMoved, match="s2 is charging now"):
        both()
    assert committed_state(journal, "s1") == ("started", 1)
    assert committed_state(journal, "s2") == ("charging", 2)
    sale = journal.get("s1")
    assert sale is not None
    with journal.batch():
        moved = journal.record(sale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
        with pytest.raises(SaleMoved, match="s1 is charging now"):
            journal.record(sale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
        journal.record(moved, Step.CHARGE_CARD_ACCEPTED, interaction_id="I1")
    assert committed_state(journal, "s1") == ("charging", 3)
