"""The figures the unit keeps of a parsed audit file: real files and written ones."""

from __future__ import annotations

from pathlib import Path

from kiosk_agent.audit import parse_audit, render_audit
from kiosk_agent.audit.books import Count, Counter, Figures, figures_of

DATA = Path(__file__).parent.parent / "data" / "dex"


def test_a_real_files_cashless_cash_and_columns() -> None:
    figures = figures_of(parse_audit((DATA / "jofemar.txt").read_bytes()))
    assert figures.cashless == Counter(Count(41, 15250), Count(41, 15250))
    assert figures.cash is not None
    assert figures.cash.since_init == Count(382, 128250)
    column = figures.columns["10"]
    assert (column.price, column.cashless) == (750, Counter(Count(1, 750), Count(1, 750)))


def test_a_written_file_for_device_two() -> None:
    data = render_audit([
        ("ID1", "VM-7"), ("VA1", "450", "3", "450", "3"), ("DA2", "150", "1"),
        ("DB2", "300", "2", "300", "2"), ("PA1", "A1", "150", "Water "), ("PA2", "3", "450"),
        ("PA7", "A1", "DB", "0", "150", "2", "300"),
    ])
    figures = figures_of(parse_audit(data), "DB")
    assert figures.machine == "VM-7"
    assert figures.cashless == Counter(Count(2, 300), Count(2, 300))
    assert figures.columns["A1"].name == "Water"
    assert figures.columns["A1"].cashless == Counter(Count(2, 300))
    assert Figures.of(figures.as_dict()) == figures
