"""`kiosk-agent doctor` as a field tech runs it: a subprocess against the simulator."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.config.load import load_config
from kiosk_agent.doctor import (
    Report,
    Verdict,
    check_port_urls,
    check_serial_ports,
)
from kiosk_agent.fleet.doctor import check_mqtt
from kiosk_agent.health.model import Health

from .cli.test_fleet_cli import endpoint_config
from .helpers import free_port
from .mqtt_broker import start_broker, stop_broker


@pytest.fixture
def pty_port() -> Iterator[str]:
    """A real pty: the mdb trigger's serial port (present and accessible)."""
    master, slave = os.openpty()
    try:
        yield os.ttyname(slave)
    finally:
        os.close(slave)
        os.close(master)


def _mixed_config(directory: Path, sim: Any, pty: str) -> Path:
    """One terminal; a kiosk API (its port is an HTTP port) and an mdb trigger on ``pty``."""
    path = endpoint_config(directory, sim, "  - device_id: SIM-0001", _triggers(pty))
    with (directory / "secrets.yaml").open("a") as secrets:
        secrets.write("kiosk_token: kiosk-token-0123456789\n")
    return path


def _triggers(pty: str) -> str:
    return f"""
triggers:
  - platform: kiosk_api
    name: screen
    token: !secret kiosk_token
    port: 8765
  - platform: mdb
    name: front
    port: {pty}
"""


async def test_doctor_checks_a_config_with_a_kiosk_api_and_an_mdb_trigger(
    tmp_path: Path, sim: Any, pty_port: str
) -> None:
    path = _mixed_config(tmp_path, sim, pty_port)
    doctor = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("kiosk-agent")), "doctor", "-c", str(path),
        "--timeout", "5",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=tmp_path,
    )
    out, err = await asyncio.wait_for(doctor.communicate(), 60)
    text, errors = out.decode(), err.decode()

    assert "Traceback" not in errors + text, errors
    assert f"[PASS] serial port front: {pty_port} present and accessible" in text
    assert "screen" not in text  # the kiosk API's HTTP port is no serial port
    assert "[PASS] service" in text
    assert doctor.returncode == 0, text + errors


def test_only_serial_ports_are_checked_as_devices(tmp_path: Path, sim: Any, pty_port: str) -> None:
    path = _mixed_config(tmp_path, sim, pty_port)
    report = Report()
    check_serial_ports(report, load_config(path))
    assert [(c.name, c.verdict) for c in report.checks] == [
        ("serial port front", Verdict.PASS)
    ]


def test_the_dex_port_is_checked_as_a_device_and_the_demos_virtual_one_said(
    tmp_path: Path, sim: Any, pty_port: str
) -> None:
    """Before: doctor said nothing of the `dex:` port; a missing audit cable passed."""
    path = _mixed_config(tmp_path, sim, pty_port)
    text = path.read_text()
    path.write_text(text + "dex: {port: /dev/no-dex-here}\n")
    report = Report()
    check_serial_ports(report, load_config(path))
    assert [(c.name, c.verdict) for c in report.checks] == [
        ("serial port front", Verdict.PASS), ("serial port dex", Verdict.FAIL)
    ]
    assert report.checks[1].detail == "/dev/no-dex-here is not present"

    path.write_text(text + "dex: {port: 'virtual:snacks'}\n")
    report = Report()
    check_serial_ports(report, load_config(path))
    assert [(c.name, c.verdict) for c in report.checks] == [
        ("serial port dex", Verdict.SKIP), ("serial port front", Verdict.PASS)
    ]
    assert "virtual:snacks: the virtual machine's DEX port" in report.checks[0].detail


async def test_a_socket_port_nobody_listens_on_fails_the_doctor(tmp_path: Path, sim: Any) -> None:
    """Before: a `socket://` port was skipped ("a URL, not a device") and doctor was green with
    the MDB link down."""
    port = f"socket://127.0.0.1:{free_port()}"
    config = load_config(_mixed_config(tmp_path, sim, port))
    report = Report()
    check_serial_ports(report, config)
    await check_port_urls(report, config, 2.0)
    [check] = report.checks
    assert (check.name, check.verdict) == ("serial port front", Verdict.FAIL)
    assert check.detail.startswith(f"{port}: ")
    assert "refused" in check.detail
    assert "ser2net" in check.fix

    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    listening = f"socket://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        config = load_config(_mixed_config(tmp_path, sim, listening))
        report = Report()
        await check_port_urls(report, config, 2.0)
    assert [(c.verdict, c.detail) for c in report.checks] == [
        (Verdict.PASS, f"{listening} accepts connections")
    ]


async def test_the_running_agent_judges_a_socket_port_by_its_own_link(
    tmp_path: Path, sim: Any
) -> None:
    """A bridge serving one client would refuse (or be taken by) a second connection: the
    status page's doctor reads the agent's link instead of connecting."""
    port = f"socket://127.0.0.1:{free_port()}"
    config = load_config(_mixed_config(tmp_path, sim, port))
    health = Health("test")
    health.report_link("mdb:front", "disconnected", "connection refused")
    links = {link.name: link for link in health.snapshot().links}
    report = Report()
    await check_port_urls(report, config, 2.0, links)
    [check] = report.checks
    assert check.verdict is Verdict.FAIL
    assert check.detail == f"{port}: the agent's link is disconnected (connection refused)"


def test_a_journal_directory_the_agent_will_make_passes(tmp_path: Path) -> None:
    from kiosk_agent.doctor import check_journal

    config_file = tmp_path / "agent.yaml"
    config_file.write_text(
        "service: {simulator: {}}\nterminals: [{device_id: SIM-0001}]\n"
        "journal: {path: state/new/journal.db}\n"
    )
    report = Report()
    check_journal(report, load_config(config_file))
    [check] = report.checks
    assert check.verdict is Verdict.PASS  # Journal.open makes it, as the demo's state dir
    assert check.detail == f"{tmp_path}/state/new/journal.db (its directory is made at start)"
    # a parent that is a file: it cannot be made
    (tmp_path / "blocked").write_text("")
    config_file.write_text(config_file.read_text().replace("state/new", "blocked/new"))
    report = Report()
    check_journal(report, load_config(config_file))
    assert report.checks[0].verdict is Verdict.FAIL
    assert "does not exist" in report.checks[0].detail


@pytest.mark.mqtt
@pytest.mark.parametrize(
    ("broker", "verdict"),
    [("", Verdict.PASS), ("max_qos 0\n", Verdict.FAIL), ("retain_available false\n", Verdict.FAIL),
     ("message_size_limit 4096\n", Verdict.WARN)],
)
async def test_doctor_checks_the_broker_takes_what_the_unit_sends(
    tmp_path: Path, broker: str, verdict: Verdict
) -> None:
    """Before: doctor only connected, so a broker that allows no QoS 1 or no retained messages
    (Mosquitto's max_qos 0, retain_available false) passed as "accepted the connection", while
    the unit (a QoS 1 retained last will, retained QoS 1 reports) was dropped at every connect
    and logged "Operation timed out" 10 s later, for ever; and one with a message size limit
    below a report's (2 KiB and more) passed while it dropped every report in silence."""
    proc, port = start_broker(tmp_path, broker)
    try:
        report = Report()
        # a refusal is a connection closed unanswered: waited for `within` (short here)
        within = 5.0 if verdict is Verdict.PASS else 1.0
        await check_mqtt(report, {"host": "127.0.0.1", "port": port}, within)
    finally:
        stop_broker(proc)
    [check] = report.checks
    assert check.verdict is verdict, check.detail
    if verdict is Verdict.FAIL:
        assert "QoS 1 and retained messages" in check.detail
        assert "max_qos, retain_available" in check.fix
    if verdict is Verdict.WARN:  # the broker drops a report-sized message without a word
        assert "did not hand back a 16 KiB message on kiosk-agent/doctor/doctor" in check.detail
        assert "message_size_limit" in check.fix


async def test_doctor_names_a_ca_file_that_is_not_a_certificate(tmp_path: Path) -> None:
    """Before: "the connection failed", sending the field tech after the network."""
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n")
    report = Report()
    await check_mqtt(report, {"host": "127.0.0.1", "port": 8883, "tls": True,
                              "ca_file": str(ca)}, 1.0)
    [check] = report.checks
    assert check.verdict is Verdict.FAIL
    assert check.detail.startswith(f"tls ca_file {ca}: holds no certificate TLS can load")
    assert "PEM" in check.fix


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_journal_on_a_full_or_read_only_disk_is_named_so_not_damaged(
    tmp_path: Path, fault: str
) -> None:
    """doctor called a whole journal on a full disk "damaged (disk I/O error)", with the fix
    "restart the agent: it moves the damaged journal aside"; on a read-only one, "not writable
    by this user: run doctor as the service user, or chown"."""
    from kiosk_agent.doctor import check_journal
    from kiosk_agent.sales.journal import Journal

    from .assembly.disk_helpers import fill, small_disk

    with small_disk(tmp_path / "disk") as disk:
        journal = Journal(disk / "journal.db")
        journal.open()
        journal.close()  # whole, its WAL gone: reading it must make files
        config_file = tmp_path / "agent.yaml"
        config_file.write_text(
            "service: {simulator: {}}\nterminals: [{device_id: SIM-0001}]\n"
            f"journal: {{path: {disk}/journal.db}}\n"
        )
        if fault == "full":
            fill(disk)
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        report = Report()
        check_journal(report, load_config(config_file))
        [check] = report.checks
        assert check.verdict is Verdict.FAIL
        assert f"the file system of {disk} is {fault}" in check.detail
        assert "damaged" not in check.detail + check.fix
        assert "free space" in check.fix


async def test_a_running_agents_doctor_checks_the_journal_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The status page's doctor: on the event loop, a year of sales' integrity check held every
    request and sale for 4.8 s. The check here waits for the loop to turn, which it can only do
    from another thread (on the loop it would wait out its bound and say so)."""
    import threading

    from kiosk_agent.doctor import check_journal_running
    from kiosk_agent.sales import journal_inspect
    from kiosk_agent.sales.journal import Journal

    config_file = tmp_path / "agent.yaml"
    config_file.write_text(
        "service: {simulator: {}}\nterminals: [{device_id: SIM-0001}]\n"
        "journal: {path: journal.db}\n"
    )
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    journal.close()
    loop_turned = threading.Event()
    seen: list[tuple[bool, bool]] = []

    def integrity(path: Path, *, quick: bool = False, but: object = ()) -> list[str]:
        seen.append((quick, loop_turned.wait(timeout=10)))
        return []

    monkeypatch.setattr(journal_inspect, "integrity", integrity)

    async def turn() -> None:
        await asyncio.sleep(0)
        loop_turned.set()

    report = Report()
    turning = asyncio.create_task(turn())
    await check_journal_running(report, load_config(config_file))
    await turning
    assert seen == [(True, True)]  # one quick check, made while the loop went on
    [check] = [c for c in report.checks if c.name == "journal"]  # beside it: the unit's
    assert check.verdict is Verdict.PASS
    assert "quick check ok" in check.detail


# -- a section's checks live with its owner ---------------------------------------------------


async def test_a_sections_checks_run_where_it_is_set_and_are_skipped_where_it_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kiosk_agent import doctor

    seen: list[tuple[dict[str, Any], float]] = []

    async def check_coins(report: Report, conf: dict[str, Any], within: float) -> None:
        seen.append((conf, within))
        report.add("coins", Verdict.PASS, "the coin box answers")

    # an owner registers its checks on import; here it has already
    monkeypatch.setattr(doctor, "CHECK_OWNERS", {"coins": "nowhere.importable", "notes": "x"})
    monkeypatch.setitem(doctor._SECTION_CHECKS, "coins", check_coins)
    report = Report()
    await doctor.check_sections(report, {"coins": {"port": 7}}, 2.5)  # type: ignore[arg-type]
    assert [(c.name, c.verdict, c.detail) for c in report.checks] == [
        ("coins", Verdict.PASS, "the coin box answers"),
        ("notes", Verdict.SKIP, "no notes: section"),  # absent: its owner is never imported
    ]
    assert seen == [({"port": 7}, 2.5)]


def test_the_fleets_checks_are_its_own_and_found_through_the_one_table_of_sections() -> None:
    from kiosk_agent import doctor
    from kiosk_agent.config.load import SECTION_OWNERS
    from kiosk_agent.fleet import doctor as fleet_doctor

    assert doctor.CHECK_OWNERS == {"upstream": "kiosk_agent.fleet.doctor"}
    assert SECTION_OWNERS["upstream"].checks == fleet_doctor.__name__
    assert doctor._SECTION_CHECKS["upstream"] is fleet_doctor.check_upstream
