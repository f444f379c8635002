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
import importlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kiosk_agent.config.load import SECTION_OWNERS, Config, ConfigInvalid, load_config
from kiosk_agent.service.errors import describe as describe  # its home: `health` needs no doctor

# The checks of a section that another package owns, registered by it (``register_check``),
# imported by name (config's SECTION_OWNERS, ``checks``) when the doctor runs: the doctor imports
# none of them (fleet's checks of ``upstream:`` live in fleet/doctor.py).
CHECK_OWNERS = {section: owner.checks for section, owner in SECTION_OWNERS.items() if owner.checks}
SectionCheck = Callable[["Report", dict[str, Any], float], Awaitable[None]]
_SECTION_CHECKS: dict[str, SectionCheck] = {}


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


async def check_running(
    config: Config, service: Any, *, within: float = 10.0, links: dict[str, Any] | None = None
) -> Report:
    """The checks a running agent can make of itself (no test print: that is a button);
    ``links``: its health's serial links by name."""
    report = Report()
    report.add("config", Verdict.PASS, f"{config.path} loaded by the running agent")
    check_serial_ports(report, config)
    await check_port_urls(report, config, within, links)
    check_triggers(report, config)
    await check_journal_running(report, config)
    await check_terminals(report, config, service, within=within)
    await check_sections(report, config, within)
    report.finished_at = time.time()
    return report


def register_check(section: str, check: SectionCheck) -> None:
    """``check(report, the section's configuration, within)`` runs where ``section:`` is set."""
    _SECTION_CHECKS[section] = check


async def check_sections(report: Report, config: Config, within: float) -> None:
    """Each registered section's check, or SKIP where the configuration has no such section."""
    for section, owner in CHECK_OWNERS.items():
        conf = config.get(section)
        if not conf:
            report.add(section, Verdict.SKIP, f"no {section}: section")
            continue
        if section not in _SECTION_CHECKS:
            importlib.import_module(owner)
        await _SECTION_CHECKS[section](report, conf, within)


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


def _serial_ports(config: Config) -> list[tuple[str, str, str]]:
    """(name, port, link name in health) of each trigger on a serial port: a serial platform's
    port is a device path or a URL (str); a kiosk_api port is an HTTP port (int)."""
    ports = [
        (t.get("name") or t["platform"], t["port"], f"{t['platform']}:{t.get('name') or ''}")
        for t in config.triggers
        if isinstance(t.get("port"), str) and t["port"]
    ]
    dex = _dex_port(config)
    if dex and not dex.startswith(_VIRTUAL_DEX):
        ports.append(("dex", dex, "dex"))  # the machine's audit port (docs/audit-link.md)
    return ports


# The virtual machine's own DEX pty (audit.component.VIRTUAL_PORT): made inside the agent.
_VIRTUAL_DEX = "virtual:"


def _dex_port(config: Config) -> str:
    section = config.get("dex")
    port = section.get("port") if isinstance(section, dict) else None
    return port if isinstance(port, str) else ""


def check_serial_ports(report: Report, config: Config) -> None:
    """Each serial device is present and this user may open it; a port given as a URL
    (``socket://host:port``) is :func:`check_port_urls`'."""
    ports = _serial_ports(config)
    dex = _dex_port(config)
    if dex.startswith(_VIRTUAL_DEX):
        report.add(
            "serial port dex", Verdict.SKIP,
            f"{dex}: the virtual machine's DEX port, made by the agent itself "
            "(kiosk-agent audit shows its reads)",
        )  # fmt: skip
    if not ports:
        report.add("serial ports", Verdict.SKIP, "no trigger uses a serial port")
        return
    for name, port, _ in ports:
        check = f"serial port {name}"
        if "://" in port:
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


def trigger_problems(config: Config) -> list[tuple[int, str, str]]:
    """(index, name, problem) for each thing that keeps a valid trigger from starting here,
    as its platform says (``config.registry.environment_problems``)."""
    from kiosk_agent.config.registry import environment_problems

    return [
        (index, f"{t['platform']}:{t.get('name') or t['platform']}", problem)
        for index, t in enumerate(config.triggers)
        for problem in environment_problems(t)
    ]


def check_triggers(report: Report, config: Config) -> None:
    """Each trigger whose platform can tell: it can start on this machine as it is."""
    problems = trigger_problems(config)
    names = {name for _, name, _ in problems}
    for name in sorted(names):
        notes = [problem for _, n, problem in problems if n == name]
        report.add(
            f"trigger {name}", Verdict.FAIL, "cannot start on this machine",
            "correct each line below; the agent starts it once restarted", notes,
        )  # fmt: skip


# pyserial's URLs that name a TCP host and port (ser2net, an ESP-Link, the virtual machine's)
_TCP_SCHEMES = ("socket", "rfc2217")


async def check_port_urls(
    report: Report, config: Config, within: float, links: dict[str, Any] | None = None
) -> None:
    """A serial port given as ``socket://host:port`` answers: a TCP connection is made (a
    link down is a failure, not a skip). In the running agent (``links``: its health's links by
    name) the agent's own link says, since a second connection may be refused by, or take the
    port from, a bridge that serves one client (ser2net)."""
    for name, port, link_name in _serial_ports(config):
        if "://" not in port:
            continue
        check = f"serial port {name}"
        parts = urlsplit(port)
        if parts.scheme not in _TCP_SCHEMES or not parts.hostname or parts.port is None:
            report.add(check, Verdict.SKIP, f"{port}: no host and port to check")
            continue
        link = (links or {}).get(link_name)
        if link is not None:
            _link_verdict(report, check, port, link)
            continue
        try:
            async with asyncio.timeout(within):
                _, writer = await asyncio.open_connection(parts.hostname, parts.port)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        except (OSError, TimeoutError) as err:
            report.add(
                check, Verdict.FAIL, f"{port}: {describe(err)}",
                "start the serial bridge there (ser2net, or `kiosk-agent virtual --listen`) "
                "and check the host, the port and the network to it",
            )  # fmt: skip
        else:
            report.add(check, Verdict.PASS, f"{port} accepts connections")


def _link_verdict(report: Report, check: str, port: str, link: Any) -> None:
    if link.healthy:
        report.add(check, Verdict.PASS, f"{port}: the agent's link is {link.state}")
        return
    detail = f" ({link.detail})" if link.detail else ""
    report.add(
        check, Verdict.FAIL, f"{port}: the agent's link is {link.state}{detail}",
        "check the serial bridge there and the network to it; the agent reconnects by itself",
    )  # fmt: skip


# Where serial adapters appear on Linux: the stable names first, then the kernel's.
SERIAL_PORT_PATTERNS = ("/dev/serial/by-id/*", "/dev/ttyUSB*", "/dev/ttyACM*", "/dev/ttyAMA*",
                        "/dev/ttyS[0-3]")


def serial_ports_present(patterns: tuple[str, ...] = SERIAL_PORT_PATTERNS) -> list[str]:
    """The serial ports that exist on this machine (at most 12 named, stable names first)."""
    import glob

    found = [p for pattern in patterns for p in sorted(glob.glob(pattern))]
    return found[:12] + ([f"... {len(found) - 12} more"] if len(found) > 12 else [])


async def check_journal_running(report: Report, config: Config) -> None:
    """The journal's checks for a running agent's doctor (the status page): SQLite's
    ``quick_check`` in a worker thread, on a connection of its own. On the event loop, a year of
    sales (281 MiB) held every request and sale for 4.8 s; the full ``integrity_check`` is the
    command line's (``kiosk-agent doctor``)."""
    await asyncio.to_thread(check_journal, report, config, quick=True)


def check_journal(report: Report, config: Config, *, quick: bool = False) -> None:
    from kiosk_agent.sales.journal_guard import disk_fault

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
        check_journal_file(report, path, quick=quick)
        check_unit(report, path)


def check_unit(report: Report, path: Path) -> None:
    """The unit's id, and whether its journal was made on this machine (sales/unit.py): a
    cloned SD card's journal takes no customer until a person adopts it. Reads only."""
    from kiosk_agent.sales import unit
    from kiosk_agent.sales.journal import Journal, JournalError
    from kiosk_agent.sales.machine import this_machine

    here = this_machine().at(path)
    history: list[unit.UnitRow] = []
    if path.exists() and path.stat().st_size:
        journal = Journal(path)
        try:
            journal.open_to_read()
            history = unit.rows(journal.db)
        except JournalError:
            return  # the journal check said what is wrong with it
        finally:
            journal.close()
    if not history:
        report.add("unit", Verdict.PASS, f"no unit id yet: made at the agent's next start "
                   f"({here.describe()})")
        return
    current = history[-1]
    mismatch = current.machine.differs(here)
    if mismatch:
        report.add(
            "unit", Verdict.FAIL,
            f"unit {current.unit_id}: its journal was made on another machine ({mismatch}); "
            "it takes no customer and moves no money",
            "a copy of another unit's SD card: `kiosk-agent unit adopt -c CONFIG` gives this "
            "one a new id (the old id's charges stay that unit's); or begin the journal anew",
        )  # fmt: skip
        return
    report.add("unit", Verdict.PASS,
               f"unit {current.unit_id}, its journal made on this machine ({here.describe()})")


def check_journal_file(report: Report, path: Path, *, quick: bool = False) -> None:
    """The journal's integrity (``PRAGMA integrity_check``, its WAL read with it; with
    ``quick``, the ``quick_check`` alone), and whether one that was in use here is missing or
    empty (the ``.in-use`` marker beside it)."""
    from kiosk_agent.sales.journal import integrity, marker_path, side_files
    from kiosk_agent.sales.journal_inspect import inspect_journal

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
    # inspect_journal ran the quick check: its notice says what it found
    problems = integrity(path) if not quick else [] if notice is None else [notice.message]
    if problems:
        found = f"{path} is damaged ({wal_text}): {'; '.join(problems[:3])}"
        if quick:
            found = problems[0]
        report.add(
            "journal", Verdict.FAIL, found,
            "restart the agent: it moves the damaged journal aside (kept for `sqlite3 FILE "
            ".recover`), begins a new one and gives back any charge it can no longer account "
            "for",
        )
        return
    marker = "" if marker_path(path).exists() else "; no in-use marker yet"
    how = "quick check" if quick else "integrity"
    report.add("journal", Verdict.PASS, f"{path}: {how} ok ({wal_text}{marker})")


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


