"""A charge whose sale the journal lost: given back, and a person told the product may have gone
out (found by i42-money-attack: the give-back said "not known dispensed" and told nobody)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.cli import main
from kiosk_agent.sales.audit import LOST_SALE
from kiosk_agent.sales.late_vends import ACK, late_vend_of
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.sales.unit import split_order_id
from kiosk_agent.service.models import TransStatus

from .test_unit import _sell, _terminal_rows, a_machine


async def test_a_paid_vend_whose_journal_was_lost_is_given_back_and_told_as_a_maybe(
    agent_factory: Any, sim_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A paid vend (captured), then the journal and its WAL are lost. At the next start the
    charge check finds the unit's own charge (its order id's tag) of no sale the journal holds
    and gives it back, and in the very commit of the give-back journals a ``late.vend`` maybe
    with what it knows (amount, the charge's time, terminal, the order id's sale part): health
    counts and names it (the page, the heartbeat, Home Assistant read health), `sales
    late-vends` lists it, and a person's acknowledgement clears it."""
    from ..assembly.agent_helpers import TIME_SCALE

    sim = await sim_factory(time_scale=TIME_SCALE, transactions=0)
    monkeypatch.setenv("KIOSK_MACHINE_ROOT", str(
        a_machine(tmp_path / "m", "a" * 32, serial="1000000000000001")))
    first = await agent_factory(sim=sim, directory=tmp_path)
    sold = await _sell(first, 250)
    assert sold.state is SaleState.COMPLETED
    await first.stop()
    journal = tmp_path / "journal.db"
    for part in (journal, *tmp_path.glob("journal.db-*")):
        part.unlink()

    again = await agent_factory(sim=sim, directory=tmp_path)
    checked = await asyncio.wait_for(again.journal_guard.first_check(), 20)

    assert checked is not None
    assert len(checked.unaccounted) == 1
    rows = {r.order_id: r for r in await _terminal_rows(again)}
    assert rows[sold.order_id].status is TransStatus.VOIDED  # the customer's money back
    [found] = [r for r in again.journal if r.order_id == sold.order_id]
    assert found.state is SaleState.REVERSED
    steps = again.journal.steps(found.sale_id)
    names = [s.step for s in steps]
    # the note in the give-back's own commit, right after its decision
    assert names[names.index(Step.REVERSE_REQUEST) + 1] == Step.LATE_VEND, names
    [note] = [s for s in steps if s.step == Step.LATE_VEND]
    sale_part = split_order_id(sold.order_id)
    assert sale_part is not None
    assert note.detail["cents"] == 250
    assert note.detail["terminal"] == "SIM-0001"
    assert note.detail["order"] == sale_part[0]
    assert note.detail["charged_at"] == rows[sold.order_id].trans_at
    unsure = str(note.detail["unsure"])
    assert unsure.startswith(f"{LOST_SALE}: $2.50 charged "), unsure
    assert f"on SIM-0001, order {sale_part[0]}; the machine may have vended it" in unsure
    late = late_vend_of(steps)
    assert late is not None
    assert late.text().startswith("may have dispensed product unnamed ")
    assert "not known dispensed" not in (found.message or "")

    # the faces: health's figures and its problem (the page, the heartbeat, Home Assistant)
    health = again.health.snapshot()
    assert (health.sales.late_vends, health.sales.maybe_dispensed) == (0, 1)
    [problem] = [p for p in health.problems if ACK in p]
    assert problem.startswith(
        "1 product(s) that may have been dispensed (the journal lost its sale), unpaid (the "
        f"money went back): sale {found.sale_id[:8]} (product unnamed on SIM-0001, "), problem
    config = str(tmp_path / "config.yaml")
    code = await asyncio.to_thread(main, ["sales", "late-vends", "-c", config, "--json"])
    [listed] = json.loads(capsys.readouterr().out)["late_vends"]
    assert (code, listed["sale_id"]) == (1, found.sale_id)
    assert str(listed["unsure"]).startswith(LOST_SALE)

    # a person looked (the machine's books, the stock): acknowledged, the problem is gone
    assert again.sales.late_vends.acknowledge(found.sale_id, by="test") == [found.sale_id]
    health = again.health.snapshot()
    assert (health.sales.late_vends, health.sales.maybe_dispensed) == (0, 0)
    assert not [p for p in health.problems if ACK in p]
    code = await asyncio.to_thread(main, ["sales", "late-vends", "-c", config])
    assert code == 0
    assert "0 late vends not acknowledged" in capsys.readouterr().out
