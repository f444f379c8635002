"""One CSV and JSON export for every route: the admin API's reports, `report` and `sales`.

Whoever asks (``GET /api/reports/{kind}?format=csv``, ``kiosk-agent report ... --format csv``,
``kiosk-agent sales --format csv``), a record comes out the same way:

- the same columns in the same order (:func:`report_columns`, :data:`SALE_COLUMNS`);
- amounts as exact two-place dollar strings (``"80.70"``, never ``80.7`` nor a float), and
  reports also carry ``amount_cents``;
- timestamps in ISO 8601, UTC, to the second, with ``Z`` (``2026-11-22T10:15:30Z``);
- no card token, key or secret (:data:`HIDDEN_FIELDS`);
- in CSV, a text cell that a spreadsheet would run as a formula (it starts with ``=``, ``+``,
  ``-``, ``@``, a tab or a carriage return: ``=HYPERLINK(...)``, ``-1+1``, ``@SUM(1)``) gets a
  leading ``'`` (OWASP, CSV injection). Our own numbers (amounts, counts) are not text and keep
  their sign.

The writers return text, so a caller streams it anywhere: a ``TextIO`` or an HTTP response.
"""

from __future__ import annotations

import csv
import datetime as dt
import enum
import io
import json
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from kiosk_agent.data_class import data_class
from kiosk_agent.moments import optional_timestamp, timestamp
from kiosk_agent.money import cents_to_dollars

if TYPE_CHECKING:
    from typing import TypeGuard

    from pydantic import BaseModel

    from kiosk_agent.audit.evadts import AuditFile, Product
    from kiosk_agent.sales.journal import SaleRecord, StepRecord
    from kiosk_agent.service.models.reports import ReportKind

# Fields never exported, in any format.
HIDDEN_FIELDS = frozenset({"account_token", "token", "api_key", "refresh_token", "client_secret"})
# A cell starting with one of these is a formula to a spreadsheet.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")

SALE_COLUMNS = (
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
    "kind",  # a new column goes last: a script reading columns by position keeps working
    "late_vend",  # when the machine said the product went out after the sale gave up, or ""
    # given back at the service by others after the sale completed (a person's refund at the
    # portal, a void, another program's), as the charge check last read reporting: the cents,
    # the charge's status there, who (reporting's ``user_identifier``), when; "" where none.
    # Apart from ``captured`` and ``reversed`` (the agent's own), never taken off either
    "given_back_by_others",
    "service_status",
    "given_back_by",
    "given_back_at",
)


@data_class(frozen=True, slots=True)
class Amount:
    """Integer cents: ``"2.50"`` in CSV and JSON, never a float (``$2.50`` for people)."""

    cents: int
    currency: str = "USD"

    def __str__(self) -> str:
        return cents_to_dollars(self.cents)


# The wall times the status page's event stream carries as Unix seconds (they are its cursor,
# ``?since=``): the health snapshot's, a sale step's or a note's ``at``, a sale's times.
STREAM_TIMES = frozenset({
    "at", "since", "until", "started_at", "checked_at", "last_ping_at", "key_expires_at",
    "made_at", "day_started_at", "last_read_at", "charges_checked_at", "created_at",
    "updated_at", "finished_at", "answer_by", "sent_at", "later_at",
})


def stream_json(value: object) -> object:
    """An event of the status page's stream as a command prints it in JSON (``events --json``,
    ``health --watch --json``): its times in ISO 8601 UTC, as every JSON the agent writes."""
    if isinstance(value, dict):
        return {key: timestamp(item) if key in STREAM_TIMES and _is_seconds(item)
                else stream_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [stream_json(item) for item in value]
    return value


def _is_seconds(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def neutralise(text: str) -> str:
    """``text`` as a spreadsheet shows it and never runs it (OWASP CSV injection)."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def plain(value: object) -> object:
    """A value as exports hold it: statuses by name, amounts and times as above."""
    if isinstance(value, enum.IntEnum):  # TransStatus, MerchantStatus: by name
        return value.name.lower()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dt.datetime):
        return timestamp(value)
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Decimal | Amount):
        return str(value)
    return value


def csv_cell(value: object) -> str:
    """One CSV cell: empty for None, text neutralised, our own numbers as they are."""
    if type(value) is str:  # most cells: the checks below took a third of an export's CPU
        return neutralise(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | Decimal | Amount) and not isinstance(value, enum.Enum):
        return str(value)  # a number, not text: "-1.50" stays a negative amount
    return neutralise(str(plain(value)))


def is_model(value: object) -> TypeGuard[BaseModel]:
    """Whether ``value`` is a pydantic model, without importing pydantic: no model exists
    before pydantic's models module is imported, and a command that exports plain values (a
    ``--json`` verdict) need not wait for it."""
    pydantic_main = sys.modules.get("pydantic.main")
    return pydantic_main is not None and isinstance(value, pydantic_main.BaseModel)


def json_value(value: object) -> object:
    """A value as JSON holds it (nested records and lists included, tokens left out)."""
    if value is None or type(value) is str:  # most values, as they are
        return value
    if is_model(value):
        return {key: json_value(item) for key, item in model_values(value).items()}
    if isinstance(value, list | tuple):
        return [json_value(item) for item in value]
    if isinstance(value, dict):
        return {str(key): json_value(item) for key, item in value.items()
                if key not in HIDDEN_FIELDS}
    plain_value = plain(value)
    if plain_value is None or isinstance(plain_value, str | int | float | bool):
        return plain_value
    return str(plain_value)  # a path, a UUID ...


class CsvExport:
    """A header line, then one line per record (RFC 4180: CRLF line ends, cells quoted as
    needed)."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = tuple(columns)

    def header(self) -> str:
        return _csv_line(self.columns)

    def row(self, values: Mapping[str, object]) -> str:
        return _csv_line(csv_cell(values.get(column)) for column in self.columns)


class JsonExport:
    """A JSON array written as it streams: ``start()``, ``row()`` each, ``end()``."""

    def __init__(self) -> None:
        self._first = True

    def start(self) -> str:
        return "["

    def row(self, values: Mapping[str, object]) -> str:
        text = json.dumps({key: json_value(value) for key, value in values.items()})
        separator = "\n" if self._first else ",\n"
        self._first = False
        return separator + text

    def end(self) -> str:
        return "]\n" if self._first else "\n]\n"


def _csv_line(cells: Iterable[str]) -> str:
    buffer = io.StringIO()
    # RFC 4180 line ends: a CR or LF inside a cell is then quoted, never a row break.
    csv.writer(buffer, lineterminator="\r\n").writerow(list(cells))
    return buffer.getvalue()


# -- what a record holds ------------------------------------------------------------------------


def model_values(record: BaseModel) -> dict[str, object]:
    """Every field of ``record`` but tokens, keys and secrets (values as the model holds them)."""
    return {
        name: getattr(record, name)
        for name in type(record).model_fields
        if name not in HIDDEN_FIELDS
    }


def report_columns(kind: ReportKind) -> tuple[str, ...]:
    """A report's export columns: its fields in the model's order, a transaction's ``status``
    by name after its id, and ``amount_cents`` last."""
    columns: list[str] = []
    for name in kind.model.model_fields:
        if name in HIDDEN_FIELDS:
            continue
        columns.append(name)
        if name == "trans_status_id":
            columns.append("status")
    return (*columns, "amount_cents")


def report_values(record: BaseModel) -> dict[str, object]:
    """One reporting record (transaction, deposit, chargeback, adjustment) for export, its
    keys in :func:`report_columns` order, so a JSON record reads as a CSV row does."""
    values: dict[str, object] = {}
    for name, value in model_values(record).items():
        values[name] = column_value(record, name) if name == "amount" else value
        if name == "trans_status_id":
            values["status"] = column_value(record, "status")
    values["amount_cents"] = record.amount_cents  # type: ignore[attr-defined]
    return values


def column_value(record: BaseModel, column: str) -> object:
    """One column of any record: ``amount`` exact, ``status`` by name (an unknown id as sent)."""
    if column == "amount":
        return Amount(record.amount_cents)  # type: ignore[attr-defined]
    if column == "status":
        status = getattr(record, "status", None)
        if status is None:  # an id newer than this code: show it as sent
            return getattr(record, "trans_status_id", getattr(record, "merchant_status_id", None))
        return status
    return getattr(record, column, None)


SALE_FORMATS = ("csv", "json")


def export_sales(sales: Iterable[SaleRecord], fmt: str,
                 late: Mapping[str, float] | None = None) -> Iterator[str]:
    """The sales as the one CSV or JSON export, piece by piece: ``kiosk-agent sales --format
    csv|json`` and the admin API's ``GET /api/sales?format=csv|json`` both write this, so the
    two give the same bytes. ``late``: when each late-vended sale's product went out
    (sales/late_vends.py's ``late_vended``)."""
    late = late or {}
    if fmt == "json":
        json_export = JsonExport()
        yield json_export.start()
        for sale in sales:
            yield json_export.row(sale_values(sale, late.get(sale.sale_id)))
        yield json_export.end()
        return
    if fmt != "csv":
        raise ValueError(f"format must be one of {', '.join(SALE_FORMATS)}, got {fmt!r}")
    csv_export = CsvExport(SALE_COLUMNS)
    yield csv_export.header()
    for sale in sales:
        yield csv_export.row(sale_values(sale, late.get(sale.sale_id)))


def sale_values(sale: SaleRecord, late_vend_at: float | None = None) -> dict[str, Any]:
    """One sale of the journal for export (``sales --format csv|json``), its ``kind`` as
    :func:`sale_json` says it (``--kind all`` lists both kinds: each row says which), and when
    the machine said its product went out after the sale gave up waiting (a late vend: the
    state says reversed, the product is gone unpaid)."""
    return {
        "created": timestamp(sale.created_at),
        "sale_id": sale.sale_id,
        "order_id": sale.order_id,
        "source": sale.source,
        "flow": sale.flow,
        "terminal": sale.terminal,
        "product": sale.product or "",
        "amount": Amount(sale.amount_cents),
        "captured": Amount(sale.captured_cents),
        "reversed": Amount(sale.reversed_cents),
        "state": sale.state.value,
        "trans_id": sale.trans_id or "",
        "last_four": sale.last_four or "",
        "message": sale.message,
        "kind": sale_kind(sale),
        "late_vend": optional_timestamp(late_vend_at) or "",
        "given_back_by_others": "" if sale.later_cents is None else Amount(sale.later_cents),
        "service_status": sale.later_status or "",
        "given_back_by": sale.later_by or "",
        "given_back_at": optional_timestamp(sale.later_at) or "",
    }


def sale_kind(sale: SaleRecord) -> str:
    """``sale``, or ``no_selection`` for a card session that ended with nothing chosen
    (sales.kinds: the one rule)."""
    from kiosk_agent.sales.kinds import SaleKind, no_selection  # on use, as the records are

    return (SaleKind.NO_SELECTION if no_selection(sale) else SaleKind.SALE).value


# A sale's wall times (Unix seconds in the journal); its sent_mono is the monotonic clock's, no
# moment of the calendar, and stays a number of seconds.
SALE_TIMES = ("created_at", "updated_at", "finished_at", "answer_by", "sent_at", "later_at")


def sale_json(sale: SaleRecord) -> dict[str, Any]:
    """A sale of the journal in JSON (``sales show|attention|resolve --json``, ``GET
    /api/sales``, ``GET /api/sales/{id}``): every field, times in ISO 8601 UTC, the
    resolution as an object with its time so too, and its ``kind`` (sales.kinds: ``sale``, or
    ``no_selection`` for a card session that ended with nothing chosen)."""
    data = sale.as_dict()
    data["kind"] = sale_kind(sale)
    for key in SALE_TIMES:
        data[key] = optional_timestamp(data[key])
    resolution = data["resolution"]
    if isinstance(resolution, dict) and isinstance(resolution.get("at"), int | float):
        data["resolution"] = {**resolution, "at": timestamp(resolution["at"])}
    return data


def step_json(step: StepRecord) -> dict[str, Any]:
    """A step of a sale in JSON, beside :func:`sale_json`."""
    return {"at": timestamp(step.at), "step": step.step, "state": step.state.value,
            "detail": step.detail}


# The machine's books per column (``kiosk-agent audit``, ``GET /api/audit``).
AUDIT_COLUMNS = (
    "column",
    "name",
    "price",
    "capacity",
    "sold_since_fill",
    "estimate",
    "low",
    "sold_out",
    "filled_at",
    "last_read",
)


def export_audit(report: Mapping[str, Any], fmt: str) -> Iterator[str]:
    """The machine's books (``audit.ledger.audit_report``) as the one CSV or JSON export:
    ``kiosk-agent audit --format csv|json`` and ``GET /api/audit?format=csv|json`` write this.
    CSV: a line per column; JSON: the whole report, its columns as the CSV's lines."""
    rows = [audit_values(column, report.get("last_read")) for column in report["columns"]]
    if fmt == "json":
        document = {**report, "columns": rows, "last_read": _read_json(report.get("last_read")),
                    "comparisons": [_comparison_json(c) for c in report.get("comparisons", [])],
                    "since": optional_timestamp(report.get("since")),
                    "intervals": [_comparison_json(c) for c in report.get("intervals", [])],
                    "in_all": _in_all_json(report.get("in_all"))}
        yield json.dumps(json_value(document), indent=2) + "\n"
        return
    if fmt != "csv":
        raise ValueError(f"format must be one of {', '.join(SALE_FORMATS)}, got {fmt!r}")
    csv_export = CsvExport(AUDIT_COLUMNS)
    yield csv_export.header()
    for row in rows:
        yield csv_export.row(row)


def _read_json(read: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The last read of the books in JSON: its time in ISO 8601 UTC."""
    return None if read is None else {**read, "at": optional_timestamp(read.get("at"))}


def _comparison_json(comparison: Mapping[str, Any]) -> dict[str, Any]:
    """One comparison of the books with the journal in JSON: its interval's ends and each
    sale's vend in ISO 8601 UTC."""
    return {
        **comparison,
        "since": optional_timestamp(comparison.get("since")),
        "until": optional_timestamp(comparison.get("until")),
        "sales": [{**sale, "vended_at": optional_timestamp(sale.get("vended_at"))}
                  for sale in comparison.get("sales", [])],
    }


def _in_all_json(stretch: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The sums of a stretch's intervals (``reconcile.Intervals.as_dict``) in JSON: each time in
    ISO 8601 UTC."""
    if stretch is None:
        return None

    def spans(key: str) -> list[dict[str, Any]]:
        return [{**span, "since": optional_timestamp(span.get("since")),
                 "until": optional_timestamp(span.get("until"))} for span in stretch.get(key, [])]

    return {**stretch, "since": optional_timestamp(stretch.get("since")),
            "mismatched": spans("mismatched"), "not_checked": spans("not_checked")}


def audit_values(column: Mapping[str, Any], last_read: Mapping[str, Any] | None) -> dict[str, Any]:
    """One column of the machine's books for export."""

    def moment(at: float | None) -> str:
        return "" if at is None else timestamp(at)

    price = column.get("price")
    return {
        "column": column["column"],
        "name": column.get("name") or "",
        "price": Amount(price) if price is not None else None,
        "capacity": column.get("capacity"),
        "sold_since_fill": column.get("sold_since_fill"),
        "estimate": column.get("estimate"),
        "low": bool(column.get("low")),
        "sold_out": bool(column.get("sold_out")),
        "filled_at": moment(column.get("filled_at")),
        "last_read": moment(last_read["at"] if last_read else None),
    }


# -- a machine's audit (EVA-DTS) ----------------------------------------------------------------

AUDIT_PRODUCT_COLUMNS = (
    "selection",
    "name",
    "price",
    "paid_since_init",
    "paid_value_since_init",
    "paid_since_reset",
    "paid_value_since_reset",
    "free_since_init",
    "test_since_init",
)
AUDIT_FORMATS = ("csv", "json")


def export_audit_products(audit: AuditFile, fmt: str) -> Iterator[str]:
    """The columns (products) of a machine's audit as the one CSV or JSON export
    (``kiosk-agent dex parse|read --format csv|json``)."""
    if fmt not in AUDIT_FORMATS:
        raise ValueError(f"format must be one of {', '.join(AUDIT_FORMATS)}, got {fmt!r}")
    rows = (audit_product_values(product, audit.currency) for product in audit.products)
    if fmt == "json":
        json_export = JsonExport()
        yield json_export.start()
        yield from (json_export.row(row) for row in rows)
        yield json_export.end()
        return
    csv_export = CsvExport(AUDIT_PRODUCT_COLUMNS)
    yield csv_export.header()
    yield from (csv_export.row(row) for row in rows)


def audit_product_values(product: Product, currency: str) -> dict[str, object]:
    def amount(cents: int | None) -> Amount | None:
        return None if cents is None else Amount(cents, currency or "USD")

    paid, free, test = product.paid, product.free, product.test
    return {
        "selection": product.column,
        "name": product.name,
        "price": amount(product.price),
        "paid_since_init": paid.count_since_init if paid else None,
        "paid_value_since_init": amount(paid.value_since_init if paid else None),
        "paid_since_reset": paid.count_since_reset if paid else None,
        "paid_value_since_reset": amount(paid.value_since_reset if paid else None),
        "free_since_init": free.count_since_init if free else None,
        "test_since_init": test.count_since_init if test else None,
    }
