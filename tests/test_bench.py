"""The benches run without the test tree: none imports ``tests`` (what they share with the
tests is bench/_support.py), and none keeps its own copy of what bench/_support.py holds
(``free_port``), read from their code with ``ast``."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import itertools
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

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
    four commits (the promise's least) and 17 statements (19 until a batch's two steps of one
    sale were one UPDATE and one INSERT); a write that reads back, or a commit more, shows here
    before it shows in a sale's CPU."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sale_steps", BENCH / "sale_steps.py")
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    context, journal = bench.make_context(tmp_path)
    try:
        assert bench.counted(context, journal) == (17, 4)
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
def _bench_module(name: str) -> Any:
    """A bench file loaded as a module (bench/ is not a package), registered as
    ``bench_<name>`` (a dataclass's module must be found in ``sys.modules``)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def statement_shapes(statements: list[str]) -> list[str]:
    """SQL as SQLite's trace shows it, its literals (strings, numbers) each made ``?``: the
    statements' shape, whatever values they were bound."""
    literal = re.compile(r"'(?:[^']|'')*'|(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")
    return [literal.sub("?", sql) for sql in statements]


def test_the_sale_floor_writes_the_statements_of_an_agents_sale(tmp_path: Path) -> None:
    """bench/sale_floor.py's journal work is the agent's own sale's, statement for statement
    (bench/sale_steps.py runs the agent's SaleSteps): a commit, a statement or a column more
    in the agent's sale shows here, and the floor must follow it or the ratio
    kiosk_sale_cpu_above_floor no longer measures what is the agent's own."""
    steps, floor = _bench_module("sale_steps"), _bench_module("sale_floor")
    (tmp_path / "agent").mkdir()
    context, journal = steps.make_context(tmp_path / "agent")
    agents: list[str] = []
    try:
        steps.one_sale(context)  # the first sale's reads of the unit are not a sale's
        journal.db.set_trace_callback(agents.append)
        steps.one_sale(context)
    finally:
        journal.close()
    db = floor.open_journal(tmp_path / "floor.db")
    floors: list[str] = []
    try:
        db.set_trace_callback(floors.append)
        floor.FloorJournal(db).one_sale()
        db.set_trace_callback(None)
        [sale] = db.execute("SELECT state, captured_cents FROM sales").fetchall()
        assert tuple(sale) == ("completed", 250)
    finally:
        db.close()
    assert len(agents) == 17
    assert agents.count("COMMIT") == 4
    assert statement_shapes(floors) == statement_shapes(agents)


def test_the_shapes_hide_values_and_keep_names() -> None:
    traced = "UPDATE s SET a = 'it''s', b = 2.5, c = -3, d = NULL WHERE id = 'x1' AND t2 = 1e3"
    assert statement_shapes([traced]) == [
        "UPDATE s SET a = ?, b = ?, c = ?, d = NULL WHERE id = ? AND t2 = ?"
    ]


def test_the_sale_floor_sends_frames_of_the_agents_sizes() -> None:
    """Each step's frame on the app's WebSocket is as long as the agent's, and says what the
    bench's driver reads (the sale, its state, whether it is final)."""
    floor = _bench_module("sale_floor")
    sale_id, order_id = floor.new_ids()
    for step, size in floor.FRAME_BYTES.items():
        text = floor.frame(sale_id, order_id, step, step == "completed")
        assert len(text) == size
        read = json.loads(text)
        assert (read["sale_id"], read["final"]) == (sale_id, step == "completed")
    assert json.loads(floor.frame(sale_id, order_id, "completed", True))["state"] == "completed"


def test_the_reference_workload_is_the_one_the_figures_were_read_with() -> None:
    """reference_cpu_ms compares runs only while its workload stays the same: a change to it
    changes this total (and must not be made: docs/architecture.md's figures were read with
    it)."""
    assert _bench_module("agent").reference_workload() == 142975


def test_paired_blocks_are_read_as_medians_and_the_median_of_their_ratios() -> None:
    """bench/agent_pair.py's figures: each agent's median block, and the median of the blocks'
    ratios (this over other), with their spread: a block of a busy minute moves neither."""
    figures = _bench_module("agent_pair").summary([8.0, 9.0, 30.0], [10.0, 9.0, 10.0])
    assert figures == {
        "this_sale_cpu_ms": 9.0, "other_sale_cpu_ms": 10.0, "this_over_other": 1.0,
        "block_ratio_min": 0.8, "block_ratio_max": 3.0,
    }  # fmt: skip


async def drive_the_floor(bench: Any, tmp_path: Path, sales: int) -> None:
    """bench/agent.py's driver runs ``sales`` kiosk API sales through a floor process (its
    journal tmp_path/floor-journal.db) on a real simulator, the floor's CPU measured; the
    floor and the simulator are stopped after."""
    from kiosk_agent.sim.server import SimOptions, SimServer

    sim = SimServer(SimOptions(port=0, time_scale=bench.PROCESS_TIME_SCALE, transactions=0))
    await sim.start()
    try:
        floor, port = await bench.spawn_sale_floor(sim.ready_info(), tmp_path)
        try:
            assert await bench.kiosk_sales_cpu(floor.pid, port, sales, warm_up=0) > 0
        finally:
            floor.terminate()
            await floor.wait()
    finally:
        await sim.stop()


def floor_sale_times(tmp_path: Path) -> list[tuple[float, float]]:
    """The floor's sales' (created_at, finished_at), in the order they started."""
    db = sqlite3.connect(tmp_path / "floor-journal.db")
    try:
        rows = db.execute("SELECT created_at, finished_at FROM sales ORDER BY created_at")
        return rows.fetchall()
    finally:
        db.close()


async def test_a_sale_through_the_sale_floor_completes_as_the_driver_reads_it(
    tmp_path: Path,
) -> None:
    """The floor process takes a kiosk API sale from the bench's own driver end to end: its
    charge on a real simulator, its frames on the sale's WebSocket to the final one, its
    commits on disk; and its CPU is measured."""
    bench = _bench_module("agent")
    await drive_the_floor(bench, tmp_path, 2)
    db = sqlite3.connect(tmp_path / "floor-journal.db")
    try:
        assert db.execute("SELECT state, count(*) FROM sales GROUP BY state").fetchall() == [
            ("completed", 2)
        ]
        assert db.execute("SELECT count(*) FROM steps").fetchone() == (12,)
    finally:
        db.close()


async def test_paced_sales_each_come_after_the_pause_the_floors_as_the_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench/agent.py --pace-ms: the driver pauses after each sale (the same driver reads the
    floor and the agent), so no sale comes sooner than the pause after the last one ended: none
    is held by the agent's rate limiter (20 a second), and each starts after a quiet moment as a
    kiosk's do. Before, the sales came back to back and the agent's waited for the limiter."""
    bench = _bench_module("agent")
    monkeypatch.setitem(bench.PACE, "s", 0.15)
    await drive_the_floor(bench, tmp_path, 3)
    sales = floor_sale_times(tmp_path)
    assert len(sales) == 3
    for (_, ended), (started, _) in itertools.pairwise(sales):
        assert started - ended >= 0.15


async def test_rested_sales_run_back_to_back_in_runs_the_limiter_takes_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench/agent.py --rested: the sales in runs (30, within the agent's rate limiter's burst
    of 40), each after a rest that fills the limiter again (its burst over its rate) and one
    unmeasured sale to warm up: back to back within a run, and none held by the limiter (before,
    the sales after the burst waited up to 50 ms each for a token, the floor's never)."""
    from kiosk_agent.service.settings import ServiceSettings

    bench = _bench_module("agent")
    settings = ServiceSettings(base_url="http://x", api_key="k", mid="1")
    assert (settings.rate_limit, settings.rate_burst) == (bench.LIMITER_RATE, bench.LIMITER_BURST)
    assert bench.RESTED_RUN + 1 <= bench.LIMITER_BURST
    monkeypatch.setitem(bench.PACE, "rested", True)
    monkeypatch.setattr(bench, "RESTED_RUN", 2)
    monkeypatch.setattr(bench, "LIMITER_BURST", 1)
    # a rest of 1 s: starved (the test process stopped 390 ms of every 400) a gap within a run
    # was 0.41 s, the driver's answer to the floor one stop late, past the 0.2 s rest it was
    monkeypatch.setattr(bench, "LIMITER_RATE", 1.0)
    await drive_the_floor(bench, tmp_path, 4)
    sales = floor_sale_times(tmp_path)
    assert len(sales) == 6  # two runs of two, each after its warm-up sale
    gaps = [started - ended for (_, ended), (started, _) in itertools.pairwise(sales)]
    assert gaps[2] >= 1.0  # the second run's rest
    assert max(gaps[:2] + gaps[3:]) < 1.0  # back to back within a run: no rest among them


async def test_the_floor_profiled_writes_its_profile_when_terminated(tmp_path: Path) -> None:
    """bench/agent.py --profile has the floor profile its sales beside the agent's: at SIGTERM
    it writes what it ran (its handlers, its commits) and ends at once, as it ends unprofiled;
    the agent-minus-floor table reads it."""
    import pstats

    from kiosk_agent.sim.server import SimOptions, SimServer

    bench = _bench_module("agent")
    sim = SimServer(SimOptions(port=0, time_scale=bench.PROCESS_TIME_SCALE, transactions=0))
    await sim.start()
    profile = tmp_path / "floor.pstats"
    try:
        floor, port = await bench.spawn_sale_floor(sim.ready_info(), tmp_path, profile)
        try:
            await bench.kiosk_sales_cpu(floor.pid, port, 2, warm_up=0)
        finally:
            floor.terminate()
            # it ends by itself, exit 0 (not killed by the signal, nor left running): the wait
            # is a hang's guard (10 s was passed at load 11-15: a niced process dumping its
            # statistics and exiting waits for a core)
            assert await asyncio.wait_for(floor.wait(), 60) == 0
    finally:
        await sim.stop()
    ran = {name for (_file, _line, name) in pstats.Stats(str(profile)).stats}  # type: ignore[attr-defined]
    assert {"start_sale", "charge", "commit", "events"} <= ran
    per_sale = bench.profile_per_sale(profile, 2)
    assert max(calls for calls, _us in per_sale.values()) >= 1


async def test_a_sale_the_floor_cannot_charge_ends_the_drive_with_its_error(
    tmp_path: Path,
) -> None:
    """With its simulator gone, the floor's sale ends on a final frame saying why, and the
    driver fails on it at once (no bench waits on a WebSocket that never ends)."""
    import pytest

    from kiosk_agent.sim.server import SimOptions, SimServer

    bench = _bench_module("agent")
    sim = SimServer(SimOptions(port=0, time_scale=bench.PROCESS_TIME_SCALE, transactions=0))
    await sim.start()
    floor, port = await bench.spawn_sale_floor(sim.ready_info(), tmp_path)
    try:
        await sim.stop()
        with pytest.raises(AssertionError, match=r"'state': 'failed'.*Client"):
            await bench.kiosk_sales_cpu(floor.pid, port, 1, warm_up=0)
    finally:
        floor.terminate()
        await floor.wait()


def test_the_benches_run_the_agent_with_the_units_environment() -> None:
    """A bench measures the agent as its systemd unit runs it: every ``Environment=`` line."""
    from bench._support import UNIT, unit_environment

    lines = [line for line in UNIT.read_text().splitlines() if line.startswith("Environment=")]
    assert lines, "the unit sets no environment: this test says nothing"
    assert unit_environment()["MALLOC_ARENA_MAX"] == "1"
    assert len(unit_environment()) == sum(len(line.split("=", 1)[1].split()) for line in lines)
    bench = Path(__file__).resolve().parents[1] / "bench"
    for name in ("agent.py", "pi.py", "journal.py"):
        assert "os.environ.update(unit_environment())" in (bench / name).read_text(), name


def test_the_journal_benchs_delay_is_the_median_run_against_the_quiet_medians() -> None:
    """bench/journal.py's delay figure: one hiccup of a busy machine, in a quiet window or in
    one run of an action, does not decide it; an action that delays every run does."""
    bench = _bench_module("journal")
    window = bench.Window
    # status at most, sale: the second quiet window and the second run each met a hiccup
    quiet = [window(0.3, 0.020, 0.080), window(0.3, 0.200, 0.085), window(0.3, 0.025, 0.090)]
    runs = [window(0.1, 0.030, 0.085), window(0.1, 0.150, 0.090), window(0.1, 0.028, 0.095)]
    delay = bench.Delay.of(quiet, runs)
    assert delay.median_s == pytest.approx(0.010)  # the third run's sale, 10 ms over 85
    assert delay.worst_s == pytest.approx(0.125)  # the hiccup: 150 ms against 25
    stalls = [window(0.1, 0.090, 0.090), window(0.1, 0.095, 0.150), window(0.1, 0.020, 0.160)]
    assert bench.Delay.of(quiet, stalls).median_s == pytest.approx(0.070)  # of 65, 70, 75 ms


async def test_the_hardware_benchs_controller_answers_across_a_process_boundary() -> None:
    """bench/hardware.py's controller runs in a process of its own, as a vending machine is
    another device: the customer's wait is timed in that process, from its vend request to
    the answer it reads (played here by the test on the adapter's side of its pty); the
    floor's bare pty line is timed across the same boundary."""
    import os
    import tty

    from kiosk_agent.platforms import mdb_protocol as wire

    bench = _bench_module("controller_process")
    controller = bench.ControllerProcess({"A1": 150})
    await controller.start()
    loop = asyncio.get_running_loop()
    adapter = os.open(controller.port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    tty.setraw(adapter)
    lines: asyncio.Queue[str] = asyncio.Queue()
    buffer = bytearray()

    def read() -> None:
        buffer.extend(os.read(adapter, 256))
        while (end := buffer.find(b"\n")) >= 0:
            lines.put_nowait(buffer[:end].decode())
            del buffer[: end + 1]

    async def line_starting(prefix: str) -> str:
        while not (line := await asyncio.wait_for(lines.get(), 10)).startswith(prefix):
            pass
        return line

    loop.add_reader(adapter, read)
    try:
        os.write(adapter, f"{wire.enable_reader()}\n".encode())
        await asyncio.wait_for(controller.wait_enabled(), 10)
        customer = asyncio.create_task(controller.customer("A1"))
        assert await line_starting("c,STATUS,VEND") == wire.vend_request_line(150, "A1")
        os.write(adapter, f"{wire.approve_vend(150)}\n".encode())
        visit = await asyncio.wait_for(customer, 10)
        assert visit.outcome == "vended"
        assert visit.answered_at > visit.requested_at
        trips = await controller.line_trips(3)
        assert len(trips) == 3
        assert all(0 < seconds < 10 for seconds in trips)
    finally:
        loop.remove_reader(adapter)
        os.close(adapter)
        await controller.stop()


async def test_a_background_load_runs_its_busy_processes_at_their_level_and_ends_them() -> None:
    """bench/agent.py --background-load N: N processes busy on the CPU at the nice level asked
    while entered, none left once left; the load the sales saw is sampled and averaged."""
    bench = _bench_module("agent")
    with bench.BackgroundLoad(2, nice=19) as load:
        pids = [process.pid for process in load.processes]
        assert len(pids) == 2
        stats: list[list[str]] = []
        # after the ")": state is field 3, utime 14 and nice 19 (man 5 proc), from 3 on here
        for _ in range(100):  # each sets its level as it starts: a busy one has used the CPU
            stats = [Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split() for p in pids]
            if all(int(fields[16]) == 19 and int(fields[11]) > 0 for fields in stats):
                break
            await asyncio.sleep(0.05)
        assert [int(fields[16]) for fields in stats] == [19, 19]
        assert all(int(fields[11]) > 0 for fields in stats)  # user time: they are busy
        async with bench.load_sampled(every_s=0.01) as seen:
            await asyncio.sleep(0.05)
    assert load.processes == []
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert seen["runnable_during_sales"] >= 1  # the sampler itself at least
    assert seen["load_average_during_sales"] >= 0


async def test_a_pairs_agents_run_as_their_systemd_unit_runs_them(tmp_path: Path) -> None:
    """bench/agent_pair.py's agents get the unit's Environment= lines (the C heap's arenas and
    per-thread cache, -OO), as bench/agent.py's, bench/journal.py's and bench/pi.py's agents
    do: a pair measured otherwise reads an agent no unit runs (i39-review2)."""
    from bench._support import unit_environment
    from kiosk_agent.sim.server import SimOptions, SimServer

    pair = _bench_module("agent_pair")
    sim = SimServer(SimOptions(port=0, time_scale=pair.bench.PROCESS_TIME_SCALE, transactions=0))
    await sim.start()
    try:
        agent, _ = await pair.spawn(None, tmp_path, sim.ready_info())
        try:
            environ = Path(f"/proc/{agent.pid}/environ").read_bytes().split(b"\0")
        finally:
            agent.terminate()
            await agent.wait()
    finally:
        await sim.stop()
    variables = dict(v.decode().partition("=")[::2] for v in environ if v)
    wanted = unit_environment()
    assert {"MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "PYTHONOPTIMIZE"} <= set(wanted)
    assert {name: variables.get(name) for name in wanted} == wanted


def _commits(statements: list[str]) -> list[list[str]]:
    """The tables each fsynced commit of a trace wrote, in order (a commit made at
    ``synchronous=NORMAL``, the card read's accepted step, left out: it waits for no fsync)."""
    commits: list[list[str]] = []
    tables: list[str] = []
    unsynced = False
    for sql in statements:
        if sql == "PRAGMA synchronous=NORMAL":
            unsynced = True
        elif sql == "PRAGMA synchronous=FULL":
            unsynced = False
        elif sql.startswith("BEGIN"):
            tables = []
        elif sql == "COMMIT":
            if not unsynced:
                commits.append(tables)
        elif found := re.match(r"(?:INSERT INTO|UPDATE) (\w+)", sql):
            tables.append(found.group(1))
    return commits


async def test_the_hardware_benchs_floor_commits_are_a_sales_own_three(tmp_path: Path) -> None:
    """bench/hardware.py's floor commits the steps an authorize_capture sale journals before
    its approve, in the agent's three fsynced commits and through its Journal, on a journal
    without what no write-ahead commit needs (the agent's read indexes, the order id's
    uniqueness, AUTOINCREMENT) and without the send's anchors beside the sale: a step or a
    commit more in the agent's window shows here, and the floor must follow it or say why."""
    from types import SimpleNamespace

    from kiosk_agent.sales.authorize_capture import AuthorizeCaptureFlow
    from kiosk_agent.sales.journal import SaleRecord
    from kiosk_agent.sales.model import Flow, SaleRequest
    from kiosk_agent.sales.states import SaleState, Step
    from kiosk_agent.service.models import ChargeResult

    steps, hardware = _bench_module("sale_steps"), _bench_module("hardware")
    (tmp_path / "agent").mkdir()
    context, journal = steps.make_context(tmp_path / "agent")
    agents: list[str] = []
    try:  # the flow's own calls, in sell()'s order, up to the approve
        record = SaleRecord(
            sale_id="s1", order_id="O1", source="mdb:bench", flow=Flow.AUTHORIZE_CAPTURE.value,
            terminal="SIM-0001", amount_cents=250, state=SaleState.STARTED, product="A2",
        )  # fmt: skip
        request = SaleRequest(source="mdb:bench", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=250)
        flow = AuthorizeCaptureFlow(record, request, dispenser=None, context=context)  # type: ignore[arg-type]
        journal.db.set_trace_callback(agents.append)
        flow.open({"source": "mdb:bench", "product": "A2"})
        flow.step(Step.READ_CARD_ACCEPTED, interaction_id="I1", interaction_kind="read_card")
        with flow.one_commit():
            flow.card_read(SimpleNamespace(card_brand_id=1, last_four="0034"))
            flow.step(Step.AUTHORIZE_REQUEST, SaleState.AUTHORIZING, "authorizing $2.50",
                      detail={"order_id": "O1", "amount_cents": 250}, **flow.sending())
        flow.approved_for_vend(
            Step.AUTHORIZE_APPROVED, ChargeResult(result="A", trans_id="T1", amount=250), "vend"
        )
        journal.db.set_trace_callback(None)
        agent_steps = [tuple(row) for row in journal.db.execute(
            "SELECT step, state FROM steps WHERE sale_id = 's1' ORDER BY id")]
    finally:
        journal.close()
    commits = hardware.SaleCommits(tmp_path / "floor.db")
    floors: list[str] = []
    try:
        commits.journal.db.set_trace_callback(floors.append)
        figures = commits.times(2)
        commits.journal.db.set_trace_callback(None)
        db = commits.journal.db
        [sale_id] = db.execute("SELECT sale_id FROM sales ORDER BY rowid LIMIT 1").fetchone()
        floor_steps = [tuple(row) for row in db.execute(
            "SELECT step, state FROM steps WHERE sale_id = ? ORDER BY id", (sale_id,))]
        indexes = {row[0] for row in db.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'index' AND sql IS NOT NULL")}
        schema = " ".join(row[0] for row in db.execute(
            "SELECT sql FROM sqlite_schema WHERE name IN ('sales', 'steps')"))
    finally:
        commits.close()
    assert _commits(agents) == [["sales", "steps"], ["sales", "sale_sends", "steps"],
                                ["sales", "steps"]]
    # a sale's end is two more fsynced commits, written untimed
    assert _commits(floors)[:3] == [["sales", "steps"]] * 3
    assert len(_commits(floors)) == 2 * 5
    accepted = ("read_card.accepted", "reading_card")
    assert accepted in agent_steps
    assert floor_steps[:6] == [s for s in agent_steps if s != accepted]
    assert floor_steps[6:] == [("capture.request", "capturing"), ("completed", "completed")]
    assert indexes.isdisjoint(hardware.NOT_THE_PROMISES_INDEXES)
    assert "UNIQUE" not in schema
    assert "AUTOINCREMENT" not in schema
    # the pages each commit wrote: each table and the sales' key a leaf of its own here
    assert [figures[f"{key}_frames"] for key in hardware.FLOOR_COMMITS] == [[3, 3], [2, 2], [2, 2]]
    assert all(len(figures[key]) == 2 and min(figures[key]) > 0 for key in hardware.FLOOR_COMMITS)


def test_the_hardware_benchs_floor_line_is_the_controllers_request_and_the_agents_approve() -> None:
    from kiosk_agent.platforms import mdb_protocol as wire

    bench = _bench_module("controller_process")
    request = wire.parse_adapter_line(bench.VEND_REQUEST.decode())
    assert request == wire.VendRequested(250, "A2")
    assert bench.VEND_APPROVE.decode() == wire.approve_vend(250) + "\n"


async def test_the_hardware_benchs_bare_sale_keeps_the_journals_promise_and_no_more(
    tmp_path: Path,
) -> None:
    """bench/hardware.py's whole floor: a bare sale on the controller's vend request line, read
    over the floor's pty from the controller's own process, journals a sale's steps through the
    agent's Journal, each write-ahead commit fsynced before the call or the line it announces
    (create -> read_card, the card read -> charge, the approval -> C,VEND; a decline's end ->
    C,STOP), and makes no other commit, call or answer inside the window. Here as the floor was
    until i42-floor-end (2026-11-30) (``ends=False``, still timed beside the whole one): its sales'
    ends written after the series."""
    from kiosk_agent.sim.server import SimOptions, SimServer

    hardware = _bench_module("hardware")
    controller_process = _bench_module("controller_process")
    sim = SimServer(SimOptions(port=0, time_scale=hardware.TIME_SCALE, rate_limit="100000/1"))
    await sim.start()
    commits = hardware.SaleCommits(tmp_path / "floor.db")
    controller = controller_process.ControllerProcess(hardware.PRODUCTS)
    events: list[str] = []
    try:
        await controller.start()
        async with hardware.ServiceClient(hardware.settings_for(sim)) as service:
            terminal, payments = service.terminal, service.payments
            read_card, charge = terminal.read_card, payments.charge

            async def recorded_read_card(*args: Any, **kwargs: Any) -> Any:
                events.append("read_card")
                return await read_card(*args, **kwargs)

            async def recorded_charge(*args: Any, **kwargs: Any) -> Any:
                events.append("charge")
                return await charge(*args, **kwargs)

            terminal.read_card, payments.charge = recorded_read_card, recorded_charge
            bare = hardware.BareSale(commits, service, ends=False)
            sell = bare.sell

            async def recorded_sell(fields: list[bytes], answer: Any) -> None:
                def recorded_answer(data: bytes) -> None:
                    events.append("answer " + data.decode().strip())
                    answer(data)

                events.append("line " + b",".join(fields).decode())
                await sell(fields, recorded_answer)

            bare.sell = recorded_sell

            def traced(sql: str) -> None:
                if sql == "COMMIT" or sql.startswith("PRAGMA synchronous"):
                    events.append(sql)

            commits.journal.db.set_trace_callback(traced)
            trips = await controller.bare_sales([(250, "A2"), (102, "D2")], bare, ends=False)
            commits.journal.db.set_trace_callback(None)
            bare.end_sales()
        timed = {key: len(times) for key, times in bare.commit_times.items() if min(times) > 0}
        db = commits.journal.db
        [synchronous] = db.execute("PRAGMA synchronous").fetchone()
        sales = [tuple(row) for row in db.execute(
            "SELECT sale_id, amount_cents, product, state FROM sales ORDER BY rowid")]
        steps = {sale_id: [tuple(row) for row in db.execute(
            "SELECT step, state FROM steps WHERE sale_id = ? ORDER BY id", (sale_id,))]
            for sale_id, *_ in sales}
    finally:
        commits.close()
        await controller.stop()
        await sim.stop()
    assert [answer for _, answer in trips] == ["C,VEND,2.50", "C,STOP"]
    assert all(0 < seconds < 10 for seconds, _ in trips)
    # each commit at synchronous=FULL (2; no PRAGMA lowers it), before what it announces
    assert synchronous == 2
    assert events == [
        "line c,STATUS,VEND,2.50,A2", "COMMIT", "read_card", "COMMIT", "charge", "COMMIT",
        "answer C,VEND,2.50",
        "line c,STATUS,VEND,1.02,D2", "COMMIT", "read_card", "COMMIT", "charge", "COMMIT",
        "answer C,STOP",
    ]  # fmt: skip
    assert [row[1:] for row in sales] == [(250, "A2", "completed"), (102, "D2", "declined")]
    approved, declined = (steps[row[0]] for row in sales)
    window = [("created", "started"), ("read_card.request", "reading_card"),
              ("read_card.done", "reading_card"), ("authorize.request", "authorizing")]
    assert approved == [*window, ("authorize.approved", "authorizing"),
                        ("dispense.request", "dispensing"), ("capture.request", "capturing"),
                        ("completed", "completed")]
    assert declined == [*window, ("authorize.declined", "declined")]
    # the write-ahead commits each timed (wall, thread CPU); the decline's end is not one
    assert timed == {"create": 2, "create_cpu": 2, "state": 2, "state_cpu": 2,
                     "approval": 1, "approval_cpu": 1}


async def test_the_hardware_benchs_bare_sale_is_whole_to_its_end(tmp_path: Path) -> None:
    """bench/hardware.py's whole floor hears each vend's result as the agent does (the machine's
    own lines after a vend, the virtual controller's), journals the confirmed vend with its
    capture request in a commit fsynced before the capture is asked, asks the capture once,
    through the same client, and commits the completion without an fsync of its own; the
    simulator's ledger holds exactly those captures. A decline's end is as before. On the floor
    before i42-floor-end (2026-11-30) no vend result was heard and no capture asked."""
    from kiosk_agent.service.models.statuses import TransStatus
    from kiosk_agent.sim.server import SimOptions, SimServer

    hardware = _bench_module("hardware")
    controller_process = _bench_module("controller_process")
    sim = SimServer(SimOptions(port=0, time_scale=hardware.TIME_SCALE, rate_limit="100000/1"))
    await sim.start()
    path = tmp_path / "floor.db"
    commits = hardware.SaleCommits(path)
    controller = controller_process.ControllerProcess(hardware.PRODUCTS)
    events: list[tuple[Any, ...]] = []
    rows = re.compile(r"\('([0-9a-f]{32})', [-+.0-9e]+, '([a-z_.]+)', '[a-z_]+'")
    written: list[tuple[str, str]] = []  # (sale id, step) of the transaction under way
    full = True

    def traced(sql: str) -> None:
        nonlocal full
        if sql.startswith("PRAGMA synchronous="):
            full = sql == "PRAGMA synchronous=FULL"
        elif sql.startswith("INSERT INTO steps"):
            written.extend(rows.findall(sql))
        elif sql == "COMMIT":
            for sale_id in dict.fromkeys(sale_id for sale_id, _ in written):
                steps = tuple(step for sid, step in written if sid == sale_id)
                events.append(("commit", sale_id, full, steps))
            written.clear()

    def captured() -> set[tuple[str, int]]:
        return {(row["trans_id"], row["amount_cents"]) for row in sim.ctx.store.rows(
            "SELECT trans_id, amount_cents FROM transactions WHERE trans_status_id = ?",
            (int(TransStatus.CAPTURED),))}

    try:
        await controller.start()
        before = captured()
        async with hardware.ServiceClient(hardware.settings_for(sim)) as service:
            terminal, payments = service.terminal, service.payments
            read_card, charge, capture = terminal.read_card, payments.charge, payments.capture

            async def recorded_read_card(device: str, cents: int) -> Any:
                events.append(("read_card", cents))
                return await read_card(device, cents)

            async def recorded_charge(request: Any) -> Any:
                events.append(("charge", request.order_id))
                return await charge(request)

            async def recorded_capture(trans_id: str, amount: int) -> Any:
                # what the journal holds on disk as the capture is asked: read by another
                # connection, which sees only what is committed
                with contextlib.closing(sqlite3.connect(path)) as other:
                    steps = [step for (step,) in other.execute(
                        "SELECT step FROM steps WHERE sale_id = "
                        "(SELECT sale_id FROM sales WHERE trans_id = ?) ORDER BY id",
                        (trans_id,))]
                events.append(("capture", trans_id, amount, steps[-1]))
                return await capture(trans_id, amount=amount)

            terminal.read_card, payments.charge = recorded_read_card, recorded_charge
            payments.capture = recorded_capture
            bare = hardware.BareSale(commits, service)
            sell, heard = bare.sell, bare.heard

            async def recorded_sell(fields: list[bytes], answer: Any) -> None:
                def recorded_answer(data: bytes) -> None:
                    events.append(("answer", fields[4].decode(), data.decode().strip()))
                    answer(data)

                events.append(("line", fields[4].decode(), fields[3].decode()))
                await sell(fields, recorded_answer)

            def recorded_heard(fields: list[bytes]) -> None:
                events.append(("heard", b",".join(fields).decode()))
                heard(fields)

            bare.sell, bare.heard = recorded_sell, recorded_heard
            commits.journal.db.set_trace_callback(traced)
            trips = await controller.bare_sales([(250, "A2"), (102, "D2"), (150, "A1")], bare)
            commits.journal.db.set_trace_callback(None)
            bare.end_sales()
        ledger = captured() - before
        db = commits.journal.db
        sales = [tuple(row) for row in db.execute(
            "SELECT sale_id, order_id, trans_id, product, amount_cents, state, captured_cents "
            "FROM sales ORDER BY rowid")]
        steps = {sale_id: [step for (step,) in db.execute(
            "SELECT step FROM steps WHERE sale_id = ? ORDER BY id", (sale_id,))]
            for sale_id, *_ in sales}
    finally:
        commits.close()
        await controller.stop()
        await sim.stop()
    assert [answer for _, answer in trips] == ["C,VEND,2.50", "C,STOP", "C,VEND,1.50"]
    assert [row[3:] for row in sales] == [
        ("A2", 250, "completed", 250), ("D2", 102, "declined", 0), ("A1", 150, "completed", 150)]
    # the machine's lines after each answer, as the virtual controller writes them
    assert [e[1] for e in events if e[0] == "heard"] == [
        "c,VEND,SUCCESS", "c,STATUS,IDLE", "c,STATUS,ENABLED", "c,STATUS,ENABLED",
        "c,VEND,SUCCESS", "c,STATUS,IDLE", "c,STATUS,ENABLED"]  # fmt: skip

    def of(sale: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """The sale's own events, in order, without its keys."""
        sale_id, order_id, trans_id, product, cents = sale[:5]
        mine = []
        for event in events:
            kind, key, *rest = event
            if (kind, key) in {("commit", sale_id), ("read_card", cents), ("charge", order_id),
                               ("capture", trans_id), ("line", product), ("answer", product)}:
                mine.append((kind, *rest) if kind in ("commit", "capture", "answer") else (kind,))
        return mine

    window = [("line",), ("commit", True, ("created", "read_card.request")), ("read_card",),
              ("commit", True, ("read_card.done", "authorize.request")), ("charge",)]
    for sale in (sales[0], sales[2]):
        cents = sale[4]
        assert of(sale) == [
            *window, ("commit", True, ("authorize.approved", "dispense.request")),
            ("answer", f"C,VEND,{cents / 100:.2f}"),
            ("commit", True, ("capture.request",)),  # fsynced, then the capture: on disk then
            ("capture", cents, "capture.request"),
            ("commit", False, ("completed",)),  # no fsync of its own
        ]
        assert steps[sale[0]][-2:] == ["capture.request", "completed"]
    assert of(sales[1]) == [*window, ("commit", True, ("authorize.declined",)),
                            ("answer", "C,STOP")]
    # each capture request committed only once its vend's success was heard
    successes = [n for n, e in enumerate(events) if e == ("heard", "c,VEND,SUCCESS")]
    requests = [n for n, e in enumerate(events)
                if e[0] == "commit" and e[3] == ("capture.request",)]
    assert len(successes) == len(requests) == 2
    assert all(heard < request for heard, request in zip(successes, requests, strict=True))
    # each capture asked while no bare sale was between its request and its answer
    for n, event in enumerate(events):
        if event[0] == "capture":
            kinds = [e[0] for e in events[:n]]
            assert kinds.count("line") == kinds.count("answer")
    # the simulator's ledger: exactly the approved sales' captures, each of the cents vended
    assert ledger == {(sales[0][2], 250), (sales[2][2], 150)}
