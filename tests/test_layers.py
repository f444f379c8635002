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

# What a platform may take from the sale domain: the dispenser's contract (the request, the
# outcome, the choice, the refusals a sale's start answers with) and the sale's clock.
SALES_FOR_PLATFORMS = {"kiosk_agent.sales.model", "kiosk_agent.sales.clock"}


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
        if i.source == "platforms" and i.target == "sales" and i.module not in SALES_FOR_PLATFORMS
    ]
    assert not offenders, offenders


# The timers a platform may arm, each a fact of its hardware or of its link, not a sale's: a
# sale's deadlines (the vend, the card-first choice) are armed in sales/ (SaleSettings's
# *_for rules, the flows' waits) and a platform only reports what its machine said.
PLATFORM_TIMERS: dict[tuple[str, str], str] = {
    ("gpio", "_Drop.dispense"): "the drop sensor's window: a product falls within it after the "
    "relay's pulse or did not come out (FAILED); the sale's vend timeout still bounds it",
    ("gpio", "GpioKiosk.pulse"): "the relay's physical pulse",
    ("gpio", "GpioKiosk.stop"): "a relay pulsing or a sensor watching finishes before the lines "
    "are let go",
    ("serial", "SerialLink._run"): "the link's reconnect backoff",
    ("serial", "SerialLink._heard_within"): "the link's silence watchdog (silence_timeout, "
    "probe), on the link's clock",
    ("serial", "SerialLink._close_transport"): "the port's close, waited for at most 5 s",
    ("serial_doctor", "check_port_urls"): "the doctor's TCP connect to a socket:// port, "
    "bounded by the doctor's own time limit (no sale runs through it)",
    ("virtual", "VirtualPlatform.stop"): "the simulated customer finishing on stop",
}
# What arms a timer: a call of one of these names, or any call given a ``timeout=``
TIMER_CALLS = {"sleep", "wait_for", "timeout", "timeout_at", "call_later", "call_at", "wait_event"}


def timers_in(source: str) -> Iterator[tuple[str, int]]:
    """Each timer armed in ``source``: the qualified name of the function it is in, its line.
    ``sleep(0)`` arms none (a yield to the loop)."""

    def visit(node: ast.AST, scope: tuple[str, ...]) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                yield from visit(child, (*scope, child.name))
                continue
            if isinstance(child, ast.Call) and _arms_a_timer(child):
                yield ".".join(scope), child.lineno
            yield from visit(child, scope)

    yield from visit(ast.parse(source), ())


def _arms_a_timer(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if any(k.arg == "timeout" for k in call.keywords):
        return True
    if name == "sleep" and call.args and isinstance(call.args[0], ast.Constant):
        return call.args[0].value != 0
    return name in TIMER_CALLS


def platform_timers() -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = defaultdict(list)
    for path in sorted((PACKAGE / "platforms").glob("*.py")):
        for function, line in timers_in(path.read_text()):
            found[(path.stem, function)].append(line)
    return found


def test_platforms_arm_no_timer_but_their_hardwares_and_links() -> None:
    offenders = [f"platforms/{module}.py:{lines[0]} {function}"
                 for (module, function), lines in platform_timers().items()
                 if (module, function) not in PLATFORM_TIMERS]  # fmt: skip
    assert not offenders, f"a platform arms a timer; a sale's belongs in sales/: {offenders}"


def test_every_allowed_platform_timer_is_still_there() -> None:
    gone = sorted(set(PLATFORM_TIMERS) - set(platform_timers()))
    assert not gone, f"no longer arms a timer, take it off PLATFORM_TIMERS: {gone}"


def test_the_timer_reading_finds_what_arms_one_and_nothing_else() -> None:
    source = """
import asyncio
class Session:
    async def choose(self):
        await self.clock.wait_for(self.selection, self.timeout)
    async def yield_(self):
        await asyncio.sleep(0)
    async def pause(self):
        await self.clock.sleep(0.2)
    def later(self):
        loop.call_later(5, self.fire)
        def inner():
            asyncio.wait(tasks, timeout=3)
    async def bounded(self):
        async with asyncio.timeout(2):
            pass
"""
    assert list(timers_in(source)) == [
        ("Session.choose", 5), ("Session.pause", 9), ("Session.later", 11),
        ("Session.later.inner", 13), ("Session.bounded", 15),
    ]


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
