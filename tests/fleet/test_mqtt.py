"""The MQTT heartbeat against a real Mosquitto: a TCP proxy between the unit and the broker plays
the network (cutting it drops the connection without a goodbye, as a pulled cable would)."""

import asyncio
import contextlib
import json
import random
import subprocess
import uuid
from collections import Counter, deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiomqtt
import pytest

from kiosk_agent.bus import EventBus
from kiosk_agent.fleet.announce import KEPT_WAIT
from kiosk_agent.fleet.backoff import Backoff
from kiosk_agent.fleet.component import Upstream
from kiosk_agent.fleet.mqtt import STABLE_AFTER, BirthPolicy, MqttSink
from kiosk_agent.fleet.schema import UPSTREAM_SCHEMA
from kiosk_agent.fleet.sink import LOOP_END_TIMEOUT
from kiosk_agent.health.availability import Availability
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import SaleState

from ..helpers import free_port, until
from ..mqtt_broker import Observer, mosquitto, start_broker, stop_broker
from . import home_assistant_rules as ha
from .helpers import TcpProxy, settled_agent, tls_listener

__all__ = ["mosquitto"]  # the broker fixture, imported for the tests below

# --- MQTT ---------------------------------------------------------------------------------------


@pytest.mark.mqtt
async def test_mqtt_discovery_heartbeat_last_will_and_catch_up(mosquitto: int) -> None:
    proxy = TcpProxy(mosquitto)
    await proxy.open()
    observer = Observer(mosquitto)
    await observer.start("kiosk-agent/unit-9/#", "homeassistant/+/unit-9/#")
    conf = {
        "device_id": "unit-9",
        "interval": 3600,
        "mqtt": {"host": "127.0.0.1", "port": proxy.port, "reconnect_interval": 0.1},
    }
    upstream = Upstream(settled_agent(), conf)
    availability = "kiosk-agent/unit-9/availability"
    state = "kiosk-agent/unit-9/state"
    await upstream.start()
    try:
        await until(lambda: observer.on(availability) == ["online"])  # after the first report
        assert len(observer.on(state)) == 1
        problem = json.loads(observer.on("homeassistant/binary_sensor/unit-9/problem/config")[0])
        assert problem["state_topic"] == state
        assert problem["device"]["sw_version"] == "9.9.9"
        assert json.loads(observer.on(state)[0])["terminals_online"] == 1

        # Pull the cable: the broker publishes the last will.
        await proxy.cut()
        await until(lambda: observer.on(availability)[-1:] == ["offline"])
        missed = [upstream.heartbeat() for _ in range(3)]
        sink = upstream.sinks[0]
        await until(lambda: sink.failures >= 1)
        assert sink.queue.dropped == 2  # each replaced by the next before it could be sent

        # The network comes back: online again, and the newest state only (Home Assistant
        # would record each replayed one as a change made now).
        await proxy.open()
        await until(lambda: observer.on(availability)[-2:] == ["offline", "online"])
        assert len(observer.on(state)) == 2
        assert [json.loads(p)["at"] for p in observer.on(state)[1:]] == [missed[-1]["at"]]
    finally:
        await upstream.stop()
    # A clean stop says goodbye itself.
    await until(lambda: observer.on(availability)[-1:] == ["offline"])
    await observer.stop()
    await proxy.cut()


@pytest.mark.mqtt
async def test_mqtt_over_tls_verifies_the_broker(tmp_path: Path) -> None:
    ca, tls = tls_listener(tmp_path)
    proc, port = start_broker(tmp_path, tls)
    try:
        mqtt = {"host": "127.0.0.1", "port": port, "tls": True, "reconnect_interval": 0.1}
        conf = {"interval": 3600, "mqtt": {**mqtt, "ca_file": str(ca)}}
        trusted = Upstream(settled_agent(), conf)
        await trusted.start()
        try:
            await until(lambda: trusted.sinks[0].sent == 1)
        finally:
            await trusted.stop()
        # without the private CA the broker's certificate is refused: nothing is sent, and
        # within one interval it is a problem in health (before: a log line, health ok)
        agent = settled_agent()
        untrusted = Upstream(agent, {"interval": 0.5, "mqtt": mqtt})
        await untrusted.start()
        try:
            await until(lambda: untrusted.sinks[0].failures >= 1)
            assert untrusted.sinks[0].sent == 0
            await until(lambda: agent.health.snapshot().status == "degraded")
            [problem] = agent.health.snapshot().problems
            assert problem.startswith(f"upstream mqtt failing: broker 127.0.0.1:{port}: ")
            assert "CERTIFICATE_VERIFY_FAILED" in problem
        finally:
            await untrusted.stop()
    finally:
        stop_broker(proc)


# quick answers to birth messages, for tests: the shape of the default, shorter
QUICK_BIRTHS = BirthPolicy(settle=0.1, spread=0.05, longest=1.0, min_gap=0.3, max_gap=1.0)


@pytest.mark.mqtt
async def test_home_assistants_birth_message_brings_the_discovery_again(mosquitto: int) -> None:
    observer = Observer(mosquitto)
    await observer.start("kiosk-agent/unit-b/#", "homeassistant/+/unit-b/#")
    conf = {
        "device_id": "unit-b",
        "interval": 3600,
        "mqtt": {"host": "127.0.0.1", "port": mosquitto, "reconnect_interval": 0.1},
    }
    upstream = Upstream(settled_agent(), conf, births=QUICK_BIRTHS)
    problem_topic = "homeassistant/binary_sensor/unit-b/problem/config"
    uptime = "homeassistant/sensor/unit-b/uptime/config"  # an earlier version's, still kept
    async with aiomqtt.Client("127.0.0.1", mosquitto) as earlier:
        await earlier.publish(uptime, json.dumps({"unique_id": "kiosk_agent_unit-b_uptime"}),
                              qos=1, retain=True)
    await upstream.start()
    try:
        await until(lambda: len(observer.on("kiosk-agent/unit-b/state")) == 1)
        configs = [t for t, payload, _ in observer.messages if t.endswith("/config") and payload
                   and t != uptime]
        assert len(configs) == 19
        for topic in configs:  # what the broker hands Home Assistant passes HA's rules
            payload = json.loads(observer.on(topic)[0])
            assert ha.violations(topic, payload, "2024.3") == []
            assert ha.violations(topic, payload, "2026.2") == []
        assert json.loads(observer.on(problem_topic)[0])["expire_after"] == 11880
        # the uptime sensor of earlier versions is cleared: HA removes it
        await until(lambda: observer.on(uptime)[-1:] == [""])

        # Home Assistant restarts and says so: the unit announces itself and its state again
        async with aiomqtt.Client("127.0.0.1", mosquitto) as home_assistant:
            await home_assistant.publish("homeassistant/status", "online", qos=1)
        await until(lambda: len(observer.on(problem_topic)) == 2)
        await until(lambda: len(observer.on("kiosk-agent/unit-b/state")) == 2)
        assert upstream.sinks[0].announcements == 2  # type: ignore[attr-defined]
        assert observer.on("kiosk-agent/unit-b/availability")[-1] == "online"
    finally:
        await upstream.stop()
        await observer.stop()


@pytest.mark.mqtt
async def test_a_storm_of_birth_messages_costs_one_announce_and_one_log_line(
    mosquitto: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Any broker client can publish `homeassistant/status online`: 2,000 of them in 0.8 s
    made a unit announce itself 2,000 times (and log 2,000 lines). The policy's waits run on
    the test's clock: births heard with gaps shorter than `settle` are one storm however long
    the broker and a loaded machine take to deliver them (on real time, a busy machine's pauses
    between births outlasted `settle`, and the test counted a second, rightful, re-announce)."""
    clock = FakeClock(monotonic=0.0)
    conf = {"device_id": "unit-s", "interval": 3600,
            "mqtt": {"host": "127.0.0.1", "port": mosquitto, "reconnect_interval": 0.1}}
    upstream = Upstream(settled_agent(), conf, births=QUICK_BIRTHS, clock=clock)
    await upstream.start()
    sink = upstream.mqtt
    assert sink is not None
    try:
        await until(lambda: sink.sent == 1)
        assert sink.announcements == 1
        await clock.advance_to(10.0)  # long after the first announce: min_gap holds none back
        with caplog.at_level("INFO", logger="kiosk_agent.fleet.mqtt"):
            async with aiomqtt.Client("127.0.0.1", mosquitto) as rogue:
                for heard in (100, 200):
                    for _ in range(100):
                        await rogue.publish("homeassistant/status", "online", qos=0)
                    await until(lambda heard=heard: sink.births_heard == heard)
                    assert sink.announcements == 1  # still coming: not answered yet
                    assert sink.reannounce_at is not None
                    if heard == 100:
                        await clock.advance(QUICK_BIRTHS.settle * 0.9)  # shorter than settle
            due = sink.reannounce_at
            assert due <= clock.monotonic() + QUICK_BIRTHS.settle + QUICK_BIRTHS.spread
            await clock.advance_to(due - 0.001)
            await asyncio.sleep(0.05)
            assert sink.announcements == 1  # not a moment before the births settled
            await clock.advance_to(due)  # the sink's own wait ends: no wake-up from the test
            await until(lambda: sink.announcements == 2)
            await clock.advance(QUICK_BIRTHS.max_gap + QUICK_BIRTHS.longest)  # long quiet
            await asyncio.sleep(0.05)
        assert sink.announcements == 2  # the first, and one for the whole storm
        assert sink.reannounce_at is None
        lines = [r for r in caplog.records if "Home Assistant (re)started" in r.getMessage()]
        assert len(lines) == 1
    finally:
        await upstream.stop()


@pytest.mark.mqtt
async def test_a_retained_birth_message_is_not_a_restart(mosquitto: int) -> None:
    """Home Assistant's birth message may be set to retain (an option in its MQTT settings), and
    any client can retain one. Before: every connect heard that old birth and announced the
    unit a second time (19 more retained publishes each; after a broker restart, the whole
    fleet twice). A birth delivered because the unit subscribed is old; a restart is live."""
    prefix = f"ha-retained-{uuid.uuid4().hex[:8]}"  # this test's birth topic alone
    async with aiomqtt.Client("127.0.0.1", mosquitto) as home_assistant:
        await home_assistant.publish(f"{prefix}/status", "online", qos=1, retain=True)
    conf = {"device_id": "unit-rb", "interval": 3600,
            "mqtt": {"host": "127.0.0.1", "port": mosquitto, "reconnect_interval": 0.1,
                     "discovery_prefix": prefix}}
    clock = FakeClock(monotonic=0.0)
    upstream = Upstream(settled_agent(), conf, births=QUICK_BIRTHS, clock=clock)
    await upstream.start()
    sink = upstream.mqtt
    assert sink is not None
    every_wait = QUICK_BIRTHS.longest + QUICK_BIRTHS.spread + QUICK_BIRTHS.max_gap
    try:
        await until(lambda: sink.sent == 1)  # subscribed: the old birth was handed over
        await clock.advance(every_wait)
        assert sink.announcements == 1
        async with aiomqtt.Client("127.0.0.1", mosquitto) as home_assistant:
            await home_assistant.publish(f"{prefix}/status", "online", qos=1)  # a restart
        # the broker hands over the retained birth before the live one: hearing the live one
        # proves the old one was read, and not taken for a restart
        await until(lambda: sink.births_heard >= 1)
        await clock.advance(every_wait)
        await until(lambda: sink.announcements == 2)
        await clock.advance(every_wait)
        assert sink.births_heard == 1
        assert sink.announcements == 2
    finally:
        await upstream.stop()
        async with aiomqtt.Client("127.0.0.1", mosquitto) as home_assistant:
            await home_assistant.publish(f"{prefix}/status", b"", qos=1, retain=True)


@pytest.mark.mqtt
async def test_a_stop_during_an_announce_leaves_the_unit_offline(mosquitto: int) -> None:
    """Before: a stop that came while the unit answered a birth message published its
    goodbye, and the announce went on and published `online` after it; the clean disconnect
    sends no last will, so the stopped unit stayed `online` on the broker (HA: available;
    `fleet forget`: "says it is online")."""
    proxy = TcpProxy(mosquitto)  # a broker slow to acknowledge: an announce takes a while
    await proxy.open()
    prefix = f"ha-stop-{uuid.uuid4().hex[:8]}"
    conf = {"device_id": "unit-gb", "interval": 3600,
            "mqtt": {"host": "127.0.0.1", "port": proxy.port, "reconnect_interval": 0.1,
                     "discovery_prefix": prefix}}
    upstream = Upstream(settled_agent(), conf, births=QUICK_BIRTHS)
    configs = Observer(mosquitto)
    await configs.start(f"{prefix}/+/unit-gb/+/config")
    await upstream.start()
    sink = upstream.mqtt
    assert sink is not None
    try:
        await until(lambda: sink.sent == 1)
        last = f"{prefix}/event/unit-gb/alert/config"  # the last config of an announce
        await until(lambda: len(configs.on(last)) == 1)
        proxy.answer_delay = 0.05
        async with aiomqtt.Client("127.0.0.1", mosquitto) as home_assistant:
            await home_assistant.publish(f"{prefix}/status", "online", qos=1)
        # the stop comes as the announce's last config reaches the broker: `online` is next
        await until(lambda: len(configs.on(last)) == 2)
    finally:
        await upstream.stop()
        await configs.stop()
    observer = Observer(mosquitto)
    await observer.start("kiosk-agent/unit-gb/availability")
    await until(lambda: bool(observer.on("kiosk-agent/unit-gb/availability")))
    await observer.stop()
    assert observer.on("kiosk-agent/unit-gb/availability") == ["offline"]
    await proxy.cut()


@pytest.mark.mqtt
async def test_a_replaced_terminals_entities_are_removed_from_home_assistant(
    mosquitto: int,
) -> None:
    """A field tech replaces the reader: SIM-0001 out of the configuration, SIM-0002 in.
    Before: the old terminal's retained configs stayed on the broker for ever, and Home
    Assistant kept its two entities, their template failing on every report (the report has no
    SIM-0001 any more). A unit clears the configs under its device id that it no longer
    announces."""
    prefix = f"ha-swap-{uuid.uuid4().hex[:8]}"
    conf = {"device_id": "unit-sw", "interval": 3600,
            "mqtt": {"host": "127.0.0.1", "port": mosquitto, "reconnect_interval": 0.1,
                     "discovery_prefix": prefix}}
    # another program on the host names its device like the host, as the unit's default id
    neighbour = f"{prefix}/sensor/unit-sw/cpu_load/config"
    async with aiomqtt.Client("127.0.0.1", mosquitto) as other:
        await other.publish(neighbour, json.dumps({"unique_id": "unit-sw-cpu", "name": "CPU",
                                                   "state_topic": "unit-sw/cpu"}),
                            qos=1, retain=True)
    for terminals in ({"SIM-0001": "front"}, {"SIM-0002": "front"}):
        agent = settled_agent()
        agent.settings = SimpleNamespace(currency="USD", terminals=terminals)
        upstream = Upstream(agent, conf)
        await upstream.start()
        try:
            await until(lambda u=upstream: u.mqtt is not None and u.mqtt.sent == 1)
            await asyncio.sleep(0.3)  # the broker hands the unit what it keeps there
        finally:
            await upstream.stop()
    observer = Observer(mosquitto)
    await observer.start(f"{prefix}/+/unit-sw/+/config")
    await observer.caught_up()  # the retained ones come right after the subscription
    await observer.stop()
    kept = {topic.split("/")[3] for topic, payload, retain in observer.messages if payload}
    assert {"terminal_sim_0002", "card_payments_sim_0002", "status", "cpu_load"} <= kept
    assert not kept & {"terminal_sim_0001", "card_payments_sim_0001"}
    async with aiomqtt.Client("127.0.0.1", mosquitto) as cleaner:
        for topic, _, _ in observer.messages:
            await cleaner.publish(topic, b"", qos=1, retain=True)


@pytest.mark.mqtt
async def test_an_unexpected_error_is_counted_in_health_and_the_unit_tries_again(
    mosquitto: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the MQTT loop expected only MqttError and OSError; anything else (here paho's
    ValueError for a topic the schema would refuse, built past it) ended the task: the unit
    published nothing more, said nothing and its health stayed ok."""
    agent = settled_agent()
    upstream = Upstream(agent, {"interval": 3600, "mqtt": {"host": "127.0.0.1",
                                                           "port": mosquitto}})
    sink = upstream.mqtt
    assert sink is not None
    sink.state_topic = "kiosk-agent/+/state"  # a bug: a wildcard to publish the report to
    sink._backoff = Backoff(0.05, 0.1)
    await upstream.start()
    try:
        await until(lambda: sink.unexpected >= 2)  # tried again after the first
        snapshot = agent.health.snapshot()
        assert snapshot.status == "degraded"
        assert "unexpected errors, logged with their tracebacks: upstream mqtt" in (
            snapshot.problems[-1])
        logged = [r for r in caplog.records if "upstream mqtt: unexpected" in r.getMessage()]
        assert logged[0].exc_info is not None
    finally:
        await upstream.stop()


@pytest.mark.mqtt
async def test_a_broker_that_refuses_qos_1_is_named_as_a_possible_cause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Mosquitto with `max_qos 0` closes a connect that carries a QoS 1 last will, without an
    answer. Before, the unit logged "Operation timed out" 10 s later at every attempt, which
    sends a field tech after the network."""
    proc, port = start_broker(tmp_path, "max_qos 0\n")
    sink = MqttSink({"host": "127.0.0.1", "port": port, "reconnect_interval": 0.05}, "unit-q",
                    "1", connect_timeout=0.3)
    try:
        await sink.start()
        await until(lambda: sink.failures >= 1)
    finally:
        await sink.stop()
        stop_broker(proc)
    assert "a broker that allows no QoS 1 or no retained messages closes it" in sink.last_error
    assert "kiosk-agent doctor" in sink.last_error


async def test_births_that_keep_coming_are_answered_ever_more_rarely() -> None:
    """The gap between announces doubles while births keep coming (up to max_gap), and one
    that never stops is still answered after `longest`."""
    clock = FakeClock(monotonic=0.0)
    sink = MqttSink({"host": "broker"}, "u", "1", births=QUICK_BIRTHS,
                    rng=random.Random(1), clock=clock)
    sink._last_announce = 0.0
    due = []
    for _ in range(3):
        for _ in range(40):  # a birth every 0.05 s for 2 s: never settles
            sink.heard_birth()
            await clock.advance(0.05)
            now = clock.monotonic()
            if sink.reannounce_at is not None and now >= sink.reannounce_at:
                due.append(round(sink.reannounce_at, 2))
                sink._last_announce, sink.reannounce_at, sink._birth_first = now, None, None
    gaps = [b - a for a, b in zip([0.0, *due], due, strict=False)]
    assert len(due) >= 3
    assert all(gap >= 0.3 for gap in gaps)  # never closer than min_gap
    assert gaps[-1] > gaps[0]  # backing off


async def test_the_reconnect_back_off_waits_on_the_sinks_clock() -> None:
    """Before: the wait between connects was a real asyncio.sleep, whatever clock the sink was
    given: a test of reconnects waited real seconds (or set the back-off tiny). Now the wait is
    the sink's clock's: nothing is tried again until that clock reaches it."""
    clock = FakeClock(monotonic=0.0)
    conf = {"host": "127.0.0.1", "port": free_port(), "reconnect_interval": 5.0,
            "reconnect_max": 5.0}  # nobody listens there: each connect is refused at once
    sink = MqttSink(conf, "unit-bo", "1", rng=random.Random(1), clock=clock)
    await sink.start()
    try:
        await until(lambda: sink.failures == 1)
        due = await clock.next_due(horizon=conf["reconnect_max"])
        assert 5.0 / 20 <= due <= 5.0  # full jitter below the first ceiling, never zero
        await asyncio.sleep(0.05)
        assert sink.failures == 1  # no real time ends the wait
        await clock.advance_to(due)
        await until(lambda: sink.failures == 2)
    finally:
        await sink.stop()


async def test_births_are_logged_once_a_minute_of_the_sinks_clock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The once-a-minute limit on the birth log line counted real minutes; now the sink's
    clock's: a storm within a minute is one line, the next minute's storm another, and the
    births held back in between are summed up in one line."""
    clock = FakeClock(monotonic=0.0)
    sink = MqttSink({"host": "broker"}, "u", "1", births=QUICK_BIRTHS,
                    rng=random.Random(1), clock=clock)
    with caplog.at_level("INFO", logger="kiosk_agent.fleet.mqtt"):
        for _ in range(3):
            sink.heard_birth()
            await clock.advance(20.0)
        sink.heard_birth()  # 60 s after the first: a new minute
    lines = [r.getMessage() for r in caplog.records]
    assert sum("Home Assistant (re)started: announcing again" in line for line in lines) == 2
    assert [line for line in lines if "more birth message(s)" in line] == [
        "mqtt_birth: 2 more birth message(s) in the last 60 s, not logged one by one "
        "(birth 2)"]


@pytest.mark.mqtt
async def test_alerts_go_out_as_home_assistant_events_at_once(mosquitto: int) -> None:
    observer = Observer(mosquitto)
    await observer.start("kiosk-agent/unit-e/event")
    agent = settled_agent()
    agent.events = EventBus()
    agent.availability = Availability(agent.health, ["SIM-0001"], hold_off=0)
    conf = {"device_id": "unit-e", "interval": 3600,
            "mqtt": {"host": "127.0.0.1", "port": mosquitto, "reconnect_interval": 0.1}}
    upstream = Upstream(agent, conf, change_gap=0.05)
    await upstream.start()
    try:
        await until(lambda: upstream.heartbeats == 1)
        attention = SaleEvent(
            sale_id="s-9", order_id="o-9", source="mdb:front", terminal="SIM-0001",
            state=SaleState.ATTENTION, amount_cents=250,
            # free text from wherever the sale failed: the last safety net masks what slipped
            message="capture.failed: Authorization: Bearer sk_live_0123456789abcdef",
        )
        agent.events.publish(attention)
        agent.health.report_terminal("SIM-0001", online=False)
        agent.availability.evaluate()
        await until(lambda: len(observer.messages) == 2)
        events = {json.loads(p)["event_type"]: json.loads(p) for _, p, _ in observer.messages}
        assert events["sale_needs_attention"]["sale_id"] == "s-9"
        assert "sk_live_0123456789abcdef" not in events["sale_needs_attention"]["reason"]
        assert events["sale_needs_attention"]["reason"].startswith("capture.failed")
        assert events["terminal_out_of_service"]["terminal"] == "SIM-0001"
        assert not any(retain for _, _, retain in observer.messages)  # an event, not a state
    finally:
        await upstream.stop()
        await observer.stop()


async def test_a_broker_restart_is_not_blamed_on_a_twin() -> None:
    """Before: any connection dropped within 30 s of connecting was logged as "another client
    with the id kiosk-agent-<id>, such as a second unit with this device_id, takes the
    connection so": a broker restart 5 s after a connect sent the field tech after a twin that
    does not exist. A twin's mark is a drop again and again with the broker there between
    (each reconnect taken); a broker that restarts refuses the next connect."""
    clock = FakeClock(monotonic=0.0)
    sink = MqttSink({"host": "broker"}, "solo-unit", "1", rng=random.Random(1), clock=clock)
    await clock.advance(4.8)
    assert sink._short_lived(0.0) == " (4.8 s after connecting)"  # the broker went away
    assert sink._short_lived(None) == ""  # ... and refused the next connect: a restart
    await clock.advance_to(20.0)
    connected_at = clock.monotonic()
    await clock.advance(2.0)
    assert "another client" not in sink._short_lived(connected_at)
    connected_at = clock.monotonic()
    await clock.advance(0.5)
    assert "another client with the id kiosk-agent-solo-unit" in sink._short_lived(connected_at)


@pytest.mark.mqtt
async def test_after_a_broker_restart_the_unit_is_back_with_its_state(tmp_path: Path) -> None:
    """A broker without persistence comes back empty: the unit reconnects (after a random
    wait below reconnect_interval) and publishes its discovery, availability and last state."""
    proc, port = start_broker(tmp_path)
    conf = {"device_id": "unit-r", "interval": 3600,
            "mqtt": {"host": "127.0.0.1", "port": port, "reconnect_interval": 0.2}}
    upstream = Upstream(settled_agent(), conf)
    await upstream.start()
    sink = upstream.mqtt
    assert sink is not None
    try:
        await until(lambda: sink.online)  # the first report, then `online`
        stop_broker(proc)
        await until(lambda: not sink.connected)
        proc, _ = start_broker(tmp_path, port=port)
        await until(lambda: sink.connects == 2, timeout=15)  # a busy machine restarts slowly
        observer = Observer(port)
        await observer.start("kiosk-agent/unit-r/#")
        # the retained ones, in the broker's order (not the order they were published in)
        await until(lambda: len(observer.messages) == 2)
        assert observer.on("kiosk-agent/unit-r/availability") == ["online"]
        assert len(observer.on("kiosk-agent/unit-r/state")) == 1
        await observer.stop()
        assert sink.sent == 1  # the same report again, not a new heartbeat
    finally:
        await upstream.stop()
        stop_broker(proc)


async def test_the_reconnect_back_off_starts_over_only_after_a_connection_that_held() -> None:
    """A copied configuration: two agents, one client id; each connect drops the other. Before,
    the back-off started over at every CONNACK: on Mosquitto the twins took the id from each
    other 9 times a second each, forever, announcing at each connect. Now a connection counts
    as a success once it held STABLE_AFTER seconds, and a shorter one says what may drop it."""
    clock = FakeClock(monotonic=0.0)
    sink = MqttSink({"host": "broker", "reconnect_interval": 1.0, "reconnect_max": 8.0},
                    "twin-unit", "1", rng=random.Random(1), clock=clock)
    for _ in range(3):  # connected, dropped 0.5 s later, three times: the waits keep growing
        connected_at = clock.monotonic()
        await clock.advance(0.5)
        hint = sink._short_lived(connected_at)
        sink._backoff.next()
    assert sink._backoff.attempts == 3
    assert sink._backoff.ceiling() == 8.0
    assert "0.5 s after connecting, 3 times in a row; another client with the id " in hint
    assert "kiosk-agent-twin-unit" in hint
    connected_at = clock.monotonic()
    await clock.advance(STABLE_AFTER)  # this one held: the next wait is short again
    assert sink._short_lived(connected_at) == ""
    assert sink._backoff.ceiling() == 1.0
    assert sink._short_lived(None) == ""  # never connected: the broker's own error says why


# --- true at every moment on the broker ---------------------------------------------------------


@pytest.mark.mqtt
async def test_online_only_after_the_first_report_of_this_run(mosquitto: int) -> None:
    """Before: `online` went out with the announce, before the first report: Home Assistant
    showed the last run's retained report as now (Problem on for 6.2 s after a late adapter,
    `ok` with no attention after a crash with sales open)."""
    device_id = f"unit-{uuid.uuid4().hex[:6]}"
    base = f"kiosk-agent/{device_id}"
    async with aiomqtt.Client("127.0.0.1", mosquitto) as last_run:
        old = {"status": "degraded", "problems": ["link mdb:front disconnected"]}
        await last_run.publish(f"{base}/state", json.dumps(old), qos=1, retain=True)
        await last_run.publish(f"{base}/availability", "offline", qos=1, retain=True)
    agent = settled_agent()
    agent.health.report_link("mdb:front", "connecting")  # the first report waits for it
    conf = {"device_id": device_id, "interval": 3600, "start_grace": 600,
            "mqtt": {"host": "127.0.0.1", "port": mosquitto, "discovery_prefix": False}}
    upstream = Upstream(agent, conf)
    sink = upstream.mqtt
    assert sink is not None
    observer = Observer(mosquitto)
    await observer.start(f"{base}/#")
    await until(lambda: len(observer.messages) == 2)  # the last run's, retained
    await upstream.start()
    try:
        await until(lambda: sink.connected)
        assert observer.on(f"{base}/availability") == ["offline"]
        agent.health.report_link("mdb:front", "connected")
        await until(lambda: observer.on(f"{base}/availability")[-1:] == ["online"])
        fresh = [(topic, payload) for topic, payload, retained in observer.messages
                 if not retained]
        assert [topic.rsplit("/", 1)[1] for topic, _ in fresh] == ["state", "availability"]
        assert json.loads(fresh[0][1])["status"] == "ok"
    finally:
        await upstream.stop()
        await observer.stop()


@pytest.mark.mqtt
async def test_a_clean_stop_says_stopped_then_offline_and_no_fault(mosquitto: int) -> None:
    """Before: every SIGTERM published a `degraded` report (its links closing: "link
    virtual:coffee closed stopped"), Problem on 0.8 s before the unit went unavailable, and that
    report stayed retained. Now what changes once the stop began is not reported; the last
    report (retained) says `stopped`, with no problems, then `offline`."""
    device_id = f"unit-{uuid.uuid4().hex[:6]}"
    base = f"kiosk-agent/{device_id}"
    agent = settled_agent()
    agent.sales = SimpleNamespace(stopping=False)  # the agent's sale runner, as Agent has it
    conf = {"device_id": device_id, "interval": 3600,
            "mqtt": {"host": "127.0.0.1", "port": mosquitto, "discovery_prefix": False}}
    upstream = Upstream(agent, conf, change_gap=0.0)
    observer = Observer(mosquitto)
    await observer.start(f"{base}/#")
    await upstream.start()
    try:
        await until(lambda: observer.on(f"{base}/availability")[-1:] == ["online"])
        agent.sales.stopping = True  # Agent.stop: sales closed first, then the platforms
        agent.health.report_link("virtual:coffee", "closed", "stopped")
        await until(lambda: not upstream._changed.is_set())  # the loop heard the change
        await asyncio.sleep(0.05)  # and would have sent it at once (change_gap 0)
        assert upstream.heartbeats == 1
    finally:
        await upstream.stop()
    await until(lambda: observer.on(f"{base}/availability")[-1:] == ["offline"])
    await observer.stop()
    said = [(topic.rsplit("/", 1)[1], payload) for topic, payload, _ in observer.messages]
    assert [kind for kind, _ in said] == ["state", "availability", "state", "availability"]
    stopped = json.loads(said[2][1])
    assert (stopped["status"], stopped["problems"]) == ("stopped", [])
    assert "stopped" in stopped
    kept = Observer(mosquitto)  # what the broker keeps for Home Assistant and `fleet list`
    await kept.start(f"{base}/state")
    await until(lambda: bool(kept.on(f"{base}/state")))
    await kept.stop()
    assert json.loads(kept.on(f"{base}/state")[0])["status"] == "stopped"


@pytest.mark.mqtt
async def test_a_broker_refusing_the_password_is_a_problem_in_health_within_an_interval(
    tmp_path: Path,
) -> None:
    """Before: a wrong password (or a certificate that does not verify) was a log line, and
    health stayed `ok`: nobody at the page knew the fleet could not see the unit."""
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(tmp_path / "users"), "unit", "right"],
                   check=True, capture_output=True)
    proc, port = start_broker(tmp_path, f"password_file {tmp_path / 'users'}\n")
    agent = settled_agent()
    conf = {"device_id": "unit-pw", "interval": 0.5,
            "mqtt": {"host": "127.0.0.1", "port": port, "username": "unit",
                     "password": "wrong-secret", "reconnect_interval": 0.05,
                     "reconnect_max": 0.1}}
    upstream = Upstream(agent, conf)
    await upstream.start()
    try:
        await until(lambda: agent.health.snapshot().status == "degraded")
        [problem] = agent.health.snapshot().problems
        assert problem.startswith("upstream mqtt failing: broker 127.0.0.1:")
        assert "wrong-secret" not in problem
        sink = upstream.mqtt
        assert sink is not None
        assert sink.trouble(3600.0) is None  # within the grace: a broker restart is no problem
    finally:
        await upstream.stop()
        stop_broker(proc)


@pytest.mark.mqtt
async def test_a_stop_that_lands_with_the_brokers_refusal_ends(tmp_path: Path) -> None:
    """Before: a stop that began in the loop turn the broker refused the password never ended
    (the test above hung until pytest's 300 s timeout, about 1 run in 90 on a busy machine).
    aiomqtt waits for the CONNACK with asyncio.wait_for, which on Python 3.11 hands back the
    refusal in place of a cancel that lands with it: the loop took the stop's cancel for one
    more refusal, slept its back-off and connected again, for ever. Here the stop begins once
    the refusal is in and before aiomqtt's connect has read it, so the race is met at every
    run."""
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(tmp_path / "users"), "unit", "right"],
                   check=True, capture_output=True)
    proc, port = start_broker(tmp_path, f"password_file {tmp_path / 'users'}\n")
    conf = {"host": "127.0.0.1", "port": port, "username": "unit", "password": "wrong-secret"}
    sink = MqttSink(conf, "unit-race", "1", clock=FakeClock(monotonic=0.0))
    stops: list[asyncio.Task[None]] = []
    made = sink._new_client

    def racing_client() -> aiomqtt.Client:
        client = made()
        wait_for = client._wait_for

        async def refused_then_stopped(future: Any, timeout: float | None) -> Any:
            if future is client._connected and not stops:
                await asyncio.wait({future})  # the broker's refusal is in ...
                stops.append(asyncio.ensure_future(sink.stop()))  # ... and the stop begins
            return await wait_for(future, timeout)

        client._wait_for = refused_then_stopped  # type: ignore[method-assign]
        return client

    sink._new_client = racing_client  # type: ignore[method-assign]
    try:
        await sink.start()
        await until(lambda: bool(stops))
        # real seconds, and no cancel of the stop (it would end the loop the stop could not):
        # the stop ends within a few loop turns
        await asyncio.wait(stops, timeout=5)
        assert stops[0].done(), "the stop did not end"
        stops[0].result()
        assert sink.failures == 1  # the refusal the stop landed with; no reconnect after it
    finally:
        for stop in stops:
            stop.cancel()  # a stop that hung: its cancel reaches the loop it waits for
        await sink.stop()
        stop_broker(proc)


class DeafConnect:
    """A client whose connect never ends and takes no notice of the first ``deaf_to`` cancels
    (a library that lost them, or waits out a timeout of its own); ``hear()`` ends that."""

    def __init__(self, deaf_to: int) -> None:
        self.deaf_to = deaf_to
        self.task: asyncio.Task[Any] | None = None
        self.cancels_ignored = 0

    def __call__(self) -> "DeafConnect":
        return self

    async def __aenter__(self) -> "DeafConnect":
        self.task = asyncio.current_task()
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if self.cancels_ignored >= self.deaf_to:
                    raise
                self.cancels_ignored += 1
                self.task.uncancel()  # as if it never came

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def hear(self) -> None:
        self.deaf_to = 0
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


async def deaf_sink(deaf_to: int) -> tuple[MqttSink, DeafConnect, FakeClock]:
    clock = FakeClock(monotonic=0.0)
    sink = MqttSink({"host": "127.0.0.1", "port": 1}, "unit-deaf", "1", clock=clock)
    client = DeafConnect(deaf_to)
    sink._new_client = client  # type: ignore[assignment]
    await sink.start()
    await until(lambda: client.task is not None)
    return sink, client, clock


async def test_a_loop_that_loses_the_stops_cancel_is_cancelled_again_halfway() -> None:
    sink, client, clock = await deaf_sink(deaf_to=1)
    try:
        stop = asyncio.ensure_future(sink.stop())
        await clock.next_due(pauses_only=False)  # the stop waits for the loop, on the clock
        await clock.advance(LOOP_END_TIMEOUT / 2 - 0.01)
        assert not stop.done()  # nothing gives up early
        await clock.advance(0.01)
        await until(stop.done)  # real seconds: a guard against the hang, without a cancel
        stop.result()
        assert client.cancels_ignored == 1
        assert client.task is not None
        assert client.task.cancelled()
        assert sink.unexpected == 0  # it ended: nothing to say
    finally:
        await client.hear()


async def test_a_stop_whose_loop_does_not_end_says_so_and_ends_anyway(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: the stop waited for the loop without a bound; a loop that never ended (a cancel
    lost on the way, a library's own 10 s wait for a disconnect) held the agent's stop past
    systemd's stop timeout, and it was killed without a word of why."""
    sink, client, clock = await deaf_sink(deaf_to=1_000)
    try:
        stop = asyncio.ensure_future(sink.stop())
        await clock.next_due(pauses_only=False)
        await clock.advance(LOOP_END_TIMEOUT - 0.01)
        assert not stop.done()
        await clock.advance(0.01)
        await until(stop.done)
        stop.result()
        assert client.cancels_ignored == 2  # cancelled at the stop and once more halfway
        assert sink.unexpected == 1  # counted: health shows it while the process lasts
        assert (f"upstream mqtt: its loop did not end within {LOOP_END_TIMEOUT:g} s of the "
                "stop; left behind") in caplog.text
    finally:
        await client.hear()


def test_a_fleet_answers_a_birth_spread_over_the_announce_spread() -> None:
    """Before: every unit answered Home Assistant's birth within 1 to 3 s: 1,000 units were
    17,000 configs in one burst, and Mosquitto dropped what overflowed Home Assistant's queue
    ("Outgoing messages are being dropped": HA never saw 52 units). Now each waits at random up
    to upstream.mqtt.announce_spread (30 s): about 33 units a second."""
    conf = UPSTREAM_SCHEMA({"mqtt": {"host": "broker"}})["mqtt"]
    assert conf["announce_spread"] == 30.0
    births = BirthPolicy(spread=conf["announce_spread"])
    clock = FakeClock(monotonic=100.0)
    fleet = [MqttSink(conf, f"unit-{i}", "1", births=births, rng=random.Random(i),
                      clock=clock) for i in range(1000)]
    for sink in fleet:
        sink.heard_birth()
    seconds = Counter(int(sink.reannounce_at or 0) for sink in fleet)
    assert min(seconds) >= 101  # settled first
    assert max(seconds) <= 131
    assert max(seconds.values()) <= 60  # ~33 a second; a burst would be all 1,000 at once


@pytest.mark.mqtt
async def test_a_connection_lost_during_an_announce_is_said_as_it_was(mosquitto: int) -> None:
    """Dropped while the unit waited for its configs' acknowledgements: the error said "no
    answer to the connect: a broker that allows no QoS 1 ..." (the hint for a connect that times
    out) of a connection that had been made, and aiomqtt's record of why it dropped was never
    read: asyncio logged "Future exception was never retrieved" at ERROR at each such drop."""
    proxy = TcpProxy(mosquitto)
    await proxy.open()
    proxy.answer_delay = 0.05  # a slow broker: the announce is under way when the link goes
    conf = {"device_id": "unit-drop", "interval": 3600,
            "mqtt": {"host": "127.0.0.1", "port": proxy.port, "reconnect_interval": 60,
                     "discovery_prefix": f"ha-drop-{uuid.uuid4().hex[:6]}"}}
    sink = Upstream(settled_agent(), conf).mqtt
    assert sink is not None
    sink._connect_timeout = 1.0  # a publish waits this long for its acknowledgement
    clients: list[aiomqtt.Client] = []
    made = sink._new_client
    sink._new_client = lambda: clients.append(made()) or clients[-1]  # type: ignore[method-assign]
    await sink.start()
    try:
        await until(lambda: sink._client is not None)  # connected, announcing
        await proxy.cut()
        await until(lambda: sink.failures >= 1)
    finally:
        await sink.stop()
    assert "after connecting" in sink.last_error
    assert "no answer to the connect" not in sink.last_error
    disconnected = clients[0]._disconnected
    assert disconnected.done()
    assert not disconnected._log_traceback  # type: ignore[attr-defined]  # read: nothing to log


@pytest.mark.mqtt
async def test_a_publish_fails_at_once_when_its_connection_is_reset_and_goes_out_on_the_next(
    mosquitto: int,
) -> None:
    """Before: a connection reset while the unit waited for its configs' acknowledgements left
    each publish waiting aiomqtt's whole timeout (10 s) for an answer that could not come; the
    unit reconnected only then. Now the publish fails as the connection goes, and what it
    carried (the configs, the report, `online`) goes out on the next connection."""
    device_id = f"unit-{uuid.uuid4().hex[:6]}"
    proxy = TcpProxy(mosquitto)
    await proxy.open()
    proxy.answer_delay = 0.1  # a slow broker: the announce is under way when the link goes
    clock = FakeClock(monotonic=0.0)
    conf = {"device_id": device_id, "interval": 3600,
            "mqtt": {"host": "127.0.0.1", "port": proxy.port, "reconnect_interval": 1.0,
                     "reconnect_max": 1.0, "discovery_prefix": f"ha-{device_id}"}}
    upstream = Upstream(settled_agent(), conf, clock=clock)
    sink = upstream.mqtt
    assert sink is not None
    sink._connect_timeout = 3600.0  # aiomqtt's wait for an acknowledgement: far off
    observer = Observer(mosquitto)
    await observer.start(f"kiosk-agent/{device_id}/#")
    await upstream.start()
    try:
        await until(lambda: sink._client is not None)  # connected, announcing
        await proxy.cut()
        await until(lambda: sink.failures == 1)  # within until's 5 s, not aiomqtt's hour
        assert "after connecting" in sink.last_error
        assert "timed out" not in sink.last_error
        assert (sink.announcements, sink.sent, sink.online) == (0, 0, False)
        proxy.answer_delay = 0.0
        await proxy.open()  # the network is back
        await clock.advance_to(await clock.next_due(horizon=1.0))  # the back-off's wait
        await until(lambda: sink.online)
        assert (sink.connects, sink.announcements, sink.sent) == (1, 1, 1)
        availability = f"kiosk-agent/{device_id}/availability"
        # the first connection's will, then the second's word, once the report is out
        await until(lambda: observer.on(availability) == ["offline", "online"])
        [state] = observer.on(f"kiosk-agent/{device_id}/state")
        assert json.loads(state)["status"] == "ok"
    finally:
        await upstream.stop()
        await observer.stop()
        await proxy.cut()


class _QueuedMessages:
    """aiomqtt's message iterator over messages that already arrived (then the link drops)."""

    def __init__(self, messages: list[aiomqtt.Message]) -> None:
        self._queue = deque(messages)

    def __len__(self) -> int:
        return len(self._queue)

    def __aiter__(self) -> "_QueuedMessages":
        return self

    async def __anext__(self) -> aiomqtt.Message:
        if not self._queue:
            await asyncio.Event().wait()  # the link stays up; the test stops the sink
        return self._queue.popleft()


class _ClientWithBirthsWaiting:
    def __init__(self, births: int) -> None:
        birth = aiomqtt.Message("homeassistant/status", b"online", 0, False, 1, None)
        self.messages = _QueuedMessages([birth] * births)
        self.published: list[str] = []

    async def subscribe(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def publish(self, topic: str, *args: Any, **kwargs: Any) -> None:
        self.published.append(topic)


async def test_births_that_arrived_before_the_storm_settled_are_heard_before_answering() -> None:
    """On a busy machine the re-announce came due while births that had already arrived
    waited unread in the client's queue: the unit answered, then read them as a new storm and
    answered again. It now reads what arrived first; those births push the answer back."""
    clock = FakeClock(monotonic=0.0)
    sink = MqttSink({"host": "broker"}, "u", "1", births=QUICK_BIRTHS,
                    rng=random.Random(1), clock=clock)
    sink.heard_birth()
    await clock.advance_to(sink.reannounce_at or 0.0)  # due, and 50 more births arrived
    client = _ClientWithBirthsWaiting(50)
    serving = asyncio.ensure_future(sink._serve(client))  # type: ignore[arg-type]
    try:
        await until(lambda: sink.births_heard == 51)
        await asyncio.sleep(0.01)
        assert sink.announcements == 0  # the storm went on: not answered yet
        assert sink.reannounce_at is not None
        assert sink.reannounce_at > clock.monotonic()  # pushed back by the births read
        await clock.advance_to(sink.reannounce_at)
        await until(lambda: sink.announcements == 1)
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving


# --- a reconnect publishes only what the broker lacks (fleet.announce) ---------------------------


async def _reconnect(proxy: TcpProxy, clock: FakeClock, sink: MqttSink, connects: int) -> None:
    """The network drops and comes back; the back-off's wait passes on the sink's clock."""
    await proxy.cut()
    await until(lambda: not sink.connected)
    await proxy.open()
    await clock.advance_to(await clock.next_due(horizon=60.0))
    await until(lambda: sink.connects == connects and sink.online)


@pytest.mark.mqtt
async def test_a_reconnect_publishes_only_the_configs_the_broker_lacks(mosquitto: int) -> None:
    """Before: every connect published all of a unit's configs again, though a broker with
    persistence kept them: a broker restart of 10,000 units was 170,000 retained publishes
    within seconds, and the broker fell so far behind that units dropped and announced again
    for 336 s. Now the unit reads its configs back first and publishes only what the broker
    lacks or holds otherwise: nothing after a plain reconnect; a config a person cleared (Home
    Assistant's "delete device") or another client changed, that one; everything after
    `fleet forget`."""
    device_id = f"unit-{uuid.uuid4().hex[:6]}"
    prefix = f"ha-{device_id}"
    proxy = TcpProxy(mosquitto)
    await proxy.open()
    clock = FakeClock(monotonic=0.0)
    conf = {"device_id": device_id, "interval": 3600,
            "mqtt": {"host": "127.0.0.1", "port": proxy.port, "reconnect_interval": 1.0,
                     "reconnect_max": 1.0, "discovery_prefix": prefix}}
    upstream = Upstream(settled_agent(), conf, clock=clock)
    sink = upstream.mqtt
    assert sink is not None
    observer = Observer(mosquitto)
    await observer.start(f"{prefix}/+/{device_id}/+/config")
    status = f"{prefix}/sensor/{device_id}/status/config"
    problem = f"{prefix}/binary_sensor/{device_id}/problem/config"
    await upstream.start()
    try:
        await until(lambda: sink.online)
        await observer.caught_up()
        announced = {t: p for t, p, _ in observer.messages}
        assert len(announced) == sink.configs_published == 19

        await _reconnect(proxy, clock, sink, 2)
        await observer.caught_up()
        assert len(observer.messages) == 19  # not one config again
        assert (sink.announcements, sink.announces_skipped) == (1, 1)

        async with aiomqtt.Client("127.0.0.1", mosquitto) as person:
            await person.publish(status, b"", qos=1, retain=True)
            await person.publish(problem, b'{"unique_id": "changed"}', qos=1, retain=True)
        await _reconnect(proxy, clock, sink, 3)
        await observer.caught_up()
        assert observer.on(status) == [announced[status], "", announced[status]]
        assert observer.on(problem)[-1] == announced[problem]
        assert sink.configs_published == 21

        async with aiomqtt.Client("127.0.0.1", mosquitto) as forget:
            for topic in announced:
                await forget.publish(topic, b"", qos=1, retain=True)
        await _reconnect(proxy, clock, sink, 4)
        assert sink.configs_published == 40  # 21 + all 19 again
        kept = Observer(mosquitto)
        await kept.start(f"{prefix}/+/{device_id}/+/config")
        await kept.caught_up()
        await kept.stop()
        assert {t: p for t, p, _ in kept.messages} == announced  # the broker holds them all
    finally:
        await upstream.stop()
        await observer.stop()
        await proxy.cut()


@pytest.mark.mqtt
async def test_configs_not_read_back_in_time_are_all_published(tmp_path: Path) -> None:
    """A broker whose ACL refuses the unit its marker hands nothing back to end the read: the
    unit waits KEPT_WAIT on its clock, then publishes every config, as before the read-back
    (and on its first connect clears the configs of earlier versions)."""
    (tmp_path / "acl").write_text("topic deny kiosk-agent/+/end\ntopic readwrite #\n")
    proc, port = start_broker(tmp_path, f"acl_file {tmp_path / 'acl'}\n")
    clock = FakeClock(monotonic=0.0)
    conf = {"device_id": "unit-acl", "interval": 3600,
            "mqtt": {"host": "127.0.0.1", "port": port}}
    upstream = Upstream(settled_agent(), conf, clock=clock)
    sink = upstream.mqtt
    assert sink is not None
    await upstream.start()
    try:
        due = await clock.next_due(pauses_only=False, horizon=KEPT_WAIT)
        await asyncio.sleep(0.1)
        assert sink.configs_published == 0  # no real time ends the wait
        await clock.advance_to(due)
        await until(lambda: sink.online)
        assert sink.configs_published == 19
        assert sink.announcements == 1
    finally:
        await upstream.stop()
        stop_broker(proc)


@pytest.mark.mqtt
async def test_a_late_vend_and_an_audit_not_compared_reach_home_assistant_and_go(
    mosquitto: int, tmp_path: Path
) -> None:
    """This round's facts on the fleet's face, against the journal's rows: a late vend (a
    journal note read by health) and an audit comparison not made are in the state topic's
    problems (what HA's Problem shows as attributes) and its audit block, in the words of the
    journal's step and the comparison; both go with the next report after the acknowledgement
    and a read that compares again."""
    from kiosk_agent.audit.reconcile import CardSale, Side, compare
    from kiosk_agent.health.model import AuditHealth
    from kiosk_agent.sales.journal import Journal, SaleRecord
    from kiosk_agent.sales.late_vends import LateVendWatch
    from kiosk_agent.sales.model import Flow
    from kiosk_agent.sales.states import Step
    from tests.audit.helpers import figures
    from tests.helpers import walk_to

    agent = settled_agent()
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    watch = LateVendWatch(journal, journal.clock, on_change=agent.health.problem_changed)
    agent.health.report_problem_of("late vends", watch.problem)
    record = walk_to(journal, journal.create(SaleRecord(
        sale_id="1a7e0001", order_id="KA1A7E", source="mdb:front",
        flow=Flow.AUTHORIZE_CAPTURE.value, terminal="SIM-0001", amount_cents=150, product="C4",
        state=SaleState.STARTED,
    )), SaleState.REVERSED)  # fmt: skip
    observer = Observer(mosquitto)
    await observer.start("kiosk-agent/unit-7/state")
    upstream = Upstream(agent, {"device_id": "unit-7", "interval": 3600,
                                "mqtt": {"host": "127.0.0.1", "port": mosquitto}})
    state = "kiosk-agent/unit-7/state"
    await upstream.start()
    try:
        await until(lambda: len(observer.on(state)) == 1)
        watch.heard(record.sale_id, "C4", "mdb:front")  # told at once, not at the interval
        ten = 1_764_324_000.0
        made = compare(Side(ten, figures((40, 6000))),  # another machine answered
                       Side(ten + 60, figures((41, 6150), machine="VM-2")),
                       [CardSale("s1", 150, "A1", "completed", ten + 1)])
        agent.health.report_audit(AuditHealth(machine="snacks", not_compared=made.text()))
        await until(lambda: any("not compared" in p for p in
                                json.loads(observer.on(state)[-1])["problems"]))
        report = json.loads(observer.on(state)[-1])
        [late] = [s for s in journal.steps(record.sale_id) if s.step == Step.LATE_VEND]
        [shown] = [p for p in report["problems"] if "gave up waiting" in p]
        assert f"sale {record.sale_id[:8]} ({late.detail['product']} on {late.detail['source']}"\
            in shown, shown
        assert f"audit of snacks {made.text()}" in report["problems"]
        assert report["audit"]["not_compared"] == made.text()
        # what to do, on this face too
        assert "check which machine the audit cable is on" in report["audit"]["not_compared"]
        assert report["status"] != "ok"
        # `kiosk-agent health` / `fleet health` say the report's words, each on its own line
        from kiosk_agent.cli.fleet import format_health

        said = format_health(report).splitlines()
        assert f"problem:  {shown}" in said
        assert f"problem:  audit of snacks {made.text()}" in said

        watch.acknowledge(record.sale_id, by="test")  # as `sales late-vends --ack` journals it
        agent.health.report_audit(AuditHealth(machine="snacks"))  # a read compared again
        upstream.heartbeat()
        await until(lambda: not json.loads(observer.on(state)[-1])["problems"])
        assert json.loads(observer.on(state)[-1])["audit"]["not_compared"] == ""
    finally:
        await upstream.stop()
        await observer.stop()
        journal.close()
