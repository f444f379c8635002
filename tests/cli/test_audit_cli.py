"""`kiosk-agent audit` and `audit fill` as a field tech types them, on a journal on disk."""

from __future__ import annotations

import csv
import io
import json
import textwrap
from pathlib import Path

import pytest

from kiosk_agent.audit.ledger import record_read
from kiosk_agent.audit.store import AuditStore
from kiosk_agent.cli import main
from kiosk_agent.sales.journal import Journal
from tests.audit.helpers import MACHINE, figures, vended_sale

CONFIG = """\
service:
  simulator: {time_scale: 300}
terminals: [{device_id: SIM-0001, name: front}]
journal: {path: journal.db}
"""
TEN = 1_764_324_000.0


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(CONFIG))
    return path


@pytest.fixture
def books(tmp_path: Path) -> Journal:
    """A journal with two reads: one vend the journal does not hold, between them."""
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    store = AuditStore(lambda: journal.db)
    store.open()
    record_read(store, figures((3, 450), columns={"A1": (150, 3, 3), "A2": (250, 0, 0)}),
                at=TEN, clean=True, sources=[MACHINE])
    sale = vended_sale(journal, 150)
    record_read(store, figures((5, 750), columns={"A1": (150, 5, 5), "A2": (250, 0, 0)}),
                at=TEN + 3600, clean=True, sources=[MACHINE])
    journal.close()
    journal.sale_id = sale.sale_id  # type: ignore[attr-defined]
    return journal


def test_audit_shows_each_column_the_last_read_and_the_mismatch(
    config: Path, books: Journal, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "-c", str(config)]) == 0
    out = capsys.readouterr().out
    assert "A1" in out
    assert "2 columns" in out
    assert "last read: " in out
    assert "journal: MISMATCH: the machine counted 2 card vends worth $3.00" in out
    assert "the journal holds 1 card vend worth $1.50" in out
    assert books.sale_id in out  # type: ignore[attr-defined]


def test_audit_csv_and_json_are_the_one_export(
    config: Path, books: Journal, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "-c", str(config), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["column"], r["price"], r["sold_since_fill"]) for r in rows] == [
        ("A1", "1.50", "2"), ("A2", "2.50", "0")  # since the first read: never filled
    ]
    assert main(["audit", "-c", str(config), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["columns"][0]["price"] == "1.50"
    assert document["comparisons"][0]["verdict"] == "mismatch"


def test_fill_counts_a_column_again_from_the_last_read(
    config: Path, books: Journal, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "fill", "A1", "-c", str(config), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fills"][0]["column"] == "A1"
    assert main(["audit", "-c", str(config), "--format", "csv"]) == 0
    rows = {r["column"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert rows["A1"]["sold_since_fill"] == "0"
    assert rows["A1"]["filled_at"]


def test_fill_needs_columns_or_all_and_says_so(
    config: Path, books: Journal, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "fill", "-c", str(config)]) == 2
    assert "name the columns refilled, or give --all" in capsys.readouterr().err
    assert main(["audit", "fill", "--all", "-c", str(config)]) == 0
    assert "refill recorded: A1, A2" in capsys.readouterr().out


def test_fill_of_a_column_the_machine_has_not_is_refused_and_records_nothing(
    config: Path, books: Journal, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "fill", "A1", "Z9", "-c", str(config)]) == 2
    err = capsys.readouterr().err
    assert "no column Z9 in the planogram or the last read (columns: A1, A2)" in err
    assert main(["audit", "-c", str(config), "--format", "csv"]) == 0
    assert all(not row["filled_at"] for row in csv.DictReader(io.StringIO(capsys.readouterr().out)))


def test_audit_before_any_read_says_none_yet(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Journal(tmp_path / "journal.db").open()
    assert main(["audit", "-c", str(config)]) == 0
    assert "last read: none yet" in capsys.readouterr().out


def test_one_read_alone_compares_nothing_and_says_so(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    store = AuditStore(lambda: journal.db)
    store.open()
    record_read(store, figures((3, 450)), at=TEN, clean=True, sources=[MACHINE])
    journal.close()
    assert main(["audit", "-c", str(config)]) == 0
    assert "journal: nothing compared yet" in capsys.readouterr().out


@pytest.mark.parametrize("column", ["", " ", "A1 ", "A1\x1b[2J", "A1\u202e"])
def test_a_column_that_is_no_name_is_refused_named_and_nothing_recorded(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], column: str
) -> None:
    """Before any read and with no planogram nothing is known to check a column against: an
    empty name was recorded as a refill (`refill recorded: `), a terminal escape too, printed
    as the terminal's own command; one with a space after it is never the machine's."""
    Journal(tmp_path / "journal.db").open()  # the agent has run: no read yet
    assert main(["audit", "fill", column, "-c", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: column {column!r} is no column name"), err
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    try:
        store = AuditStore(lambda: journal.db)
        store.open()
        assert store.last_fills() == {}
    finally:
        journal.close()



def test_a_machine_reinitialised_is_said_as_the_store_holds_it(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    store = AuditStore(lambda: journal.db)
    store.open()
    record_read(store, figures((40, 6000)), at=TEN, clean=True, sources=[MACHINE])
    vended_sale(journal, 150)
    record_read(store, figures((1, 150)), at=TEN + 3600, clean=True, sources=[MACHINE])
    stored = store.last_comparison()
    journal.close()
    assert stored is not None
    assert stored.cause == "reinitialised"
    assert main(["audit", "-c", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"journal: {stored.text()}" in out
    assert "not compared at 2025-11-28 11:00:00Z" in out
    assert "changed: DA2 cashless since initialisation went down" in out
