"""`kiosk-agent doctor` as a field tech runs it: a subprocess against the simulator."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.fleet.doctor import check_mqtt
from kiosk_agent.verdicts import Report, Verdict

from .mqtt_broker import start_broker, stop_broker
from .platforms.doctor_rig import mixed_config, pty_port

__all__ = ["pty_port"]  # the fixture, imported for the test below


async def test_doctor_checks_a_config_with_a_kiosk_api_and_an_mdb_trigger(
    tmp_path: Path, sim: Any, pty_port: str
) -> None:
    path = mixed_config(tmp_path, sim, pty_port)
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


# -- the bytecode the unit's -OO reads ---------------------------------------------------------


def test_the_bytecode_check_reads_the_level_the_unit_runs_at() -> None:
    from kiosk_agent import doctor

    unit = (Path(__file__).parents[1] / "systemd" / "kiosk-agent.service").read_text()
    assert f"Environment=PYTHONOPTIMIZE={doctor.UNIT_OPTIMIZATION}\n" in unit


def test_modules_without_bytecode_for_the_units_level_are_named_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip writes bytecode without -OO, and the unit may not write its own: an install without
    the compile step starts every time from source, seconds slower, and says nothing else."""
    import importlib.util
    import json.decoder  # noqa: F401 - the sample's modules are imported
    import py_compile

    from kiosk_agent import doctor

    monkeypatch.setattr(doctor, "_BYTECODE_SAMPLE", ("json",))
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path))  # a cache with nothing in it
    report = Report()
    doctor.check_bytecode(report)
    [check] = report.checks
    sources = sorted(str(m.__file__) for n, m in sys.modules.items()
                     if n.partition(".")[0] == "json" and str(m.__file__).endswith(".py"))
    assert check.verdict is Verdict.WARN, check.detail
    assert check.detail.startswith(
        f"{len(sources)} of the {len(sources)} modules of the agent, pydantic and asyncio that "
        "this command loaded; the running agent loads more, its status page counts those not "
        "compiled")
    assert check.fix.startswith(f"sudo {sys.executable} -m compileall -q -o 2 ")
    assert check.notes == sources[:3]
    for source in sources:
        py_compile.compile(source, importlib.util.cache_from_source(source, optimization=2),
                           optimize=2, doraise=True)
    report = Report()
    doctor.check_bytecode(report)
    doctor.check_bytecode(report, running=True)  # the status page's run, in the agent
    # one count, named by whose modules it is: the command's or the running agent's (the
    # command said 72 modules, the status page 228, each "modules" alone: 2026-11-30)
    whose = f"{len(sources)} modules of the agent, pydantic and asyncio that"
    assert [(c.verdict, c.detail) for c in report.checks] == [
        (Verdict.PASS, f"compiled for the unit's -OO ({whose} this command loaded; the running "
                       "agent loads more, its status page counts those)"),
        (Verdict.PASS, f"compiled for the unit's -OO ({whose} the running agent loaded)"),
    ]
