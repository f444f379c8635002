"""A tech's shell on the journal while the unit sells, as real processes see it.

The agent (`kiosk-agent run`, a virtual machine whose customers come back to back, the
simulator over HTTP) sells while a tech runs the reading commands and a `sqlite3` shell on its
journal on disk.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.sales.journal import Journal, JournalError

from ..sales.test_journal import new_sale
from .agent_process import (
    MACHINE,
    AgentProcess,
    cli,
    money_agrees,
    sale_in,
    states,
    write_config,
)

SQLITE3 = shutil.which("sqlite3")


class Shell:
    """The `sqlite3` command-line shell on the journal, as a tech opens it."""

    def __init__(self, journal: Path) -> None:
        self.journal = journal
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> Shell:
        assert SQLITE3 is not None
        self.proc = await asyncio.create_subprocess_exec(
            SQLITE3, str(self.journal), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        await self.run(".timeout 5000")  # as a tech's would: else a commit under way refuses it
        return self

    async def run(self, sql: str, within: float = 30.0) -> str:
        """``sql`` typed in; what the shell answered, up to a marker it echoes after it."""
        assert self.proc is not None
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(f"{sql}\nSELECT 'done-marker';\n".encode())
        await self.proc.stdin.drain()
        said = b""
        async with asyncio.timeout(within):
            while b"done-marker" not in said:
                said += await self.proc.stdout.readline()
        return said.decode().replace("done-marker\n", "")

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            async with asyncio.timeout(30):
                await self.proc.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def admin(port: int) -> str:
    return f"""\
admin:
  port: {port}
  tokens: [{{name: tech, token: !env_var KIOSK_ADMIN_TOKEN}}]
"""


async def health_answers_within(port: int, seconds: float) -> bool:
    """Whether the agent's /api/health answered within ``seconds`` (its event loop turned)."""
    token = {"Authorization": "Bearer an-admin-token-of-at-least-24-chars"}
    began = time.monotonic()
    async with aiohttp.ClientSession() as http, http.get(
        f"http://127.0.0.1:{port}/api/health", headers=token
    ) as answer:
        await answer.read()
    return time.monotonic() - began < seconds


async def journal_health(port: int) -> dict[str, Any]:
    """The agent's /api/health ``journal`` part, as `kiosk-agent health` shows it."""
    token = {"Authorization": "Bearer an-admin-token-of-at-least-24-chars"}
    async with aiohttp.ClientSession() as http, http.get(
        f"http://127.0.0.1:{port}/api/health", headers=token
    ) as answer:
        journal: dict[str, Any] = (await answer.json())["journal"]
    return journal


def completed(journal: Path) -> set[str]:
    return {sale for sale, state in states(journal).items() if state == "completed"}


async def more_completed(journal: Path, than: set[str], count: int, within: float = 30) -> None:
    async with asyncio.timeout(within):
        while len(completed(journal) - than) < count:
            await asyncio.sleep(0.05)


NO_SHELL = pytest.mark.skipif(SQLITE3 is None, reason="no sqlite3 shell on this machine")


@NO_SHELL
@pytest.mark.slow(seconds=20)
async def test_a_shell_holding_the_write_lock_is_named_and_the_readers_never_wait_for_it(
    sim_factory: Any, tmp_path: Path
) -> None:
    """`BEGIN IMMEDIATE;` typed in a `sqlite3` shell while the unit sells: every reading
    command (`sales`, its CSV export, `sales late-vends`, `sales attention`, `doctor`, `unit
    show`) answers at once, as none of them takes the journal's write lock (each would wait out
    SQLite's busy wait, 5 s, and fail with "database is locked"); the agent's next write finds
    the lock held past its busy wait, goes out of service and names the shell by pid and
    command line; `ROLLBACK;` and it sells again, nothing lost (the ledger and the journal
    agree)."""
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    journal = tmp_path / "journal.db"
    port = free_port()
    # the checker's rounds (each probes the journal) a second apart, not a minute
    checker = "health:\n  ping_interval: 1\n"
    agent = AgentProcess(write_config(tmp_path, sim, journal, MACHINE + admin(port) + checker),
                         sim)
    shell = Shell(journal)
    try:
        await agent.start()
        await agent.wait_ready()
        first = await sale_in(journal, "completed")
        await shell.start()
        assert shell.proc is not None
        assert await shell.run("BEGIN IMMEDIATE;") == ""  # taken
        for args in (("sales", "--format", "json"), ("sales", "--format", "csv"),
                     ("sales", "late-vends"), ("sales", "attention"), ("doctor",),
                     ("unit", "show", "--json")):  # fmt: skip
            code, out, err = await cli(agent, *args)
            assert code == 0, (args, err[-2000:])
            assert "database is locked" not in out + err, args
            if args[0:2] == ("sales", "--format"):
                assert first in out, args
        # a command that opens the journal to write, with nothing to migrate nor to write: its
        # open took the write lock (5 s of busy wait, then "database is locked") before
        code, out, err = await cli(agent, "sales", "late-vends", "--ack", "all")
        assert (code, "database is locked" in err) == (1, False), err[-2000:]
        assert "no late vend to acknowledge for 'all'" in err
        await agent.wait_for_log(
            f"its write lock is held by another process: pid {shell.proc.pid}: {SQLITE3} "
            f"{journal}", within=30,
        )  # fmt: skip
        assert "journal NOT writable" in agent.text()  # out of service, said
        # the event loop is not held in SQLite's busy wait while the shell keeps the lock: the
        # admin API answers (it stood still up to 15 s at a time, 20 s of 20, before)
        for _ in range(5):
            assert await health_answers_within(port, 4.0)
        # health names the holder as the log does, also once the checker's journal probe has
        # met the lock (the first refusal wakes it): before, the probe's bare "database is
        # locked" replaced the name in health's journal detail a second after it was said
        holder = f"held by another process: pid {shell.proc.pid}: {SQLITE3} {journal}"
        async with asyncio.timeout(30):
            while (said := await journal_health(port))["detail"] == "" or said["writable"]:
                await asyncio.sleep(0.1)
        probed = said["checked_at"]
        async with asyncio.timeout(30):  # a probe round after the one that said it first
            while (said := await journal_health(port))["checked_at"] == probed:
                await asyncio.sleep(0.1)
        assert said["writable"] is False
        assert holder in said["detail"], said
        # in the words of the first refusal: a reader's reason does not change at each probe
        assert said["detail"].startswith(f"cannot write the journal at {journal}: "), said
        await shell.run("ROLLBACK;")
        await agent.wait_for_log("journal takes writes again")
        await agent.wait_for_log("terminal SIM-0001 back in service")
        agent.send(signal.SIGTERM)
        assert await agent.exit_code() == 0, agent.text()[-3000:]
    finally:
        await shell.close()
        await agent.close()
    await money_agrees(sim, journal)


@NO_SHELL
@pytest.mark.slow(seconds=20)
async def test_a_shell_holding_a_read_transaction_keeps_no_customer_waiting(
    sim_factory: Any, tmp_path: Path
) -> None:
    """`BEGIN; SELECT ...;` left open in a `sqlite3` shell (a snapshot held): the agent's
    commits go on (WAL readers never block the writer), back-to-back sales complete, and the
    journal is never found unwritable; the WAL cannot be checkpointed past the shell's snapshot
    meanwhile and grows, and shrinks back once the shell lets go."""
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    journal = tmp_path / "journal.db"
    agent = AgentProcess(write_config(tmp_path, sim, journal, MACHINE), sim)
    shell = Shell(journal)
    try:
        await agent.start()
        await agent.wait_ready()
        await sale_in(journal, "completed")
        await shell.start()
        said = await shell.run("BEGIN; SELECT count(*) FROM steps;")
        before = completed(journal)
        await more_completed(journal, before, 3)
        assert (await shell.run("SELECT count(*) FROM steps;")) == said  # its snapshot held
        assert "NOT writable" not in agent.text()
        await shell.run("COMMIT;")
        agent.send(signal.SIGTERM)
        assert await agent.exit_code() == 0, agent.text()[-3000:]
    finally:
        await shell.close()
        await agent.close()
    await money_agrees(sim, journal)


@NO_SHELL
async def test_a_lock_held_by_another_process_is_waited_for_briefly_until_a_write_goes_through(
    tmp_path: Path,
) -> None:
    """The journal on disk, the lock held by a real `sqlite3` shell: another open of it at this
    schema takes no write lock; the first write waits the busy wait (5 s; 0.5 s here) and
    fails naming the shell; the next ones wait 0.1 s for it, not 5 s (SQLite's wait is on the
    event loop's thread); the first write that goes through sets the busy wait back to 5 s."""
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    shell = Shell(journal.path)
    try:
        await shell.start()
        assert shell.proc is not None
        assert await shell.run("BEGIN IMMEDIATE;") == ""  # taken
        # another open of the journal, at this schema: only read (it waited out the busy wait
        # and failed "database is locked" when its migration's transaction took the lock)
        began = time.monotonic()
        beside = Journal(journal.path)
        await asyncio.to_thread(beside.open)
        beside.close()
        assert time.monotonic() - began < 4.9
        sale = new_sale(1)
        journal.db.execute("PRAGMA busy_timeout=500")  # the usual wait (5 s), shorter for a test
        began = time.monotonic()
        with pytest.raises(JournalError, match=rf"held by another process: pid {shell.proc.pid}"):
            await asyncio.to_thread(journal.create, sale)
        assert time.monotonic() - began >= 0.45  # the busy wait, for a lock that may be brief
        assert journal.db.execute("PRAGMA busy_timeout").fetchone()[0] == 100
        with pytest.raises(JournalError, match="database is locked"):
            await asyncio.to_thread(journal.create, sale)
        assert journal.db.execute("PRAGMA busy_timeout").fetchone()[0] == 100
        await shell.run("ROLLBACK;")
        journal.create(sale)
        assert journal.db.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
        assert journal.get("s1") is not None
    finally:
        await shell.close()
        journal.close()
    db = sqlite3.connect(journal.path)
    try:
        assert db.execute("SELECT count(*) FROM sales").fetchone()[0] == 1
    finally:
        db.close()
