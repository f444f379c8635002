"""The benches run without the test tree: none imports ``tests`` (what they share with the
tests is bench/_support.py), and none keeps its own copy of what bench/_support.py holds
(``free_port``), read from their code with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SHARED = "_support.py"  # the one place a bench's shared helper is defined
SHARED_NAMES = ("free_port",)  # what the benches import from it, never define again


def imports_of_the_test_tree(source: str, name: str = "<test>") -> list[str]:
    """Each import of the test tree in ``source`` (``import tests...``, ``from tests...``)."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
        found += [f"{name}:{node.lineno}: {n}" for n in names
                  if n == "tests" or n.startswith("tests.")]
    return found


def own_copies_of_shared_helpers(source: str, name: str = "<test>") -> list[str]:
    """Each function in ``source``, at any depth, named like a helper of bench/_support.py."""
    return [
        f"{name}:{node.lineno}: def {node.name}"
        for node in ast.walk(ast.parse(source, name))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in SHARED_NAMES
    ]


def benches() -> list[Path]:
    found = sorted(BENCH.glob("*.py"))
    assert len(found) > 5  # the folder is really there
    return found


def test_no_bench_imports_the_test_tree() -> None:
    offenders = [
        hit for path in benches() for hit in imports_of_the_test_tree(path.read_text(), path.name)
    ]
    assert not offenders, offenders


def test_no_bench_defines_its_own_free_port() -> None:
    assert own_copies_of_shared_helpers((BENCH / SHARED).read_text(), SHARED)  # the one copy
    offenders = [
        hit for path in benches() if path.name != SHARED
        for hit in own_copies_of_shared_helpers(path.read_text(), path.name)
    ]
    assert not offenders, f"import it from bench/_support.py instead: {offenders}"


def test_the_reading_finds_both_forms_of_import_at_any_depth() -> None:
    source = "import tests.helpers\ndef f():\n    from tests.faketime import SteppedClock\n"
    assert imports_of_the_test_tree(source) == [
        "<test>:1: tests.helpers", "<test>:3: tests.faketime"
    ]
    clean = "import testsuite\nfrom bench._support import free_port\n"
    assert imports_of_the_test_tree(clean) == []


def test_the_reading_finds_a_copy_of_free_port_at_any_depth() -> None:
    source = (
        "def free_port() -> int:\n    return 0\n"
        "class Broker:\n    async def free_port(self) -> int:\n        return 0\n"
    )
    assert own_copies_of_shared_helpers(source) == [
        "<test>:1: def free_port", "<test>:4: def free_port"
    ]
    clean = "from _support import free_port\nport = free_port()\ndef free_ports(): pass\n"
    assert own_copies_of_shared_helpers(clean) == []


def test_the_sale_steps_bench_counts_a_charge_card_sales_statements_and_commits(
    tmp_path: Path,
) -> None:
    """bench/sale_steps.py's sale is the kiosk API's charge_card sale as the journal takes it:
    four commits (the promise's least) and 21 statements; a write that reads back, or a commit
    more, shows here before it shows in a sale's CPU."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sale_steps", BENCH / "sale_steps.py")
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    context, journal = bench.make_context(tmp_path)
    try:
        assert bench.counted(context, journal) == (21, 4)
        [sale] = journal.db.execute("SELECT state, captured_cents FROM sales").fetchall()
        assert tuple(sale) == ("completed", 250)
        assert bench.cpu_per_sale(context, sales=2, rounds=1) > 0
    finally:
        journal.close()


def _mounted(point: Path) -> bool:
    return any(line.split()[1] == str(point)
               for line in Path("/proc/self/mounts").read_text().splitlines())


def test_a_tmpfs_left_by_a_killed_process_is_given_back_and_a_live_ones_kept(
    tmp_path: Path,
) -> None:
    """A test run killed mid-test (a timeout, SIGKILL) never reaches its unmount: the next run
    finds the mount's owner gone and unmounts it; another run's mount, still in use, stays."""
    import os
    import subprocess
    import sys

    from bench._support import mount_tmpfs, release_leaked_mounts

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    orphan = tmp_path / "orphan"
    # a process that mounts, then is killed before its block ends
    code = ("import os, sys; from pathlib import Path; from bench._support import mount_tmpfs\n"
            f"mounted = mount_tmpfs(Path({str(orphan)!r}), 'size=1m'); mounted.__enter__()\n"
            "os._exit(0)  # no finally, as after SIGKILL")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])
    assert _mounted(orphan)
    with mount_tmpfs(tmp_path / "in-use", "size=1m") as in_use:
        foreign = tmp_path / "foreign"  # mounted by hand: no owner recorded, not ours to touch
        foreign.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(foreign)], check=True)
        try:
            assert release_leaked_mounts(tmp_path) == [orphan]
            assert not _mounted(orphan)
            assert _mounted(in_use)
            assert _mounted(foreign)
        finally:
            subprocess.run(["umount", str(foreign)], check=True)
    assert not _mounted(in_use)
