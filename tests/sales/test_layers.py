"""The sale domain stands on its own: it imports the service client and the leaf modules only."""

from __future__ import annotations

import ast
from pathlib import Path

import kiosk_agent.sales

SALES = Path(kiosk_agent.sales.__file__).parent
FORBIDDEN = ("kiosk_agent.assembly", "kiosk_agent.platforms", "kiosk_agent.admin",
             "kiosk_agent.cli", "kiosk_agent.sim", "kiosk_agent.app", "kiosk_agent.health",
             "kiosk_agent.config", "kiosk_agent.fleet", "kiosk_agent.doctor", "kiosk_agent.audit")


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


# What reads or waits on a real clock. Inside sales/ only clock.py may: every other module
# takes the injected clock (SaleContext.clock, Journal.clock), so a FakeClock moves them all.
REAL_TIME = {
    ("time", "time"), ("time", "time_ns"), ("time", "monotonic"), ("time", "monotonic_ns"),
    ("time", "perf_counter"), ("time", "perf_counter_ns"), ("time", "localtime"),
    ("time", "gmtime"), ("asyncio", "sleep"), ("asyncio", "wait_for"), ("asyncio", "timeout"),
    ("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"), ("date", "today"),
}  # fmt: skip


def real_time_reads(source: str, name: str = "<test>") -> list[str]:
    """Each ``module.attribute`` of :data:`REAL_TIME` the source reaches (``dt.datetime.now``
    counts as ``datetime.now``; ``from time import monotonic`` as ``time.monotonic``)."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Attribute):
            owner = node.value
            owner_name = (owner.id if isinstance(owner, ast.Name)
                          else owner.attr if isinstance(owner, ast.Attribute) else "")
            if (owner_name, node.attr) in REAL_TIME:
                found.append(f"{name}:{node.lineno}: {owner_name}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in {"time", "asyncio", "datetime"}:
            found += [f"{name}:{node.lineno}: from {node.module} import {alias.name}"
                      for alias in node.names if (node.module, alias.name) in REAL_TIME]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
            node.func.attr == "time" and isinstance(node.func.value, ast.Call)
        ):  # get_running_loop().time(): the loop's monotonic clock
            found.append(f"{name}:{node.lineno}: loop.time()")
    return found


def test_only_the_clock_module_reads_a_real_clock_in_sales() -> None:
    offenders = [
        read
        # fake_clock.py: the tests' clock, moved out of clock.py (its wait_for's timeout)
        for path in SALES.glob("*.py") if path.name not in ("clock.py", "fake_clock.py")
        for read in real_time_reads(path.read_text(), path.name)
    ]  # fmt: skip
    assert not offenders, offenders


def test_the_real_clock_check_finds_each_way_of_reading_one() -> None:
    source = """
import time, asyncio
import datetime as dt
from time import monotonic
a = time.time(); b = time.monotonic(); c = dt.datetime.now(dt.UTC)
async def f():
    await asyncio.sleep(1)
    asyncio.get_running_loop().time()
"""
    assert len(real_time_reads(source)) == 6
    assert real_time_reads("x = clock.time(); y = self.clock.monotonic()") == []
