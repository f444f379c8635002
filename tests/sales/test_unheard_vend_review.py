"""Review of recovery's "may have dispensed" (sales/recovery.py ``unheard_vend``) against the
journals the live flows really write: a person is told of a vend only where one was approved
and never heard end. Each case runs a real sale through the kiosk API on the simulator, then
reads its journal cut after each of its steps (where a kill there leaves the next start)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from kiosk_agent.sales.journal import SaleRecord, StepRecord
from kiosk_agent.sales.recovery import unheard_vend
from kiosk_agent.sales.states import SaleState, Step
from tests.platforms.agent_rig import until_final
from tests.platforms.test_kiosk_api import _app, amounts_times, answers_rewritten


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
