"""One agent per journal, as two real `kiosk-agent run` processes see it.

Two configurations in two directories, with their own admin ports, name one journal: whichever
agent starts second is refused before it reads, recovers or writes anything, and names the
first; reading commands keep working beside the owner; a SIGKILLed owner blocks nobody.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.cli.contract import EXIT_JOURNAL_OWNED

from .agent_process import (
    LISTENING,
    MACHINE,
    AgentProcess,
    cli,
    given_back_at_once,
    money_agrees,
    sale_in,
    states,
    steps_of,
    under_systemd,
    write_config,
)

ADMIN = """\
admin:
  port: 0
  tokens: [{name: tech, token: !env_var KIOSK_ADMIN_TOKEN}]
"""


async def refused_by(second: AgentProcess, owner: AgentProcess, journal: Path) -> None:
    await second.start()
    assert await second.exit_code() == EXIT_JOURNAL_OWNED, second.text()[-3000:]
    said = second.text()
    assert f"error: the journal {journal} is owned by another agent (pid {owner.pid}" in said
    assert "kiosk_agent run -c " + str(owner.config) in said  # the holder's command line
    assert "ready in" not in said  # it started nothing
    # nor recovered: its lines, not the word (the holder's command line may hold a path with it)
    assert "recovery finished" not in said
    assert "from the journal" not in said


@pytest.mark.slow(seconds=10)
async def test_whichever_agent_starts_second_on_one_journal_is_refused(
    sim_factory: Any, tmp_path: Path
) -> None:
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    journal = tmp_path / "shared" / "journal.db"
    # the owners start cold: the refusal names their command line (/proc), not a warm fork's
    one = AgentProcess(write_config(tmp_path / "one", sim, journal, MACHINE), sim, cold=True)
    two = AgentProcess(write_config(tmp_path / "two", sim, journal, ADMIN), sim)
    again = AgentProcess(one.config, sim, log="again.log")
    try:
        await one.start()
        await one.wait_ready()
        await sale_in(journal, "completed")
        await refused_by(two, one, journal)
        # reading beside the owner works
        code, out, err = await cli(one, "sales", "--format", "json")
        assert code == 0, err
        assert '"state": "completed"' in out
        assert (await cli(one, "sales", "attention"))[0] == 0
        one.send(signal.SIGTERM)
        assert await one.exit_code() == 0, one.text()[-3000:]

        # the other order: the second configuration owns it now, the first is refused
        two = AgentProcess(two.config, sim, log="owner.log", cold=True)
        await two.start()
        await two.wait_ready()
        await refused_by(again, two, journal)
        two.send(signal.SIGTERM)
        assert await two.exit_code() == 0, two.text()[-3000:]
    finally:
        for agent in (one, two, again):
            await agent.close()
    await money_agrees(sim, journal)


async def test_an_agent_after_a_sigkilled_one_starts_and_recovers_its_sale(
    sim_factory: Any, tmp_path: Path
) -> None:
    """The successor starts at once (ready, its journal claimed from the dead owner) and
    recovers the sale the kill left dispensing. The virtual machine is born again with this
    process and can say nothing of the last one's vend, so recovery does not listen for it
    (rule 13's "while it can still hear"): the money goes back at once, not at the vend's
    deadline (a machine that outlives the agent is listened for: test_agent_drain.py's mdb)."""
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    journal = tmp_path / "journal.db"
    # a dispense of 3 s: the kill lands while the product drops, even on a loaded machine; the
    # vend timeout of 6 s is how long the successor listens from the vend's approval
    config = write_config(tmp_path, sim, journal, MACHINE.replace("1.0", "3.0")
                          + "    vend_timeout: 6\n")
    killed = AgentProcess(config, sim)
    successor = AgentProcess(config, sim)
    try:
        await killed.start()
        stranded = await sale_in(journal, "dispensing")
        killed.send(signal.SIGKILL)
        assert await killed.exit_code() == -signal.SIGKILL
        assert states(journal)[stranded] == "dispensing"
        await successor.start()
        await successor.wait_ready()
        await successor.wait_for_log("recovery finished: 1 of 1 open sale(s) ended")
        # the dispense was never confirmed, and nothing can say it now: the money goes back
        given_back_at_once(journal, stranded, vend_timeout=6)
        assert not successor.says(f"sale {stranded}: {LISTENING}")
        successor.send(signal.SIGTERM)
        assert await successor.exit_code() == 0, successor.text()[-3000:]
    finally:
        await killed.close()
        await successor.close()
    await money_agrees(sim, journal)


async def test_a_lock_file_removed_under_a_running_agent_still_keeps_a_second_one_out(
    sim_factory: Any, tmp_path: Path
) -> None:
    """docs said the lock file "means nothing" once its agent is dead; removed while the agent
    ran, a second `run` found no claim and started on the same journal."""
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    journal = tmp_path / "shared" / "journal.db"
    # the owners start cold: the refusal names their command line (/proc), not a warm fork's
    one = AgentProcess(write_config(tmp_path / "one", sim, journal, MACHINE), sim, cold=True)
    two = AgentProcess(write_config(tmp_path / "two", sim, journal, ADMIN), sim)
    try:
        await one.start()
        await one.wait_ready()
        lock = journal.with_name("journal.db.lock")
        lock.unlink()
        await one.wait_for_log("journal.db.lock was removed while this agent ran; claimed again")
        await refused_by(two, one, journal)
        one.send(signal.SIGTERM)
        assert await one.exit_code() == 0, one.text()[-3000:]
    finally:
        for agent in (one, two):
            await agent.close()
    await money_agrees(sim, journal)


def test_the_unit_file_does_not_restart_an_agent_refused_its_journal() -> None:
    """A copied unit file fails once, visibly, instead of restarting until systemd's start limit:
    restarting cannot help while the other agent lives."""
    unit = Path(__file__).parents[2] / "systemd" / "kiosk-agent.service"
    settings = dict(
        line.split("=", 1) for line in unit.read_text().splitlines() if "=" in line
    )
    assert settings["Restart"] == "on-failure"
    assert settings["RestartPreventExitStatus"].split() == [str(EXIT_JOURNAL_OWNED)]


async def test_under_systemd_ready_follows_the_recovery_of_the_sale_the_kill_left(
    sim_factory: Any, tmp_path: Path
) -> None:
    """Under systemd (NOTIFY_SOCKET), the successor of a SIGKILLed agent says READY=1 only once
    recovery has settled the sale the kill left dispensing; the virtual machine, born again with
    it, cannot say how that vend ended, so the money goes back at once, before the vend's own
    deadline (a machine that outlives the agent is listened for until then:
    tests/sales/test_recovery.py, test_agent_drain.py's mdb)."""
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    journal = tmp_path / "journal.db"
    config = write_config(tmp_path, sim, journal, MACHINE.replace("1.0", "3.0")
                          + "    vend_timeout: 6\n")
    killed = AgentProcess(config, sim)
    successor = AgentProcess(config, sim, log="successor.log", cold=True)  # its own sd_notify
    server = under_systemd(successor, tmp_path)
    loop = asyncio.get_running_loop()
    # (what the agent told systemd, the sale's state then, when: wall clock)
    said: list[tuple[str, str, float]] = []
    try:
        await killed.start()
        stranded = await sale_in(journal, "dispensing")
        killed.send(signal.SIGKILL)
        assert await killed.exit_code() == -signal.SIGKILL
        await successor.start()
        async with asyncio.timeout(30):
            while not any(m.startswith("READY=1") for m, _, _ in said):
                message = (await loop.sock_recv(server, 4096)).decode()
                said.append((message, states(journal)[stranded], time.time()))
        [ready] = [n for n, (m, _, _) in enumerate(said) if m.startswith("READY=1")]
        assert said[ready][1] == "reversed", said  # ready once recovery settled it
        approved = [at for at, step in steps_of(journal, stranded) if step == "dispense.request"]
        assert said[ready][2] < approved[-1] + 6 - 1, said  # not held to the vend's deadline
        assert not successor.says(f"sale {stranded}: {LISTENING}")
        given_back_at_once(journal, stranded, vend_timeout=6)
        successor.send(signal.SIGTERM)
        assert await successor.exit_code() == 0, successor.text()[-3000:]
    finally:
        server.close()
        await killed.close()
        await successor.close()
    await money_agrees(sim, journal)
