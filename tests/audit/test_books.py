"""The figures the unit keeps of a parsed audit file: real files and written ones."""

from __future__ import annotations

from pathlib import Path

from kiosk_agent.audit import parse_audit, render_audit
from kiosk_agent.audit.books import Figures, figures_of
from kiosk_agent.audit.evadts import Counters, Tally

DATA = Path(__file__).parent.parent / "data" / "dex"


def test_a_real_files_cashless_cash_and_columns() -> None:
    figures = figures_of(parse_audit((DATA / "jofemar.txt").read_bytes()))
    assert figures.cashless == Counters(Tally(41, 15250), Tally(41, 15250))
    assert figures.cash is not None
    assert figures.cash.since_init == Tally(382, 128250)
    column = figures.columns["10"]
    assert (column.price, column.cashless) == (750, Counters(Tally(1, 750), Tally(1, 750)))


def test_a_written_file_for_device_two() -> None:
    data = render_audit([
        ("ID1", "VM-7"), ("VA1", "450", "3", "450", "3"), ("DA2", "150", "1"),
        ("DB2", "300", "2", "300", "2"), ("PA1", "A1", "150", "Water "), ("PA2", "3", "450"),
        ("PA7", "A1", "DB", "0", "150", "2", "300"),
    ])
    figures = figures_of(parse_audit(data), "DB")
    assert figures.machine == "VM-7"
    assert figures.cashless == Counters(Tally(2, 300), Tally(2, 300))
    assert figures.columns["A1"].name == "Water"
    assert figures.columns["A1"].cashless == Counters(Tally(2, 300))
    assert Figures.of(figures.as_dict()) == figures


def test_a_stored_reads_json_reads_back_the_same() -> None:
    """The figures' JSON as this release's reads stored it (before one counter type served the
    reader and the books): read back, and written again unchanged."""
    stored = {
        "machine": "VM-7",
        "currency": "USD",
        "paid": {"since_init": {"count": 3, "value": 450}, "since_reset": None},
        "cash": None,
        "cashless": {
            "since_init": {"count": 2, "value": 300},
            "since_reset": {"count": 1, "value": 150},
        },
        "columns": {
            "A1": {
                "price": 150,
                "name": "Water",
                "paid": {"since_init": {"count": 3, "value": 450}, "since_reset": None},
                "cashless": None,
            }
        },
    }
    figures = Figures.of(stored)
    assert figures.cashless == Counters(Tally(2, 300), Tally(1, 150))
    assert figures.as_dict() == stored
    parsed = figures_of(parse_audit(render_audit([("ID1", "VM-7"), ("DA2", "300", "2")])))
    assert parsed.as_dict()["cashless"] == {
        "since_init": {"count": 2, "value": 300},
        "since_reset": None,
    }
