"""`kiosk-agent run` as a real process against a simulator in the test's process.

The simulator outlives every agent process, so a test can ask its ledger (reporting) what
really happened after signals and kills. Waits poll the journal and the log on loopback; each
is bounded, and what the agent logged is in the failure message.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import sys
import textwrap
from pathlib import Path
from typing import Any

from kiosk_agent.redact import redact
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import TransactionFilter, TransStatus
from kiosk_agent.service.settings import ServiceSettings

from ..assembly.crash_driver import WarmCommand, WarmCommands
from ..child_signals import SignalledChild
from ..helpers import service_yaml

TIME_SCALE = 50  # a card is presented 30 ms after the charge-card starts
POLL_S = 0.05


def write_config(directory: Path, sim: Any, journal: Path, extra: str = "") -> Path:
    """A configuration for the simulator ``sim``, its journal at ``journal`` (absolute, so two
    configurations in two directories can name one journal)."""
    info = sim.ready_info()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.yaml"
    path.write_text(
        service_yaml(info)
        + textwrap.dedent(
            f"""\
            terminals: [{{device_id: SIM-0001}}]
            journal: {{path: {journal}}}
            logging: {{format: json}}
            sales: {{answer_margin: 0.5, interaction_lifetime: {180 / TIME_SCALE}}}
            """
        )
        + textwrap.dedent(extra)
    )
    return path


# A vending machine whose customers come at once and whose dispense lasts long enough
# (1 s) for a test to catch the sale at `dispensing`.
MACHINE = """\
triggers:
  - platform: virtual
    name: lobby
    gap: [0.05, 0.1]
    fail_rate: 0
    walk_away_rate: 0
    dispense_time: 1.0
    seed: 7
"""


class AgentProcess:
    """One ``kiosk-agent run -c CONFIG``; its standard error goes to ``<config dir>/<log>``.

    A process of its own, forked from a warm interpreter (crash_driver.WarmCommands: the agent's
    imports done once for the test process, not 1.2 s of CPU a start); ``cold=True`` runs the
    installed entry point in a new interpreter instead, for a test about that start itself."""

    def __init__(
        self, config: Path, sim: Any, log: str = "agent.log", *, nohup: bool = False,
        cold: bool = False,
    ) -> None:
        self.config = config
        self.nohup = nohup  # started with SIGHUP ignored, as `nohup` starts a command
        self.cold = cold
        self.log = config.with_name(log)
        info = sim.ready_info()
        self.env = {
            **os.environ,
            "KIOSK_API_KEY": info["api_key"],
            "KIOSK_CLIENT_SECRET": info["client_secret"],
            "KIOSK_ADMIN_TOKEN": "an-admin-token-of-at-least-24-chars",  # for an admin: section
        }
        self.proc: asyncio.subprocess.Process | WarmCommand | None = None
        self._child: SignalledChild | None = None

    async def start(self) -> AgentProcess:
        if not self.cold:  # its output in files, not pipes: a full pipe would stall the agent
            self.proc = await asyncio.to_thread(
                WarmCommands.shared().start, ["run", "-c", str(self.config)], self.env, self.log,
                nohup=self.nohup,
            )  # fmt: skip
            self._child = SignalledChild(self.proc)
            return self
        with self.log.open("a") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "kiosk_agent", "run", "-c", str(self.config),
                stdout=asyncio.subprocess.DEVNULL, stderr=log, env=self.env,
                # whatever the test runner ignores (a nohup'd CI), the agent starts as from a
                # shell, or as from `nohup`
                preexec_fn=lambda: signal.signal(
                    signal.SIGHUP, signal.SIG_IGN if self.nohup else signal.SIG_DFL
                ),
            )  # fmt: skip
        self._child = SignalledChild(self.proc)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def says(self, words: str) -> bool:
        """Whether the log says ``words``, redacted as the agent's log is: a sale id (32 hex
        digits) may hold 13-19 digits in a row that pass the Luhn check, which the log masks
        as a card number (kiosk_agent/redact.py)."""
        return redact(words) in self.text()

    async def wait_for_log(self, words: str, within: float = 30.0) -> None:
        """Until the log says ``words`` (:meth:`says`); fails if the agent ends first."""
        assert self.proc is not None
        async with asyncio.timeout(within):
            while not self.says(words):
                assert self.proc.returncode is None, self.text()[-3000:]
                await asyncio.sleep(POLL_S)

    async def wait_ready(self) -> None:
        await self.wait_for_log("ready in")

    async def exit_code(self, within: float = 30.0) -> int:
        assert self.proc is not None
        async with asyncio.timeout(within):
            return await self.proc.wait()

    def send(self, signum: int) -> None:
        """Signals the agent without reaping it (see SignalledChild); ProcessLookupError once
        it has ended and been reaped."""
        assert self._child is not None
        self._child.send(signum)

    async def close(self) -> None:
        """At the end of a test: nothing left running."""
        if self._child is not None:
            await self._child.close()
            self._child = None


def under_systemd(agent: AgentProcess, directory: Path) -> socket.socket:
    """``agent`` started as systemd starts it (``NOTIFY_SOCKET``, no watchdog): the datagram
    socket it tells READY=1 and STATUS= to, bound in ``directory``, for the test to read (its
    ``sock_recv``) and close."""
    path = str(directory / "notify")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.setblocking(False)
    agent.env = {**agent.env, "NOTIFY_SOCKET": path}
    agent.env.pop("WATCHDOG_USEC", None)
    agent.env.pop("WATCHDOG_PID", None)
    return server


async def cli(agent: AgentProcess, *args: str) -> tuple[int, str, str]:
    """Another command of the same unit (same configuration), run beside the agent: its exit
    code and output."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kiosk_agent", *args, "-c", str(agent.config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=agent.env,
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def states(journal: Path) -> dict[str, str]:
    """sale_id -> state, read as any reader would beside a running agent."""
    if not journal.exists():
        return {}
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)
    try:
        return dict(db.execute("SELECT sale_id, state FROM sales").fetchall())
    except sqlite3.OperationalError:  # created, its tables not yet
        return {}
    finally:
        db.close()


async def sale_in(journal: Path, state: str, within: float = 30.0) -> str:
    """The first sale seen in ``state``."""
    async with asyncio.timeout(within):
        while True:
            found = [sale for sale, now in states(journal).items() if now == state]
            if found:
                return found[0]
            await asyncio.sleep(POLL_S)


async def sale_reaches(journal: Path, sale_id: str, state: str, within: float = 30.0) -> None:
    """Until the sale ``sale_id`` is in ``state``."""
    async with asyncio.timeout(within):
        while states(journal).get(sale_id) != state:
            await asyncio.sleep(POLL_S)


HELD = {TransStatus.CAPTURED, TransStatus.SETTLED}
CHARGED = HELD | {TransStatus.AUTHORIZED, TransStatus.VOIDED, TransStatus.REFUNDED}


async def money_agrees(sim: Any, journal: Path) -> None:
    """The simulator's ledger and the journal tell one story: a completed sale holds its
    captured amount, any other holds nothing; none is left at `dispensing`."""
    from kiosk_agent.sales.journal import Journal

    records = Journal(journal)
    records.open()
    try:
        sales = records.query()
    finally:
        records.close()
    assert sales
    async with ServiceClient(ServiceSettings.reaching_simulator(sim.ready_info())) as service:
        for sale in sales:
            rows = []
            for order_id in sale.all_order_ids():
                query = TransactionFilter(order_id=order_id)
                rows += [r async for r in service.reporting.transactions(query)]
            held = [r for r in rows if r.status in HELD]
            why = f"{sale.sale_id} {sale.state.value} {sale.message!r}: {[r.status for r in rows]}"
            assert sale.state.value != "dispensing", why
            assert sale.state.final, why
            if sale.state.value == "completed":
                assert [r.amount_cents for r in held] == [sale.captured_cents], why
            else:
                assert held == [], why


LISTENING = "left dispensing; listening for its vend result for"  # recovery's log line
SILENCE = "no vend result within its vend timeout after the restart"  # its reason, given back
LAG_S = 5.0  # how late a busy machine may write the step due at a deadline


def steps_of(journal: Path, sale_id: str) -> list[tuple[float, str]]:
    """(wall time, step) of each of ``sale_id``'s journaled steps, in order."""
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)
    try:
        rows = db.execute("SELECT at, step FROM steps WHERE sale_id = ? ORDER BY id", (sale_id,))
        return [(at, step) for at, step in rows]
    finally:
        db.close()


def _recovery_acted(journal: Path, sale_id: str) -> tuple[float, float, str, str, str]:
    """``sale_id``'s vend approval (its last ``dispense.request`` step), the time and name of
    recovery's first step after its last ``recovery.start``, and the sale's state and message."""
    steps = steps_of(journal, sale_id)
    approved = [at for at, step in steps if step == "dispense.request"][-1]
    restarted = [n for n, (_, step) in enumerate(steps) if step == "recovery.start"][-1]
    acted, step = steps[restarted + 1]
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)
    try:
        [(state, message)] = db.execute(
            "SELECT state, message FROM sales WHERE sale_id = ?", (sale_id,)).fetchall()
    finally:
        db.close()
    return approved, acted, step, state, message


def given_back_at_once(journal: Path, sale_id: str, vend_timeout: float) -> None:
    """A start after a crash gave ``sale_id``'s money back without listening for its vend: the
    demo's ``virtual`` machine is made anew with each agent, so nothing of the last run's vend
    can be heard (recovery.py ``_hearing``); well before the vend's own deadline."""
    approved, acted, step, state, message = _recovery_acted(journal, sale_id)
    assert acted < approved + vend_timeout - 1, (step, acted - approved)
    assert state == "reversed", (state, message)
    assert SILENCE not in message, message
    assert "after the restart" not in message, message


def given_back_at_its_deadline(journal: Path, sale_id: str, vend_timeout: float) -> None:
    """A start after a stop or crash listened for ``sale_id``'s vend until the vend's own
    deadline (its approval, the ``dispense.request`` step, plus the trigger's ``vend_timeout``),
    heard nothing, and gave the money back then: not before (rule 13), nor long after."""
    approved, acted, step, state, message = _recovery_acted(journal, sale_id)
    deadline = approved + vend_timeout
    # the deadline is timed on the monotonic clock, the steps on the wall clock: 0.2 s apart
    assert deadline - 0.2 <= acted <= deadline + LAG_S, (step, acted - approved)
    assert state == "reversed", (state, message)
    assert SILENCE in message, message
