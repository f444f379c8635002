"""Scheduled reads: when the machine is idle, stopped for a sale, retried with back-off."""

from __future__ import annotations

import asyncio

from kiosk_agent.audit import AuditFile, render_audit
from kiosk_agent.audit.dexucs import SlaveFaults
from kiosk_agent.audit.link import LinkRead, LinkSettings
from kiosk_agent.audit.schedule import AuditSchedule, ReadState
from kiosk_agent.audit.virtual import VirtualDexPort
from kiosk_agent.sales.clock import FakeClock

AUDIT = render_audit([("VA1", "1250", "5"), ("CA2", "750", "3"), ("DA2", "500", "2")])


class Machine:
    """Whether a sale is in progress on the machine (what the runner would say)."""

    def __init__(self) -> None:
        self.selling = False

    def busy(self) -> bool:
        return self.selling


async def until(condition, clock: FakeClock | None = None, step: float = 0.2) -> None:
    """Until ``condition()``, moving ``clock`` a poll at a time when given (bounded)."""
    for _ in range(2000):
        if condition():
            return
        if clock is not None and clock.pending(pauses_only=True):
            await clock.advance(step)
        else:
            await asyncio.sleep(0.001)
    raise AssertionError("condition never held")


async def test_a_read_when_the_machine_is_idle_hands_the_audit_on():
    kept: list[tuple[AuditFile, LinkRead]] = []

    async def keep(audit: AuditFile, read: LinkRead) -> None:
        kept.append((audit, read))

    clock = FakeClock()
    async with VirtualDexPort(AUDIT, clock=FakeClock()) as port:
        schedule = AuditSchedule(
            LinkSettings(port=port.port),
            interval=3600,
            busy=Machine().busy,
            on_audit=keep,
            clock=clock,
        )
        assert await asyncio.wait_for(schedule.run_once(), 20)
    ((audit, read),) = kept
    assert audit.paid_vends is not None
    assert audit.paid_vends.value_since_init == 1250
    assert read.audit == AUDIT
    assert schedule.status()["reads_ok"] == 1
    assert schedule.status()["last_ok_at"] == clock.time()
    assert schedule.next_delay(True) == 3600


async def test_a_read_waits_for_the_sale_in_progress_to_end():
    machine = Machine()
    machine.selling = True
    clock = FakeClock()
    async with VirtualDexPort(AUDIT, clock=FakeClock()) as port:
        schedule = AuditSchedule(
            LinkSettings(port=port.port), interval=3600, busy=machine.busy, clock=clock
        )
        task = asyncio.ensure_future(schedule.run_once())
        await until(lambda: schedule.state is ReadState.WAITING)
        await clock.advance(5 * schedule.busy_poll)
        assert port.bytes_heard == 0  # not a byte sent while the machine sells
        machine.selling = False
        await clock.advance(schedule.busy_poll)  # its next look finds the machine idle
        assert await asyncio.wait_for(task, 20) is True  # the read itself needs no clock


async def test_a_sale_starting_during_a_read_stops_it_without_counting_a_failure():
    machine = Machine()
    clock = FakeClock()
    async with VirtualDexPort(AUDIT, faults=SlaveFaults(stall_after=1), clock=FakeClock()) as port:
        schedule = AuditSchedule(
            LinkSettings(port=port.port), interval=3600, busy=machine.busy, clock=clock
        )
        task = asyncio.ensure_future(schedule.run_once())
        await until(lambda: port.slave.stalled)
        machine.selling = True
        await until(task.done, clock)
    assert task.result() is False
    assert schedule.stats.reads_stopped == 1
    assert schedule.stats.reads_failed == 0


def backoffs(clock: FakeClock) -> list[float]:
    """The pauses between reads (not the looks for a sale, 0.2 s each, while a read runs)."""
    return [pause for pause in clock.sleeps if pause != 0.2]


async def test_failed_reads_back_off_up_to_the_interval_and_are_shown():
    clock = FakeClock()
    schedule = AuditSchedule(
        LinkSettings(port="/dev/no-dex-port"),
        interval=600,
        busy=Machine().busy,
        clock=clock,
        retry_min=30,
    )
    running = asyncio.ensure_future(schedule.run())
    try:
        await until(lambda: len(backoffs(clock)) >= 6, clock, step=600)
    finally:
        running.cancel()
    delays = backoffs(clock)[:6]
    for attempt, delay in enumerate(delays):  # 30 s doubling, +-25 %, never past the interval
        base = min(600, 30 * 2**attempt)
        assert max(30, base * 0.75) <= delay <= min(600, base * 1.25), (attempt, delays)
    status = schedule.status()
    assert status["reads_failed"] >= 6
    assert str(status["last_error"]).startswith("cannot open /dev/no-dex-port")


async def test_a_keeper_that_fails_is_counted_and_the_schedule_goes_on():
    async def broken(audit: AuditFile, read: LinkRead) -> None:
        raise RuntimeError("disk full")

    clock = FakeClock()
    async with VirtualDexPort(AUDIT, clock=FakeClock()) as port:
        schedule = AuditSchedule(
            LinkSettings(port=port.port),
            interval=3600,
            busy=Machine().busy,
            on_audit=broken,
            clock=clock,
        )
        assert await asyncio.wait_for(schedule.run_once(), 20)
        assert await asyncio.wait_for(schedule.run_once(), 20)
    assert schedule.stats.handler_errors == 2
    assert schedule.status()["last_error"] == "keeping the audit failed: RuntimeError: disk full"
