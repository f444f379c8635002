"""The fleet as the broker holds it: units read from retained topics alone."""

import asyncio
import datetime as dt
import json
import time
import uuid
import zoneinfo

import aiomqtt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.fleet.inventory import (
    MAX_PAYLOAD_BYTES,
    Unit,
    _control_in,
    _may_hold_control,
    _payload_text,
    retained,
    units,
)
from kiosk_agent.fleet.report import build_report

from ..mqtt_broker import mosquitto
from .helpers import TcpProxy, settled_agent

__all__ = ["mosquitto"]  # the broker fixture, imported for the tests below


def _state(device_id: str, **changes: object) -> str:
    report = build_report(device_id, settled_agent().health.snapshot(), 60.0)
    return json.dumps({**report, **changes})


def test_units_from_state_and_availability_topics() -> None:
    found = {
        "kiosk-agent/a1/state": _state("a1"),
        "kiosk-agent/a1/availability": "online",
        "kiosk-agent/b2/availability": "offline",  # its state was cleared
        "kiosk-agent/c3/state": "not json",  # a foreign payload: listed, named invalid
        "kiosk-agent/eu/d4/state": _state("d4"),  # another shard's prefix
        "other/e5/state": _state("e5"),
    }
    fleet = units("kiosk-agent", found)
    assert [u.device_id for u in fleet] == ["a1", "b2", "c3"]
    now = time.time()
    assert [u.status(now) for u in fleet] == ["ok", "offline", "invalid"]
    assert fleet[2].summary(now)["problems"] == ["its report is not JSON: 'not json'"]
    assert [u.device_id for u in units("kiosk-agent/eu", found)] == ["d4"]


def test_a_unit_whose_reports_stopped_is_stale_and_yesterdays_sales_are_not_today() -> None:
    report = json.loads(_state("a1"))
    unit = Unit("a1", "online", report)
    now = report["at"]
    assert unit.status(now + 60) == "ok"
    assert unit.status(now + 3 * 60 * 1.1 + 1) == "stale"  # three beats missed, connection open
    assert unit.sales_today(now) == (0, 0)
    day_after = report["sales"]["day_started_at"] + 86400 + 3600
    assert unit.sales_today(day_after) is None
    summary = unit.summary(day_after)
    assert (summary["sales_today"], summary["version"], summary["online"]) == (None, "9.9.9", True)


def test_last_seen_is_an_iso_time_in_utc_as_every_json_timestamp() -> None:
    """`fleet list --json` gave it as Unix seconds, alone among the command line's times."""
    report = json.loads(_state("a1"))
    report["at"] = dt.datetime(2026, 11, 22, 10, 15, 30, 900_000, tzinfo=dt.UTC).timestamp()
    assert Unit("a1", "online", report).summary(report["at"])["last_seen"] == "2026-11-22T10:15:30Z"
    assert Unit("a2", "online", None).summary(report["at"])["last_seen"] is None


def test_sales_of_a_day_that_ended_are_not_today_the_hour_after_midnight() -> None:
    """Before: a report counted as today's until 25 h after its day began (a DST day is 25 h),
    so from 00:00 to 01:00 `fleet list` showed a unit gone quiet at 23:59 with yesterday's sales
    as today's. The day ends at the unit's own next midnight, by the offset its report names
    (a fleet across time zones: the listing's clock is not the unit's)."""
    tokyo = dt.timezone(dt.timedelta(hours=9))
    midnight = dt.datetime(2026, 3, 10, tzinfo=tokyo)
    report = json.loads(_state("a1"))
    report["sales"].update(today_count=50, today_amount_cents=12345,
                           day_started_at=midnight.timestamp(),
                           day_started=midnight.isoformat())
    report["at"] = (midnight + dt.timedelta(hours=23, minutes=59)).timestamp()
    unit = Unit("a1", "offline", report)
    assert unit.sales_today(report["at"] + 30) == (50, 12345)
    half_past = (midnight + dt.timedelta(hours=24, minutes=30)).timestamp()
    assert unit.sales_today(half_past) is None
    assert unit.summary(half_past)["sales_today"] is None


# What any careless or hostile client of the broker can leave on a unit's state topic, and how
# `fleet list` names it. Before: one of these made the whole listing fail ("invalid literal for
# int()", "'list' object has no attribute 'get'"), or printed a terminal escape as it came.
HOSTILE = [
    ("[1, 2]", "its report is a JSON list, not an object"),
    ('{"status": 5}', "its report's status is 5, not one of ok, degraded, down, stopped"),
    ('{"status": "ok", "problems": "abc"}', "its report's problems is \"abc\", not a list of text"),
    ('{"status": "ok", "sales": {"today_count": "many"}}',
     "its report's sales.today_count is \"many\", not a whole number, 0 or more"),
    ('{"status": "ok", "sales": {"attention": 1, "attention_cents": "lots"}}',
     "its report's sales.attention_cents is \"lots\", not a whole number, 0 or more"),
    ('{"status": "ok", "sales": {"late_vends": -1}}',
     "its report's sales.late_vends is -1, not a whole number, 0 or more"),
    ('{"status": "ok", "sales": {"maybe_dispensed": 1.5}}',
     "its report's sales.maybe_dispensed is 1.5, not a whole number, 0 or more"),
    ('{"status": "ok", "sales": [1]}', "its report's sales is [1], not an object"),
    ('{"status": "ok", "at": 1e999}', "its report's at is Infinity, not a Unix time"),
    ('{"status": "ok", "at": -1e300}', "its report's at is -1e+300, not a Unix time"),
    ('{"status": "ok", "version": {"a": 1}}', "its report's version is {\"a\": 1}, not text"),
    ('{"status": "ok", "terminals": [{"device_id": "T1", "online": "yes"}]}',
     "its report's terminals is [{\"device_id\": \"T1\", \"online\": \"yes\"}], not a list of "
     "terminals (device_id, online, latency_ms)"),
    ('{"status": "\\u001b[31mok", "problems": []}', "a control character (U+001B) in status"),
    ('{"status": "ok", "problems": ["x\\u001b]0;pwned\\u0007"]}',
     "a control character (U+001B) in problems.0"),
]


@pytest.mark.parametrize(("payload", "named"), HOSTILE)
def test_a_foreign_report_makes_its_unit_invalid_and_says_why(payload: str, named: str) -> None:
    [unit] = units("kiosk-agent", {"kiosk-agent/x1/state": payload})
    summary = unit.summary(time.time())
    assert (summary["status"], summary["problems"]) == ("invalid", [named])
    assert unit.report is None  # nothing of it reaches `fleet show`'s health view


def test_an_oversized_payload_is_not_kept_and_a_foreign_availability_is_named() -> None:
    huge = _payload_text(b"{" + b" " * (MAX_PAYLOAD_BYTES + 10) + b"}")
    assert len(huge) < 100  # the listing's memory stays bounded whatever is retained
    fleet = units("kiosk-agent", {
        "kiosk-agent/big/state": huge,
        "kiosk-agent/odd/state": _state("odd"),
        "kiosk-agent/odd/availability": "\x1b[31mmaybe",
    })
    now = time.time()
    assert [u.summary(now)["problems"] for u in fleet] == [
        [f"its report is {MAX_PAYLOAD_BYTES + 12:,} bytes, more than {MAX_PAYLOAD_BYTES:,}"],
        ["its availability is '\\x1b[31mmaybe', not online or offline"],
    ]
    assert [u.availability for u in fleet] == ["", ""]


@pytest.mark.mqtt
async def test_two_listings_at_once_from_one_pid_do_not_take_each_others_connection(
    mosquitto: int,
) -> None:
    """Before: a listing's client id was kiosk-agent-fleet-<pid>. Every container that runs the
    command (`docker run ... fleet list`, a cron job in a pod) is pid 1 there, so two admins or
    two cron jobs at the same moment took the connection from each other: one failed with
    "cannot reach the MQTT broker". Two collections in one process show the same."""
    conf = {"host": "127.0.0.1", "port": mosquitto}
    async with aiomqtt.Client("127.0.0.1", mosquitto) as unit:
        await unit.publish("pid-one/u1/state", _state("u1"), qos=1, retain=True)
    try:
        first, second = await asyncio.gather(
            retained(conf, ["pid-one/+/state"], wait=2.0, quiet=0.5),
            retained(conf, ["pid-one/+/state"], wait=2.0, quiet=0.5),
        )
        assert list(first) == list(second) == ["pid-one/u1/state"]
    finally:
        async with aiomqtt.Client("127.0.0.1", mosquitto) as unit:
            await unit.publish("pid-one/u1/state", b"", qos=1, retain=True)


@pytest.mark.mqtt
async def test_the_listing_ends_when_the_broker_has_handed_every_retained_report(
    mosquitto: int,
) -> None:
    """Before: the collection ended at the first pause of 0.3 s, a guess: on a busy machine
    the pause came early and `fleet list` showed 1,553 of 3,000 units without a word. A
    message sent to itself after subscribing marks the end; here the pause allowed is none."""
    prefix = f"marker-{uuid.uuid4().hex[:8]}"
    report = _state("u")
    async with aiomqtt.Client("127.0.0.1", mosquitto) as units:
        for i in range(300):
            await units.publish(f"{prefix}/u{i}/state", report, qos=0, retain=True)
        await units.publish(f"{prefix}/u300/state", report, qos=1, retain=True)
    conf = {"host": "127.0.0.1", "port": mosquitto, "topic_prefix": prefix}
    try:
        found = await retained(conf, [f"{prefix}/+/state"], wait=5.0, quiet=0.0)
        assert len(found) == 301
        assert found.complete
    finally:
        async with aiomqtt.Client("127.0.0.1", mosquitto) as units:
            for i in range(301):
                await units.publish(f"{prefix}/u{i}/state", b"", qos=0, retain=True)


@pytest.mark.mqtt
async def test_reports_kept_at_qos_1_are_all_handed_before_the_end_marker(mosquitto: int) -> None:
    """Units publish their reports at QoS 1, and the broker hands them back at QoS 1 to a QoS
    1 subscription: Mosquitto holds those past its in-flight window (20 by default, 100 as
    docs/fleet.md sets it) in a queue that the QoS 0 end marker overtook. `fleet list` of
    10,000 units said it was complete with 785 of them. The listing now subscribes at QoS 0,
    one order for all."""
    prefix = f"qos1-{uuid.uuid4().hex[:8]}"
    report = _state("u")
    async with aiomqtt.Client("127.0.0.1", mosquitto) as units:
        await asyncio.gather(*(units.publish(f"{prefix}/u{i}/state", report, qos=1, retain=True)
                               for i in range(300)))
    slow_link = TcpProxy(mosquitto)  # the listing's acknowledgements come late: a queue
    slow_link.answer_delay = 0.02
    await slow_link.open()
    conf = {"host": "127.0.0.1", "port": slow_link.port, "topic_prefix": prefix}
    try:
        found = await retained(conf, [f"{prefix}/+/state"], wait=20.0)
        assert found.complete
        assert len(found) == 300
    finally:
        await slow_link.cut()
        async with aiomqtt.Client("127.0.0.1", mosquitto) as units:
            for i in range(300):
                await units.publish(f"{prefix}/u{i}/state", b"", qos=0, retain=True)


@pytest.mark.parametrize(
    ("day", "hours"),
    [("2026-11-01", 25), ("2026-03-08", 23), ("2026-07-01", 24)],  # fall back, spring forward
)
def test_a_units_day_is_the_utc_day_whatever_its_zone_does(day: str, hours: int) -> None:
    """Before: the day ended at the report's fixed UTC offset plus 24 h, so in New York on
    2026-11-01 (25 h) `fleet list` showed sales_today empty from 23:00 while the unit reported
    183, and on 2026-03-08 (23 h) yesterday's count until 01:00. A unit's day is now the UTC
    day (the one rule of days on every face, kiosk_agent.moments): 24 hours whatever New York's
    clock does, and `fleet list` ends it where the unit does."""
    new_york = zoneinfo.ZoneInfo("America/New_York")
    local_midnight = dt.datetime.fromisoformat(day).replace(tzinfo=new_york)
    assert (local_midnight + dt.timedelta(days=1)).timestamp() - local_midnight.timestamp() == (
        hours * 3600)
    utc_midnight = dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC)
    report = json.loads(_state("ny"))
    report["sales"].update(today_count=183, today_amount_cents=45750,
                           day_started_at=utc_midnight.timestamp(),
                           day_started=f"{day}T00:00:00Z")
    unit = Unit("ny", "online", report)
    end = utc_midnight.timestamp() + 86400
    assert unit.sales_today(end - 60) == (183, 45750)  # 23:59Z
    assert unit.sales_today(end + 60) is None  # 00:01Z, the next day
    # a report of an older release names its local offset: its day ends at that midnight
    report["sales"].update(day_started_at=local_midnight.timestamp(),
                           day_started=local_midnight.isoformat())
    local_end = local_midnight.timestamp() + 86400
    assert unit.sales_today(local_end - 60) == (183, 45750)
    assert unit.sales_today(local_end + 60) is None


@given(st.dictionaries(st.text(max_size=8), st.text() | st.lists(st.text(), max_size=3),
                       max_size=4), st.booleans())
def test_the_quick_look_misses_no_control_character_the_walk_finds(
    report: dict[str, object], ascii_only: bool,
) -> None:
    """`fleet list` walks a report string by string only when its text may hold a control
    character (a second a thousand reports, walked always): whatever a unit or a stranger
    sends, escaped or not, the quick look says "may" whenever the walk finds one."""
    payload = json.dumps(report, ensure_ascii=ascii_only)
    if _control_in(json.loads(payload), "") is not None:
        assert _may_hold_control(payload)
