"""`kiosk-agent report KIND`: transactions, deposits, chargebacks, adjustments, streamed.

Also the writer every listed pull shares (``boarding merchants`` too): a table with fixed widths
for people, and CSV and JSON through the one export (:mod:`kiosk_agent.export`), so a CSV from
here and one from the admin API have the same columns, amounts and timestamps.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from kiosk_agent.cli.contract import (
    EXIT_OK,
    EXIT_USAGE,
    STATUS,
    CliError,
    as_text,
    first_problem,
    given,
    guarded,
    options,
    parse_moment,
    positive_int,
    wants_json,
)
from kiosk_agent.cli.service_access import service_client
from kiosk_agent.cli.waiting import Progress
from kiosk_agent.export import (
    CsvExport,
    JsonExport,
    column_value,
    model_values,
    report_columns,
    report_values,
)
from kiosk_agent.moments import MOMENT_FORMS

if TYPE_CHECKING:  # pydantic is imported with the service's models, when a report is pulled
    from pydantic import BaseModel

SERVICE = options(timeout=True)
REPORT_KINDS = ("transactions", "deposits", "chargebacks", "adjustments")
# Columns of the table, per kind (CSV and JSON have every field but tokens: kiosk_agent.export).
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "transactions": ("trans_id", "trans_date", "mid", "order_id", "amount", "status", "result",
                     "card_number", "terminal_id"),
    "deposits": ("deposit_id", "deposit_date", "mid", "amount", "transaction_count", "batch_id",
                 "status"),
    "chargebacks": ("chargeback_id", "chargeback_date", "mid", "trans_id", "case_number",
                    "amount", "reason_code", "status"),
    "adjustments": ("adjustment_id", "adjustment_date", "mid", "amount", "category",
                    "description"),
    "merchants": ("merchant_id", "dba_name", "legal_name", "status", "mid", "updated"),
    "merchant_states": ("merchant_id", "dba_name", "status", "mid", "reason", "changed_at"),
}
# What one record is called in progress lines.
NOUNS = {"transactions": "transaction", "deposits": "deposit", "chargebacks": "chargeback",
         "adjustments": "adjustment", "merchants": "merchant", "merchant_states": "merchant"}
# Table widths; longer values are cut with an ellipsis so the stream never waits to align.
COLUMN_WIDTHS: dict[str, int] = {
    "trans_date": 20, "deposit_date": 20, "chargeback_date": 20, "adjustment_date": 20,
    "updated": 20, "amount": 12, "status": 18, "result": 6, "mid": 12, "card_number": 16,
    "transaction_count": 5, "merchant_id": 8,
}
DEFAULT_WIDTH = 20
# Options that are filter attributes of the same name (--status: see build_filter).
FILTER_OPTIONS = ("mid", "order_id", "trans_id", "batch_id", "funding_master_id", "category",
                  "status")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        parents=SERVICE,
        help="transactions, deposits, chargebacks, adjustments (streamed)",
        description="Pull a report, streamed page by page: memory stays flat for any size.",
    )
    parser.add_argument("kind", choices=REPORT_KINDS)
    add_list_options(parser)
    parser.add_argument("--mid", help="merchant id")
    parser.add_argument("--order-id", help="transactions: the order id")
    parser.add_argument("--trans-id", help="transactions and chargebacks: the transaction id")
    parser.add_argument("--batch-id")
    parser.add_argument("--funding-master-id")
    parser.add_argument("--category", help="adjustments: the category")
    parser.add_argument(
        "--status",
        help="transactions: settled, captured, 3 ...; chargebacks: OPEN, WON, LOST; "
        "deposits: the status text (any case)",
    )
    parser.add_argument("--since", help=f"from: {MOMENT_FORMS} (days and times in UTC)")
    parser.add_argument(
        "--until", help="up to this day (the whole of it) or time, in the same forms as --since"
    )
    parser.set_defaults(handler=guarded(report))


def page_size(text: str) -> int:
    """An argparse ``type``: records per request, within the service's cap (refused before
    anything is printed, not after a CSV header)."""
    from kiosk_agent.service.reporting import MAX_PAGE_SIZE

    value = positive_int(text)
    if value > MAX_PAGE_SIZE:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_PAGE_SIZE}, got {text!r}")
    return value


def add_list_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=["table", "csv", "json"], default=None,
                        help="table (default), csv or json (--json is --format json)")
    parser.add_argument("--limit", type=positive_int, help="stop after this many records")
    parser.add_argument("--page-size", type=page_size, default=500,
                        help="records per request (1..1000)")
    parser.add_argument("--quiet", action="store_true", help="no progress line on stderr")


def output_format(args: argparse.Namespace) -> str:
    """``--format``, with ``--json`` standing for ``--format json``."""
    fmt: str | None = getattr(args, "format", None)
    if wants_json(args):
        if fmt not in (None, "json"):
            raise CliError(f"--json and --format {fmt} disagree: give one", EXIT_USAGE)
        return "json"
    return fmt or "table"


def build_filter(kind: str, args: argparse.Namespace) -> Any:
    """The typed ``q`` filter of ``kind`` from the command line; names a misplaced option."""
    from pydantic import ValidationError

    from kiosk_agent.service.models.reports import ReportKind

    report_kind = ReportKind(kind)
    try:  # the admin API's query takes the same forms (ReportKind.text_filter)
        fields = report_kind.text_filter(given(args, FILTER_OPTIONS))
    except ValueError as err:
        raise CliError(f"--status: {err}", EXIT_USAGE) from None
    allowed = report_kind.filter.model_fields
    for attr in fields:
        if attr not in allowed:
            option = "--status" if attr == "trans_status_id" else "--" + attr.replace("_", "-")
            raise CliError(f"{option} does not apply to {kind}", EXIT_USAGE)
    try:
        return report_kind.filter.model_validate(fields)
    except ValidationError as err:
        first = err.errors(include_input=False)[0]
        raise CliError(f"--{first['loc'][0]}: {first_problem(err)}", EXIT_USAGE) from None


async def report(args: argparse.Namespace) -> int:
    from kiosk_agent.service.models.reports import ReportKind

    kind = ReportKind(args.kind)
    fmt = output_format(args)
    filters = build_filter(args.kind, args)
    since = parse_moment(args.since, end=False, option="--since")
    until = parse_moment(args.until, end=True, option="--until")
    if since and until and since >= until:
        raise CliError("--since must be before --until", EXIT_USAGE)
    # q filters equalities only, so a time window is applied here, on the stream.
    windowed = since is not None or until is not None
    progress = Progress(NOUNS[kind.value], quiet=args.quiet)
    async with service_client(args, needs="oauth") as svc:
        records = svc.reporting.records(
            kind, filters, page_size=args.page_size, limit=None if windowed else args.limit
        )
        if windowed:
            from kiosk_agent.service.reporting import within

            records = within(records, kind.date_field, since, until,
                             scanned=_count_scanned(progress))
        return await write_records(records, args, kind.value, fmt, progress)


def _count_scanned(progress: Progress) -> Callable[[int], None]:
    """The progress line of a windowed pull: records read, not only those kept."""

    def scanned(count: int) -> None:
        progress.scanned = count
        if count % 256 == 0:
            progress.tick(scanned=count, matched=progress.matched)

    return scanned


async def write_records(
    records: AsyncIterator[Any],
    args: argparse.Namespace,
    kind: str,
    fmt: str | None = None,
    progress: Progress | None = None,
) -> int:
    """Stream ``records`` to stdout as a table, CSV or JSON; progress on stderr."""
    fmt = fmt or output_format(args)
    writer = make_writer(fmt, kind, sys.stdout)
    progress = progress or Progress(NOUNS[kind], quiet=args.quiet)
    matched = 0
    finished = False
    writer.start()
    try:
        async for record in records:
            if matched == 0:
                STATUS.clear()
            writer.write(record)
            matched += 1
            progress.tick(scanned=max(progress.scanned, matched), matched=matched)
            if args.limit is not None and matched >= args.limit:
                break
        finished = True
    finally:
        # Leaving early (--limit, an error) must not leave a prefetched page in flight.
        aclose = getattr(records, "aclose", None)
        if aclose is not None:
            await aclose()
        if finished:
            writer.finish()
        else:
            writer.abort()
    progress.matched = matched
    progress.scanned = max(progress.scanned, matched)
    progress.done()  # only a pull that ended well gets a count; a failure gets its error line
    return EXIT_OK


def export_values(kind: str, record: Any) -> dict[str, object]:
    """A record as the one export has it (kiosk_agent.export)."""
    if kind in REPORT_KINDS:
        return report_values(record)
    values = model_values(record)
    values["status"] = column_value(record, "status")
    return values


def export_columns(kind: str) -> tuple[str, ...]:
    from kiosk_agent.service.models.reports import ReportKind

    return report_columns(ReportKind(kind)) if kind in REPORT_KINDS else TABLE_COLUMNS[kind]


class Writer:
    """Start, one record at a time, finish: nothing is held back."""

    def __init__(self, kind: str, out: TextIO) -> None:
        self.kind = kind
        self.out = out

    def start(self) -> None: ...

    def write(self, record: BaseModel) -> None: ...

    def finish(self) -> None:
        self.out.flush()

    def abort(self) -> None:
        """The pull failed: what was written stays, visibly unfinished."""
        self.out.flush()


class TableWriter(Writer):
    def start(self) -> None:
        self.columns = TABLE_COLUMNS[self.kind]
        self._line([c.upper() for c in self.columns])

    def write(self, record: BaseModel) -> None:
        self._line([as_text(column_value(record, c)) for c in self.columns])

    def _line(self, cells: Sequence[str]) -> None:
        parts = []
        for column, cell in zip(self.columns, cells, strict=True):
            width = max(COLUMN_WIDTHS.get(column, DEFAULT_WIDTH), len(column))
            cell = cell if len(cell) <= width else cell[: width - 1] + "…"
            parts.append(cell.rjust(width) if column == "amount" else cell.ljust(width))
        print("  ".join(parts).rstrip(), file=self.out)


class CsvWriter(Writer):
    def start(self) -> None:
        self._export = CsvExport(export_columns(self.kind))
        self.out.write(self._export.header())

    def write(self, record: BaseModel) -> None:
        self.out.write(self._export.row(export_values(self.kind, record)))


class JsonWriter(Writer):
    """A JSON array, written as it streams (valid JSON once finished). A pull that fails before
    its first record prints nothing here (the error is the one JSON answer); one cut short
    leaves its array open, so no parser takes it for a whole report."""

    def start(self) -> None:
        self._export = JsonExport()
        self._opened = False

    def write(self, record: BaseModel) -> None:
        if not self._opened:
            self.out.write(self._export.start())
            self._opened = True
        self.out.write(self._export.row(export_values(self.kind, record)))

    def finish(self) -> None:
        if not self._opened:
            self.out.write(self._export.start())
        self.out.write(self._export.end())
        super().finish()

    def abort(self) -> None:
        if self._opened:
            self.out.write("\n")
        super().abort()


def make_writer(fmt: str, kind: str, out: TextIO) -> Writer:
    return {"table": TableWriter, "csv": CsvWriter, "json": JsonWriter}[fmt](kind, out)
