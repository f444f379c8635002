"""Heartbeats against real receivers: an aiohttp endpoint and a Mosquitto broker started here.

A TCP proxy between the agent and each receiver plays the unreliable network: cutting it drops
the connection without a goodbye, as a pulled cable would.
"""

import asyncio
import contextlib
import datetime as dt
import json
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiomqtt
import pytest
import voluptuous as vol
from aiohttp import web

from kiosk_agent.app import load_agent
from kiosk_agent.cli import main
from kiosk_agent.core.availability import Availability
from kiosk_agent.core.config import ConfigInvalid
from kiosk_agent.core.health import Health
from kiosk_agent.core.upstream import (
    UPSTREAM_SCHEMA,
    DiscoveryOptions,
    ReportQueue,
    Upstream,
    build_report,
    configuration_url,
    discovery_messages,
)
from kiosk_agent.core.web import LocalSite

from ..helpers import free_port, until
from ..mqtt_broker import Observer, mosquitto, start_broker, stop_broker
from . import home_assistant_rules as ha

__all__ = ["mosquitto"]  # the broker fixture, imported for the tests below


def _make_certificates(directory: Path) -> Path:
    """A throwaway CA and a server certificate for 127.0.0.1 (openssl CLI); returns the CA."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=kiosk-agent test CA",
    )
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    )
    return directory / "ca.crt"


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target; `cut()` aborts every connection and refuses more."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers.update({writer, up_writer})

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


def _agent(version: str = "9.9.9") -> SimpleNamespace:
    """An agent that has settled: the service and its terminal checked."""
    health = Health(version)
    health.report_service(True)
    health.report_terminal("SIM-0001", online=True, connected=True, latency_ms=8.0, pinged=True)
    return SimpleNamespace(health=health)


# --- the report ---------------------------------------------------------------------------------


def test_report_carries_health_and_nothing_secret() -> None:
    agent = _agent()
    agent.health.report_link("mdb:front", "connected")
    report = build_report("unit-1", agent.health.snapshot())
    assert report["device_id"] == "unit-1"
    assert report["status"] == "ok"
    assert report["terminals_online"] == 1
    assert report["links"][0]["name"] == "mdb:front"
    assert set(report) == {
        "device_id",
        "version",
        "status",
        "problems",
        "at",
        "uptime_s",
        "service",
        "sales",
        "terminals",
        "terminals_online",
        "links",
        "journal",
        "availability",
        "out_of_service",
    }
    text = json.dumps(report)
    for word in ("api_key", "token", "secret", "password", "card_number"):
        assert word not in text


def test_queue_drops_the_oldest_and_counts() -> None:
    queue = ReportQueue(2)
    for n in range(5):
        queue.put({"n": n})
    assert len(queue) == 2
    assert queue.dropped == 3
    assert queue.peek() == {"n": 3}


def test_schema_names_the_bad_field() -> None:
    with pytest.raises(vol.Invalid, match="url"):
        UPSTREAM_SCHEMA({"http": {"url": "ftp://x"}})
    conf = UPSTREAM_SCHEMA({"mqtt": {"host": "broker"}})
    assert conf["mqtt"]["port"] == 1883
    assert conf["interval"] == 60.0


def test_discovery_describes_one_device_with_sensors_and_status() -> None:
    messages = discovery_messages("unit-1", "1.0", "k/unit-1/state", "k/unit-1/availability", "ha")
    topics = [topic for topic, _ in messages]
    assert len(topics) == 8
    assert "ha/binary_sensor/unit-1/problem/config" in topics
    assert "ha/sensor/unit-1/sales_today_amount/config" in topics
    identifiers = {json.dumps(config["device"]["identifiers"]) for _, config in messages}
    assert identifiers == {'["kiosk_agent_unit-1"]'}
    assert all(config["availability_topic"] == "k/unit-1/availability" for _, config in messages)
    assert discovery_messages("unit-1", "1.0", "s", "a", False) == []


def _discovery(**options: Any) -> dict[str, dict[str, Any]]:
    messages = discovery_messages(
        "unit-1", "1.2.3", "kiosk-agent/unit-1/state", "kiosk-agent/unit-1/availability",
        "homeassistant", DiscoveryOptions(**options),
    )
    return {topic.split("/")[-2]: config for topic, config in messages}


@pytest.mark.parametrize("version", sorted(ha.VERSIONS))
def test_discovery_follows_home_assistants_rules(version: str) -> None:
    options = {"expire_after": 180, "configuration_url": "http://kiosk-7:8124/", "currency": "EUR"}
    messages = discovery_messages(
        "unit-1", "1.2.3", "kiosk-agent/unit-1/state", "kiosk-agent/unit-1/availability",
        "homeassistant", DiscoveryOptions(**options),
    )
    for topic, config in messages:
        assert ha.violations(topic, config, version) == [], topic


def test_the_rules_catch_what_home_assistant_would_not_take() -> None:
    """The checker itself: each of the issue's findings is caught."""
    [(topic, config)] = [m for m in discovery_messages("u", "1", "s", "a", "homeassistant")
                         if m[0].endswith("/sales_today/config")]
    assert ha.violations(topic, config, "2024.3") == []
    assert ha.violations(topic, {**config, "expire_after": 180.0}, "2024.3") == [
        "expire_after 180.0 is not a positive integer"
    ]
    amount = _discovery()["sales_today_amount"]
    wrong = {**amount, "state_class": "total_increasing"}
    assert ha.violations("homeassistant/sensor/u/a/config", wrong, "2026.2") == [
        "state_class 'total_increasing' is impossible with device_class 'monetary'",
        "last_reset_value_template with state_class 'total_increasing'",
    ]
    status = {k: v for k, v in _discovery()["status"].items() if k not in ("options", "origin")}
    assert ha.violations("homeassistant/sensor/u/status/config", status, "2024.3") == [
        "origin (o) is missing (device-based discovery requires it)",
        "an enum sensor without options accepts any state",
    ]
    assert ha.violations(
        "homeassistant/sensor/u/x/config", {**status, "origin": {"name": "k"}, "typo": 1},
        "2024.3",
    )[0] == "unknown key 'typo' (HA drops it silently)"
    abbreviated = {"stat_t": "s", "uniq_id": "u", "dev": {"ids": ["x"]}, "o": {"name": "k"},
                   "stat_cla": "total_increasing", "exp_aft": 180}
    assert ha.violations("homeassistant/sensor/u/x/config", abbreviated, "2024.3") == []
    with_model_id = {**abbreviated, "dev": {"ids": ["x"], "model_id": "k1"}}
    assert ha.violations("homeassistant/sensor/u/x/config", with_model_id, "2024.3") == [
        "unknown device key 'model_id'"
    ]
    assert ha.violations("homeassistant/sensor/u/x/config", with_model_id, "2026.2") == []


def test_the_discovery_tells_what_the_issue_asked_for() -> None:
    configs = _discovery(expire_after=180, configuration_url="http://kiosk-7:8124/")
    assert configs["sales_today"]["state_class"] == "total_increasing"
    amount = configs["sales_today_amount"]
    assert (amount["device_class"], amount["state_class"]) == ("monetary", "total")
    assert amount["last_reset_value_template"] == "{{ value_json.sales.day_started }}"
    assert configs["status"]["device_class"] == "enum"
    assert configs["status"]["options"] == ["ok", "degraded", "down"]
    assert "json_attributes_topic" in configs["problem"]
    assert {c["expire_after"] for c in configs.values()} == {180}
    assert {c["origin"]["name"] for c in configs.values()} == {"kiosk-agent"}
    assert {c["device"]["configuration_url"] for c in configs.values()} == {
        "http://kiosk-7:8124/"
    }


def test_every_template_reads_fields_the_report_has() -> None:
    agent = _agent()
    report = build_report("unit-1", agent.health.snapshot())
    for key, config in _discovery().items():
        for name in ("value_template", "last_reset_value_template", "json_attributes_template"):
            for path in ha.template_paths(config.get(name, "")):
                value: Any = report
                for part in path:
                    assert isinstance(value, dict), (key, name, path)
                    assert part in value, (key, name, path)
                    value = value[part]
    assert report["status"] in _discovery()["status"]["options"]
    # the daily amount's last reset: local midnight, an ISO 8601 time with its offset
    day_started = dt.datetime.fromisoformat(report["sales"]["day_started"])
    assert day_started.utcoffset() is not None
    assert (day_started.hour, day_started.minute) == (0, 0)


def test_expire_after_is_three_heartbeats_and_the_url_the_admin_api() -> None:
    agent = _agent()
    agent.config = {"admin": {"host": "0.0.0.0", "port": 8124}}  # noqa: S104 - a config value
    agent.settings = SimpleNamespace(currency="EUR")
    upstream = Upstream(agent, {"interval": 20, "mqtt": {"host": "broker"}})
    discovery = upstream.sinks[0]._discovery  # type: ignore[attr-defined]
    assert discovery.expire_after == 60
    assert discovery.currency == "EUR"
    assert discovery.configuration_url == f"http://{socket.gethostname()}:8124/"
    agent.config = {"admin": {"host": "127.0.0.1", "port": 8124}}
    assert configuration_url(agent, {}) is None  # nobody else could open a loopback page
    assert configuration_url(agent, {"configuration_url": "https://k7.example/"}) == (
        "https://k7.example/"
    )


async def test_the_first_report_waits_for_the_links_to_settle() -> None:
    agent = _agent()
    agent.health.report_service(True)
    agent.health.report_link("mdb:front", "connecting")
    upstream = Upstream(agent, {"interval": 3600, "start_grace": 30})
    await upstream.start()
    try:
        await asyncio.sleep(0.2)
        assert upstream.heartbeats == 0  # a connecting link is not a problem yet
        agent.health.report_link("mdb:front", "connected")
        await until(lambda: upstream.heartbeats == 1)
        assert upstream.heartbeat()["status"] == "ok"
    finally:
        await upstream.stop()


async def test_a_link_that_never_connects_is_reported_after_the_grace() -> None:
    agent = _agent()
    agent.health.report_service(True)
    agent.health.report_link("mdb:front", "connecting")
    upstream = Upstream(agent, {"interval": 3600, "start_grace": 0.3})
    await upstream.start()
    try:
        await until(lambda: upstream.heartbeats == 1)
        assert upstream.first_report_waited_s is not None
        assert upstream.first_report_waited_s >= 0.2
    finally:
        await upstream.stop()


# --- HTTP ---------------------------------------------------------------------------------------


class HttpReceiver:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.port = free_port()  # fixed: the receiver goes down and comes back on it
        self._site = LocalSite(host, self.port)
        self.failing = False  # answer 503, as an overloaded fleet server would

    async def _post(self, request: web.Request) -> web.Response:
        if self.failing:
            return web.json_response({"error": "overloaded"}, status=503)
        self.bodies.append(await request.json())
        self.auth.append(request.headers.get("Authorization"))
        return web.json_response({"ok": True})

    async def up(self) -> None:
        app = web.Application()
        app.router.add_post("/heartbeat", self._post)
        await self._site.start(app)

    async def down(self) -> None:
        await self._site.stop()


@pytest.fixture
async def receiver() -> AsyncIterator[HttpReceiver]:
    receiver = HttpReceiver()
    await receiver.up()
    yield receiver
    await receiver.down()


async def test_http_heartbeat_queues_while_down_and_catches_up(receiver: HttpReceiver) -> None:
    conf = {
        "device_id": "unit-7",
        "interval": 3600,
        "queue_size": 2,
        "http": {"url": f"http://127.0.0.1:{receiver.port}/heartbeat", "token": "s3cr3t"},
    }
    upstream = Upstream(_agent(), conf)
    await upstream.start()  # the first heartbeat goes out at once
    try:
        await until(lambda: len(receiver.bodies) == 1)
        assert receiver.auth == ["Bearer s3cr3t"]
        assert receiver.bodies[0]["device_id"] == "unit-7"

        await receiver.down()
        missed = [upstream.heartbeat() for _ in range(3)]
        sink = upstream.sinks[0]
        await until(lambda: sink.failures >= 1)
        assert upstream.stats()["http"]["dropped"] == 1

        await receiver.up()
        latest = upstream.heartbeat()  # the next heartbeat flushes what was kept
        await until(lambda: len(receiver.bodies) == 3)
        # the queue holds two: the oldest ones gave way; the rest arrive in order
        kept = [*missed, latest][-2:]
        assert [b["at"] for b in receiver.bodies[1:]] == [r["at"] for r in kept]
        # the receiver keeps a body before it answers; the sink drops it once answered
        await until(lambda: upstream.stats()["http"]["queued"] == 0)
    finally:
        await upstream.stop()


async def test_http_error_answers_keep_the_report_queued(receiver: HttpReceiver) -> None:
    url = f"http://127.0.0.1:{receiver.port}/heartbeat"
    receiver.failing = True
    upstream = Upstream(_agent(), {"interval": 3600, "http": {"url": url}})
    await upstream.start()
    try:
        sink = upstream.sinks[0]
        await until(lambda: sink.failures == 1)
        assert sink.last_error == f"HTTP 503 from {url}"
        assert upstream.stats()["http"]["queued"] == 1
        receiver.failing = False
        upstream.heartbeat()
        await until(lambda: len(receiver.bodies) == 2)
        await until(lambda: upstream.stats()["http"]["queued"] == 0)  # once the 200 is heard
    finally:
        await upstream.stop()


# --- HTTP in clear: the fleet token must not leave the machine unencrypted ------------------------


def _fleet_config(directory: Path, http: str) -> Path:
    (directory / "secrets.yaml").write_text("fleet_token: fleet-token-0123456789\n")
    (directory / "secrets.yaml").chmod(0o600)
    path = directory / "config.yaml"
    path.write_text(
        "service:\n  simulator: {time_scale: 50}\n"
        "terminals:\n  - device_id: SIM-0001\n"
        "journal: {path: journal.db}\n"
        f"upstream:\n  device_id: store-42\n  http: {http}\n"
    )
    return path


def test_check_config_refuses_a_heartbeat_in_clear_to_another_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _fleet_config(
        tmp_path, "{url: 'http://fleet.example.com/hb', token: !secret fleet_token}"
    )
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "upstream.http.url: an http:// heartbeat to another host sends the fleet token" in err
    assert "allow_insecure_http: true" in err
    assert "fleet-token-0123456789" not in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "url",
    [
        "https://fleet.example.com/hb",
        "http://127.0.0.1:8080/hb",
        "http://127.0.1.1/hb",
        "http://[::1]:8080/hb",
        "http://localhost/hb",
        "http://localhost./hb",
    ],
)
def test_https_and_loopback_heartbeats_need_no_permission(url: str) -> None:
    conf = UPSTREAM_SCHEMA({"http": {"url": url, "token": "t"}})
    assert conf["http"]["allow_insecure_http"] is False


@pytest.mark.parametrize(
    "url",
    [
        "http://fleet.example.com/hb",
        "http://10.0.0.7/hb",
        "http://localhost.evil.example/hb",
        "http://127.0.0.1.evil.example/hb",
        "http://[::ffff:10.0.0.7]/hb",
        "http://user@10.0.0.7/hb",
    ],
)
def test_clear_text_heartbeats_to_other_hosts_need_permission(url: str) -> None:
    with pytest.raises(vol.Invalid, match="allow_insecure_http"):
        UPSTREAM_SCHEMA({"http": {"url": url, "token": "t"}})
    allowed = UPSTREAM_SCHEMA({"http": {"url": url, "allow_insecure_http": True}})
    assert allowed["http"]["url"] == url


async def test_the_agent_refuses_to_start_a_heartbeat_in_clear(tmp_path: Path) -> None:
    path = _fleet_config(tmp_path, "{url: 'http://10.0.0.7/hb', token: !secret fleet_token}")
    with pytest.raises(ConfigInvalid, match=r"upstream\.http\.url"):
        load_agent(path, None, systemd=False)
    with pytest.raises(vol.Invalid, match="allow_insecure_http"):  # the component itself too
        Upstream(_agent(), {"http": {"url": "http://10.0.0.7/hb"}})


async def test_an_allowed_heartbeat_in_clear_is_warned_at_start_and_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the receiver on every address, reached by this machine's name (not a loopback literal)
    receiver = HttpReceiver(host="0.0.0.0")  # noqa: S104 - the test's own receiver
    await receiver.up()
    url = f"http://{socket.gethostname()}:{receiver.port}/heartbeat"
    http = {"url": url, "token": "fleet-token-0123456789", "allow_insecure_http": True}
    upstream = Upstream(_agent(), {"interval": 3600, "http": http})
    try:
        with caplog.at_level("WARNING", logger="kiosk_agent.core.upstream"):
            await upstream.start()
        await until(lambda: len(receiver.bodies) == 1)
        assert receiver.auth == ["Bearer fleet-token-0123456789"]
        [warning] = [r.getMessage() for r in caplog.records if "in clear" in r.getMessage()]
        assert f"{url} is plain http to another host (allow_insecure_http)" in warning
        assert "fleet-token" not in caplog.text
    finally:
        await upstream.stop()
        await receiver.down()


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
        "queue_size": 2,
        "mqtt": {"host": "127.0.0.1", "port": proxy.port, "reconnect_interval": 0.1},
    }
    upstream = Upstream(_agent(), conf)
    availability = "kiosk-agent/unit-9/availability"
    state = "kiosk-agent/unit-9/state"
    await upstream.start()
    try:
        await until(lambda: len(observer.on(state)) == 1)
        assert observer.on(availability) == ["online"]
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
        assert sink.queue.dropped == 1

        # The network comes back: online again, and the kept reports arrive oldest first.
        await proxy.open()
        await until(lambda: len(observer.on(state)) == 3)
        assert observer.on(availability)[-1] == "online"
        assert [json.loads(p)["at"] for p in observer.on(state)[1:]] == [
            r["at"] for r in missed[1:]
        ]
    finally:
        await upstream.stop()
    # A clean stop says goodbye itself.
    await until(lambda: observer.on(availability)[-1:] == ["offline"])
    await observer.stop()
    await proxy.cut()


@pytest.mark.mqtt
async def test_mqtt_over_tls_verifies_the_broker(tmp_path: Path) -> None:
    ca = _make_certificates(tmp_path)
    tls = f"cafile {ca}\ncertfile {tmp_path / 'server.crt'}\nkeyfile {tmp_path / 'server.key'}\n"
    proc, port = start_broker(tmp_path, tls)
    try:
        mqtt = {"host": "127.0.0.1", "port": port, "tls": True, "reconnect_interval": 0.1}
        trusted = Upstream(_agent(), {"interval": 3600, "mqtt": {**mqtt, "ca_file": str(ca)}})
        await trusted.start()
        try:
            await until(lambda: trusted.sinks[0].sent == 1)
        finally:
            await trusted.stop()
        # without the private CA the broker's certificate is refused: nothing is sent
        untrusted = Upstream(_agent(), {"interval": 3600, "mqtt": mqtt})
        await untrusted.start()
        try:
            await until(lambda: untrusted.sinks[0].failures >= 1)
            assert untrusted.sinks[0].sent == 0
            assert untrusted.stats()["mqtt"]["queued"] == 1
        finally:
            await untrusted.stop()
    finally:
        stop_broker(proc)


@pytest.mark.mqtt
async def test_an_agent_configured_with_upstream_reports_itself(
    tmp_path: Path, mosquitto: int, sim_settings: Any
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "service:\n  simulator: {time_scale: 50}\n"
        "terminals:\n  - device_id: SIM-0001\n"
        "journal: {path: journal.db}\n"
        f"upstream:\n  device_id: store-42\n  mqtt: {{host: 127.0.0.1, port: {mosquitto}}}\n"
    )
    observer = Observer(mosquitto)
    await observer.start("kiosk-agent/store-42/#")
    agent = load_agent(config, sim_settings, systemd=False)
    await agent.start()
    try:
        await until(lambda: bool(observer.on("kiosk-agent/store-42/state")))
        report = json.loads(observer.on("kiosk-agent/store-42/state")[-1])
        assert report["version"] == agent.version
        assert [t["device_id"] for t in report["terminals"]] == ["SIM-0001"]
    finally:
        await agent.stop()
    await until(lambda: observer.on("kiosk-agent/store-42/availability")[-1:] == ["offline"])
    await observer.stop()


@pytest.mark.mqtt
async def test_home_assistants_birth_message_brings_the_discovery_again(mosquitto: int) -> None:
    observer = Observer(mosquitto)
    await observer.start("kiosk-agent/unit-b/#", "homeassistant/+/unit-b/#")
    conf = {"device_id": "unit-b", "interval": 3600,
            "mqtt": {"host": "127.0.0.1", "port": mosquitto, "reconnect_interval": 0.1}}
    upstream = Upstream(_agent(), conf)
    problem_topic = "homeassistant/binary_sensor/unit-b/problem/config"
    await upstream.start()
    try:
        await until(lambda: len(observer.on("kiosk-agent/unit-b/state")) == 1)
        configs = [t for t, _, _ in observer.messages if t.endswith("/config")]
        assert len(configs) == 8
        for topic in configs:  # what the broker hands Home Assistant passes HA's rules
            payload = json.loads(observer.on(topic)[0])
            assert ha.violations(topic, payload, "2024.3") == []
            assert ha.violations(topic, payload, "2026.2") == []
        assert json.loads(observer.on(problem_topic)[0])["expire_after"] == 10800

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


async def test_going_out_of_service_is_reported_at_once() -> None:
    agent = _agent()
    agent.availability = Availability(agent.health, ["SIM-0001"], hold_off=0)
    upstream = Upstream(agent, {"interval": 3600})
    await upstream.start()
    try:
        await until(lambda: upstream.heartbeats == 1)
        agent.health.report_terminal("SIM-0001", online=False)
        agent.availability.evaluate()
        await until(lambda: upstream.heartbeats == 2)  # not an hour later
        report = upstream.heartbeat()
        assert report["out_of_service"] == ["SIM-0001"]
        assert "card payment unavailable on SIM-0001: terminal offline" in report["problems"]
    finally:
        await upstream.stop()
