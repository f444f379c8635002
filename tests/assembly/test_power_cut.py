"""A power cut: the journal as the disk held it after its last fsync, the service living on.

Three commits carry no fsync of their own (docs/journal.md, "Which commits are fsynced"): the card
read's accepted step (``UNSYNCED_STEPS``), the confirmed vend's capture request (it waits for
a shared fsync before the capture is sent) and the capture's completion (a shared fsync before
it is announced). A SIGKILL keeps both (the OS's page cache holds
them: test_crash.py); a power cut before the next fsync loses them. A fourth, a card-first
customer's choice (``dispense.chosen``): a power cut ends the boot whose vend it lets recovery
hear, and recovery gives the money back at once on another boot with or without it
(test_recovery.py); here, lost on the same boot (the worst case), it is given back at once
too. The agent runs as a real process (``crash_driver.py``), which copies the journal's files
after each fsync; it is killed right after the unsynced commit, and the copy is put in the
journal's place, as the disk would be after the power came back. The next start must then end
every sale with the service's records agreeing (test_crash.assert_no_unearned_money) and take
the next customer.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import InteractionKind, InteractionStatus, TransStatus
from tests.assembly.crash_driver import CARD_FIRST, WarmDrivers
from tests.assembly.test_crash import (
    TIME_SCALE,
    Driver,
    assert_no_unearned_money,
    driver_on,
    journaled_sales,
    sale_ids_so_far,
    statuses_of,
)

NO_CARD = 305  # ..05: no card is presented, the read waits (choices.md)


def power_cut_after(driver: Driver, tmp_path: Path) -> Path:
    """The directory the driver copies the journal into after each fsync."""
    disk = tmp_path / "at-last-fsync"
    disk.mkdir(exist_ok=True)
    driver.env["CRASH_POWER_CUT_DIR"] = str(disk)
    return disk


def power_back(disk: Path, tmp_path: Path, driver: Driver) -> None:
    """The journal's files as the disk held them at the last fsync; the WAL index, a file of
    shared memory rebuilt by the first opener, gone with the power."""
    driver.env.pop("CRASH_POWER_CUT_DIR")
    for name in ("journal.db", "journal.db-wal", "journal.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    for copy in disk.iterdir():
        shutil.copyfile(copy, tmp_path / copy.name)


@pytest.mark.slow(seconds=6)
async def test_a_power_cut_that_loses_the_accepted_read_ends_the_sale_and_sells_on(
    sim_factory: Any, drivers: WarmDrivers, tmp_path: Path
) -> None:
    # The accepted step (the read's interaction id) is lost: the journal holds a sale reading a
    # card with no id, its read still waiting on the terminal. The next start ends the sale
    # with no money moved, and the next customer on that terminal is still served.
    sim = await sim_factory(time_scale=TIME_SCALE, seed=6, transactions=0)
    driver = driver_on(sim, drivers, tmp_path)
    disk = power_cut_after(driver, tmp_path)
    assert await driver.run("authorize_capture", NO_CARD, "vended", 3) == "killed"
    assert driver.steps == ["created", "read_card.request", "read_card.accepted"]
    [killed] = journaled_sales(tmp_path).values()
    assert killed.interaction_id is not None  # a kill alone keeps it (test_crash.py)
    power_back(disk, tmp_path, driver)
    [lost] = journaled_sales(tmp_path).values()
    assert lost.state is SaleState.READING_CARD
    assert lost.interaction_id is None  # what the power cut took

    assert await driver.run("authorize_capture", 300, "vended", 99) == "done"

    sales = journaled_sales(tmp_path)
    assert sales[killed.sale_id].state is SaleState.FAILED, sales[killed.sale_id].message
    [after] = [s for s in sales.values() if s.sale_id != killed.sale_id]
    assert after.state is SaleState.COMPLETED, after.message
    await assert_no_unearned_money(sim, sales, driver.markers)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        read = await service.terminal.get_interaction(
            "SIM-0001", InteractionKind.READ_CARD, killed.interaction_id
        )
    assert read.status is not InteractionStatus.PENDING


@pytest.mark.slow(seconds=6)
async def test_a_power_cut_that_loses_the_capture_request_gives_the_money_back(
    sim_factory: Any, drivers: WarmDrivers, tmp_path: Path
) -> None:
    # The confirmed vend and its capture request are lost before the shared fsync: the journal
    # says the vend was asked for and never confirmed. The capture was never sent (it waits for
    # the fsync), so the next start gives the authorization back: the customer keeps goods
    # and money, never money without goods, and no authorization hangs.
    sim = await sim_factory(time_scale=TIME_SCALE, seed=7, transactions=0)
    driver = driver_on(sim, drivers, tmp_path)
    disk = power_cut_after(driver, tmp_path)
    assert await driver.run("authorize_capture", 300, "vended", 8) == "killed"
    assert driver.steps[-2:] == ["dispense.request", "capture.request"]
    [killed] = journaled_sales(tmp_path).values()
    assert killed.state is SaleState.CAPTURING  # a kill alone keeps it
    power_back(disk, tmp_path, driver)
    [lost] = journaled_sales(tmp_path).values()
    assert lost.state is SaleState.DISPENSING

    assert await driver.run() == "done"

    sales = journaled_sales(tmp_path)
    ended = sales[killed.sale_id]
    assert ended.state is SaleState.REVERSED, ended.message
    await assert_no_unearned_money(sim, sales, driver.markers)
    assert [s for s in await statuses_of(sim, killed.order_id) if s] == [TransStatus.VOIDED]


@pytest.mark.slow(seconds=6)
@pytest.mark.parametrize("last", ["dispense.chosen", "capture.request"])
async def test_a_power_cut_that_loses_a_card_first_choice_gives_all_the_money_back_at_once(
    sim_factory: Any, drivers: WarmDrivers, tmp_path: Path, last: str
) -> None:
    # Card first ($3.00 authorized, $1.75 chosen): the choice's step (dispense.chosen) has no
    # fsync of its own. Killed right after it (before the vend's approval), or after the
    # confirmed vend's capture request (both unsynced), then the disk as at its last fsync:
    # the journal holds a vend approved up to $3.00 and no choice. A real power cut also ends
    # the boot; here the start is on the same one, the worst case: still nothing is captured
    # (no price is known, the $3.00 is never taken for it), nothing listened for, and the
    # authorization given back at once; never money without a price the machine vended.
    sim = await sim_factory(time_scale=TIME_SCALE, seed=8, transactions=0)
    driver = driver_on(sim, drivers, tmp_path)
    disk = power_cut_after(driver, tmp_path)
    kill_at = 8 if last == "dispense.chosen" else 9
    assert await driver.run(CARD_FIRST, 300, "vended", kill_at) == "killed"
    assert driver.steps[-1] == last
    assert driver.steps[6:8] == ["dispense.request", "dispense.chosen"]
    [killed] = journaled_sales(tmp_path).values()
    power_back(disk, tmp_path, driver)
    [lost] = journaled_sales(tmp_path).values()
    assert (lost.state, lost.product) == (SaleState.DISPENSING, None)  # the choice is gone

    assert await driver.run() == "done"

    sales = journaled_sales(tmp_path)
    ended = sales[killed.sale_id]
    assert (ended.state, ended.captured_cents) == (SaleState.REVERSED, 0), ended.message
    assert "after the restart" not in ended.message  # not listened for: given back at once
    await assert_no_unearned_money(sim, sales, driver.markers)
    assert [s for s in await statuses_of(sim, killed.order_id) if s] == [TransStatus.VOIDED]


@pytest.mark.slow(seconds=8)
async def test_a_kill_or_a_power_cut_before_the_completions_shared_fsync_captures_once(
    sim_factory: Any, drivers: WarmDrivers, tmp_path: Path
) -> None:
    # The capture answered, its completion committed without an fsync of its own (it waits to
    # share the next customer's, or for its own once nobody waits), not announced yet. A kill
    # keeps it: the next start has nothing left to do. A power cut loses it: the journal says
    # CAPTURING, and the next start finds the capture in reporting. Captured once either way.
    sim = await sim_factory(time_scale=TIME_SCALE, seed=10, transactions=0)
    driver = driver_on(sim, drivers, tmp_path)
    for cut in (False, True):
        disk = power_cut_after(driver, tmp_path) if cut else None
        before = sale_ids_so_far(tmp_path)
        assert await driver.run("authorize_capture", 300, "vended", 9) == "killed"
        assert driver.steps[-2:] == ["capture.request", "completed"]
        [killed] = [s for s in journaled_sales(tmp_path).values() if s.sale_id not in before]
        assert killed.state is SaleState.COMPLETED  # a kill alone keeps it
        if disk is not None:
            power_back(disk, tmp_path, driver)
            assert journaled_sales(tmp_path)[killed.sale_id].state is SaleState.CAPTURING
        assert await driver.run() == "done"
        sales = journaled_sales(tmp_path)
        assert sales[killed.sale_id].state is SaleState.COMPLETED, sales[killed.sale_id].message
        await assert_no_unearned_money(sim, sales, driver.markers)
        statuses = [s for s in await statuses_of(sim, killed.order_id) if s]
        assert statuses == [TransStatus.CAPTURED], cut


# The next customer's steps, killed at each, while the first sale's capture waits for that
# customer's answer (sales/answers.py): the wait's distinct moments for the first sale (2a and 4
# are what 1 and 3 are to it; 5, an authorization on disk and never sent, waits out its answer
# window in recovery for nothing the first sale meets: test_crash.py kills there), whether the
# power was cut too (the journal put back as at its last fsync), and how the next sale ends.
IN_THE_WAIT = [
    ("1", True, SaleState.FAILED),  # created (its fsync holds the first's capture request)
    ("3", True, SaleState.FAILED),  # the card read accepted, its id lost with the power
    ("5a", True, SaleState.REVERSED),  # the authorization answered, not heard
    ("7", False, SaleState.REVERSED),  # approved and the vend asked for, the machine not told
]


@pytest.mark.slow(seconds=9)
async def test_a_kill_or_a_power_cut_at_any_moment_of_a_captures_wait_captures_it_once(
    sim_factory: Any, drivers: WarmDrivers, tmp_path: Path
) -> None:
    # Back to back: the first sale's vend is confirmed and its capture request on disk; the
    # capture waits while the next customer waits for the machine's answer. Killed at each
    # step of the next sale up to the approve (and for some, the power cut too), the next
    # start captures the first sale exactly once and ends the next one as its own steps say.
    sim = await sim_factory(time_scale=TIME_SCALE, seed=9, transactions=0)
    driver = driver_on(sim, drivers, tmp_path)
    rounds = []
    for kill_at, cut, second_ends in IN_THE_WAIT:
        disk = power_cut_after(driver, tmp_path) if cut else None
        before = sale_ids_so_far(tmp_path)
        assert await driver.run("overlap", kill_at) == "killed"
        killed = sorted((s for s in journaled_sales(tmp_path).values() if s.sale_id not in before),
                        key=lambda s: s.created_at)
        first, second = killed
        assert first.state is SaleState.CAPTURING, (kill_at, driver.steps)
        if disk is not None:
            power_back(disk, tmp_path, driver)
            kept = journaled_sales(tmp_path)
            assert kept[first.sale_id].state is SaleState.CAPTURING  # fsynced before the wait
            if kill_at == "3":
                assert kept[second.sale_id].interaction_id is None  # what the cut took
        assert await driver.run() == "done"
        rounds.append((kill_at, first, second, second_ends))

    sales = journaled_sales(tmp_path)
    for kill_at, first, second, second_ends in rounds:
        statuses = [s for s in await statuses_of(sim, first.order_id) if s]
        assert statuses == [TransStatus.CAPTURED], kill_at
        assert sales[first.sale_id].state is SaleState.COMPLETED, kill_at
        assert sales[second.sale_id].state is second_ends, (kill_at, sales[second.sale_id])
    await assert_no_unearned_money(sim, sales, driver.markers)
