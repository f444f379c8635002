"""What each test cost the machine besides its wall time: ``pytest --costs=25``.

For every test (setup, call and teardown together) the wall time, the CPU of the pytest process
and of the children it reaped meanwhile (agents, simulators, browsers), and the bytes it wrote
to disk (the kernel's write accounting: pages dirtied, fsynced or not; a file deleted before
the kernel wrote it back, as SQLite's WAL at close, is counted though the disk never saw it).
The tests that waited most (wall minus CPU), those that spent most CPU and those that wrote
most are listed, and the totals: a test that mostly waits is one to put on the injected clock,
one that spends seconds of CPU one to make cheaper (on 2 cores the suite's wall follows its
CPU), a test that writes megabytes one to look at. Works
under xdist (each worker measures its own tests; the figures travel in the reports' user
properties), where it also says when each worker's last test ended: the tail of the run.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Generator
from dataclasses import dataclass

import pytest

_KEY = "costs"  # the user property's name
_BLOCK = 512  # getrusage counts written blocks of 512 bytes


@dataclass(frozen=True)
class Costs:
    wall_s: float
    cpu_s: float
    written_bytes: int

    @property
    def waited_s(self) -> float:
        return max(0.0, self.wall_s - self.cpu_s)

    def __sub__(self, before: Costs) -> Costs:
        return Costs(self.wall_s - before.wall_s, self.cpu_s - before.cpu_s,
                     self.written_bytes - before.written_bytes)


def now() -> Costs:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    written = (own.ru_oublock + children.ru_oublock) * _BLOCK
    return Costs(time.perf_counter(), cpu, written)


_STARTED = pytest.StashKey[Costs]()
_SEEN: dict[str, Costs] = {}  # by test id, in the process that prints (xdist's controller)
_WORKER_LAST: dict[str, float] = {}  # when each xdist worker's last test ended
_SESSION_START = time.perf_counter()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--costs", type=int, default=0, metavar="N",
        help="list the N tests that waited most (wall minus the CPU of pytest and its children) "
             "and the N that wrote most to disk, with totals per directory; 0: none (default)",
    )
    parser.addoption(
        "--costs-json", metavar="PATH", default=None,
        help="also write every test's costs to PATH, one JSON object a line (implies --costs)",
    )


def _measuring(config: pytest.Config) -> bool:
    return bool(config.getoption("costs") or config.getoption("costs_json"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _measuring(item.config):
        item.stash[_STARTED] = now()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    started = item.stash.get(_STARTED, None)
    if call.when == "teardown" and started is not None:
        spent = now() - started
        report.user_properties.append((_KEY, (spent.wall_s, spent.cpu_s, spent.written_bytes)))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    worker = getattr(report, "node", None)  # xdist's controller: the worker that ran it
    if worker is not None and report.when == "teardown":
        _WORKER_LAST[str(worker.gateway.id)] = time.perf_counter()
    for name, value in report.user_properties:
        if name == _KEY and report.when == "teardown":
            wall_s, cpu_s, written_bytes = value
            _SEEN[report.nodeid] = Costs(wall_s, cpu_s, written_bytes)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    shown = terminalreporter.config.getoption("costs")
    dump = terminalreporter.config.getoption("costs_json")
    if dump and _SEEN:
        with open(dump, "w", encoding="utf-8") as out:
            for nodeid, costs in _SEEN.items():
                out.write(json.dumps({"test": nodeid, "wall_s": round(costs.wall_s, 3),
                                      "cpu_s": round(costs.cpu_s, 3),
                                      "written_bytes": costs.written_bytes}) + "\n")
    if not shown or not _SEEN:
        return
    terminalreporter.section(
        f"costs: the {shown} tests that waited most, spent most CPU, and wrote most"
    )
    for line in listing(_SEEN, shown):
        terminalreporter.write_line(line)
    write = terminalreporter.write_line
    if len(_WORKER_LAST) > 1:
        ends = sorted(_WORKER_LAST.items(), key=lambda kv: kv[1])
        write("workers' last test ended at " + ", ".join(
            f"{name} {end - _SESSION_START:.0f} s" for name, end in ends
        ) + f" (from pytest's start); the last worker ran alone for the last "
            f"{ends[-1][1] - ends[-2][1]:.1f} s")


def listing(seen: dict[str, Costs], shown: int) -> list[str]:
    """The ``shown`` tests that waited most, those that spent most CPU (on 2 cores the suite's
    wall follows its CPU: these are the ones to make cheaper), those that wrote most, and the
    totals per directory."""
    lines = [f"{'wall s':>8} {'cpu s':>7} {'waited s':>8} {'written MB':>10}  test"]
    writers = {nodeid: costs for nodeid, costs in seen.items() if costs.written_bytes > 0}
    for rows, key in ((seen, lambda c: c.waited_s), (seen, lambda c: c.cpu_s),
                      (writers, lambda c: c.written_bytes)):
        ranked = sorted(rows.items(), key=lambda kv: -key(kv[1]))[:shown]
        lines += [_line(costs, nodeid) for nodeid, costs in ranked]
        lines.append("")
    directories: dict[str, list[Costs]] = {}
    for nodeid, costs in seen.items():
        directories.setdefault(_directory(nodeid), []).append(costs)
    for name, costs_list in sorted(directories.items()):
        lines.append(_line(_sum(costs_list), f"{name} ({len(costs_list)} tests)"))
    lines.append(_line(_sum(list(seen.values())), f"all ({len(seen)} tests)"))
    return lines


def _directory(nodeid: str) -> str:
    """tests/sales for tests/sales/test_x.py::test_y; tests/*.py for the top-level files."""
    parts = nodeid.split("::")[0].split("/")
    return "/".join(parts[:-1]) if len(parts) > 2 else "/".join([*parts[:-1], "*.py"])


def _sum(costs: list[Costs]) -> Costs:
    return Costs(sum(c.wall_s for c in costs), sum(c.cpu_s for c in costs),
                 sum(c.written_bytes for c in costs))


def _line(costs: Costs, name: str) -> str:
    return (f"{costs.wall_s:8.2f} {costs.cpu_s:7.2f} {costs.waited_s:8.2f} "
            f"{costs.written_bytes / 1e6:10.1f}  {name}")
