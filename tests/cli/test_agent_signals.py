"""No signal but SIGKILL strands a sale: each signal sent to `kiosk-agent run` mid-dispense.

A real agent process sells on a virtual vending machine against a simulator in this process;
when the journal shows a sale at `dispensing` (the product is dropping) the signal is sent. The
sale must end `completed`, the simulator's ledger must hold exactly its captured amount, and no
sale may be left at `dispensing`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.cli.contract import (
    CRASH_SIGNALS,
    IGNORED_SIGNALS,
    STOP_SIGNALS,
    StopSignals,
    signal_name,
)

from .agent_process import (
    MACHINE,
    AgentProcess,
    money_agrees,
    sale_in,
    sale_reaches,
    states,
    write_config,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("signum", list(STOP_SIGNALS), ids=lambda s: s.name)
async def test_a_stopping_signal_mid_dispense_lets_the_sale_finish(
    signum: signal.Signals, sim_factory: Any, tmp_path: Path
) -> None:
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    journal = tmp_path / "journal.db"
    agent = AgentProcess(write_config(tmp_path, sim, journal, MACHINE), sim)
    try:
        await agent.start()
        dropping = await sale_in(journal, "dispensing")
        agent.send(signum)
        assert await agent.exit_code() == STOP_SIGNALS[signum], agent.text()[-3000:]
    finally:
        await agent.close()
    assert states(journal)[dropping] == "completed", agent.text()[-3000:]
    await money_agrees(sim, journal)
    said = [json.loads(line)["msg"] for line in agent.text().splitlines() if line[:1] == "{"]
    assert f"{signum.name} received: stopping: new sales refused" in "\n".join(said)


async def test_an_ignored_signal_mid_dispense_changes_nothing(
    sim_factory: Any, tmp_path: Path
) -> None:
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    journal = tmp_path / "journal.db"
    agent = AgentProcess(write_config(tmp_path, sim, journal, MACHINE), sim)
    try:
        await agent.start()
        dropping = await sale_in(journal, "dispensing")
        for signum in IGNORED_SIGNALS:
            agent.send(signum)
            await agent.wait_for_log(f"{signal_name(signum)} received: ignored")
        await sale_reaches(journal, dropping, "completed")
        agent.send(signal.SIGTERM)
        assert await agent.exit_code() == 0, agent.text()[-3000:]
    finally:
        await agent.close()
    await money_agrees(sim, journal)


async def test_under_nohup_sighup_is_ignored_and_the_agent_sells_on(
    sim_factory: Any, tmp_path: Path
) -> None:
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    journal = tmp_path / "journal.db"
    agent = AgentProcess(write_config(tmp_path, sim, journal, MACHINE), sim, nohup=True)
    try:
        await agent.start()
        dropping = await sale_in(journal, "dispensing")
        agent.send(signal.SIGHUP)
        await agent.wait_for_log("SIGHUP received: ignored (started with SIGHUP ignored")
        await sale_reaches(journal, dropping, "completed")
        agent.send(signal.SIGTERM)
        assert await agent.exit_code() == 0, agent.text()[-3000:]
    finally:
        await agent.close()
    await money_agrees(sim, journal)


def test_the_signal_table_in_docs_is_the_one_in_the_code() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("### Signals", 1)[1].split("\n#", 1)[0]
    rows = {
        name.strip(): (what, code)
        for names, what, code in re.findall(r"^\| (SIG[^|]+) \| (.+?) \| (\S+) \|$", section, re.M)
        for name in names.split(",")
    }
    for signum, code in STOP_SIGNALS.items():
        what, documented = rows[signum.name]
        assert what.startswith("graceful stop"), signum
        assert documented == str(code), signum
    for signum in IGNORED_SIGNALS:
        name = signal_name(signum)
        shown = "SIGRTMIN+n" if name.startswith("SIGRTMIN+") else name
        assert rows[shown][0].startswith("ignored"), name
    for signum in CRASH_SIGNALS:
        assert rows[signum.name][0].startswith("a crash"), signum


# By default these are ignored: nothing is stranded. (SIGSTOP, which cannot be caught, freezes
# the agent as a whole until SIGCONT; SIGTSTP, SIGTTIN and SIGTTOU did the same to a sale
# mid-dispense until they were ignored.)
HARMLESS = {signal.SIGCHLD, signal.SIGURG, signal.SIGWINCH, signal.SIGCONT, signal.SIGSTOP}


def test_every_signal_that_would_end_the_agent_is_a_stop_or_ignored() -> None:
    """Every signal whose default ends the process (the man page's Term and Core) is a
    graceful stop or ignored; what is left is SIGKILL (cannot be caught), SIGPIPE (Python
    ignores it) and the crash signals. SIGALRM, SIGPWR or SIGRTMIN once killed it mid-sale."""
    left = (
        set(signal.valid_signals()) - set(STOP_SIGNALS) - set(IGNORED_SIGNALS) - HARMLESS
        - CRASH_SIGNALS
    )  # fmt: skip
    assert left == {signal.SIGKILL, signal.SIGPIPE}, sorted(signal_name(s) for s in left)


async def test_an_ignored_signal_is_logged_on_the_loop_and_remove_gives_the_handler_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = signal.getsignal(signal.SIGUSR2)
    stops = StopSignals("stopping").install()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        for _ in range(100):  # the handler hands the line to the loop: a few turns at most
            if "SIGUSR2 received: ignored" in caplog.text:
                break
            await asyncio.sleep(0.01)
        assert "SIGUSR2 received: ignored (it does not stop the agent)" in caplog.text
        assert not stops.event.is_set()
    finally:
        stops.remove()
    assert signal.getsignal(signal.SIGUSR2) == before
