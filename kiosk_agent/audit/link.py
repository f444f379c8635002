"""One audit read over the machine's DEX port: a protocol's master run over a serial line.

The port is opened the way every serial platform opens its own (``platforms.serial``: a device
path, a glob, a ``/dev/serial/by-id`` link, or ``socket://host:port``), at 9600 8N1 by default.
Every wait is bounded on the injected clock (the master says how long it waits, the whole read
has a deadline), and so is every byte: past ``max_bytes`` heard the read ends, so a port that
floods costs at most that much. A read that ends early raises ``LinkError`` with the reason.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Protocol

import serial_asyncio_fast

from kiosk_agent.audit.ddcmp import DdcmpMaster
from kiosk_agent.audit.dexucs import DexMaster
from kiosk_agent.audit.link_settings import LinkProtocol, LinkSettings
from kiosk_agent.platforms.serial import resolve_port
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock

READ_CHUNK = 4096


class LinkError(Exception):
    """A read that ended without the audit; says why (stalled, flooded, refused, garbage)."""


class ByteReader(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


class ByteWriter(Protocol):
    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


class Master(Protocol):
    """What the runner asks of a protocol's master (DEX/UCS, DDCMP)."""

    failure: str
    blocks: int
    refused_blocks: int
    machine_id: str

    @property
    def wait(self) -> float | None: ...

    @property
    def audit(self) -> bytes: ...

    @property
    def garbage(self) -> int: ...

    def start(self) -> bytes: ...

    def receive(self, data: bytes) -> bytes: ...

    def expire(self) -> bytes: ...

    def fail(self, reason: str) -> bytes: ...


@dataclass(frozen=True, slots=True)
class LinkRead:
    protocol: LinkProtocol
    audit: bytes
    machine_id: str
    blocks: int
    refused_blocks: int  # blocks answered NAK and sent again
    bytes_heard: int
    seconds: float  # on the monotonic clock


def make_master(settings: LinkSettings) -> Master:
    if settings.protocol is LinkProtocol.DDCMP:
        return DdcmpMaster(
            comm_id=settings.comm_id, timeouts=settings.timeouts, max_audit=settings.max_bytes
        )
    return DexMaster(
        comm_id=settings.comm_id, timeouts=settings.timeouts, max_audit=settings.max_bytes
    )


async def read_audit(
    port: str,
    protocol: str = LinkProtocol.DEX.value,
    *,
    clock: Clock = SYSTEM_CLOCK,
    limits: LinkSettings | None = None,
) -> bytes:
    """The shared contract's read: the audit's bytes from ``port``, or LinkError saying why.

    ``limits`` carries the rest (baud rate, deadline, byte budget; its port is not used)."""
    if protocol not in {p.value for p in LinkProtocol}:
        known = ", ".join(p.value for p in LinkProtocol)
        raise LinkError(f"protocol {protocol!r} is not one the link speaks ({known})")
    settings = limits or LinkSettings(port=port)
    settings = LinkSettings(
        port=port, protocol=LinkProtocol(protocol), baudrate=settings.baudrate,
        comm_id=settings.comm_id, deadline=settings.deadline, max_bytes=settings.max_bytes,
        timeouts=settings.timeouts,
    )  # fmt: skip
    return (await read_link(settings, clock=clock)).audit


async def read_link(settings: LinkSettings, *, clock: Clock = SYSTEM_CLOCK) -> LinkRead:
    """Open the port, read one audit, close the port; LinkError says why a read failed."""
    port = resolve_port(settings.port)
    if port is None:
        raise LinkError(f"no port matches {settings.port}")
    try:
        reader, writer = await serial_asyncio_fast.open_serial_connection(
            url=port, baudrate=settings.baudrate
        )
    except (OSError, ValueError) as err:  # pyserial's SerialException is an OSError
        raise LinkError(f"cannot open {port}: {err}") from None
    try:
        return await run_master(make_master(settings), reader, writer, settings, clock)
    finally:
        writer.close()  # the port closes whatever comes; a cancel while it does is the caller's
        with contextlib.suppress(OSError):  # TimeoutError too: the close is not waited for longer
            await clock.wait_for(writer.wait_closed(), 5)


async def run_master(
    master: Master,
    reader: ByteReader,
    writer: ByteWriter,
    settings: LinkSettings,
    clock: Clock,
) -> LinkRead:
    """Drive ``master`` over a byte stream until it is done or has failed."""
    started = clock.monotonic()
    heard = 0
    out = master.start()
    while True:
        if out:
            writer.write(out)
            await writer.drain()
        wait = master.wait
        if wait is None:
            break
        left = settings.deadline - (clock.monotonic() - started)
        try:
            chunk = await clock.wait_for(reader.read(READ_CHUNK), max(0.0, min(wait, left)))
        except TimeoutError:
            if left <= wait:
                out = master.fail(f"the read took longer than {settings.deadline:g} s")
            else:
                out = master.expire()
            continue
        if not chunk:
            out = master.fail("the port closed")
            continue
        heard += len(chunk)
        if heard > settings.max_bytes:
            out = master.fail(f"more than {settings.max_bytes} bytes heard: the port floods")
            continue
        out = master.receive(chunk)
    if master.failure:
        garbage = f"; {master.garbage} bytes of garbage heard" if master.garbage else ""
        raise LinkError(master.failure + garbage)
    return LinkRead(
        protocol=settings.protocol,
        audit=master.audit,
        machine_id=master.machine_id,
        blocks=master.blocks,
        refused_blocks=master.refused_blocks,
        bytes_heard=heard,
        seconds=clock.monotonic() - started,
    )
