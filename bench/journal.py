"""A journal of years: the agent's start, faces, commands and memory on 200,000 sales.

    python bench/journal.py [--sales 200000] [--days 500] [--rss-sales 20000] [--cache DIR]

The journal is made with the project's own writes: a few real sales run through the agent's
flows in this process (simulator, journal, transition table) while every ``Journal.create`` and
``Journal.record`` call they make is recorded; the recording is then replayed ``--sales`` times
through the same two calls (fresh ids, times spread over ``--days``), a few hundred sales to a
``Journal.batch`` (one commit each: the same write path, fewer fsyncs). The made journal is kept
under ``--cache`` (default: ``~/.cache/kiosk-agent/bench-journal``), keyed by the journal's
schema version and the number of sales, and copied for each run, so a rerun starts at once.

Then, on a copy, a real ``kiosk-agent run`` (kiosk API and admin API) is measured:

- start -> ready (spawn to systemd READY=1), target <= 2 s; whether pruning (the journal
  spans more than ``keep_days``, 400) ran before ready (target: never on that path); start ->
  in service (the journal's file read whole in its worker thread: no customer before). With
  ``--indexes-missing``, on a copy without the two partial indexes that came after journals
  were in use (as an older release left it: the agent builds them after READY=1);
- spawn -> the first charge check done (the admin API's health);
- each face (``/api/status``, ``/api/sales``, a sale with its steps, the page's first load,
  ``/metrics``, the doctor's ``POST``, answered at once) and each read command (``sales``,
  ``sales --since 24h``, ``sales attention``, ``sales show``, ``health``, ``terminals``), each
  run ``--runs`` times: its slowest run's time, target <= 0.5 s;
  the doctor's run whole (``doctor_run``: a check in the background, not a face); while each
  run goes on, the longest ``/api/status`` answer of a prober asking back to back and the time
  of a kiosk API sale, against the medians of quiet windows (nothing running, one before each
  run): a run's delay is the larger of the two excesses, an action's the median of its runs'
  (``worst_delay_caused_ms``, the worst action's: target <= 50 ms; one scheduler hiccup of a
  busy machine does not decide it), the single worst run's printed beside it
  (``worst_delay_one_run_ms``);
- RSS over ``--rss-sales`` kiosk API sales: after the first 1,000 and at the end (target:
  within 3 MB), and every 1,000 on the way;
- a second start (``start_to_ready_again_s``), whose first charge check reads every charge the
  simulator holds not yet settled (it never settles: each of the run's sales); its triggers,
  and READY=1, wait for the first ``START_WAIT_ROWS`` of them (500), the rest is read while it
  sells (``first_charge_check_again_s``: that check done). ``--seed-charges
  N`` adds N completed sales and their captured charges before it (the last kiosk API sale's
  steps replayed under the unit's order ids, its ledger row copied): what N more RSS sales leave
  it, made in seconds instead of a quarter of an hour.

Figures are upper bounds on a shared machine: each wall time is printed with the load average
when it was taken and, for the start and the commands, the share of it the process ran
(``cpu/wall``: well under 1, the wall time is the machine's load). The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import resource
import shutil
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.config.load import load_config
from kiosk_agent.sales.clock import SYSTEM_CLOCK
from kiosk_agent.sales.journal import SCHEMA_VERSION, Journal, SaleRecord, side_files
from kiosk_agent.sales.machine import this_machine
from kiosk_agent.sales.model import DispenseOutcome, DispenseStatus, Flow, SaleRequest
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.sales.unit import load as load_unit
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.sim.server import SimOptions, SimServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _support import free_port, unit_environment  # shared with the tests, not the test tree
from agent import (  # the sibling bench's helpers
    KIOSK_TOKEN,
    PROCESS_TIME_SCALE,
    TIME_SCALE,
    _cpu_ns,
    _rss_mb,
    config_text,
    settings_for,
)

ADMIN_TOKEN = "bench-admin-token-0123456789abcdef"  # noqa: S105 - a throwaway token
KEEP_DAYS = 400  # the default retention
BATCH_SALES = 250  # replayed sales a commit
# The template's sales: (cents, vends); the simulator decides by the cents (README): 02 declined,
# 07 a device fault; a vend that fails gives the money back (reversed).
TEMPLATE = [(250, True)] * 44 + [(302, True)] * 3 + [(307, True)] * 1 + [(175, False)] * 2
IDS = ("sale_id", "order_id", "interaction_id", "trans_id", "reverse_trans_id")
FRESH = ("interaction_id", "trans_id", "reverse_trans_id")  # ids made anew for each sale
SHIFTED = ("answer_by", "sent_at", "finished_at")  # wall times a step sets: moved with the sale
OLD_BOOT = "bench-old-boot"  # the replayed sends were on another boot (prune reads it)
# the partial indexes a journal made before them gains after READY=1 (--indexes-missing)
LATE_INDEXES = ("sales_no_selection", "steps_late_vend")


# -- the journal, made with the project's own writes ------------------------------------------


@dataclasses.dataclass
class Call:
    """One ``Journal.create``/``record`` call a real sale made, relative to its creation."""

    method: str
    offset: float  # seconds after the sale's creation
    step: str | None
    state: str | None
    detail: dict[str, Any] | None
    if_state: str | None
    changes: dict[str, Any]
    record: dict[str, Any]  # the sale as passed (create: the new sale)


class Vend:
    def __init__(self, works: bool) -> None:
        self.works = works

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        if self.works:
            return DispenseOutcome(DispenseStatus.VENDED, vended_cents=authorized_cents)
        return DispenseOutcome(DispenseStatus.FAILED, detail="jammed")

    async def deny(self, reason: str) -> None:
        return None


async def record_template(scratch: Path) -> list[list[Call]]:
    """Real sales through the agent's flows; every journal write they make, sale by sale."""
    sim = SimServer(SimOptions(port=0, time_scale=TIME_SCALE, transactions=0,
                               rate_limit="1000000/1"))
    await sim.start()
    info = sim.ready_info()
    (scratch / "config.yaml").write_text(config_text(info))
    os.environ["BENCH_API_KEY"] = info["api_key"]
    os.environ["BENCH_CLIENT_SECRET"] = info["client_secret"]
    calls: dict[str, list[Call]] = {}
    created: dict[str, float] = {}
    try:
        settings = settings_for(info)
        async with aiohttp.ClientSession() as session:
            agent = Agent(load_config(scratch / "config.yaml"), settings,
                          service=ServiceClient(settings, session=session))
            journal = agent.journal
            create, record = journal.create, journal.record

            def recording_create(sale: SaleRecord, detail: Any = None) -> SaleRecord:
                made = create(sale, detail)
                created[made.sale_id] = made.created_at
                calls[made.sale_id] = [Call("create", 0.0, None, None, detail and dict(detail),
                                            None, {}, made.row())]
                return made

            def recording_record(sale: SaleRecord, step: Step, state: SaleState | None = None,
                                 detail: Any = None, *, if_state: SaleState | None = None,
                                 **changes: Any) -> SaleRecord:
                updated = record(sale, step, state, detail, if_state=if_state, **changes)
                if sale.sale_id in calls:
                    calls[sale.sale_id].append(Call(
                        "record", updated.updated_at - created[sale.sale_id], step.value,
                        state and state.value, detail and dict(detail),
                        if_state and if_state.value, changes, {},
                    ))
                return updated

            journal.create = recording_create  # type: ignore[method-assign]
            journal.record = recording_record  # type: ignore[method-assign]
            await agent.start()
            try:
                for cents, vends in TEMPLATE:
                    request = SaleRequest(source="kiosk_api", flow=Flow.CHARGE_CARD,
                                          amount_cents=cents, product="coffee")
                    sale = await agent.sales.start(request, Vend(vends))
                    await sale.result()
                await asyncio.sleep(0.1)
            finally:
                await agent.stop()
    finally:
        await sim.stop()
    return [c for c in calls.values() if c[-1].state is not None]


def replay(template: list[list[Call]], path: Path, sales: int, days: float) -> None:
    """``sales`` sales written through ``Journal.create``/``record`` as the template's were,
    dated evenly over the last ``days`` (the newest a minute ago)."""
    clock = _BenchClock()
    journal = Journal(path, clock=clock)
    journal.open()
    now = time.time() - 60
    first = now - days * 86400
    step = (now - first) / max(1, sales - 1)
    rng = random.Random(33)
    plans = [Plan.of(calls) for calls in template]
    try:
        for start in range(0, sales, BATCH_SALES):
            with journal.batch():
                for n in range(start, min(sales, start + BATCH_SALES)):
                    _replay_one(journal, clock, rng.choice(plans), n, first + n * step)
    finally:
        journal.close()


@dataclasses.dataclass(frozen=True)
class Planned:
    """One recorded call made ready to replay: its names read into the enums once, what holds
    the template's ids kept as JSON text (renamed by text, read back by the C parser), the
    changes made for each sale named apart from those copied."""

    call: Call
    step: Step | None
    state: SaleState | None
    if_state: SaleState | None
    detail: dict[str, Any] | None  # as recorded: it names neither id
    detail_text: str | None  # as JSON: it does
    copied: dict[str, Any]  # changes written as recorded
    fresh: tuple[str, ...]  # changes made anew for each sale (_fresh_change)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A template sale's calls, made ready to replay (the replay's own Python stays small
    beside the journal's writes it measures)."""

    sale_id: str
    order_id: str
    row_text: str  # the created sale, as JSON
    calls: list[Planned]

    @classmethod
    def of(cls, calls: list[Call]) -> Plan:
        ids = (calls[0].record["sale_id"], calls[0].record["order_id"])

        def names_an_id(text: str) -> bool:
            return any(old in text for old in ids)

        planned = []
        for call in calls[1:]:
            text = json.dumps(call.detail)
            fresh = tuple(k for k, v in call.changes.items()
                          if v is not None and (k in FRESH or k in SHIFTED))
            planned.append(Planned(
                call, Step(call.step) if call.step else None,
                SaleState(call.state) if call.state else None,
                SaleState(call.if_state) if call.if_state else None,
                None if names_an_id(text) else call.detail,
                text if names_an_id(text) else None,
                {k: _copied_change(k, v) for k, v in call.changes.items() if k not in fresh},
                fresh,
            ))
        row = {k: v for k, v in calls[0].record.items() if k not in ("created_at", "updated_at")}
        return cls(*ids, json.dumps({"row": row, "detail": calls[0].detail}), planned)

    def renamed(self, text: str, sale_id: str, order_id: str) -> Any:
        return json.loads(text.replace(self.sale_id, sale_id).replace(self.order_id, order_id))


class _BenchClock:
    """Dates the replayed writes: wall time set per write."""

    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return time.monotonic()

    def since_boot(self) -> float | None:
        return None

    def boot_id(self) -> str | None:
        return OLD_BOOT


def _replay_one(journal: Journal, clock: _BenchClock, plan: Plan, n: int, at: float) -> None:
    sale_id = uuid.UUID(int=random.Random(n).getrandbits(128)).hex
    order_id = f"KA{n:018X}"
    clock.now = at
    made = plan.renamed(plan.row_text, sale_id, order_id)
    made["row"]["state"] = SaleState(made["row"]["state"])
    record = journal.create(SaleRecord(**made["row"]), made["detail"])
    for planned in plan.calls:
        call = planned.call
        clock.now = at + call.offset
        detail = planned.detail
        if planned.detail_text is not None:
            detail = plan.renamed(planned.detail_text, sale_id, order_id)
        changes = planned.copied
        if planned.fresh:
            changes = {**changes, **{k: _fresh_change(k, call.changes[k], n, at, call)
                                     for k in planned.fresh}}
        assert planned.step is not None
        record = journal.record(record, planned.step, planned.state, detail,
                                if_state=planned.if_state, **changes)


def _fresh_change(name: str, value: Any, n: int, at: float, call: Call) -> Any:
    if name in FRESH:
        return f"{name[:2]}{n:016x}"
    return at + call.offset + 1.0  # SHIFTED: a wall time, moved with the sale


def _copied_change(name: str, value: Any) -> Any:
    if value is not None and name == "sent_boot":
        return OLD_BOOT
    if value is not None and name == "sent_mono":
        return 1.0  # long ago on that other boot
    return value


def default_cache() -> Path:
    """The user's cache directory (kept across reboots, unlike the temporary one)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kiosk-agent" / "bench-journal"


def made_journal(cache: Path, sales: int, days: float) -> tuple[Path, dict[str, float]]:
    """The journal of ``sales`` sales, from the cache or made now (and kept there)."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"journal-v{SCHEMA_VERSION}-{sales}-{days:g}d.db"
    facts = path.with_suffix(".json")
    if path.exists() and facts.exists():
        return path, json.loads(facts.read_text())
    with tempfile.TemporaryDirectory(prefix="bench-journal-template-") as scratch:
        began = time.perf_counter()
        template = asyncio.run(record_template(Path(scratch)))
        recorded = time.perf_counter() - began
    building = path.with_suffix(".building")
    for stale in (building, *[building.with_name(building.name + s) for s in ("-wal", "-shm")]):
        stale.unlink(missing_ok=True)
    began = time.perf_counter()
    replay(template, building, sales, days)
    made = {
        "made_at": time.time(),
        "template_s": round(recorded, 2),
        "build_s": round(time.perf_counter() - began, 1),
        "size_mib": round(building.stat().st_size / 2**20, 1),
    }
    building.rename(path)
    Journal(building).marker.unlink(missing_ok=True)  # the build's: the cache keeps no marker
    facts.write_text(json.dumps(made))
    return path, made


# -- the agent on it ---------------------------------------------------------------------------


def agent_config(info: dict[str, Any], kiosk_port: int, admin_port: int) -> str:
    return config_text(info, kiosk_port, PROCESS_TIME_SCALE).replace(
        "journal: {path: journal.db}",
        f"journal: {{path: journal.db, keep_days: {KEEP_DAYS}}}\n"
        f"admin:\n  port: {admin_port}\n  tokens:\n"
        f"    - {{name: bench, token: !env_var BENCH_ADMIN_TOKEN}}",
    )


def old_sales(path: Path) -> int:
    """Finished sales older than the retention (what a prune removes)."""
    if not path.exists():
        return 0
    cutoff = time.time() - KEEP_DAYS * 86400
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT COUNT(*) FROM sales WHERE created_at < ?", (cutoff,)).fetchone()
    finally:
        db.close()
    return int(row[0])


class SaleNotCompleted(Exception):
    """A bench sale ended otherwise than completed (on the code before: its charge's answer
    waited out while the page's first load held the loop)."""


class Ports:
    """The agent's kiosk and admin ports, written into its configuration; picked again when
    another program took one between the pick and the agent's listen (a shared machine)."""

    def __init__(self, directory: Path, info: dict[str, Any]) -> None:
        self.directory = directory
        self.info = info
        self.kiosk = self.admin = 0
        self.pick()

    def pick(self) -> None:
        self.kiosk, self.admin = free_port(), free_port()
        while self.admin == self.kiosk:  # two picks, neither bound yet, can meet
            self.admin = free_port()
        (self.directory / "config.yaml").write_text(
            agent_config(self.info, self.kiosk, self.admin))


class Running:
    """A ``kiosk-agent run`` process on the copied journal, and clients of its two APIs."""

    def __init__(self, directory: Path, env: dict[str, str], ports: Ports) -> None:
        self.directory = directory
        self.env = env
        self.ports = ports
        self.proc: asyncio.subprocess.Process | None = None
        self.http: aiohttp.ClientSession | None = None

    @property
    def kiosk(self) -> str:
        return f"http://127.0.0.1:{self.ports.kiosk}/api/v1"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.ports.admin}"

    async def start(self, listener: socket.socket) -> dict[str, float]:
        old_before = old_sales(self.directory / "journal.db")
        for _ in range(3):  # a port another engineer's process took meanwhile: others, again
            spawned = time.perf_counter()
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "kiosk_agent", "run", "--config",
                str(self.directory / "config.yaml"), env=self.env,
                stdout=asyncio.subprocess.DEVNULL,
            )
            if await self._ready(listener):
                break
            print("  the agent exited before READY=1 (a port taken?): new ports", flush=True)
            self.ports.pick()
        else:
            raise RuntimeError("the agent never became ready")
        ready = time.perf_counter() - spawned
        ready_cpu = _cpu_ns(self.proc.pid) / 1e9
        old_at_ready = old_sales(self.directory / "journal.db")
        # a connection each: a kept-alive one the server closes as it is reused ends a run
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        checked = await self._first_check(spawned)
        in_service = await self._file_read(spawned)
        return {
            "start_to_ready_s": round(ready, 3),
            "start_cpu_s": round(ready_cpu, 3),  # what the machine's load does not move
            "start_to_ready_load_average": round(os.getloadavg()[0], 2),
            "start_to_ready_cpu_over_wall": round(ready_cpu / ready, 2),
            "old_sales_before": old_before,
            "old_sales_at_ready": old_at_ready,
            "pruned_before_ready": int(old_before > 0 and old_at_ready < old_before / 2),
            "first_charge_check_s": round(checked, 3),
            # the whole file read in its worker thread: customers wait for it, READY=1 not
            "start_to_in_service_s": round(in_service, 3),
        }

    async def _ready(self, listener: socket.socket) -> bool:
        """READY=1 said (True), or the process ended first (False)."""
        assert self.proc is not None
        loop = asyncio.get_running_loop()
        exited = asyncio.ensure_future(self.proc.wait())
        try:
            while True:
                said = asyncio.ensure_future(loop.sock_recv(listener, 1024))
                done, _ = await asyncio.wait({said, exited}, timeout=120,
                                             return_when=asyncio.FIRST_COMPLETED)
                if said in done and said.result().startswith(b"READY=1"):
                    return True
                if said not in done:
                    said.cancel()
                    if exited in done:
                        return False
                    raise TimeoutError("no READY=1 in 120 s")
        finally:
            exited.cancel()

    async def _first_check(self, spawned: float) -> float:
        while True:
            health = await self.get_json("/api/health")
            if health["journal"].get("charges_checked_at"):
                return time.perf_counter() - spawned
            await asyncio.sleep(0.02)

    async def _file_read(self, spawned: float) -> float:
        while True:
            health = await self.get_json("/api/health")
            if not health["journal"].get("file_checking"):
                return time.perf_counter() - spawned
            await asyncio.sleep(0.02)

    async def get_json(self, path: str) -> Any:
        assert self.http is not None
        async with self.http.get(f"{self.admin}{path}", headers=_admin()) as response:
            assert response.status == 200, (path, response.status, await response.text())
            return await response.json()

    async def fetch(self, path: str, method: str = "GET") -> float:
        assert self.http is not None
        began = time.perf_counter()
        async with self.http.request(method, f"{self.admin}{path}", headers=_admin()) as answer:
            await answer.read()
            assert answer.status in (200, 202), (path, answer.status)  # 202: under way
        return time.perf_counter() - began

    async def sale(self) -> float:
        """One kiosk API sale, followed on its WebSocket to its end: seconds."""
        assert self.http is not None
        auth = {"Authorization": f"Bearer {KIOSK_TOKEN}"}
        began = time.perf_counter()
        async with self.http.post(f"{self.kiosk}/sales", json={"product": "coffee"},
                                  headers=auth) as response:
            assert response.status == 202, await response.text()
            sale_id = (await response.json())["sale_id"]
        async with self.http.ws_connect(f"{self.kiosk}/sales/{sale_id}/events",
                                        headers=auth) as ws:
            async for message in ws:
                step = message.json()
                if step.get("final"):
                    if step["state"] != "completed":
                        raise SaleNotCompleted(f"{step['state']}: {step.get('message')}")
                    break
        return time.perf_counter() - began

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.close()
            self.http = None
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()


def _admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@dataclasses.dataclass(frozen=True)
class Window:
    """What a prober and a sale saw while one action ran (or nothing, the quiet baseline)."""

    s: float  # the action's own seconds
    status_max_s: float  # the longest /api/status answer of a prober asking back to back
    sale_s: float  # one kiosk API sale's seconds
    sale_failed: bool = False


async def while_it_runs(agent: Running, action: Callable[[], Awaitable[float]]) -> Window:
    """``action``'s own seconds; meanwhile the longest /api/status answer of a prober asking
    back to back, and one kiosk API sale's seconds."""
    longest = 0.0
    stop = asyncio.Event()

    async def prober() -> None:
        nonlocal longest
        while not stop.is_set():
            began = time.perf_counter()
            with contextlib.suppress(aiohttp.ClientError):  # dropped: its wait counts
                await agent.fetch("/api/status")
            longest = max(longest, time.perf_counter() - began)
            await asyncio.sleep(0.005)  # a prober, not a load of its own

    probing = asyncio.create_task(prober())
    selling = asyncio.create_task(agent.sale())
    try:
        took = await action()
        try:
            sale_s = await selling
        except (aiohttp.ClientError, SaleNotCompleted) as err:  # a figure, not a run's end
            print(f"  a sale failed meanwhile: {err!r}", flush=True)
            return Window(took, longest, took, sale_failed=True)
    finally:
        stop.set()
        await probing
    return Window(took, longest, sale_s)


@dataclasses.dataclass(frozen=True)
class Delay:
    """What an action's runs delayed a prober's request or a sale by, against the quiet
    windows (each run's delay: the larger of its longest /api/status answer and its sale's
    time above the quiet windows' medians)."""

    median_s: float  # the median of its runs' delays: what the action itself does
    worst_s: float  # its worst run's: one scheduler hiccup of a busy machine can make it

    @classmethod
    def of(cls, quiet: list[Window], runs: list[Window]) -> Delay:
        status = statistics.median(w.status_max_s for w in quiet)
        sale = statistics.median(w.sale_s for w in quiet)
        each = [max(w.status_max_s - status, w.sale_s - sale) for w in runs]
        return cls(statistics.median(each), max(each))


BACKGROUND = {"doctor_run"}  # measured, but a check's run, not a face's answer
COMMAND_CPU: dict[str, float] = {}  # each command's CPU seconds (user + system), by its words
QUIET_S = 0.3  # a quiet window's length


async def command(directory: Path, env: dict[str, str], *args: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kiosk_agent", *args, "--config", str(directory / "config.yaml"),
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    # health: 1 says degraded or down (an answer all the same); any other is a failed command
    assert proc.returncode == 0 or (args[0] == "health" and proc.returncode == 1), (
        args, proc.returncode, err.decode())
    took = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    COMMAND_CPU[" ".join(args)] = (after.ru_utime - before.ru_utime) + (
        after.ru_stime - before.ru_stime
    )
    return took


async def faces_and_commands(agent: Running, directory: Path, env: dict[str, str],
                             runs: int) -> dict[str, Any]:
    newest = (await agent.get_json("/api/sales?limit=1"))["sales"][0]["sale_id"]
    actions: dict[str, Callable[[], Awaitable[float]]] = {
        # the page's first load runs the doctor's checks (the journal's integrity among them)
        "page_first_load": lambda: agent.fetch("/api/page"),
        # answered at once (202): the run goes on in the background
        "doctor_checks": lambda: agent.fetch("/api/doctor", "POST"),
        # that run whole (not a face: what it delays is measured all the same)
        "doctor_run": lambda: doctor_run(agent),
        "api_status": lambda: agent.fetch("/api/status"),
        "api_sales": lambda: agent.fetch("/api/sales"),
        "api_sales_today": lambda: agent.fetch("/api/sales?since=24h"),
        "api_sale": lambda: agent.fetch(f"/api/sales/{newest}"),
        "metrics": lambda: agent.fetch("/metrics"),
        "cmd_sales": lambda: command(directory, env, "sales"),
        "cmd_sales_today": lambda: command(directory, env, "sales", "--since", "24h"),
        "cmd_sales_attention": lambda: command(directory, env, "sales", "attention"),
        "cmd_sales_show": lambda: command(directory, env, "sales", "show", newest[:8]),
        # asking the running agent (its admin API)
        "cmd_health": lambda: command(directory, env, "health"),
        "cmd_terminals": lambda: command(directory, env, "terminals"),
    }
    figures: dict[str, Any] = {}
    worst_delay, worst_run, failed = 0.0, 0.0, 0
    every_quiet: list[Window] = []
    for name, action in actions.items():
        # its baseline: a window with nothing running before each run (the machine's load moves
        # over the minutes the actions take)
        quiet, seen, cpu = [], [], []
        for _ in range(runs):
            quiet.append(await while_it_runs(agent, lambda: asyncio.sleep(QUIET_S, QUIET_S)))
            COMMAND_CPU.clear()
            seen.append(await while_it_runs(agent, action))
            cpu.append(sum(COMMAND_CPU.values()))
        every_quiet += quiet
        slowest = max(range(runs), key=lambda n: seen[n].s)  # the face's time: its slowest run
        delay = Delay.of(quiet, seen)
        figures[f"{name}_s"] = round(seen[slowest].s, 3)
        figures[f"{name}_load_average"] = round(os.getloadavg()[0], 2)
        if COMMAND_CPU:
            figures[f"{name}_cpu_s"] = round(cpu[slowest], 3)
            # the share of its wall time the command ran: well under 1, the machine's load
            figures[f"{name}_cpu_over_wall"] = round(cpu[slowest] / seen[slowest].s, 2)
        figures[f"{name}_status_max_ms"] = round(max(w.status_max_s for w in seen) * 1000, 1)
        figures[f"{name}_sale_ms"] = round(max(w.sale_s for w in seen) * 1000, 1)
        figures[f"{name}_delay_ms"] = round(delay.median_s * 1000, 1)
        failed += sum(w.sale_failed for w in seen)  # its time: the action's whole (dropped)
        worst_delay = max(worst_delay, delay.median_s)
        worst_run = max(worst_run, delay.worst_s)
        print(f"  {name}: {seen[slowest].s:.3f} s (slowest of {runs}); quiet "
              + "/".join(f"{w.status_max_s * 1000:.0f}" for w in quiet) + " ms and "
              + "/".join(f"{w.sale_s * 1000:.0f}" for w in quiet) + " ms; meanwhile /api/status "
              "at most " + "/".join(f"{w.status_max_s * 1000:.0f}" for w in seen) + " ms, a sale "
              + "/".join(f"{w.sale_s * 1000:.0f}" for w in seen) + " ms: delay "
              f"{delay.median_s * 1000:.0f} ms (median), {delay.worst_s * 1000:.0f} ms (worst)",
              flush=True)
    quiet_status = [round(w.status_max_s * 1000, 1) for w in every_quiet]
    figures["quiet_status_max_ms"] = statistics.median(quiet_status)
    figures["quiet_status_max_ms_range"] = [min(quiet_status), max(quiet_status)]
    figures["quiet_sale_ms"] = round(statistics.median(w.sale_s for w in every_quiet) * 1000, 1)
    figures["slowest_face_or_command_s"] = max(
        v for k, v in figures.items()
        if k.endswith("_s") and not k.endswith("cpu_s") and not k.startswith("quiet")
        and k.removesuffix("_s") not in BACKGROUND
    )
    # the target's: the worst action's median delay over its runs, against the quiet windows'
    # medians (one scheduler hiccup of a busy machine does not decide it)
    figures["worst_delay_caused_ms"] = round(worst_delay * 1000, 1)
    # the single worst run of any action (what this figure was before: one run each)
    figures["worst_delay_one_run_ms"] = round(worst_run * 1000, 1)
    figures["sales_failed_meanwhile"] = failed
    return figures


async def doctor_run(agent: Running) -> float:
    """A whole run of the doctor's checks: once the one under way ended (the page's first load
    began one; a POST follows it to its end with ``?wait``), one begun and waited for."""
    await agent.fetch("/api/doctor?wait=60", "POST")
    return await agent.fetch("/api/doctor?wait=60", "POST")


async def rss_over_sales(agent: Running, sales: int) -> dict[str, Any]:
    """RSS after the first 1,000 kiosk API sales and after ``sales``; printed every 1,000 on
    the way (where it grows, and when: a plateau or a step at a charge check)."""
    assert agent.proc is not None
    first = min(1000, sales)
    every: list[float] = []
    began = 0.0
    for n in range(1, sales + 1):
        await agent.sale()
        if n == first:
            began = time.perf_counter()
        if n % 1000 == 0 or n == sales:
            every.append(round(_rss_mb(agent.proc.pid), 1))
            print(f"  RSS after {n:,} sales: {every[-1]} MB "
                  f"[load {os.getloadavg()[0]:.2f}]", flush=True)
    rate = (sales - first) / max(1e-9, time.perf_counter() - began)
    after_first, at_end = every[0], every[-1]
    return {
        "rss_after_1000_sales_mb": after_first,
        f"rss_after_{sales}_sales_mb": at_end,
        "rss_growth_after_1000_mb": round(at_end - after_first, 1),
        "rss_every_1000_sales_mb": every,
        "rss_sales_per_s": round(rate, 1),
    }


async def warm_up(directory: Path, env: dict[str, str], command_env: dict[str, str],
                  ports: Ports, listener: socket.socket) -> None:
    """A first start and read commands on an empty journal: the bytecode of whatever the runs
    import is written (as pip writes it at install), not compiled in the runs measured."""
    agent = Running(directory, env, ports)
    try:
        await agent.start(listener)
        await agent.fetch("/api/page")
        for args in (("sales",), ("sales", "attention")):
            await command(directory, command_env, *args)
    finally:
        await agent.stop()
    for path in (directory / "journal.db", *side_files(directory / "journal.db")):
        path.unlink(missing_ok=True)


async def measure(journal: Path, args: argparse.Namespace) -> dict[str, Any]:
    sim = SimServer(SimOptions(port=0, time_scale=PROCESS_TIME_SCALE, transactions=0,
                               rate_limit="1000000/1"))
    await sim.start()
    info = sim.ready_info()
    with tempfile.TemporaryDirectory(prefix="bench-journal-", dir=args.dir) as scratch:
        directory = Path(scratch)
        ports = Ports(directory, info)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        listener.bind(str(directory / "notify.sock"))
        listener.setblocking(False)
        env = {**os.environ, "NOTIFY_SOCKET": str(directory / "notify.sock"),
               "BENCH_API_KEY": info["api_key"], "BENCH_CLIENT_SECRET": info["client_secret"],
               "BENCH_KIOSK_TOKEN": KIOSK_TOKEN, "BENCH_ADMIN_TOKEN": ADMIN_TOKEN}
        command_env = {k: v for k, v in env.items() if k != "NOTIFY_SOCKET"}
        await warm_up(directory, env, command_env, ports, listener)
        shutil.copyfile(journal, directory / "journal.db")
        if args.indexes_missing:  # as a release before them left it: built after READY=1
            db = sqlite3.connect(directory / "journal.db")
            for name in LATE_INDEXES:
                db.execute(f"DROP INDEX IF EXISTS {name}")
            db.commit()
            db.close()
        # a journal made by an older build gains this one's indexes on its first open: once,
        # timed apart from the starts
        began = time.perf_counter()
        upgraded = Journal(directory / "journal.db")
        upgraded.open()
        upgraded.close()
        first_open = time.perf_counter() - began
        agent = Running(directory, env, ports)
        try:
            figures: dict[str, Any] = await agent.start(listener)
            figures["first_open_s"] = round(first_open, 3)
            print(f"  started: {figures}", flush=True)
            await asyncio.sleep(1.0)  # what runs after ready (models, the WAL grown) settles
            figures |= await faces_and_commands(agent, directory, command_env, args.runs)
            if args.rss_sales:
                figures |= await rss_over_sales(agent, args.rss_sales)
            await agent.stop()
            if args.seed_charges:
                figures["seeded_charges"] = seed_charges(
                    directory / "journal.db", sim, info["mid"], args.seed_charges)
            # a second start: nothing left to prune
            agent = Running(directory, env, ports)
            again = await agent.start(listener)
            figures["start_to_ready_again_s"] = again["start_to_ready_s"]
            figures["start_cpu_again_s"] = again["start_cpu_s"]
            figures["first_charge_check_again_s"] = again["first_charge_check_s"]
        finally:
            await agent.stop()
            listener.close()
            await sim.stop()
    return figures


def seed_charges(path: Path, sim: SimServer, mid: str, count: int) -> int:
    """``count`` completed sales added to the journal at ``path``, each the last completed kiosk
    API sale's steps replayed under an order id of the journal's unit, and a captured charge of
    each in ``sim`` (that sale's ledger row, copied): what ``count`` more real sales leave the
    next start's charge check, made in seconds. Returns ``count``."""
    ledger = sim.ctx.ledger if sim.ctx is not None else None
    assert ledger is not None, "the simulator is started"
    journal = Journal(path)
    journal.open()
    try:
        unit = load_unit(journal.db, journal.path, this_machine(), SYSTEM_CLOCK)
        # the latest real one (the replayed sales' older order ids have no charge in ``sim``)
        last = next((sale_id for sale_id, order_id in journal.db.execute(
            "SELECT sale_id, order_id FROM sales WHERE source LIKE 'kiosk_api%' AND state = ? "
            "ORDER BY rowid DESC", (SaleState.COMPLETED.value,)) if unit.made_here(order_id)),
            None)
        if last is None:
            raise SystemExit("--seed-charges: no completed kiosk API sale to copy (run faces)")
        template = journal.get(last)
        assert template is not None
        steps = journal.steps(template.sale_id)
        charge = dict(ledger.find_order(mid, template.order_id)[0])
        charge.pop("seq", None)
        rows = []
        for start in range(0, count, BATCH_SALES):
            with journal.batch():
                for n in range(start, min(count, start + BATCH_SALES)):
                    sale_id = f"{n + 1:016x}" + "5eed" * 4
                    record = journal.create(dataclasses.replace(
                        template, sale_id=sale_id, order_id=unit.order_id(sale_id),
                        state=steps[0].state, trans_id=None))
                    for step in steps[1:]:
                        record = journal.record(
                            record, Step(step.step),
                            step.state if step.state is not record.state else None, step.detail)
                    rows.append({**charge, "trans_id": f"9{n:011d}", "order_id": record.order_id})
    finally:
        journal.close()
    ledger.add_many(rows)
    return count


def measured_under(figures: dict[str, Any], name: str) -> str:
    """A wall time's circumstances: the load average when it was taken, and the share of it
    the process ran (CPU over wall), where known."""
    key = name.removesuffix("_s")
    if f"{key}_load_average" not in figures:
        return ""
    ratio = figures.get(f"{key}_cpu_over_wall")
    return (f"   [load {figures[f'{key}_load_average']}"
            + (f", cpu/wall {ratio}]" if ratio is not None else "]"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sales", type=int, default=200_000, help="sales in the journal")
    parser.add_argument("--days", type=float, default=500.0,
                        help=f"days they span (more than keep_days, {KEEP_DAYS}: a prune is due)")
    parser.add_argument("--rss-sales", type=int, default=20_000,
                        help="kiosk API sales over which RSS is followed (0: skip)")
    parser.add_argument("--runs", type=int, default=3,
                        help="runs of each face and command (the delay is their median's)")
    parser.add_argument("--seed-charges", type=int, default=0,
                        help="completed sales and captured charges added before the second "
                             "start (as that many more RSS sales leave its charge check)")
    parser.add_argument("--cache", type=Path, default=default_cache(),
                        help="where the made journal is kept, by schema version and size")
    parser.add_argument("--dir", type=Path, default=None, help="where the copy runs (a disk)")
    parser.add_argument("--indexes-missing", action="store_true",
                        help="the copy without " + " and ".join(LATE_INDEXES) + ", as a "
                             "release before them left it (built after READY=1)")
    args = parser.parse_args()
    os.environ.update(unit_environment())  # the agent as its systemd unit runs it
    path, made = made_journal(args.cache, args.sales, args.days)
    # as installed: the processes read bytecode (a scratch cache the warm-up run fills)
    bytecode = tempfile.TemporaryDirectory(prefix="bench-journal-bytecode-")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = bytecode.name
    print(f"journal: {path} ({made['size_mib']} MiB, {args.sales:,} sales, made in "
          f"{made['build_s']} s)")
    figures: dict[str, Any] = {"journal_sales": args.sales, "journal_mib": made["size_mib"],
                               "journal_build_s": made["build_s"],
                               "indexes_missing": int(args.indexes_missing)}
    try:
        figures |= asyncio.run(measure(path, args))
    finally:
        bytecode.cleanup()
    targets = {"start_to_ready_s": 2.0, "slowest_face_or_command_s": 0.5,
               "worst_delay_caused_ms": 50.0, "rss_growth_after_1000_mb": 3.0,
               "pruned_before_ready": 0}
    for name, value in figures.items():
        if name.endswith(("_cpu_over_wall", "_load_average")):
            continue  # printed with their figure
        verdict = ""
        if name in targets:
            ok = value <= targets[name]
            verdict = f"   (target <= {targets[name]}: {'ok' if ok else 'MISSED'})"
        print(f"{name:40} {value}{verdict}{measured_under(figures, name)}")
    load = os.getloadavg()[0]
    figures["load_average"] = round(load, 2)
    print(f"load average {load:.2f}")
    print(json.dumps(figures))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
