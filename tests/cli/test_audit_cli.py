"""`kiosk-agent audit` and `audit fill` as a field tech types them, on a journal on disk."""

from __future__ import annotations

import csv
import datetime as dt
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
    # a mismatch in the window: exit 1, as `sales attention` with a sale waiting
    assert main(["audit", "-c", str(config), "--since", "2025-11-28"]) == 1
    out = capsys.readouterr().out
    assert "A1" in out
    assert "2 columns" in out
    assert "last read: " in out
    assert ("  2025-11-28 10:00:00Z to 11:00:00Z  MISMATCH: the machine counted 2 card vends "
            "worth $3.00; the journal holds 1 card vend worth $1.50") in out
    assert books.sale_id in out  # type: ignore[attr-defined]
    # by default the intervals of the last day (dex: mismatch_shown): this one is older
    assert main(["audit", "-c", str(config)]) == 0
    out = capsys.readouterr().out
    assert "journal: no interval ended since " in out
    assert ("; the latest, until 2025-11-28 11:00:00Z: 2025-11-28 10:00:00Z to 11:00:00Z  "
            "MISMATCH") in out


def test_audit_csv_and_json_are_the_one_export(
    config: Path, books: Journal, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "-c", str(config), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["column"], r["price"], r["sold_since_fill"]) for r in rows] == [
        ("A1", "1.50", "2"), ("A2", "2.50", "0")  # since the first read: never filled
    ]
    assert main(["audit", "-c", str(config), "--json", "--since", "2025-11-28T10:30:00Z"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["columns"][0]["price"] == "1.50"
    assert document["comparisons"][0]["verdict"] == "mismatch"
    assert document["since"] == "2025-11-28T10:30:00Z"
    assert [c["verdict"] for c in document["intervals"]] == ["mismatch"]
    assert document["in_all"]["mismatched"] == [
        {"since": "2025-11-28T10:00:00Z", "until": "2025-11-28T11:00:00Z", "verdict": "mismatch",
         "cause": ""}]


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



def test_the_machines_books_reset_are_said_as_the_store_holds_them(
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
    assert (stored.verdict, stored.cause) == ("books_reset", "reinitialised")
    assert main(["audit", "-c", str(config), "--since", "2025-11-28"]) == 0  # no mismatch
    out = capsys.readouterr().out
    assert ("  2025-11-28 10:00:00Z to 11:00:00Z  books reset: its DA2 (cashless) since "
            "initialisation went down (40 worth $60.00 -> 1 worth $1.50); the journal holds 1 "
            "card vend worth $1.50, not checked") in out
    assert ("in all, 1 interval from 2025-11-28 10:00:00Z to 11:00:00Z: none compared; not "
            "checked: 1 interval (2025-11-28 10:00:00Z to 11:00:00Z, the machine's books reset), "
            "the journal's 1 card vend worth $1.50 of them outside these sums") in out
    assert "changed: DA2 cashless since initialisation went down" in out


def test_audit_tells_every_interval_of_a_stretch_and_their_sums_as_the_journal_holds_them(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run's story as a person reads it: four intervals in the last hour (a match, a vend the
    journal lacks, the machine's books reset, a match from the new baseline); each said with
    its verdict, and the sums against the journal's rows, the mismatch named beside them."""
    import time
    from decimal import Decimal

    start = time.time() - 3600
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    store = AuditStore(lambda: journal.db)
    store.open()
    # the machine's DA2 since initialisation at each read, as its audit file says it
    da2 = [(10, 1500), (12, 1800), (14, 2100), (1, 150), (2, 300)]
    held = [[150, 150], [150], [150], [150]]  # the journal's vended sales between reads
    record_read(store, figures(da2[0]), at=start, clean=True, sources=[MACHINE])
    ids: list[list[str]] = []
    for n, cents in enumerate(held, start=1):
        ids.append([vended_sale(journal, c).sale_id for c in cents])
        record_read(store, figures(da2[n]), at=start + 600 * n, clean=True, sources=[MACHINE])
    rows = journal.db.execute("SELECT sale_id, vended_cents FROM sales WHERE source = ?",
                              (MACHINE,)).fetchall()
    journal.close()

    assert main(["audit", "-c", str(config), "--json"]) == 1  # a mismatch within the day
    document = json.loads(capsys.readouterr().out)
    intervals, in_all = document["intervals"], document["in_all"]
    assert [c["verdict"] for c in intervals] == ["match", "mismatch", "books_reset", "match"]
    assert [[s["sale_id"] for s in c["sales"]] for c in intervals] == ids
    # the machine's side: its DA2 differences over the intervals compared (not the reset's)
    machine = [(da2[n + 1][0] - da2[n][0], da2[n + 1][1] - da2[n][1]) for n in (0, 1, 3)]
    assert (in_all["machine"]["count"], in_all["machine"]["value"]) == (
        sum(m[0] for m in machine), sum(m[1] for m in machine))
    # the journal's side: its rows, summed as Decimal, the reset's interval apart
    by_id = {r[0]: Decimal(r[1]) / 100 for r in rows}
    compared = [i for n in (0, 1, 3) for i in ids[n]]
    assert Decimal(in_all["journal"]["value"]) / 100 == sum(by_id[i] for i in compared)
    assert in_all["journal"]["count"] == len(compared)
    assert Decimal(in_all["journal_not_checked"]["value"]) / 100 == sum(by_id[i] for i in ids[2])
    assert in_all["verdict"] == "mismatch"
    assert [(m["since"], m["until"]) for m in in_all["mismatched"]] == [
        (intervals[1]["since"], intervals[1]["until"])]
    assert [(m["verdict"], m["until"]) for m in in_all["not_checked"]] == [
        ("books_reset", intervals[2]["until"])]

    # the table: a line per interval, then the sums, the mismatch named beside them
    assert main(["audit", "-c", str(config)]) == 1
    out = capsys.readouterr().out.splitlines()
    head = out.index(next(line for line in out if line.startswith("journal against")))
    lines = out[head + 1:]
    assert [line.split("  ")[2].split(":")[0] for line in lines[:4]] == [
        "match", "MISMATCH", "books reset", "match"]
    assert ids[1][0] in lines[1]
    assert lines[4].startswith("in all, 4 intervals from ")
    assert "the machine counted 5 card vends worth $7.50; the journal holds 4 card vends worth " \
        "$6.00; MISMATCH in 1 interval: " in lines[4]
    assert lines[4].endswith("the journal's 1 card vend worth $1.50 of them outside these sums")

    # --since after the mismatch: only the intervals that ended since, none mismatched
    since = dt.datetime.fromtimestamp(start + 1500, dt.UTC).isoformat()
    assert main(["audit", "-c", str(config), "--json", "--since", since]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [c["verdict"] for c in document["intervals"]] == ["books_reset", "match"]
    assert document["in_all"]["verdict"] == "not_checked"
    # a --since that is no moment is the contract's usage error
    assert main(["audit", "-c", str(config), "--since", "last tuesday"]) == 2
    assert capsys.readouterr().err.startswith("error: --since: ")


def test_sales_before_the_first_clean_read_are_said_in_no_interval_never_dropped(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A first read that met a sale is no boundary: the sales vended before the next clean
    read belong to no interval. The stretch says so, with the journal's side, rather than sums
    that begin later as if the stretch had no sale before."""
    import time
    from decimal import Decimal

    start = time.time() - 3600
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    store = AuditStore(lambda: journal.db)
    store.open()
    record_read(store, figures((0, 0)), at=start, clean=False, sources=[MACHINE])  # met a sale
    early = [vended_sale(journal, c).sale_id for c in (150, 250)]
    record_read(store, figures((2, 400)), at=start + 600, clean=True, sources=[MACHINE])
    later = vended_sale(journal, 150).sale_id
    record_read(store, figures((3, 550)), at=start + 1200, clean=True, sources=[MACHINE])
    cents = dict(journal.db.execute("SELECT sale_id, vended_cents FROM sales").fetchall())
    journal.close()
    config.write_text(config.read_text() + "triggers: [{platform: virtual, name: snacks}]\n"
                      "dex: {port: virtual:snacks, trigger: snacks}\n")

    assert main(["audit", "-c", str(config), "--json", "--since", "2h"]) == 0
    in_all = json.loads(capsys.readouterr().out)["in_all"]
    assert in_all["before"] == early
    assert Decimal(in_all["journal_before"]["value"]) / 100 == sum(
        Decimal(cents[i]) / 100 for i in early)
    assert (in_all["journal"]["count"], in_all["verdict"]) == (1, "not_checked")
    assert cents[later] == in_all["journal"]["value"]
    assert main(["audit", "-c", str(config), "--since", "2h"]) == 0
    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if line.startswith("in all, 1 interval from ")]
    assert line.endswith(
        "Z: the journal's 2 card vends worth $4.00 in no interval (vended before a read taken "
        "while no sale of the machine ran)"), line
    assert "; before 20" in line


def test_a_column_with_no_refill_recorded_says_what_its_figures_count_from(
    config: Path, books: Journal, capsys: pytest.CaptureFixture[str]
) -> None:
    """`FILLED never` after a demo read as a machine never filled, though its machine starts
    full: the cell says no refill was recorded, and a line what SOLD and LEFT count from."""
    assert main(["audit", "-c", str(config)]) == 0
    out = capsys.readouterr().out
    [a1] = [line for line in out.splitlines() if line.startswith("A1 ")]
    assert a1.endswith("  not recorded")
    assert "never" not in out
    assert ("FILLED: the last refill recorded (`kiosk-agent audit fill`; the demo's machine "
            "records one when every column is sold out); not recorded: SOLD and LEFT count from "
            "the first read, the column taken as full then") in out
    # every column refilled: each its time, and no such line
    assert main(["audit", "fill", "--all", "-c", str(config)]) == 0
    capsys.readouterr()
    assert main(["audit", "-c", str(config)]) == 0
    out = capsys.readouterr().out
    assert "not recorded" not in out
    assert "FILLED: " not in out
    [a1] = [line for line in out.splitlines() if line.startswith("A1 ")]
    assert a1.split()[-1].endswith("Z")
