"""`kiosk-agent run | check-config`: the agent's own commands (`sales` is cli/sales.py's)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiosk_agent.cli.contract import (
    EXIT_JOURNAL_OWNED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    StopSignals,
    config_path,
    existing_config,
    guarded,
    load,
    options,
    plural,
    wants_json,
)

# The configuration loader and the journal are imported by the commands that use them: the
# parser (`--help`, shell completion) must not wait for YAML, voluptuous and sqlite.
if TYPE_CHECKING:
    from kiosk_agent.assembly.agent import Agent
    from kiosk_agent.config.load import Config
    from kiosk_agent.sales.owner import JournalLock


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = subparsers.add_parser("run", help="run the agent", parents=options(json=False))
    run.set_defaults(handler=guarded(run_command))

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


# -- check-config ------------------------------------------------------------------------------


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
    warnings = port_warnings(config) + trigger_warnings(config)
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


# -- run ---------------------------------------------------------------------------------------


async def run_command(args: argparse.Namespace) -> int:
    """Run until a stop signal (:data:`STOP_SIGNALS`), then stop gracefully: new sales refused,
    the running ones heard to their end within ``sales.stop_timeout`` (a second signal ends
    that wait) and what is still open parked; the exit code says which signal it was."""
    import gc

    try:
        return await _run(args)
    finally:
        gc.enable()  # a run that ended before settling


async def _run(args: argparse.Namespace) -> int:
    from kiosk_agent.assembly.collector import collecting_while_loading

    # the libraries' import garbage collected as they load, then no collection until the agent
    # settles after READY=1 (assembly/collector.py)
    with collecting_while_loading():
        config = load(config_path(args))
    from kiosk_agent.sales.journal import JournalError
    from kiosk_agent.sales.owner import JournalLock, JournalOwned

    owner = JournalLock(config.resolve(config["journal"]["path"]))
    try:
        owner.acquire()
    except JournalOwned as err:
        # a distinct code: restarting cannot help while the other agent lives (the unit's
        # RestartPreventExitStatus), and a copied unit file must not loop on it
        raise CliError(str(err), EXIT_JOURNAL_OWNED) from None
    except JournalError as err:
        raise CliError(str(err)) from None
    try:
        return await _run_owning(args, config, owner)
    finally:
        from kiosk_agent.sales.journal_inspect import taken_ahead

        untaken = taken_ahead(owner.journal)  # a run stopped before its agent opened the journal
        if untaken is not None:
            untaken.exception()  # waited for: the file is let go once nothing looks at it
        owner.release()


async def _run_owning(args: argparse.Namespace, config: Config, owner: JournalLock) -> int:
    """The run once the journal is this process's: its file is looked at in a thread of its
    own while the agent is imported (a year of sales: 0.3 s of a second core, not of the path
    to READY=1; sales/journal_inspect.py)."""
    from kiosk_agent.sales.journal_inspect import inspect_ahead

    inspect_ahead(owner.journal)
    from kiosk_agent.app import agent_for
    from kiosk_agent.cli.embedded import embedded_simulator, simulated_machines
    from kiosk_agent.logs import setup_logging
    from kiosk_agent.sales.journal import JournalError
    from kiosk_agent.sales.owner import JournalOwned

    setup_logging(config["logging"])
    # Before anything starts: a signal during the start is a graceful stop once it is done.
    signals = StopSignals(
        "stopping: new sales refused, the sales running finish within sales.stop_timeout "
        f"({config['sales']['stop_timeout']:g} s) or are parked; a second signal ends the wait"
    ).install()
    if signals.received is not None:  # it came while the run was still reading its config
        signals.remove()
        return signals.exit_code
    try:
        async with agent_for(
            config, simulator=embedded_simulator, machines=simulated_machines, owner=owner
        ) as (agent, _service):
            await _start_unless_stopped(agent, signals)
            await signals.wait()
            if agent.started:  # the drain, cut short by a second signal
                await agent.stop(interrupt=signals.again)
    except JournalOwned as err:
        # a distinct code: restarting cannot help while the other agent lives (the unit's
        # RestartPreventExitStatus), and a copied unit file must not loop on it
        raise CliError(str(err), EXIT_JOURNAL_OWNED) from None
    except JournalError as err:
        # a read-only disk, a bad path: say so, no traceback
        raise CliError(str(err)) from None
    finally:
        # stopped: a late signal cannot strand anything now, nor kill the exiting process
        signals.remove(then_ignore=getattr(args, "owns_process", False))
    return signals.exit_code


async def _start_unless_stopped(agent: Agent, signals: StopSignals) -> None:
    """The agent's start, ended by a stop signal while it still waits (for its journal's disk:
    sales/journal_guard.py); what had started is stopped again (Agent.start)."""
    import asyncio

    starting = asyncio.ensure_future(agent.start())
    stopping = asyncio.ensure_future(signals.event.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        return
    starting.result()
