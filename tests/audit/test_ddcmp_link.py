"""DDCMP end to end: the agent's master reads the virtual machine's DDCMP slave over a real pty,
with faults on purpose; and the codec alone, fuzzed.

Every wait is on a FakeClock: a clean read needs no time to pass; a fault that needs a wait to
run out is moved there by the test (``run_out_the_clock``), never slept through.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiosk_agent.audit import parse_audit, render_audit
from kiosk_agent.audit.crc import crc16_arc
from kiosk_agent.audit.ddcmp import (
    BLOCK_TEXT,
    App,
    DdcmpFaults,
    DdcmpMaster,
    DdcmpSlave,
    MasterPhase,
    block_message,
)
from kiosk_agent.audit.ddcmp_codec import (
    BadHeader,
    Control,
    ControlType,
    Data,
    Deframer,
    FramingError,
    NakReason,
    encode_control,
    encode_data,
)
from kiosk_agent.audit.link import LinkError, read_audit, read_link
from kiosk_agent.audit.link_settings import LinkProtocol, LinkSettings
from kiosk_agent.audit.virtual import DDCMP_START, PortFaults, VirtualDexPort
from kiosk_agent.sales.clock import FakeClock
from tests.audit.helpers import hear_then_silence
from tests.audit.pty_line import read_counted, run_out_the_clock

AUDIT = render_audit(
    [("ID1", "SN0001", "VIRTUAL"), ("VA1", "12500", "50", "2500", "10")]
    + [("PA1", str(n), "250", f"Item {n}") for n in range(60)]
)
DDCMP = LinkProtocol.DDCMP


def machine(faults: DdcmpFaults | None = None, **options: object) -> VirtualDexPort:
    return VirtualDexPort(
        AUDIT, faults=faults or DdcmpFaults(), clock=FakeClock(), protocol=DDCMP, **options
    )  # type: ignore[arg-type]


async def read_from(port: VirtualDexPort, **settings: object) -> object:
    link = LinkSettings(port=port.port, protocol=DDCMP, **settings)  # type: ignore[arg-type]
    return await asyncio.wait_for(read_link(link, clock=FakeClock()), 20)


# --- over a pseudo-terminal ------------------------------------------------------------------


async def test_a_clean_read_brings_the_audit_whole():
    async with machine() as port:
        read = await read_from(port)
    assert read.audit == AUDIT  # type: ignore[attr-defined]
    assert read.blocks == -(-len(AUDIT) // BLOCK_TEXT) > 2  # type: ignore[attr-defined]
    assert read.machine_id == "VIRTUALVMC"  # type: ignore[attr-defined]
    assert read.refused_blocks == 0  # type: ignore[attr-defined]
    assert read.seconds == 0  # type: ignore[attr-defined]  # no wait ran out
    assert parse_audit(read.audit).paid_vends is not None  # type: ignore[attr-defined]
    assert port.slave.reads == 1


@pytest.mark.parametrize(
    "faults",
    [DdcmpFaults(corrupt_headers={2, 4}), DdcmpFaults(corrupt_blocks={1, 3})],
    ids=["header CRC", "data CRC"],
)
async def test_a_corrupted_message_is_refused_and_sent_again(faults):
    async with machine(faults) as port:
        read = await read_from(port)
    assert read.audit == AUDIT  # type: ignore[attr-defined]
    assert read.refused_blocks == 2  # type: ignore[attr-defined]


async def test_a_lost_acknowledgement_is_asked_for_with_rep_and_given_again():
    faults = DdcmpFaults(lose_acks={1, 3})
    async with machine(faults) as port:
        read = await read_from(port)
    assert read.audit == AUDIT  # type: ignore[attr-defined]
    assert not faults.lose_acks  # each was lost once


async def test_a_lost_block_is_asked_for_refused_and_sent_again():
    faults = DdcmpFaults(lose_blocks={1, 4})
    async with machine(faults) as port:
        read = await read_from(port)
    assert read.audit == AUDIT  # type: ignore[attr-defined]


async def test_a_slow_machine_within_the_waits_is_waited_for_without_asking_again():
    clock = FakeClock()  # the machine's and the agent's: each block comes 2.5 s after its ACK
    faults = DdcmpFaults(slow_blocks=2.5)
    async with VirtualDexPort(AUDIT, faults=faults, clock=clock, protocol=DDCMP) as port:
        task, line = await read_counted(port, clock, LinkSettings(port=port.port, protocol=DDCMP))
        await run_out_the_clock(clock, task, port, line)
        read = await task
    assert read.audit == AUDIT  # type: ignore[attr-defined]
    assert read.seconds == pytest.approx(read.blocks * 2.5)  # type: ignore[attr-defined]
    # START, ACK + who are you, ACK + read, an ACK a block, finish: nothing asked again
    assert line.written == 8 + (8 + 21) + (8 + 11) + read.blocks * 8 + 11  # type: ignore[attr-defined]


async def test_a_stalled_slave_ends_the_read_with_the_reason_in_bounded_time():
    clock = FakeClock()
    async with machine(DdcmpFaults(stall_after=2)) as port:
        started = clock.monotonic()
        settings = LinkSettings(port=port.port, protocol=DDCMP)
        task, line = await read_counted(port, clock, settings)
        await run_out_the_clock(clock, task, port, line)
        with pytest.raises(LinkError, match=r"the machine stalled after block 2, 4 times"):
            await task
    assert 4 * 3.0 <= clock.monotonic() - started <= 3 * 4 * 3.0 + 4 * 1.0


async def test_the_whole_read_has_a_deadline():
    clock = FakeClock()
    started = clock.monotonic()
    async with machine(DdcmpFaults(stall_after=1)) as port:
        settings = LinkSettings(port=port.port, protocol=DDCMP, deadline=2.5)
        task, line = await read_counted(port, clock, settings)
        await run_out_the_clock(clock, task, port, line)
        with pytest.raises(LinkError, match=r"the read took longer than 2.5 s"):
            await task
    assert clock.monotonic() - started == pytest.approx(2.5)  # not a moment more


async def test_a_flooding_port_ends_the_read_bounded_in_bytes():
    async with machine(port_faults=PortFaults(flood=True)) as port:
        with pytest.raises(LinkError, match=r"bytes heard without one DDCMP message: the port"):
            await read_from(port)
        assert port.bytes_sent < 1 << 20  # it stopped listening long before a megabyte


async def test_a_port_answering_garbage_is_refused_naming_it():
    clock = FakeClock()
    async with machine(port_faults=PortFaults(garbage=True)) as port:
        settings = LinkSettings(port=port.port, protocol=DDCMP)
        task, line = await read_counted(port, clock, settings)
        await run_out_the_clock(clock, task, port, line)
        with pytest.raises(LinkError, match=r"no answer to START.*bytes of garbage heard"):
            await task


async def test_a_dex_machine_asked_in_ddcmp_says_so():
    clock = FakeClock()
    async with VirtualDexPort(AUDIT, clock=FakeClock(), protocol=LinkProtocol.DEX) as port:
        settings = LinkSettings(port=port.port, protocol=DDCMP)
        task, line = await read_counted(port, clock, settings)
        await run_out_the_clock(clock, task, port, line)
        with pytest.raises(LinkError, match=r"does it speak DDCMP\?, 4 times"):
            await task


async def test_a_ddcmp_machine_asked_in_dex_ucs_says_so():
    clock = FakeClock()
    async with machine() as port:  # it speaks DDCMP only
        task, line = await read_counted(port, clock, LinkSettings(port=port.port))
        await run_out_the_clock(clock, task, port, line)
        with pytest.raises(LinkError, match=r"does it speak DEX/UCS\?, 4 times"):
            await task


async def test_a_machine_answering_both_answers_each_read_in_the_protocol_it_opens_with():
    async with VirtualDexPort(AUDIT, clock=FakeClock()) as port:  # protocol None: either
        for protocol in ("dex_ucs", "ddcmp", "ddcmp", "dex_ucs"):
            audit = await asyncio.wait_for(read_audit(port.port, protocol, clock=FakeClock()), 20)
            assert audit == AUDIT, protocol
        assert port.reads == 4


async def quiet(port: VirtualDexPort) -> None:
    async with asyncio.timeout(10):
        while True:
            heard = port.bytes_heard
            await asyncio.sleep(0.02)
            if port.answered and port.bytes_heard == heard:
                return


SLOW = 2.5  # a slow machine's block, held this long after the last ACK (its other wait: 1 s)


async def holding_a_block(port: VirtualDexPort, clock: FakeClock) -> None:
    """Until the machine has made its next block and holds it, waiting on ``clock`` alone."""
    async with asyncio.timeout(10):
        while not (
            port.answered
            and port.slave.wait == SLOW
            and clock.pending() == [clock.monotonic() + SLOW]
        ):
            await asyncio.sleep(0.001)


@pytest.mark.parametrize("then", ["ddcmp", "dex_ucs"])
async def test_a_read_abandoned_half_way_leaves_the_machine_ready_for_the_next(then):
    clock = FakeClock()  # the machine's, and the next read's; the abandoned read waits forever
    faults = DdcmpFaults(slow_blocks=SLOW)  # each block goes only when the clock lets it
    async with VirtualDexPort(AUDIT, faults=faults, clock=clock) as port:  # protocol None: either
        abandoned = asyncio.ensure_future(
            read_link(LinkSettings(port=port.port, protocol=DDCMP), clock=FakeClock())
        )
        for _ in range(3):  # three blocks out
            await holding_a_block(port, clock)
            await clock.advance(SLOW)
        await holding_a_block(port, clock)  # the fourth made: the agent is waiting for it
        assert port.bytes_sent > 3 * BLOCK_TEXT
        assert not abandoned.done()
        abandoned.cancel()  # and then the agent stops
        with pytest.raises(asyncio.CancelledError):
            await abandoned
        await clock.advance(SLOW)  # the fourth block goes to a line nobody reads
        await quiet(port)  # what the abandoned read wrote last has been heard and answered
        assert port.unread() > 0  # the fourth block waits in the line
        assert port.reads == 0
        settings = LinkSettings(port=port.port, protocol=LinkProtocol(then))
        task, line = await read_counted(port, clock, settings)
        await run_out_the_clock(clock, task, port, line)
        assert (await task).audit == AUDIT  # type: ignore[attr-defined]
        assert port.reads == 1


async def test_read_audit_by_port_reads_ddcmp_as_the_machine_has_it_then():
    later = render_audit([("VA1", "12750", "51")])
    counters = iter([AUDIT, later])
    async with VirtualDexPort(lambda: next(counters), clock=FakeClock(), protocol=DDCMP) as port:
        first = await asyncio.wait_for(read_audit(port.port, "ddcmp", clock=FakeClock()), 20)
        second = await asyncio.wait_for(read_audit(port.port, "ddcmp", clock=FakeClock()), 20)
    assert (first, second) == (AUDIT, later)


# --- the codec alone -------------------------------------------------------------------------


def exchange(master: DdcmpMaster, slave: DdcmpSlave, limit: int = 3000) -> None:
    """Both sides in turn, each wait running out when the other says nothing."""
    out = master.start()
    for _ in range(limit):
        if master.wait is None:
            return
        back = slave.receive(out)
        if not back and slave.wait is not None:
            back = slave.expire()
        out = master.receive(back) if back else master.expire()


def test_the_header_is_decs_layout_with_its_crc():
    frame = encode_data(3, 2, b"AB")
    assert frame[:6] == bytes((0x81, 2, 0x80, 2, 3, 1))  # SOH, count, SELECT, RESP, NUM, ADDR
    assert int.from_bytes(frame[6:8], "little") == crc16_arc(frame[:6])
    assert crc16_arc(frame[:8]) == 0  # a header and its CRC check to zero
    assert frame[8:10] == b"AB"
    assert int.from_bytes(frame[10:], "little") == crc16_arc(b"AB")
    nak = encode_control(ControlType.NAK, subtype=NakReason.DATA_CRC, resp=7)
    assert nak[:6] == bytes((0x05, 2, 0x80 | 2, 7, 0, 1))


def test_a_bad_header_is_reported_once_and_the_message_behind_it_is_found():
    bad = bytearray(encode_data(1, 0, b"\x81\x05" * 20))
    bad[7] ^= 0x01
    good = encode_data(2, 0, b"next")
    deframer = Deframer()
    assert deframer.feed(bytes(bad) + good) == [BadHeader(), Data(2, 0, b"next", intact=True)]


def test_idle_fill_is_skipped_and_other_bytes_are_garbage():
    deframer = Deframer()
    messages = deframer.feed(b"\xff\xff\x96" + b"xyz" + encode_control(ControlType.STACK))
    assert messages == [Control(ControlType.STACK)]
    assert deframer.garbage == 3


def test_a_message_longer_than_we_take_is_refused_before_its_data():
    with pytest.raises(FramingError, match="a message of 5000 bytes announced, more than"):
        Deframer(max_data=1024).feed(encode_data(1, 0, b"A" * 5000)[:8])


def test_a_machine_refusing_the_read_says_its_code():
    master, slave = DdcmpMaster(), DdcmpSlave(audit=AUDIT)
    send = slave._send

    def refusing(payload: bytes) -> bytes:
        return send(payload[:1] + b"07" + payload[3:] if payload[:1] == b"\x02" else payload)

    slave._send = refusing  # type: ignore[method-assign]
    exchange(master, slave)
    assert master.phase is MasterPhase.FAILED
    assert "refused the read (response code b'07')" in master.failure


def test_a_block_refused_too_often_ends_the_read():
    master, slave = DdcmpMaster(), DdcmpSlave(audit=AUDIT)
    send = slave._send

    def always_corrupt(payload: bytes) -> bytes:  # every sending of every block, again too
        frame = send(payload)
        if payload[:1] == bytes((App.BLOCK,)):
            slave._unacked = frame[:-1] + bytes((frame[-1] ^ 0xFF,))
        return slave._unacked

    slave._send = always_corrupt  # type: ignore[method-assign]
    exchange(master, slave)
    assert master.failure == "block 1 failed its data CRC, 4 times (asking for the audit)"
    assert master.refused_blocks == 4


def test_the_first_block_is_waited_for_as_long_as_any_block():
    master = DdcmpMaster()
    master.start()
    assert master.wait == master.timeouts.answer  # STACK: an answer
    master.receive(encode_control(ControlType.STACK))
    master.receive(encode_data(1, 1, b"\x0200VIRTUALVMC"))
    assert master.phase is MasterPhase.ASKING
    assert master.wait == master.timeouts.block  # the machine is making its first block


def test_blocks_out_of_order_end_the_read():
    master = DdcmpMaster()
    master.start()
    master.receive(encode_control(ControlType.STACK))
    master.receive(encode_data(1, 1, b"\x0200VIRTUALVMC"))
    master.receive(encode_data(2, 2, block_message(2, b"VA1*1*1\r\n", last=True)))
    assert master.failure == "block 2 came where block 1 was due (asking for the audit)"


def test_message_numbers_wrap_after_255_as_decs_do():
    audit = bytes(range(32, 127)) * 800  # 76 kB: 317 blocks, past 255 messages each way
    master, slave = DdcmpMaster(), DdcmpSlave(audit=audit, faults=DdcmpFaults(lose_acks={256}))
    exchange(master, slave)
    assert master.phase is MasterPhase.DONE, master.failure
    assert master.audit == audit
    assert master.received == (master.blocks + 1) % 256  # the identity, then each block


# --- generated --------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=120), max_size=20))
def test_decoding_never_raises_anything_but_its_own_error(chunks):
    deframer = Deframer(max_data=256)
    for chunk in chunks:
        try:
            messages = deframer.feed(chunk)
        except FramingError:
            return
        assert all(isinstance(m, Control | Data | BadHeader) for m in messages)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 255), st.integers(0, 255), st.binary(max_size=300)), max_size=6
    ),
    st.integers(1, 40),
)
def test_what_is_encoded_is_decoded_whatever_the_chunks(messages, step):
    wire = b"\xff".join(encode_data(num, resp, data) for num, resp, data in messages)
    deframer = Deframer()
    heard = []
    for at in range(0, len(wire), step):
        heard += deframer.feed(wire[at : at + step])
    assert heard == [Data(num, resp, data, intact=True) for num, resp, data in messages]
    assert deframer.garbage == 0


_byte = st.integers(0, 255)
_controls = st.builds(
    lambda kind, sub, resp, num: encode_control(kind, subtype=sub, resp=resp, num=num),
    st.sampled_from(list(ControlType)),
    st.integers(0, 63),
    _byte,
    _byte,
)
_payloads = st.one_of(
    st.binary(max_size=40),
    st.builds(
        lambda app, rest: bytes((app,)) + rest, st.sampled_from(list(App)), st.binary(max_size=30)
    ),
    st.builds(
        lambda n, text, last: block_message(n, text, last=last),
        st.integers(0, 4),
        st.binary(max_size=30),
        st.booleans(),
    ),
)
_datas = st.builds(
    lambda num, resp, payload: encode_data(num, resp, payload), _byte, _byte, _payloads
)
# what a line may carry: noise, and messages (well formed, with any numbers and any contents)
_chunks = st.one_of(st.binary(max_size=80), _controls, _datas)


@settings(max_examples=100, deadline=None)
@given(st.lists(_chunks, max_size=30), st.lists(st.booleans(), max_size=30))
def test_any_bytes_heard_and_any_waits_end_the_master_cleanly(chunks, expiries):
    master = DdcmpMaster()
    master.start()
    hear_then_silence(master, chunks, expiries, silent_waits=60)
    assert master.wait is None
    assert master.phase in (MasterPhase.DONE, MasterPhase.FAILED)
    assert master.failure or master.phase is MasterPhase.DONE


@settings(max_examples=100, deadline=None)
@given(
    st.binary(min_size=1, max_size=3000),
    st.sets(st.integers(1, 13), max_size=3),
    st.sets(st.integers(1, 13), max_size=3),
    st.sets(st.integers(1, 13), max_size=3),
    st.sets(st.integers(1, 13), max_size=3),
)
def test_any_audit_with_any_faults_arrives_whole(audit, corrupt, headers, lost_acks, lost):
    faults = DdcmpFaults(corrupt, lost_acks, corrupt_headers=headers, lose_blocks=lost)
    master, slave = DdcmpMaster(), DdcmpSlave(audit=audit, faults=faults)
    exchange(master, slave)
    assert master.phase is MasterPhase.DONE, master.failure
    assert master.audit == audit
    assert slave.reads == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(_chunks, st.just(DDCMP_START)), max_size=30), st.lists(st.booleans()))
def test_the_virtual_machines_slave_takes_any_bytes_and_waits_without_raising(chunks, expiries):
    slave = DdcmpSlave(audit=AUDIT)
    for chunk, expire in zip(chunks, expiries + [False] * len(chunks), strict=False):
        out = slave.expire() if expire else slave.receive(chunk)
        assert len(out) <= 2 * (BLOCK_TEXT + 32)  # at most an ACK and a block
