"""SIGKILL the agent at every step of every flow, restart it, and ask the simulator what happened.

The agent runs as a real process (``crash_driver.py``) against a simulator in this process, forked
from one warm interpreter (``WarmDrivers``) that imported the agent once: each driver is a process
of its own, SIGKILLed by the kernel, without 1.2 s of CPU spent on imports each time (there are some
40 drivers here). Each driver first recovers what the previous, killed one left open, then starts
the next sale and is killed right after its Nth journal step (before the call that step announces).
The last driver only recovers. Each distinct write point is killed at once, which is enough: the
steps one batch commits together are one point (a kill after its first step lands after its
last), and a flow's failed dispense journals the same steps as its vended one up to the dispense
request, so it is killed only after that (a kill before would leave the very same journal to
recover: 15 more drivers, 6 of them waiting out a charge's whole deadline). Then, from the
service's own records (reporting) and the machine's vend counter:

- no sale is lost: every sale any process started is in the journal, and ended;
- no double charge: at most one charge per sale holds or held money;
- no captured money without a confirmed dispense, and no authorization left hanging.
"""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.sales.journal import Journal
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import (
    InteractionKind,
    InteractionStatus,
    TransactionFilter,
    TransStatus,
)
from tests.assembly.crash_driver import CARD_FIRST, CHARGED, HELD, SharedDrivers, WarmDrivers
from tests.helpers import service_yaml, sim_call

DRIVER = Path(__file__).with_name("crash_driver.py")
TIME_SCALE = 150  # interactions live 1.2 s: slack for a loaded machine
CASES = [
    ("charge_card", 250, "vended"),
    ("charge_card", 250, "failed"),
    ("authorize_capture", 300, "vended"),
    ("authorize_capture", 300, "failed"),
]
# journal steps that announce a call to the service
SERVICE_CALL_STEPS = {
    "charge_card.request",
    "read_card.request",
    "authorize.request",
    "capture.request",
    "reverse.request",
}


def write_config(directory: Path, sim: Any, timeout: float = 5) -> Path:
    """The crash driver's agent on ``sim``: ``timeout`` the service's per-call one."""
    info = sim.ready_info()
    path = directory / "config.yaml"
    path.write_text(
        service_yaml(info, timeout=timeout)
        + textwrap.dedent(
            f"""\
            terminals: [{{device_id: SIM-0001}}]
            journal: {{path: journal.db}}
            sales: {{vend_timeout: 5, answer_margin: 0.5, interaction_lifetime: {180 / TIME_SCALE}}}
            """
        )
    )
    return path


class Driver:
    def __init__(
        self, drivers: WarmDrivers, config: Path, markers: Path, env: dict[str, str]
    ) -> None:
        self.drivers = drivers
        self.log = config.with_name("drivers.log")
        self.config = config
        self.markers = markers
        self.env = env
        self.started_sales: set[str] = set()
        self.kills = 0
        self.steps: list[str] = []  # step names of the last driver's sale

    async def run(self, *sale: Any, recovery_kill: str | None = None) -> str:
        """One agent process; 'killed' or 'done'. Kills it with SIGKILL when it says KILLME."""
        with self.log.open("a") as log:
            log.write(f"--- driver {' '.join(map(str, sale))}\n")
        argv = [str(self.config), str(self.markers), *map(str, sale)]
        env = {**self.env, "CRASH_RECOVERY_KILL": recovery_kill or ""}
        await self.drivers.start(argv, env, self.log)
        outcome = "done"
        self.steps = []
        try:
            async with asyncio.timeout(30):
                while not (line := await self.drivers.line()).startswith("ENDED "):
                    assert line, "the drivers' server ended: " + self.log.read_text()[-3000:]
                    words = line.split()
                    if words[0] == "STEP":
                        self.started_sales.add(words[-1])
                        self.steps.append(words[2])
                    elif words[0] == "KILLME":
                        self.drivers.kill()
                        self.kills += 1
                        outcome = "killed"
        except TimeoutError:
            self.drivers.kill()
            await self.drivers.ended()
            raise AssertionError(self.log.read_text()[-3000:]) from None
        returncode = int(line.split()[1])
        if outcome == "done":
            assert returncode == 0, self.log.read_text()[-3000:]
        else:
            assert returncode == -signal.SIGKILL
        return outcome


def driver_on(sim: Any, drivers: WarmDrivers, tmp_path: Path) -> Driver:
    """A crash driver for agents on ``sim``, with its keys in their environment."""
    info = sim.ready_info()
    env = {
        **os.environ,
        "KIOSK_API_KEY": info["api_key"],
        "KIOSK_CLIENT_SECRET": info["client_secret"],
    }
    markers = tmp_path / "vended.txt"
    markers.touch()
    return Driver(drivers, write_config(tmp_path, sim), markers, env)


@pytest.mark.slow(seconds=21)
async def test_sigkill_at_every_step_loses_no_sale_and_keeps_no_unearned_money(
    sim_factory: Any, drivers: WarmDrivers, tmp_path: Path
) -> None:
    sim = await sim_factory(time_scale=TIME_SCALE, seed=2, transactions=0)
    driver = driver_on(sim, drivers, tmp_path)

    killed, completed = await kill_at_every_step(driver, CASES)
    # crashes during recovery itself: killed as the void's / the capture's answer arrives
    assert await driver.run("charge_card", 250, "failed", 5) == "killed"
    assert driver.steps[-1] == "dispense.request"
    assert await driver.run(recovery_kill="2a") == "killed"  # recovery.start, reverse.request
    # the vend left in flight told to a person in the give-back's commit (a maybe late vend)
    assert driver.steps == ["recovery.start", "reverse.request", "late.vend"]
    assert await driver.run("authorize_capture", 300, "vended", 8) == "killed"
    assert driver.steps[-1] == "capture.request"
    assert await driver.run(recovery_kill="2a") == "killed"  # recovery.start, capture.request
    assert driver.steps == ["recovery.start", "capture.request"]
    # killed with a card read under way, then at the start of its recovery: the next recovery
    # ends it failed and its agent must still stop (a wake-up of the health checker as the stop
    # began once lost the stop's cancellation: the process never exited)
    assert await driver.run("authorize_capture", 300, "vended", "2a") == "killed"
    assert driver.steps == ["created", "read_card.request"]
    assert await driver.run(recovery_kill="1") == "killed"
    assert driver.steps == ["recovery.start"]
    assert await driver.run(recovery_kill="1a") == "done"  # no money call to be killed on
    assert driver.steps == ["recovery.start", "recovery.done"]
    assert await driver.run() == "done"  # recovers the last killed sale, if any

    sales = journaled_sales(tmp_path)
    # every step of every case's flow was in a point some driver was killed at (16 points)
    ran = {(flow, step) for flow, steps in completed for step in steps}
    assert ran <= {(point[0], step) for point in killed for step in point[1:]}
    # no sale lost, none left open, none that needed a person
    assert driver.started_sales <= set(sales)
    await assert_no_unearned_money(sim, sales, driver.markers)


async def kill_at_every_step(
    driver: Driver, cases: list[tuple[str, int, str]]
) -> tuple[set[tuple[str, ...]], list[tuple[str, list[str]]]]:
    """Each case's sale killed after each of its distinct write points, then once more as each
    of its money calls answers; each kill recovered by the next driver. The points killed at
    (flow, steps...), and each case's steps run to its end."""
    killed: set[tuple[str, ...]] = set()  # each distinct point a driver was killed at
    completed: list[tuple[str, list[str]]] = []  # each case's steps, run to its end
    for flow, cents, dispense in cases:
        # A flow's second case journals the same steps as its first up to the dispense (the
        # machine is asked nothing before): killed from its first step after it on.
        shared = killed_already(killed, flow)
        kill_at = len(shared) + 1
        while await driver.run(flow, cents, dispense, kill_at) == "killed":
            point = (flow, *driver.steps)
            assert driver.steps[: len(shared)] == list(shared), "the cases' steps differ"
            assert point not in killed, f"killed twice at {point}"
            killed.add(point)
            # the steps a batch commits together are one write point: killed after its last
            kill_at = len(driver.steps) + 1
        steps = driver.steps
        assert len(steps) > 4, f"{flow}/{dispense} finished after {steps}"
        completed.append((flow, steps))
        # and once more for each call that moves money: killed as its answer arrives
        for n, step in enumerate(steps, start=1):
            if step in SERVICE_CALL_STEPS and n > len(shared):
                assert await driver.run(flow, cents, dispense, f"{n}a") == "killed", step
    return killed, completed


# the last step a flow's cases share before the machine says how the dispense went: the vend's
# approval (card first, the customer's choice after it)
LAST_SHARED_STEPS = ("dispense.request", "dispense.chosen")


def killed_already(killed: set[tuple[str, ...]], flow: str) -> tuple[str, ...]:
    """The steps of ``flow`` up to its dispense request (card first, up to the customer's
    choice), when a driver was killed after them."""
    shared = [point[1:] for point in killed
              if point[0] == flow and point[-1] in LAST_SHARED_STEPS]
    return max(shared, key=len, default=())


@pytest.mark.slow(seconds=25)
async def test_sigkill_at_every_step_of_a_card_first_sale_captures_only_the_vended_choice(
    sim_factory: Any, drivers: WarmDrivers, tmp_path: Path
) -> None:
    # Card first (the customer taps, $3.00 is authorized, then chooses $1.75 at the machine):
    # killed after each write point, the choice's unsynced step among them, and as each money
    # call answers. As docs/journal.md says: killed before the choice, the authorization is
    # given back at once (nothing was chosen, no vend approved); killed between the choice
    # (dispense.chosen, on disk) and the vend's approval, recovery listens for that vend until
    # the choice's deadline, hears nothing (the machine never vended) and gives it all back;
    # killed once the vend is confirmed, it captures the chosen $1.75, never the $3.00 held.
    # Then a kill at the choice and another at the start of its recovery (two restarts in a
    # row): the third start still gives it back, within the choice's deadline.
    sim = await sim_factory(time_scale=TIME_SCALE, seed=7, transactions=0)
    driver = driver_on(sim, drivers, tmp_path)
    cases = [(CARD_FIRST, 300, "vended"), (CARD_FIRST, 300, "failed")]
    killed, completed = await kill_at_every_step(driver, cases)
    [at_choice] = [p for p in killed if p[-1] == "dispense.chosen"]
    assert "dispense.request" in at_choice, killed  # the approval first, the choice after
    assert await driver.run(CARD_FIRST, 300, "vended", len(at_choice) - 1) == "killed"
    assert driver.steps[-1] == "dispense.chosen"
    assert await driver.run(recovery_kill="1") == "killed"
    assert driver.steps == ["recovery.start"]
    assert await driver.run() == "done"

    sales = journaled_sales(tmp_path)
    ran = {(flow, step) for flow, steps in completed for step in steps}
    assert ran <= {(point[0], step) for point in killed for step in point[1:]}
    assert driver.started_sales <= set(sales)
    await assert_no_unearned_money(sim, sales, driver.markers)
    vended = dict(line.split() for line in driver.markers.read_text().splitlines())
    for sale in sales.values():
        assert sale.amount_cents == 300
        chosen = [s for s in journal_steps(tmp_path, sale.sale_id)
                  if s.step == "dispense.chosen"]
        if sale.state is SaleState.COMPLETED:  # the choice's price, as the machine vended it
            assert sale.captured_cents == int(vended[sale.sale_id]) == 175, sale.message
            assert [s.detail["cents"] for s in chosen] == [175]
        else:  # never vended: everything authorized given back
            assert sale.sale_id not in vended
            assert sale.state in (SaleState.REVERSED, SaleState.FAILED, SaleState.DECLINED), (
                sale.message)
            assert sale.captured_cents == 0
    left_at_choice = [s for s in sales.values()
                      if "no vend result within its vend timeout after the restart"
                      in s.message]
    assert len(left_at_choice) == 2, [  # the kill at the choice, and the two in a row
        [s.step for s in journal_steps(tmp_path, sale.sale_id)] for sale in left_at_choice]
    assert all(s.reversed_cents == 300 for s in left_at_choice)


def journal_steps(directory: Path, sale_id: str) -> list[Any]:
    journal = Journal(directory / "journal.db")
    journal.open()
    try:
        return journal.steps(sale_id)
    finally:
        journal.close()


def sale_ids_so_far(directory: Path) -> set[str]:
    """The sales journaled in ``directory`` before a round (none before the first start)."""
    return set(journaled_sales(directory)) if (directory / "journal.db").exists() else set()


def journaled_sales(directory: Path) -> dict[str, Any]:
    journal = Journal(directory / "journal.db")
    journal.open()
    sales = {sale.sale_id: sale for sale in journal.query()}
    journal.close()
    return sales


async def assert_no_unearned_money(sim: Any, sales: dict[str, Any], markers: Path) -> None:
    """Every sale ended, none needing a person; the service's records agree with each one."""
    vended = {line.split()[0] for line in markers.read_text().splitlines()}
    assert [s for s in sales.values() if not s.state.final] == []
    assert [s.message for s in sales.values() if s.state is SaleState.ATTENTION] == []

    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        for sale in sales.values():
            rows = []
            for order_id in sale.all_order_ids():
                query = TransactionFilter(order_id=order_id)
                rows += [r async for r in service.reporting.transactions(query)]
            charged = [r for r in rows if r.status in CHARGED]
            held = [r for r in rows if r.status in HELD]
            why = f"{sale.flow} {sale.state.value} {sale.message!r}: {[r.status for r in rows]}"
            assert len(charged) <= 1, f"double charge: {why}"
            assert not [r for r in held if r.status is TransStatus.AUTHORIZED], f"hanging: {why}"
            if held:
                assert sale.sale_id in vended, f"money kept without a dispense: {why}"
                assert sale.state is SaleState.COMPLETED, why
                assert held[0].amount_cents == sale.captured_cents, why
            if sale.state is SaleState.COMPLETED:
                assert held, f"completed without money: {why}"
            if sale.state is SaleState.REVERSED:
                assert charged, why
                assert not held, why


# The second sale's steps when the agent is killed, the first one capturing all along.
OVERLAP_KILLS = [
    ("2", ["created", "read_card.request"], SaleState.FAILED),
    ("3", ["created", "read_card.request", "read_card.accepted"], SaleState.FAILED),
    (
        "5a",
        ["created", "read_card.request", "read_card.accepted", "read_card.done",
         "authorize.request"],
        SaleState.REVERSED,
    ),
    (
        "8",
        ["created", "read_card.request", "read_card.accepted", "read_card.done",
         "authorize.request", "authorize.approved", "dispense.request", "capture.request"],
        SaleState.COMPLETED,
    ),
]


async def kill_at_each_overlap(
    sim: Any, driver: Any, tmp_path: Path, fault: dict[str, Any], first_left: SaleState
) -> list[tuple[str, str, SaleState]]:
    """For each of OVERLAP_KILLS: ``fault`` armed, a first sale left ``first_left`` and the agent
    killed at that step of the next one on the same terminal, then a start that recovers both.
    (first, second, how the second must end) for each round."""
    pairs = []
    for kill_at, steps, second_ends in OVERLAP_KILLS:
        await sim_call(sim, "POST", "/sim/faults", fault)
        before = sale_ids_so_far(tmp_path)
        assert await driver.run("overlap", kill_at) == "killed"
        assert driver.steps == steps
        killed = {s.sale_id: s for s in journaled_sales(tmp_path).values()
                  if s.sale_id not in before}
        first, second = sorted(killed.values(), key=lambda s: s.created_at)
        assert first.state is first_left
        assert await driver.run() == "done"  # the next start recovers both
        pairs.append((first.sale_id, second.sale_id, second_ends))
    return pairs


@pytest.mark.slow(seconds=22)
async def test_sigkill_with_a_capturing_sale_and_a_newer_one_on_its_terminal_ends_both(
    sim_factory: Any, drivers: WarmDrivers, tmp_path: Path
) -> None:
    # The first sale vended and released the terminal; its capture is held by the service (a
    # black hole: never processed) when the agent is killed at a step of the second sale. The
    # next start must capture the first (the goods are out) and end the second as its own
    # step says: nothing moved, an authorization given back, or its capture made. Since the
    # capture waits for the next customer's answer (sales/answers.py), a kill before that
    # answer finds it unsent, and the black hole holds the recovering start's capture instead:
    # its deadline then its reporting lookup, some 2 s a round of waiting (22 s in all).
    sim = await sim_factory(time_scale=TIME_SCALE, seed=3, transactions=0)
    driver = driver_on(sim, drivers, tmp_path)
    held_capture = {"path": "/api/v1/capture", "fault": "black_hole", "count": 1}
    pairs = await kill_at_each_overlap(sim, driver, tmp_path, held_capture, SaleState.CAPTURING)

    sales = journaled_sales(tmp_path)
    for first_id, second_id, second_ends in pairs:
        assert sales[first_id].state is SaleState.COMPLETED, sales[first_id].message
        assert sales[second_id].state is second_ends, sales[second_id].message
    await assert_no_unearned_money(sim, sales, driver.markers)


async def statuses_of(sim: Any, order_id: str) -> list[TransStatus]:
    """What the service's reporting holds under an order id."""
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        query = TransactionFilter(order_id=order_id)
        return [r.status async for r in service.reporting.transactions(query)]


@pytest.mark.slow(seconds=6)
async def test_sigkill_while_a_capture_waits_for_the_next_customers_answer_captures_it_once(
    sim_factory: Any, drivers: WarmDrivers, tmp_path: Path
) -> None:
    # The first sale's vend is confirmed and its capture request (CAPTURING) on disk; its
    # capture waits while the next customer waits for the machine's answer (sales/answers.py).
    # Killed there (the next sale's card read accepted, many turns after the capture would
    # have been sent before), nothing was sent: the next start captures it, exactly once.
    sim = await sim_factory(time_scale=TIME_SCALE, seed=6, transactions=0)
    driver = driver_on(sim, drivers, tmp_path)
    assert await driver.run("overlap", "3") == "killed"
    assert driver.steps == ["created", "read_card.request", "read_card.accepted"]
    first, second = sorted(journaled_sales(tmp_path).values(), key=lambda s: s.created_at)
    assert first.state is SaleState.CAPTURING
    assert await statuses_of(sim, first.order_id) == [TransStatus.AUTHORIZED]  # not sent
    assert await driver.run() == "done"  # the next start recovers both
    sales = journaled_sales(tmp_path)
    assert sales[first.sale_id].state is SaleState.COMPLETED, sales[first.sale_id].message
    assert await statuses_of(sim, first.order_id) == [TransStatus.CAPTURED]
    assert sales[second.sale_id].state is SaleState.FAILED
    await assert_no_unearned_money(sim, sales, driver.markers)


@pytest.mark.slow(seconds=23)
async def test_sigkill_with_a_lost_authorization_and_a_newer_sale_on_its_terminal_ends_both(
    sim_factory: Any, drivers: WarmDrivers, tmp_path: Path
) -> None:
    # The first sale's authorization answer is lost (the charge made): it tells the machine no,
    # frees the terminal and asks reporting, which is slow (2 s a lookup), when the agent is
    # killed at a step of the next customer's sale. The next start gives the first one's money
    # back (found in reporting) and ends the second as its own step says; reporting stays slow.
    sim = await sim_factory(time_scale=TIME_SCALE, seed=4, transactions=0)
    driver = driver_on(sim, drivers, tmp_path)
    slow_reporting = {"path": "/ords/sprint/api/3p/v1/transactions", "method": "GET",
                      "fault": "latency", "delay_s": 2}  # fmt: skip
    await sim_call(sim, "POST", "/sim/faults", slow_reporting)
    lost = {"path": "/api/v1/charge", "fault": "drop_answer", "count": 1}
    # the first's lookup still on its way when killed
    pairs = await kill_at_each_overlap(sim, driver, tmp_path, lost, SaleState.AUTHORIZING)

    await sim_call(sim, "DELETE", "/sim/faults")  # the judge's own lookups need no waiting
    sales = journaled_sales(tmp_path)
    for first_id, second_id, second_ends in pairs:
        first = sales[first_id]
        assert first.state is SaleState.REVERSED, first.message
        assert (first.authorized_cents, first.reversed_cents) == (300, 300)
        assert sales[second_id].state is second_ends, sales[second_id].message
    await assert_no_unearned_money(sim, sales, driver.markers)


@pytest.mark.slow(seconds=4)
async def test_sigkill_right_after_the_unfsynced_accepted_step_keeps_the_reads_id_to_cancel_by(
    sim_factory: Any, drivers: WarmDrivers, tmp_path: Path
) -> None:
    # The card read's accepted step is committed without an fsync of its own (a WAL commit at
    # synchronous=NORMAL: in the OS's page cache). A kill right after it must leave the
    # interaction id on disk, so that the next start cancels the read by it and the terminal
    # is free at once, not held by a read nobody can end for an interaction's lifetime.
    # the read lives 12 s of the simulator's (not 1.2 s): a start on a loaded machine finds it
    # still waiting for a card
    sim = await sim_factory(time_scale=TIME_SCALE / 10, seed=5, transactions=0)
    driver = driver_on(sim, drivers, tmp_path)
    no_card = 305  # ..05: no card is presented, the read waits (choices.md)
    assert await driver.run("authorize_capture", no_card, "vended", 3) == "killed"
    assert driver.steps == ["created", "read_card.request", "read_card.accepted"]
    [killed] = journaled_sales(tmp_path).values()
    assert killed.state is SaleState.READING_CARD
    assert killed.interaction_id is not None
    assert await driver.run() == "done"  # recovers it: cancels the read by its id
    [recovered] = journaled_sales(tmp_path).values()
    assert recovered.state is SaleState.FAILED, recovered.message
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        read = await service.terminal.get_interaction(
            "SIM-0001", InteractionKind.READ_CARD, killed.interaction_id
        )
    assert read.status is InteractionStatus.CANCELLED  # ended by recovery, not by its lifetime


async def test_a_warm_driver_is_a_process_of_its_own_whose_failure_is_its_exit_code(
    drivers: WarmDrivers, tmp_path: Path
) -> None:
    """What the crash tests rely on in WarmDrivers: each driver a new process (not the server),
    its stderr in the file it was given, its failure its exit code. (Its environment is its
    own too: the drivers above find the simulator's keys only in the one they are given.)"""
    log = tmp_path / "driver.log"
    argv = [str(tmp_path / "missing.yaml"), str(tmp_path / "m.txt")]
    pid = await drivers.start(argv, dict(os.environ), log)
    assert pid not in (os.getpid(), drivers.server_pid)
    assert (await drivers.ended()) == 1
    assert "missing.yaml" in log.read_text()  # its traceback, in the file it was given
    assert drivers.pid == 0  # ended: its pid is no longer killed by the server's user


def test_one_drivers_server_serves_every_test_and_ends_what_one_left_running(
    tmp_path: Path,
) -> None:
    """SharedDrivers, the `drivers` fixture's: one server for the test process, used from each
    test's own event loop; a driver a test left running (its lines unread) is ended before the
    next is forked, so the next test hears only its own."""
    shared = SharedDrivers.shared()
    assert SharedDrivers.shared() is shared
    argv = [str(tmp_path / "missing.yaml"), str(tmp_path / "m.txt")]

    async def left_running() -> int:
        return await shared.start(argv, dict(os.environ), tmp_path / "first.log")

    async def the_next_test() -> tuple[int, int]:
        pid = await shared.start(argv, dict(os.environ), tmp_path / "second.log")
        return pid, await shared.ended()

    first = asyncio.run(left_running())
    second, code = asyncio.run(the_next_test())
    assert second != first
    assert code == 1  # its own end, not the first one's lines
    assert shared.server_pid == SharedDrivers.shared().server_pid
    assert "missing.yaml" in (tmp_path / "second.log").read_text()
