"""DEX/UCS end to end: the agent's master reads the virtual machine's slave over a real pty.

Every wait is on a FakeClock: a clean read needs no time to pass; a fault that needs a wait to
run out is moved there by the test (``run_out_the_clock``), never slept through.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiosk_agent.audit import parse_audit, render_audit
from kiosk_agent.audit.dexucs import BLOCK_TEXT, DexMaster, DexSlave, MasterPhase, SlaveFaults
from kiosk_agent.audit.framing import Block, Deframer, FramingError, encode_block
from kiosk_agent.audit.link import LinkError, read_audit, read_link
from kiosk_agent.audit.link_settings import LinkSettings
from kiosk_agent.audit.virtual import PortFaults, VirtualDexPort
from kiosk_agent.sales.clock import FakeClock
from tests.audit.helpers import hear_then_silence
from tests.audit.pty_line import read_counted, run_out_the_clock

AUDIT = render_audit(
    [("ID1", "SN0001", "VIRTUAL"), ("VA1", "12500", "50", "2500", "10")]
    + [("PA1", str(n), "250", f"Item {n}") for n in range(60)]
)


async def test_a_clean_read_brings_the_audit_whole():
    clock = FakeClock()
    async with VirtualDexPort(AUDIT, clock=FakeClock()) as port:
        read = await asyncio.wait_for(read_link(LinkSettings(port=port.port), clock=clock), 20)
    assert read.audit == AUDIT
    assert read.blocks == -(-len(AUDIT) // BLOCK_TEXT) > 2
    assert read.machine_id == "VIRTUALVMC"
    assert read.refused_blocks == 0
    assert read.seconds == 0  # no wait ran out
    assert parse_audit(read.audit).paid_vends is not None
    assert port.slave.reads == 1


class CancelledAtTheClose(FakeClock):
    """The agent stops (its shutdown cancels the read) just as a finished read closes its port."""

    async def wait_for(self, awaitable, seconds):  # type: ignore[no-untyped-def]
        if getattr(awaitable, "__qualname__", "").endswith("wait_closed"):
            asyncio.current_task().cancel()  # type: ignore[union-attr]
        return await super().wait_for(awaitable, seconds)


async def test_a_read_cancelled_while_closing_its_port_is_cancelled_not_returned():
    async with VirtualDexPort(AUDIT, clock=FakeClock()) as port:
        read = asyncio.ensure_future(
            read_link(LinkSettings(port=port.port), clock=CancelledAtTheClose())
        )
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(read, 20)
        assert read.cancelled()  # the agent's stop is not swallowed by the port's close
        # the port was closed all the same: the next read opens it and reads whole
        again = await asyncio.wait_for(
            read_link(LinkSettings(port=port.port), clock=FakeClock()), 20
        )
    assert again.audit == AUDIT


async def test_a_corrupted_block_is_refused_and_sent_again():
    clock = FakeClock()
    faults = SlaveFaults(corrupt_blocks={2, 4})
    async with VirtualDexPort(AUDIT, faults=faults, clock=FakeClock()) as port:
        read = await asyncio.wait_for(read_link(LinkSettings(port=port.port), clock=clock), 20)
    assert read.audit == AUDIT
    assert read.refused_blocks == 2


async def test_a_lost_acknowledgement_is_asked_for_and_repeated():
    clock = FakeClock()
    faults = SlaveFaults(lose_acks={1, 3})
    async with VirtualDexPort(AUDIT, faults=faults, clock=FakeClock()) as port:
        read = await asyncio.wait_for(read_link(LinkSettings(port=port.port), clock=clock), 20)
    assert read.audit == AUDIT
    assert not faults.lose_acks  # each was lost once


async def test_a_stalled_slave_ends_the_read_with_the_reason_in_bounded_time():
    clock = FakeClock()
    async with VirtualDexPort(AUDIT, faults=SlaveFaults(stall_after=2), clock=FakeClock()) as port:
        started = clock.monotonic()
        task, line = await read_counted(port, clock)
        await run_out_the_clock(clock, task, port, line)
        with pytest.raises(LinkError, match=r"the machine stalled after block [12], 4 times"):
            await task
    # Four waits of a block's timeout (3 s) after the last block heard; a wait may also run out
    # while a block is on its way (the master then asks again), at most four times per block.
    assert 4 * 3.0 <= clock.monotonic() - started <= 3 * 4 * 3.0 + 4 * 1.0


async def test_a_flooding_port_ends_the_read_bounded_in_bytes():
    clock = FakeClock()
    async with VirtualDexPort(AUDIT, port_faults=PortFaults(flood=True), clock=FakeClock()) as port:
        task = asyncio.ensure_future(read_link(LinkSettings(port=port.port), clock=clock))
        with pytest.raises(LinkError, match="a block of more than 512 bytes without its end"):
            await asyncio.wait_for(task, 20)
        assert port.bytes_sent < 1 << 20  # it stopped listening long before a megabyte


async def test_a_port_answering_garbage_is_refused_naming_it():
    clock = FakeClock()
    async with VirtualDexPort(
        AUDIT, port_faults=PortFaults(garbage=True), clock=FakeClock()
    ) as port:
        task, line = await read_counted(port, clock)
        await run_out_the_clock(clock, task, port, line)
        with pytest.raises(LinkError, match=r"no answer to ENQ.*bytes of garbage heard"):
            await task


async def test_a_port_that_is_not_there_is_a_link_error():
    with pytest.raises(LinkError, match="cannot open /dev/no-such-dex-port"):
        await read_link(LinkSettings(port="/dev/no-such-dex-port"), clock=FakeClock())


async def test_the_whole_read_has_a_deadline():
    clock = FakeClock()
    async with VirtualDexPort(AUDIT, faults=SlaveFaults(stall_after=1), clock=FakeClock()) as port:
        task, line = await read_counted(port, clock, LinkSettings(port=port.port, deadline=2.5))
        await run_out_the_clock(clock, task, port, line)
        with pytest.raises(LinkError, match=r"the read took longer than 2.5 s"):
            await task


# --- the codec alone -------------------------------------------------------------------------


def exchange(master: DexMaster, slave: DexSlave, limit: int = 2000) -> None:
    out = master.start()
    for _ in range(limit):
        if master.wait is None:
            return
        back = slave.receive(out)
        out = master.receive(back) if back else master.expire()


def test_a_block_with_dle_in_its_text_is_stuffed_and_read_back():
    text = b"A\x10B\x10\x10C"
    frame = encode_block(text, last=False)
    assert frame.count(b"\x10\x10") == 3
    assert Deframer().feed(frame) == [Block(0x02, text, last=False, intact=True)]


def test_the_block_check_covers_the_end_byte():
    frame = bytearray(encode_block(b"VA1*1*1\r\n"))
    frame[-3] = 0x17  # ETX made ETB: the CRC no longer matches
    (block,) = Deframer().feed(bytes(frame))
    assert isinstance(block, Block)
    assert not block.intact


def test_a_block_without_end_is_a_framing_error():
    with pytest.raises(FramingError, match="512 bytes"):
        Deframer().feed(b"\x10\x02" + b"A" * 600)


def test_a_machine_refusing_the_read_says_its_code():
    master, slave = DexMaster(), DexSlave(AUDIT)
    slave_identity = slave._identity

    def refusing() -> bytes:
        return encode_block(b"01" + slave_identity()[4:20], start=0x01)

    slave._identity = refusing  # type: ignore[method-assign]
    exchange(master, slave)
    assert master.phase is MasterPhase.FAILED
    assert "refused the read (response code b'01')" in master.failure


def test_a_block_refused_too_often_ends_the_read():
    slave, master = DexSlave(AUDIT), DexMaster()
    original = slave._send

    def always_corrupt(number: int) -> bytes:
        frame = original(number)
        return frame[:-1] + bytes((frame[-1] ^ 0xFF,))

    slave._send = always_corrupt  # type: ignore[method-assign]
    exchange(master, slave)
    assert master.failure == "block 1 failed its CRC, 4 times (receiving the audit)"


# --- generated --------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=80), max_size=30), st.lists(st.booleans(), max_size=30))
def test_any_bytes_heard_and_any_waits_end_the_master_cleanly(chunks, expiries):
    """Whatever the line says, and whenever waits run out, the master never raises, answers
    with bounded bytes, and ends (done or failed with a reason) within its retries."""
    master = DexMaster()
    master.start()
    hear_then_silence(master, chunks, expiries, silent_waits=40)
    assert master.wait is None
    assert master.phase in (MasterPhase.DONE, MasterPhase.FAILED)
    assert master.failure or master.phase is MasterPhase.DONE


@settings(max_examples=100, deadline=None)
@given(
    st.binary(min_size=1, max_size=3000),
    st.sets(st.integers(1, 13), max_size=4),
    st.sets(st.integers(1, 13), max_size=4),
)
def test_any_audit_with_corrupted_blocks_and_lost_acks_arrives_whole(audit, corrupt, lost):
    master, slave = DexMaster(), DexSlave(audit, faults=SlaveFaults(corrupt, lost))
    exchange(master, slave)
    assert master.phase is MasterPhase.DONE, master.failure
    assert master.audit == audit


# --- the shared contract's entry points -------------------------------------------------------


async def test_read_audit_by_port_gives_the_audits_bytes_as_the_machine_has_it_then():
    later = render_audit([("VA1", "12750", "51")])
    counters = iter([AUDIT, later])
    async with VirtualDexPort(lambda: next(counters), clock=FakeClock()) as port:
        first = await asyncio.wait_for(read_audit(port.port, "dex_ucs", clock=FakeClock()), 20)
        second = await asyncio.wait_for(read_audit(port.port, "dex_ucs", clock=FakeClock()), 20)
    assert (first, second) == (AUDIT, later)


async def test_read_audit_refuses_a_protocol_it_does_not_speak():
    with pytest.raises(LinkError, match=r"protocol 'x25' is not one the link speaks \(dex_ucs, "):
        await read_audit("/dev/ttyUSB0", "x25", clock=FakeClock())
