"""platforms.serial_doctor: the doctor's checks of serial ports, devices and ``socket://`` ones."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from kiosk_agent.config.load import load_config
from kiosk_agent.health.model import Health
from kiosk_agent.platforms.serial_doctor import check_port_urls, check_serial_ports
from kiosk_agent.verdicts import Report, Verdict

from ..helpers import free_port
from .doctor_rig import mixed_config, pty_port

__all__ = ["pty_port"]  # the fixture, imported for the tests below


def test_only_serial_ports_are_checked_as_devices(tmp_path: Path, sim: Any, pty_port: str) -> None:
    path = mixed_config(tmp_path, sim, pty_port)
    report = Report()
    check_serial_ports(report, load_config(path))
    assert [(c.name, c.verdict) for c in report.checks] == [
        ("serial port front", Verdict.PASS)
    ]


def test_the_dex_port_is_checked_as_a_device_and_the_demos_virtual_one_said(
    tmp_path: Path, sim: Any, pty_port: str
) -> None:
    """Before: doctor said nothing of the `dex:` port; a missing audit cable passed."""
    path = mixed_config(tmp_path, sim, pty_port)
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
    config = load_config(mixed_config(tmp_path, sim, port))
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
        config = load_config(mixed_config(tmp_path, sim, listening))
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
    config = load_config(mixed_config(tmp_path, sim, port))
    health = Health("test")
    health.report_link("mdb:front", "disconnected", "connection refused")
    links = {link.name: link for link in health.snapshot().links}
    report = Report()
    await check_port_urls(report, config, 2.0, links)
    [check] = report.checks
    assert check.verdict is Verdict.FAIL
    assert check.detail == f"{port}: the agent's link is disconnected (connection refused)"


def test_a_glob_port_is_checked_as_the_transport_opens_it(tmp_path: Path, sim: Any) -> None:
    """Before: a port given as a glob (``/dev/ttyUSB*``, which the transport opens as its
    first match) failed as "not present" whatever was plugged in."""
    (tmp_path / "ttyACM1").touch()
    (tmp_path / "ttyACM0").touch()
    pattern = str(tmp_path / "ttyACM*")
    report = Report()
    check_serial_ports(report, load_config(mixed_config(tmp_path, sim, pattern)))
    assert [(c.verdict, c.detail) for c in report.checks] == [
        (Verdict.PASS, f"{pattern} ({tmp_path}/ttyACM0) present and accessible")
    ]
    nothing = str(tmp_path / "ttyUSB*")
    report = Report()
    check_serial_ports(report, load_config(mixed_config(tmp_path, sim, nothing)))
    assert [(c.verdict, c.detail) for c in report.checks] == [
        (Verdict.FAIL, f"{nothing} is not present")
    ]


async def test_a_program_that_had_the_port_open_before_the_agent_is_a_warning(
    tmp_path: Path, sim: Any, pty_port: str
) -> None:
    """The link's hold (TIOCEXCL) refuses opens after it, not a program that had the port
    open before (a tech's screen left attached across a restart of the agent): doctor names
    it, apart from the agent that holds the port (its flock), which is no warning."""
    import sys

    path = mixed_config(tmp_path, sim, pty_port)
    holds = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_NOCTTY)\n"
             "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()")
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", holds, pty_port, "an-agent",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    port = os.open(pty_port, os.O_RDWR | os.O_NOCTTY)  # the program's, given as its stdin
    try:
        program = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys; sys.stdin.buffer.read(1)", "a-terminal-program",
            stdin=port)
    finally:
        os.close(port)
    try:
        assert agent.stdout is not None
        assert await asyncio.wait_for(agent.stdout.readline(), 30) == b"held\n"
        report = Report()
        check_serial_ports(report, load_config(path))
        [check] = report.checks
        assert check.verdict is Verdict.WARN
        assert f"but also open by pid {program.pid}: " in check.detail
        assert "a-terminal-program" in check.detail
        assert "an-agent" not in check.detail
        assert check.fix.startswith("close that program")

        program.kill()
        await program.wait()
        report = Report()
        check_serial_ports(report, load_config(path))
        assert [(c.verdict, c.detail) for c in report.checks] == [
            (Verdict.PASS, f"{pty_port} present and accessible")]
    finally:
        for child in (agent, program):
            if child.returncode is None:
                child.kill()
                await child.wait()
