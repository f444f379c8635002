"""`kiosk-agent doctor` and `kiosk-agent health`, run in-process against the simulator."""

import asyncio
import datetime as dt
import json
import re
import socket
import subprocess
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import aiomqtt
import pytest

from kiosk_agent.app import load_agent
from kiosk_agent.cli import build_parser
from kiosk_agent.cli.fleet import format_health
from kiosk_agent.fleet.component import Upstream
from kiosk_agent.health.model import Health

from ..fleet.helpers import TcpProxy
from ..helpers import ADMIN_TOKEN, endpoint_config, free_port, until, write_config
from ..mqtt_broker import Observer, mosquitto, start_broker, stop_broker

__all__ = ["mosquitto"]  # the broker fixture, imported for the tests below


async def run_cli(*argv: str) -> int:
    args = build_parser(argv[0]).parse_args(list(argv))
    return int(await args.handler(args))


async def test_doctor_names_each_config_mistake_and_fails(tmp_path: Path, capsys) -> None:
    path = write_config(tmp_path, "service: {simulator: {}}\nterminals: []\nadmin: {prot: 1}\n")
    assert await run_cli("doctor", "--config", str(path)) == 2  # a broken config: exit 2
    out = capsys.readouterr().out
    assert "[FAIL] config:" in out
    assert "fix: correct each line below" in out
    assert "terminals" in out
    assert "1 of 1 check failed: config" in out


async def test_doctor_with_a_missing_config_file(tmp_path: Path, capsys) -> None:
    assert await run_cli("doctor", "--config", str(tmp_path / "nope.yaml")) == 2
    assert "does not exist" in capsys.readouterr().out


async def test_doctor_reports_an_unplugged_serial_adapter(tmp_path: Path, sim, capsys) -> None:
    gone = "/dev/serial/by-id/usb-missing-adapter-if00"
    triggers = f"triggers:\n  - platform: mdb\n    name: front\n    port: {gone}\n"
    path = endpoint_config(tmp_path, sim, "  - device_id: SIM-0001", triggers)
    assert await run_cli("doctor", "--config", str(path)) == 1
    out = capsys.readouterr().out
    assert f"[FAIL] serial port front: {gone} is not present" in out
    assert "fix: plug the adapter in" in out
    assert "[PASS] journal" in out
    assert "       serial ports here: " in out  # what does exist, to pick from


async def test_doctor_json_says_when_the_run_finished(tmp_path: Path, sim, capsys) -> None:
    path = endpoint_config(tmp_path, sim, "  - device_id: SIM-0001")
    before = time.time()
    await run_cli("doctor", "--config", str(path), "--json")
    report = json.loads(capsys.readouterr().out)
    finished = dt.datetime.fromisoformat(report["finished_at"].replace("Z", "+00:00"))
    assert report["finished_at"].endswith("Z")  # ISO 8601 UTC, as every JSON time
    assert int(before) <= finished.timestamp() <= time.time()  # to the second
    assert report["started_at"] <= report["finished_at"]


async def test_doctor_reports_an_unreachable_service(tmp_path: Path, sim, capsys) -> None:
    path = endpoint_config(tmp_path, sim, "  - device_id: SIM-0001")
    await sim.stop()
    assert await run_cli("doctor", "--config", str(path), "--timeout", "0.5") == 1
    out = capsys.readouterr().out
    assert "[FAIL] service: not reachable" in out
    assert "fix: check the network" in out


def test_health_is_readable_for_people() -> None:
    snapshot = {
        "version": "1.0",
        "status": "degraded",
        "uptime_s": 3725,
        "service": {"reachable": True, "key_expires_in_s": 7200},
        "sales": {"today_count": 3, "today_amount_cents": 1250, "open": 0, "attention": 1},
        "terminals": [{"device_id": "SIM-0001", "online": False, "detail": "timed out"}],
        "links": [{"name": "mdb:front", "state": "connected", "healthy": True, "detail": ""}],
        "problems": ["1 sale(s) need attention"],
        "availability": [
            {"device_id": "SIM-0001", "available": False, "reason": "terminal offline",
             "since": 0.0},
        ],
        "journal": {"writable": False, "detail": "disk full"},
    }
    text = format_health(snapshot)
    assert "status:   DEGRADED  (version 1.0, up 1h 2m)" in text
    assert "key expires in 2h 0m" in text
    assert "sales:    today (since 00:00 UTC) 3 completed, $12.50; open 0, attention 1" in text
    assert "SIM-0001     OFFLINE  timed out" in text
    assert "problem:  1 sale(s) need attention" in text
    out_of_service = r"card: +SIM-0001 +OUT OF SERVICE since \d\d:\d\d:\d\dZ: terminal offline"
    assert re.search(out_of_service, text)
    assert "cards:    0 of 1 reader can take cards" in text
    assert "journal:  NOT WRITABLE disk full" in text


async def test_health_from_a_running_agent(
    tmp_path: Path, sim, sim_settings, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = "admin:\n  port: 0\n  tokens:\n    - {name: ops, token: !secret admin_token}\n"
    path = endpoint_config(tmp_path, sim, "  - device_id: SIM-0001", admin)
    agent = load_agent(path, sim_settings, systemd=False)
    await agent.start()
    try:
        server = next(c for c in agent.components if type(c).__name__ == "AdminServer")
        monkeypatch.setenv("KIOSK_AGENT_TOKEN", ADMIN_TOKEN)  # never a flag: shell history
        rc = await run_cli("health", "--url", server.url, "--json")
        snapshot = json.loads(capsys.readouterr().out)
        assert snapshot["version"] == agent.version
        assert rc == (0 if snapshot["status"] == "ok" else 1)
        wrong = tmp_path / "token"
        wrong.write_text("wrong" * 6 + "\n")
        assert await run_cli("health", "--url", server.url, "--token-file", str(wrong)) == 3
        assert "refused the token" in capsys.readouterr().err
    finally:
        await agent.stop()
    assert await run_cli("health", "--url", server.url) == 4
    assert "cannot reach the agent" in capsys.readouterr().err


async def test_health_needs_a_token_or_a_config(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delenv("KIOSK_AGENT_TOKEN", raising=False)
    assert await run_cli("health", "--url", "http://127.0.0.1:9") == 2
    assert "set $KIOSK_AGENT_TOKEN or give --token-file FILE" in capsys.readouterr().err
    # a token is never taken from the command line
    with pytest.raises(SystemExit):
        await run_cli("health", "--url", "http://127.0.0.1:9", "--token", "t" * 24)
    err = capsys.readouterr().err
    assert "--token: a token is never taken from the command line" in err
    assert "t" * 24 not in err
    no_file = ("--token-file", "/nonexistent")
    assert await run_cli("health", "--url", "http://127.0.0.1:9", *no_file) == 2
    assert "--token-file /nonexistent: No such file or directory" in capsys.readouterr().err


def test_doctor_counts_skipped_checks_apart_whether_it_passes_or_fails() -> None:
    from kiosk_agent.cli.fleet import verdict
    from kiosk_agent.doctor import Report, Verdict

    report = Report()
    report.add("config", Verdict.PASS)
    report.add("serial port front", Verdict.FAIL)
    report.add("upstream", Verdict.SKIP)
    assert verdict(report) == "1 of 2 checks failed: serial port front"  # not "1 of 3"
    report.checks.pop(1)
    assert verdict(report) == "all 1 check passed, 1 skipped"


async def test_doctor_passes_on_a_healthy_unit(tmp_path: Path, sim, service, capsys) -> None:
    handle = await service.terminal.charge_card("SIM-0001", 125)
    charge = (await handle.wait(timeout=10)).charge_result
    assert charge is not None
    trans_id = charge.trans_id
    terminals = "  - device_id: SIM-0001\n  - device_id: SIM-0007"
    path = endpoint_config(tmp_path, sim, terminals)
    argv = ("doctor", "--config", str(path), "--test-print", "--trans-id", trans_id)
    assert await run_cli(*argv) == 0
    out = capsys.readouterr().out
    for line in (
        "[PASS] config:",
        "[PASS] service: reachable, 8 terminal(s) listed",
        "[PASS] terminal SIM-0001: listed",
        "[PASS] ping SIM-0001:",
        "[SKIP] test print SIM-0001: this terminal has no printer",
        f"[PASS] test print SIM-0007: printed transaction {trans_id}",
    ):
        assert line in out
    assert "all " in out


async def test_doctor_finds_an_offline_reader_and_a_wrong_device_id(
    tmp_path: Path, sim, capsys
) -> None:
    base = sim.ready_info()["base_url"]
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{base}/sim/terminals/SIM-0002/offline") as response,
    ):
        assert response.status == 200
    terminals = "  - device_id: SIM-0002\n  - device_id: SIM-0O01"
    path = endpoint_config(tmp_path, sim, terminals)
    assert await run_cli("doctor", "--config", str(path)) == 1
    out = capsys.readouterr().out
    assert "[FAIL] ping SIM-0002: the terminal is offline" in out
    assert "fix: power-cycle the reader" in out
    assert "[FAIL] terminal SIM-0O01: not listed by the service" in out
    assert "fix: fix the device_id in the config (the service lists: SIM-0001" in out


async def test_doctor_with_the_embedded_simulator(tmp_path: Path, capsys) -> None:
    body = "service:\n  simulator: {time_scale: 50}\nterminals:\n  - device_id: SIM-0003\n"
    path = write_config(tmp_path, body)
    assert await run_cli("doctor", "--config", str(path)) == 0
    out = capsys.readouterr().out
    assert "[PASS] service: embedded simulator started" in out
    assert "[PASS] ping SIM-0003" in out
    skipped = out.count("[SKIP]")
    ran = out.count("[PASS]") + out.count("[WARN]")
    assert skipped  # no serial port, no upstream, no printer
    assert out.rstrip().endswith(f"all {ran} checks passed, {skipped} skipped")


async def test_doctor_checks_that_heartbeats_can_leave(tmp_path: Path, sim, capsys) -> None:
    listener = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    open_port = listener.sockets[0].getsockname()[1]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    upstream = (
        "upstream:\n"
        f"  http: {{url: 'http://127.0.0.1:{open_port}/heartbeat'}}\n"
        f"  mqtt: {{host: 127.0.0.1, port: {closed_port}}}\n"
    )
    path = endpoint_config(tmp_path, sim, "  - device_id: SIM-0001", upstream)
    try:
        assert await run_cli("doctor", "--config", str(path), "--timeout", "2") == 1
    finally:
        listener.close()
    out = capsys.readouterr().out
    assert f"[PASS] upstream http: 127.0.0.1:{open_port} accepts connections" in out
    assert f"[FAIL] upstream mqtt: 127.0.0.1:{closed_port}:" in out
    assert "fix: check host, port, user and password" in out


async def test_health_finds_the_admin_api_in_the_config(
    tmp_path: Path, sim, sim_settings, capsys
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    admin = f"admin:\n  port: {port}\n  tokens:\n    - {{name: ops, token: !secret admin_token}}\n"
    path = endpoint_config(tmp_path, sim, "  - device_id: SIM-0001", admin)
    agent = load_agent(path, sim_settings, systemd=False)
    await agent.start()
    try:
        rc = await run_cli("health", "--config", str(path))
    finally:
        await agent.stop()
    out = capsys.readouterr().out
    assert out.startswith("status:   OK")
    assert "terminal: SIM-0001     online" in out
    assert rc == 0
    assert ADMIN_TOKEN not in out


# -- fleet forget (a real Mosquitto) ------------------------------------------------------------


def _fleet_config(directory: Path, broker: int, device_id: str = "old-unit") -> Path:
    return write_config(
        directory,
        "service: {simulator: {}}\nterminals: [{device_id: SIM-0001}]\n"
        f"upstream:\n  device_id: {device_id}\n"
        f"  mqtt: {{host: 127.0.0.1, port: {broker}, reconnect_interval: 0.1}}\n",
    )


async def _retained(broker: int, *topics: str) -> dict[str, str]:
    """What a newcomer (Home Assistant starting) is handed for ``topics``."""
    observer = Observer(broker)
    await observer.start(*topics)
    await observer.caught_up()  # the retained ones come right after the subscription
    await observer.stop()
    return {topic: payload for topic, payload, retain in observer.messages if retain and payload}


async def _announce(broker: int, device_id: str) -> Upstream:
    health = Health("1.0")
    health.report_service(True)
    upstream = Upstream(
        SimpleNamespace(health=health),
        {"device_id": device_id, "interval": 3600,
         "mqtt": {"host": "127.0.0.1", "port": broker, "reconnect_interval": 0.1}},
    )
    await upstream.start()
    await until(lambda: upstream.mqtt is not None and upstream.mqtt.online)  # after the report
    return upstream


@pytest.mark.mqtt
async def test_fleet_forget_clears_a_decommissioned_units_retained_topics(
    tmp_path: Path, mosquitto: int, capsys: pytest.CaptureFixture[str]
) -> None:
    upstream = await _announce(mosquitto, "old-unit")
    neighbour = await _announce(mosquitto, "other-unit")
    config = _fleet_config(tmp_path, mosquitto)
    unit_topics = ("kiosk-agent/old-unit/#", "homeassistant/+/old-unit/+/config")
    assert len(await _retained(mosquitto, *unit_topics)) == 21  # 19 configs, state, availability

    # still running: refused, with the fix
    assert await run_cli("fleet", "forget", "--config", str(config), "--wait", "0.3") == 1
    assert "says it is online: stop its agent first" in capsys.readouterr().err

    await upstream.stop()  # decommissioned: its goodbye leaves "offline" retained
    watcher = Observer(mosquitto)  # what Home Assistant hears, in order
    await watcher.start(*unit_topics)
    code = await run_cli("fleet", "forget", "--config", str(config), "--wait", "0.3",
                         "--settle", "0.1", "--json")
    assert code == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["device_id"] == "old-unit"
    assert len(answer["found"]) == 21
    assert await _retained(mosquitto, *unit_topics) == {}  # Home Assistant forgets it
    # the configs first (HA removes the entities), the state after: no template meets an
    # empty state while its entity is still there
    await until(lambda: len([m for m in watcher.messages if not m[1]]) >= 19)
    await watcher.stop()
    cleared = [topic for topic, payload, _ in watcher.messages if not payload]
    last_config = max(i for i, topic in enumerate(cleared) if topic.endswith("/config"))
    assert last_config < cleared.index("kiosk-agent/old-unit/state")
    # the neighbour is untouched
    assert len(await _retained(mosquitto, "homeassistant/+/other-unit/+/config")) == 19
    await neighbour.stop()


@pytest.mark.mqtt
async def test_fleet_forget_leaves_another_programs_configs_under_the_same_node_id(
    tmp_path: Path, mosquitto: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A unit's device id defaults to its host name, and other programs on the host name their
    Home Assistant device after it too (a system monitor: `homeassistant/sensor/<host>/...`).
    Before: forget cleared every config under that node id, the other program's with it."""
    upstream = await _announce(mosquitto, "shared-host")
    await upstream.stop()
    foreign = "homeassistant/sensor/shared-host/cpu_load/config"
    async with aiomqtt.Client("127.0.0.1", mosquitto) as monitor:
        await monitor.publish(foreign, json.dumps({"unique_id": "shared-host-cpu",
                                                   "state_topic": "monitor/cpu"}),
                              qos=1, retain=True)
    config = _fleet_config(tmp_path, mosquitto, "shared-host")
    try:
        assert await run_cli("fleet", "forget", "--config", str(config), "--wait", "0.3",
                             "--settle", "0", "--json") == 0
        answer = json.loads(capsys.readouterr().out)
        assert foreign not in answer["cleared"]
        left = await _retained(mosquitto, "kiosk-agent/shared-host/#",
                               "homeassistant/+/shared-host/+/config")
        assert list(left) == [foreign]
    finally:
        async with aiomqtt.Client("127.0.0.1", mosquitto) as monitor:
            await monitor.publish(foreign, b"", qos=1, retain=True)


@pytest.mark.mqtt
async def test_fleet_forget_of_a_unit_online_but_long_quiet_says_its_will_was_lost(
    tmp_path: Path, mosquitto: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A unit gone while its broker restarted: its last will never came, `online` stays. Before,
    forget told the field tech to stop an agent that no longer runs."""
    report = json.dumps({"status": "ok", "at": time.time() - 7200, "interval_s": 60})
    async with aiomqtt.Client("127.0.0.1", mosquitto) as broker:
        await broker.publish("kiosk-agent/ghost-1/availability", "online", qos=1, retain=True)
        await broker.publish("kiosk-agent/ghost-1/state", report, qos=1, retain=True)
    config = _fleet_config(tmp_path, mosquitto, "ghost-1")
    argv = ("fleet", "forget", "--config", str(config), "--wait", "0.5", "--settle", "0")
    assert await run_cli(*argv) == 1
    err = capsys.readouterr().err
    assert "ghost-1 says it is online, but its last report is 2h 0m old" in err
    assert "if its agent is gone, pass --force" in err
    assert await run_cli(*argv, "--force") == 0
    assert await _retained(mosquitto, "kiosk-agent/ghost-1/#") == {}


async def test_fleet_forget_names_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, "service: {simulator: {}}\nterminals: [{device_id: S1}]\n")
    assert await run_cli("fleet", "forget", "--config", str(config)) == 2
    assert "no upstream: mqtt: section" in capsys.readouterr().err
    closed = _fleet_config(tmp_path, free_port())
    assert await run_cli("fleet", "forget", "--config", str(closed), "--wait", "0.2") == 4
    assert "cannot reach the MQTT broker 127.0.0.1:" in capsys.readouterr().err


@pytest.mark.parametrize("settle", ["inf", "nan", "-5", "soon"])
def test_fleet_forget_takes_a_settle_of_finite_seconds_only(
    settle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `--settle inf` cleared the configs and then waited for ever, the unit's state
    and availability never cleared; `-5` and `nan` were taken as no wait."""
    with pytest.raises(SystemExit) as usage:
        build_parser("fleet").parse_args(["fleet", "forget", "--settle", settle])
    assert usage.value.code == 2
    assert "--settle" in capsys.readouterr().err
    args = build_parser("fleet").parse_args(["fleet", "forget", "--settle", "0"])
    assert args.settle == 0.0


@pytest.mark.mqtt
async def test_fleet_forget_refuses_a_unit_that_is_not_there_and_wildcards(
    tmp_path: Path, mosquitto: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `--device-id nosuch-unit` exited 0 ("cleared 10 retained topics (0 were
    set)"), and `--device-id +` was taken as an MQTT wildcard, stopped only by the broker."""
    config = _fleet_config(tmp_path, mosquitto)
    argv = ("fleet", "forget", "--config", str(config), "--wait", "0.3")
    assert await run_cli(*argv, "--device-id", "nosuch-unit") == 1
    err = capsys.readouterr().err
    assert "no unit nosuch-unit on the broker 127.0.0.1:" in err
    assert "none of its retained topics is set" in err
    for wildcard in ("+", "#", "a/+", "unit 1"):
        assert await run_cli(*argv, "--device-id", wildcard) == 2
        assert f"--device-id {wildcard!r} is not a device id" in capsys.readouterr().err


@pytest.mark.mqtt
async def test_fleet_forget_fails_when_the_broker_keeps_what_it_was_asked_to_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker's ACL may refuse this user's writes, and MQTT 3.1.1 refuses a publish in
    silence (PUBACK all the same). Before: `fleet forget` said "forgot acl-unit: cleared 17
    retained topic(s)... Home Assistant removes its entities now" and exited 0 while the broker
    kept every one; with the discovery prefix refused alone it cleared the state under
    entities HA still had."""
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(tmp_path / "users"), "unit", "unit-pw"],
                   check=True, capture_output=True)
    subprocess.run(["mosquitto_passwd", "-b", str(tmp_path / "users"), "admin", "admin-pw"],
                   check=True, capture_output=True)
    (tmp_path / "acl").write_text(
        "user unit\ntopic readwrite kiosk-agent/#\ntopic readwrite homeassistant/#\n"
        "user admin\ntopic readwrite kiosk-agent/#\ntopic read homeassistant/#\n"
    )
    proc, port = start_broker(
        tmp_path, f"password_file {tmp_path / 'users'}\nacl_file {tmp_path / 'acl'}\n"
    )
    try:
        health = Health("1.0")
        health.report_service(True)
        mqtt = {"host": "127.0.0.1", "port": port, "reconnect_interval": 0.1,
                "username": "unit", "password": "unit-pw"}
        unit = Upstream(SimpleNamespace(health=health),
                        {"device_id": "acl-unit", "interval": 3600, "mqtt": mqtt})
        await unit.start()
        await until(lambda: unit.sinks[0].sent >= 1)
        await unit.stop()
        monkeypatch.setenv("FLEET_ADMIN_PASSWORD", "admin-pw")
        config = write_config(
            tmp_path, "service: {simulator: {}}\nterminals: [{device_id: SIM-0001}]\n"
            f"upstream:\n  mqtt: {{host: 127.0.0.1, port: {port}, username: admin, "
            "password: !env_var FLEET_ADMIN_PASSWORD}\n")
        argv = ("fleet", "forget", "--config", str(config), "--device-id", "acl-unit",
                "--wait", "0.5", "--settle", "0.1")
        assert await run_cli(*argv) == 1
        err = capsys.readouterr().err
        assert ("the broker kept 19 of acl-unit's discovery configs after they were cleared"
                in err)
        assert "its state and availability are left for the entities HA keeps" in err
        assert "may the MQTT user admin write there" in err
        # the state is left: Home Assistant still has the entities that read it
        async with aiomqtt.Client("127.0.0.1", port, username="unit", password="unit-pw") as c:
            await c.subscribe("kiosk-agent/acl-unit/state")
            async with asyncio.timeout(2):
                message = await anext(aiter(c.messages))
        assert message.retain
        assert message.payload
    finally:
        stop_broker(proc)


@pytest.mark.mqtt
async def test_fleet_list_and_show_read_the_retained_topics(
    tmp_path: Path, mosquitto: int, capsys: pytest.CaptureFixture[str]
) -> None:
    healthy = await _announce(mosquitto, "list-a1")
    troubled = await _announce(mosquitto, "list-b2")
    troubled._health.report_journal(False, "disk full")  # type: ignore[attr-defined]
    await until(lambda: troubled.heartbeats == 2)  # a problem goes out at once
    await until(lambda: troubled.sinks[0].sent == 2)
    await troubled.stop()  # its goodbye: offline
    config = _fleet_config(tmp_path, mosquitto)
    try:
        # exit 1: a unit is not ok (list-b2 is offline), as `health` of a degraded agent
        assert await run_cli("fleet", "list", "--config", str(config), "--json") == 1
        rows = {r["device_id"]: r for r in json.loads(capsys.readouterr().out)["units"]}
        assert rows["list-a1"]["status"] == "ok"
        assert rows["list-a1"]["online"] is True
        assert rows["list-a1"]["version"] == "1.0"
        assert rows["list-a1"]["sales_today"] == 0
        assert rows["list-b2"]["status"] == "offline"
        assert rows["list-b2"]["problems"] == ["journal not writable: disk full"]

        assert await run_cli("fleet", "list", "--config", str(config)) == 1
        table = capsys.readouterr().out.splitlines()
        assert table[0].split() == ["UNIT", "STATUS", "LAST", "SEEN", "SALES", "TODAY",
                                    "VERSION", "PROBLEMS"]
        [line] = [row for row in table if row.startswith("list-b2")]
        assert line.split()[1] == "offline"
        assert line.endswith("journal not writable: disk full")

        assert await run_cli("fleet", "show", "list-b2", "--config", str(config)) == 1
        out = capsys.readouterr().out
        assert out.startswith("unit:     list-b2  (offline, last seen ")
        assert "journal:  NOT WRITABLE disk full" in out
        assert await run_cli("fleet", "show", "nosuch", "--config", str(config)) == 1
        assert "no unit nosuch on the broker" in capsys.readouterr().err
        assert await run_cli("fleet", "show", "list-a1", "--config", str(config)) == 0
    finally:
        await healthy.stop()


@pytest.mark.mqtt
async def test_fleet_list_of_no_unit_says_where_it_looked_and_what_hides_units(
    tmp_path: Path, mosquitto: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: an empty listing was the header and "0 units, 0 not ok", the same for a wrong
    topic_prefix and for a broker whose ACL does not let this user read the units' topics (the
    broker takes the subscription and hands nothing)."""
    prefix = f"empty-{uuid.uuid4().hex[:8]}"
    config = write_config(tmp_path, "service: {simulator: {}}\nterminals: [{device_id: S1}]\n"
                          f"upstream:\n  mqtt: {{host: 127.0.0.1, port: {mosquitto}, "
                          f"topic_prefix: {prefix}}}\n")
    assert await run_cli("fleet", "list", "--config", str(config), "--wait", "1") == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == "0 units, 0 not ok"
    assert f"no unit under {prefix}/ on the broker 127.0.0.1:{mosquitto}" in captured.err
    assert "may the MQTT user anonymous read" in captured.err


@pytest.mark.mqtt
async def test_fleet_show_of_a_unit_without_a_report_says_why_it_is_not_ok(
    tmp_path: Path, mosquitto: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a unit whose availability alone was kept printed its first line and nothing
    else, exit 1 without a word why."""
    prefix = f"bare-{uuid.uuid4().hex[:8]}"
    async with aiomqtt.Client("127.0.0.1", mosquitto) as unit:
        await unit.publish(f"{prefix}/bare-1/availability", "online", qos=1, retain=True)
    config = write_config(tmp_path, "service: {simulator: {}}\nterminals: [{device_id: S1}]\n"
                          f"upstream:\n  mqtt: {{host: 127.0.0.1, port: {mosquitto}, "
                          f"topic_prefix: {prefix}}}\n")
    try:
        assert await run_cli("fleet", "show", "bare-1", "--config", str(config)) == 1
        assert capsys.readouterr().out.splitlines()[1:] == [
            "status:   UNKNOWN",
            "problem:  no report of it on the broker (cleared, or the unit has not reported yet)",
        ]
    finally:
        async with aiomqtt.Client("127.0.0.1", mosquitto) as unit:
            await unit.publish(f"{prefix}/bare-1/availability", b"", qos=1, retain=True)


@pytest.mark.mqtt
async def test_fleet_list_says_when_the_broker_had_not_handed_every_unit_in_time(
    tmp_path: Path, mosquitto: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A slow broker (a proxy delays each chunk it sends) and a short --wait: the listing ends
    before the broker's end marker. Before, such a listing was cut at the first pause and
    printed as the whole fleet, exit 0 when the units it held were ok."""
    prefix = f"slow-{uuid.uuid4().hex[:8]}"
    async with aiomqtt.Client("127.0.0.1", mosquitto) as units:
        for i in range(1000):
            await units.publish(f"{prefix}/u{i}/state", b'{"status": "ok"}' + b" " * 1500,
                                qos=0, retain=True)
        await units.publish(f"{prefix}/last/state", b'{"status": "ok"}', qos=1, retain=True)
    proxy = TcpProxy(mosquitto)
    await proxy.open()
    proxy.answer_delay = 0.05
    config = write_config(tmp_path, "service: {simulator: {}}\nterminals: [{device_id: S1}]\n"
                          f"upstream:\n  mqtt: {{host: 127.0.0.1, port: {proxy.port}, "
                          f"topic_prefix: {prefix}}}\n")
    try:
        assert await run_cli("fleet", "list", "--config", str(config), "--json",
                             "--wait", "1") == 1
        captured = capsys.readouterr()
        answer = json.loads(captured.out)
        assert answer["complete"] is False
        assert answer["count"] < 1001
        assert "the broker had not handed every retained topic within --wait 1 s" in (
            captured.err)
    finally:
        await proxy.cut()
        async with aiomqtt.Client("127.0.0.1", mosquitto) as units:
            for i in range(1000):
                await units.publish(f"{prefix}/u{i}/state", b"", qos=0, retain=True)
            await units.publish(f"{prefix}/last/state", b"", qos=1, retain=True)


@pytest.mark.mqtt
async def test_fleet_list_names_what_other_clients_left_on_unit_topics_and_lists_the_rest(
    tmp_path: Path, mosquitto: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Any client of the broker can retain anything on a unit's topics. Before: one bad
    report failed the whole listing ("invalid literal for int()", exit 2), and `fleet show`
    printed a report's terminal escapes as they came."""
    prefix = f"hostile-{uuid.uuid4().hex[:8]}"  # this test's fleet alone on the shared broker
    health = Health("1.0")
    health.report_service(True)
    mqtt = {"host": "127.0.0.1", "port": mosquitto, "reconnect_interval": 0.1,
            "topic_prefix": prefix, "discovery_prefix": ""}
    unit = Upstream(SimpleNamespace(health=health),
                    {"device_id": "good-1", "interval": 3600, "mqtt": mqtt})
    await unit.start()
    await until(lambda: unit.sinks[0].sent >= 1)
    try:
        async with aiomqtt.Client("127.0.0.1", mosquitto) as careless:
            for device_id, payload in [
                ("garbage", b"{not json"), ("typed", b'{"status": "ok", "sales": [1]}'),
                ("escape", b'{"status": "ok", "problems": ["\\u001b[2Jall fine"]}'),
                ("huge", b'{"status": "ok", "problems": ["' + b"x" * 300_000 + b'"]}'),
            ]:
                await careless.publish(f"{prefix}/{device_id}/state", payload, retain=True, qos=1)
        config = write_config(tmp_path, "service: {simulator: {}}\nterminals: [{device_id: S1}]\n"
                              f"upstream:\n  mqtt: {json.dumps(mqtt)}\n")

        assert await run_cli("fleet", "list", "--config", str(config), "--json") == 1
        rows = {r["device_id"]: r for r in json.loads(capsys.readouterr().out)["units"]}
        assert rows["good-1"]["status"] == "ok"  # the unit is listed truthfully beside them
        assert {d: r["status"] for d, r in rows.items() if d != "good-1"} == dict.fromkeys(
            ("escape", "garbage", "huge", "typed"), "invalid")
        assert rows["garbage"]["problems"] == ["its report is not JSON: '{not json'"]
        assert rows["typed"]["problems"] == ["its report's sales is [1], not an object"]
        assert rows["huge"]["problems"][0].startswith("its report is 300,034 bytes, more than")

        assert await run_cli("fleet", "show", "escape", "--config", str(config)) == 1
        out = capsys.readouterr().out
        assert "problem:  a control character (U+001B) in problems.0" in out
        assert "\x1b" not in out
        await until(lambda: unit.sinks[0].connected)
        assert unit.sinks[0].sent >= 1  # the unit kept running and reporting meanwhile
    finally:
        await unit.stop()


HOSTILE = "\x1b]0;pwned\x07\x1b[2J"  # retitles the terminal, then clears the screen


def test_health_and_fleet_show_say_what_sales_today_counts_and_of_which_day() -> None:
    """`fleet show` (and `health`) said "today 3": not what the 3 were (the completed sales,
    as the page's "3 completed, $12.50") nor by which day (UTC), nor that a unit's last report
    was of an earlier day."""
    from kiosk_agent.moments import day_of, day_start

    today = day_start(day_of(time.time()))
    sales = {"today_count": 3, "today_amount_cents": 1250, "open": 1, "attention": 0}

    def line(report_sales: dict[str, object]) -> str:
        text = format_health({"status": "ok", "sales": report_sales}, now=today + 60)
        [sales_line] = [ln for ln in text.splitlines() if ln.startswith("sales:")]
        return sales_line

    expected = "sales:    today (since 00:00 UTC) 3 completed, $12.50; open 1, attention 0"
    assert line({**sales, "day_started_at": today}) == expected
    assert line(sales) == expected  # a report that does not name its day: the agent's own
    yesterday = day_start(day_of(today - 3600))
    assert line({**sales, "day_started_at": yesterday}) == (
        f"sales:    on {day_of(yesterday).isoformat()} (UTC, the report's day) 3 completed, "
        "$12.50; open 1, attention 0"
    )


def test_health_shows_outside_words_and_never_lets_the_terminal_obey_them() -> None:
    """Before: `health` printed a service's words, a machine's message and a unit's report raw;
    an escape sequence in them retitled or cleared the tech's terminal."""
    snapshot = {
        "version": f"1.0{HOSTILE}",
        "status": "degraded",
        "service": {"reachable": False},
        "terminals": [{"device_id": f"SIM{HOSTILE}", "online": False, "detail": HOSTILE}],
        "links": [{"name": "mdb:front", "state": "error", "healthy": False,
                   "detail": f"adapter said {HOSTILE}"}],
        "problems": [f"service refused: {HOSTILE}\nstatus:   OK"],
        "availability": [{"device_id": "SIM-0001", "available": False, "reason": HOSTILE,
                          "since": 0.0}],
        "journal": {"writable": False, "detail": HOSTILE},
    }
    text = format_health(snapshot)
    assert not {"\x1b", "\x07"} & set(text)
    assert "problem:  service refused: \ufffd]0;pwned\ufffd\ufffd[2J status:   OK" in text
    assert not any(line.startswith("status:   OK") for line in text.splitlines())  # no fake line
    # a time on the command line is UTC, and says so
    assert "OUT OF SERVICE since 00:00:00Z: " in text


def test_health_says_a_terminal_waiting_for_the_start_is_starting_not_out_of_service() -> None:
    waiting = {"device_id": "SIM-0001", "available": False, "since": 0.0, "starting": True,
               "reason": "journal: reading its file whole before money moves on it"}
    text = format_health({"status": "ok", "service": {"reachable": True}, "problems": [],
                          "availability": [waiting]})
    assert ("card:     SIM-0001     STARTING since 00:00:00Z: journal: reading its file whole "
            "before money moves on it") in text
    assert "OUT OF SERVICE" not in text


def test_the_fleet_table_shows_outside_words_and_never_lets_the_terminal_obey_them() -> None:
    from kiosk_agent.cli.fleet import format_fleet

    row = {"device_id": f"unit{HOSTILE}", "status": "degraded",
           "last_seen": "1970-01-01T00:00:00Z",
           "sales_today": None, "version": HOSTILE, "problems": [HOSTILE]}
    text = format_fleet([row], 60.0)
    assert not {"\x1b", "\x07"} & set(text)
    assert "\ufffd]0;pwned" in text


def test_an_answer_read_whole_is_parsed_as_http_or_refused_as_not_http() -> None:
    """`health` and `terminals` ask the agent over plain HTTP on a socket (cli/fleet.py's
    get_once, HTTP/1.0): what comes back is its status, Location and body, or a ValueError
    that says it is no HTTP answer (the command then says it cannot reach the agent)."""
    from kiosk_agent.cli.fleet import ANSWER_LIMIT, parse_answer

    answer = (b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n"
              b"\r\n{\"a\": 1}\r\nextra")
    assert parse_answer(answer) == (200, None, b'{"a": 1}\r\ne')
    assert parse_answer(b"HTTP/1.1 307 Temporary Redirect\r\nlocation: http://x/y\r\n\r\n") == (
        307, "http://x/y", b"")
    assert parse_answer(b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * (ANSWER_LIMIT + 5))[2] == (
        b"x" * ANSWER_LIMIT)
    for not_http in (b"", b"SSH-2.0-OpenSSH_9.2\r\n", b"HTTP/1.1 200 OK\r\nno end",
                     b"<html>hello</html>\r\n\r\n", b"HTTP/2 200\r\n\r\n",
                     b"HTTP/1.1 abc\r\n\r\n"):
        with pytest.raises(ValueError, match="no HTTP answer"):
            parse_answer(not_http)
