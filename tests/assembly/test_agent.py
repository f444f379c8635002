"""The Agent's lifecycle: start, health seeded from the journal, systemd READY, a clean stop."""

from __future__ import annotations

import asyncio
import gc
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.assembly.systemd import SystemdLifecycle, SystemdNotifier
from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.config.load import load_config
from kiosk_agent.sales.audit import ChargeAudit
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock, FakeClock
from kiosk_agent.sales.model import Flow, SaleRequest
from kiosk_agent.sales.recovery import Recovery
from kiosk_agent.sales.runner import Sale, TerminalBusy
from kiosk_agent.sales.settings import UnknownTerminal
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.terminal import TerminalClient
from tests.helpers import until
from tests.sales.test_recovery import leave_open

from .agent_helpers import ScriptedDispenser, write_config


def charge(cents: int, **fields: Any) -> SaleRequest:
    return SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=cents, **fields)


async def test_start_tells_systemd_ready_and_stop_says_stopping(
    sim_factory: Any, tmp_path: Path
) -> None:
    sim = await sim_factory(time_scale=300, transactions=0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(tmp_path / "notify.sock"))
    listener.settimeout(5)
    systemd = SystemdLifecycle(SystemdNotifier(str(tmp_path / "notify.sock")), environ={})
    config = load_config(write_config(tmp_path))
    agent = Agent(config, settings_from_ready(sim.ready_info()), systemd=systemd)
    try:
        await agent.start()
        assert listener.recv(1024).decode().startswith("READY=1\nSTATUS=ready")
        await agent.stop()
        said = listener.recv(1024).decode().splitlines()
        # the drain's start: how long the stop may take (stop_timeout 2 s + 15 s of margin)
        assert said == ["STOPPING=1", "STATUS=stopping (no sale running)",
                        "EXTEND_TIMEOUT_USEC=17000000"]
    finally:
        listener.close()


async def test_health_counts_today_from_the_journal_after_a_restart(
    agent_factory: Any, sim_factory: Any
) -> None:
    sim = await sim_factory(time_scale=300, transactions=0)
    first = await agent_factory(sim=sim)
    sale = await first.sales.start(charge(250), ScriptedDispenser())
    assert (await sale.result()).state is SaleState.COMPLETED
    await first.stop()
    second = await agent_factory(sim=sim)
    sales = second.health.snapshot().sales
    assert (sales.today_count, sales.today_amount_cents) == (1, 250)
    terminals = {t.device_id: t for t in second.health.snapshot().terminals}
    assert terminals["SIM-0001"].online


async def test_stop_lets_the_running_sale_finish(agent: Agent) -> None:
    machine = ScriptedDispenser(delay=0.3)
    sale = await agent.sales.start(charge(250), machine)
    await asyncio.wait_for(machine.started.wait(), 5)
    await agent.stop()
    record = agent.journal
    record.open()
    finished = record.get(sale.sale_id)
    record.close()
    assert finished is not None
    assert finished.state is SaleState.COMPLETED


async def test_a_stopping_agent_refuses_new_sales(agent: Agent) -> None:
    await agent.sales.stop()
    with pytest.raises(TerminalBusy, match="the agent is stopping"):
        await agent.sales.start(charge(250), ScriptedDispenser())


async def test_no_sale_opens_once_a_stop_has_begun(agent: Agent) -> None:
    """While one machine is being stopped, another that still runs cannot open a sale."""
    refused: list[str] = []

    class StillRunningMachine:
        name = "snacks"

        def status(self) -> dict[str, Any]:
            return {}

        async def stop(self) -> None:
            # a customer presses a button just as the agent stops the machines one by one
            try:
                await agent.sales.start(charge(250), ScriptedDispenser())
            except TerminalBusy as err:
                refused.append(err.reason)

    agent.platforms.append(StillRunningMachine())
    await agent.stop()
    assert refused == ["the agent is stopping: new sales are refused until it is back"]


async def test_terminals_by_name_and_unknown_ones(agent: Agent) -> None:
    sale = await agent.sales.start(charge(250, terminal="printer"), ScriptedDispenser())
    assert sale.terminal == "SIM-0007"
    await sale.result()
    with pytest.raises(UnknownTerminal, match="configured: SIM-0001 \\(front\\), SIM-0007"):
        await agent.sales.start(charge(250, terminal="back"), ScriptedDispenser())


async def test_a_zero_amount_is_refused_before_anything_is_journaled(agent: Agent) -> None:
    with pytest.raises(ValueError, match="amount above zero"):
        await agent.sales.start(charge(0), ScriptedDispenser())
    assert agent.journal.query() == []


class RefusingComponent:
    """A section whose component cannot start (its port is taken, say)."""

    def __init__(self, agent: Agent, conf: Any) -> None:
        self.stopped = False

    async def start(self) -> None:
        raise OSError("address already in use")

    async def stop(self) -> None:
        self.stopped = True


async def test_a_failed_start_leaves_nothing_open(sim_factory: Any, tmp_path: Path) -> None:
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = Agent(load_config(write_config(tmp_path)), settings_from_ready(sim.ready_info()))
    agent.add_component(RefusingComponent, {})
    with pytest.raises(OSError, match="address already in use"):
        await agent.start()
    assert not agent.started
    assert agent.stopped.is_set()
    with pytest.raises(Exception, match="not open"):
        agent.journal.query()


async def test_the_terminal_list_is_in_flight_beside_the_first_charge_check(
    agent_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start listed the terminals, then began the first charge check (reporting's token and
    its queries): each waited for the service in turn before the triggers started. The list is
    now answered only once the check has begun: a start that waits for one before the other
    does not finish."""
    check_begun = asyncio.Event()
    check, listing = ChargeAudit.check, TerminalClient.list

    async def begun(
        audit: ChargeAudit, running: Any = (), settled: bool = True, **kwargs: Any
    ) -> Any:
        check_begun.set()
        return await check(audit, running, settled=settled, **kwargs)

    async def after_the_check(client: TerminalClient) -> Any:
        await asyncio.wait_for(check_begun.wait(), 5)  # only a start that never overlaps waits
        return await listing(client)

    monkeypatch.setattr(ChargeAudit, "check", begun)
    monkeypatch.setattr(TerminalClient, "list", after_the_check)
    agent = await agent_factory()
    assert agent.started
    assert not agent.health.journal.charges_pending  # the check was made before ready
    snapshot = agent.health.snapshot()
    assert {t.device_id for t in snapshot.terminals} == set(agent.settings.terminals)
    assert all(t.online for t in snapshot.terminals)  # listed: not the start's "unknown"


async def test_a_start_that_fails_beside_the_terminal_list_leaves_no_list_running(
    sim_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The list runs beside the rest of the start: a start that fails meanwhile ends it too
    (the session it would use is closed by the stop), and says its own error."""
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = Agent(load_config(write_config(tmp_path)), settings_from_ready(sim.ready_info()))
    asked: list[str] = []

    async def never_answered(_client: TerminalClient) -> Any:
        asked.append("asked")
        try:
            await asyncio.Event().wait()
        finally:
            asked.append("ended")

    def broken(_recovery: Any) -> Any:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(TerminalClient, "list", never_answered)
    monkeypatch.setattr(Recovery, "start", broken)
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        await agent.start()
    assert asked in ([], ["asked", "ended"])  # not left waiting
    listing = agent._start_listing  # the task the start made
    assert listing is not None
    assert listing.done()
    assert agent.stopped.is_set()


async def _recovering_under_systemd(
    sim_factory: Any, tmp_path: Path, *, answer_in: float, clock: Clock = SYSTEM_CLOCK
) -> tuple[Agent, socket.socket]:
    """An agent under a (socket) systemd, with an authorization left open by a crash whose
    answer may still come for ``answer_in`` s; and the socket that hears what it tells systemd."""
    leave_open(tmp_path, state=SaleState.AUTHORIZING, answer_by=clock.time() + answer_in)
    sim = await sim_factory(time_scale=300, transactions=0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(tmp_path / "notify.sock"))
    systemd = SystemdLifecycle(SystemdNotifier(str(tmp_path / "notify.sock")), environ={})
    config = load_config(write_config(tmp_path))
    agent = Agent(
        config, settings_from_ready(sim.ready_info(), timeout=5), systemd=systemd, clock=clock
    )
    return agent, listener


async def test_systemd_hears_ready_only_once_recovery_has_finished(
    sim_factory: Any, tmp_path: Path
) -> None:
    # an authorization whose answer may still come for 1.5 s: recovery must wait for it (on a
    # FakeClock: the 1.5 s pass in the pauses between its lookups)
    clock = FakeClock(wall=time.time())
    agent, listener = await _recovering_under_systemd(
        sim_factory, tmp_path, answer_in=1.5, clock=clock
    )
    listener.settimeout(10)
    try:
        await agent.start()
        assert agent.recovery.state == "running"
        loop = asyncio.get_running_loop()

        async def heard() -> str:  # off the loop: the agent sends from its own tasks
            return (await loop.run_in_executor(None, listener.recv, 1024)).decode()

        assert [await heard(), await heard()] == [
            "STATUS=ready: 0 trigger(s)",
            "EXTEND_TIMEOUT_USEC=30000000",  # more start time while recovery runs
        ]
        assert agent.recovery.state == "running"
        await clock.run(agent.recovery.wait())
        assert (await heard()).startswith("READY=1")
        assert agent.recovery.state == "done"
        record = agent.journal.get("crashed1")
        assert record is not None
        assert record.state is SaleState.FAILED
        assert record.finished_at is not None
        assert record.answer_by is not None
        assert record.finished_at >= record.answer_by  # it waited for the deadline
    finally:
        await agent.stop()
        listener.close()


async def test_a_stop_during_recovery_never_tells_systemd_ready(
    sim_factory: Any, tmp_path: Path
) -> None:
    # recovery waits 30 s for the authorization's deadline; the agent is stopped before that
    agent, listener = await _recovering_under_systemd(sim_factory, tmp_path, answer_in=30)
    try:
        await agent.start()
        assert agent.recovery.state == "running"
        await agent.stop()
        listener.setblocking(False)
        heard = []
        while True:
            try:
                heard.append(listener.recv(1024).decode())
            except BlockingIOError:
                break
        assert [m for m in heard if m.startswith("STOPPING=1")], heard
        assert not [m for m in heard if m.startswith("READY=1")], heard
    finally:
        listener.close()


async def test_a_ready_agent_has_frozen_its_start_up_objects(
    agent_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kiosk_agent.assembly import collector

    monkeypatch.setattr(collector, "_frozen", False)  # as in a process of its own
    frozen_before = gc.get_freeze_count()
    try:
        agent = await agent_factory()
        assert agent.started
        await asyncio.wait_for(agent.settling.done.wait(), 10)  # the models built after READY=1
        assert agent.settling.errors == 0
        # the agent itself is start-up: no full collection walks it any more
        assert gc.get_freeze_count() > frozen_before
        assert not collector.freeze_start_up_objects()  # once a process
    finally:
        if frozen_before == 0:
            gc.unfreeze()


async def test_a_bug_caught_in_a_listener_is_counted_and_shown_in_health(agent: Agent) -> None:
    def broken(event: object) -> None:
        raise RuntimeError("a listener with a bug")

    agent.events.listen(broken)
    sale = await agent.sales.start(charge(250), ScriptedDispenser())
    assert (await sale.result()).state is SaleState.COMPLETED  # the sale never noticed
    snapshot = agent.health.snapshot()
    assert snapshot.errors["sale event listeners"] >= 1
    assert snapshot.status == "degraded"
    assert any(p.startswith("unexpected errors, logged with their tracebacks: sale event "
                            "listeners") for p in snapshot.problems)


async def test_after_ready_the_journals_wal_is_grown_ahead(agent: Agent) -> None:
    from kiosk_agent.sales.journal import WAL_RESERVE_BYTES

    await asyncio.wait_for(agent.settled.wait(), 30)
    wal = agent.journal.path.with_name(agent.journal.path.name + "-wal")
    assert wal.stat().st_size >= WAL_RESERVE_BYTES


async def _checkpoint_due(
    agent_factory: Any, sim_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[FakeClock, Agent, list[float]]:
    """An agent on a FakeClock whose journal has a checkpoint due; (the clock, the agent, when
    each checkpoint ran)."""
    clock = FakeClock(wall=time.time())
    # the service's interaction lives 6 s of real time (not 0.6): a loaded machine still pays
    sim = await sim_factory(time_scale=30, transactions=0)
    agent = await agent_factory(sim=sim, clock=clock)
    ran: list[float] = []

    def checkpoint(stopping: Any = None) -> int:
        ran.append(clock.monotonic())
        return 0

    await agent._journal_watch.stop()  # its own look each second would checkpoint too
    monkeypatch.setattr(agent.journal, "checkpoint_due", lambda: True)
    monkeypatch.setattr(agent.journal, "checkpoint", checkpoint)
    return clock, agent, ran


async def _a_customer_waits(agent: Agent) -> Sale:
    """A customer's vend request whose card never comes (..05): they wait for the answer."""
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=305),
        ScriptedDispenser(),
    )
    await until(lambda: agent.sales.context.customers.waiting() == 1)
    return sale


async def test_a_due_checkpoint_waits_until_the_customer_being_served_has_their_answer(
    agent_factory: Any, sim_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At a tenth of a core its worker thread's 2-3 ms of CPU were 25 ms more of the customer's
    # wait (bench/pi.py): it starts once the machine is told (here C,STOP: the customer
    # cancels), as a released sale's capture does (sales/answers.py).
    clock, agent, ran = await _checkpoint_due(agent_factory, sim_factory, monkeypatch)
    sale = await _a_customer_waits(agent)
    began = clock.monotonic()
    checkpoint = asyncio.create_task(agent._checkpoint_aside())
    await until(lambda: began + 1.0 in clock.pending())  # it waits, one second at most
    await clock.advance(0.4)
    assert ran == []  # the customer still waits
    assert not checkpoint.done()
    assert await agent.sales.cancel(sale.sale_id)
    await asyncio.wait_for(checkpoint, 5)
    assert ran == [began + 0.4]
    assert (await asyncio.wait_for(sale.result(), 5)).state is SaleState.CANCELLED


async def test_a_due_checkpoint_waits_for_a_customer_one_second_at_most(
    agent_factory: Any, sim_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Customers may follow each other without a gap: the WAL is still copied.
    clock, agent, ran = await _checkpoint_due(agent_factory, sim_factory, monkeypatch)
    sale = await _a_customer_waits(agent)
    began = clock.monotonic()
    checkpoint = asyncio.create_task(agent._checkpoint_aside())
    await until(lambda: began + 1.0 in clock.pending())  # it waits, one second at most
    await clock.advance(0.9)
    assert ran == []
    await clock.advance_to(began + 1.0)
    await asyncio.wait_for(checkpoint, 5)
    assert ran == [began + 1.0]
    assert agent.sales.context.customers.waiting() == 1  # the customer still waits meanwhile
    await agent.sales.cancel(sale.sale_id)
    await asyncio.wait_for(sale.result(), 5)


async def test_a_due_checkpoint_runs_at_once_while_the_machine_vends(
    agent_factory: Any, sim_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The customer was told (C,VEND) and the machine vends, the terminal still held: nobody
    # waits for an answer, the loop has nothing to do, and the WAL is copied then (until
    # 2026-11-29's i37-b2b it waited for the terminal, as long as a card-first offer's wait).
    clock, agent, ran = await _checkpoint_due(agent_factory, sim_factory, monkeypatch)
    machine = ScriptedDispenser(delay=30, clock=clock)
    await agent.sales.start(
        SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=300), machine
    )
    await asyncio.wait_for(machine.started.wait(), 10)  # the customer's vend is approved
    vending_at = clock.monotonic()
    await asyncio.wait_for(agent._checkpoint_aside(), 5)
    assert ran == [vending_at]
    assert agent.sales.busy_reason("SIM-0001") is not None  # the vend goes on meanwhile


async def test_a_burst_of_sales_is_checkpointed_by_the_commit_that_makes_it_due(
    agent_factory: Any, sim_factory: Any
) -> None:
    # Customers back to back (bench/hardware.py: some 100 sales a second) wrote three times the
    # WAL's reserve between two of the watch's once-a-second looks, and every commit past the
    # reserve fsynced the file's new size too. The commit that makes a checkpoint due asks for
    # it (after its customer is answered): the WAL stays within what reserve_wal grew it to.
    from kiosk_agent.sales.journal import CHECKPOINT_AFTER_ROWS, WAL_RESERVE_BYTES

    sim = await sim_factory(time_scale=1000, transactions=0)
    agent = await agent_factory(sim=sim)
    await asyncio.wait_for(agent.settled.wait(), 30)
    await agent._journal_watch.stop()  # no look each second: only the commits ask
    wal = agent.journal.path.with_name(agent.journal.path.name + "-wal")
    reserved = wal.stat().st_size
    assert reserved >= WAL_RESERVE_BYTES
    ran: list[int] = []
    checkpoint = agent.journal.checkpoint

    def counted(stopping: Any = None) -> int:
        ran.append(copied := checkpoint(stopping))
        return copied

    agent.journal.checkpoint = counted  # type: ignore[method-assign]
    began = agent.journal.db.total_changes
    while agent.journal.db.total_changes - began < 4 * CHECKPOINT_AFTER_ROWS:
        sale = await agent.sales.start(
            SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=300),
            ScriptedDispenser(vended_cents=300),
        )
        assert (await asyncio.wait_for(sale.result(), 10)).state is SaleState.COMPLETED
        # the next customer after this one's checkpoint, if one runs (a loaded machine may
        # hold its worker thread longer than a sale takes here)
        await until(lambda: agent._checkpointing is None or agent._checkpointing.done())
    assert wal.stat().st_size == reserved  # every commit wrote inside the reserve
    await until(lambda: len(ran) >= 3)
    assert all(copied > 0 for copied in ran)


async def test_a_vended_sale_past_keep_days_is_not_given_back_by_the_charge_check(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """``journal.keep_days: 1`` pruned a vended sale of two days ago at the next start; the
    charge check (reporting's last 7 days) then found its capture under no sale and voided it:
    the customer had the goods and the money back."""
    from tests.assembly.disk_helpers import ledger

    sim = await sim_factory(time_scale=300, transactions=0)
    first = await agent_factory(sim=sim)
    sale = await first.sales.start(charge(250), ScriptedDispenser())
    done = await sale.result()
    assert done.state is SaleState.COMPLETED
    await first.stop()
    two_days = 2 * 86400
    db = sqlite3.connect(tmp_path / "journal.db")
    with db:  # the sale as made two days ago
        db.execute("UPDATE sales SET created_at = created_at - ?, finished_at = finished_at - ?",
                   (two_days, two_days))
    db.close()
    config_path = write_config(tmp_path)
    config_path.write_text(config_path.read_text().replace(
        "journal: {path: journal.db}", "journal: {path: journal.db, keep_days: 1}"))
    config = load_config(config_path)
    second = Agent(config, settings_from_ready(sim.ready_info(), timeout=5.0))
    await second.start()
    try:
        checked = await asyncio.wait_for(second.journal_guard.first_check(), 20)
        assert checked is not None
        assert checked.unaccounted == []
        kept = second.journal.get(sale.sale_id)
        assert kept is not None
        assert kept.state is SaleState.COMPLETED
        assert [s.source for s in second.journal.query()] == ["test"]
        rows = await ledger(second.service, kept.order_id)
        assert [r.status.name for r in rows if r.status] == ["CAPTURED"]
    finally:
        await second.stop()


async def _a_unit_with_a_month_old_sale(tmp_path: Path, sim_factory: Any) -> tuple[Path, Any]:
    """A configuration keeping a day of sales, its journal holding one completed a month ago
    (due for the prune) and one after it (the sale of the newest step: the prune keeps it, so
    no step id is given twice), and the simulator it names."""
    from kiosk_agent.sales.journal import Journal
    from tests.helpers import walk_to
    from tests.sales.test_journal import new_sale

    month_ago = FakeClock(wall=time.time() - 30 * 86400, boot_id="an-earlier-boot")
    journal = Journal(tmp_path / "journal.db", month_ago)
    journal.open()
    walk_to(journal, journal.create(new_sale(1)), SaleState.COMPLETED)
    walk_to(journal, journal.create(new_sale(2)), SaleState.COMPLETED)
    journal.close()
    sim = await sim_factory(time_scale=300, transactions=0)
    config_path = write_config(tmp_path)
    config_path.write_text(config_path.read_text().replace(
        "journal: {path: journal.db}", "journal: {path: journal.db, keep_days: 1}"))
    return config_path, sim


async def test_old_sales_are_pruned_after_ready_not_on_the_way_to_it(
    sim_factory: Any, tmp_path: Path
) -> None:
    """A year of sales to prune held the start 1.5 s before READY=1: the prune now runs after
    it, in a worker thread, with what else the agent does once ready (``settled``)."""
    config_path, sim = await _a_unit_with_a_month_old_sale(tmp_path, sim_factory)
    agent = Agent(load_config(config_path), settings_from_ready(sim.ready_info(), timeout=5.0))
    await agent.start()
    try:
        assert [s.sale_id for s in agent.journal.query()] == ["s2", "s1"]  # ready, not pruned
        await asyncio.wait_for(agent.settled.wait(), 30)
        assert [s.sale_id for s in agent.journal.query()] == ["s2"]
    finally:
        await agent.stop()


async def test_the_prunes_batches_wait_for_no_sale_to_be_running(
    sim_factory: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """A batch holds the journal's write lock, which a sale's step waits for with the whole
    event loop: on a year's journal the prune's minutes doubled a kiosk sale (70 -> 170 ms,
    bench/journal.py). Each batch now waits for the runner to be idle (at most
    PRUNE_IDLE_WAIT_S)."""
    from kiosk_agent.assembly import agent as agent_module
    config_path, sim = await _a_unit_with_a_month_old_sale(tmp_path, sim_factory)
    monkeypatch.setattr(agent_module, "PRUNE_IDLE_WAIT_S", 60.0)
    agent = Agent(load_config(config_path), settings_from_ready(sim.ready_info(), timeout=5.0))
    assert agent.sales.idle()  # no sale live
    selling = True
    monkeypatch.setattr(agent.sales, "idle", lambda: not selling)
    await agent.start()
    try:
        await asyncio.wait_for(agent.settling.done.wait(), 30)  # then the prune begins
        await asyncio.sleep(0.3)
        assert [s.sale_id for s in agent.journal.query()] == ["s2", "s1"]  # waiting for it
        selling = False
        await asyncio.wait_for(agent.settled.wait(), 30)
        assert [s.sale_id for s in agent.journal.query()] == ["s2"]
    finally:
        await agent.stop()


async def test_a_prune_that_breaks_is_said_and_counted_and_the_agent_settles(
    sim_factory: Any, tmp_path: Path
) -> None:
    """Only a journal's errors were caught: any other ended the task of what follows READY=1
    silently, and the agent never said it had settled."""
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = Agent(load_config(write_config(tmp_path)), settings_from_ready(sim.ready_info()))

    def broken_prune(keep_days: int, **kwargs: Any) -> int:
        raise RuntimeError("a bug in the prune")

    agent.journal.prune = broken_prune  # type: ignore[method-assign]
    await agent.start()
    try:
        await asyncio.wait_for(agent.settled.wait(), 30)
        assert agent.health.snapshot().errors["journal prune"] == 1
    finally:
        await agent.stop()


async def test_a_stop_waits_for_the_prunes_thread_to_end_its_batch(
    sim_factory: Any, tmp_path: Path
) -> None:
    """The prune deletes in a worker thread; a stop tells it to end after its batch and waits
    for that before it closes the journal: nothing of the agent still holds the journal's file
    once stop() returns (a copy of the state directory, a second agent, a rollback)."""
    import threading

    sim = await sim_factory(time_scale=300, transactions=0)
    agent = Agent(load_config(write_config(tmp_path)), settings_from_ready(sim.ready_info()))
    in_batch, batch_done = threading.Event(), threading.Event()

    def slow_prune(keep_days: int, *, pause: float, stopping: Any, **waits: Any) -> int:
        in_batch.set()
        while not stopping():  # a batch in progress until the stop is told
            time.sleep(0.01)
        time.sleep(0.2)  # the rest of the batch, after the stop asked
        batch_done.set()
        return 0

    agent.journal.prune = slow_prune  # type: ignore[method-assign]
    await agent.start()
    try:
        assert await asyncio.to_thread(in_batch.wait, 30)
    finally:
        await agent.stop()
    assert batch_done.is_set()


async def test_a_terminal_offline_at_boot_is_starting_and_offline_once_ready_an_outage(
    agent_factory: Any, sim_factory: Any
) -> None:
    # the agent's start hears the terminal offline before any reader is enabled: part of
    # starting (no event, no count, no problem); once it was in service, the same is an outage
    from tests.helpers import sim_call, until

    from .agent_helpers import TIME_SCALE

    sim = await sim_factory(time_scale=TIME_SCALE, seed=1, transactions=0)
    await sim_call(sim, "POST", "/sim/terminals/SIM-0001/offline")
    agent = await agent_factory(sim=sim)
    state = agent.availability.state("SIM-0001")
    assert (state.available, state.starting) == (False, True), state
    snapshot = agent.health.snapshot()
    [shown] = [a for a in snapshot.availability if a.device_id == "SIM-0001"]
    assert (shown.starting, shown.changes) == (True, 0)
    assert not [p for p in snapshot.problems if p.startswith("card payment unavailable")]

    await sim_call(sim, "POST", "/sim/terminals/SIM-0001/online")
    agent.availability.wake()  # the checker's next round, now
    await until(lambda: agent.availability.state("SIM-0001").available, timeout=15)
    kinds = {"out_of_service", "in_service"}
    assert [e for e in agent.event_log.recent() if e.kind in kinds] == []

    await sim_call(sim, "POST", "/sim/terminals/SIM-0001/offline")
    agent.availability.wake()
    await until(lambda: not agent.availability.state("SIM-0001").available, timeout=15)
    state = agent.availability.state("SIM-0001")
    assert not state.starting
    assert [e.kind for e in agent.event_log.recent() if e.kind in kinds] == ["out_of_service"]
    [shown] = [a for a in agent.health.snapshot().availability if a.device_id == "SIM-0001"]
    assert (shown.starting, shown.changes) == (False, 1)


async def test_the_health_checkers_rounds_begin_once_the_agent_is_ready(
    sim_factory: Any, tmp_path: Path
) -> None:
    """The start lists the terminals itself; the checker's first round (the list again, a ping
    a terminal, a journal write) is none of READY=1's business: 19 requests before it, now 10."""
    from tests.helpers import until

    sim = await sim_factory(time_scale=300, transactions=0)
    agent = Agent(load_config(write_config(tmp_path)), settings_from_ready(sim.ready_info()))
    pinged_while_ready: list[bool] = []
    ping = agent.service.terminal.ping

    async def noted_ping(device_id: str) -> Any:
        pinged_while_ready.append(agent.started)
        return await ping(device_id)

    agent.service.terminal.ping = noted_ping  # type: ignore[method-assign]
    await agent.start()
    try:
        assert pinged_while_ready == []  # no ping on the way to ready
        await until(lambda: len(pinged_while_ready) == 2, timeout=15)  # the first round, after
        assert pinged_while_ready == [True, True]
        assert agent.health.terminal("SIM-0001").last_ping_at is not None  # type: ignore[union-attr]
    finally:
        await agent.stop()


async def test_after_ready_the_freeze_the_wal_and_the_prune_each_take_a_turn_of_their_own(
    agent_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After READY=1 the freeze, the WAL grown ahead (12 ms of a core) and the prune's start
    ran in one turn of the loop: a sale arriving then waited for all three. Each has a turn of
    its own now (the collector's own steps: tests/assembly/test_collector.py)."""
    from kiosk_agent.assembly import collector

    turn = 0
    steps: list[tuple[str, int]] = []
    agent = await agent_factory()  # its after-ready task made, not yet run: patched in time
    freeze, reserve, prune = (collector.freeze_start_up_objects, agent.journal.reserve_wal,
                              agent._prune)

    def frozen() -> bool:
        steps.append(("freeze", turn))
        return freeze()

    def reserved() -> bool:
        steps.append(("wal", turn))
        return reserve()

    async def pruned() -> None:
        steps.append(("prune", turn))
        await prune()

    monkeypatch.setattr(collector, "freeze_start_up_objects", frozen)
    monkeypatch.setattr(agent.journal, "reserve_wal", reserved)
    monkeypatch.setattr(agent, "_prune", pruned)

    async def count_turns() -> None:
        nonlocal turn
        while True:
            turn += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count_turns())
    try:
        await asyncio.wait_for(agent.settled.wait(), 10)
    finally:
        counter.cancel()
    assert [name for name, _turn in steps] == ["freeze", "wal", "prune"]
    turns = [at for _name, at in steps]
    assert turns == sorted(set(turns))  # each in a turn of its own


async def test_a_stop_lets_the_journal_go_only_once_its_checkpoints_worker_thread_ended(
    agent_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop cancels the checkpoint's task, not its worker thread: that thread's connection
    may still be retrying RESTART (a reader in the way) when the journal closes. Its claim
    let go then, a second agent could open the journal while the first's thread still wrote
    to it. The stop now tells the thread (it ends its tries) and waits for it, bounded, before
    it closes the journal and lets the claim go."""
    import threading

    from kiosk_agent.sales import journal as journal_module

    agent = await agent_factory()
    await asyncio.wait_for(agent.settled.wait(), 30)
    await agent._journal_watch.stop()  # its own look each second would checkpoint too
    monkeypatch.setattr(journal_module, "RESTART_TRIES", 2000)  # some 10 s held busy
    monkeypatch.setattr(journal_module, "RESTART_RETRY_S", 0.005)
    from kiosk_agent.sales.journal import SaleRecord
    from tests.helpers import walk_to

    sale = agent.journal.create(SaleRecord(
        sale_id="before-the-reader", order_id=str(agent.unit.order_id("0" * 15 + "c")),
        source="test", flow="charge_card", terminal="SIM-0001", amount_cents=100,
        state=SaleState.STARTED))
    walk_to(agent.journal, sale, SaleState.CANCELLED)  # frames in the WAL
    reader = sqlite3.connect(agent.journal.path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT COUNT(*) FROM sales").fetchone()  # in the WAL: each RESTART waits
    started, ended = threading.Event(), threading.Event()
    checkpoint = agent.journal.checkpoint

    def held(*args: Any, **kwargs: Any) -> int:
        started.set()
        try:
            return checkpoint(*args, **kwargs)
        finally:
            ended.set()

    monkeypatch.setattr(agent.journal, "checkpoint", held)
    monkeypatch.setattr(agent.journal, "checkpoint_due", lambda: True)
    let_go_while_it_ran: list[bool] = []
    release = agent.owner.release

    def release_watched() -> None:
        let_go_while_it_ran.append(not ended.is_set())
        release()

    monkeypatch.setattr(agent.owner, "release", release_watched)
    try:
        agent._checkpoint_soon()
        await until(started.is_set)
        await until(lambda: not agent.journal.db.in_transaction, 5)
        assert not ended.is_set()  # held busy by the reader
        await asyncio.wait_for(agent.stop(), 30)
    finally:
        reader.close()
    assert let_go_while_it_ran == [False]
    assert ended.is_set()
