import asyncio
import dataclasses
import datetime as dt
import time

import pytest
import voluptuous as vol

from kiosk_agent.bus import EventBus
from kiosk_agent.health.defaults import section_defaults
from kiosk_agent.health.model import (
    Health,
    HealthChecker,
    HealthSnapshot,
    Status,
)
from kiosk_agent.health.schema import HEALTH_SCHEMA
from kiosk_agent.moments import day_start
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import SaleState, Step

from ..helpers import until


def _event(
    sale_id: str, state: SaleState, amount: int = 250, captured: int = 0, created: float = 0.0
) -> SaleEvent:
    return SaleEvent(
        sale_id=sale_id,
        order_id=f"o-{sale_id}",
        source="virtual:test",
        state=state,
        amount_cents=amount,
        captured_cents=captured,
        created_at=created,
    )


def test_a_fresh_agent_is_ok_and_reports_its_version() -> None:
    snapshot = Health("1.2.3").snapshot()
    assert isinstance(snapshot, HealthSnapshot)
    assert snapshot.version == "1.2.3"
    assert snapshot.status is Status.OK
    assert snapshot.problems == []
    assert snapshot.uptime_s >= 0


def test_a_lost_serial_link_degrades_and_names_the_link() -> None:
    health = Health("1")
    health.report_link("mdb:front", "connected")
    first_since = health.snapshot().links[0].since
    health.report_link("mdb:front", "connected")
    assert health.snapshot().links[0].since == first_since  # same state keeps its start time

    health.report_link("mdb:front", "disconnected", "port vanished")
    snapshot = health.snapshot()
    assert snapshot.status is Status.DEGRADED
    assert snapshot.links[0].healthy is False
    assert snapshot.problems == ["link mdb:front disconnected port vanished"]


def test_terminals_keep_their_last_ping_across_failed_checks() -> None:
    health = Health("1")
    health.report_terminal("SIM-0001", online=True, connected=True, latency_ms=12.0, pinged=True)
    pinged_at = health.snapshot().terminals[0].last_ping_at
    assert pinged_at is not None
    health.report_terminal("SIM-0001", online=False, detail="timed out")
    terminal = health.snapshot().terminals[0]
    assert terminal.last_ping_at == pinged_at
    assert terminal.latency_ms == 12.0
    assert terminal.connected is True
    # the only terminal is offline: no sale can succeed
    assert health.snapshot().status is Status.DOWN


def test_unreachable_service_is_down() -> None:
    health = Health("1")
    health.report_service(False, "ServiceUnreachableError")
    snapshot = health.snapshot()
    assert snapshot.status is Status.DOWN
    assert snapshot.problems == ["service unreachable: ServiceUnreachableError"]


def test_key_expiry_soon_is_a_problem() -> None:
    health = Health("1", key_warning=3600)
    health.report_key_expiry(time.time() + 60)
    snapshot = health.snapshot()
    assert snapshot.service.key_expires_in_s is not None
    assert 0 < snapshot.service.key_expires_in_s <= 60
    assert snapshot.status is Status.DEGRADED


def test_sales_are_counted_open_attention_and_today() -> None:
    health = Health("1")
    health.record_sale(_event("a", SaleState.STARTED))
    health.record_sale(_event("b", SaleState.STARTED))
    health.record_sale(_event("c", SaleState.STARTED))
    assert health.snapshot().sales.open == 3
    health.record_sale(_event("a", SaleState.COMPLETED, amount=300, captured=250))
    health.record_sale(_event("b", SaleState.DECLINED))
    health.record_sale(_event("c", SaleState.ATTENTION))
    sales = health.snapshot().sales
    assert (sales.open, sales.attention, sales.today_count, sales.today_amount_cents) == (
        0,
        1,
        1,
        250,
    )
    assert health.snapshot().status is Status.DEGRADED


def test_a_receipt_note_is_not_counted_as_a_second_sale() -> None:
    health = Health("1")
    completed = _event("a", SaleState.COMPLETED, captured=250)
    health.record_sale(completed)
    health.record_sale(dataclasses.replace(completed, step=Step.RECEIPT, message="receipt printed"))
    sales = health.snapshot().sales
    assert (sales.today_count, sales.today_amount_cents) == (1, 250)


def test_the_days_amount_is_what_was_captured_as_the_journal_sums_it() -> None:
    """A completed enrollment saves a card and takes nothing: the day's amount counted its
    $7.50 asked while the agent ran, and the journal's sum (Journal.today, read at start) did
    not, so the page's "Sales today" changed at a restart."""
    health = Health("1")
    health.record_sale(_event("a", SaleState.COMPLETED, amount=750, captured=0))
    health.record_sale(_event("b", SaleState.COMPLETED, amount=500, captured=180))
    sales = health.snapshot().sales
    assert (sales.today_count, sales.today_amount_cents) == (2, 180)


def test_running_totals_only_grow_across_midnight_where_the_day_starts_again() -> None:
    day = [dt.date(2026, 11, 24)]
    health = Health("1", today=lambda: day[0])
    reversed_sale = dataclasses.replace(_event("b", SaleState.REVERSED), reversed_cents=300)
    for event in (_event("a", SaleState.COMPLETED, captured=250), reversed_sale):
        health.record_sale(event)
    before = health.sale_totals()
    day[0] = dt.date(2026, 11, 25)  # midnight passes
    assert health.snapshot().sales.today_count == 0  # the day's figures start again
    assert health.sale_totals() == before  # the totals do not
    health.record_sale(dataclasses.replace(_event("c", SaleState.COMPLETED, captured=100),
                                           terminal="SIM-0001"))
    totals = health.sale_totals()
    assert totals.sales == {("", SaleState.COMPLETED): 1, ("", SaleState.REVERSED): 1,
                            ("SIM-0001", SaleState.COMPLETED): 1}
    assert (totals.captured_cents, totals.reversed_cents) == ({"": 250, "SIM-0001": 100},
                                                              {"": 300})
    assert health.snapshot().sales.today_count == 1


def test_a_step_that_ends_nothing_does_not_read_the_day() -> None:
    """The day is read when a count of it changes (a sale's end) and when it is shown, not on
    each of a sale's steps (a date made from the clock, five times a kiosk API sale); a sale
    that starts before midnight and ends after it still counts on the day it began."""
    day = [dt.date(2026, 11, 24)]
    reads = []

    def today() -> dt.date:
        reads.append(day[0])
        return day[0]

    health = Health("1", today=today)
    reads.clear()
    for state in (SaleState.STARTED, SaleState.CHARGING, SaleState.DISPENSING):
        health.record_sale(_event("a", state))
    assert reads == []
    assert health.snapshot().sales.open == 1
    day[0] = dt.date(2026, 11, 25)  # midnight passes while the sale dispenses
    ended = dataclasses.replace(_event("a", SaleState.COMPLETED, captured=250),
                                created_at=day_start(dt.date(2026, 11, 24)) + 86399)
    health.record_sale(ended)
    assert reads[-1] == dt.date(2026, 11, 25)
    assert health.snapshot().sales.today_count == 0  # it began yesterday
    assert health.snapshot().sales.open == 0


def test_a_sale_held_then_resolved_counts_in_both_outcomes() -> None:
    health = Health("1")
    health.record_sale(_event("a", SaleState.ATTENTION))
    health.record_sale(_event("a", SaleState.COMPLETED, captured=250))
    assert health.sale_totals().sales == {("", SaleState.ATTENTION): 1,
                                          ("", SaleState.COMPLETED): 1}


async def test_follow_sales_reads_the_event_bus() -> None:
    health = Health("1")
    bus: EventBus[SaleEvent] = EventBus()
    task = asyncio.create_task(health.follow_sales(bus))
    while bus.subscriber_count == 0:
        await asyncio.sleep(0)
    bus.publish(_event("a", SaleState.COMPLETED, amount=125, captured=125))
    for _ in range(10):
        await asyncio.sleep(0)
    task.cancel()
    assert health.snapshot().sales.today_amount_cents == 125


def test_schema_defaults_and_refuses_nonsense() -> None:
    defaults = {
        "ping_interval": 60.0,
        "ping_timeout": 10.0,
        "key_warning": 86400.0,
        "hold_off": 0.5,
        "recheck_interval": 1.0,
    }
    assert HEALTH_SCHEMA({}) == defaults
    # what an agent whose configuration has no health: section reads, without the schema
    assert section_defaults() == defaults
    with pytest.raises(vol.Invalid, match="ping_interval"):
        HEALTH_SCHEMA({"ping_interval": 0})


async def test_checker_pings_the_simulators_terminals(service) -> None:
    await service.terminal.connect("SIM-0002")
    await service.keys.refresh()  # a rotated key has an expiry (the seeded one has none)
    health = Health("1")
    checker = HealthChecker(
        health,
        service.terminal,
        ["SIM-0001", "SIM-0002", "NOPE-1"],
        key_expiry=lambda: service.transport.keys.credentials.api_key_expires_at,
    )
    await checker.check_once()
    snapshot = health.snapshot()
    assert snapshot.service.reachable is True
    assert snapshot.service.key_expires_at is not None
    assert snapshot.service.key_expires_in_s is not None
    assert snapshot.service.key_expires_in_s > 0
    by_id = {t.device_id: t for t in snapshot.terminals}
    assert by_id["SIM-0001"].online is True
    assert by_id["SIM-0001"].last_ping_at is not None
    assert by_id["SIM-0002"].connected is True
    assert by_id["NOPE-1"].online is False
    assert by_id["NOPE-1"].detail == "not listed by the service"
    assert snapshot.status is Status.DEGRADED


async def test_checker_says_the_service_is_unreachable(sim, service) -> None:
    await sim.stop()
    health = Health("1")
    await HealthChecker(health, service.terminal, ["SIM-0001"], timeout=0.3).check_once()
    snapshot = health.snapshot()
    assert snapshot.service.reachable is False
    assert snapshot.status is Status.DOWN


async def test_checker_runs_in_the_background(service) -> None:
    health = Health("1")
    checker = HealthChecker(health, service.terminal, ["SIM-0003"], interval=0.05)
    checker.start()
    try:
        for _ in range(100):
            if health.snapshot().terminals:
                break
            await asyncio.sleep(0.02)
    finally:
        await checker.stop()
    assert health.snapshot().terminals[0].device_id == "SIM-0003"


def test_details_are_redacted_on_the_way_in() -> None:
    health = Health("1")
    health.report_service(False, "refused: Authorization: Bearer sk_live_abcdef123456")
    health.report_link("serial:door", "error", "echoed 4111 1111 1111 1111 back")
    snapshot = health.snapshot()
    text = snapshot.model_dump_json()
    assert "sk_live_abcdef123456" not in text
    assert "4111 1111 1111 1111" not in text
    assert "[REDACTED]" in snapshot.service.detail


def test_only_internal_failures_make_the_agent_not_alive() -> None:
    health = Health("1")
    health.report_service(False, "network down")
    assert health.alive()  # a restart would not bring the network back
    health.report_fatal("journal", "disk I/O error")
    assert not health.alive()
    assert health.snapshot().status is Status.DOWN
    assert "journal failed: disk I/O error" in health.snapshot().problems
    health.clear_fatal("journal")
    assert health.alive()


def test_settling_names_what_is_still_starting() -> None:
    health = Health("1")
    health.report_link("mdb:front", "connecting")
    assert health.settling() == ["link mdb:front", "service check"]
    health.report_service(True)
    health.report_terminal("SIM-0001", online=None)
    assert health.settling() == ["link mdb:front", "terminal check"]
    health.report_link("mdb:front", "connected")
    health.report_terminal("SIM-0001", online=False)
    assert health.settling() == []  # settled, even if what it found is a problem


def test_a_link_never_up_yet_is_still_starting_one_that_was_up_is_down() -> None:
    """A USB adapter that appears after boot fails its first open at once: `disconnected`
    without ever having been up is starting, not broken; after it was up, it is a problem."""
    health = Health("1")
    health.report_service(True)
    health.report_link("mdb:front", "disconnected", "no such device")
    assert health.settling() == ["link mdb:front"]
    health.report_link("mdb:front", "connected")
    health.report_link("mdb:front", "disconnected", "unplugged")
    assert health.settling() == []
    assert "link mdb:front disconnected unplugged" in health.snapshot().problems


def test_change_listeners_hear_each_report_until_they_leave() -> None:
    health = Health("1")
    heard: list[str] = []
    leave = health.on_change(lambda: heard.append("changed"))
    health.report_journal(False, "disk full")
    health.report_fatal("journal", "disk full")
    leave()
    health.report_journal(True)
    assert heard == ["changed", "changed"]


async def test_a_refused_key_is_not_an_unreachable_service(sim) -> None:
    from kiosk_agent.cli.sim import settings_from_ready
    from kiosk_agent.service.client import ServiceClient

    info = {**sim.ready_info(), "api_key": "revoked-key", "refresh_token": None}
    async with ServiceClient(settings_from_ready(info)) as refused:
        health = Health("1")
        await HealthChecker(health, refused.terminal, ["SIM-0001"], timeout=5).check_once()
    snapshot = health.snapshot()
    assert snapshot.service.reachable is True
    assert snapshot.service.key_usable is False
    assert snapshot.status is Status.DOWN
    assert snapshot.problems[0].startswith("API key refused: AuthenticationError")


async def test_each_round_probes_the_journal_and_can_be_woken(service, tmp_path) -> None:
    from kiosk_agent.sales.events import EventLog
    from kiosk_agent.sales.journal import Journal

    journal = Journal(tmp_path / "journal.db")
    journal.open()
    log = EventLog(lambda: journal.db)
    log.open()
    health = Health("1")
    rounds: list[int] = []
    checker = HealthChecker(health, service.terminal, ["SIM-0001"], interval=3600,
                            journal_probe=log.probe, on_checked=lambda: rounds.append(1))
    checker.start()
    try:
        await until(lambda: rounds == [1])
        assert health.snapshot().journal.writable is True
        journal.db.execute("PRAGMA query_only = ON")
        checker.wake()  # not an hour later
        await until(lambda: len(rounds) == 2)
        snapshot = health.snapshot()
        assert snapshot.journal.writable is False
        assert "readonly" in snapshot.journal.detail
        assert snapshot.status is Status.DOWN
    finally:
        await checker.stop()
        journal.close()


async def test_a_broken_round_is_counted_and_the_checker_goes_on(service) -> None:
    health = Health("1")

    def broken() -> None:
        raise RuntimeError("a bug after the checks")

    checker = HealthChecker(health, service.terminal, ["SIM-0001"], interval=0.01,
                            on_checked=broken)
    checker.start()
    try:
        await until(lambda: checker.errors >= 2)
    finally:
        await checker.stop()
    assert checker.rounds >= 2


async def test_a_wake_just_before_the_stop_does_not_keep_the_checker_running(service) -> None:
    """A sale that fails as the agent stops wakes the checker in the same step the stop
    cancels it: it must still end (it once ran on, and ``kiosk-agent run`` never exited)."""
    checker = HealthChecker(Health("1"), service.terminal, ["SIM-0001"], interval=60)
    checker.start()
    await until(lambda: checker.rounds >= 1)  # waiting out its interval now
    checker.wake()
    done, _ = await asyncio.wait({asyncio.ensure_future(checker.stop())}, timeout=5)
    assert done, "the checker's stop hung"
    assert checker.rounds == 1


def test_unexpected_errors_a_part_caught_are_shown_counted_and_degrade() -> None:
    health = Health("1.0")
    caught = {"health check": 0}
    health.count_errors_of("health check", lambda: caught["health check"])
    assert health.snapshot().errors == {}
    assert health.snapshot().status == "ok"
    caught["health check"] = 2
    snapshot = health.snapshot()
    assert snapshot.errors == {"health check": 2}
    assert snapshot.status == "degraded"
    assert "unexpected errors, logged with their tracebacks: health check 2" in snapshot.problems


async def test_a_configured_terminal_name_wins_over_the_services(service) -> None:
    """The agent starts with the configuration's names ("front") and its first round of pings
    put the service's ("Counter 1") in their place: the status page's terminal and `health`
    changed names under the technician a minute after the start."""
    health = Health("1")
    health.report_terminal("SIM-0001", online=True, name="front")  # as the agent starts
    checker = HealthChecker(
        health, service.terminal, ["SIM-0001", "SIM-0002"], names={"SIM-0001": "front"}
    )
    await checker.check_once()
    by_id = {t.device_id: t for t in health.snapshot().terminals}
    assert by_id["SIM-0001"].name == "front"
    listed = {t.device_id: t.name for t in await service.terminal.list()}
    assert by_id["SIM-0002"].name == listed["SIM-0002"]  # no configured name: the service's


def test_a_sale_is_todays_on_the_utc_day_it_was_created_as_the_journal_counts_it() -> None:
    """One rule of days on every face (kiosk_agent.moments): a sale begun at 23:59 UTC and
    paid at 00:01 counted on the new day in "Sales today" (by when it ended) and on the old
    day in `sales --since/--until` (by when it was created). Now by when it was created,
    here as in Journal.today, whatever it waited for (a person resolving an attention sale)."""
    day = [dt.date(2026, 11, 24)]
    health = Health("1", today=lambda: day[0])
    before_midnight = dt.datetime(2026, 11, 24, 23, 59, tzinfo=dt.UTC).timestamp()
    after_midnight = before_midnight + 120
    health.record_sale(_event("held", SaleState.ATTENTION, captured=250, created=before_midnight))
    health.record_sale(_event("same-day", SaleState.COMPLETED, captured=100,
                              created=before_midnight))
    assert (health.snapshot().sales.today_count, health.snapshot().sales.today_amount_cents) == (
        1, 100
    )
    day[0] = dt.date(2026, 11, 25)
    # ended after midnight: yesterday's sales all the same
    health.record_sale(_event("held", SaleState.COMPLETED, captured=250, created=before_midnight))
    health.record_sale(_event("straddles", SaleState.COMPLETED, captured=300,
                              created=before_midnight))
    health.record_sale(_event("new", SaleState.COMPLETED, captured=400, created=after_midnight))
    sales = health.snapshot().sales
    assert (sales.today_count, sales.today_amount_cents, sales.attention) == (1, 400, 0)
    assert sales.day_started_at == dt.datetime(2026, 11, 25, tzinfo=dt.UTC).timestamp()


def test_the_day_is_the_utc_day_whatever_the_units_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")  # UTC+14: its local date is a day ahead
    time.tzset()
    try:
        now = time.time()
        midnight = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        assert Health("1").snapshot().sales.day_started_at == midnight.timestamp() <= now
    finally:
        monkeypatch.undo()
        time.tzset()


def test_a_card_session_with_no_selection_is_counted_apart_from_the_sales() -> None:
    """One rule of what a sale is (sales.kinds): a card-first session that ended with nothing
    chosen is not in the sales' totals (kiosk_agent_sales_total), it is counted apart; the
    hold it released is still money given back."""
    health = Health("1")
    session = dataclasses.replace(
        _event("walked", SaleState.REVERSED, amount=500), flow="authorize_capture",
        terminal="SIM-0008", reversed_cents=500,
    )
    chosen = dataclasses.replace(session, sale_id="chose", product="K1")  # the vend failed
    for event in (session, chosen):
        health.record_sale(event)
    totals = health.sale_totals()
    assert totals.sales == {("SIM-0008", SaleState.REVERSED): 1}
    assert totals.no_selection == {"SIM-0008": 1}
    assert totals.reversed_cents == {"SIM-0008": 1000}
