"""The agent's end of a virtual machine's DEX port, for the link tests of both protocols: the bytes
crossing it counted, and a FakeClock moved to each wait only once the line is quiet."""

from __future__ import annotations

import asyncio

import serial_asyncio_fast

from kiosk_agent.audit.link import make_master, run_master
from kiosk_agent.audit.link_settings import LinkSettings
from kiosk_agent.audit.virtual import VirtualDexPort
from kiosk_agent.sales.clock import FakeClock


class Counted:
    """The agent's end of the port, counting what crosses it (to know when the line is quiet)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.read_bytes = self.written = 0

    async def read(self, n: int = -1) -> bytes:
        data = await self.reader.read(n)
        self.read_bytes += len(data)
        return data

    def write(self, data: bytes) -> None:
        self.written += len(data)
        self.writer.write(data)

    async def drain(self) -> None:
        await self.writer.drain()


async def settled(port: VirtualDexPort, line: Counted, task: asyncio.Future[object]) -> None:
    """Until every byte sent either way has arrived and been answered, and stays so over a few
    turns of the loop (a wait of the machine's that the clock just ended takes some turns to
    write its answer), or the read is over."""

    def counts() -> tuple[int, int, int, int]:
        return port.bytes_heard, line.written, line.read_bytes, port.bytes_sent

    while True:
        while not task.done() and not (
            port.answered
            and port.bytes_heard == line.written
            and line.read_bytes == port.bytes_sent
        ):
            await asyncio.sleep(0.001)  # the pty moves bytes on the kernel's time, not the loop's
        before = counts()
        for _ in range(10):
            await asyncio.sleep(0)
        if task.done() or (port.answered and counts() == before):
            return


async def run_out_the_clock(
    clock: FakeClock, task: asyncio.Future[object], port: VirtualDexPort, line: Counted
) -> None:
    """Move the clock to each wait in turn until ``task`` ends, only once the line is quiet
    (so that no answer in flight is timed out); no real time is waited for a timeout."""
    for _ in range(40):
        await asyncio.wait_for(settled(port, line, task), 10)
        if task.done():
            return
        due = clock.pending()
        if due:
            await clock.advance_to(due[0])
            continue
        waiting = asyncio.ensure_future(clock.next_due(pauses_only=False, horizon=600))
        await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()


async def read_counted(
    port: VirtualDexPort, clock: FakeClock, settings: LinkSettings | None = None
) -> tuple[asyncio.Future[object], Counted]:
    """A read through ``run_master`` over the pty, its bytes counted."""
    settings = settings or LinkSettings(port=port.port)
    reader, writer = await serial_asyncio_fast.open_serial_connection(url=port.port, baudrate=9600)
    line = Counted(reader, writer)
    # counted from here: what crossed the port before is another read's
    line.written, line.read_bytes = port.bytes_heard, port.bytes_sent - port.unread()

    async def read() -> object:
        try:
            return await run_master(make_master(settings), line, line, settings, clock)
        finally:
            writer.close()

    return asyncio.ensure_future(read()), line
