"""A live vend timeout gives the money back, and a person is told the product may have gone out.

Standing rule 13: the agent moves only money it can prove is its own, and what it cannot prove
it reports to a person. A live sale approves its vend, the machine says nothing within the vend
timeout, the money goes back, and the agent listens for a late vend only in memory: stopped or
killed before that late vend, the product may have gone out unpaid. Before (2026-11-30), no face
said so; now the vend timeout's ``dispense.result`` carries the maybe (``late.vend`` with
``unsure`` and the vend's price) in its own commit, before the give-back.

Through the real agent on each platform (the simulator over HTTP, a pty-backed controller,
SQLite on disk), the vend timeout on the agent's injected clock; then the agent stops, a new
one starts on the same journal, and nothing more is heard. ``kiosk-agent sales late-vends
--json`` (the real command on the journal) lists the sale as unsure with its price, and
health's maybe count (from the journal) counts it. The endings that cannot have made a vend
(a failure the machine said, a cancel before the vend was approved, a vend never sent) are in
tests/sales/test_timeout_maybe.py, on the sale's flows.
"""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.cli import main
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.sim.machine import VirtualController

from ..helpers import until
from .agent_rig import running_agent, vend_asked
from .test_kiosk_api import _confirming_on, _ended
from .test_late_vends import _MACHINES, _dropped, _given_back_at_its_vend_timeout


def told_after_the_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], agent: Any, sale_id: str,
    product: str, cents: int, unsure: str = "no vend result within",
) -> None:
    """``sale_id`` is listed by `kiosk-agent sales late-vends --json` (the real command on the
    journal) as unsure, with its product and price, and it alone; ``agent`` (a new start on the
    same journal) counts it as a maybe in health, from the journal."""
    capsys.readouterr()
    config = str(tmp_path / "agent.yaml")
    assert main(["sales", "late-vends", "-c", config, "--json"]) == 1  # exit 1 while any
    [listed] = json.loads(capsys.readouterr().out)["late_vends"]
    assert (listed["sale_id"], listed["product"], listed["cents"]) == (sale_id, product, cents)
    assert listed["unsure"].startswith(unsure), listed
    assert agent.sales.late_vends.counts() == (0, 1)
    snapshot = agent.health.snapshot()
    [problem] = [p for p in snapshot.problems if "unpaid (the money went back)" in p]
    assert sale_id[:8] in problem, problem
    assert f"maybe: {unsure}" in problem, problem
    # in health's words of its kind (before: "the agent stopped mid-vend", for every maybe
    # not a dispenser's error)
    assert "may have been dispensed (no vend result heard)" in problem, problem
    record = agent.journal.get(sale_id)
    assert record is not None
    assert record.state is SaleState.REVERSED, record
    steps = [s.step for s in agent.journal.steps(sale_id)]
    # told with the vend timeout's result, before the give-back was asked
    result = steps.index(Step.DISPENSE_RESULT)
    assert steps[result + 1] == Step.LATE_VEND, steps
    assert steps.index(Step.REVERSE_REQUEST) > result + 1, steps


@pytest.mark.parametrize("kind", _MACHINES)
async def test_a_vend_timeout_then_a_restart_with_nothing_heard_is_told(
    tmp_path: Path, sim_settings: Any, controller: VirtualController, kind: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """mdb and serial_line: the controller is still dropping the B1 ($3.25) when the sale's vend
    timeout passes (the agent's clock): the money goes back. The agent stops; the next start
    hears nothing of that vend (the controller's word never comes). Failed on integ: the list
    was empty, health counted nothing."""
    trigger = {**_MACHINES[kind], "port": controller.port, "vend_timeout": 0.5}
    clock, controller.clock = FakeClock(), FakeClock()
    async with running_agent(tmp_path, sim_settings, [trigger], clock=clock) as agent:
        visit, record = await _given_back_at_its_vend_timeout(agent, controller, clock, 0.5)
    async with running_agent(tmp_path, sim_settings, [trigger]) as second:
        await asyncio.wait_for(second.recovery.wait(), 10)
        told_after_the_restart(tmp_path, capsys, second, record.sale_id, "B1", 325)
    visit.cancel()  # the machine's drop never ends on its own clock


async def test_a_kiosk_app_that_never_confirms_then_a_restart_is_told(
    tmp_path: Path, sim_settings: Any, capsys: pytest.CaptureFixture[str],
) -> None:
    """kiosk_api with confirm_dispense: the app never reports the tea ($1.75) within the vend
    timeout (30 s on the agent's clock); the money goes back, the agent stops, and the app's
    report never comes. Failed on integ: nothing listed, nothing counted."""
    import time

    clock = FakeClock(wall=time.time())
    async with _confirming_on(clock, tmp_path, sim_settings) as (_agent, app):
        _, started = await app.post("/sales", {"product": "tea"})
        sale_id = started["sale_id"]
        await until(lambda: app.api._latest[sale_id].state is SaleState.DISPENSING)
        await until(lambda: clock.monotonic() + 30.0 in clock.pending())
        await clock.advance(30.0)
        await until(functools.partial(_ended, app, sale_id))
    async with _confirming_on(FakeClock(wall=time.time()), tmp_path, sim_settings) as (
            second, _app):
        await asyncio.wait_for(second.recovery.wait(), 10)
        told_after_the_restart(tmp_path, capsys, second, sale_id, "tea", 175)


@pytest.mark.parametrize("kind", _MACHINES)
async def test_a_controller_reset_mid_vend_then_a_restart_is_told(
    tmp_path: Path, sim_settings: Any, controller: VirtualController, kind: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The controller goes inactive mid-vend (a power blip) after the B1 was approved: the
    session ends with no vend result, the money goes back at once, and the machine may still
    have dropped it (docs/platforms.md, Vend timeout). The agent stops before any success is
    heard: told as after a vend timeout, with the reset's words (serial_line: the device's
    cancel line)."""
    trigger = {**_MACHINES[kind], "port": controller.port, "vend_timeout": 5}
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        await asyncio.wait_for(controller.wait_enabled(), 5)
        controller.options.dispense_time = 0.3
        visit = asyncio.create_task(controller.customer("B1"))
        await vend_asked(controller)
        controller.reset()
        await asyncio.wait_for(visit, 10)
        [record] = agent.journal.query()
        await until(lambda: agent.journal.get(record.sale_id).state.final)
    async with running_agent(tmp_path, sim_settings, [trigger]) as second:
        await asyncio.wait_for(second.recovery.wait(), 10)
        told_after_the_restart(tmp_path, capsys, second, record.sale_id, "B1", 325,
                               unsure={"mdb": "controller inactive",
                                       "serial_line": "cancelled by the device"}[kind])


async def test_a_drop_sensor_that_saw_nothing_then_a_restart_is_told(
    tmp_path: Path, sim_settings: Any, capsys: pytest.CaptureFixture[str],
) -> None:
    """gpio with a drop sensor: the latte's relay fired and its sensor saw nothing within its
    window (the platform's vend timeout, 0.3 s): the money goes back, and the latte may be stuck
    and fall later. The agent stops before any fall: told, with the window's words."""
    from kiosk_agent.platforms.gpio import PLATFORM_SCHEMA, setup_with_chip

    from .test_gpio import BUTTONS, FakeChip, _pressed

    config = PLATFORM_SCHEMA({"platform": "gpio", "name": "coffee", "buttons": BUTTONS,
                              "flow": "authorize_capture", "sensor_timeout": 0.3})
    chip = FakeChip()
    async with running_agent(tmp_path, sim_settings, []) as agent:
        platform = await setup_with_chip(agent, config, chip)
        try:
            stuck = await _pressed(agent, chip, 18)
            assert stuck.state is SaleState.REVERSED
        finally:
            await platform.stop()
    async with running_agent(tmp_path, sim_settings, []) as second:
        await asyncio.wait_for(second.recovery.wait(), 10)
        told_after_the_restart(tmp_path, capsys, second, stuck.sale_id, "latte", 320,
                               unsure="drop sensor saw nothing")


@pytest.mark.parametrize("kind", _MACHINES)
async def test_a_failure_heard_after_the_vend_timeout_closes_the_maybe(
    tmp_path: Path, sim_settings: Any, controller: VirtualController, kind: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The vend timeout gave the money back and told a person the B1 may have gone out; then
    the controller says the vend failed: nothing went out. The maybe is closed on the sale
    (``late.vend.seen`` by the machine, what it said): health and `sales late-vends` no longer
    show it, no person needed, and the sales table says the B1 was not dispensed. Before, that
    failure was a line "with no vend pending", ignored (and the maybe, once told, a person's)."""
    trigger = {**_MACHINES[kind], "port": controller.port, "vend_timeout": 0.5}
    clock, controller.clock = FakeClock(), FakeClock()
    async with running_agent(tmp_path, sim_settings, [trigger], clock=clock) as agent:
        visit, record = await _given_back_at_its_vend_timeout(agent, controller, clock, 0.5,
                                                              fail=True)
        assert agent.sales.late_vends.counts() == (0, 1)  # a person is told
        await _dropped(controller.clock)  # then the controller says the vend failed
        await asyncio.wait_for(visit, 10)
        await until(lambda: agent.sales.late_vends.counts() == (0, 0))
        assert not [p for p in agent.health.snapshot().problems if "money went back" in p]
        [seen] = [s.detail for s in agent.journal.steps(record.sale_id)
                  if s.step == Step.LATE_VEND_SEEN]
        assert seen["by"] == "the machine", seen
        assert seen["not_vended"], seen
    capsys.readouterr()
    config = str(tmp_path / "agent.yaml")
    assert main(["sales", "late-vends", "-c", config, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["late_vends"] == []
    assert main(["sales", "-c", config]) == 0
    [row] = capsys.readouterr().out.splitlines()[1:-1]
    assert "B1 not dispensed: the machine said so after the sale gave up waiting" in row, row


async def test_a_kiosk_apps_failure_after_the_vend_timeout_closes_the_maybe(
    tmp_path: Path, sim_settings: Any,
) -> None:
    """kiosk_api: the app reports the tea failed after the sale gave up (30 s): answered 409
    saying so, and the maybe a person was told of is closed."""
    import time

    clock = FakeClock(wall=time.time())
    async with _confirming_on(clock, tmp_path, sim_settings) as (agent, app):
        _, started = await app.post("/sales", {"product": "tea"})
        sale_id = started["sale_id"]
        await until(lambda: app.api._latest[sale_id].state is SaleState.DISPENSING)
        await until(lambda: clock.monotonic() + 30.0 in clock.pending())
        await clock.advance(30.0)
        await until(functools.partial(_ended, app, sale_id))
        assert agent.sales.late_vends.counts() == (0, 1)
        status, answer = await app.post(f"/sales/{sale_id}/dispensed",
                                        {"status": "failed", "detail": "jammed"})
        assert status == 409
        assert "nothing went out" in answer["message"], answer
        assert agent.sales.late_vends.counts() == (0, 0)
        [seen] = [s.detail for s in agent.journal.steps(sale_id) if s.step == Step.LATE_VEND_SEEN]
        assert seen == {"by": "the machine", "not_vended": "jammed"}
