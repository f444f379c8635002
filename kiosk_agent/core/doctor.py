"""The doctor's checks: one verdict per check, with the fix for each failure.

One wording of every check and its fix, used by ``kiosk-agent doctor`` (``cli/fleet.py`` prints
each check as it ends) and by the running agent's status page (``admin/page.py`` shows them, and
an admin runs them again from the page). The agent runs them with its own service client:
``check_running``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kiosk_agent.core.config import Config, ConfigInvalid, load_config


class Verdict(enum.StrEnum):
    PASS = "PASS"  # noqa: S105 - a verdict, not a password
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(slots=True)
class Check:
    name: str
    verdict: Verdict
    detail: str = ""
    fix: str = ""
    notes: list[str] = field(default_factory=list)  # more lines, e.g. each config mistake

    def lines(self) -> list[str]:
        text = f"[{self.verdict}] {self.name}" + (f": {self.detail}" if self.detail else "")
        fix = [f"       fix: {self.fix}"] if self.fix else []
        return [text, *fix, *(f"       {note}" for note in self.notes)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict.value,
            "detail": self.detail,
            "fix": self.fix,
            "notes": list(self.notes),
        }


@dataclass(slots=True)
class Report:
    """The checks in the order they ran; ``on_check`` sees each one as it is added."""

    checks: list[Check] = field(default_factory=list)
    on_check: Callable[[Check], None] | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    def add(
        self,
        name: str,
        verdict: Verdict,
        detail: str = "",
        fix: str = "",
        notes: list[str] | None = None,
    ) -> Check:
        check = Check(name, verdict, detail, fix, notes or [])
        self.checks.append(check)
        if self.on_check is not None:
            self.on_check(check)
        return check

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.verdict is Verdict.FAIL]

    def as_dict(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "failed": len(self.failed),
            "checks": [c.as_dict() for c in self.checks],
        }


async def check_running(config: Config, service: Any, *, within: float = 10.0) -> Report:
    """The checks a running agent can make of itself (no test print: that is a button)."""
    report = Report()
    report.add("config", Verdict.PASS, f"{config.path} loaded by the running agent")
    check_serial_ports(report, config)
    check_journal(report, config)
    await check_terminals(report, config, service, within=within)
    await check_upstream(report, config, within)
    report.finished_at = time.time()
    return report


def check_config(report: Report, path: Path) -> Config | None:
    if not path.exists():
        report.add(
            "config",
            Verdict.FAIL,
            f"{path} does not exist",
            "pass the right --config, e.g. /etc/kiosk-agent/config.yaml",
        )
        return None
    try:
        config = load_config(path)
    except ConfigInvalid as err:
        report.add(
            "config",
            Verdict.FAIL,
            f"{len(err.errors)} mistake(s) in {path}",
            "correct each line below, then run `kiosk-agent check-config` again",
            notes=[str(error) for error in err.errors],
        )
        return None
    report.add("config", Verdict.PASS, f"{path} is valid")
    return config


def check_serial_ports(report: Report, config: Config) -> None:
    # A serial platform's port is a device path (str); a kiosk_api port is an HTTP port (int).
    ports = [
        (t.get("name") or t["platform"], t["port"])
        for t in config.triggers
        if isinstance(t.get("port"), str) and t["port"]
    ]
    if not ports:
        report.add("serial ports", Verdict.SKIP, "no trigger uses a serial port")
        return
    for name, port in ports:
        check = f"serial port {name}"
        if "://" in port:
            report.add(check, Verdict.SKIP, f"{port} is a URL, not a device")
            continue
        path = Path(port)
        if not path.exists():
            present = serial_ports_present()
            report.add(
                check,
                Verdict.FAIL,
                f"{port} is not present",
                "plug the adapter in; list /dev/serial/by-id/ and use that stable name",
                [f"serial ports here: {', '.join(present)}" if present
                 else "serial ports here: none (no adapter is plugged in)"],
            )
        elif not os.access(path, os.R_OK | os.W_OK):
            report.add(
                check,
                Verdict.FAIL,
                f"{port} exists but this user cannot open it",
                "add the service user to the dialout group (usermod -aG dialout USER)",
            )
        else:
            report.add(check, Verdict.PASS, f"{port} present and accessible")


# Where serial adapters appear on Linux: the stable names first, then the kernel's.
SERIAL_PORT_PATTERNS = ("/dev/serial/by-id/*", "/dev/ttyUSB*", "/dev/ttyACM*", "/dev/ttyAMA*",
                        "/dev/ttyS[0-3]")


def serial_ports_present(patterns: tuple[str, ...] = SERIAL_PORT_PATTERNS) -> list[str]:
    """The serial ports that exist on this machine (at most 12 named, stable names first)."""
    import glob

    found = [p for pattern in patterns for p in sorted(glob.glob(pattern))]
    return found[:12] + ([f"... {len(found) - 12} more"] if len(found) > 12 else [])


def check_journal(report: Report, config: Config) -> None:
    from kiosk_agent.core.journal_guard import disk_fault

    path = config.resolve(config["journal"]["path"])
    directory = path.parent
    if not directory.exists() and _can_create(directory):
        # the agent makes it at start (as the demo's ~/.local/state/kiosk-agent)
        report.add("journal", Verdict.PASS, f"{path} (its directory is made at start)")
    elif not directory.exists():
        report.add(
            "journal",
            Verdict.FAIL,
            f"directory {directory} does not exist",
            f"create it: install -d -o kiosk-agent -m 0700 {directory}",
        )
    elif (fault := disk_fault(directory)) is not None:
        # before the rest: its effects (not writable, "disk I/O error") are no fault of the file
        report.add(
            "journal",
            Verdict.FAIL,
            f"{path}: {fault}; no sale can be journaled, so the unit takes no card",
            "free space on it (or make it writable again); a running agent comes back by "
            "itself, a starting one waits for it",
        )
    elif not os.access(directory, os.W_OK):
        report.add(
            "journal",
            Verdict.FAIL,
            f"{directory} is not writable by this user",
            "run doctor as the service user, or chown the state directory",
        )
    else:
        check_journal_file(report, path)


def check_journal_file(report: Report, path: Path) -> None:
    """The journal's integrity (``PRAGMA integrity_check``, its WAL read with it), and whether
    one that was in use here is missing or empty (the ``.in-use`` marker beside it)."""
    from kiosk_agent.core.journal_guard import inspect_journal
    from kiosk_agent.sales.journal import integrity, marker_path, side_files

    wal = side_files(path)[0]
    wal_text = f"WAL {wal.stat().st_size} bytes" if wal.exists() else "no WAL"
    notice = inspect_journal(path, move_damaged=False)
    if notice is not None and notice.kind == "lost":
        report.add("journal", Verdict.FAIL, notice.message,
                   "restore it from a backup, or delete the marker if it was removed on "
                   "purpose; the agent checks reporting for the charges it held on start")
        return
    if not path.exists():
        report.add("journal", Verdict.PASS, f"{path} not created yet (the first start does)")
        return
    problems = integrity(path)
    if problems:
        report.add(
            "journal", Verdict.FAIL, f"{path} is damaged ({wal_text}): {'; '.join(problems[:3])}",
            "restart the agent: it moves the damaged journal aside (kept for `sqlite3 FILE "
            ".recover`), begins a new one and gives back any charge it can no longer account "
            "for",
        )
        return
    marker = "" if marker_path(path).exists() else "; no in-use marker yet"
    report.add("journal", Verdict.PASS, f"{path}: integrity ok ({wal_text}{marker})")


def _can_create(directory: Path) -> bool:
    """Whether this user may make ``directory``: its nearest existing parent is writable."""
    parent = directory
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)


async def _timed(call: Awaitable[Any], within: float) -> Any:
    async with asyncio.timeout(within):
        return await call


async def check_terminals(
    report: Report,
    config: Config,
    service: Any,
    *,
    within: float,
    test_print: bool = False,
    trans_id: str | None = None,
) -> None:
    """The service answers, each configured terminal is listed and online, printers print."""
    from kiosk_agent.service.errors import AuthenticationError, ServiceError

    try:
        listed = await _timed(service.terminal.list(), within)
    except AuthenticationError as err:
        report.add(
            "service",
            Verdict.FAIL,
            f"the API key was refused: {err}",
            "check api_key/refresh_token in secrets.yaml; `kiosk-agent keys refresh`",
        )
        return
    except (ServiceError, TimeoutError, OSError) as err:
        report.add(
            "service",
            Verdict.FAIL,
            f"not reachable: {describe(err)}",
            "check the network, DNS and base_url; try `curl -I <base_url>`",
        )
        return
    by_id = {t.device_id: t for t in listed}
    report.add("service", Verdict.PASS, f"reachable, {len(listed)} terminal(s) listed")
    for configured in config["terminals"]:
        device_id = configured["device_id"]
        terminal = by_id.get(device_id)
        if terminal is None:
            known = ", ".join(sorted(by_id)) or "none"
            report.add(
                f"terminal {device_id}",
                Verdict.FAIL,
                "not listed by the service",
                f"fix the device_id in the config (the service lists: {known})",
            )
            continue
        report.add(
            f"terminal {device_id}",
            Verdict.PASS,
            f"listed ({terminal.vendor or '?'} {terminal.model or '?'})",
        )
        await check_ping(report, service, device_id, within)
        await check_test_print(
            report,
            config,
            service,
            terminal,
            within=within,
            test_print=test_print,
            trans_id=trans_id,
        )


async def check_ping(report: Report, service: Any, device_id: str, within: float) -> None:
    from kiosk_agent.service.errors import ServiceError

    name = f"ping {device_id}"
    try:
        answer = await _timed(service.terminal.ping(device_id), within)
    except (ServiceError, TimeoutError, OSError) as err:
        report.add(name, Verdict.FAIL, describe(err), "check the reader's power and network")
        return
    if not answer.online:
        report.add(
            name,
            Verdict.FAIL,
            "the terminal is offline",
            "power-cycle the reader and check its network cable or Wi-Fi",
        )
        return
    latency = f"{answer.latency_ms:.0f} ms" if answer.latency_ms is not None else "answered"
    report.add(name, Verdict.PASS, latency)


async def check_test_print(
    report: Report,
    config: Config,
    service: Any,
    terminal: Any,
    *,
    within: float,
    test_print: bool,
    trans_id: str | None,
) -> None:
    from kiosk_agent.service.errors import ServiceError

    name = f"test print {terminal.device_id}"
    if not terminal.capabilities.receipt_printing:
        report.add(name, Verdict.SKIP, "this terminal has no printer")
        return
    if not test_print:
        report.add(name, Verdict.SKIP, "can print; pass --test-print to print a receipt copy")
        return
    trans_id = trans_id or last_trans_id(config)
    if trans_id is None:
        report.add(
            name,
            Verdict.WARN,
            "no sale in the journal to print",
            "pass --trans-id of any transaction of this merchant",
        )
        return
    try:
        await _timed(service.terminal.print_receipt(terminal.device_id, trans_id), within)
    except (ServiceError, TimeoutError, OSError) as err:
        report.add(name, Verdict.FAIL, describe(err), "check the paper roll and the printer door")
        return
    report.add(name, Verdict.PASS, f"printed transaction {trans_id}")


def last_trans_id(config: Config) -> str | None:
    from kiosk_agent.sales.journal import Journal

    path = config.resolve(config["journal"]["path"])
    if not path.exists():
        return None
    journal = Journal(path)
    journal.open_to_read()
    try:
        return journal.last_trans_id()
    finally:
        journal.close()


async def check_upstream(report: Report, config: Config, within: float) -> None:
    """Can the heartbeats leave the unit? (Connects only; sends no report.)"""
    upstream = config.get("upstream")
    if not upstream:
        report.add("upstream", Verdict.SKIP, "no upstream: section")
        return
    if "http" in upstream:
        url = upstream["http"]["url"]
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            async with asyncio.timeout(within):
                _, writer = await asyncio.open_connection(parts.hostname, port)
            writer.close()
            await writer.wait_closed()
        except (OSError, TimeoutError) as err:
            report.add(
                "upstream http",
                Verdict.FAIL,
                f"{parts.hostname}:{port}: {describe(err)}",
                "check the URL, DNS and that the firewall lets the unit out",
            )
        else:
            report.add(
                "upstream http", Verdict.PASS, f"{parts.hostname}:{port} accepts connections"
            )
    if "mqtt" in upstream:
        from kiosk_agent.fleet.component import host_device_id

        device_id = upstream.get("device_id") or host_device_id()
        await check_mqtt(report, upstream["mqtt"], within, device_id)


# A report of a unit with 16 terminals is under 10 KiB: the echo test sends this much
ECHO_BYTES = 16 * 1024


async def check_mqtt(
    report: Report, conf: dict[str, Any], within: float, device_id: str = "doctor"
) -> None:
    import aiomqtt

    from kiosk_agent.fleet.mqtt import CaFileError, mqtt_client, passing_client_id

    where = f"{conf['host']}:{conf['port']}"
    try:
        # Its own client id: reusing the agent's would disconnect the running agent.
        client = mqtt_client(conf, passing_client_id("doctor"), timeout=within)
        async with asyncio.timeout(within), client:
            pass
    except CaFileError as err:
        report.add("upstream mqtt", Verdict.FAIL, str(err),
                   "point ca_file at the CA's certificate in PEM (openssl x509 -in FILE -text)")
        return
    except (aiomqtt.MqttError, OSError, TimeoutError) as err:
        fix = "check host, port, user and password; with tls: check the CA and the clock"
        report.add("upstream mqtt", Verdict.FAIL, f"{where}: {describe(err)}", fix)
        return
    topic = f"{conf.get('topic_prefix', 'kiosk-agent')}/{device_id}/doctor"
    try:
        echoed = await _send_as_a_unit(conf, topic, min(within, 3.0))
    except (aiomqtt.MqttError, OSError, TimeoutError) as err:
        report.add(
            "upstream mqtt", Verdict.FAIL,
            f"{where} accepted a plain connection but not QoS 1 and retained messages, which a "
            f"unit sends (its last will, its reports): {describe(err)}",
            "let the broker take QoS 1 and retained messages (Mosquitto: max_qos, "
            "retain_available)",
        )
        return
    if not echoed:  # MQTT 3.1.1 drops a refused publish without a word: only an echo tells
        report.add(
            "upstream mqtt", Verdict.WARN,
            f"{where} accepted the connection, QoS 1 and retained messages, but did not hand "
            f"back a {ECHO_BYTES // 1024} KiB message on {topic}",
            "a message size limit below a report's (Mosquitto: message_size_limit) or an ACL "
            "that refuses this user's writes there drops reports in silence; fine if this "
            "user may only write there, not read",
        )
        return
    report.add("upstream mqtt", Verdict.PASS, f"{where} accepted the connection, QoS 1, "
               f"retained messages and a report-sized message ({topic})")


async def _send_as_a_unit(conf: dict[str, Any], topic: str, within: float) -> bool:
    """Connect with a QoS 1 retained last will and publish a QoS 1 retained message, as a unit
    does (a broker that takes neither closes the connection), both empty: an empty retained
    message leaves nothing on the broker. Then whether a report-sized message sent to
    ``topic`` comes back (not retained)."""
    import aiomqtt

    from kiosk_agent.fleet.mqtt import mqtt_client, passing_client_id

    will = aiomqtt.Will(topic, b"", qos=1, retain=True)
    client = mqtt_client(conf, passing_client_id("doctor"), timeout=within, will=will)
    async with asyncio.timeout(within), client:
        await client.publish(topic, b"", qos=1, retain=True)
    # a connection of its own: a broker may close one that sends a message too large
    with contextlib.suppress(TimeoutError, aiomqtt.MqttError):
        async with asyncio.timeout(within), client:
            await client.subscribe(topic, qos=1)
            await client.publish(topic, b"x" * ECHO_BYTES, qos=0)  # no PUBACK to wait for
            async for message in client.messages:
                if message.payload:
                    return True
    return False


def describe(err: BaseException) -> str:
    """An error in words: a failed connection as where and why, no library jargon."""
    if isinstance(err, TimeoutError):
        return "timed out"
    if isinstance(err, OSError) or type(err).__module__.startswith("aiohttp"):
        from kiosk_agent.service.errors import network_words

        return network_words(err)
    return str(err) or type(err).__name__
