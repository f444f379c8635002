"""./dev test's one-time rewrite of the test modules writes what pytest's own collection writes.

The rewrite calls pytest's internals (``_rewrite_test``, ``_write_pyc``) instead of a collection;
a pytest whose internals changed must still find these files valid and identical, or every
xdist worker would rewrite all the test modules again for itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rewritten(project: Path) -> dict[str, bytes]:
    """Every pytest-rewritten module under ``project/tests``, by path."""
    return {
        str(pyc.relative_to(project)): pyc.read_bytes()
        for pyc in (project / "tests").rglob("__pycache__/*-pytest-*.pyc")
    }


def a_project(root: Path) -> Path:
    tests = root / "tests"
    (tests / "sub").mkdir(parents=True)
    (root / "pyproject.toml").write_text("")
    (tests / "conftest.py").write_text("LIMIT = 3\n")
    (tests / "test_sums.py").write_text(
        "def test_sum():\n    assert 1 + 1 == 2, 'arithmetic'\n"
    )
    # a directory of test modules alone: no helper module's bytecode makes its __pycache__ first
    (tests / "sub" / "test_lists.py").write_text(
        "def test_list():\n    found = [1, 2]\n    assert found == [1, 2]\n"
    )
    (tests / "helpers.py").write_text("WANTED = [1, 2]\n")
    return root


def test_the_one_time_rewrite_writes_what_pytests_collection_writes(tmp_path: Path) -> None:
    project = a_project(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    script = (  # no pytest in VENV: the collection it falls back on would hide a failure
        f'source <(sed "/^cmd=/,\\$d" {ROOT / "dev"}); '
        f'VENV={project / "no-venv"}; PY={sys.executable}; rewrite_tests_once'
    )
    subprocess.run(["bash", "-c", script], cwd=project, env=env, check=True,
                   capture_output=True, timeout=60)
    ours = rewritten(project)
    assert any(p.name.startswith("helpers.") for p in (project / "tests/__pycache__").iterdir())

    for pyc in (project / "tests").rglob("__pycache__/*-pytest-*.pyc"):
        pyc.unlink()
    subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-p", "no:hypothesispytest"],
        cwd=project, env=env, check=True, capture_output=True, timeout=60,
    )

    assert sorted(ours) == [
        "tests/__pycache__/conftest" + suffix(),
        "tests/__pycache__/test_sums" + suffix(),
        "tests/sub/__pycache__/test_lists" + suffix(),
    ]
    assert rewritten(project) == ours  # byte for byte


def suffix() -> str:
    import pytest

    return f".{sys.implementation.cache_tag}-pytest-{pytest.__version__}.pyc"
