"""Shared fixtures: the service simulator, started for real on an ephemeral port."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from bench._support import release_leaked_mounts
from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.logs import _HANDLER_NAME as AGENT_HANDLER
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.settings import ServiceSettings
from kiosk_agent.sim import dataset
from kiosk_agent.sim.server import SimOptions, SimServer

# Property tests run on a busy 2-core CI machine: hypothesis's per-example deadline would make
# them flaky, so time bounds are asserted by the tests themselves, generously. Every run draws
# new examples (no example database in a fresh clone): 100 a property (hypothesis's own default)
# in every run, where 300 cost a third of the suite's CPU for the first ten properties alone.
# A property that needs more says so with its own @settings; HYPOTHESIS_PROFILE=deep asks 1,000
# of every other one, for a search before a release.
_PROFILE = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("kiosk", max_examples=100, **_PROFILE)
settings.register_profile("deep", max_examples=1000, **_PROFILE)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "kiosk"))

# pytest keeps each test module's assertion-rewritten bytecode in __pycache__ unless Python is
# told to write none (PYTHONDONTWRITEBYTECODE, set by many container images): then every run, and
# every xdist worker, parsed and rewrote all the test modules again (collecting the suite: 11.5 s
# of CPU a process; 4 s with the cache). The tests' own cache is written whatever that says.
sys.dont_write_bytecode = False

SimFactory = Callable[..., Awaitable[SimServer]]

_LOOKUPS = ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing")


@pytest.fixture(autouse=True)
def _logging_lookups_kept() -> Iterator[None]:
    """A test that runs setup_logging in this process turns off logging's caller lookup (as a
    unit's agent does, kiosk_agent/logs.py); put back after it, so that a later test's failure
    report in the same worker still names the file and line each captured record came from.
    Its root level and handler go back too: left at INFO, every later test in the worker
    captured INFO records, and a test counting the lines that name a sale found two."""
    kept = [getattr(logging, name) for name in _LOOKUPS]
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    for name, value in zip(_LOOKUPS, kept, strict=True):
        setattr(logging, name, value)
    root.setLevel(level)
    for handler in list(root.handlers):  # the agent's own, not pytest's capture of a phase
        if handler not in handlers and handler.get_name() == AGENT_HANDLER:
            root.removeHandler(handler)
            handler.close()


_GENERATE = dataset.generate
_DATA_SETS: dict[tuple[Any, ...], list[dataset.Record]] = {}


def _generated_once(
    seed: int, count: int, end: float, ids: dataset.IdBases | None = None
) -> Iterator[dataset.Record]:
    """``dataset.generate``'s rows, drawn once a worker for each set of its arguments (it is a
    function of them alone: its own seeded random, the day-aligned end, the id blocks). Every
    simulator the fixtures start seeds the same 200 transactions; drawing them was half of a
    start's CPU. Each start still stores them whole, from copies of the rows."""
    key = (seed, count, end, ids)
    if key not in _DATA_SETS:
        _DATA_SETS[key] = list(_GENERATE(seed, count, end, ids))
    for kind, row in _DATA_SETS[key]:
        yield kind, dict(row)


@pytest.fixture
async def sim_factory() -> AsyncIterator[SimFactory]:
    """Start simulators with any ``SimOptions`` (port 0, time_scale 50 unless given)."""
    async with simulators() as start:
        yield start


@contextlib.asynccontextmanager
async def simulators() -> AsyncIterator[SimFactory]:
    """``sim_factory``'s body, for a fixture on another event loop (tests/admin/
    browser_session.py): each simulator started is stopped at the end."""
    started: list[SimServer] = []

    async def start(**options: Any) -> SimServer:
        options.setdefault("port", 0)
        options.setdefault("time_scale", 50)
        options.setdefault("transactions", 200)
        server = SimServer(SimOptions(**options))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(dataset, "generate", _generated_once)
            await server.start()
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        await server.stop()


@pytest.fixture
async def sim(sim_factory: SimFactory) -> SimServer:
    """A started in-process simulator: real HTTP on 127.0.0.1, time_scale 50, seed 1."""
    return await sim_factory(seed=1)


@pytest.fixture
def sim_settings(sim: SimServer) -> ServiceSettings:
    """``ServiceSettings`` for the ``sim`` fixture's merchant key."""
    return settings_from_ready(sim.ready_info())


@pytest.fixture
async def service(sim_settings: ServiceSettings) -> AsyncIterator[ServiceClient]:
    """A connected ``ServiceClient`` on ``sim``."""
    async with ServiceClient(sim_settings) as svc:
        yield svc


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first, dealt out over the parallel workers (``./dev test`` runs several with
    ``--dist worksteal``, which hands each worker one contiguous share of the list and lets an idle
    worker take the tail of a busy one's). Each share starts with its part of the slow tests, the
    longest first, so no worker is left with all of them at the end of the run."""
    slow = sorted((i for i in items if i.get_closest_marker("slow")), key=_expected_seconds)
    slow.reverse()
    fast = [i for i in items if not i.get_closest_marker("slow")]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for item in slow:  # longest first, each to the share with the least so far
        share = loads.index(min(loads))
        shares[share].append(item)
        loads[share] += _expected_seconds(item)
    # fill the shares with fast tests so each is len(items) / workers long, as worksteal cuts them
    size, extra = divmod(len(items), workers)
    fast_left = iter(fast)
    items[:] = []
    for index, share in enumerate(shares):
        want = size + (1 if index < extra else 0)
        share.extend(itertools.islice(fast_left, max(0, want - len(share))))
        items.extend(share)
    items.extend(fast_left)


def _expected_seconds(item: pytest.Item) -> float:
    """A slow test's rough length on a quiet machine: ``@pytest.mark.slow(seconds=50)``."""
    marker = item.get_closest_marker("slow")
    return float(marker.kwargs.get("seconds", 10)) if marker else 0.0


# `pytest --costs=N`: each test's wall, CPU and bytes written (tests/costs.py)
from tests.costs import (  # noqa: E402
    pytest_addoption,
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    pytest_terminal_summary,
)

__all__ = [
    "pytest_addoption",
    "pytest_runtest_logreport",
    "pytest_runtest_makereport",
    "pytest_runtest_setup",
    "pytest_terminal_summary",
]


def pytest_sessionstart(session: pytest.Session) -> None:
    """Give back the small file systems an earlier run mounted and could not unmount (killed by
    a timeout or SIGKILL): each would stay mounted under the temporary directory for good."""
    if hasattr(session.config, "workerinput"):
        return  # the controller does it once, before its workers start
    for mount_point in release_leaked_mounts(Path(tempfile.gettempdir())):
        print(f"unmounted {mount_point}: left mounted by a test run that was killed")


# Every test's agents run on one made-up machine with a hardware serial (tests/machine, read
# as sales/machine.py reads a machine under KIOSK_MACHINE_ROOT), whatever the host: on a host
# with no hardware id (a container) the charge check puts a charge it cannot place to a person
# instead of giving it back (sales/unit.py ``OwnUnit.copyable``), and the tests of its
# give-backs would have read the host. A test of another machine sets its own; a run given
# one from outside keeps it.
os.environ.setdefault("KIOSK_MACHINE_ROOT", str(Path(__file__).resolve().parent / "machine"))
