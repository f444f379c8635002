"""Review of recovery's "may have dispensed" (sales/recovery.py ``unheard_vend``) against the
journals the live flows really write: a person is told of a vend only where one was approved
and never heard end. Each case runs a real sale through the kiosk API on the simulator, then
reads its journal cut after each of its steps (where a kill there leaves the next start)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.sales.journal import Journal, SaleRecord, StepRecord
from kiosk_agent.sales.late_vends import late_vended
from kiosk_agent.sales.model import DispenseOutcome, DispenseStatus
from kiosk_agent.sales.recovery import UNHEARD, unheard_vend
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import TransStatus
from tests.platforms.agent_rig import until_final
from tests.platforms.test_kiosk_api import _app, amounts_times, answers_rewritten

from .test_recovery import _left_dispensing, rows


async def _sold(tmp_path: Path, sim: Any, rewrite: Any) -> tuple[SaleRecord, list[StepRecord]]:
    """One coffee ($2.50) from the app, authorize then capture, the authorization's answer
    rewritten: the sale as its journal ends it, and its steps."""
    async with answers_rewritten(sim, "/api/v1/charge", rewrite) as proxy:
        async for app in _app(tmp_path, proxy.settings(sim), flow="authorize_capture"):
            status, started = await app.post("/sales", {"product": "coffee"})
            assert status == 202
            agent = app.api.agent
            await asyncio.wait_for(until_final(agent, started["sale_id"]), 15)
            record = agent.journal.get(started["sale_id"])
            assert record is not None
            return record, agent.journal.steps(record.sale_id)
    raise AssertionError("no app")


def _cut(
    record: SaleRecord, steps: list[StepRecord], n: int
) -> tuple[SaleRecord, list[StepRecord]]:
    """The sale as a kill after its ``n``-th step leaves it: the state that step wrote."""
    kept = steps[:n]
    return dataclasses.replace(record, state=kept[-1].state, vended_cents=0), kept


async def test_a_vend_refused_for_a_partial_authorization_is_never_told_as_maybe_dispensed(
    tmp_path: Path, sim: Any
) -> None:
    """The service approves $1.25 of a $2.50 coffee: the machine is told no (vend_refusal) and
    the hold goes back. The journal had its ``dispense.request`` ("vend up to $1.25", written
    with the approval, before the refusal) and then only the give-back: a kill after the
    ``reverse.request`` left a sale whose vend read as approved and unheard, and the next start
    told a person the coffee may have gone out unpaid (a false alarm: the machine had been
    told no). Now the refusal is journaled as the vend's end (``dispense.result``, cancelled)
    before the machine hears it: at no cut after it is a person told."""
    record, steps = await _sold(tmp_path, sim, amounts_times(1, 2))
    assert record.state is SaleState.REVERSED, record
    assert "above the $1.25 authorized" in record.message, record
    names = [s.step for s in steps]
    # the refusal journaled as the vend's end, in the turn of the approval's commit (no wait
    # between them), before the machine is told no and before the give-back
    refused_from = names.index(Step.DISPENSE_RESULT) + 1
    assert names[refused_from - 2:refused_from + 1] == [
        Step.DISPENSE_REQUEST, Step.DISPENSE_RESULT, Step.REVERSE_REQUEST], names
    told = [names[n - 1] for n in range(refused_from, len(steps) + 1)
            if unheard_vend(*_cut(record, steps, n)) is not None]
    assert told == [], (told, names)


@pytest.mark.parametrize("source", ["kiosk_api:screen", "serial_line:panel", "mdb:front"])
async def test_an_old_journals_sale_naming_no_product_is_read_by_the_platform_that_made_it(
    agent_factory: Any, sim_factory: Any, tmp_path: Path, source: str
) -> None:
    """A journal written by the release before ``chosen_at_machine`` (main's, 2026-11-30): an
    authorize_capture sale naming no product, left dispensing, its ``created`` step saying
    nothing of who chooses. Only the mdb platform opens card-first sessions (C,START, the
    customer's choice approving the vend); a kiosk app's or a serial line's sale for an amount
    approved its vend with its ``dispense.request``. Read as card first, such a sale was not
    listened for and its money went back at once, told to nobody, though the product may have
    gone out: now the source's platform says which, and it is listened for and told; an mdb
    card-first session nobody chose in is still given back untold."""
    sim, clock = await _left_dispensing(sim_factory, tmp_path, product=None, source=source)
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    [created] = [s for s in journal.steps("crashed1") if s.step == Step.CREATED]
    journal.close()
    assert "chosen_at_machine" not in created.detail  # as main wrote it
    agent = await agent_factory(sim=sim, clock=clock)
    listened = agent.sales.listening_after_restart("crashed1")

    [event] = await clock.run(agent.recovery.wait(), horizon=600)

    assert event.state is SaleState.REVERSED, event.message
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.VOIDED  # the money back, either way
    noted = late_vended(agent.journal).get("crashed1")
    if source.startswith("mdb:"):
        assert listened is None
        assert noted is None
        return
    assert listened is not None
    assert "no vend result within its vend timeout after the restart" in event.message
    assert noted is not None
    assert (noted.cents, noted.unsure) == (300, UNHEARD), noted


async def test_a_vend_heard_after_a_person_voided_its_hold_meanwhile_goes_to_a_person(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """Recovery listens for the vend a kill left in flight; meanwhile a person at the service
    voids the sale's authorization (the customer phoned). Then the machine says it vended: the
    product is out and the money is back with the customer. The agent takes no money it cannot
    prove (nothing captured, no second charge) and the sale says so to a person, not
    "completed". (Found holding, 2026-11-30, i41-review-money.)"""
    sim, clock = await _left_dispensing(sim_factory, tmp_path)
    agent = await agent_factory(sim=sim, clock=clock)
    assert agent.sales.listening_after_restart("crashed1") is not None
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.trans_id is not None
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        assert (await service.payments.void_or_refund(
            record.trans_id, user_identifier="ops-desk")).voided
    success = DispenseOutcome(DispenseStatus.VENDED, 0, "B1", "vend success")
    assert agent.sales.restart_vend_heard("crashed1", success)
    [event] = await clock.run(agent.recovery.wait(), horizon=600)
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.VOIDED  # nothing taken after the person's void
    assert event.state is SaleState.ATTENTION, event.message
    assert event.captured_cents == 0, event.message
    assert event.message.startswith("dispensed, but the capture failed"), event.message
    assert "transaction_voided" in event.message, event.message


def test_an_old_journals_card_first_platforms_are_the_sale_kinds_ones() -> None:
    """Which platforms may open card-first sessions is one contract (sales.kinds): the demo's
    ``virtual`` machine is one, as ``mdb``; a created step that says so decides over it."""
    from kiosk_agent.sales.kinds import CARD_FIRST_PLATFORMS
    from kiosk_agent.sales.recovery import approved_by_request

    def sale(source: str, **created: Any) -> tuple[SaleRecord, list[StepRecord]]:
        record = SaleRecord(sale_id="s", order_id="o", source=source, flow="authorize_capture",
                            terminal="T", amount_cents=300, state=SaleState.DISPENSING)
        return record, [StepRecord("s", 1.0, Step.CREATED, SaleState.STARTED, created)]

    assert set(CARD_FIRST_PLATFORMS) == {"mdb", "virtual"}
    assert [approved_by_request(*sale(f"{p}:x")) for p in CARD_FIRST_PLATFORMS] == [False] * 2
    assert approved_by_request(*sale("gpio:button")) is True
    assert approved_by_request(*sale("mdb:front", chosen_at_machine=False)) is True
    assert approved_by_request(*sale("kiosk_api:screen", chosen_at_machine=True)) is False


@pytest.mark.parametrize(("cents", "mono", "read"), [
    (250, 12.5, (250, 12.5)),  # as the flow writes it
    (250, 12, (250, 12.0)),  # a whole second is still a time
    (0, 12.5, (None, 12.5)),  # the flow approves no vend of nothing (vend_refusal)
    (-250, 12.5, (None, 12.5)),
    ("250", "12.5", (None, None)),  # text: not as the flow writes it
    (True, False, (None, None)),  # a flag is no amount and no time
    (None, None, (None, None)),
])
def test_recovery_reads_a_customers_choice_once_for_telling_and_for_listening(
    cents: Any, mono: Any, read: tuple[int | None, float | None]
) -> None:
    """``dispense.chosen`` is read in one place (``customer_choice``) for both uses: a price
    or time not as the flow writes it reads None. Telling (``unheard_vend``) tells all the
    same, at the sale's price; listening (``Recovery._hearing``) needs both, else none."""
    from kiosk_agent.sales.recovery import customer_choice

    record = SaleRecord(sale_id="s1", order_id="KAS1", source="mdb:front",
                        flow="authorize_capture", terminal="SIM-0001", amount_cents=500,
                        state=SaleState.DISPENSING, product=None)
    steps = [StepRecord("s1", 1.0, Step.DISPENSE_REQUEST, SaleState.DISPENSING, {}),
             StepRecord("s1", 2.0, Step.DISPENSE_CHOSEN, SaleState.DISPENSING,
                        {"product": "A2", "cents": cents, "mono": mono})]
    chosen = customer_choice(steps)
    assert chosen is not None
    assert (chosen.product, chosen.cents, chosen.mono) == ("A2", *read)
    assert unheard_vend(record, steps) == ("A2", read[0] or 500)
    assert customer_choice(steps[:1]) is None
