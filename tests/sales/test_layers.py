"""The sale domain stands on its own: it imports the service client and the leaf modules only."""

from __future__ import annotations

import ast
from pathlib import Path

import kiosk_agent.sales

SALES = Path(kiosk_agent.sales.__file__).parent
FORBIDDEN = ("kiosk_agent.core", "kiosk_agent.platforms", "kiosk_agent.admin", "kiosk_agent.cli",
             "kiosk_agent.sim", "kiosk_agent.app")


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_sales_never_imports_the_assembly_or_the_hardware() -> None:
    offenders = {
        f"{path.name}: {name}"
        for path in SALES.glob("*.py")
        for name in imports_of(path)
        if name.startswith(FORBIDDEN)
    }
    assert not offenders, sorted(offenders)
    assert len(list(SALES.glob("*.py"))) > 5  # the package is really there
