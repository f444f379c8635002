"""The machine's DEX port, played: a DEX/UCS or DDCMP slave on a real pseudo-terminal, with faults.

The virtual vending machine, the demo, the benchmarks and the tests read from it exactly as the
agent reads a real machine: ``port`` is the pty's path, opened by ``link.read_audit``. Faults on
purpose: the slave's own (``SlaveFaults``: a corrupted block, a lost acknowledgement, a stall;
``ddcmp.DdcmpFaults`` adds a corrupted header and a lost block), and the port's: ``flood``
(endless bytes once asked) and ``garbage`` (noise for answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import sys
import termios
import tty
from collections.abc import Callable
from dataclasses import dataclass, field

from kiosk_agent.audit.ddcmp import DdcmpSlave, SlavePhase
from kiosk_agent.audit.ddcmp_codec import ControlType, encode_control
from kiosk_agent.audit.dexucs import ENQ_BYTE, DexSlave, SlaveFaults
from kiosk_agent.audit.link_settings import LinkProtocol
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.tasks import BackgroundTask

FLOOD_CHUNK = b"\x10\x02" + b"A" * 4094  # a data block that never ends
GARBAGE = b"\xff\x00?\x7fZ\x13"
DDCMP_START = encode_control(ControlType.START)
BETWEEN_READS = frozenset({SlavePhase.IDLE, SlavePhase.DONE})


@dataclass
class PortFaults:
    flood: bool = False
    garbage: bool = False


@dataclass
class VirtualDexPort:
    """A pty whose far end answers reads with ``audit`` (bytes, or a callable giving the
    machine's audit as it is when a read starts): in ``protocol``, or, with None, in the one
    each read opens with (DEX/UCS's ENQ alone, or DDCMP's START), as most controllers do."""

    audit: bytes | Callable[[], bytes]
    faults: SlaveFaults = field(default_factory=SlaveFaults)
    port_faults: PortFaults = field(default_factory=PortFaults)
    clock: Clock = SYSTEM_CLOCK
    baud_delay: bool = False  # pace writes as 9600 baud would (for the benchmark's wire time)
    protocol: LinkProtocol | None = None

    def __post_init__(self) -> None:
        self._slaves: dict[LinkProtocol, DexSlave | DdcmpSlave] = {
            LinkProtocol.DEX: DexSlave(self.audit, faults=self.faults),
            LinkProtocol.DDCMP: DdcmpSlave(audit=self.audit, faults=self.faults),
        }
        self.slave = self._slaves[self.protocol or LinkProtocol.DEX]
        self._tail = b""  # the last bytes heard, to find DDCMP's START across two chunks
        self._lone_enq = False  # the last chunk heard was DEX/UCS's ENQ alone
        self.bytes_sent = 0
        self.bytes_heard = 0
        self._answering = False  # between taking bytes heard and writing their answer
        self._master_fd, self._slave_fd = os.openpty()
        tty.setraw(self._slave_fd)  # a serial line: no echo, no line editing
        os.set_blocking(self._master_fd, False)
        self.port = os.ttyname(self._slave_fd)
        self._incoming: asyncio.Queue[bytes] = asyncio.Queue()
        self._writable = asyncio.Event()
        self._task = BackgroundTask(self._serve, f"dex-port:{self.port}")

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self._master_fd, self._read_ready)
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._master_fd)
        loop.remove_writer(self._master_fd)
        os.close(self._master_fd)
        os.close(self._slave_fd)

    async def __aenter__(self) -> VirtualDexPort:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def answered(self) -> bool:
        """Everything heard so far has been answered (the pty itself may still hold bytes)."""
        return self._incoming.empty() and not self._answering

    def _read_ready(self) -> None:
        with contextlib.suppress(OSError):
            data = os.read(self._master_fd, 4096)
            self.bytes_heard += len(data)
            if data:
                self._incoming.put_nowait(data)

    async def _serve(self) -> None:
        while True:
            wait = self.slave.wait
            try:
                if wait is None:
                    data = await self._incoming.get()
                else:
                    data = await self.clock.wait_for(self._incoming.get(), wait)
            except TimeoutError:
                await self._write(self.slave.expire())
                continue
            self._answering = True
            try:
                await self._answer(data)
            finally:
                self._answering = False

    async def _answer(self, data: bytes) -> None:
        if self.port_faults.garbage:
            await self._write(GARBAGE)
        elif self.port_faults.flood:
            while True:
                await self._write(FLOOD_CHUNK)
        else:
            self._pick_protocol(data)
            await self._write(self.slave.receive(data))

    def unread(self) -> int:
        """Bytes sent that the agent's end has not read yet (a read abandoned half way)."""
        try:
            return int.from_bytes(
                fcntl.ioctl(self._slave_fd, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder
            )
        except OSError:
            return 0

    @property
    def reads(self) -> int:
        """Reads answered to their end, in either protocol."""
        return sum(slave.reads for slave in self._slaves.values())

    def _pick_protocol(self, data: bytes) -> None:
        """Between reads, the protocol the master opens with: DDCMP's START, or DEX/UCS's ENQ
        alone (its master then waits for DLE 0)."""
        if self.protocol is not None:
            return
        heard, self._tail = self._tail + data, (self._tail + data)[-len(DDCMP_START) + 1 :]
        ddcmp = self._slaves[LinkProtocol.DDCMP]
        lone_enq, again = data == ENQ_BYTE, self._lone_enq
        self._lone_enq = lone_enq
        if DDCMP_START in heard and self.slave is not ddcmp:
            self._switch(ddcmp)
        elif lone_enq and self.slave is ddcmp and (ddcmp.phase in BETWEEN_READS or again):
            # between reads; or a DEX master asking again while a DDCMP read was left
            # half done (a DDCMP master sends no ENQ alone, let alone twice)
            self._switch(self._slaves[LinkProtocol.DEX])

    def _switch(self, slave: DexSlave | DdcmpSlave) -> None:
        slave.reset()
        self.slave = slave

    async def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self._master_fd, view)
            except BlockingIOError:  # the pty is full: wait until the agent reads
                await self._until_writable()
                continue
            self.bytes_sent += written
            view = view[written:]
            if self.baud_delay:
                await self.clock.sleep(written * 10 / 9600)

    async def _until_writable(self) -> None:
        loop = asyncio.get_running_loop()
        self._writable.clear()
        loop.add_writer(self._master_fd, self._writable.set)
        try:
            await self._writable.wait()
        finally:
            loop.remove_writer(self._master_fd)
