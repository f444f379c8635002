"""SaleSteps' commits of several steps: what they cost in Python, and what memory keeps of them
when the journal cannot write them."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, cast

import pytest

from kiosk_agent.bus import EventBus
from kiosk_agent.sales import steps as steps_module
from kiosk_agent.sales.journal import HeldStep, Journal, JournalError, SaleMoved, SaleRecord
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.settings import SaleSettings
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.sales.steps import SaleContext, SaleSteps
from tests.helpers import PythonCalls


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    opened = Journal(tmp_path / "journal.db")
    opened.open()
    yield opened
    opened.close()


def sale_steps(journal: Journal, heard: list[SaleEvent]) -> SaleSteps:
    """An authorize_capture sale reading a card, with no service (nothing here calls one)."""
    events: EventBus[SaleEvent] = EventBus()
    events.listen(heard.append)
    context = SaleContext(service=cast(Any, None), journal=journal, events=events,
                          settings=SaleSettings(mid="1", terminals={"T1": "front"}))
    record = journal.create(SaleRecord(
        sale_id="s1", order_id="KA000001", source="virtual:front", flow="authorize_capture",
        terminal="T1", amount_cents=250, state=SaleState.STARTED))
    steps = SaleSteps(record, context)
    steps.step(Step.READ_CARD_REQUEST, SaleState.READING_CARD)
    return steps


def test_a_commit_of_steps_is_entered_and_left_in_a_few_calls_and_keeps_no_record_of_them(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """one_commit() was a generator context manager (contextlib's helper, __enter__, __exit__
    and two generator resumptions around each of the vend window's three commits), and each
    step made a HeldStep for the case its write fails: now only when one does."""
    heard: list[SaleEvent] = []
    steps = sale_steps(journal, heard)
    made: list[object] = []
    monkeypatch.setattr(steps_module, "HeldStep", lambda *args: made.append(args))
    with PythonCalls() as calls, steps.one_commit():
        pass
    assert "helper" not in calls
    # one_commit, its __init__, __enter__ and __exit__ around the batch's eight (batch,
    # __init__, __enter__, db, prune_gives_way, __exit__, _tell): none of contextlib's
    assert len(calls) <= 11, calls
    with steps.one_commit():
        steps.step(Step.READ_CARD_DONE, last_four="4242")
        steps.step(Step.AUTHORIZE_REQUEST, SaleState.AUTHORIZING, "authorizing $2.50")
    assert made == []
    assert [e.step for e in heard] == ["read_card.request", "read_card.done",
                                       "authorize.request"]
    assert journal.get("s1") == steps.record


class CommitFails:
    """The journal's connection, whose next statement beginning with ``failing`` (the COMMIT,
    or one of the writes the batch makes at its end) fails as a full disk's does."""

    def __init__(self, real: sqlite3.Connection, failing: str = "COMMIT") -> None:
        self.real = real
        self.failing = failing

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith(self.failing):
            raise sqlite3.OperationalError("database or disk is full")
        return self.real.execute(sql, *args)


@pytest.mark.parametrize("failing", ["COMMIT", "UPDATE sales", "INSERT INTO steps"])
def test_a_commit_of_steps_that_fails_keeps_them_in_memory_in_order_and_publishes_none(
    journal: Journal, failing: str
) -> None:
    """The batch rolled back whole: the sale is as the journal holds it, memory keeps it as the
    journal should (every step applied) and the steps to write again, in order. The sale's
    steps are written at the batch's end (one UPDATE, one INSERT): a disk failing at either
    is the failed commit too."""
    heard: list[SaleEvent] = []
    steps = sale_steps(journal, heard)
    before = steps.record
    real = journal.db

    def read_and_authorize() -> None:
        with steps.one_commit():
            steps.step(Step.READ_CARD_DONE, last_four="4242")
            steps.step(Step.AUTHORIZE_REQUEST, SaleState.AUTHORIZING, "authorizing $2.50",
                       detail={"amount_cents": 250})

    journal._db = cast(Any, CommitFails(real, failing))
    try:
        with pytest.raises(JournalError, match="disk is full"):
            read_and_authorize()
    finally:
        journal._db = real
    assert steps.record == before == journal.get("s1")
    assert steps.unwritten is not None
    assert (steps.unwritten.state, steps.unwritten.last_four) == (SaleState.AUTHORIZING, "4242")
    assert steps.held == [
        HeldStep(Step.READ_CARD_DONE, None, None, {"last_four": "4242"}),
        HeldStep(Step.AUTHORIZE_REQUEST, SaleState.AUTHORIZING, {"amount_cents": 250},
                 {"message": "authorizing $2.50"}),
    ]
    assert [e.step for e in heard] == ["read_card.request"]


def test_a_commit_of_steps_of_a_sale_moved_elsewhere_leaves_memory_as_the_journal_holds_it(
    journal: Journal, tmp_path: Path
) -> None:
    """Another process (a person's `kiosk-agent resolve`) moved the sale before the commit: the
    batch writes its steps at its end, where its UPDATE finds it moved (SaleMoved) and rolls
    back whole. Memory is the sale as the journal last took it, as when the first step raised
    it: not the batch's steps, which the runner's SaleMoved path (and its unwritten event,
    "never a state the journal does not hold") would otherwise show; nothing published, nothing
    kept to write again (the other writer's decision stands)."""
    heard: list[SaleEvent] = []
    steps = sale_steps(journal, heard)
    before = steps.record
    person = Journal(journal.path)
    person.open()
    try:
        found = person.get("s1")
        assert found is not None
        person.record(found, Step.RECOVERY_UNDECIDED, SaleState.ATTENTION)
    finally:
        person.close()

    def read_and_authorize() -> None:
        with steps.one_commit():
            steps.step(Step.READ_CARD_DONE, last_four="4242")
            steps.step(Step.AUTHORIZE_REQUEST, SaleState.AUTHORIZING, "authorizing $2.50")

    with pytest.raises(SaleMoved, match="s1 is attention now"):
        read_and_authorize()
    assert steps.record == before
    assert (steps.record.state, steps.record.last_four) == (SaleState.READING_CARD, None)
    assert steps.unwritten is None
    assert steps.held == []
    assert [e.step for e in heard] == ["read_card.request"]
    on_disk = journal.get("s1")
    assert on_disk is not None
    assert on_disk.state is SaleState.ATTENTION
