"""`kiosk-agent check-config`: a configuration validated, nothing started. Its own module, not
`run`'s (cli/agent.py): a running agent never checks a configuration this way, and its text
builders stayed in every run's memory (docs/architecture.md, "Idle memory: tenth round")."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiosk_agent.cli.contract import (
    EXIT_OK,
    EXIT_USAGE,
    config_path,
    existing_config,
    guarded,
    options,
    plural,
    wants_json,
)

# The configuration loader is imported by the command: the parser (`--help`, shell completion)
# must not wait for YAML and voluptuous.
if TYPE_CHECKING:
    from kiosk_agent.config.load import Config


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = subparsers.add_parser(
        "check-config", help="validate a configuration, start nothing", parents=options()
    )
    check.add_argument(
        "config_file",
        metavar="FILE",
        nargs="?",
        type=Path,
        help="the configuration (or -c/--config FILE, or $KIOSK_CONFIG)",
    )
    check.add_argument(
        "--show",
        action="store_true",
        help="print the resolved configuration (defaults filled, includes "
        "read), every secret as ***",
    )
    check.set_defaults(handler=guarded(check_config_command, loop=False))


async def check_config_command(args: argparse.Namespace) -> int:
    from kiosk_agent.config.load import ConfigInvalid, load_config

    path = existing_config(args.config_file) if args.config_file else config_path(args)
    try:
        config = load_config(path)
    except ConfigInvalid as err:
        if wants_json(args):
            print(
                json.dumps(
                    {"path": str(path), "valid": False,
                     # each mistake's parts (file, line, path, fix ...) and its printed line
                     "errors": [{**e.as_dict(), "text": str(e)} for e in err.errors]},
                    indent=2,
                )
            )
        for error in err.errors:
            print(error, file=sys.stderr)
        print(f"{plural(len(err.errors), 'mistake')} in {path}", file=sys.stderr)
        return EXIT_USAGE  # a broken config file: the same code from every command
    warnings = port_warnings(config) + trigger_warnings(config) + listen_warnings(config)
    if wants_json(args):
        shown = {"config": _in_order(config.masked())} if args.show else {}
        print(
            json.dumps(
                {"path": str(path), "valid": True, "errors": [], "warnings": warnings, **shown},
                indent=2, default=str,
            )
        )
    elif args.show:
        import yaml

        print(
            yaml.safe_dump(json.loads(json.dumps(config.masked(), default=str)), sort_keys=True),
            end="",
        )
    else:
        print(summary(config))
    for warning in warnings:  # valid, but it will not work on this machine as it is
        print(f"warning: {warning}", file=sys.stderr)
    return EXIT_OK


def port_warnings(config: Config) -> list[str]:
    """A serial port the configuration names that does not exist here: valid YAML, but the
    trigger cannot start (a typo, an unplugged adapter). Named with its file and line, and the
    ports that do exist."""
    from kiosk_agent.config.load import locate
    from kiosk_agent.config.yaml_loader import load_yaml
    from kiosk_agent.platforms.serial_ports import resolve_port, serial_ports_present

    missing = [
        (index, trigger["port"])
        for index, trigger in enumerate(config.triggers)
        if isinstance(trigger.get("port"), str) and trigger["port"]
        and "://" not in trigger["port"] and not _present(resolve_port(trigger["port"]))
    ]
    if not missing:
        return []
    raw, _errors = load_yaml(config.path)
    present = ", ".join(serial_ports_present()) or "none"
    warnings = []
    for index, port in missing:
        where = locate(raw, ["triggers", index, "port"], None)
        place = f"{where.file}:{where.line}: " if where is not None and where.line else ""
        warnings.append(
            f"{place}triggers[{index}].port: {port} does not exist on this machine "
            f"(serial ports here: {present}); plug the adapter in, or use its "
            "/dev/serial/by-id/ name"
        )
    return warnings


def _present(port: str | None) -> bool:
    """A port as the serial transport would open it (a glob: its first match) exists."""
    return port is not None and Path(port).exists()


def trigger_warnings(config: Config) -> list[str]:
    """A valid trigger that cannot start on this machine as it is (a GPIO chip that does not
    exist, gpiod not installed): named with its file and line, and what to do."""
    from kiosk_agent.config.load import locate
    from kiosk_agent.config.yaml_loader import load_yaml
    from kiosk_agent.platforms.doctor import trigger_problems

    problems = trigger_problems(config)
    if not problems:
        return []
    raw, _errors = load_yaml(config.path)
    warnings = []
    for index, _name, problem in problems:
        where = locate(raw, ["triggers", index], None)
        place = f"{where.file}:{where.line}: " if where is not None and where.line else ""
        warnings.append(f"{place}triggers[{index}]: cannot start here: {problem}")
    return warnings


def listen_warnings(config: Config) -> list[str]:
    """A server's host that is not one of this machine's addresses now (a LAN address before
    DHCP gives it, a name that does not resolve): valid, the agent waits for it, but said here
    with its file and line. A host that can never be one (a multicast address, a URL) is the
    schema's mistake (web/hosts.py's listen_host), not a warning."""
    from kiosk_agent.config.load import format_path, locate
    from kiosk_agent.config.yaml_loader import load_yaml
    from kiosk_agent.web.hosts import address_problem, listen_hosts

    problems = [(path, problem) for path, host in listen_hosts(config)
                if (problem := address_problem(host)) is not None]
    if not problems:
        return []
    raw, _errors = load_yaml(config.path)
    placed = []
    for path, problem in problems:
        where = locate(raw, path, None)
        line = where.line if where is not None and where.line else 0
        place = f"{where.file}:{line}: " if where is not None and line else ""
        placed.append((line, f"{place}{format_path(path)}: {problem}"))
    return [warning for _line, warning in sorted(placed, key=lambda item: item[0])]  # file order


def _in_order(value: Any) -> Any:
    """``value`` with every mapping's keys sorted: the loader fills defaults in no fixed order,
    and two runs of ``--show`` on one file must print the same text."""
    if isinstance(value, dict):
        return {key: _in_order(value[key]) for key in sorted(value, key=str)}
    if isinstance(value, list):
        return [_in_order(item) for item in value]
    return value


def summary(config: Config) -> str:
    service = config["service"]
    where = (
        f"embedded simulator (time scale {service['simulator']['time_scale']:g})"
        if "simulator" in service
        else service["base_url"]
    )
    triggers = ", ".join(t.get("name") or t["platform"] for t in config.triggers) or "none"
    extra = sorted(k for k in config.data if k not in _CORE_SECTIONS)
    lines = [
        f"{config.path}: valid",
        f"  service:   {where}",
        f"  terminals: {', '.join(t['device_id'] for t in config['terminals'])}",
        f"  triggers:  {triggers}",
        f"  journal:   {config.resolve(config['journal']['path'])}",
    ]
    if extra:
        lines.append(f"  sections:  {', '.join(extra)}")
    return "\n".join(lines)


_CORE_SECTIONS = frozenset(
    {"service", "terminals", "journal", "receipts", "logging", "sales", "triggers"}
)
