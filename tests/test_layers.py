"""The packages' layers as docs/architecture.md draws them, read from the code's imports (``ast``):
no circle between packages, nothing below the command line imports the simulator, nothing but
the command line imports fleet, and platforms take from sales only the dispenser's types."""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import kiosk_agent

PACKAGE = Path(kiosk_agent.__file__).parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"

# Circles another branch is taking apart, each with where and who: a circle gone must leave
# this list (test_a_known_circle_still_exists), a new one fails.
KNOWN_CIRCLES: dict[frozenset[str], str] = {}

# What a platform may take from the sale domain: the dispenser's contract and the refusals a
# sale's start answers with (the kiosk API says them to its caller).
SALES_FOR_PLATFORMS = {"kiosk_agent.sales.model", "kiosk_agent.sales.clock"}
SALE_REFUSALS = {
    ("kiosk_agent.sales.runner", "STOPPING"), ("kiosk_agent.sales.runner", "AgentStopping"),
    ("kiosk_agent.sales.runner", "TerminalBusy"), ("kiosk_agent.sales.settings", "UnknownTerminal"),
    ("kiosk_agent.sales.journal", "JournalError"),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Import:
    where: str  # kiosk_agent/path.py:line
    importer: str  # the importing module, dotted
    module: str  # the imported module, dotted
    name: str | None  # ``from module import name``; None for ``import module``

    @property
    def source(self) -> str:
        return package_of(self.importer)

    @property
    def target(self) -> str:
        return package_of(self.module)


def package_of(module: str) -> str:
    """``kiosk_agent.sales.runner`` -> ``sales``; a top module (``kiosk_agent.app``) is its own."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_in(source: str, importer: str, where: str = "<test>") -> Iterator[Import]:
    """Every import of a kiosk_agent module, at any depth (inside functions, TYPE_CHECKING)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(f"{where}:{node.lineno}", importer, alias.name, None)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                yield Import(f"{where}:{node.lineno}", importer, node.module, alias.name)


@functools.cache  # the tree does not change during a run: read once, not once a test
def project_imports() -> tuple[Import, ...]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE.parent))
        found += [i for i in imports_in(path.read_text(), module_of(path), where)
                  if i.module.startswith("kiosk_agent.") and i.source != i.target]
    return tuple(found)


def package_graph(imports: Iterable[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for i in imports:
        graph[i.source].add(i.target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected groups of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(frozenset(group))

    for node in sorted({*graph, *(t for ts in graph.values() for t in ts)}):
        if node not in index:
            visit(node)
    return found


def test_no_circle_between_packages() -> None:
    found = circles(package_graph(project_imports()))
    new = [sorted(group) for group in found if group not in KNOWN_CIRCLES]
    assert not new, new


def test_a_known_circle_still_exists() -> None:
    found = circles(package_graph(project_imports()))
    gone = [sorted(group) for group in KNOWN_CIRCLES if group not in found]
    assert not gone, f"no longer a circle, take it off KNOWN_CIRCLES: {gone}"


def test_nothing_below_the_command_line_imports_the_simulator() -> None:
    offenders = [i.where for i in project_imports()
                 if i.target == "sim" and i.source not in {"cli", "__main__"}]
    assert not offenders, offenders


def test_only_the_command_line_imports_fleet() -> None:
    # the upstream section's schema, component and doctor checks are found by name (config's
    # SECTION_OWNERS) and register themselves
    offenders = [i.where for i in project_imports() if i.target == "fleet" and i.source != "cli"]
    assert not offenders, offenders


def test_platforms_take_from_sales_only_the_dispensers_types() -> None:
    offenders = [
        f"{i.where}: {i.module} {i.name}"
        for i in project_imports()
        if i.source == "platforms" and i.target == "sales"
        and i.module not in SALES_FOR_PLATFORMS and (i.module, i.name) not in SALE_REFUSALS
    ]  # fmt: skip
    assert not offenders, offenders


def test_core_is_gone() -> None:
    # a checkout updated in place may keep core/__pycache__; what counts is the code
    assert not list((PACKAGE / "core").glob("*.py"))
    assert not [i.where for i in project_imports() if i.target == "core"]


def test_every_package_has_its_line_in_the_architecture_picture() -> None:
    picture = ARCHITECTURE.read_text().split("```", 2)[1]
    drawn = set(re.findall(r"^  (\w+)(?:/|\.py)", picture, re.MULTILINE))
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem not in {"__init__", "__main__"}}
    assert packages | modules <= drawn, sorted((packages | modules) - drawn)
    assert drawn <= packages | modules, sorted(drawn - (packages | modules))


# -- the checks find what they look for ---------------------------------------------------------


def test_the_reading_finds_imports_inside_functions_and_type_checking_blocks() -> None:
    source = """
from typing import TYPE_CHECKING
import kiosk_agent.money
if TYPE_CHECKING:
    from kiosk_agent.sim.server import SimServer
def f():
    from kiosk_agent.fleet import mqtt
"""
    found = {(i.module, i.name) for i in imports_in(source, "kiosk_agent.app")}
    assert ("kiosk_agent.sim.server", "SimServer") in found
    assert ("kiosk_agent.fleet", "mqtt") in found
    assert ("kiosk_agent.money", None) in found


def test_a_circle_of_three_is_found_and_a_line_is_not() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert circles({"a": {"b"}, "b": {"c"}}) == []
