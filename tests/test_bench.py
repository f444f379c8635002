"""The benches run without the test tree: none imports ``tests`` (what they share with the
tests is bench/_support.py), read from their code with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def imports_of_the_test_tree(source: str, name: str = "<test>") -> list[str]:
    """Each import of the test tree in ``source`` (``import tests...``, ``from tests...``)."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
        found += [f"{name}:{node.lineno}: {n}" for n in names
                  if n == "tests" or n.startswith("tests.")]
    return found


def test_no_bench_imports_the_test_tree() -> None:
    benches = sorted(BENCH.glob("*.py"))
    assert len(benches) > 5  # the folder is really there
    offenders = [
        hit for path in benches for hit in imports_of_the_test_tree(path.read_text(), path.name)
    ]
    assert not offenders, offenders


def test_the_reading_finds_both_forms_of_import_at_any_depth() -> None:
    source = "import tests.helpers\ndef f():\n    from tests.faketime import SteppedClock\n"
    assert imports_of_the_test_tree(source) == [
        "<test>:1: tests.helpers", "<test>:3: tests.faketime"
    ]
    clean = "import testsuite\nfrom bench._support import free_port\n"
    assert imports_of_the_test_tree(clean) == []
