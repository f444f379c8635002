"""`pytest --costs=N` (tests/costs.py): what it lists, on made-up figures."""

from __future__ import annotations

from tests.costs import Costs, listing


def test_the_listing_ranks_by_waiting_by_cpu_and_by_writing_then_sums_each_directory() -> None:
    seen = {
        "tests/sales/test_a.py::waits": Costs(wall_s=9.0, cpu_s=0.5, written_bytes=0),
        "tests/sales/test_a.py::computes": Costs(wall_s=4.0, cpu_s=3.9, written_bytes=0),
        "tests/admin/test_b.py::writes": Costs(wall_s=1.0, cpu_s=0.2, written_bytes=8_000_000),
        "tests/test_c.py::cheap": Costs(wall_s=0.1, cpu_s=0.1, written_bytes=1_000),
    }

    lines = listing(seen, 2)

    blocks = "\n".join(lines).split("\n\n")
    assert len(blocks) == 4, lines  # waited, CPU, written, totals
    names = [[line.split()[-1] for line in block.splitlines()] for block in blocks]
    assert names[0][1:] == ["tests/sales/test_a.py::waits", "tests/admin/test_b.py::writes"]
    assert names[1] == ["tests/sales/test_a.py::computes", "tests/sales/test_a.py::waits"]
    assert names[2] == ["tests/admin/test_b.py::writes", "tests/test_c.py::cheap"]
    totals = blocks[3].splitlines()
    assert [t.split("  ")[-1] for t in totals] == [
        "tests/*.py (1 tests)", "tests/admin (1 tests)", "tests/sales (2 tests)", "all (4 tests)",
    ]
    sales = totals[2].split()
    assert [float(x) for x in sales[:3]] == [13.0, 4.4, 8.6]  # wall, CPU, waited
