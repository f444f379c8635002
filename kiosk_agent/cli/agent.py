"""`kiosk-agent run | check-config | sales`: the agent's own commands."""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import io
import json
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiosk_agent.core.config import Config, ConfigInvalid, load_config
from kiosk_agent.core.journal import Journal, JournalError, SaleRecord
from kiosk_agent.core.sale import SaleState
from kiosk_agent.money import cents_to_dollars, format_cents

if TYPE_CHECKING:
    from kiosk_agent.service.settings import ServiceSettings
    from kiosk_agent.sim.server import SimServer


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = subparsers.add_parser("run", help="run the agent")
    run.add_argument("--config", "-c", required=True, type=Path, help="configuration file")
    run.set_defaults(handler=run_command)

    check = subparsers.add_parser("check-config", help="validate a configuration, start nothing")
    check.add_argument("config", type=Path)
    check.set_defaults(handler=check_config_command)

    sales = subparsers.add_parser("sales", help="list or export the sales journal")
    sales.add_argument("--config", "-c", required=True, type=Path)
    sales.add_argument(
        "--since", help='ISO date or time ("2026-11-01", "2026-11-01T08:00") or "24h", "7d"'
    )
    sales.add_argument(
        "--state", action="append", choices=[s.value for s in SaleState], help="repeatable"
    )
    sales.add_argument("--format", choices=["table", "csv", "json"], default="table")
    sales.add_argument("--limit", type=int, default=None)
    sales.set_defaults(handler=sales_command)


def load_or_explain(path: Path, **options: Any) -> Config | None:
    """The configuration at ``path``; None once every mistake is printed to stderr."""
    try:
        return load_config(path, **options)
    except ConfigInvalid as err:
        for error in err.errors:
            print(error, file=sys.stderr)
        return None


# -- check-config ------------------------------------------------------------------------------


async def check_config_command(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigInvalid as err:
        for error in err.errors:
            print(error, file=sys.stderr)
        count = len(err.errors)
        print(f"{count} mistake{'s' if count != 1 else ''} in {args.config}", file=sys.stderr)
        return 2  # a broken config file is bad input (docs/cli.md)
    print(summary(config))
    return 0


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
    config = load_or_explain(args.config)
    if config is None:
        return 1
    from kiosk_agent.app import build_agent
    from kiosk_agent.core.logging import setup_logging

    setup_logging(config["logging"])
    simulator = config["service"].get("simulator")
    sim = None
    settings = None
    if simulator is not None:
        sim, settings = await start_simulator(simulator)
    agent = build_agent(config, settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await agent.start()
        await stop.wait()
    except JournalError as err:
        print(err, file=sys.stderr)  # a read-only disk or a bad path: say so, no traceback
        return 1
    finally:
        if agent.started:
            await agent.stop()
        if sim is not None:
            await sim.stop()
    return 0


async def start_simulator(conf: dict[str, Any]) -> tuple[SimServer, ServiceSettings]:
    """The embedded simulator (``service: {simulator: ...}``) and the settings to reach it."""
    from kiosk_agent.cli.sim import settings_from_ready
    from kiosk_agent.sim.server import SimOptions, SimServer

    sim = SimServer(
        SimOptions(
            port=0,
            time_scale=conf["time_scale"],
            seed=conf["seed"],
            transactions=conf["transactions"],
        )
    )
    await sim.start()
    return sim, settings_from_ready(sim.ready_info())


# -- sales -------------------------------------------------------------------------------------

_RELATIVE = re.compile(r"^(\d+)\s*([mhdw])$")
_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400, "w": 604800}
COLUMNS = (
    "created",
    "sale_id",
    "order_id",
    "source",
    "flow",
    "terminal",
    "product",
    "amount",
    "captured",
    "reversed",
    "state",
    "trans_id",
    "last_four",
    "message",
)


def parse_since(text: str, now: float | None = None) -> float:
    """``"24h"``/``"7d"`` back from now, or an ISO date/time (local time unless it says)."""
    match = _RELATIVE.match(text.strip())
    current = now if now is not None else dt.datetime.now().timestamp()
    if match:
        return current - int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    try:
        return dt.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ValueError(
            f'--since: expected an ISO date like "2026-11-01" or "24h"/"7d", got {text!r}'
        ) from None


def row_of(sale: SaleRecord) -> dict[str, Any]:
    created = dt.datetime.fromtimestamp(sale.created_at, dt.UTC)
    return {
        "created": created.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "sale_id": sale.sale_id,
        "order_id": sale.order_id,
        "source": sale.source,
        "flow": sale.flow,
        "terminal": sale.terminal,
        "product": sale.product or "",
        "amount": cents_to_dollars(sale.amount_cents),
        "captured": cents_to_dollars(sale.captured_cents),
        "reversed": cents_to_dollars(sale.reversed_cents),
        "state": sale.state.value,
        "trans_id": sale.trans_id or "",
        "last_four": sale.last_four or "",
        "message": sale.message,
    }


def render(sales: Sequence[SaleRecord], fmt: str) -> str:
    rows = [row_of(s) for s in sales]
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue().rstrip("\n")
    return _table(sales)


def _table(sales: Sequence[SaleRecord]) -> str:
    headers = ("created", "order_id", "source", "amount", "state", "message")
    lines = [
        (
            row_of(s)["created"],
            s.order_id,
            s.source,
            format_cents(s.captured_cents or s.amount_cents, s.currency),
            s.state.value,
            s.message,
        )
        for s in sales
    ]
    widths = [max([len(h)] + [len(str(line[i])) for line in lines]) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    out = [fmt.format(*headers)] + [fmt.format(*line) for line in lines]
    out.append(f"{len(sales)} sale{'s' if len(sales) != 1 else ''}")
    return "\n".join(out)


async def sales_command(args: argparse.Namespace) -> int:
    config = load_or_explain(args.config, check_platforms=False)
    if config is None:
        return 1
    try:
        since = parse_since(args.since) if args.since else None
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    path = config.resolve(config["journal"]["path"])
    if not path.exists():
        print(f"no journal at {path} (the agent has not run yet)", file=sys.stderr)
        return 1
    journal = Journal(path)
    try:
        journal.open()
    except JournalError as err:
        print(err, file=sys.stderr)
        return 1
    try:
        states = [SaleState(s) for s in args.state] if args.state else None
        sales = journal.query(since=since, states=states, limit=args.limit)
    finally:
        journal.close()
    print(render(sales, args.format))
    return 0
