"""A cloned card's twin that the machine cannot tell apart: an attack on "whose money".

The unit tells a copy of its journal by the machine it was made on (sales/machine.py): the
machine-id (the same on every copy of a card), the hardware's serial or the MAC of a physical
network interface, and the journal's path. A machine with neither a serial nor a physical
interface (a container, an odd board) leaves only the machine-id and the path, both of which a
copy of the card at the same path carries. Real agents on the simulator over HTTP, journals on
disk, made-up machines under ``KIOSK_MACHINE_ROOT``."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.sales.journal_doctor import check_unit
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.models import TransStatus
from kiosk_agent.verdicts import Report, Verdict
from tests.assembly.agent_helpers import TIME_SCALE
from tests.sales.test_unit import _copy_journal_dir, _sell, _terminal_rows, a_machine


async def _twin(
    agent_factory: Any, sim: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serial: str
) -> tuple[Any, Any]:
    """A card imaged once its unit was made (journal, unit id, key), then the original selling
    a $2.50 charge-card sale; the image started at the same path on a second machine of the
    same machine-id, whose serial is ``serial`` ("": none, nor a physical interface; the first
    machine alike). The paid sale and the twin."""
    home = tmp_path / "kiosk"
    home.mkdir()
    other = "10000000000000b2" if serial else ""
    monkeypatch.setenv("KIOSK_MACHINE_ROOT", str(a_machine(tmp_path / "box1", "e" * 32, serial)))
    made = await agent_factory(sim=sim, directory=home)
    await made.stop()
    _copy_journal_dir(home, tmp_path / "image")
    original = await agent_factory(sim=sim, directory=home)
    paid = await _sell(original, 250)
    assert paid.state is SaleState.COMPLETED
    await original.stop()
    shutil.move(home, tmp_path / "box1-card")
    _copy_journal_dir(tmp_path / "image", home)  # the twin: the image, at the same path
    monkeypatch.setenv("KIOSK_MACHINE_ROOT", str(a_machine(tmp_path / "box2", "e" * 32, other)))
    twin = await agent_factory(sim=sim, directory=home)
    assert twin.unit.id == original.unit.id
    return paid, twin


async def test_a_twin_on_a_machine_with_no_hardware_id_gives_back_none_of_the_originals_charges(
    agent_factory: Any, sim_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The twin is not told apart (its unit confirmed): its charge check found the original's
    paid $2.50 under its own id and tag, a sale its journal never made, took it for a charge
    its lost journal once held and voided it: a customer who got the product paid nothing,
    and every such charge of the original's went the same way at each check. Now, on a unit
    whose machine has no hardware id, such a charge is put to a person, worded, never given
    back: neither by the check nor by the attention sweeper."""
    sim = await sim_factory(time_scale=TIME_SCALE, transactions=0)
    paid, twin = await _twin(agent_factory, sim, tmp_path, monkeypatch, serial="")
    assert twin.unit.confirmed  # what the machine cannot tell
    assert twin.unit.copyable

    checked = await asyncio.wait_for(twin.journal_guard.first_check(), 20)
    await twin.attention.sweep()

    assert checked is not None
    assert checked.ok, checked.error
    rows = {r.order_id: r.status for r in await _terminal_rows(twin)}
    assert rows[paid.order_id] is TransStatus.CAPTURED
    [held] = twin.journal.attention_sales()
    assert held.order_id == paid.order_id
    assert "no hardware id" in held.message
    assert "a cloned card's twin" in held.message
    names = [s.step for s in twin.journal.steps(held.sale_id)]
    assert Step.REVERSE_REQUEST not in names, names
    assert (await twin.journal_guard.audit.check()).unaccounted == []  # told once
    report = Report()
    check_unit(report, tmp_path / "kiosk" / "journal.db")  # `kiosk-agent doctor` says why
    [check] = report.checks
    assert check.verdict is Verdict.PASS
    assert "no hardware id" in check.detail, check


async def test_a_twin_on_a_machine_with_a_serial_is_told_apart_and_moves_no_money(
    agent_factory: Any, sim_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same twin on boards with serials (a Raspberry Pi's): told apart at its start (not
    confirmed), it checks no charge and moves no money: the original's stays captured."""
    sim = await sim_factory(time_scale=TIME_SCALE, transactions=0)
    paid, twin = await _twin(agent_factory, sim, tmp_path, monkeypatch,
                             serial="10000000000000a1")
    assert not twin.unit.confirmed
    assert not twin.unit.copyable

    result = await twin.journal_guard.audit.check()

    assert not result.ok
    assert result.by_unit
    rows = {r.order_id: r.status for r in await _terminal_rows(twin)}
    assert rows[paid.order_id] is TransStatus.CAPTURED
