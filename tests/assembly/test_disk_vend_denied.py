"""A card-first customer chooses while the journal's disk is full: the choice cannot be
journaled, so the vend is never approved and the machine is told no. Once space returns the
money goes back, and no face tells a person the product "may have dispensed" (before: `kiosk-agent
sales late-vends` listed it, "the agent stopped mid-vend; no vend result heard after the
restart", and health counted it, though the agent had neither stopped nor approved the vend;
seen on an MDB card-first machine under `kiosk-agent run`, i42-newcomer 2026-11-30). Held to
the journal on disk, the simulator's ledger and the real `kiosk-agent sales late-vends`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.cli import main
from kiosk_agent.sales.model import (
    DispenseOutcome,
    DispenseStatus,
    Flow,
    SaleEvent,
    SaleRequest,
    Selection,
)
from kiosk_agent.sales.runner import Sale
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.models import TransStatus

from .agent_helpers import ScriptedDispenser
from .disk_helpers import fill, free, ledger

# the fixtures: the agent (a kiosk API in front) with its journal on a small disk
from .test_disk import agent, disk, fill_at, until  # noqa: F401


class FullDiskChooser:
    """A card-first machine whose customer chooses B1 ($3.25) just as the disk fills up."""

    def __init__(self, full: Path) -> None:
        self.disk = full
        self.offered: list[int] = []
        self.approved: list[int] = []
        self.denied: list[str] = []

    async def choose(self, funds_cents: int) -> Selection:
        self.offered.append(funds_cents)
        fill(self.disk)
        return Selection("B1", 325)

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        self.approved.append(authorized_cents)  # never: no vend without its journaled choice
        return DispenseOutcome(DispenseStatus.VENDED, vended_cents=325, product="B1")

    async def deny(self, reason: str) -> None:
        self.denied.append(reason)


async def test_a_choice_made_on_a_full_disk_is_denied_and_never_told_as_a_maybe_vend(
    agent: Agent, disk: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
) -> None:
    machine = FullDiskChooser(disk)
    request = SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=500,
                          chosen_at_machine=True)
    sale = await agent.sales.start(request, machine)
    held = await asyncio.wait_for(sale.result(), 20)
    assert held.unwritten  # the choice's step could not be written: held in memory
    assert machine.offered == [500]
    assert machine.approved == []  # the vend was never approved
    assert machine.denied == ["journal not writable"]

    free(disk)
    await until(lambda: not agent.unwritten.sale_ids, 10)
    record = agent.journal.get(sale.sale_id)
    assert record is not None
    assert (record.state, record.captured_cents, record.reversed_cents) == (
        SaleState.REVERSED, 0, 500)
    # what happened, in the words a tech reads (`sales`): not a crash's "interrupted"
    assert record.message.startswith(
        "vend refused before it was approved: the journal could not be written (disk full or "
        "read-only); nothing vended"), record.message
    assert "interrupted" not in record.message
    [row] = await ledger(agent.service, sale.order_id)
    assert row.status is TransStatus.VOIDED  # the hold released, as the journal says
    steps = [s.step for s in agent.journal.steps(sale.sale_id)]
    assert Step.LATE_VEND not in steps  # no maybe: no vend was approved
    assert Step.DISPENSE_RESULT in steps  # the machine's end, told no, journaled

    # the faces a person reads: nothing went out unpaid
    assert (agent.health.snapshot().sales.late_vends,
            agent.health.snapshot().sales.maybe_dispensed) == (0, 0)
    capsys.readouterr()
    code = await asyncio.to_thread(
        main, ["sales", "late-vends", "-c", str(disk / "agent.yaml"), "--json"])
    listed: Any = json.loads(capsys.readouterr().out)
    assert (code, listed["late_vends"]) == (0, [])


async def _sold_as_the_disk_fills(
    agent: Agent, step: str, disk: Path,  # noqa: F811
) -> tuple[ScriptedDispenser, Sale, SaleEvent]:
    """A $2.50 authorize-capture sale of A1 on a ScriptedDispenser, the disk filling the moment
    the journal has written ``step``: the machine, the sale, and what its end returned."""
    machine = ScriptedDispenser()
    filler = asyncio.create_task(fill_at(agent, step, disk))
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=250,
                    product="A1"), machine)
    held = await asyncio.wait_for(sale.result(), 20)
    await filler
    return machine, sale, held


async def test_a_vend_whose_request_met_a_full_disk_is_denied_and_never_told_as_a_maybe_vend(
    agent: Agent, disk: Path,  # noqa: F811
) -> None:
    """Selection first: the disk fills while the authorization is asked, so its answer and the
    vend's own request (`dispense.request`, journaled before the machine is told to vend)
    cannot be written: the machine is told no, nothing vended, and no maybe is told once space
    returns."""
    machine, sale, held = await _sold_as_the_disk_fills(agent, "authorize.request", disk)
    assert held.unwritten
    assert machine.authorized == []  # never told to vend
    assert machine.denied == ["journal not writable"]
    free(disk)
    await until(lambda: not agent.unwritten.sale_ids, 10)
    record = agent.journal.get(sale.sale_id)
    assert record is not None
    assert record.state is SaleState.REVERSED
    assert record.message == ("vend refused before it was approved: the journal could not be "
                              "written (disk full or read-only); nothing vended; $2.50 voided")
    steps = [s.step for s in agent.journal.steps(sale.sale_id)]
    assert Step.LATE_VEND not in steps
    assert (agent.health.snapshot().sales.late_vends,
            agent.health.snapshot().sales.maybe_dispensed) == (0, 0)


async def test_an_authorization_whose_request_met_a_full_disk_was_never_sent_and_ends_at_once(
    agent: Agent, disk: Path,  # noqa: F811
) -> None:
    """The disk fills as the card is read: the `authorize.request` step cannot be written, so
    the authorization is never sent (journal first). Once space returns the sale is written
    again and ends "no charge" without waiting the authorization's answer window (before: 17 s
    on a real unit, its reader out of service meanwhile), and nothing is held at the service."""
    machine, sale, held = await _sold_as_the_disk_fills(agent, "read_card.accepted", disk)
    assert held.unwritten
    assert machine.authorized == []
    assert await ledger(agent.service, sale.order_id) == []  # never sent: no row at the service
    free(disk)
    waited = await until(lambda: not agent.unwritten.sale_ids, 30)
    record = agent.journal.get(sale.sale_id)
    assert record is not None
    steps = [s.step for s in agent.journal.steps(sale.sale_id)]
    assert (record.state, record.message) == (
        SaleState.FAILED, "the authorization was never sent: the journal could not write its "
        "request (disk full or read-only); no money moved")
    # written again from memory, then ended: no wait for an answer that cannot come
    assert steps[-4:] == [Step.READ_CARD_DONE, Step.AUTHORIZE_REQUEST, Step.RECOVERY_START,
                          Step.RECOVERY_DONE]
    assert waited < 10.0  # was 25.0 s here, the simulator's answer window (load 3.6)
    assert await ledger(agent.service, sale.order_id) == []  # still nothing at the service
    await until(lambda: agent.health.snapshot().availability[0].available, 5)  # back in service
