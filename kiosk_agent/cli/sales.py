"""`kiosk-agent sales`: the local sales journal (list, export, show, attention, resolve).

Apart from `run` (cli/agent.py): a run imports neither its exports (CSV/JSON, `export`) nor its
views, which an idle agent never uses."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kiosk_agent.cli.contract import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    case_insensitive,
    guarded,
    open_journal,
    options,
    parse_moment,
    plural,
    positive_int,
    print_json,
    say,
    unit_config,
    wants_json,
)
from kiosk_agent.export import SALE_FORMATS, export_sales, sale_json, step_json
from kiosk_agent.moments import MOMENT_FORMS, display_time
from kiosk_agent.money import format_cents
from kiosk_agent.sales.kinds import (
    KIND_CHOICES,
    NOT_A_SALE,
    SaleKind,
    no_selection,
    sessions_text,
)
from kiosk_agent.sales.model import money_text
from kiosk_agent.sales.states import RESOLUTIONS, SaleState

# The journal is imported by the commands that use it: the parser (`--help`, shell completion)
# must not wait for sqlite.
if TYPE_CHECKING:
    from kiosk_agent.sales.journal import Journal, SaleRecord
    from kiosk_agent.sales.late_vends import LateVend


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sales = subparsers.add_parser(
        "sales",
        help="list or export the sales journal",
        parents=options(),
        description="The local sales journal. Without an action: `sales list`.",
    )
    _sales_list_options(sales)
    sales.set_defaults(handler=guarded(sales_command, loop=False))
    actions = sales.add_subparsers(dest="action", metavar="ACTION")
    listing = actions.add_parser(
        "list", help="list or export sales (the default)", parents=options()
    )
    _sales_list_options(listing)
    listing.set_defaults(handler=guarded(sales_command, loop=False))
    shown = actions.add_parser(
        "show", parents=options(),
        help="one sale with every step, as the status page and GET /api/sales/{id} show it",
    )  # fmt: skip
    shown.add_argument(
        "sale", metavar="SALE", help="sale id (or a unique start of it), or order id"
    )
    shown.set_defaults(handler=guarded(show_command, loop=False))
    attention = actions.add_parser(
        "attention", parents=options(),
        help="the sales a person must decide (state attention), with why and since when",
        description="The sales a person must decide (state attention), with why and since when, "
        "and the open sales not moving. Exit 1 when it lists any (so `kiosk-agent sales "
        "attention || alert` works from cron), 0 when there is none.",
    )  # fmt: skip
    attention.set_defaults(handler=guarded(attention_command, loop=False))
    resolve = actions.add_parser(
        "resolve", parents=options(),
        help="record what a person did about an attention sale, and why",
        description="Journal a person's decision on a sale in state attention, or on an open "
        "sale of another unit id (`sales attention` lists both): --as captured "
        "(the money was taken by hand: the sale ends completed) or --as reversed (it was given "
        "back: the sale ends reversed). Nothing is sent to the payment service.",
    )  # fmt: skip
    resolve.add_argument(
        "sale", metavar="SALE", help="sale id (or a unique start of it), or order id"
    )
    resolve.add_argument(
        "--as",
        dest="resolve_as",
        required=True,
        choices=sorted(RESOLUTIONS),
        type=case_insensitive(sorted(RESOLUTIONS)),
        help="what was done",
    )
    resolve.add_argument("--why", required=True, help="what you did and why (kept with the sale)")
    resolve.set_defaults(handler=guarded(resolve_command, loop=False))
    late = actions.add_parser(
        "late-vends", parents=options(),
        help="products the machine dispensed after their sale gave up waiting (unpaid)",
        description="The products the machine reported dispensed after their sale had given up "
        "waiting (its vend timeout) within the last 24 hours, not yet acknowledged: each went "
        "out unpaid (its money went back), and the machine's stock is one less than the sales "
        "say. Health shows them as a problem until acknowledged (--ack) or 24 hours have "
        "passed. Exit 1 when it lists any. Nothing is sent to the payment service.",
    )  # fmt: skip
    late.add_argument(
        "--ack", metavar="SALE",
        help="acknowledge the late vend of SALE (a unique start of its id), or of every one "
        "with 'all': journaled on the sale with who",
    )  # fmt: skip
    late.set_defaults(handler=guarded(late_vends_command, loop=False))



def _sales_list_options(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: the options may stand before or after `list` (`sales --since 7d list`).
    parser.add_argument(
        "--since", default=argparse.SUPPRESS, help=f"from: {MOMENT_FORMS} (days and times in UTC)"
    )
    parser.add_argument(
        "--until", default=argparse.SUPPRESS,
        help="up to this day (the whole of it) or time, in the same forms as --since",
    )  # fmt: skip
    parser.add_argument(
        "--state", action="append", default=argparse.SUPPRESS,
        type=case_insensitive([s.value for s in SaleState]),
        help=f"repeatable, any case: {', '.join(s.value for s in SaleState)}",
    )  # fmt: skip
    parser.add_argument(
        "--kind", choices=KIND_CHOICES, default=argparse.SUPPRESS,
        help="sale (default), no_selection (card sessions that ended with nothing chosen and "
        "nothing kept: not sales, counted apart) or all",
    )  # fmt: skip
    parser.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        default=argparse.SUPPRESS,
        help="table (default), csv or json (--json is --format json)",
    )
    parser.add_argument(
        "--limit", type=positive_int, default=argparse.SUPPRESS,
        help=f"at most N sales, newest first (the table shows {TABLE_LIMIT} unless told; "
        "CSV and JSON export every sale)",
    )  # fmt: skip
    parser.add_argument(
        "--all", action="store_true", default=argparse.SUPPRESS,
        help="every sale, also in the table",
    )  # fmt: skip


# -- sales -------------------------------------------------------------------------------------


def parse_since(text: str, now: float | None = None) -> float:
    """``"24h"``/``"7d"`` back from now, or an ISO day or time (UTC unless it says): a Unix time."""
    current = dt.datetime.fromtimestamp(now, dt.UTC) if now is not None else None
    moment = parse_moment(text, option="--since", now=current)
    if moment is None:
        raise RuntimeError("--since named no moment")
    return moment.timestamp()


def sales_window(
    since_text: str | None, until_text: str | None
) -> tuple[float | None, float | None]:
    """``--since``/``--until`` as Unix seconds (an until day is the whole day), as the admin
    API's ``since``/``until`` read them; an empty or backwards window is a usage error."""
    since = parse_moment(since_text, option="--since")
    until = parse_moment(until_text, end=True, option="--until")
    if since is not None and until is not None and since >= until:
        raise CliError("--since must be before --until", EXIT_USAGE)
    return (
        since.timestamp() if since is not None else None,
        until.timestamp() if until is not None else None,
    )


# Rows the table shows unless --limit or --all says otherwise (as `journalctl -n`): after a
# demo the journal holds hundreds of sales, and a tech wants the newest.
TABLE_LIMIT = 25


def render(sales: Sequence[SaleRecord], fmt: str, kind: SaleKind = SaleKind.SALE,
           late: Mapping[str, LateVend] | None = None) -> str:
    """The sales as a table for people, or the one CSV / JSON export (kiosk_agent.export, which
    the admin API's ``GET /api/sales?format=csv|json`` writes too). ``late``: the late vends
    of sales/late_vends.py's ``late_vended``, said on their sale."""
    late = late or {}
    if fmt in SALE_FORMATS:
        return "".join(export_sales(sales, fmt, {i: v.at for i, v in late.items()}))
    return _table(sales, kind, late) + "\n"



def _each_counted(pages: Iterable[list[SaleRecord]], count: list[int]) -> Iterator[SaleRecord]:
    """Each sale of ``pages``, counted in ``count[0]`` as it goes."""
    for page in pages:
        count[0] += len(page)
        yield from page


def _table(sales: Sequence[SaleRecord], kind: SaleKind, late: Mapping[str, LateVend]) -> str:
    from kiosk_agent.text import for_terminal  # on use: `--help` does not wait for it

    headers = ("created", "order_id", "source", "money", "state", "message")
    lines = [
        (
            display_time(s.created_at),  # for people, as every table (CSV and JSON: ISO 8601)
            for_terminal(s.order_id),
            for_terminal(s.source),
            money_text(s),  # what was charged, or is held: never the price asked as if taken
            s.state.value,
            # a service's or a machine's words: shown, never obeyed by the terminal
            for_terminal("; ".join(
                t for t in (late[s.sale_id].text() if s.sale_id in late else "",
                            s.message) if t)),
        )
        for s in sales
    ]
    widths = [max([len(h)] + [len(str(line[i])) for line in lines]) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    out = [fmt.format(*headers)] + [fmt.format(*line) for line in lines]
    apart = sum(1 for s in sales if no_selection(s))  # what sales.kinds says is not a sale
    counted = [plural(len(sales) - apart, "sale")] if kind is not SaleKind.NO_SELECTION else []
    if apart or kind is SaleKind.NO_SELECTION:
        counted.append(sessions_text(apart))
    out.append(", ".join(counted))
    return "\n".join(out)


# An open sale that has not moved for this long is shown with the attention sales: a running
# agent may hold it in memory while its journal cannot take the step (docs/journal.md).
STALLED_OPEN_S = 30.0


async def attention_command(args: argparse.Namespace) -> int:
    from kiosk_agent.sales.unit import others_open

    journal = open_journal(unit_config(args))
    try:
        sales = journal.attention_sales()
        # open sales of another unit id (a journal adopted under a new id): never the agent's
        # to finish, whatever their age; a person decides
        others = others_open(journal)
        theirs = {sale.sale_id for sale, _ in others}
        now = time.time()
        # either way: a last step dated after now means the clock was stepped back since (NTP
        # after a boot on a saved clock), and the sale may have stalled as long
        stalled = [s for s in journal.open_sales()
                   if abs(now - s.updated_at) > STALLED_OPEN_S and s.sale_id not in theirs]
    finally:
        journal.close()
    # a cron job alerts on the exit code: 1 while anything here waits for a person or the agent
    waiting = EXIT_FAILED if sales or stalled or others else EXIT_OK
    if wants_json(args):
        print(json.dumps({"sales": [sale_json(s) for s in sales],
                          "stalled_open": [sale_json(s) for s in stalled],
                          "other_unit_open": [{**sale_json(s), "why": why} for s, why in others]},
                         indent=2))
        return waiting
    from kiosk_agent.text import for_terminal

    for sale in stalled:
        moved = (
            f"not moved for {now - sale.updated_at:.0f} s" if sale.updated_at <= now else
            f"its last step is dated {sale.updated_at - now:.0f} s after now (the clock was "
            "stepped back since)"
        )  # fmt: skip
        print(
            f"{sale.sale_id}  {sale.order_id}  {for_terminal(sale.source)}  open "
            f"({sale.state.value}) since {display_time(sale.updated_at)}\n  {moved}: the agent "
            "finishes it (a journal that cannot take writes keeps it in memory meanwhile)"
        )
    for sale, why in others:
        print(
            f"{sale.sale_id}  {sale.order_id}  {for_terminal(sale.source)}  {money_text(sale)}  "
            f"open ({sale.state.value}) since {display_time(sale.updated_at)}\n  {why}"
        )
    for sale in sales:
        # the sales list's words: "held $0.00" said of a charge whose answer was lost
        print(
            f"{sale.sale_id}  {sale.order_id}  {for_terminal(sale.source)}  {money_text(sale)}  "
            f"since {display_time(sale.finished_at or sale.updated_at)}\n"
            f"  {for_terminal(sale.message)}"
        )
    counted = plural(len(sales), "sale") + " in attention"
    if stalled:  # listed above, and the exit code counts them: never "0 sales" alone
        counted += (f", {plural(len(stalled), 'open sale')} not moving (the agent finishes "
                    f"{'it' if len(stalled) == 1 else 'them'})")
    if others:
        counted += f", {len(others)} open sale(s) of another unit id"
    print(
        counted
        + (
            "; resolve each with: kiosk-agent sales resolve SALE --as captured|reversed --why TEXT"
            if sales or others
            else ""
        )
    )
    return waiting


async def resolve_command(args: argparse.Namespace) -> int:
    import getpass

    from kiosk_agent.sales.resolve import ResolveError, resolve

    journal = open_journal(unit_config(args), to_write=True)
    try:
        record = resolve(
            journal, args.sale, args.resolve_as, args.why, f"cli ({getpass.getuser()})"
        )
    except ResolveError as err:  # an unknown sale, one not in attention, no reason
        raise CliError(str(err), EXIT_FAILED) from None
    finally:
        journal.close()
    say(
        args,
        f"sale {record.sale_id} resolved as {args.resolve_as}: now {record.state.value}",
        sale=sale_json(record),
    )
    return EXIT_OK


async def late_vends_command(args: argparse.Namespace) -> int:
    import getpass

    from kiosk_agent.sales.clock import SYSTEM_CLOCK
    from kiosk_agent.sales.journal_reads import SaleNotFound
    from kiosk_agent.sales.late_vends import LateVendWatch

    ack = getattr(args, "ack", None)
    journal = open_journal(unit_config(args), to_write=ack is not None)
    try:
        watch = LateVendWatch(journal, SYSTEM_CLOCK)
        if ack is not None:
            try:
                done = watch.acknowledge(ack, f"cli ({getpass.getuser()})")
            except SaleNotFound as err:  # unknown, or a start of several sales' ids
                raise CliError(str(err), EXIT_FAILED) from None
            if not done:
                raise CliError(f"no late vend to acknowledge for {ack!r} (`kiosk-agent sales "
                               "late-vends` lists them)", EXIT_FAILED)
            say(args, f"acknowledged the late vend of {plural(len(done), 'sale')}: "
                f"{', '.join(done)}", acknowledged=done)
            return EXIT_OK
        late = watch.unseen()
        books = _books_at_charges(journal, late)
    finally:
        journal.close()
    if wants_json(args):
        print(json.dumps({"late_vends": [
            {"sale_id": v.sale_id, "product": v.product, "source": v.source, "at": v.at,
             "unsure": v.unsure, "cents": v.cents,
             **({"machine_books": books[v.sale_id][0]} if v.sale_id in books else {})}
            for v in late]}, indent=2))
        return EXIT_FAILED if late else EXIT_OK
    from kiosk_agent.text import for_terminal

    for vend in late:
        # a maybe (a dispenser's error, a vend a stop left unheard) is never said dispensed
        said = (f"may have dispensed {display_time(vend.at)} ({for_terminal(vend.unsure)}): "
                "unpaid if so, the money went back" if vend.unsure else
                f"dispensed {display_time(vend.at)}, after its sale gave up waiting: unpaid, "
                "the money went back")
        print(f"{vend.sale_id}  {for_terminal(vend.product or '(product unnamed)')}  "
              f"{for_terminal(vend.source)}  {said}")
        if books.get(vend.sale_id, (None, ""))[1]:
            print(f"  {books[vend.sale_id][1]}")
    print(plural(len(late), "late vend") + " not acknowledged"
          + ("; check the stock, then: kiosk-agent sales late-vends --ack SALE|all"
             if late else ""))
    return EXIT_FAILED if late else EXIT_OK


def _books_at_charges(
    journal: Journal, late: Sequence[LateVend]
) -> dict[str, tuple[dict[str, Any] | None, str]]:
    """For each maybe whose sale the journal lost (its charge's time kept on the note): the
    machine's books for the interval holding the charge (audit/at_charge.py), as JSON (None: no
    read covers it) and in words ("" where the unit keeps no books), by sale id."""
    lost = [(v.sale_id, v.charged_at) for v in late if v.charged_at is not None]
    if not lost:
        return {}
    import sqlite3

    from kiosk_agent.audit.at_charge import books_at, books_words
    from kiosk_agent.audit.store import AuditStore

    store = AuditStore(lambda: journal.db)
    try:
        known = store.exists()
    except sqlite3.Error:
        known = False
    found = {}
    for sale_id, charged_at in lost:
        comparison = books_at(store, charged_at) if known else None
        found[sale_id] = (comparison.as_dict() if comparison else None,
                          books_words(comparison, known))
    return found


async def sales_command(args: argparse.Namespace) -> int:
    from kiosk_agent.cli.report import output_format

    fmt = output_format(args)
    limit = getattr(args, "limit", None)
    if limit is not None and getattr(args, "all", False):
        raise CliError("give --limit N or --all, not both", EXIT_USAGE)
    if limit is None and fmt == "table" and not getattr(args, "all", False):
        limit = TABLE_LIMIT
    since, until = sales_window(getattr(args, "since", None), getattr(args, "until", None))
    from kiosk_agent.sales.late_vends import late_vended

    journal = open_journal(unit_config(args))
    try:
        states = [SaleState(s) for s in getattr(args, "state", None) or []] or None
        kind = SaleKind(getattr(args, "kind", SaleKind.SALE))
        late = late_vended(journal)  # a handful, from their own index
        if fmt in SALE_FORMATS:
            # written as the journal is read, a page at a time: a year of sales read whole took
            # 270 MB here, enough to push a small unit's agent out of memory
            pages = journal.pages(since=since, until=until, states=states, kind=kind,
                                  limit=limit)
            written = [0]
            late_at = {i: v.at for i, v in late.items()}
            for piece in export_sales(_each_counted(pages, written), fmt, late_at):
                sys.stdout.write(piece)
            shown = written[0]
        else:
            sales = journal.query(since=since, until=until, states=states, kind=kind,
                                  limit=limit)
            sys.stdout.write(render(sales, fmt, kind, late))
            shown = len(sales)
        more = (journal.count(since=since, until=until, states=states, kind=kind) - shown
                if limit else 0)
        apart = (journal.count(since=since, until=until, states=states,
                               kind=SaleKind.NO_SELECTION) if kind is SaleKind.SALE else 0)
    finally:
        journal.close()
    # on stderr: a pipe or an export gets the rows only
    if more > 0:
        print(f"{more:,} more (older); use --limit N or --all", file=sys.stderr)
    if apart:
        print(f"not sales: {sessions_text(apart)} (--kind no_selection lists them)",
              file=sys.stderr)
    return EXIT_OK


async def show_command(args: argparse.Namespace) -> int:
    """One sale with its steps: ``kiosk-agent sales show SALE``."""
    from kiosk_agent.sales.journal_reads import SaleNotFound

    journal = open_journal(unit_config(args))
    try:
        try:
            record = journal.find(args.sale)
        except SaleNotFound as err:  # unknown, or a prefix of several
            raise CliError(str(err), EXIT_FAILED) from None
        steps = journal.steps(record.sale_id)
    finally:
        journal.close()
    if wants_json(args):  # the admin API's GET /api/sales/{id}
        print_json({
            "sale": sale_json(record),
            "steps": [step_json(s) for s in steps],
        })  # fmt: skip
        return EXIT_OK
    from kiosk_agent.text import for_terminal

    print(for_terminal(sale_text(record, steps), keep_lines=True))
    return EXIT_OK


def sale_text(record: SaleRecord, steps: Sequence[Any]) -> str:
    """A sale and its steps for people, times in UTC to the second."""
    from kiosk_agent.card_brands import card_brand_name
    from kiosk_agent.sales.late_vends import late_vend_of

    def at(unix: float | None) -> str:
        if unix is None:
            return "-"
        return display_time(unix)

    card = " ".join(p for p in (card_brand_name(record.card_brand), record.last_four) if p)
    pairs = [
        ("sale", record.sale_id),
        ("order_id", record.order_id),
        ("state", record.state.value),
        ("kind", NOT_A_SALE if no_selection(record) else "sale"),
        ("money", money_text(record)),
        ("asked", format_cents(record.amount_cents, record.currency)),
        ("authorized", format_cents(record.authorized_cents, record.currency)),
        ("captured", format_cents(record.captured_cents, record.currency)),
        ("reversed", format_cents(record.reversed_cents, record.currency)),
        *([("by others", f"{format_cents(record.later_cents, record.currency)} "
            f"{record.later_status or ''} at the service after it completed"
            f"{' by ' + repr(record.later_by) if record.later_by else ''} "
            f"({at(record.later_at)})")] if record.later_cents is not None else []),
        ("source", record.source),
        ("flow", record.flow),
        ("terminal", record.terminal),
        ("product", record.product or "-"),
        ("card", card or "-"),
        ("trans_id", record.trans_id or "-"),
        ("created", at(record.created_at)),
        ("finished", at(record.finished_at)),
        ("message", record.message or "-"),
    ]
    width = max(len(key) for key, _ in pairs)
    lines = [f"{key:<{width}}  {value}" for key, value in pairs]
    vend = late_vend_of(steps)
    if vend is not None:  # its state says reversed: the product that went out anyway
        lines.append(f"{'late vend':<{width}}  {vend.text()}")
    lines.append(f"steps ({len(steps)}):")
    for step in steps:
        lines.append(f"  {at(step.at)}  {step.step:<24} -> {step.state.value}"
                     f"{step_detail_text(step.detail)}")
    return "\n".join(lines)


def step_detail_text(detail: object) -> str:
    """A step's detail as the status page says it: its message, else its facts as key=value
    (a late vend's product and source, who acknowledged it), at most 160 characters; never a
    field the exports hide (a token, a key)."""
    from kiosk_agent.export import HIDDEN_FIELDS

    if not isinstance(detail, dict) or not detail:
        return ""
    message = detail.get("message")
    if isinstance(message, str) and message:
        text = message
    else:
        text = " ".join(
            f"{k}={v if isinstance(v, str) else json.dumps(v, separators=(',', ':'))}"
            for k, v in detail.items() if k not in HIDDEN_FIELDS
        )
    return f"  {text[:160]}" if text else ""
