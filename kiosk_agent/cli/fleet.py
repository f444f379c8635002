"""`kiosk-agent doctor | health | fleet list | show | forget`: what a field tech and a remote
operator run.

``doctor`` checks a unit in place (configuration, serial ports, journal, service, terminals,
ping, test print) and prints one verdict per check with the fix for each failure; it exits
non-zero when any check fails. ``health`` asks a running agent's admin API for its snapshot.
``fleet list`` and ``fleet show`` read every unit's retained state and availability on the
broker (no unit is asked); ``fleet forget`` removes a decommissioned unit from Home Assistant by
clearing its retained MQTT topics (discovery configs first, then state and availability).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiosk_agent.cli.contract import (
    CONFIG_ENV,
    EXIT_AUTH,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    STATUS,
    CliError,
    awaited_anyhow,
    config_path,
    guarded,
    load,
    named_config,
    off_the_loop,
    optional_config_path,
    options,
    plural,
    positive_number,
    print_json,
    program_command,
    timeout_of,
    wants_json,
    zero_or_more_seconds,
)
from kiosk_agent.moments import display_time, optional_timestamp
from kiosk_agent.money import format_cents

# The checks (doctor.py, verdicts.py), the configuration and aiohttp are imported by the
# commands that use them: the parser (`--help`, shell completion) must not wait for them.
if TYPE_CHECKING:
    from kiosk_agent.config.load import Config
    from kiosk_agent.verdicts import Check, Report

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
        f"the configuration (-c/--config or $KIOSK_CONFIG), or --url with the token in "
        f"${TOKEN_ENV} or --token-file.",
        parents=options(timeout=True),
    )
    add_admin_address(health)
    health.add_argument(
        "--watch", action="store_true",
        help="show it again whenever it changes, until Ctrl-C (the agent's event stream)",
    )  # fmt: skip
    health.set_defaults(handler=guarded(health_command, loop=False))

    fleet = subparsers.add_parser("fleet", help="the fleet on the MQTT broker (Home Assistant)",
                                  parents=options())
    actions = fleet.add_subparsers(dest="fleet_action", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "list",
        help="every unit on the broker: status, problems, last seen, sales today, version",
        description="Every unit whose retained topics are on the broker of the config's "
        "upstream: mqtt: section, from those topics alone (no unit is asked).",
        parents=options(),
    )
    listing.add_argument(
        "--wait", type=positive_number, default=5.0,
        help="seconds at most to collect the retained topics (ends sooner once all came)",
    )
    listing.set_defaults(handler=guarded(list_command))
    show = actions.add_parser(
        "show", help="one unit's last report, as its retained topics hold it", parents=options()
    )
    show.add_argument("unit", metavar="UNIT", help="the unit's device id")
    show.add_argument("--wait", type=positive_number, default=5.0,
                      help="seconds at most to collect its retained topics")
    show.set_defaults(handler=guarded(show_command))
    forget = actions.add_parser(
        "forget",
        help="remove a decommissioned unit from Home Assistant: clear its retained MQTT topics",
        parents=options(),  # -c/--config (its upstream: mqtt broker) and --json
    )
    forget.add_argument(
        "--device-id",
        help="the unit to forget (default: the config's upstream.device_id, else this host)",
    )
    forget.add_argument(
        "--force", action="store_true", help="forget it even while it says it is online"
    )
    forget.add_argument(
        "--wait", type=positive_number, default=1.0,
        help="seconds at most to collect its retained topics",
    )
    forget.add_argument(
        "--settle", type=zero_or_more_seconds, default=2.0,
        help="seconds between clearing its discovery configs and its state (Home Assistant "
        "removes the entities meanwhile)",
    )
    forget.set_defaults(handler=guarded(forget_command))


# -- doctor ------------------------------------------------------------------------------------


async def doctor_command(args: argparse.Namespace) -> int:
    # The checks and their fixes live in doctor.py (the status page runs them too).
    from kiosk_agent.doctor import Report, check_config, check_sections, check_this_unit

    as_json = wants_json(args)
    report = Report(on_check=None if as_json else _print_check)
    config = check_config(report, named_config(args))
    if config is not None:
        # each check within --timeout, else the configuration's service.timeout (its default)
        args.timeout = getattr(args, "timeout", None) or config["service"].get(
            "timeout", timeout_of(args)
        )
        await check_this_unit(report, config, args.timeout)
        await _check_service(report, config, args)
        await check_sections(report, config, args.timeout)
    report.finished_at = time.time()  # the run is over: its time is a fact, not null
    if as_json:
        shown = report.as_dict()
        for key in ("started_at", "finished_at"):  # ISO 8601 UTC, as every JSON time
            shown[key] = optional_timestamp(shown[key])
        print(json.dumps({"ok": not report.failed, "verdict": verdict(report), **shown},
                         indent=2))
    else:
        print(f"\n{verdict(report)}")
    if config is None:
        return EXIT_USAGE  # a broken config file: the same code from every command
    return EXIT_FAILED if report.failed else EXIT_OK


def verdict(report: Report) -> str:
    """``all 8 checks passed, 4 skipped`` or ``2 of 8 checks failed: ...``: skipped checks
    are counted apart, never as checks that ran."""
    from kiosk_agent.verdicts import Verdict

    if not report.checks:
        return "nothing checked"
    skipped = sum(c.verdict is Verdict.SKIP for c in report.checks)
    ran = plural(len(report.checks) - skipped, "check")
    failed = report.failed
    if failed:
        names = ", ".join(c.name for c in failed)
        return f"{len(failed)} of {ran} failed: {names}"
    return f"all {ran} passed" + (f", {skipped} skipped" if skipped else "")


def _print_check(check: Check) -> None:
    from kiosk_agent.text import for_terminal  # on use: `--help` does not wait for it

    for line in check.lines():  # a service's or a terminal's words: shown, never obeyed
        print(for_terminal(line), flush=True)


async def _check_service(report: Report, config: Config, args: argparse.Namespace) -> None:
    from kiosk_agent.app import configured_service
    from kiosk_agent.cli.embedded import RunningSimulator, command_simulator
    from kiosk_agent.doctor import Verdict, check_terminals
    from kiosk_agent.service.client import ServiceClient

    async with configured_service(config, command_simulator(config)) as configured:
        if isinstance(configured.simulator, RunningSimulator):
            report.add("service", Verdict.PASS,
                       f"the simulator of the demo running on it, at "
                       f"{configured.simulator.base_url} (process {configured.simulator.pid})")
        elif configured.simulator is not None:
            report.add("service", Verdict.PASS,
                       f"embedded simulator started at {configured.simulator.base_url}")
        async with ServiceClient(configured.settings) as service:
            await check_terminals(
                report,
                config,
                service,
                within=args.timeout,
                test_print=args.test_print,
                trans_id=args.trans_id,
            )


# -- fleet list | show | forget ---------------------------------------------------------------


def _broker(args: argparse.Namespace) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """The config's path, its upstream section and its mqtt broker (a usage error without)."""
    path = config_path(args)
    config = load(path, check_platforms=False)
    upstream = config.get("upstream") or {}
    mqtt = upstream.get("mqtt")
    if not mqtt:
        raise CliError(f"{path} has no upstream: mqtt: section; no broker to ask", EXIT_USAGE)
    return path, upstream, mqtt


def _unreachable(mqtt: dict[str, Any], err: BaseException) -> CliError:
    from kiosk_agent.service.errors import describe

    return CliError(f"cannot reach the MQTT broker {mqtt['host']}:{mqtt['port']}: "
                    f"{describe(err)}", EXIT_UNREACHABLE)


def _device_id(text: str, flag: str) -> str:
    from kiosk_agent.fleet.topics import DEVICE_ID, DEVICE_ID_RULE

    if not DEVICE_ID.match(text):
        # "+" or "#" would be an MQTT wildcard: every unit, not one
        raise CliError(f"{flag} {text!r} is not a device id ({DEVICE_ID_RULE})", EXIT_USAGE)
    return text


async def _fleet(
    mqtt: dict[str, Any], wait: float, device_id: str = "+"
) -> tuple[list[Any], bool]:
    """The units on the broker, and whether the broker had handed all it keeps in time."""
    from kiosk_agent.fleet.inventory import retained, units

    prefix = mqtt.get("topic_prefix", "kiosk-agent")
    patterns = [f"{prefix}/{device_id}/state", f"{prefix}/{device_id}/availability"]
    try:
        found = await retained(mqtt, patterns, wait=wait)
    except (OSError, TimeoutError, _mqtt_error()) as err:
        raise _unreachable(mqtt, err) from None
    if not found.complete:
        print(f"the broker had not handed every retained topic within --wait {wait:g} s: units "
              "may be missing (a larger --wait gives it longer)", file=sys.stderr)
    return units(prefix, found), found.complete


async def list_command(args: argparse.Namespace) -> int:
    _, _, mqtt = _broker(args)
    fleet, complete = await _fleet(mqtt, args.wait)
    now = time.time()
    rows = [unit.summary(now) for unit in fleet]
    if wants_json(args):
        print_json({"units": rows, "count": len(rows), "complete": complete})
    else:
        STATUS.clear()
        print(format_fleet(rows, now))
    if not rows:  # a wrong prefix or broker, or an ACL that hides the units, look alike
        prefix = mqtt.get("topic_prefix", "kiosk-agent")
        print(f"no unit under {prefix}/ on the broker {mqtt['host']}:{mqtt['port']}: check "
              f"upstream.mqtt.topic_prefix; may the MQTT user {mqtt.get('username') or 'anonymous'}"
              f" read {prefix}/+/state? (a broker's ACL hides what a user may not read)",
              file=sys.stderr)
    # like `health`: 0 only when all is well, so `fleet list || alert` works from cron; no unit
    # at all is not well either (a wrong broker or topic_prefix would look like a quiet fleet)
    # nor is a listing that may miss units
    healthy = rows and complete and all(row["status"] == "ok" for row in rows)
    return EXIT_OK if healthy else EXIT_FAILED


def format_fleet(units: list[dict[str, Any]], now: float) -> str:
    """The fleet as a table, one unit a line; problems shortened to the first. The units' words
    (their ids, versions, problems) are shown, never obeyed by the terminal."""
    from kiosk_agent.text import for_terminal_in  # on use: `--help` does not wait for it

    rows: list[dict[str, Any]] = for_terminal_in(units)  # type: ignore[assignment]
    header = ("UNIT", "STATUS", "LAST SEEN", "SALES TODAY", "VERSION", "PROBLEMS")
    lines = [header]
    for row in rows:
        sales = ("-" if row["sales_today"] is None else
                 f"{row['sales_today']} {format_cents(row['sales_today_cents'])}")
        problems = row["problems"]
        first = problems[0] if problems else ""
        more = f" (+{len(problems) - 1})" if len(problems) > 1 else ""
        lines.append((row["device_id"], row["status"], _ago(row["last_seen"], now), sales,
                      row["version"] or "-", first + more))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    text = ["  ".join([*(c.ljust(w) for c, w in zip(line, widths, strict=False)), line[-1]])
            for line in lines]
    bad = sum(1 for row in rows if row["status"] != "ok")
    text.append(f"{plural(len(rows), 'unit')}, {bad} not ok")
    return "\n".join(line.rstrip() for line in text)


def _sales_day(sales: dict[str, Any], now: float | None = None) -> str:
    """Which day a report's "sales today" are of, by the one rule of days (moments.py: the
    completed sales created since 00:00 UTC, as the status page's "Sales today" and `sales
    --since today --state completed`): ``today (since 00:00 UTC)``; the day by its date when
    the report is of an earlier day (`fleet show` of a unit that last reported yesterday)."""
    from kiosk_agent.moments import day_of

    started = sales.get("day_started_at")
    if not isinstance(started, int | float) or isinstance(started, bool) or started <= 0:
        return "today (since 00:00 UTC)"  # a report that does not name its day
    day = day_of(started)
    if day == day_of(time.time() if now is None else now):
        return "today (since 00:00 UTC)"
    return f"on {day.isoformat()} (UTC, the report's day)"


def _ago(at: str | None, now: float) -> str:
    """How long before ``now`` a unit's ``last_seen`` (ISO 8601) was."""
    if at is None:
        return "never"
    seen = dt.datetime.fromisoformat(at).timestamp()
    return f"{_duration(max(0.0, now - seen))} ago"


async def show_command(args: argparse.Namespace) -> int:
    _, _, mqtt = _broker(args)
    device_id = _device_id(args.unit, "UNIT")
    fleet, _ = await _fleet(mqtt, args.wait, device_id)
    if not fleet:
        raise CliError(f"no unit {device_id} on the broker {mqtt['host']}:{mqtt['port']}",
                       EXIT_FAILED, ["`kiosk-agent fleet list` shows the units there"])
    unit = fleet[0]
    now = time.time()
    if wants_json(args):
        summary = unit.summary(now)
        print_json({**summary, "availability": unit.availability, "report": unit.report})
        return EXIT_OK if summary["status"] == "ok" else EXIT_FAILED
    STATUS.clear()
    summary = unit.summary(now)
    from kiosk_agent.text import for_terminal  # on use: `--help` does not wait for it

    print(for_terminal(f"unit:     {device_id}  ({unit.availability or 'availability unknown'}, "
                       f"last seen {_ago(summary['last_seen'], now)})"))
    if unit.report is not None:
        print(format_health({**unit.report, "status": summary["status"]}, now))
    if unit.defect is not None:
        print(f"status:   {summary['status'].upper()}\nproblem:  {for_terminal(unit.defect)}")
    elif unit.report is None:  # its availability alone: say why it is not ok
        print(f"status:   {summary['status'].upper()}\nproblem:  no report of it on the broker "
              "(cleared, or the unit has not reported yet)")
    return EXIT_OK if summary["status"] == "ok" else EXIT_FAILED


async def forget_command(args: argparse.Namespace) -> int:
    from kiosk_agent.fleet.component import host_device_id
    from kiosk_agent.fleet.discovery import own_config
    from kiosk_agent.fleet.inventory import retained
    from kiosk_agent.fleet.topics import ONLINE, unit_base_topic, unit_topics

    _, upstream, mqtt = _broker(args)
    given = args.device_id is not None
    device_id = _device_id(args.device_id or upstream.get("device_id") or host_device_id(),
                           "--device-id" if given else "the device id")
    base = unit_base_topic(mqtt, device_id)
    discovery = mqtt.get("discovery_prefix", "homeassistant")
    patterns = [f"{base}/#"] + ([f"{discovery}/+/{device_id}/+/config"] if discovery else [])
    try:
        kept = await retained(mqtt, patterns, wait=args.wait)
        found = {topic: payload for topic, payload in kept.items()
                 if not topic.endswith("/config") or own_config(device_id, payload)}
        if not found:
            raise CliError(
                f"no unit {device_id} on the broker {mqtt['host']}:{mqtt['port']}: none of its "
                "retained topics is set", EXIT_FAILED,
                ["check the device id; `kiosk-agent fleet list` shows the units there"],
            )
        if found.get(f"{base}/availability") == ONLINE and not args.force:
            raise CliError(_online_refusal(device_id, found, base))
        # another program's config under this node id is left alone
        ours = (set(found) | set(unit_topics(mqtt, device_id))) - (set(kept) - set(found))
        configs = sorted(t for t in ours if t.endswith("/config"))
        rest = sorted(ours - set(configs))
        await _clear(mqtt, device_id, configs, rest, args.settle, args.wait)
    except (OSError, TimeoutError, _mqtt_error()) as err:
        raise _unreachable(mqtt, err) from None
    cleared = configs + rest
    if wants_json(args):
        print(json.dumps({"device_id": device_id, "cleared": cleared, "found": sorted(found)}))
    else:
        print(f"forgot {device_id}: cleared {len(cleared)} retained topic(s) "
              f"({len(found)} were set); Home Assistant removes its entities now")
        from kiosk_agent.text import for_terminal  # the broker's topic names: never obeyed

        for topic in cleared:
            print(f"  {for_terminal(topic)}")
    return EXIT_OK


def _online_refusal(device_id: str, found: dict[str, str], base: str) -> str:
    """Why a unit that says it is online is not forgotten, and what to do. Its reports may
    have stopped long ago: a last will is lost when the broker restarts while the unit is gone,
    and `online` stays."""
    from kiosk_agent.fleet.inventory import STALE_AFTER_BEATS, read_report

    report, _ = read_report(found.get(f"{base}/state", ""))
    interval, at = (report or {}).get("interval_s"), (report or {}).get("at")
    if isinstance(interval, int | float) and isinstance(at, int | float):
        quiet = time.time() - at
        if quiet > STALE_AFTER_BEATS * interval * 1.1:
            return (f"{device_id} says it is online, but its last report is {_duration(quiet)} "
                    "old (its last will lost, as in a broker restart while it was gone?): if "
                    "its agent is gone, pass --force")
    return (f"{device_id} says it is online: stop its agent first (it would announce itself "
            "again at its next start), or pass --force")


def _mqtt_error() -> type[Exception]:
    import aiomqtt

    return aiomqtt.MqttError


async def _clear(
    conf: dict[str, Any], device_id: str, configs: list[str], rest: list[str], settle: float,
    within: float,
) -> None:
    """An empty retained message deletes a retained topic (and HA's entity with its config).

    The configs go first and the state ``settle`` seconds later: cleared while HA was still
    removing the entities, the empty state reached their templates (HA 2024.3 logged
    ``'value_json' is undefined`` for each). Each step is read back: a broker's ACL refuses a
    publish in silence (MQTT 3.1.1 acknowledges it all the same), and the state is not
    cleared under entities HA still has."""
    import asyncio  # here: `doctor --help` and `health` never wait for it

    from kiosk_agent.fleet.mqtt import mqtt_client, passing_client_id

    async with mqtt_client(conf, passing_client_id("fleet"),
                           timeout=max(within, 5.0)) as client:
        for topic in configs:
            await client.publish(topic, b"", qos=1, retain=True)
        await asyncio.sleep(settle)
        await _check_cleared(conf, device_id, configs, "discovery configs", within,
                             "; its state and availability are left for the entities HA keeps")
        for topic in rest:
            await client.publish(topic, b"", qos=1, retain=True)
    await _check_cleared(conf, device_id, rest, "topics", within, "")


async def _check_cleared(
    conf: dict[str, Any], device_id: str, topics: list[str], what: str, within: float,
    left: str,
) -> None:
    from kiosk_agent.fleet.inventory import retained

    kept = sorted(await retained(conf, topics, wait=within)) if topics else []
    if kept:
        user = conf.get("username") or "anonymous"
        raise CliError(
            f"the broker kept {len(kept)} of {device_id}'s {what} after they were cleared "
            f"({kept[0]}{', ...' if len(kept) > 1 else ''}){left}",
            EXIT_FAILED,
            [f"may the MQTT user {user} write there? A broker's ACL refuses a publish "
             "without a word; or a client publishes them again (is the unit still running?)"],
        )


# -- health ------------------------------------------------------------------------------------


async def health_command(args: argparse.Namespace) -> int:
    """Registered without an event loop: one question, asked with the standard library in a
    thread bounded by the timeout (``--watch`` follows a stream, in a loop of its own)."""
    if args.watch:
        from kiosk_agent.cli.events import watch_health

        return await awaited_anyhow(watch_health(args))
    from kiosk_agent.cli.waiting import wait_in_thread

    url, token = admin_address(args)
    within = timeout_of(args)
    try:
        status, location, body = await off_the_loop(lambda: wait_in_thread(
            f"the agent at {url}", within,
            lambda: get_once(f"{url.rstrip('/')}/api/health", token, within)))
    except (OSError, ValueError, TimeoutError) as err:
        from kiosk_agent.service.errors import describe

        raise CliError(
            f"cannot reach the agent at {url}: {describe(err)}",
            EXIT_UNREACHABLE, ["is it running? `systemctl status kiosk-agent`"],
        ) from None
    check_admin_answer(url, status, location)
    try:
        snapshot = json.loads(body)
    except ValueError:
        raise CliError(f"{url} answered no JSON: is it the agent's admin API?") from None
    if wants_json(args):
        print(json.dumps(snapshot, indent=2))
    else:
        print("\n".join([format_health(snapshot), *next_steps(snapshot, args)]))
    return EXIT_OK if snapshot.get("status") == "ok" else EXIT_FAILED


def next_steps(snapshot: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """What a tech at the unit runs next, by what health holds (its fields, not its words):
    the doctor names the fix of each failing part (a reader, the service, the journal, a
    link); the sales that wait for a person have commands of their own. None when it is ok."""
    if snapshot.get("status") == "ok":
        return []
    path = optional_config_path(args)
    program = program_command(sys.argv[0])
    config = f"-c {path}" if path is not None else "-c FILE"
    sales = snapshot.get("sales", {})
    journal = snapshot.get("journal", {})
    steps = []
    if (snapshot.get("service", {}).get("reachable") is False
            or journal.get("writable") is False
            or any(t.get("online") is False for t in snapshot.get("terminals", []))
            or any(not link.get("healthy", True) for link in snapshot.get("links", []))
            or any(not a.get("available", True) and not a.get("starting")
                   for a in snapshot.get("availability", []))):
        steps.append(f"next:     `{program} doctor {config}` checks each part and says how to "
                     "fix what fails")
    if sales.get("attention"):
        steps.append(f"next:     `{program} sales attention {config}` lists the sales a person "
                     "decides")
    if sales.get("late_vends") or sales.get("maybe_dispensed"):
        steps.append(f"next:     `{program} sales late-vends {config}`: check the stock, then "
                     "acknowledge them")
    return steps


# The most of an answer `health` reads (a health snapshot is some kilobytes).
ANSWER_LIMIT = 8 << 20


def get_once(url: str, token: str, within: float) -> tuple[int, str | None, bytes]:
    """One GET of the admin API with the standard library: (status, Location, body). A
    redirect is not followed. ``health`` asks once: aiohttp's import (a quarter of a second of
    CPU here, seconds on a Pi Zero) is for the commands that follow a stream. An answer that
    is not HTTP is a ValueError, as an address that is not http:// or https://."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http:// or https:// address: {url}")
    if parts.scheme == "http":  # the agent on this machine, as its configuration gives it
        return _plain_get(parts.hostname, parts.port or 80, parts.netloc, parts.path or "/",
                          token, within)
    import http.client

    connection = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=within)
    try:
        connection.request("GET", parts.path or "/", headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json"})
        response = connection.getresponse()
        return response.status, response.getheader("Location"), response.read(ANSWER_LIMIT)
    except http.client.HTTPException as err:  # not an HTTP answer: said as one
        raise ValueError(f"no HTTP answer ({type(err).__name__})") from None
    finally:
        connection.close()


def _plain_get(host: str, port: int, netloc: str, path: str, token: str,
               within: float) -> tuple[int, str | None, bytes]:
    """:func:`get_once` over plain HTTP on a socket: HTTP/1.0, so the answer is the bytes
    until the agent closes (no chunks, no second request). http.client's import (with ssl and
    the e-mail parser it brings) was a tenth of `health`'s CPU for this one question."""
    import socket

    request = (f"GET {path} HTTP/1.0\r\nHost: {netloc}\r\nAuthorization: Bearer {token}\r\n"
               "Accept: application/json\r\nConnection: close\r\n\r\n")
    limit = ANSWER_LIMIT + HEAD_LIMIT
    received = bytearray()
    with socket.create_connection((host, port), timeout=within) as connection:
        connection.sendall(request.encode("latin-1"))
        while len(received) <= limit:
            piece = connection.recv(65536)
            if not piece:
                break
            received += piece
    return parse_answer(bytes(received))


HEAD_LIMIT = 64 << 10  # an answer's status line and headers, at most


def parse_answer(received: bytes) -> tuple[int, str | None, bytes]:
    """(status, Location, body) of an HTTP/1.x answer read whole; ValueError when it is not
    one (a server that speaks something else, an answer cut before its headers end)."""
    head, ended, body = received.partition(b"\r\n\r\n")
    if not ended or len(head) > HEAD_LIMIT:
        raise ValueError("no HTTP answer (its headers did not end)")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise ValueError("no HTTP answer (no status line)")
    headers = {}
    for line in header_lines:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length", "")
    if length.isdigit():
        body = body[: int(length)]
    return int(code), headers.get("location"), body[:ANSWER_LIMIT]


def check_admin_answer(url: str, status: int, location: str | None) -> None:
    """The CliError an admin API answer other than 200 stands for. A redirect is not followed:
    the request carries the admin token, and the agent's own API never redirects."""
    if status == 401:
        raise CliError("the admin API refused the token", EXIT_AUTH)
    if 300 <= status < 400:
        from kiosk_agent.redact import redirect_target

        where = redirect_target(location)
        raise CliError(
            f"{url} answered HTTP {status}, a redirect to {where}: not followed (the token "
            "goes to the agent's own address only)",
            EXIT_UNREACHABLE, ["give the agent's admin address itself with --url"],
        )
    if status != 200:
        raise CliError(f"the admin API answered HTTP {status}")


def add_admin_address(parser: argparse.ArgumentParser) -> None:
    """Where a running agent's admin API is, for ``health`` and ``events``: the configuration,
    or ``--url``. The token never comes from a flag (it would land in shell history): it is
    read from ``$KIOSK_AGENT_TOKEN``, a file, or the configuration."""
    parser.add_argument("--url", help="admin API address, e.g. http://127.0.0.1:8124")
    parser.add_argument(
        "--token-file", metavar="FILE",
        help=f"read the admin API token from FILE (default: ${TOKEN_ENV}, else the config's)",
    )  # fmt: skip
    # `--token T` would otherwise be taken as an abbreviation of --token-file, and the token
    # echoed as a file name: refused by name, the value never shown
    parser.add_argument("--token", nargs="?", action=_NoTokenFlag, help=argparse.SUPPRESS)


class _NoTokenFlag(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        parser.error(
            f"--token: a token is never taken from the command line (it would stay in the "
            f"shell's history); set ${TOKEN_ENV} or give --token-file FILE"
        )


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as file:
                token = file.read(4096).strip()
        except OSError as err:
            raise CliError(f"--token-file {args.token_file}: {err.strerror}", EXIT_USAGE) from None
        if not token:
            raise CliError(f"--token-file {args.token_file} is empty", EXIT_USAGE)
        return token
    return os.environ.get(TOKEN_ENV) or None


def admin_address(args: argparse.Namespace) -> tuple[str, str]:
    """The admin API's address and token (``health``, ``events``)."""
    token = _token(args)
    if args.url:
        if not token:
            raise CliError(f"set ${TOKEN_ENV} or give --token-file FILE with --url", EXIT_USAGE)
        return args.url, token
    path = optional_config_path(args)
    if path is None:
        raise CliError(f"give -c/--config FILE (or set ${CONFIG_ENV}), or --url with "
                       f"${TOKEN_ENV} set", EXIT_USAGE)
    config = load(path, check_platforms=False)
    address = configured_admin(config, token)
    if address is not None:
        return address
    if "simulator" in config["service"]:
        # a demo's configuration: the demo serves an admin API of its own while it runs
        # read at once: no file is said as the reader says it (no demo is running)
        from kiosk_agent.cli.demo_admin import demo_admin_of, read_demo_admin

        url, made = read_demo_admin(demo_admin_of(config), str(path))
        return url, token or made
    raise CliError(f"{path} has no admin: section; the agent serves no admin API", EXIT_USAGE)


def configured_admin(config: Config, token: str | None = None) -> tuple[str, str] | None:
    """The admin API of the agent run on ``config``: its address on this machine and ``token``,
    else the configuration's first admin token; None without an ``admin:`` section."""
    admin = config.get("admin")
    if not admin:
        return None
    host = admin["host"] if admin["host"] not in ("0.0.0.0", "::") else "127.0.0.1"  # noqa: S104
    if not token:
        admin_tokens = [t for t in admin["tokens"] if t["role"] == "admin"] or admin["tokens"]
        token = admin_tokens[0]["token"]
    return f"http://{host}:{admin['port']}", str(token)


def format_health(report: dict[str, Any], now: float | None = None) -> str:
    """An agent's health for people. Its words come from outside (a service's answer, a
    machine's message, a unit's report): shown, never obeyed by the terminal."""
    from kiosk_agent.text import for_terminal_in  # on use: `--help` does not wait for it

    snapshot: dict[str, Any] = for_terminal_in(report)  # type: ignore[assignment]
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
        f"sales:    {_sales_day(sales, now)} {sales.get('today_count', 0)} completed, "
        f"{format_cents(int(sales.get('today_amount_cents', 0)))}"
        # of those, what others gave back later at the service (the page's words)
        + (f" ({format_cents(sales['today_given_back_cents'])} given back since by others)"
           if type(sales.get("today_given_back_cents")) is int
           and sales["today_given_back_cents"] > 0 else "")
        + "; "
        f"open {sales.get('open', 0)}, attention {sales.get('attention', 0)}"
        # the prices of the sales in attention, as health sums them (sales.attention_cents)
        + (f" ({format_cents(sales['attention_cents'])})"
           if sales.get("attention") and type(sales.get("attention_cents")) is int else ""),
    ]
    if snapshot.get("availability"):
        from kiosk_agent.health.readers import availability

        # the status page's words: how many readers can take cards
        cards = availability(snapshot)["summary"]
        # A trigger's link down (its name "platform:name"; the audit port's is "dex"): the
        # reader takes cards at the service, but the machine cannot ask the agent for a sale.
        cut = [link["name"] for link in snapshot.get("links", [])
               if not link.get("healthy", True) and ":" in link["name"]]
        if cut:
            cards += (f" at the service, but no customer can pay on {', '.join(cut)}: the "
                      "machine cannot reach the agent (link below)")
        lines.append(f"cards:    {cards}")
    for terminal in snapshot.get("terminals", []):
        state = {True: "online", False: "OFFLINE", None: "unchecked"}[terminal.get("online")]
        latency = terminal.get("latency_ms")
        lines.append(
            f"terminal: {terminal['device_id']:<12} {state}"
            + (", connected" if terminal.get("connected") else "")
            + (f", ping {latency:.0f} ms" if latency is not None else "")
            + (f"  {terminal['detail']}" if terminal.get("detail") else "")
        )
    for state in snapshot.get("availability", []):
        if not state.get("available", True):
            from kiosk_agent.health.availability import unavailable_text

            out = unavailable_text(starting=bool(state.get("starting")), since=state["since"],
                                   reason=state.get("reason", ""))
            lines.append(f"card:     {state['device_id']:<12} {out}")
        elif state.get("recovering"):  # in service, held by recovery: no new sale meanwhile
            lines.append(f"card:     {state['device_id']:<12} HELD: {state['recovering']}")
    if snapshot.get("journal", {}).get("writable") is False:
        lines.append(f"journal:  NOT WRITABLE {snapshot['journal'].get('detail', '')}")
    for link in snapshot.get("links", []):
        mark = "" if link.get("healthy") else "  <-"
        since = ("" if link.get("healthy") or not link.get("since")  # ISO 8601 in the JSON
                 else f" since {display_time(link['since'])}")
        lines.append(f"link:     {link['name']:<12} {link['state']}{since} "
                     f"{link.get('detail', '')}{mark}")
    audit = snapshot.get("audit") or {}
    if audit.get("books_reset"):  # the machine's books reset: no problem, said beside them
        lines.append(f"audit:    {audit['books_reset']}")
    # a link's problem is its link line above (health's words, model.py): said once
    said = {f"link {link['name']} {link['state']} {link.get('detail', '')}".strip()
            for link in snapshot.get("links", [])}
    for problem in snapshot.get("problems", []):
        if problem not in said:
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
