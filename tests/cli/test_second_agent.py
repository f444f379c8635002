"""A second agent on the same reader, as real `kiosk-agent run` processes see it.

A tech starts `kiosk-agent run` by hand while the unit's service runs, with a configuration of
their own: its own journal (a new one, or a copy of the unit's) but the unit's MDB adapter (a
pty the test plays) and the unit's terminal. The journal's claim does not stop it (another
journal), so the adapter must: the second agent never writes a byte to it nor reads one from
it while the first holds it (a byte it read is a byte the first never hears: a vend result lost,
a paid product given back), and says who holds it, by pid and command line. Once the first
stops, the second takes the reader within a second (and a kiosk API's port within a step of
its backoff).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from ..helpers import sim_call, until
from ..platforms.vending_rig import LineDevice
from .agent_process import AgentProcess, money_agrees, sale_reaches, states, write_config
from .test_tech_shell import free_port


def _machine(port: str) -> str:
    return f"""\
triggers:
  - platform: mdb
    name: front
    port: {port}
    vend_timeout: 30
    max_price: "5.00"
"""


@pytest.mark.slow(seconds=15)
@pytest.mark.parametrize("journal_of_its_own", ["new", "copied"])
async def test_a_second_agent_on_the_reader_never_touches_it_and_names_who_holds_it(
    sim_factory: Any, tmp_path: Path, journal_of_its_own: str
) -> None:
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    adapter = LineDevice()
    journal = tmp_path / "unit" / "journal.db"
    theirs = tmp_path / "tech" / "journal.db"
    # the unit starts cold: the refusal names its command line (/proc), not a warm fork's
    unit = AgentProcess(write_config(tmp_path / "unit", sim, journal, _machine(adapter.port)), sim,
                        cold=True)
    tech = AgentProcess(write_config(tmp_path / "tech", sim, theirs, _machine(adapter.port)), sim)
    try:
        await unit.start()
        await until(lambda: "C,1" in adapter.heard, timeout=30)  # the unit set its reader up
        await unit.wait_ready()
        if journal_of_its_own == "copied":  # the unit's journal, copied while it runs
            theirs.parent.mkdir(parents=True, exist_ok=True)
            for part in journal.parent.iterdir():
                if part.name.startswith("journal.db") and not part.name.endswith(".lock"):
                    shutil.copyfile(part, theirs.parent / part.name)
        heard_before = len(adapter.heard)
        await tech.start()
        await tech.wait_for_log(
            f"cannot open {adapter.port}: held by another process (pid {unit.pid}:", within=30
        )
        assert f"kiosk_agent run -c {unit.config}" in tech.text()  # the holder's command line
        assert adapter.heard[heard_before:] == []  # the second agent wrote nothing to it
        # a customer at the machine: the unit hears every byte, and sells once
        adapter.write(b"c,STATUS,VEND,2.50,12\n")
        await until(lambda: "C,VEND,2.50" in adapter.heard[heard_before:], timeout=30)
        [sale] = [sale for sale, state in states(journal).items() if state == "dispensing"]
        adapter.write(b"c,VEND,SUCCESS\n")
        await sale_reaches(journal, sale, "completed")
        assert adapter.heard[heard_before:].count("C,VEND,2.50") == 1
        assert [s for s in states(theirs) if s not in states(journal)] == []  # no sale of its own
        # the unit stops: the tech's agent takes the reader within a second or so
        heard_before = len(adapter.heard)  # the unit disables its reader as it stops
        unit.send(signal.SIGTERM)
        assert await unit.exit_code() == 0, unit.text()[-3000:]
        await tech.wait_for_log("mdb:front: serial link connected", within=10)
        if journal_of_its_own == "new":  # its own unit: it sets the reader up and sells
            await until(lambda: "C,1" in adapter.heard[heard_before:], timeout=10)
        else:  # the copy is refused as a copy, said once (not again at each look, every second)
            # the id is read again every second: a few looks, each of which said it again (a
            # warning a second, and a wake-up of the charge check, which asks nothing)
            asked = await sim_call(sim, "POST", "/sim/faults", {
                "path": "/ords/sprint/api/3p/v1/*", "method": "GET", "fault": "latency",
                "delay_s": 0})  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await tech.wait_for_log("the unit's id is read again", within=3)
            [counted] = [f for f in (await sim_call(sim, "GET", "/sim/faults"))["faults"]
                         if f["id"] == asked["id"]]
            assert counted["hits"] == 0  # a copy not adopted asks nothing about the charges
            refusal = f"its journal was made on another machine (made at {journal}"
            errors = [line for line in tech.text().splitlines() if '"level": "ERROR"' in line]
            assert sum(refusal in line for line in errors) == 1, tech.text()[-3000:]
            assert "the unit's id is read again" not in tech.text()
        tech.send(signal.SIGTERM)
        assert await tech.exit_code() == 0, tech.text()[-3000:]
    finally:
        await unit.close()
        await tech.close()
        adapter.close()
    await money_agrees(sim, journal)


@pytest.mark.slow(seconds=12)
async def test_a_second_agent_on_the_kiosk_apis_port_names_who_serves_it_and_waits_for_it(
    sim_factory: Any, tmp_path: Path
) -> None:
    """The same with a touchscreen kiosk: the second agent's kiosk API finds its port taken. It
    logged a traceback ("trigger kiosk_api:screen cannot start", address already in use), then
    one line naming the process that serves the port, and never tried the port again until
    restarted; now it names that process (pid and command line) and waits for the port, the
    rest of the agent running, and serves it once the unit lets go (i42-env)."""
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    port = free_port()
    screen = f"""\
triggers:
  - {{platform: kiosk_api, name: screen, token: !env_var KIOSK_ADMIN_TOKEN, port: {port},
      products: {{A1: "2.50"}}}}
"""
    unit = AgentProcess(write_config(tmp_path / "unit", sim, tmp_path / "unit" / "journal.db",
                                     screen), sim, cold=True)
    tech = AgentProcess(write_config(tmp_path / "tech", sim, tmp_path / "tech" / "journal.db",
                                     screen), sim)
    try:
        await unit.start()
        await unit.wait_ready()
        await tech.start()
        await tech.wait_for_log(f"kiosk_api:screen: cannot listen on 127.0.0.1:{port}: the "
                                f"port is in use by pid {unit.pid}: ")
        await tech.wait_ready()
        said = tech.text()
        assert f"kiosk_agent run -c {unit.config}" in said
        assert "NOT ready to sell" not in said
        assert "Traceback" not in said
        unit.send(signal.SIGTERM)
        assert await unit.exit_code() == 0, unit.text()[-3000:]
        # within a step of the backoff (5 s at most) of the port let go
        await tech.wait_for_log(f"kiosk_api:screen: listening on 127.0.0.1:{port} at last",
                                within=15)
        tech.send(signal.SIGTERM)
        assert await tech.exit_code() == 0, tech.text()[-3000:]
    finally:
        await unit.close()
        await tech.close()
