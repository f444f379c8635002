"""health.availability: the one decider of "can this terminal take a card now", on a fake clock."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kiosk_agent.health.availability import FILE_CHECK_REASON, Availability, TerminalState
from kiosk_agent.health.model import Health
from kiosk_agent.sales.events import EventLog
from kiosk_agent.sales.journal import Journal
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import SaleState


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    yield journal
    journal.close()


def _make(
    journal: Journal, hold_off: float = 2.0, *, starting: bool = False
) -> tuple[Availability, Health, Clock]:
    health = Health("1")
    health.report_service(True)
    health.report_terminal("SIM-0001", online=True)
    clock = Clock()
    log = EventLog(lambda: journal.db)
    log.open()
    availability = Availability(
        health, ["SIM-0001"], hold_off=hold_off, recheck_interval=0.5, log=log, clock=clock,
        starting=starting,
    )
    return availability, health, clock


def test_one_lost_ping_within_the_hold_off_changes_nothing(journal: Journal) -> None:
    availability, health, clock = _make(journal)
    seen: list[TerminalState] = []
    availability.subscribe(None, seen.append)
    assert [s.available for s in seen] == [True]  # told at once

    health.report_terminal("SIM-0001", online=False, detail="timed out")
    availability.evaluate()
    assert availability.state().available
    assert availability.next_check_in(60.0) == 0.5  # re-checked quickly meanwhile
    # still in service, but what health shows (the page, the CLI) says it is failing
    [held] = health.snapshot().availability
    assert (held.available, held.failing) == (True, "terminal offline: timed out")
    clock.now += 1.0
    health.report_terminal("SIM-0001", online=True)
    availability.evaluate()
    assert [s.available for s in seen] == [True]
    [back] = health.snapshot().availability
    assert (back.available, back.failing) == (True, "")
    assert availability.next_check_in(60.0) == 60.0
    assert availability.log is not None
    assert availability.log.recent() == []


def test_out_after_the_hold_off_and_back_at_the_first_good_check(journal: Journal) -> None:
    availability, health, clock = _make(journal)
    seen: list[TerminalState] = []
    availability.subscribe("SIM-0001", seen.append)

    health.report_terminal("SIM-0001", online=False, detail="timed out")
    availability.evaluate()
    clock.now += 1.5
    assert availability.next_check_in(60.0) == pytest.approx(0.5)
    availability.evaluate()
    assert availability.state().available
    clock.now += 0.5
    availability.evaluate()
    state = availability.state()
    assert (state.available, state.reason) == (False, "terminal offline: timed out")
    assert availability.next_check_in(60.0) == 0.5

    health.report_terminal("SIM-0001", online=True)
    availability.evaluate()  # no hold-off on the way back
    assert [s.available for s in seen] == [True, False, True]
    assert availability.log is not None
    assert [(e.kind, e.subject) for e in availability.log.recent()] == [
        ("in_service", "SIM-0001"),
        ("out_of_service", "SIM-0001"),
    ]
    [shown] = health.snapshot().availability
    assert (shown.available, shown.changes) == (True, 1)


def test_the_reasons_in_order_and_a_new_reason_while_out(journal: Journal) -> None:
    availability, health, _ = _make(journal, hold_off=0)
    health.report_journal(False, "disk full")
    availability.evaluate()
    assert availability.state().reason == "journal not writable: disk full"
    health.report_service(False, "cannot connect")
    availability.evaluate()
    assert availability.state().reason == (
        "journal not writable: disk full; service unreachable: cannot connect"
    )
    health.report_journal(True)
    health.report_service(True)
    health.report_credentials(False, "HTTP 401")
    availability.evaluate()
    assert availability.state().reason == (
        "API key expired or refused and cannot be refreshed: HTTP 401"
    )
    assert "card payment unavailable on SIM-0001: API key" in " ".join(
        health.snapshot().problems
    )
    assert availability.log is not None
    assert len(availability.log.recent()) == 1  # one change, whatever the reasons since


def test_at_start_there_is_no_hold_off(journal: Journal) -> None:
    availability, health, _ = _make(journal, hold_off=30)
    health.report_terminal("SIM-0001", online=False)
    availability.evaluate(at_start=True)
    assert not availability.state().available


def test_the_starts_file_check_is_part_of_starting_not_an_outage(journal: Journal) -> None:
    # every start reads the journal's file whole before money moves on it: the terminals wait
    # out of service meanwhile, but a boot is no outage (no event, no count, no alert)
    availability, health, _ = _make(journal, hold_off=30, starting=True)
    seen: list[TerminalState] = []
    availability.subscribe("SIM-0001", seen.append)
    health.report_journal_state(file_checking=True)
    availability.evaluate(at_start=True)
    state = availability.state()
    assert (state.available, state.starting, state.reason) == (False, True, FILE_CHECK_REASON)
    snapshot = health.snapshot()
    [shown] = snapshot.availability
    assert (shown.available, shown.starting, shown.reason) == (False, True, FILE_CHECK_REASON)
    assert not [p for p in snapshot.problems if "card payment" in p]  # starting is no problem
    availability.readers_started()  # the check outlasts the readers' start: still starting
    assert availability.state().starting
    health.report_journal_state(file_checking=False)
    availability.evaluate()
    heard = [(s.available, s.starting) for s in seen]
    assert heard == [(True, False), (False, True), (True, False)]
    assert availability.log is not None
    assert availability.log.recent() == []
    [shown] = health.snapshot().availability
    assert (shown.available, shown.starting, shown.changes) == (True, False, 0)
    # the same reason once the unit was ready is an outage: the file check only excuses the start
    health.report_journal_state(file_checking=True)
    availability.evaluate()
    state = availability.state()
    assert (state.available, state.starting, state.reason) == (False, False, FILE_CHECK_REASON)
    assert [e.kind for e in availability.log.recent()] == ["out_of_service"]
    assert health.snapshot().availability[0].changes == 1


def test_the_service_unreachable_at_boot_is_starting_and_later_an_outage(
    journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    availability, health, clock = _make(journal, hold_off=2.0, starting=True)
    seen: list[TerminalState] = []
    availability.subscribe("SIM-0001", seen.append)
    health.report_service(False, "cannot connect")
    availability.evaluate(at_start=True)
    availability.readers_started()
    # its detail changes while the boot goes on: still the start's reason, still starting
    clock.now += 60
    health.report_service(False, "timed out")
    availability.evaluate()
    state = availability.state()
    assert (state.available, state.starting) == (False, True)
    assert state.reason == "service unreachable: timed out"
    health.report_service(True)
    availability.evaluate()
    # the platforms (an MDB reader) heard one wait and one start: no flapping on the bus
    assert [s.available for s in seen] == [True, False, False, True]
    assert availability.log is not None
    assert availability.log.recent() == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert health.snapshot().availability[0].changes == 0
    # the unit was ready once: the same reason is an outage, after the hold-off, as ever
    health.report_service(False, "cannot connect")
    availability.evaluate()
    assert availability.state().available  # held off
    clock.now += 2.0
    availability.evaluate()
    state = availability.state()
    assert (state.available, state.starting) == (False, False)
    assert [e.kind for e in availability.log.recent()] == ["out_of_service"]
    assert "terminal SIM-0001 out of service: service unreachable" in caplog.text
    assert "card payment unavailable on SIM-0001" in " ".join(health.snapshot().problems)


def test_before_the_readers_start_every_reason_is_part_of_starting(journal: Journal) -> None:
    availability, health, _ = _make(journal, hold_off=30, starting=True)
    health.report_terminal("SIM-0001", online=False, detail="timed out")
    availability.evaluate(at_start=True)
    since = availability.state().since
    health.report_terminal("SIM-0001", online=True)
    health.report_service(False, "cannot connect")
    availability.evaluate()
    state = availability.state()
    assert (state.starting, state.reason, state.since) == (
        True, "service unreachable: cannot connect", since
    )
    health.report_service(True)
    availability.evaluate()  # in service, but no reader is enabled yet: not ready
    health.report_journal_state(file_checking=True)
    availability.evaluate()
    assert availability.state().starting
    health.report_journal_state(file_checking=False)
    availability.readers_started()
    assert availability.state().available
    assert availability.log is not None
    assert availability.log.recent() == []


def test_a_reason_the_start_did_not_have_ends_it_as_an_outage(journal: Journal) -> None:
    availability, health, _ = _make(journal, hold_off=30, starting=True)
    health.report_journal_state(file_checking=True)
    availability.evaluate(at_start=True)
    availability.readers_started()
    health.report_terminal("SIM-0001", online=False, detail="timed out")
    availability.evaluate()
    state = availability.state()
    assert (state.available, state.starting) == (False, False)
    assert state.reason == f"{FILE_CHECK_REASON}; terminal offline: timed out"
    assert availability.log is not None
    assert [e.kind for e in availability.log.recent()] == ["out_of_service"]
    [shown] = health.snapshot().availability
    assert (shown.starting, shown.changes) == (False, 1)


def test_a_damaged_file_found_by_the_starts_check_is_an_outage(journal: Journal) -> None:
    availability, health, _ = _make(journal, starting=True)
    health.report_journal_state(file_checking=True)
    availability.evaluate(at_start=True)
    availability.readers_started()
    health.report_journal_state(file_checking=False, file_damaged=True)
    availability.evaluate()
    assert availability.state().reason == "journal damaged: a restart moves it aside"
    assert availability.log is not None
    assert [e.kind for e in availability.log.recent()] == ["out_of_service"]
    [shown] = health.snapshot().availability
    assert shown.changes == 1


def test_a_broken_listener_is_counted_and_the_others_still_hear(journal: Journal) -> None:
    availability, health, _ = _make(journal, hold_off=0)

    def broken(state: TerminalState) -> None:
        raise RuntimeError("platform bug")

    seen: list[bool] = []
    availability.subscribe(None, broken)
    unsubscribe = availability.subscribe(None, lambda s: seen.append(s.available))
    health.report_terminal("SIM-0001", online=False)
    availability.evaluate()
    assert seen == [True, False]
    assert availability.listener_errors == 2
    unsubscribe()
    health.report_terminal("SIM-0001", online=True)
    availability.evaluate()
    assert seen == [True, False]


def test_a_failed_sale_asks_for_a_check_now(journal: Journal) -> None:
    availability, _, _ = _make(journal)
    woken: list[bool] = []
    availability.wake = lambda: woken.append(True)
    event = SaleEvent(sale_id="s", order_id="o", source="t", state=SaleState.FAILED,
                      amount_cents=100)
    availability.on_sale_event(event)
    availability.on_sale_event(SaleEvent(sale_id="s", order_id="o", source="t",
                                         state=SaleState.COMPLETED, amount_cents=100))
    assert woken == [True]


def test_events_wait_in_memory_while_the_journal_is_read_only(journal: Journal) -> None:
    log = EventLog(lambda: journal.db)
    log.open()
    log.probe()
    journal.db.execute("PRAGMA query_only = ON")
    with pytest.raises(Exception, match="readonly"):
        log.probe()
    kept = log.record("out_of_service", "SIM-0001", {"reason": "journal not writable"})
    assert kept.id is None
    assert log.unwritten == 1
    assert [e.kind for e in log.recent()] == ["out_of_service"]  # shown while waiting
    journal.db.execute("PRAGMA query_only = OFF")
    log.probe()  # the first write that works writes what waited, with its own time
    assert log.unwritten == 0
    [written] = log.recent()
    assert written.id is not None
    assert written.at == kept.at
    assert log.prune(keep_days=1, now=kept.at + 2 * 86400) == 1


def test_event_details_are_redacted(journal: Journal) -> None:
    log = EventLog(lambda: journal.db)
    log.open()
    event = log.record("out_of_service", "SIM-0001", {"reason": "card 4111111111111111 refused"})
    assert "4111111111111111" not in str(event.detail)


def test_a_terminal_that_is_not_configured_takes_no_card_and_says_why(journal: Journal) -> None:
    availability, _, _ = _make(journal)
    seen: list[TerminalState] = []
    availability.subscribe("SIM-0099", seen.append)
    assert [(s.available, s.reason) for s in seen] == [
        (False, "terminal SIM-0099 is not configured")
    ]

    def resolve(name: str | None) -> str:
        raise ValueError(f"unknown terminal {name!r}; configured: SIM-0001 (front)")

    strict = Availability(Health("1"), ["SIM-0001"], resolve=resolve)
    assert strict.state("back").reason == "unknown terminal 'back'; configured: SIM-0001 (front)"


def test_how_long_a_terminal_was_out_is_real_time_whatever_the_wall_clock_did(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was the difference of two wall times: NTP stepping the clock back an hour during a
    30-s outage logged "back in service after -3570.0 s" and journaled that."""
    import kiosk_agent.health.availability as module

    availability, health, clock = _make(journal, hold_off=0)
    health.report_terminal("SIM-0001", online=False, detail="timed out")
    availability.evaluate()
    wall = module.time.time()
    monkeypatch.setattr(module.time, "time", lambda: wall - 3600.0)  # NTP steps it back
    clock.now += 30.0
    health.report_terminal("SIM-0001", online=True)
    availability.evaluate()
    assert availability.log is not None
    back = availability.log.recent()[0]
    assert (back.kind, back.detail) == ("in_service", {"out_of_service_s": 30.0})


def test_a_start_that_became_an_outage_ends_as_one(journal: Journal) -> None:
    # out for the start's file check, then offline too: an outage. The terminal answering
    # again while the check goes on must not turn the outage back into a quiet start: the
    # episode ends with its in_service event when the terminal can take cards
    availability, health, _ = _make(journal, hold_off=30, starting=True)
    health.report_journal_state(file_checking=True)
    availability.evaluate(at_start=True)
    availability.readers_started()
    health.report_terminal("SIM-0001", online=False, detail="timed out")
    availability.evaluate()
    health.report_terminal("SIM-0001", online=True)
    availability.evaluate()
    state = availability.state()
    assert (state.available, state.starting, state.reason) == (False, False, FILE_CHECK_REASON)
    health.report_journal_state(file_checking=False)
    availability.evaluate()
    assert availability.state().available
    assert availability.log is not None
    assert [e.kind for e in availability.log.recent()] == ["in_service", "out_of_service"]


class _Events:
    """The agent's event log as the decider writes it: (kind, terminal) in order."""

    def __init__(self) -> None:
        self.written: list[tuple[str, str]] = []

    def record(self, kind: str, subject: str, detail: object = None) -> None:
        self.written.append((kind, subject))


_MOVES = st.sampled_from([
    "file_check", "file_checked", "offline", "online", "unreachable", "reachable",
    "not_writable", "writable", "evaluate", "evaluate", "later", "readers_started", "stop",
])  # fmt: skip


@settings(deadline=None)
@given(st.lists(_MOVES, max_size=40))
@example(["file_check", "readers_started", "offline", "evaluate", "online", "evaluate",
          "file_checked", "evaluate"])  # a start turned outage, then back: the episode ends
def test_whatever_happens_episodes_are_whole_and_a_start_is_none(moves: list[str]) -> None:
    health = Health("1")
    health.report_service(True)
    health.report_terminal("SIM-0001", online=True)
    clock = Clock()
    events = _Events()
    availability = Availability(health, ["SIM-0001"], hold_off=2.0, recheck_interval=0.5,
                                log=events, clock=clock, starting=True)  # type: ignore[arg-type]
    availability.evaluate(at_start=True)
    apply = {
        "file_check": lambda: health.report_journal_state(file_checking=True),
        "file_checked": lambda: health.report_journal_state(file_checking=False),
        "offline": lambda: health.report_terminal("SIM-0001", online=False, detail="timed out"),
        "online": lambda: health.report_terminal("SIM-0001", online=True),
        "unreachable": lambda: health.report_service(False, "cannot connect"),
        "reachable": lambda: health.report_service(True),
        "not_writable": lambda: health.report_journal(False, "disk full"),
        "writable": lambda: health.report_journal(True),
        "later": lambda: setattr(clock, "now", clock.now + 1.5),
        "readers_started": availability.readers_started,
        "stop": lambda: availability.stop_taking_cards("the agent is stopping"),
        "evaluate": availability.evaluate,
    }
    ever_ready = False
    for move in moves:
        if move == "readers_started" and availability.readers_enabled:
            continue
        apply[move]()
        state = availability.state()
        assert not (state.starting and state.available)
        if not availability.readers_enabled:  # before any reader: nothing is an outage
            assert events.written == [], move
        ever_ready = ever_ready or (availability.readers_enabled and state.available)
        if ever_ready:
            assert not state.starting  # once in service, never starting again
    kinds = [kind for kind, _ in events.written]
    # whole episodes: out, in, out, in ..., never two of a kind in a row, never in first
    assert kinds == ["out_of_service", "in_service"] * (len(kinds) // 2) + (
        ["out_of_service"] if len(kinds) % 2 else []
    )
    state = availability.state()
    [shown] = health.snapshot().availability
    assert shown.changes == kinds.count("out_of_service")
    assert (shown.available, shown.starting) == (state.available, state.starting)
    assert not state.available or len(kinds) % 2 == 0  # in service: no episode left open
