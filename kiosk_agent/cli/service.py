"""The command line for field techs and remote admins: terminals, reports, payments and boarding.

Credentials never come from a flag (it would land in shell history): they come from the agent's
configuration file (``--config FILE`` or ``KIOSK_CONFIG``, its ``service:`` section, with
``!secret``) and from ``KIOSK_*`` environment variables, which win over the file. Every failure
prints one line on standard error and exits non-zero; no traceback reaches a person.
"""

from __future__ import annotations

import argparse
import csv
import enum
import json
import os
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from pydantic import BaseModel, SecretStr, ValidationError

from kiosk_agent.money import MoneyError, cents_to_dollars, format_cents, parse_price

if TYPE_CHECKING:
    from kiosk_agent.service.client import ServiceClient
    from kiosk_agent.service.models.boarding import MerchantStatus
    from kiosk_agent.service.settings import ServiceSettings

M = TypeVar("M", bound=BaseModel)

# Exit codes (docs/cli.md): 0 fine, 1 the check failed or the service said no, 2 bad input,
# 3 credentials refused, 4 service unreachable.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_UNREACHABLE = 4

# settings field -> environment variable
ENVIRONMENT = {
    "base_url": "KIOSK_BASE_URL",
    "reporting_url": "KIOSK_REPORTING_URL",
    "ws_url": "KIOSK_WS_URL",
    "api_key": "KIOSK_API_KEY",
    "refresh_token": "KIOSK_REFRESH_TOKEN",
    "mid": "KIOSK_MID",
    "isv": "KIOSK_ISV",
    "client_id": "KIOSK_CLIENT_ID",
    "client_secret": "KIOSK_CLIENT_SECRET",
    "credentials_path": "KIOSK_CREDENTIALS_PATH",
}
CONFIG_ENV = "KIOSK_CONFIG"
# Fields never printed, whatever the output format.
HIDDEN_FIELDS = frozenset({"account_token", "token", "api_key", "refresh_token", "client_secret"})


class CliError(Exception):
    """One line for the person at the keyboard, and the exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


Handler = Callable[[argparse.Namespace], Awaitable[int]]


def guarded(handler: Handler) -> Handler:
    """Turn every expected failure into one line on stderr and an exit code."""

    async def run(args: argparse.Namespace) -> int:
        from kiosk_agent.service import errors

        try:
            return await handler(args)
        except CliError as err:
            _fail(str(err), scrub=False)  # our own words (and the config loader's): no secrets
            return err.code
        except errors.MissingCredentialsError as err:
            _fail(str(err), scrub=False)  # our own words: which setting to add
            return EXIT_USAGE
        except errors.AuthenticationError as err:
            _fail(f"credentials refused: {err}. Check KIOSK_API_KEY / client id and secret.")
            return EXIT_AUTH
        except errors.ServiceUnreachableError as err:
            _fail(f"service unreachable: {err}. Check KIOSK_BASE_URL and the network.")
            return EXIT_UNREACHABLE
        except errors.ServiceError as err:
            _fail(f"the service said no: {err}")
            return EXIT_FAILED
        except (MoneyError, ValueError) as err:
            _fail(str(err))
            return EXIT_USAGE
        except BrokenPipeError:  # `... | head`: the reader left, nothing to say
            return EXIT_OK
        except Exception as err:  # noqa: BLE001  (a person gets one line, never a traceback)
            _fail(f"unexpected {type(err).__name__}: {err} (please report this)")
            return EXIT_FAILED

    return run


def given(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The options among ``names`` that the command line set."""
    return {name: value for name in names if (value := getattr(args, name, None)) is not None}


def validated(model: type[M], what: str, fields: dict[str, Any]) -> M:
    """``model`` of ``fields``; refused fields are a usage error that starts with ``what``."""
    try:
        return model.model_validate(fields)
    except ValidationError as err:
        raise CliError(f"{what}: {first_problem(err)}", EXIT_USAGE) from None


def first_problem(err: ValidationError) -> str:
    """The first validation message, without pydantic's "Value error, " prefix."""
    message = str(err.errors(include_input=False)[0]["msg"])
    return message.removeprefix("Value error, ")


def _fail(message: str, *, scrub: bool = True) -> None:
    from kiosk_agent.redact import redact

    # The service's words and unexpected errors pass through redact, the net under a slip.
    print(f"error: {redact(message) if scrub else message}", file=sys.stderr)


# -- settings ------------------------------------------------------------------------------------


def load_settings(config: str | None, *, needs: str = "api") -> ServiceSettings:
    """Settings from the config file's ``service:`` section, overridden by ``KIOSK_*`` variables.

    ``needs`` is ``"api"`` (payments and terminal: base_url, api_key, mid) or ``"oauth"``
    (reporting and boarding: base_url or reporting_url, client_id, client_secret).
    """
    from kiosk_agent.service.settings import ServiceSettings

    values: dict[str, Any] = {}
    path = config or os.environ.get(CONFIG_ENV)
    if path:
        values.update(_service_section(Path(path)))
    for field, variable in ENVIRONMENT.items():
        if os.environ.get(variable):
            values[field] = os.environ[variable]
    if "base_url" not in values and "reporting_url" in values:
        values["base_url"] = values["reporting_url"]
    required = ["base_url", "api_key", "mid"] if needs == "api" else [
        "base_url", "client_id", "client_secret"
    ]
    missing = [ENVIRONMENT[field] for field in required if not values.get(field)]
    if missing:
        raise CliError(
            f"no service credentials: set {', '.join(missing)} in the environment, or give "
            "--config FILE with a service: section",
            EXIT_USAGE,
        )
    if isinstance(values.get("isv"), str):
        values["isv"] = values["isv"].strip().lower() in ("1", "true", "yes", "y")
    try:
        return ServiceSettings(**values)
    except ValidationError as err:
        first = err.errors(include_input=False)[0]
        field = ".".join(str(p) for p in first["loc"])
        raise CliError(f"service setting {field!r}: {first_problem(err)}", EXIT_USAGE) from None


def _service_section(path: Path) -> dict[str, Any]:
    """The service settings the agent itself would use with this configuration.

    Read by the agent's own loader, so ``!secret``, the defaults and the place of the rotated key
    (``credentials_path``, else ``keys.json`` beside the journal) are the same for both.
    """
    from kiosk_agent.core.agent import service_settings_from_config
    from kiosk_agent.core.config import ConfigInvalid, load_config

    if not path.is_file():
        raise CliError(f"config file {path} does not exist", EXIT_USAGE)
    try:
        config = load_config(path, check_platforms=False)
    except ConfigInvalid as err:
        more = len(err.errors) - 1
        hint = f" (and {more} more: `kiosk-agent check-config {path}`)" if more else ""
        raise CliError(f"{err.errors[0]}{hint}", EXIT_USAGE) from None
    if "simulator" in config["service"]:
        raise CliError(
            f"{path}: service: uses the embedded simulator; start `kiosk-agent sim` and point "
            "KIOSK_BASE_URL at it",
            EXIT_USAGE,
        )
    try:
        settings = service_settings_from_config(config)
    except ValidationError as err:
        raise CliError(f"{path}: service: {first_problem(err)}", EXIT_USAGE) from None
    # By the names the settings take (``mid``), so KIOSK_* variables override them one for one.
    given = settings.model_dump(by_alias=True, exclude_unset=True, exclude_none=True)
    return {
        name: value.get_secret_value() if isinstance(value, SecretStr) else value
        for name, value in given.items()
    }


def open_client(args: argparse.Namespace, *, needs: str = "api") -> ServiceClient:
    from kiosk_agent.service.client import ServiceClient

    return ServiceClient(load_settings(getattr(args, "config", None), needs=needs))


# -- small output helpers ----------------------------------------------------------------------


def parse_amount(text: str) -> int:
    """A dollars string from the command line ("2.50", "$2.50") -> integer cents."""
    try:
        cents = parse_price(text)
    except MoneyError as err:
        raise CliError(f"amount: {err}", EXIT_USAGE) from None
    if cents <= 0:
        raise CliError(f"amount must be above zero, got {text!r}", EXIT_USAGE)
    return cents


def safe_dump(model: BaseModel) -> dict[str, Any]:
    """A model as JSON-ready data without tokens or keys."""
    return {
        key: value
        for key, value in model.model_dump(mode="json").items()
        if key not in HIDDEN_FIELDS
    }


def print_record(pairs: Iterable[tuple[str, object]], *, as_json: bool, out: TextIO) -> None:
    items = [(k, v) for k, v in pairs if k not in HIDDEN_FIELDS]
    if as_json:
        print(json.dumps({k: _jsonable(v) for k, v in items}, indent=2), file=out)
        return
    width = max((len(k) for k, _ in items), default=0)
    for key, value in items:
        print(f"{key:<{width}}  {_text(value)}", file=out)


def show(args: argparse.Namespace, pairs: Iterable[tuple[str, object]]) -> None:
    """One record on stdout, as text or (``--json``) JSON."""
    print_record(pairs, as_json=wants_json(args), out=sys.stdout)


@dataclass(frozen=True, slots=True)
class Money:
    """Integer cents in a printed record: ``$2.50`` for people, ``"2.50"`` in JSON."""

    cents: int
    currency: str = "USD"


def _jsonable(value: object) -> object:
    if isinstance(value, Money):
        return cents_to_dollars(value.cents)
    if isinstance(value, Decimal):
        return f"{value:.2f}"
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, BaseModel):
        return safe_dump(value)
    return value


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, Money):
        return format_cents(value.cents, value.currency)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Decimal):
        return f"{value:.2f}"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


# -- terminals -----------------------------------------------------------------------------------


def _register_terminals(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "terminals",
        parents=[common],
        help="card readers: list, ping, connect, test print (start here when a reader is down)",
        description="List the card readers with their capabilities and online state, or check one.",
    )
    parser.set_defaults(handler=guarded(terminals_list))
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.add_parser("list", parents=[common], help="every reader and its state").set_defaults(
        handler=guarded(terminals_list)
    )
    for name, handler, text in (
        ("ping", terminals_ping, "is the reader online, and how fast does it answer"),
        ("connect", terminals_connect, "open a session on the reader"),
    ):
        sub = actions.add_parser(name, parents=[common], help=text)
        sub.add_argument("device", metavar="DEVICE", help="device id, e.g. SIM-0001")
        sub.set_defaults(handler=guarded(handler))
    sub = actions.add_parser("test-print", parents=[common], help="print a receipt on the reader")
    sub.add_argument("device", metavar="DEVICE")
    sub.add_argument("--trans-id", help="transaction to print (default: the latest one)")
    sub.set_defaults(handler=guarded(terminals_test_print))


async def terminals_list(args: argparse.Namespace) -> int:
    async with open_client(args) as svc:
        terminals = await svc.terminal.list()
    out = sys.stdout
    if wants_json(args):
        print(json.dumps([safe_dump(t) for t in terminals], indent=2), file=out)
        return EXIT_OK
    header = ("DEVICE", "NAME", "VENDOR", "MODEL", "ONLINE", "SESSION", "SIGNATURE", "PRINTS",
              "LAST SEEN")
    rows = [
        (
            t.device_id, t.name, t.vendor, t.model, t.online, t.connected,
            t.capabilities.signature_capture, t.capabilities.receipt_printing, t.last_seen_at,
        )
        for t in terminals
    ]
    _print_table(header, rows, out)
    offline = [t.device_id for t in terminals if not t.online]
    if not terminals:
        print("no terminals on this account", file=out)
    elif offline:
        print(
            f"\n{len(offline)} of {len(terminals)} offline: {', '.join(offline)}. "
            f"Fix: check power and network of the reader, then `kiosk-agent terminals ping "
            f"{offline[0]}`.",
            file=out,
        )
    else:
        print(f"\nall {len(terminals)} terminals online", file=out)
    return EXIT_OK


def _print_table(header: Sequence[str], rows: Sequence[Sequence[object]], out: TextIO) -> None:
    cells = [[_text(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(), file=out)
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


async def terminals_ping(args: argparse.Namespace) -> int:
    from kiosk_agent.service.errors import NotFoundError

    async with open_client(args) as svc:
        try:
            result = await svc.terminal.ping(args.device)
        except NotFoundError:
            raise _unknown_device(args.device) from None
    if result.online:
        latency = f" in {result.latency_ms:.0f} ms" if result.latency_ms is not None else ""
        print(f"OK    {args.device} is online and answered{latency}")
        return EXIT_OK
    print(
        f"DOWN  {args.device} does not answer.\n"
        f"Fix:  check that the reader has power and network (cable, Wi-Fi), wait for it to "
        f"boot, then run `kiosk-agent terminals ping {args.device}` again."
    )
    return EXIT_FAILED


def _unknown_device(device: str) -> CliError:
    return CliError(f"no terminal {device} on this account; `kiosk-agent terminals` lists them")


async def terminals_connect(args: argparse.Namespace) -> int:
    from kiosk_agent.service.errors import NotFoundError, ServiceError

    async with open_client(args) as svc:
        try:
            connection = await svc.terminal.connect(args.device)
        except NotFoundError:
            raise _unknown_device(args.device) from None
        except ServiceError as err:
            raise CliError(
                f"{args.device} refused the session: {err}. Fix: `kiosk-agent terminals ping "
                f"{args.device}` to see whether it is online."
            ) from None
    if connection.connected:
        print(f"OK    {args.device} session open")
        return EXIT_OK
    print(f"DOWN  {args.device} did not open a session; is it online? "
          f"`kiosk-agent terminals ping {args.device}`")
    return EXIT_FAILED


async def terminals_test_print(args: argparse.Namespace) -> int:
    async with open_client(args) as svc:
        terminals = await svc.terminal.list()
        terminal = next((t for t in terminals if t.device_id == args.device), None)
        if terminal is None:
            raise _unknown_device(args.device)
        if not terminal.capabilities.receipt_printing:
            printers = [t.device_id for t in terminals if t.capabilities.receipt_printing]
            hint = f" Readers that print: {', '.join(printers)}." if printers else ""
            raise CliError(
                f"{args.device} has no receipt printer (its capabilities lack receipt_printing); "
                f"customers get e-mailed receipts.{hint}"
            )
        if not terminal.online:
            raise CliError(
                f"{args.device} is offline. Fix: check power and network, then "
                f"`kiosk-agent terminals ping {args.device}`."
            )
        trans_id = args.trans_id or await _latest_trans_id(args)
        await svc.terminal.print_receipt(args.device, trans_id)
    print(f"OK    {args.device} printed the receipt of transaction {trans_id}")
    return EXIT_OK


async def _latest_trans_id(args: argparse.Namespace) -> str:
    """The newest transaction's id, read from reporting (needs the OAuth client)."""
    try:
        client = open_client(args, needs="oauth")
    except CliError:
        raise CliError("give --trans-id (reporting credentials are not set to find one)",
                       EXIT_USAGE) from None
    newest: tuple[datetime, str] | None = None
    async with client as svc:
        async for transaction in svc.reporting.transactions(page_size=1000):
            when = transaction.trans_date or datetime.min.replace(tzinfo=UTC)
            if newest is None or when > newest[0]:
                newest = (when, transaction.trans_id)
    if newest is None:
        raise CliError("no transaction to print yet; give --trans-id", EXIT_USAGE)
    return newest[1]


# -- reports ------------------------------------------------------------------------------------


# Columns of the table and CSV outputs, per kind (JSON has every field but tokens).
REPORT_COLUMNS: dict[str, tuple[str, ...]] = {
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
# Table widths; longer values are cut with an ellipsis so the stream never waits to align.
COLUMN_WIDTHS: dict[str, int] = {
    "trans_date": 19, "deposit_date": 19, "chargeback_date": 19, "adjustment_date": 19,
    "updated": 19, "amount": 12, "status": 18, "result": 6, "mid": 12, "card_number": 16,
    "transaction_count": 5, "merchant_id": 8,
}
DEFAULT_WIDTH = 20
# Options that are filter attributes of the same name (--status: see build_filter).
FILTER_OPTIONS = ("mid", "order_id", "trans_id", "batch_id", "funding_master_id", "category",
                  "status")


def _register_report(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "report",
        parents=[common],
        help="transactions, deposits, chargebacks, adjustments (streamed)",
        description="Pull a report, streamed page by page: memory stays flat for any size.",
    )
    parser.add_argument("kind", choices=["transactions", "deposits", "chargebacks", "adjustments"])
    _add_list_options(parser)
    parser.add_argument("--mid", help="merchant id")
    parser.add_argument("--order-id", help="transactions: the order id")
    parser.add_argument("--trans-id", help="transactions and chargebacks: the transaction id")
    parser.add_argument("--batch-id")
    parser.add_argument("--funding-master-id")
    parser.add_argument("--category", help="adjustments: the category")
    parser.add_argument(
        "--status",
        help="transactions: settled, captured, 3 ...; chargebacks: OPEN, WON, LOST; "
        "deposits: the status text",
    )
    parser.add_argument("--since", help="from this date or time (ISO 8601, UTC when no offset)")
    parser.add_argument("--until", help="up to this date (whole day) or time")
    parser.set_defaults(handler=guarded(report))


def _add_list_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=["table", "csv", "json"], default="table")
    parser.add_argument("--limit", type=_positive_int, help="stop after this many records")
    parser.add_argument("--page-size", type=_positive_int, default=500,
                        help="records per request (1..1000)")
    parser.add_argument("--quiet", action="store_true", help="no progress line on stderr")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number above zero, got {text!r}")
    return value


def build_filter(kind: str, args: argparse.Namespace) -> Any:
    """The typed ``q`` filter of ``kind`` from the command line; names a misplaced option."""
    from kiosk_agent.service.models.reporting import ReportKind, TransStatus

    report_kind = ReportKind(kind)
    fields = given(args, FILTER_OPTIONS)
    if kind == "transactions" and "status" in fields:
        try:
            fields["trans_status_id"] = TransStatus.parse(fields.pop("status"))
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


def parse_moment(text: str | None, *, end: bool) -> datetime | None:
    """``2026-11-22`` (a whole day) or an ISO 8601 time; no offset means UTC."""
    if text is None:
        return None
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            return start + timedelta(days=1) if end else start
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"not a date or time: {text!r} (use 2026-11-22 or "
                       "2026-11-22T10:00:00Z)", EXIT_USAGE) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


async def report(args: argparse.Namespace) -> int:
    from kiosk_agent.service.models.reporting import ReportKind

    kind = ReportKind(args.kind)
    filters = build_filter(args.kind, args)
    since, until = parse_moment(args.since, end=False), parse_moment(args.until, end=True)
    if since and until and since >= until:
        raise CliError("--since must be before --until", EXIT_USAGE)
    # q filters equalities only, so a time window is applied here, on the stream.
    windowed = since is not None or until is not None
    async with open_client(args, needs="oauth") as svc:
        records = svc.reporting.records(
            kind, filters, page_size=args.page_size, limit=None if windowed else args.limit
        )
        if windowed:
            records = _within(records, kind.date_field, since, until)
        return await write_records(records, args, kind.value)


async def _within(
    records: AsyncIterator[Any], field: str, since: datetime | None, until: datetime | None
) -> AsyncIterator[Any]:
    async for record in records:
        moment = getattr(record, field, None)
        if moment is None:
            continue
        if (since is None or moment >= since) and (until is None or moment < until):
            yield record


async def write_records(records: AsyncIterator[Any], args: argparse.Namespace, kind: str) -> int:
    """Stream ``records`` to stdout in ``args.format``; a progress line on stderr."""
    writer = make_writer(args.format, REPORT_COLUMNS[kind], sys.stdout)
    progress = Progress(kind, sys.stderr, quiet=args.quiet)
    count = 0
    writer.start()
    try:
        async for record in records:
            writer.write(record)
            count += 1
            progress.tick(count)
            if args.limit is not None and count >= args.limit:
                break
    finally:
        # Leaving early (--limit, an error) must not leave a prefetched page in flight.
        aclose = getattr(records, "aclose", None)
        if aclose is not None:
            await aclose()
        writer.finish()
        progress.done(count)
    return EXIT_OK


def record_row(record: BaseModel, column: str) -> object:
    """One column's value of a record, for table and CSV (amounts exact, status by name)."""
    if column == "amount":
        return cents_to_dollars(record.amount_cents)  # type: ignore[attr-defined]
    if column == "status":
        status = getattr(record, "status", None)
        if isinstance(status, enum.IntEnum):  # TransStatus, MerchantStatus: by name
            return status.name.lower()
        if isinstance(status, enum.Enum):
            return status.value
        if status is None:  # an id newer than this code: show it as sent
            return getattr(record, "trans_status_id", getattr(record, "merchant_status_id", None))
        return status
    return getattr(record, column, None)


class Writer:
    """Start, one record at a time, finish: nothing is held back."""

    def __init__(self, columns: Sequence[str], out: TextIO) -> None:
        self.columns = columns
        self.out = out

    def start(self) -> None: ...

    def write(self, record: BaseModel) -> None: ...

    def finish(self) -> None:
        self.out.flush()


class TableWriter(Writer):
    def start(self) -> None:
        self._line([c.upper() for c in self.columns])

    def write(self, record: BaseModel) -> None:
        self._line([_text(record_row(record, c)) for c in self.columns])

    def _line(self, cells: Sequence[str]) -> None:
        parts = []
        for column, cell in zip(self.columns, cells, strict=True):
            width = max(COLUMN_WIDTHS.get(column, DEFAULT_WIDTH), len(column))
            cell = cell if len(cell) <= width else cell[: width - 1] + "…"
            parts.append(cell.rjust(width) if column == "amount" else cell.ljust(width))
        print("  ".join(parts).rstrip(), file=self.out)


class CsvWriter(Writer):
    def start(self) -> None:
        self._csv = csv.writer(self.out, lineterminator="\n")
        self._csv.writerow(self.columns)

    def write(self, record: BaseModel) -> None:
        row = [record_row(record, c) for c in self.columns]
        self._csv.writerow(["" if v is None else _csv_text(v) for v in row])


def _csv_text(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    return _text(value)


class JsonWriter(Writer):
    """A JSON array, written as it streams (valid JSON once finished); amounts as strings."""

    def start(self) -> None:
        self._first = True
        self.out.write("[")

    def write(self, record: BaseModel) -> None:
        data = safe_dump(record)
        if "amount" in data:
            data["amount"] = cents_to_dollars(record.amount_cents)  # type: ignore[attr-defined]
        self.out.write(("\n" if self._first else ",\n") + json.dumps(data))
        self._first = False

    def finish(self) -> None:
        self.out.write("\n]\n" if not self._first else "]\n")
        super().finish()


def make_writer(fmt: str, columns: Sequence[str], out: TextIO) -> Writer:
    return {"table": TableWriter, "csv": CsvWriter, "json": JsonWriter}[fmt](columns, out)


class Progress:
    """``12,000 transactions (8,100/s)`` on stderr while a long pull runs, then a summary."""

    INTERVAL_S = 0.5  # redraw on a terminal
    PLAIN_INTERVAL_S = 5.0  # one line per this many seconds when stderr is a file or pipe

    def __init__(self, kind: str, stream: TextIO, *, quiet: bool = False) -> None:
        self.kind = kind
        self.stream = stream
        self.quiet = quiet
        self.started = time.monotonic()
        self._shown = self.started
        self._tty = stream.isatty()

    def tick(self, count: int) -> None:
        if self.quiet or count % 256:
            return
        now = time.monotonic()
        interval = self.INTERVAL_S if self._tty else self.PLAIN_INTERVAL_S
        if now - self._shown < interval:
            return
        self._shown = now
        line = f"{count:,} {self.kind} ({count / (now - self.started):,.0f}/s)"
        self.stream.write(f"\r{line}" if self._tty else f"{line}\n")
        self.stream.flush()

    def done(self, count: int) -> None:
        if self.quiet:
            return
        elapsed = time.monotonic() - self.started
        prefix = "\r" if self._tty else ""
        self.stream.write(f"{prefix}{count:,} {self.kind} in {elapsed:.1f} s\n")
        self.stream.flush()


# -- payments, vault, plans, hosted pages, keys --------------------------------------------------


def _register_payments(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("payments", parents=[common], help="charge, capture, void ...")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    charge = actions.add_parser("charge", parents=[common], help="charge a token or vaulted card")
    charge.add_argument("--amount", required=True, help='dollars, e.g. "2.50"')
    source = charge.add_mutually_exclusive_group(required=True)
    source.add_argument("--token", help="account token, or - to read it from stdin")
    source.add_argument("--vault-uuid", help="a vaulted payment account (stored credential)")
    charge.add_argument("--expiration", help="MMYY (with --token)")
    charge.add_argument("--order-id", help="your order id (made on the device when omitted)")
    charge.add_argument("--auth-only", action="store_true", help="authorize; capture later")
    charge.add_argument("--cof", choices=["C", "M"], help="stored credential: C customer present, "
                        "M merchant-initiated (default with --vault-uuid: M)")
    charge.add_argument("--scheduled", action="store_true", help="stored credential: recurring")
    charge.set_defaults(handler=guarded(payments_charge))

    for name, text in (("capture", "capture an authorization"),
                       ("void", "void, or refund when settled")):
        sub = actions.add_parser(name, parents=[common], help=text)
        sub.add_argument("trans_id", metavar="TRANS_ID")
        sub.add_argument("--amount", help="dollars; default: the whole amount")
        sub.set_defaults(handler=guarded(payments_capture if name == "capture" else payments_void))

    surcharge = actions.add_parser("surcharge", parents=[common], help="would a card pay a fee")
    surcharge.add_argument("--amount", required=True)
    card = surcharge.add_mutually_exclusive_group(required=True)
    card.add_argument("--token", help="account token, or - to read it from stdin")
    card.add_argument("--bin", help="the card's first six digits")
    surcharge.set_defaults(handler=guarded(payments_surcharge))

    receipt = actions.add_parser("receipt", parents=[common], help="e-mail a receipt")
    receipt.add_argument("trans_id", metavar="TRANS_ID")
    receipt.add_argument("--email", required=True)
    receipt.set_defaults(handler=guarded(payments_receipt))


def _token(value: str) -> str:
    """A token given as ``-`` is read from stdin, so it stays out of shell history."""
    token = sys.stdin.readline().strip() if value == "-" else value.strip()
    if not token:
        raise CliError("--token: empty token", EXIT_USAGE)
    return token


def _charge_lines(result: Any) -> list[tuple[str, object]]:
    verdict = {"A": "approved", "B": "retry", "C": "declined"}.get(str(result.result), "unknown")
    amount = Money(result.amount, result.currency) if result.amount is not None else None
    return [
        ("result", f"{result.result} ({verdict})"), ("trans_id", result.trans_id),
        ("order_id", result.order_id), ("amount", amount), ("auth_code", result.auth_code),
        ("resp_text", result.resp_text), ("payment_account_uuid", result.payment_account_uuid),
    ]


async def payments_charge(args: argparse.Namespace) -> int:
    from kiosk_agent.service.models.payments import ChargeRequest

    cents = parse_amount(args.amount)
    async with open_client(args) as svc:
        fields: dict[str, Any] = {
            "mid": svc.settings.mid, "amount": cents, "capture": not args.auth_only,
            "order_id": args.order_id,
        }
        if args.token is not None:
            fields.update(account_token=_token(args.token), expiration=args.expiration)
        else:
            fields.update(payment_account_uuid=args.vault_uuid, cof=args.cof or "M",
                          cof_sched=args.scheduled)
        result = await svc.payments.charge(validated(ChargeRequest, "charge", fields))
    show(args, _charge_lines(result))
    return EXIT_OK if result.approved else EXIT_FAILED


async def payments_capture(args: argparse.Namespace) -> int:
    cents = parse_amount(args.amount) if args.amount else None
    async with open_client(args) as svc:
        result = await svc.payments.capture(args.trans_id, cents)
    show(args, _charge_lines(result))
    return EXIT_OK if result.approved else EXIT_FAILED


async def payments_void(args: argparse.Namespace) -> int:
    cents = parse_amount(args.amount) if args.amount else None
    async with open_client(args) as svc:
        result = await svc.payments.void_or_refund(args.trans_id, cents)
    outcome = "voided" if result.voided else "refunded" if result.refunded else result.resp_text
    show(args, [
        ("outcome", outcome), ("trans_id", result.trans_id), ("order_id", result.order_id),
        ("amount", Money(result.amount, result.currency)), ("resp_text", result.resp_text),
    ])
    return EXIT_OK


async def payments_surcharge(args: argparse.Namespace) -> int:
    cents = parse_amount(args.amount)
    async with open_client(args) as svc:
        if args.token is not None:
            result = await svc.payments.surcharge(cents, account_token=_token(args.token))
        else:
            result = await svc.payments.surcharge(cents, card_bin=args.bin)
    show(args, [
        ("surcharge", result.surcharge), ("surcharge_amount", Money(result.surcharge_amount)),
        ("surcharge_percent", result.surcharge_percent),
    ])
    return EXIT_OK


async def payments_receipt(args: argparse.Namespace) -> int:
    async with open_client(args) as svc:
        result = await svc.payments.send_receipt(args.trans_id, args.email)
    print("receipt sent" if result.sent else "the service did not send the receipt")
    return EXIT_OK if result.sent else EXIT_FAILED


VAULT_FIELDS = ("name", "account_zip", "address1", "address2", "city", "region", "country",
                "email", "phone", "nickname", "expiration")


def _register_vault(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("vault", parents=[common], help="stored payment accounts")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", parents=[common], help="vault an account token")
    create.add_argument("--token", required=True, help="account token, or - to read from stdin")
    update = actions.add_parser("update", parents=[common], help="change fields of an account")
    update.add_argument("uuid", metavar="UUID")
    for sub, required in ((create, True), (update, False)):
        for field in VAULT_FIELDS:
            needed = required and field not in ("address2", "nickname", "expiration")
            sub.add_argument(f"--{field.replace('_', '-')}", dest=field, required=needed)
    create.set_defaults(handler=guarded(vault_create))
    update.set_defaults(handler=guarded(vault_update))
    for name, handler in (("get", vault_get), ("delete", vault_delete)):
        sub = actions.add_parser(name, parents=[common], help=f"{name} an account")
        sub.add_argument("uuid", metavar="UUID")
        sub.set_defaults(handler=guarded(handler))


def _vault_lines(account: Any) -> list[tuple[str, object]]:
    return [(k, v) for k, v in safe_dump(account).items() if v is not None]


async def vault_create(args: argparse.Namespace) -> int:
    from kiosk_agent.service.models.payments import VaultAccountRequest

    request = VaultAccountRequest(account_token=_token(args.token), **given(args, VAULT_FIELDS))
    async with open_client(args) as svc:
        account = await svc.vault.create(request)
    show(args, _vault_lines(account))
    return EXIT_OK


async def vault_get(args: argparse.Namespace) -> int:
    async with open_client(args) as svc:
        account = await svc.vault.get(args.uuid)
    show(args, _vault_lines(account))
    return EXIT_OK


async def vault_update(args: argparse.Namespace) -> int:
    changes = given(args, VAULT_FIELDS)
    if not changes:
        raise CliError("nothing to update: give at least one field such as --email", EXIT_USAGE)
    async with open_client(args) as svc:
        account = await svc.vault.update(args.uuid, **changes)
    show(args, _vault_lines(account))
    return EXIT_OK


async def vault_delete(args: argparse.Namespace) -> int:
    async with open_client(args) as svc:
        await svc.vault.delete(args.uuid)
    print(f"deleted vault payment account {args.uuid}")
    return EXIT_OK


def _register_plans(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("plans", parents=[common], help="recurring billing plans")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", parents=[common], help="bill a vaulted card on a rule")
    create.add_argument("--name", required=True)
    create.add_argument("--description", default="")
    create.add_argument("--vault-uuid", required=True, help="the vaulted payment account")
    create.add_argument("--amount", required=True, help='dollars per payment, e.g. "9.99"')
    create.add_argument("--start", required=True, help="first payment, e.g. 2026-12-01")
    create.add_argument("--every", default="MONTHLY",
                        choices=["DAILY", "WEEKLY", "MONTHLY", "YEARLY"])
    create.add_argument("--interval", type=_positive_int, default=1)
    create.add_argument("--until", help="last day (inclusive); none: open-ended")
    create.set_defaults(handler=guarded(plans_create))
    for name, handler in (("get", plans_get), ("cancel", plans_cancel)):
        sub = actions.add_parser(name, parents=[common], help=f"{name} a plan")
        sub.add_argument("plan_id", metavar="PLAN_ID", type=_positive_int)
        sub.set_defaults(handler=guarded(handler))


async def plans_create(args: argparse.Namespace) -> int:
    from kiosk_agent.money import cents_to_decimal
    from kiosk_agent.service.rrule import build_rrule

    start = parse_moment(args.start, end=False)
    until = parse_moment(args.until, end=False) if args.until else None
    assert start is not None
    rule = build_rrule(start, args.every, args.interval,
                       until.date() if until and len(args.until) == 10 else until)
    amount = cents_to_decimal(parse_amount(args.amount))
    async with open_client(args) as svc:
        plan_id = await svc.plans.create(
            name=args.name, description=args.description, payment_account_uuid=args.vault_uuid,
            amount=amount, rrule_pattern=rule,
        )
        plan = await svc.plans.get(plan_id)
    _print_plan(plan, args)
    return EXIT_OK


def _print_plan(plan: Any, args: argparse.Namespace) -> None:
    if wants_json(args):
        print(json.dumps(safe_dump(plan), indent=2))
        return
    print_record(
        [("id", plan.id), ("name", plan.name), ("status", plan.status), ("amount", plan.amount),
         ("rule", plan.rrule_pattern.replace("\n", " ")),
         ("payments", len(plan.scheduled_payments))],
        as_json=False, out=sys.stdout,
    )
    for payment in plan.scheduled_payments:
        print(f"  #{payment.payment_number:<3} {_text(payment.payment_date)}  "
              f"{payment.amount_scheduled:>10.2f}  {payment.payment_status}")


async def plans_get(args: argparse.Namespace) -> int:
    async with open_client(args) as svc:
        plan = await svc.plans.get(args.plan_id)
    _print_plan(plan, args)
    return EXIT_OK


async def plans_cancel(args: argparse.Namespace) -> int:
    async with open_client(args) as svc:
        await svc.plans.cancel(args.plan_id)
        plan = await svc.plans.get(args.plan_id)
    _print_plan(plan, args)
    return EXIT_OK


def _register_hpp(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("hpp", parents=[common], help="hosted payment pages")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", parents=[common], help="make a page; prints its link")
    edit = actions.add_parser("edit", parents=[common], help="change a page (others keep value)")
    edit.add_argument("page", metavar="PAGE", help="the page's id or its link")
    for sub in (create, edit):
        sub.add_argument("--name", required=sub is create)
        sub.add_argument("--amount", help='dollars, e.g. "25.00"')
        sub.add_argument("--min-amount", help="with an unlocked amount: the least a payer may pay")
        sub.add_argument("--max-amount", help="with an unlocked amount: the most a payer may pay")
        lock = sub.add_mutually_exclusive_group()
        lock.add_argument("--lock-amount", dest="lock_amount", action="store_true", default=None)
        lock.add_argument("--unlock-amount", dest="lock_amount", action="store_false")
    create.set_defaults(handler=guarded(hpp_create))
    edit.set_defaults(handler=guarded(hpp_edit))


def _page(args: argparse.Namespace) -> Any:
    from kiosk_agent.money import cents_to_decimal
    from kiosk_agent.service.models.payments import HostedPage

    def dollars(text: str | None) -> Decimal | None:
        return cents_to_decimal(parse_amount(text)) if text else None

    return validated(HostedPage, "page", {
        "name": args.name, "amount": dollars(args.amount), "lock_amount": args.lock_amount,
        "min_amount": dollars(args.min_amount), "max_amount": dollars(args.max_amount),
    })


async def hpp_create(args: argparse.Namespace) -> int:
    page = _page(args)
    async with open_client(args) as svc:
        link = await svc.hpp.create(page)
    show(args, [("url", link.url), ("page_id", link.hpp_client_id)])
    return EXIT_OK


async def hpp_edit(args: argparse.Namespace) -> int:
    changes = _page(args)
    if not changes.to_wire():
        raise CliError("nothing to change: give --name, --amount ...", EXIT_USAGE)
    async with open_client(args) as svc:
        await svc.hpp.edit(args.page, changes)
    print(f"updated hosted page {args.page}")
    return EXIT_OK


def _register_keys(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("keys", parents=[common], help="the payments API key")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("refresh", parents=[common], help="rotate the key now").set_defaults(
        handler=guarded(keys_refresh)
    )


async def keys_refresh(args: argparse.Namespace) -> int:
    settings = load_settings(getattr(args, "config", None))
    if settings.credentials_path is None:
        # The refresh spends the refresh token: a new pair that is not saved is a locked door.
        raise CliError(
            "refusing to rotate: no credentials_path is set, so the new key would be lost. Set "
            "KIOSK_CREDENTIALS_PATH (or service.credentials_path) to the agent's credentials file",
            EXIT_USAGE,
        )
    from kiosk_agent.service.client import ServiceClient

    async with ServiceClient(settings) as svc:
        credentials = await svc.keys.refresh()
    expires = credentials.api_key_expires_at
    until = datetime.fromtimestamp(expires, UTC).isoformat() if expires else "unknown"
    print(f"rotated: the new key is saved in {settings.credentials_path} (expires {until})")
    return EXIT_OK


# -- boarding --------------------------------------------------------------------------------------


def _register_boarding(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("boarding", parents=[common], help="merchants and onboarding")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    merchants = actions.add_parser("merchants", parents=[common], help="list merchants")
    _add_list_options(merchants)
    merchants.add_argument("--status", help="new, sent_for_signature, boarded, live ...")
    merchants.add_argument("--mid")
    merchants.add_argument("--dba-name")
    merchants.add_argument(
        "--webhooks",
        action="store_true",
        help="the state this unit's webhook receiver keeps (its store), not the service's list",
    )
    merchants.set_defaults(handler=guarded(boarding_merchants))

    merchant = actions.add_parser("merchant", parents=[common], help="one merchant")
    merchant.add_argument("merchant_id", metavar="MERCHANT_ID", type=_positive_int)
    merchant.set_defaults(handler=guarded(boarding_merchant))

    create = actions.add_parser("create", parents=[common], help="start a merchant application")
    create.add_argument("--dba-name", required=True)
    create.add_argument("--legal-name")
    create.add_argument("--external-crm-id")
    create.set_defaults(handler=guarded(boarding_create))

    update = actions.add_parser("update", parents=[common], help="change a merchant")
    update.add_argument("merchant_id", metavar="MERCHANT_ID", type=_positive_int)
    update.add_argument("--status", help="sent_for_signature (send or resend) or new (retract)")
    update.add_argument("--dba-name")
    update.add_argument("--legal-name")
    update.add_argument("--external-crm-id")
    update.set_defaults(handler=guarded(boarding_update))


def _merchant_lines(merchant: Any) -> list[tuple[str, object]]:
    status = merchant.status.api_name if merchant.status else merchant.merchant_status_id
    lines: list[tuple[str, object]] = [("status", status)]
    lines += [(k, v) for k, v in safe_dump(merchant).items() if v is not None]
    return lines


def merchant_status_arg(text: str | None) -> MerchantStatus | int | None:
    """``--status`` by name (``sent_for_signature``) or id; a typo is shown to its typist."""
    from kiosk_agent.service.models.boarding import MerchantStatus

    if text is None:
        return None
    if text.strip().isdigit():
        return int(text)
    try:
        return MerchantStatus.from_name(text)
    except ValueError as err:
        raise CliError(f"--status: {err}", EXIT_USAGE) from None


async def boarding_merchants(args: argparse.Namespace) -> int:
    from kiosk_agent.service.models.boarding import MerchantFilter

    if args.webhooks:
        return await webhook_merchant_states(args)
    status = merchant_status_arg(args.status)
    filters = validated(MerchantFilter, "--status",
                        {"mid": args.mid, "dba_name": args.dba_name, "merchant_status_id": status})
    async with open_client(args, needs="oauth") as svc:
        records = svc.boarding.merchants(filters, page_size=args.page_size, limit=args.limit)
        return await write_records(records, args, "merchants")


async def webhook_merchant_states(args: argparse.Namespace) -> int:
    """Each merchant's latest state as the receiver's durable store has it (any arrival order)."""
    rows = stored_merchant_states(args.config or os.environ.get(CONFIG_ENV))

    async def records() -> AsyncIterator[Any]:
        for row in rows:
            yield row

    return await write_records(records(), args, "merchant_states")


def stored_merchant_states(path: str | None) -> list[Any]:
    from kiosk_agent.admin.webhooks import read_merchant_states
    from kiosk_agent.core.config import ConfigInvalid, load_config

    if not path:
        raise CliError(
            f"--webhooks reads the receiver's store: pass --config or set {CONFIG_ENV}", EXIT_USAGE
        )
    try:
        config = load_config(path, check_platforms=False)
    except ConfigInvalid as err:
        raise CliError(str(err.errors[0]), EXIT_USAGE) from None
    if "webhooks" not in config.data:
        raise CliError(f"{path}: no webhooks: section, so this unit receives none", EXIT_USAGE)
    store = Path(config.resolve(config["webhooks"]["store"]))  # validated, defaults filled
    if not store.is_file():
        raise CliError(f"no webhook store at {store}: the receiver has accepted no event yet")
    try:
        return read_merchant_states(store)
    except sqlite3.Error as err:
        raise CliError(f"cannot read the webhook store {store}: {err}") from None


async def boarding_merchant(args: argparse.Namespace) -> int:
    async with open_client(args, needs="oauth") as svc:
        merchant = await svc.boarding.get(args.merchant_id)
    show(args, _merchant_lines(merchant))
    return EXIT_OK


async def boarding_create(args: argparse.Namespace) -> int:
    from kiosk_agent.service.models.boarding import MerchantCreate

    request = MerchantCreate(dba_name=args.dba_name, legal_name=args.legal_name,
                             external_crm_id=args.external_crm_id)
    async with open_client(args, needs="oauth") as svc:
        merchant = await svc.boarding.create(request)
    show(args, _merchant_lines(merchant))
    return EXIT_OK


async def boarding_update(args: argparse.Namespace) -> int:
    from kiosk_agent.service.models.boarding import MerchantUpdate

    status = merchant_status_arg(args.status)
    changes = validated(MerchantUpdate, "--status", {
        "merchant_status": status, "dba_name": args.dba_name, "legal_name": args.legal_name,
        "external_crm_id": args.external_crm_id,
    })
    if not changes.to_wire():
        raise CliError("nothing to update: give --status or a field", EXIT_USAGE)
    async with open_client(args, needs="oauth") as svc:
        merchant = await svc.boarding.update(args.merchant_id, changes)
    show(args, _merchant_lines(merchant))
    return EXIT_OK


# -- registration ---------------------------------------------------------------------------------


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config", default=argparse.SUPPRESS,
        help=f"the agent's YAML configuration (its service: section); default ${CONFIG_ENV}",
    )
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print JSON instead of text")
    # SUPPRESS: the options may stand before or after the action (`terminals --json list`);
    # an option not given is simply absent, read through wants_json() and the config lookup.
    return common


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


def register(subparsers: Any) -> None:
    common = _common_options()
    for add in (_register_terminals, _register_report, _register_payments, _register_vault,
                _register_plans, _register_hpp, _register_boarding, _register_keys):
        add(subparsers, common)


__all__ = ["CliError", "load_settings", "register"]
