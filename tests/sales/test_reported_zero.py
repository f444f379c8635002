"""Reporting saying a capture took 0 cents for a product the machine dispensed.

0 is a figure (the service took nothing), not a missing one (reporting named no amount): the
sale is not "paid in full" on it, by the live flow, by recovery or by the attention sweeper. It
goes to a person, worded as what reporting shows; the agent moves no money on it by itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.cli import main
from kiosk_agent.cli.contract import EXIT_FAILED
from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.sales.model import DispenseStatus, money_text
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import TransStatus
from tests.assembly.agent_helpers import ScriptedDispenser
from tests.sales.test_attention import found_in_reporting
from tests.sales.test_contradicting_answers import RewritingProxy, a_vending_sale
from tests.sales.test_lost_answers import ledger, started_agent_behind
from tests.sales.test_recovery import authorize, leave_open, rows

NOTHING_TAKEN = "reporting shows $0.00 captured"


@pytest.fixture
async def behind_proxy(
    sim_factory: Any, tmp_path: Path
) -> AsyncIterator[tuple[Any, Agent, RewritingProxy]]:
    sim = await sim_factory(time_scale=300, transactions=0)
    proxy = RewritingProxy(sim.base_url)
    await proxy.start()
    agent = await started_agent_behind(proxy, sim, tmp_path, 300)
    yield sim, agent, proxy
    await agent.stop()
    await proxy.stop()


async def test_a_capture_reporting_shows_of_nothing_is_put_to_a_person(
    behind_proxy: tuple[Any, Agent, RewritingProxy],
) -> None:
    """The machine vended $2.00; the capture reached the service, its answer was a 503, and
    reporting shows the capture made for $0.00. Not "paid $2.00": a person decides, told
    what reporting shows, and the sale holds 0 captured, as the service does."""
    sim, agent, proxy = behind_proxy

    async def captured_nothing(request: web.Request) -> web.Response:
        del proxy.answer_instead["/api/v1/capture"]
        await proxy.forward(request)  # the service captures the $2.00 asked
        trans_id = (await request.json())["trans_id"]
        sim.ctx.ledger.update(trans_id, amount_cents=0)  # ... and reports it as $0.00
        return web.json_response({"error": "unavailable"}, status=503)

    proxy.answer_instead["/api/v1/capture"] = captured_nothing
    machine = ScriptedDispenser(DispenseStatus.VENDED, vended_cents=200)
    sale, event = await a_vending_sale(agent, machine)
    assert machine.authorized == [300]  # dispensed
    [row] = await ledger(agent, sale.order_id)
    assert (row.status, row.amount_cents) == (TransStatus.CAPTURED, 0)
    assert event.state is SaleState.ATTENTION, event.message
    assert NOTHING_TAKEN in event.message
    assert "$2.00" in event.message  # what the vend asked
    assert event.captured_cents == 0


async def test_recovery_and_the_sweeper_do_not_call_a_capture_of_nothing_paid(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """Killed while capturing the $1.75 vended; reporting shows the capture made for $0.00.
    Recovery does not end the sale "dispensed and captured", and the sweeper after it does not
    end it "paid $1.75 (found captured)": it waits for a person, with nothing captured."""
    sim = await sim_factory(time_scale=300, transactions=0)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        trans_id = await authorize(service, "KACRASHED1", capture=False)
        await service.payments.capture(trans_id, amount=175)
    sim.ctx.ledger.update(trans_id, amount_cents=0)
    leave_open(
        tmp_path, state=SaleState.CAPTURING, trans_id=trans_id, authorized_cents=300,
        vended_cents=175,
    )  # fmt: skip
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), 60)
    assert event.state is SaleState.ATTENTION, event.message
    assert NOTHING_TAKEN in event.message
    assert event.captured_cents == 0
    assert await agent.attention.sweep() == []
    record = agent.journal.get("crashed1")
    assert record is not None
    assert (record.state, record.captured_cents) == (SaleState.ATTENTION, 0)
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.CAPTURED  # nothing more was asked of the service


async def test_the_sweeper_says_a_capture_of_nothing_found_later(
    agent_factory: Any, tmp_path: Path, sim_factory: Any
) -> None:
    """A sale in attention for a failed capture of its $2.50 vend; reporting shows it later
    captured for $0.00. The sweeper keeps it for a person and says so, once (a second sweep
    finding the same writes nothing more)."""
    sim = await sim_factory(time_scale=300, transactions=0)
    leave_open(tmp_path, state=SaleState.ATTENTION, answer_by=time.time() - 1, vended_cents=250)
    agent = await agent_factory(sim=sim)
    trans_id = await authorize(agent.service, "KACRASHED1", capture=False)
    await agent.service.payments.capture(trans_id, amount=250)
    sim.ctx.ledger.update(trans_id, amount_cents=0)
    found_in_reporting(agent, trans_id)
    assert await agent.attention.sweep() == []  # nothing ended
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.state is SaleState.ATTENTION, record.message
    assert NOTHING_TAKEN in record.message
    assert "$2.50" in record.message
    assert record.captured_cents == 0
    steps = len(agent.journal.steps("crashed1"))
    assert await agent.attention.sweep() == []
    assert len(agent.journal.steps("crashed1")) == steps
    assert agent.health.snapshot().sales.attention == 1


async def _give_back_answered_503(
    behind_proxy: tuple[Any, Agent, RewritingProxy], *, settled: bool
) -> Any:
    """A $3.00 authorization whose dispense failed: the agent gives it back; the give-back
    reaches the service (a void, or a refund once ``settled``), its answer is a 503, and
    reporting shows the original's row given back for $0.00. The sale's end."""
    sim, agent, proxy = behind_proxy

    async def given_back_shown_as_nothing(request: web.Request) -> web.Response:
        del proxy.answer_instead["/api/v1/void-or-refund"]
        trans_id = (await request.json())["trans_id"]
        if settled:
            sim.ctx.ledger.update(trans_id, trans_status_id=TransStatus.SETTLED)
        await proxy.forward(request)  # the service gives it back ...
        sim.ctx.ledger.update(trans_id, amount_cents=0)  # ... and its row reads $0.00
        return web.json_response({"error": "unavailable"}, status=503)

    proxy.answer_instead["/api/v1/void-or-refund"] = given_back_shown_as_nothing
    _, event = await a_vending_sale(agent, ScriptedDispenser(DispenseStatus.FAILED))
    return event


async def test_a_void_whose_row_reporting_shows_as_nothing_gave_back_the_whole_hold(
    behind_proxy: tuple[Any, Agent, RewritingProxy],
) -> None:
    """A void releases the whole hold, whatever figure its row shows: the sale ends reversed
    with the $3.00 it held given back, worded so, not "$0.00 voided" (the money was right,
    the words and the figure were not)."""
    event = await _give_back_answered_503(behind_proxy, settled=False)
    assert event.state is SaleState.REVERSED, event.message
    assert event.reversed_cents == 300
    assert "$3.00 voided" in event.message
    assert "$0.00 voided" not in event.message


async def test_a_refund_whose_row_reporting_shows_as_nothing_goes_to_a_person(
    behind_proxy: tuple[Any, Agent, RewritingProxy],
) -> None:
    """A refund of $0.00 is no refund: the agent cannot tell that the $3.00 went back, does
    not refund again on its own, and a person decides, told what reporting shows."""
    _sim, agent, _proxy = behind_proxy
    event = await _give_back_answered_503(behind_proxy, settled=True)
    assert event.state is SaleState.ATTENTION, event.message
    assert "refunded for $0.00" in event.message
    assert "$3.00" in event.message
    record = agent.journal.get(event.sale_id)
    assert record is not None
    assert record.reversed_cents == 0


@pytest.mark.parametrize("settled", [False, True], ids=["void", "refund"])
async def test_recovery_and_the_sweeper_word_a_give_back_shown_as_nothing(
    agent_factory: Any, sim_factory: Any, tmp_path: Path, settled: bool
) -> None:
    """Killed while giving back a $3.00 charge; reporting shows it given back for $0.00.
    Recovery ends a void reversed with the whole $3.00 given back; a refund of nothing goes
    to a person, and the sweeper after it writes nothing more and moves no money."""
    sim = await sim_factory(time_scale=300, transactions=0)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        trans_id = await authorize(service, "KACRASHED1", capture=True)
        if settled:
            sim.ctx.ledger.update(trans_id, trans_status_id=TransStatus.SETTLED)
        await service.payments.void_or_refund(trans_id)
    sim.ctx.ledger.update(trans_id, amount_cents=0)
    leave_open(tmp_path, state=SaleState.REVERSING, trans_id=trans_id, authorized_cents=300,
               captured_cents=300)
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), 60)
    if not settled:
        assert event.state is SaleState.REVERSED, event.message
        assert event.reversed_cents == 300
        assert "$3.00 voided" in event.message
        return
    assert event.state is SaleState.ATTENTION, event.message
    assert "refunded for $0.00" in event.message
    steps = len(agent.journal.steps("crashed1"))
    assert await agent.attention.sweep() == []
    assert len(agent.journal.steps("crashed1")) == steps  # said once
    record = agent.journal.get("crashed1")
    assert record is not None
    assert (record.state, record.reversed_cents) == (SaleState.ATTENTION, 0)
    assert len(await rows(agent.service, "KACRASHED1")) == 2  # the charge and its one refund


async def test_a_charge_found_already_voided_as_nothing_is_held_and_given_back_whole(
    agent_factory: Any, tmp_path: Path, sim_factory: Any
) -> None:
    """A sale in attention that never heard its $3.00 charge's answer; reporting later shows
    that charge already voided, its row reading $0.00. A void releases the whole hold: the
    sale ends reversed holding $3.00 taken and given back, not $0.00 of each."""
    sim = await sim_factory(time_scale=300, transactions=0)
    leave_open(tmp_path, state=SaleState.ATTENTION, answer_by=time.time() - 1)
    agent = await agent_factory(sim=sim)
    trans_id = await authorize(agent.service, "KACRASHED1", capture=False)
    await agent.service.payments.void_or_refund(trans_id)
    sim.ctx.ledger.update(trans_id, amount_cents=0)
    [event] = await agent.attention.sweep()
    assert event.state is SaleState.REVERSED, event.message
    assert event.reversed_cents == 300
    record = agent.journal.get("crashed1")
    assert record is not None
    assert (record.authorized_cents, record.reversed_cents) == (300, 300)


async def test_a_charge_found_already_refunded_as_nothing_goes_to_a_person(
    agent_factory: Any, tmp_path: Path, sim_factory: Any
) -> None:
    """A sale in attention that never heard its $3.00 charge's answer; reporting later shows
    that charge settled and refunded, its row reading $0.00. A refund of nothing gave nothing
    back: the sale holds the charge and goes to a person, told what reporting shows, once
    (a second sweep writes nothing more and moves no money). Before, found_given_back ended
    it reversed with $0.00 given back: the customer's money called settled."""
    sim = await sim_factory(time_scale=300, transactions=0)
    leave_open(tmp_path, state=SaleState.ATTENTION, answer_by=time.time() - 1)
    agent = await agent_factory(sim=sim)
    trans_id = await authorize(agent.service, "KACRASHED1", capture=True)
    sim.ctx.ledger.update(trans_id, trans_status_id=TransStatus.SETTLED)
    assert (await agent.service.payments.void_or_refund(trans_id)).refunded
    sim.ctx.ledger.update(trans_id, amount_cents=0)
    assert await agent.attention.sweep() == []  # nothing ended
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.state is SaleState.ATTENTION, record.message
    assert f"reporting shows {trans_id} refunded for $0.00" in record.message
    assert "$3.00 may still be held" in record.message
    assert (record.trans_id, record.authorized_cents, record.reversed_cents) == (trans_id, 300, 0)
    steps = len(agent.journal.steps("crashed1"))
    assert await agent.attention.sweep() == []
    assert len(agent.journal.steps("crashed1")) == steps  # said once
    assert len(await rows(agent.service, "KACRASHED1")) == 2  # the charge and its one refund


async def test_every_face_says_a_capture_of_nothing_as_the_journal_and_the_service_hold_it(
    agent_factory: Any, sim_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Recovery left the $1.75 vend whose capture reporting shows made for $0.00 to a person.
    `kiosk-agent sales attention` and the status page said "$3.00 held, undecided" (0 read as
    no capture, the authorization as still held), where the service holds a capture of $0.00
    and nothing on the card. They say what the journal and the service hold."""
    sim = await sim_factory(time_scale=300, transactions=0)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        trans_id = await authorize(service, "KACRASHED1", capture=False)
        await service.payments.capture(trans_id, amount=175)
    sim.ctx.ledger.update(trans_id, amount_cents=0)
    leave_open(tmp_path, state=SaleState.CAPTURING, trans_id=trans_id, authorized_cents=300,
               vended_cents=175)
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), 60)
    [row] = await rows(agent.service, "KACRASHED1")
    record = agent.journal.get("crashed1")
    assert record is not None
    # the service and the journal: captured, for nothing, of the $1.75 dispensed
    assert (row.status, row.amount_cents) == (TransStatus.CAPTURED, 0)
    assert (record.state, record.captured_cents, record.vended_cents) == (
        SaleState.ATTENTION, 0, 175)
    said = "$0.00 captured of $1.75 dispensed, undecided"
    assert money_text(record) == money_text(event) == said
    assert main(["sales", "attention", "-c", str(tmp_path / "config.yaml")]) == EXIT_FAILED
    listed = capsys.readouterr().out
    assert f"crashed1  KACRASHED1  test  {said}  since" in listed
    assert "held" not in listed.split("\n")[0]


async def test_a_lost_authorization_found_refunded_for_nothing_goes_to_a_person(
    behind_proxy: tuple[Any, Agent, RewritingProxy],
) -> None:
    """The live flow: the $3.00 authorization reached the service, its answer was a 503, and
    by the time reporting is asked the charge is settled and refunded, its row reading $0.00.
    The machine vends nothing; the sale goes to a person (the lookup's own "unknown" step),
    holding the charge it found, not "reversed" with $0.00 given back."""
    sim, agent, proxy = behind_proxy

    async def refunded_as_nothing(request: web.Request) -> web.Response:
        del proxy.answer_instead["/api/v1/charge"]
        await proxy.forward(request)  # the service authorizes the $3.00 ...
        order_id = (await request.json())["order_id"]
        [row] = await ledger(agent, order_id)
        sim.ctx.ledger.update(row.trans_id, trans_status_id=TransStatus.SETTLED)
        sim.ctx.payments.void_or_refund(agent.service.settings.mid, row.trans_id, None, "someone")
        sim.ctx.ledger.update(row.trans_id, amount_cents=0)  # ... and its row reads $0.00
        return web.json_response({"error": "unavailable"}, status=503)

    proxy.answer_instead["/api/v1/charge"] = refunded_as_nothing
    machine = ScriptedDispenser(DispenseStatus.VENDED, vended_cents=300)
    _, event = await a_vending_sale(agent, machine, timeout=30)
    assert machine.authorized == []  # nothing vended
    assert event.state is SaleState.ATTENTION, event.message
    assert "refunded for $0.00" in event.message
    record = agent.journal.get(event.sale_id)
    assert record is not None
    assert record.trans_id is not None
    assert (record.authorized_cents, record.reversed_cents) == (300, 0)
    assert agent.journal.steps(event.sale_id)[-1].step == "authorize.unknown"
