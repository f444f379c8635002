"""Who gave the money back, when the agent finds a give-back it did not hear the answer of.

The agent names itself on every void and refund it sends (``user_identifier``, the service's
field for the user that initiated the activity: sales/steps.py ``agent_user``); the simulator
keeps it on the refund's own row, and on a voided row (docs/interface-choices.md). After a
restart, recovery's words say whose give-back it found: a person's at the service while the
agent was down, or the agent's own, sent before the kill and never answered. The amounts are
as before; the words were the agent's in both (2026-11-30: "$2.00 refunded, the rest of the
$3.00 charge", whoever refunded it). Each test: a real charge on the real simulator, the
journal as the killed agent left it, then a real agent's start; the words against the
simulator's own rows."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.sales.journal import SaleRecord
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.sales.steps import agent_user
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import TransStatus
from tests.helpers import sim_call
from tests.sales.test_recovery import authorize, leave_open, rows

WAIT_S = 60.0


async def _charge(sim: Any, *, settled: bool) -> tuple[ServiceClient, str]:
    """A real $3.00 charge under the crashed sale's order id: captured and settled (a refund
    gives it back), or only authorized (a void does)."""
    service = ServiceClient(settings_from_ready(sim.ready_info()))
    await service.__aenter__()
    trans_id = await authorize(service, "KACRASHED1", capture=settled)
    if settled:
        sim.ctx.ledger.update(trans_id, trans_status_id=TransStatus.SETTLED)
    return service, trans_id


async def _restarted(
    agent_factory: Any, sim: Any
) -> tuple[Agent, SaleEvent, SaleRecord | None]:
    """An agent started on ``sim`` over the journal the killed one left, its recovery done: the
    agent, the one end recovery told, and the crashed sale as the journal then holds it."""
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    return agent, event, agent.journal.get("crashed1")


async def test_a_persons_refund_while_the_agent_was_down_is_said_to_be_theirs(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """The agent was killed giving back a $3.00 charge (journaled, not sent); a person refunds
    it at the service meanwhile, naming themself. The restart finds it refunded, and says by
    whom: not "the agent"."""
    sim = await sim_factory(time_scale=300, transactions=0)
    service, trans_id = await _charge(sim, settled=True)
    try:
        persons = await service.payments.void_or_refund(trans_id, user_identifier="jane")
    finally:
        await service.__aexit__(None, None, None)
    leave_open(tmp_path, state=SaleState.REVERSING, trans_id=trans_id, authorized_cents=300,
               captured_cents=300, message="dispense failed")
    agent, event, record = await _restarted(agent_factory, sim)
    assert record is not None
    assert event.message == record.message  # what the page, the CLI and HA are told
    assert record.state is SaleState.REVERSED, record.message
    assert (record.captured_cents, record.reversed_cents) == (300, 300)  # money as before
    assert record.reverse_trans_id == persons.trans_id
    assert "$3.00 refunded by 'jane' (not the agent)" in record.message, record.message
    assert "by the agent" not in record.message
    # `kiosk-agent sales show` (the page's sale, the admin API's) says the same words
    from kiosk_agent.cli.sales import sale_text

    shown = sale_text(record, agent.journal.steps("crashed1"))
    assert "$3.00 refunded by 'jane' (not the agent)" in shown
    assert "nothing charged ($3.00 given back)" in shown  # the money, as before
    [refund] = [r for r in await rows(agent.service, "KACRASHED1")
                if r.status is TransStatus.REFUND]
    assert refund.user_identifier == "jane"  # the service's own row, as the words say


async def test_a_persons_refund_of_the_rest_names_them_and_what_was_refunded_before(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """$1.00 of the $3.00 charge refunded before (the journal holds it); the agent was killed
    before it sent its refund of the $2.00 left, and a person refunded that rest meanwhile,
    naming no one. Before, the words gave the $2.00 to the agent ("the latest refund ended the
    charge's refunds (the agent's)"); the amounts stay."""
    sim = await sim_factory(time_scale=300, transactions=0)
    service, trans_id = await _charge(sim, settled=True)
    try:
        assert (await service.payments.void_or_refund(trans_id, amount=100)).refunded
        await service.payments.void_or_refund(trans_id, amount=200)  # a person, unnamed
    finally:
        await service.__aexit__(None, None, None)
    leave_open(tmp_path, state=SaleState.REVERSING, trans_id=trans_id, authorized_cents=300,
               captured_cents=300, reversed_cents=100, message="a charge found, not vended")
    _, event, record = await _restarted(agent_factory, sim)
    assert record is not None
    assert event.message == record.message
    assert (record.state, record.captured_cents, record.reversed_cents) == (
        SaleState.REVERSED, 300, 300), record.message
    assert ("$2.00 refunded, reporting names no one who gave it back, the rest of the $3.00 "
            "charge: $1.00 of it had been refunded before") in record.message, record.message
    assert "by the agent" not in record.message


async def test_the_agents_own_refund_sent_before_the_kill_is_said_to_be_the_agents(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """The reverse: a first agent sends its refund of the $3.00 charge and is stopped before
    the answer comes (the service made it); the next start finds the charge refunded by a row
    that names the agent, and says so."""
    sim = await sim_factory(time_scale=300, transactions=0)
    service, trans_id = await _charge(sim, settled=True)
    await service.__aexit__(None, None, None)
    leave_open(tmp_path, state=SaleState.REVERSING, trans_id=trans_id, authorized_cents=300,
               captured_cents=300, message="dispense failed")
    # the refund reaches the service, which commits it 3 s later whatever the caller does
    # meanwhile (a slow service): the first agent is stopped as soon as it sent it
    fault = await sim_call(sim, "POST", "/sim/faults", {
        "path": "/api/v1/void-or-refund", "fault": "delay", "delay_s": 3.0})
    first = await agent_factory(sim=sim)
    own = agent_user(first.sales.context.unit)

    async def sent() -> None:
        while not [f for f in (await sim_call(sim, "GET", "/sim/faults"))["faults"]
                   if f["id"] == fault["id"] and f["hits"]]:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(sent(), WAIT_S)
    await first.stop()  # killed before the answer: the journal still says reversing
    db = sqlite3.connect(tmp_path / "journal.db")
    [(state, sent_steps)] = db.execute(
        "SELECT state, (SELECT count(*) FROM steps WHERE sale_id = 'crashed1' AND step = ?) "
        "FROM sales WHERE sale_id = 'crashed1'", (Step.REVERSE_REQUEST.value,)).fetchall()
    db.close()
    # the step the crashed agent left (leave_open) and the first agent's, sent, its answer
    # never heard
    assert (state, sent_steps) == ("reversing", 2)

    async def refunded() -> None:
        async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
            while not [r for r in await rows(service, "KACRASHED1")
                       if r.status is TransStatus.REFUND]:
                await asyncio.sleep(0.05)

    await asyncio.wait_for(refunded(), WAIT_S)  # made at the service after all
    second, event, record = await _restarted(agent_factory, sim)
    assert record is not None
    assert event.message == record.message
    assert (record.state, record.captured_cents, record.reversed_cents) == (
        SaleState.REVERSED, 300, 300), record.message
    assert "$3.00 refunded by the agent" in record.message, record.message
    [refund] = [r for r in await rows(second.service, "KACRASHED1")
                if r.status is TransStatus.REFUND]
    assert refund.user_identifier == own


async def test_a_void_says_whose_it_was(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """An authorization (not captured) voided by a person while the agent was down: the
    voided row names them, and so do the words."""
    sim = await sim_factory(time_scale=300, transactions=0)
    service, trans_id = await _charge(sim, settled=False)
    try:
        assert (await service.payments.void_or_refund(
            trans_id, user_identifier="ops-desk")).voided
    finally:
        await service.__aexit__(None, None, None)
    leave_open(tmp_path, state=SaleState.REVERSING, trans_id=trans_id, authorized_cents=300,
               message="dispense failed")
    _, event, record = await _restarted(agent_factory, sim)
    assert record is not None
    assert event.message == record.message
    assert (record.state, record.reversed_cents) == (SaleState.REVERSED, 300), record.message
    assert "$3.00 voided by 'ops-desk' (not the agent)" in record.message, record.message


async def test_a_charge_found_already_given_back_says_whose_give_back_it_was(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """The agent was killed waiting for its authorization's answer (no trans id journaled); the
    service made the charge, and a person refunded it while the agent was down. The restart
    finds it under the sale's order id already given back, and says by whom."""
    sim = await sim_factory(time_scale=300, transactions=0)
    service, trans_id = await _charge(sim, settled=True)
    try:
        await service.payments.void_or_refund(trans_id, user_identifier="night-shift")
    finally:
        await service.__aexit__(None, None, None)
    leave_open(tmp_path, state=SaleState.AUTHORIZING)
    _, event, record = await _restarted(agent_factory, sim)
    assert record is not None
    assert event.message == record.message
    assert (record.state, record.trans_id, record.reversed_cents) == (
        SaleState.REVERSED, trans_id, 300), record.message
    assert "already given back; $3.00 refunded by 'night-shift' (not the agent)" in (
        record.message), record.message
