"""SIGKILL recovery itself at every journal step of its give-back of a vend a kill left in flight.

A sale killed with its vend approved (``dispense.request`` journaled; card first, the customer's
choice ``dispense.chosen`` too) and no result heard: the machine may have vended while no agent
listened. Recovery gives the money back and tells a person ("may have dispensed": a ``late.vend``
step with ``unsure``). Found by the lead's chaos run (``bench/chaos.py --kills 40 --seed 51
--disk-full 0.2 --card-first``, 2026-11-30): recovery killed after its ``reverse.request``
(before the note, written once the money was back) left the next start a sale ``reversing``,
finished by its reversing path, which knows nothing of vends: the product went out unpaid and no
person was told. Here each recovery is killed after each of its steps and as its give-back
answers, then a start finishes the sale; on each:

- the money went back exactly once (the simulator's own rows: one charge, voided or refunded
  once);
- ``kiosk-agent sales late-vends --json``, run as a process against the journal, lists the sale
  with the vend's price (not for a card-first sale nobody chose in: no vend was approved);
- health's maybe count, read from the journal (``LateVendWatch.counts``, what health shows),
  counts each told sale once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.sales.journal import Journal
from kiosk_agent.sales.late_vends import LateVendWatch
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import TransactionFilter, TransStatus
from tests.assembly.crash_driver import CARD_FIRST, WarmDrivers, warm_command
from tests.assembly.test_crash import SERVICE_CALL_STEPS, TIME_SCALE, Driver, driver_on

# (flow, cents offered, the live step the sale is killed after, the vend's price if told)
CASES = {
    "charge card": ("charge_card", 250, Step.DISPENSE_REQUEST, 250),
    "selection first": ("authorize_capture", 300, Step.DISPENSE_REQUEST, 300),
    # the crash driver's customer chooses $1.75 of the $3.00 authorized
    "card first, chosen": (CARD_FIRST, 300, Step.DISPENSE_CHOSEN, 175),
    # the session opened (dispense.request), nobody chose: no vend approved, nothing to tell
    "card first, not chosen": (CARD_FIRST, 300, Step.DISPENSE_REQUEST, None),
}
# a vend listened for after the restart for up to this long (the crash tests' 5 s, shortened:
# every round waits it out before the give-back)
VEND_TIMEOUT_S = 1.5


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("case", list(CASES))
async def test_a_kill_at_each_step_of_recoverys_give_back_still_tells_a_person(
    sim_factory: Any, drivers: WarmDrivers, tmp_path: Path, case: str
) -> None:
    flow, cents, left_after, price = CASES[case]
    sim = await sim_factory(time_scale=TIME_SCALE, seed=11, transactions=0)
    driver = driver_on(sim, drivers, tmp_path)
    config = driver.config.read_text()
    assert "vend_timeout: 5," in config
    driver.config.write_text(config.replace("vend_timeout: 5,", f"vend_timeout: {VEND_TIMEOUT_S},"))
    kill_at = await _step_number(driver, flow, cents, left_after)

    told: set[str] = set()
    points = [str(n) for n in range(1, 9)]  # after recovery's Nth step; "Na": as its call answers
    queued = set(points)
    whole: list[str] = []  # the steps of a recovery run to its end
    while points:
        point = points.pop(0)
        before = _sale_ids(tmp_path)
        assert await driver.run(flow, cents, "vended", kill_at) == "killed"
        assert driver.steps[-1] == left_after
        [sale_id] = _sale_ids(tmp_path) - before
        if await driver.run(recovery_kill=point) == "done":  # past recovery's last step
            assert not point.endswith("a"), (point, driver.steps)
            whole = list(driver.steps)
            assert len(whole) == int(point) - 1, (point, whole)  # each step killed after
            points = [p for p in points if p.endswith("a")]
        else:
            for n, step in enumerate(driver.steps, start=1):  # and as its money call answers
                if step in SERVICE_CALL_STEPS and f"{n}a" not in queued:
                    points.append(f"{n}a")
                    queued.add(f"{n}a")
            assert await driver.run() == "done"  # the next start finishes it
        await _given_back_once(sim, tmp_path, sale_id, point)
        if price is not None:
            told.add(sale_id)
        await _told(tmp_path, driver, told, sale_id, price, point)
    assert whole[:2] == [Step.RECOVERY_START, Step.REVERSE_REQUEST], whole
    assert {"2a"} <= queued, queued


async def _step_number(driver: Driver, flow: str, cents: int, step: str) -> int:
    """The number of the live sale's step ``step`` (one sale run to its end, the machine's
    vend failing: nothing dispensed, nothing told)."""
    assert await driver.run(flow, cents, "failed", 99) == "done"
    return driver.steps.index(step) + 1


def _sale_ids(directory: Path) -> set[str]:
    journal = Journal(directory / "journal.db")
    journal.open()
    try:
        return {sale.sale_id for sale in journal.query()}
    finally:
        journal.close()


async def _given_back_once(sim: Any, directory: Path, sale_id: str, point: str) -> None:
    """The sale ended reversed, its charge given back once: the service's rows and the journal
    agree."""
    journal = Journal(directory / "journal.db")
    journal.open()
    try:
        sale = journal.get(sale_id)
    finally:
        journal.close()
    assert sale is not None
    assert sale.state is SaleState.REVERSED, (point, sale.message)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        rows = []
        for order_id in sale.all_order_ids():
            query = TransactionFilter(order_id=order_id)
            rows += [r async for r in service.reporting.transactions(query)]
    statuses = [(r.status, r.amount_cents) for r in rows]
    [charge] = [r for r in rows if r.status is not TransStatus.REFUND]
    refunds = [r for r in rows if r.status is TransStatus.REFUND]
    held = sale.captured_cents or sale.authorized_cents
    if charge.status is TransStatus.VOIDED:
        assert refunds == [], (point, statuses)
    else:
        assert charge.status is TransStatus.REFUNDED, (point, statuses)
        assert [r.amount_cents for r in refunds] == [held], (point, statuses)
    assert sale.reversed_cents == held, (point, sale.message, statuses)


async def _told(directory: Path, driver: Driver, told: set[str], sale_id: str,
                price: int | None, point: str, why: str = "the agent stopped mid-vend") -> None:
    """``kiosk-agent sales late-vends --json`` lists exactly the sales told so far, each with
    its vend's price, and health's maybe count (from the journal) counts them."""
    code, out, err = await warm_command(
        ["sales", "late-vends", "-c", str(driver.config), "--json"], directory, env=driver.env)
    listed = {v["sale_id"]: v for v in json.loads(out)["late_vends"]}
    assert code == (1 if told else 0), (code, err)
    assert set(listed) == told, (point, sorted(listed), sorted(told))
    if price is not None:
        vend = listed[sale_id]
        assert vend["unsure"].startswith(why), (point, vend)
        assert vend["cents"] == price, (point, vend)
    journal = Journal(directory / "journal.db")
    journal.open()
    try:
        heard, maybe = LateVendWatch(journal, journal.clock).counts()
        notes = [s for s in journal.steps(sale_id) if s.step == Step.LATE_VEND]
    finally:
        journal.close()
    assert (heard, maybe) == (0, len(told)), point
    assert len(notes) == (price is not None), (point, [s.detail for s in notes])


@pytest.mark.slow(seconds=15)
@pytest.mark.parametrize("flow", ["charge_card", "authorize_capture"])
async def test_a_kill_after_a_dispensers_error_still_tells_of_the_product_it_may_have_vended(
    sim_factory: Any, drivers: WarmDrivers, tmp_path: Path, flow: str
) -> None:
    """A dispenser that raised once its relay fired (the product out, an error heard): the
    live sale gives the money back and tells a person "may have dispensed" (i39-hear-vend).
    The runner journaled that note once the sale had ended: a kill after the give-back's
    request (the next start finishing it ``reversing``) or after its end lost it, the product
    out unpaid, told to nobody. Now the note is in the commit of the ``dispense.result``:
    killed after each later step and as the give-back answers, each sale is told once."""
    cents, price = (250, 250) if flow == "charge_card" else (300, 300)
    sim = await sim_factory(time_scale=TIME_SCALE, seed=12, transactions=0)
    driver = driver_on(sim, drivers, tmp_path)
    assert await driver.run(flow, cents, "raises", 99) == "done"
    whole = list(driver.steps)
    after = whole.index(Step.DISPENSE_RESULT) + 1
    assert whole[after - 1:] == [Step.DISPENSE_RESULT, Step.LATE_VEND, Step.REVERSE_REQUEST,
                                 Step.REVERSE_DONE], whole
    told = set(_sale_ids(tmp_path))
    await _told(tmp_path, driver, told, next(iter(told)), price, "no kill", why="dispenser error")
    asked = whole.index(Step.REVERSE_REQUEST) + 1
    for point in [*map(str, range(after, len(whole) + 1)), f"{asked}a"]:
        before = _sale_ids(tmp_path)
        assert await driver.run(flow, cents, "raises", point) == "killed", point
        [sale_id] = _sale_ids(tmp_path) - before
        assert await driver.run() == "done"  # the next start finishes it, if open
        await _given_back_once(sim, tmp_path, sale_id, point)
        told.add(sale_id)
        await _told(tmp_path, driver, told, sale_id, price, point, why="dispenser error")
    vended = {line.split()[0] for line in driver.markers.read_text().splitlines()}
    assert vended == told  # each one out unpaid, each told
