"""`kiosk-agent audit`: the machine's own books as the journal holds them; `audit fill` records a
refill (docs/audit.md).

Both work on the journal beside a running agent, as `sales` and `sales resolve` do: `audit`
only reads it, `audit fill` writes one row per column refilled.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from kiosk_agent.cli.contract import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    guarded,
    open_journal,
    options,
    parse_moment,
    plural,
    say,
    unit_config,
)
from kiosk_agent.export import SALE_FORMATS, export_audit
from kiosk_agent.moments import MOMENT_FORMS, display_time, timestamp
from kiosk_agent.money import format_cents

if TYPE_CHECKING:
    from kiosk_agent.audit.settings import BooksSettings
    from kiosk_agent.audit.store import AuditStore
    from kiosk_agent.sales.journal import Journal


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    audit = subparsers.add_parser(
        "audit",
        help="the machine's own books: stock per column, the last read, mismatches",
        parents=options(),
        description="Per column: paid vends since the last refill, the stock left by the "
        "planogram (dex: planogram), and the last audit read; then each interval between two "
        "reads that ended since --since (by default within dex: mismatch_shown, a day), the "
        "machine's card vends against the journal's, and their sums. Exit 1 when an interval "
        "of them is a mismatch. `audit fill` records a refill.",
    )
    _format_option(audit)
    audit.add_argument(
        "--since", default=None,
        help=f"from: {MOMENT_FORMS} (days and times in UTC)",
    )  # fmt: skip
    audit.set_defaults(handler=guarded(audit_command))
    actions = audit.add_subparsers(dest="action", metavar="ACTION")
    fill = actions.add_parser(
        "fill", parents=options(), help="record a refill of some columns (or --all)",
        description="Record that these columns were refilled now: their sales are counted "
        "again from the last read before the refill. Read the machine just before filling.",
    )  # fmt: skip
    fill.add_argument("columns", metavar="COLUMN", nargs="*", help="the columns refilled")
    fill.add_argument("--all", action="store_true", help="every column of the planogram and "
                      "of the last read")
    fill.set_defaults(handler=guarded(fill_command))


def _format_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format", choices=["table", *SALE_FORMATS], default=None,
        help="table (default), csv or json (--json is --format json)",
    )  # fmt: skip


def _books(
    args: argparse.Namespace, *, to_write: bool
) -> tuple[Journal, AuditStore, BooksSettings, list[str]]:
    """The journal, its audit tables, the dex: section, and the sources of its machine."""
    from kiosk_agent.audit.settings import BooksSettings, machine_sources
    from kiosk_agent.audit.store import AuditStore

    config = unit_config(args)
    settings = BooksSettings.from_config(config.get("dex") or {})
    sources = machine_sources(settings.trigger, config.triggers)
    journal = open_journal(config, to_write=to_write)
    store = AuditStore(lambda: journal.db)
    if to_write:
        store.open()
    return journal, store, settings, sources


async def audit_command(args: argparse.Namespace) -> int:
    from kiosk_agent.audit.ledger import audit_report
    from kiosk_agent.audit.reconcile import Intervals
    from kiosk_agent.cli.report import output_format

    fmt = output_format(args)
    moment = parse_moment(args.since, option="--since")
    journal, store, settings, sources = _books(args, to_write=False)
    since = moment.timestamp() if moment is not None else time.time() - settings.mismatch_shown
    try:
        report = audit_report(
            store, settings.planogram, settings.low_stock, since=since,
            machine=settings.trigger or "", sources=sources,
        ) if store.exists() else None
    finally:
        journal.close()
    if report is None:
        report = {"machine": settings.trigger or "", "last_read": None, "columns": [],
                  "comparisons": [], "mismatch": "", "since": since, "intervals": [],
                  "in_all": Intervals(since).as_dict()}
    if fmt != "table":
        for piece in export_audit(report, fmt):
            sys.stdout.write(piece)
    else:
        print(audit_table(report))
    # as `sales attention` does for a sale waiting: a cron job can alert on a mismatch
    return EXIT_FAILED if report["in_all"]["mismatched"] else EXIT_OK


# A column no refill was recorded for (`audit fill`; the virtual machine's tech records one once
# every column is sold out): its sales count from the first read, the column taken as full then.
# It said "never", which a demo's machine, full at its start, read as never filled (2026-11-30).
NO_FILL = "not recorded"
NO_FILL_MEANS = (
    "FILLED: the last refill recorded (`kiosk-agent audit fill`; the demo's machine records one "
    "when every column is sold out); not recorded: SOLD and LEFT count from the first read, "
    "the column taken as full then"
)


def audit_table(report: dict[str, Any]) -> str:
    """The books for people: a line per column, the last read, the latest comparison."""
    from kiosk_agent.text import for_terminal

    headers = ("COLUMN", "NAME", "PRICE", "CAPACITY", "SOLD", "LEFT", "", "FILLED")
    lines = [
        (
            for_terminal(c["column"]),
            for_terminal(c["name"]),
            format_cents(c["price"]) if c["price"] is not None else "",
            "" if c["capacity"] is None else str(c["capacity"]),
            "" if c["sold_since_fill"] is None else str(c["sold_since_fill"]),
            "" if c["estimate"] is None else str(c["estimate"]),
            "SOLD OUT" if c["sold_out"] else "LOW" if c["low"] else "",
            _when(c["filled_at"]) or NO_FILL,
        )
        for c in report["columns"]
    ]
    widths = [max([len(h)] + [len(line[i]) for line in lines]) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    out = [fmt.format(*headers)] + [fmt.format(*line) for line in lines] if lines else []
    out.append(plural(len(lines), "column"))
    if any(line[-1] == NO_FILL for line in lines):
        out.append(NO_FILL_MEANS)
    last = report["last_read"]
    if last is None:
        out.append("last read: none yet")
    else:
        during = "" if last["clean"] else " (taken during a sale: no comparison boundary)"
        out.append(f"last read: {_when(last['at'])}{during}")
        out.extend(f"  changed: {for_terminal(c['text'])}" for c in last["changes"])
    out.extend(intervals_lines(report))
    return "\n".join(out)


def intervals_lines(report: dict[str, Any]) -> list[str]:
    """The journal against the machine, interval by interval since the report's ``since``, and
    the sums (``reconcile.Intervals``): what `kiosk-agent audit` and the demo's end print."""
    from kiosk_agent.audit.reconcile import Comparison
    from kiosk_agent.text import for_terminal

    comparisons = report["comparisons"]
    stretch = report["in_all"]
    # the journal's sales of the stretch that no interval holds, said even with no interval
    outside = [for_terminal(stretch["text"])] if stretch.get("before") else []
    if not comparisons:
        if report["last_read"] is None:
            return []
        return ["journal: nothing compared yet (a comparison needs two reads taken while no "
                "sale of the machine ran)", *outside]
    found = [Comparison.of(c) for c in report["intervals"]]
    if not found:
        latest = Comparison.of(comparisons[0])
        return [f"journal: no interval ended since {display_time(report['since'])}; the "
                f"latest, until {display_time(latest.until)}: {for_terminal(latest.line())}",
                *outside]
    return [
        "journal against the machine's card vends, interval by interval since "
        f"{display_time(report['since'])}:",
        *(f"  {for_terminal(c.line())}" for c in found),
        for_terminal(stretch["text"]),
    ]


def _when(at: float | None) -> str:
    if at is None:
        return ""
    return display_time(at)


async def fill_command(args: argparse.Namespace) -> int:
    import getpass

    journal, store, settings, _ = _books(args, to_write=True)  # the configuration first
    try:
        if args.all == bool(args.columns):
            raise CliError("name the columns refilled, or give --all (not both)", EXIT_USAGE)
        columns = list(dict.fromkeys(args.columns))
        for column in columns:  # checked also where nothing is known to check it against
            if not column.strip() or column != column.strip() or not column.isprintable():
                raise CliError(
                    f"column {column!r} is no column name (a column's id on the machine, as "
                    "`kiosk-agent audit` lists them: A1, 12); nothing recorded", EXIT_USAGE,
                )  # fmt: skip
        last = store.last_read()
        known = sorted(set(settings.planogram) | set(last.figures.columns if last else ()))
        if args.all:
            columns = known
            if not columns:
                raise CliError("--all: no column known yet (no planogram and no read)")
        unknown = [column for column in columns if column not in known]
        if known and unknown:  # a typo would be a refill of nothing, said as done
            raise CliError(
                f"no column {', '.join(unknown)} in the planogram or the last read "
                f"(columns: {', '.join(known)}); nothing recorded", EXIT_USAGE,
            )  # fmt: skip
        fills = store.record_fill(columns, at=time.time(), by=f"cli ({getpass.getuser()})")
    finally:
        journal.close()
    say(args, f"refill recorded: {', '.join(f.column for f in fills)}",
        fills=[{"column": f.column, "at": timestamp(f.at), "read_id": f.read_id} for f in fills])
    return EXIT_OK
