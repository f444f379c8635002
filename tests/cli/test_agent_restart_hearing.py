"""READY=1 is held through the restart's hearing, as two real `kiosk-agent run` processes see it.

A real agent on an MDB adapter (a pty the test plays, as tests/cli/test_agent_drain.py does)
approves a vend and is SIGKILLed while the controller drops the product. Its successor, under
systemd (NOTIFY_SOCKET), finds the sale left dispensing; the controller outlives the agent, so
recovery listens for that vend until its deadline (rule 13), the adapter's setup held back. The
controller says VEND,SUCCESS meanwhile: the sale is captured, and only then does the successor
say READY=1 (systemd counts it started once recovery has finished: docs/operations.md), well
before the vend's deadline. Selection first, and card first (the price chosen at the machine,
journaled with the choice: the capture takes it, not the funds offered).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import time
import types
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.redact import redact

from ..helpers import until
from ..platforms.vending_rig import LineDevice
from .agent_process import (
    LISTENING,
    AgentProcess,
    money_agrees,
    states,
    steps_of,
    under_systemd,
    write_config,
)

VEND_TIMEOUT = 60.0  # how long the successor would listen: far more than the test takes


def _machine(port: str, mode: str) -> str:
    card_first = (
        "    mode: card_first\n    flow: authorize_capture\n    max_funds: \"5.00\"\n"
        "    session_timeout: 30\n" if mode == "card_first" else "")
    return f"""\
triggers:
  - platform: mdb
    name: front
    port: {port}
    vend_timeout: {VEND_TIMEOUT}
    max_price: "5.00"
{card_first}"""


async def _vend_approved(adapter: LineDevice, journal: Path, mode: str) -> str:
    """The controller's customer buys item 12 at $2.50 (card first: offered $5.00 first, then
    chooses); once the agent approved the vend (C,VEND,2.50), the sale's id."""
    await until(lambda: "C,1" in adapter.heard, timeout=30)
    if mode == "card_first":
        adapter.write(b"c,STATUS,ENABLED\n")  # the agent offers the card's funds: C,START
        await until(lambda: "C,START,5.00" in adapter.heard, timeout=30)
        adapter.write(b"c,STATUS,IDLE,5.00\n")
    adapter.write(b"c,STATUS,VEND,2.50,12\n")
    await until(lambda: "C,VEND,2.50" in adapter.heard, timeout=30)
    [sale] = [sale for sale, state in states(journal).items() if state == "dispensing"]
    return sale


@pytest.mark.slow(seconds=15)
@pytest.mark.parametrize("mode", ["selection_first", "card_first"])
async def test_ready_waits_for_the_vend_heard_after_a_kill_and_captured(
    sim_factory: Any, tmp_path: Path, mode: str
) -> None:
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    journal = tmp_path / "journal.db"
    adapter = LineDevice()
    config = write_config(tmp_path, sim, journal, _machine(adapter.port, mode))
    killed = AgentProcess(config, sim)
    successor = AgentProcess(config, sim, log="successor.log", cold=True)  # its own sd_notify
    server = under_systemd(successor, tmp_path)
    loop = asyncio.get_running_loop()
    # (what the successor told systemd, the sale's state as the journal held it then)
    said: list[tuple[str, str | None]] = []
    stranded: str | None = None

    async def hear_systemd() -> None:
        while True:
            message = (await loop.sock_recv(server, 4096)).decode()
            said.append((message, states(journal).get(stranded or "")))

    def ready() -> bool:
        return any(message.startswith("READY=1") for message, _ in said)

    listener = asyncio.ensure_future(hear_systemd())
    try:
        await killed.start()
        stranded = await _vend_approved(adapter, journal, mode)
        killed.send(signal.SIGKILL)
        assert await killed.exit_code() == -signal.SIGKILL
        assert states(journal)[stranded] == "dispensing"
        heard_before = len(adapter.heard)
        await successor.start()
        await successor.wait_for_log(f"sale {stranded}: {LISTENING}", within=60)
        await successor.wait_for_log("listening for its result before the setup")
        await asyncio.sleep(0.2)  # a READY=1 not held by the hearing would be in by now
        assert not ready(), said
        assert "C,0" not in adapter.heard[heard_before:]  # the controller's session left alone
        adapter.write(b"c,VEND,SUCCESS\n")  # the product came out after the restart
        async with asyncio.timeout(30):
            while not ready():
                await asyncio.sleep(0.05)
        [(_, state_at_ready)] = [(m, s) for m, s in said if m.startswith("READY=1")]
        assert state_at_ready == "completed", (said, successor.text()[-3000:])  # captured first
        approved = [at for at, step in steps_of(journal, stranded) if step == "dispense.request"]
        assert time.time() < approved[-1] + VEND_TIMEOUT  # released by the result, not a deadline
        await until(lambda: "C,1" in adapter.heard[heard_before:])  # set up once it was heard
        successor.send(signal.SIGTERM)
        assert await successor.exit_code() == 0, successor.text()[-3000:]
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        server.close()
        await killed.close()
        await successor.close()
        adapter.close()
    await money_agrees(sim, journal)  # the ledger holds what the journal says, once
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        [(captured,)] = db.execute("SELECT captured_cents FROM sales WHERE sale_id = ?",
                                   (stranded,)).fetchall()
    finally:
        db.close()
    assert captured == 250  # the price chosen (card first: not the $5.00 offered)


async def test_a_sale_id_the_log_masks_as_a_card_number_is_still_found_in_it(
    tmp_path: Path,
) -> None:
    """This file's test failed once at load 7 (card first) waiting 60 s for a line the agent
    had written at once: its sale id, 1d9676235339429d8902f1204e1ae761, holds 13 digits in a
    row that pass the Luhn check (9676235339429), which the log's redaction masks as a card
    number ('1d967623***9429d8...'). About one random sale id in a few hundred does. What a
    test looks for in the log is now redacted as the log is."""

    class Sim:
        def ready_info(self) -> dict[str, str]:
            return {"api_key": "k", "client_secret": "s"}

    sale = "1d9676235339429d8902f1204e1ae761"
    agent = AgentProcess(tmp_path / "config.yaml", Sim())
    agent.log.write_text(json.dumps({"msg": redact(f"sale {sale}: {LISTENING} 59.0 s")}) + "\n")
    assert sale not in agent.text()  # masked, as the agent's log writes it
    agent.proc = types.SimpleNamespace(returncode=None)  # type: ignore[assignment]
    await agent.wait_for_log(f"sale {sale}: {LISTENING}", within=1)
    assert agent.says(f"sale {sale}: {LISTENING}")
