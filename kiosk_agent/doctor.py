"""The doctor: the list of checks and their runner; each check lives beside what it checks.

One wording of every check and its fix, used by ``kiosk-agent doctor`` (``cli/fleet.py`` prints
each check as it ends) and by the running agent's status page (``admin/page.py`` shows them, and
an admin runs them again from the page). The agent runs them with its own service client:
``check_running``. Where each lives: the serial ports' beside the serial transport
(``platforms/serial_doctor.py``), the triggers' with the platforms (``platforms/doctor.py``),
the journal's beside the journal (``sales/journal_doctor.py``), a section's with its owner
(``upstream:``, ``fleet/doctor.py``); their words (verdict, report) are ``verdicts.py``.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kiosk_agent.config.load import (
    SECTION_OWNERS,
    Config,
    ConfigInvalid,
    format_path,
    load_config,
)
from kiosk_agent.platforms.doctor import check_triggers
from kiosk_agent.platforms.serial_doctor import check_port_urls, check_serial_ports
from kiosk_agent.sales.journal_doctor import check_journal, check_journal_running
from kiosk_agent.service.errors import describe
from kiosk_agent.verdicts import Check, Report, Verdict

__all__ = ["Check", "Report", "Verdict", "check_running", "check_this_unit", "describe"]

# The checks of a section that another package owns, registered by it (``register_check``),
# imported by name (config's SECTION_OWNERS, ``checks``) when the doctor runs: the doctor imports
# none of them (fleet's checks of ``upstream:`` live in fleet/doctor.py).
CHECK_OWNERS = {section: owner.checks for section, owner in SECTION_OWNERS.items() if owner.checks}
SectionCheck = Callable[["Report", dict[str, Any], float], Awaitable[None]]
_SECTION_CHECKS: dict[str, SectionCheck] = {}
# The unit runs Python at -OO (systemd/kiosk-agent.service: PYTHONOPTIMIZE=2), which reads
# bytecode files of that level only; tests/test_doctor.py keeps this in step with the unit.
UNIT_OPTIMIZATION = 2
# Whose modules stand for the install's bytecode: the agent's own, and its largest library and
# the standard library's package it runs on (an install compiles them all in one step, or none).
_BYTECODE_SAMPLE = ("kiosk_agent", "pydantic", "asyncio")


async def check_running(
    config: Config,
    service: Any,
    *,
    within: float = 10.0,
    links: dict[str, Any] | None = None,
    report: Report | None = None,
) -> Report:
    """The checks a running agent can make of itself (no test print: that is a button);
    ``links``: its health's serial links by name; ``report``: where they go as they are made
    (the status page shows a run's progress), else a new one."""
    report = report if report is not None else Report()
    report.add("config", Verdict.PASS, f"{config.path} loaded by the running agent")
    await check_this_unit(report, config, within, links=links, running=True)
    await check_terminals(report, config, service, within=within)
    await check_sections(report, config, within)
    report.finished_at = time.time()
    return report


async def check_this_unit(
    report: Report,
    config: Config,
    within: float,
    *,
    links: dict[str, Any] | None = None,
    running: bool = False,
) -> None:
    """The unit's own parts, in this order: its serial ports (devices, then ``socket://``
    ones), its triggers, its journal (``running``: the quick check, off the event loop)."""
    check_serial_ports(report, config)
    await check_port_urls(report, config, within, links)
    check_triggers(report, config)
    await check_listen_addresses(report, config)
    check_bytecode(report, running=running)
    journal = config.resolve(config["journal"]["path"])
    if running:
        await check_journal_running(report, journal)
    else:
        check_journal(report, journal)


async def check_listen_addresses(report: Report, config: Config) -> None:
    """Each local server's host is one of this machine's addresses now: one that is not (a LAN
    address before DHCP gives it) is a warning, the agent waits for it (web/hosts.py). Looked
    up in a thread: a name's lookup may wait on DNS, and the running agent's status page runs
    this on its event loop."""
    from kiosk_agent.web.hosts import address_problem, listen_hosts

    hosts = listen_hosts(config)
    if not hosts:
        return
    found = await asyncio.to_thread(lambda: [address_problem(host) for _path, host in hosts])
    problems = [f"{format_path(path)}: {problem}" for (path, _host), problem in zip(
        hosts, found, strict=True) if problem is not None]
    if problems:
        report.add(
            "listen addresses", Verdict.WARN,
            f"{len(problems)} of {len(hosts)} not on this machine now: served once they are",
            "wait for the network (DHCP), or change each host named below to one of this "
            "machine's addresses (`ip -brief address`)",
            problems,
        )
    else:
        report.add("listen addresses", Verdict.PASS,
                   ", ".join(f"{format_path(path)} {host or '(every address)'}"
                             for path, host in hosts) + ": on this machine")


def check_bytecode(report: Report, *, running: bool = False) -> None:
    """The agent's modules have bytecode at the unit's -OO level: pip writes another level's,
    and the unit may not write any, so without it every start compiles them from source.

    What is looked at is the modules of the sample this process has loaded: the command loads
    fewer (72 on config/demo.yaml) than the running agent (228, the status page's doctor run),
    so the count says whose it is (``running``), not one figure under two meanings."""
    sources = sorted(
        origin for name, module in list(sys.modules.items())
        if name.partition(".")[0] in _BYTECODE_SAMPLE
        and (origin := getattr(getattr(module, "__spec__", None), "origin", None))
        and origin.endswith(".py")
    )
    missing = [source for source in sources if not os.path.exists(
        importlib.util.cache_from_source(source, optimization=UNIT_OPTIMIZATION)
    )]
    whose = (f"{len(sources)} modules of the agent, pydantic and asyncio that "
             + ("the running agent loaded" if running else "this command loaded; the running "
                "agent loads more, its status page counts those"))
    if not missing:
        detail = f"compiled for the unit's -OO ({whose})"
        report.add("bytecode", Verdict.PASS, detail)
        return
    import sysconfig  # only to say where: not imported by a healthy install's doctor

    places = [sysconfig.get_path("purelib"), sysconfig.get_path("stdlib")]
    report.add(
        "bytecode",
        Verdict.WARN,
        f"{len(missing)} of the {whose} not compiled for the unit's -OO: each start compiles "
        "them from source (seconds on a small computer)",
        f"sudo {sys.executable} -m compileall -q -o {UNIT_OPTIMIZATION} " + " ".join(places),
        notes=missing[:3],
    )


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
