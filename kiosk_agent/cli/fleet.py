"""`kiosk-agent doctor | health`: what a field tech and a remote operator run first.

``doctor`` checks a unit in place (configuration, serial ports, journal, service, terminals,
ping, test print) and prints one verdict per check with the fix for each failure; it exits
non-zero when any check fails. ``health`` asks a running agent's admin API for its snapshot.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import json
import os
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from kiosk_agent.cli.contract import (
    CONFIG_ENV,
    EXIT_AUTH,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    STATUS,
    CliError,
    guarded,
    load,
    named_config,
    optional_config_path,
    options,
    plural,
    timeout_of,
    wants_json,
)
from kiosk_agent.core.config import Config, ConfigInvalid, load_config
from kiosk_agent.money import format_cents

TOKEN_ENV = "KIOSK_AGENT_TOKEN"  # noqa: S105 - the variable's name, not a secret


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # -c/--config, --json and --timeout: the command line's contract (kiosk_agent.cli.contract)
    doctor = subparsers.add_parser(
        "doctor", help="check this unit: config, serial ports, service, terminals, printing",
        parents=options(timeout=True),
    )
    doctor.add_argument(
        "--test-print",
        action="store_true",
        help="print a receipt copy on terminals that can (uses the last sale's transaction)",
    )
    doctor.add_argument("--trans-id", help="the transaction to print with --test-print")
    doctor.set_defaults(handler=guarded(doctor_command))

    health = subparsers.add_parser(
        "health", help="the health of a running agent (admin API)",
        description="Ask a running agent's admin API for its health: its address and token from "
        "the configuration (-c/--config or $KIOSK_CONFIG), or --url and --token.",
        parents=options(timeout=True),
    )
    health.add_argument("--url", help="admin API address, e.g. http://127.0.0.1:8124")
    health.add_argument("--token", help=f"bearer token (default: ${TOKEN_ENV})")
    health.set_defaults(handler=guarded(health_command))


# -- doctor ------------------------------------------------------------------------------------


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

    def lines(self) -> list[str]:
        text = f"[{self.verdict}] {self.name}" + (f": {self.detail}" if self.detail else "")
        return [text] + ([f"       fix: {self.fix}"] if self.fix else [])


@dataclass(slots=True)
class Report:
    checks: list[Check] = field(default_factory=list)
    quiet: bool = False  # --json: the checks are printed once, at the end

    def add(self, name: str, verdict: Verdict, detail: str = "", fix: str = "") -> Check:
        check = Check(name, verdict, detail, fix)
        self.checks.append(check)
        if not self.quiet:
            for line in check.lines():
                print(line, flush=True)
        return check

    def note(self, line: str) -> None:
        if not self.quiet:
            print(line)

    def verdict(self) -> str:
        failed = self.failed
        if failed:
            names = ", ".join(c.name for c in failed)
            return f"{len(failed)} of {len(self.checks)} checks failed: {names}"
        if not self.checks:
            return "nothing checked"
        skipped = sum(c.verdict is Verdict.SKIP for c in self.checks)
        ran = len(self.checks) - skipped
        return f"all {plural(ran, 'check')} passed" + (f", {skipped} skipped" if skipped else "")

    def as_json(self) -> str:
        return json.dumps({
            "ok": not self.failed,
            "verdict": self.verdict(),
            "checks": [{"name": c.name, "verdict": c.verdict.value, "detail": c.detail,
                        "fix": c.fix} for c in self.checks],
        }, indent=2)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.verdict is Verdict.FAIL]


async def doctor_command(args: argparse.Namespace) -> int:
    report = Report(quiet=wants_json(args))
    args.timeout = timeout_of(args)
    config = _check_config(report, named_config(args))
    if config is not None:
        _check_serial_ports(report, config)
        _check_journal(report, config)
        await _check_service(report, config, args)
        await _check_upstream(report, config, args.timeout)
    if report.quiet:
        print(report.as_json())
    else:
        print(f"\n{report.verdict()}")
    if config is None:
        return EXIT_USAGE  # a broken config file: the same code from every command
    return EXIT_FAILED if report.failed else EXIT_OK


def _check_config(report: Report, path: Path) -> Config | None:
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
        )
        for error in err.errors:
            report.note(f"       {error}")
        return None
    report.add("config", Verdict.PASS, f"{path} is valid")
    return config


def _check_serial_ports(report: Report, config: Config) -> None:
    ports = [(t.get("name") or t["platform"], t["port"]) for t in config.triggers if t.get("port")]
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
            report.add(
                check,
                Verdict.FAIL,
                f"{port} is not present",
                "plug the adapter in; list /dev/serial/by-id/ and use that stable name",
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


def _check_journal(report: Report, config: Config) -> None:
    path = config.resolve(config["journal"]["path"])
    directory = path.parent
    if not directory.exists():
        report.add(
            "journal",
            Verdict.FAIL,
            f"directory {directory} does not exist",
            f"create it: install -d -o kiosk-agent -m 0700 {directory}",
        )
    elif not os.access(directory, os.W_OK):
        report.add(
            "journal",
            Verdict.FAIL,
            f"{directory} is not writable by this user",
            "run doctor as the service user, or chown the state directory",
        )
    else:
        report.add("journal", Verdict.PASS, str(path))


async def _check_service(report: Report, config: Config, args: argparse.Namespace) -> None:
    from kiosk_agent.service.client import ServiceClient

    sim = None
    try:
        simulator = config["service"].get("simulator")
        if simulator is not None:
            from kiosk_agent.cli.agent import start_simulator

            sim, settings = await start_simulator(simulator)
            report.add("service", Verdict.PASS, f"embedded simulator started at {sim.base_url}")
        else:
            from kiosk_agent.core.agent import service_settings_from_config

            settings = service_settings_from_config(config)
        async with ServiceClient(settings) as service:
            await _check_terminals(report, config, service, args)
    finally:
        if sim is not None:
            await sim.stop()


async def _timed(call: Awaitable[Any], within: float) -> Any:
    async with asyncio.timeout(within):
        return await call


async def _check_terminals(
    report: Report, config: Config, service: Any, args: argparse.Namespace
) -> None:
    from kiosk_agent.service.errors import AuthenticationError, ServiceError

    try:
        listed = await _timed(service.terminal.list(), args.timeout)
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
            f"not reachable: {_describe(err)}",
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
        await _ping(report, service, device_id, args.timeout)
        await _test_print(report, config, service, terminal, args)


async def _ping(report: Report, service: Any, device_id: str, within: float) -> None:
    from kiosk_agent.service.errors import ServiceError

    name = f"ping {device_id}"
    try:
        answer = await _timed(service.terminal.ping(device_id), within)
    except (ServiceError, TimeoutError, OSError) as err:
        report.add(name, Verdict.FAIL, _describe(err), "check the reader's power and network")
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


async def _test_print(
    report: Report, config: Config, service: Any, terminal: Any, args: argparse.Namespace
) -> None:
    from kiosk_agent.service.errors import ServiceError

    name = f"test print {terminal.device_id}"
    if not terminal.capabilities.receipt_printing:
        report.add(name, Verdict.SKIP, "this terminal has no printer")
        return
    if not args.test_print:
        report.add(name, Verdict.SKIP, "can print; pass --test-print to print a receipt copy")
        return
    trans_id = args.trans_id or _last_trans_id(config)
    if trans_id is None:
        report.add(
            name,
            Verdict.WARN,
            "no sale in the journal to print",
            "pass --trans-id of any transaction of this merchant",
        )
        return
    try:
        await _timed(service.terminal.print_receipt(terminal.device_id, trans_id), args.timeout)
    except (ServiceError, TimeoutError, OSError) as err:
        report.add(name, Verdict.FAIL, _describe(err), "check the paper roll and the printer door")
        return
    report.add(name, Verdict.PASS, f"printed transaction {trans_id}")


def _last_trans_id(config: Config) -> str | None:
    from kiosk_agent.core.journal import Journal
    from kiosk_agent.core.sale import SaleState

    path = config.resolve(config["journal"]["path"])
    if not path.exists():
        return None
    journal = Journal(path)
    journal.open()
    try:
        for record in journal.query(states=[SaleState.COMPLETED], limit=20):
            if record.trans_id:
                return str(record.trans_id)
    finally:
        journal.close()
    return None


async def _check_upstream(report: Report, config: Config, within: float) -> None:
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
                f"{parts.hostname}:{port}: {_describe(err)}",
                "check the URL, DNS and that the firewall lets the unit out",
            )
        else:
            report.add(
                "upstream http", Verdict.PASS, f"{parts.hostname}:{port} accepts connections"
            )
    if "mqtt" in upstream:
        await _check_mqtt(report, upstream["mqtt"], within)


async def _check_mqtt(report: Report, conf: dict[str, Any], within: float) -> None:
    import aiomqtt

    from kiosk_agent.core.upstream import mqtt_tls_context

    where = f"{conf['host']}:{conf['port']}"
    try:
        # Its own client id: reusing the agent's would disconnect the running agent.
        client = aiomqtt.Client(
            conf["host"],
            conf["port"],
            username=conf.get("username"),
            password=conf.get("password"),
            identifier=f"kiosk-agent-doctor-{os.getpid()}",
            timeout=within,
            tls_context=mqtt_tls_context(conf),
        )
        async with asyncio.timeout(within), client:
            pass
    except (aiomqtt.MqttError, OSError, TimeoutError) as err:
        fix = "check host, port, user and password; with tls: check the CA and the clock"
        report.add("upstream mqtt", Verdict.FAIL, f"{where}: {_describe(err)}", fix)
        return
    report.add("upstream mqtt", Verdict.PASS, f"{where} accepted the connection")


def _describe(err: BaseException) -> str:
    if isinstance(err, TimeoutError):
        return "timed out"
    return str(err) or type(err).__name__


# -- health ------------------------------------------------------------------------------------


async def health_command(args: argparse.Namespace) -> int:
    url, token = _admin_address(args)
    headers = {"Authorization": f"Bearer {token}"}
    within = timeout_of(args)
    try:
        async with (
            STATUS.waiting(f"the agent at {url}", within),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=within)) as session,
            session.get(f"{url.rstrip('/')}/api/health", headers=headers) as response,
        ):
            if response.status == 401:
                raise CliError("the admin API refused the token", EXIT_AUTH)
            if response.status != 200:
                raise CliError(f"admin API answered HTTP {response.status}")
            snapshot = await response.json()
    except (aiohttp.ClientError, TimeoutError) as err:
        raise CliError(
            f"cannot reach the agent at {url}: {_describe(err)}",
            EXIT_UNREACHABLE, ["is it running? `systemctl status kiosk-agent`"],
        ) from None
    print(json.dumps(snapshot, indent=2) if wants_json(args) else format_health(snapshot))
    return EXIT_OK if snapshot.get("status") == "ok" else EXIT_FAILED


def _admin_address(args: argparse.Namespace) -> tuple[str, str]:
    token = args.token or os.environ.get(TOKEN_ENV)
    if args.url:
        if not token:
            raise CliError(f"give --token or set ${TOKEN_ENV}", EXIT_USAGE)
        return args.url, token
    path = optional_config_path(args)
    if path is None:
        raise CliError(f"give -c/--config FILE (or set ${CONFIG_ENV}), or --url and --token",
                       EXIT_USAGE)
    config = load(path, check_platforms=False)
    admin = config.get("admin")
    if not admin:
        raise CliError(f"{path} has no admin: section; the agent serves no admin API",
                       EXIT_USAGE)
    host = admin["host"] if admin["host"] not in ("0.0.0.0", "::") else "127.0.0.1"  # noqa: S104
    if not token:
        admin_tokens = [t for t in admin["tokens"] if t["role"] == "admin"] or admin["tokens"]
        token = admin_tokens[0]["token"]
    return f"http://{host}:{admin['port']}", str(token)


def format_health(snapshot: dict[str, Any]) -> str:
    sales = snapshot.get("sales", {})
    service = snapshot.get("service", {})
    lines = [
        f"status:   {snapshot.get('status', '?').upper()}  (version {snapshot.get('version')}, "
        f"up {_duration(snapshot.get('uptime_s', 0))})",
        f"service:  {_reachable(service.get('reachable'))}"
        + (
            f", key expires in {_duration(service['key_expires_in_s'])}"
            if service.get("key_expires_in_s") is not None
            else ""
        ),
        f"sales:    today {sales.get('today_count', 0)} for "
        f"{format_cents(int(sales.get('today_amount_cents', 0)))}, "
        f"open {sales.get('open', 0)}, attention {sales.get('attention', 0)}",
    ]
    for terminal in snapshot.get("terminals", []):
        state = {True: "online", False: "OFFLINE", None: "unchecked"}[terminal.get("online")]
        latency = terminal.get("latency_ms")
        lines.append(
            f"terminal: {terminal['device_id']:<12} {state}"
            + (", connected" if terminal.get("connected") else "")
            + (f", ping {latency:.0f} ms" if latency is not None else "")
            + (f"  {terminal['detail']}" if terminal.get("detail") else "")
        )
    for link in snapshot.get("links", []):
        mark = "" if link.get("healthy") else "  <-"
        lines.append(f"link:     {link['name']:<12} {link['state']} {link.get('detail', '')}{mark}")
    for problem in snapshot.get("problems", []):
        lines.append(f"problem:  {problem}")
    return "\n".join(lines)


def _reachable(value: bool | None) -> str:
    return {True: "reachable", False: "UNREACHABLE", None: "not checked yet"}[value]


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 0:
        return "expired"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s"
