"""The virtual vending machine's controller in a process of its own, as in the field.

A real controller is another device: the customer's wait ends when the agent's ``C,VEND`` is on
the wire, whatever the agent does next. A controller on the agent's own event loop (as
bench/hardware.py's was) reads the answer only when that loop next gets round to it, so the work
the agent does after writing its answer counted as the customer's wait. Here the controller runs
its own loop in a child process (as bench/pi.py's is outside the agent), driven by one JSON line a
command over its stdin and answering one JSON line a command on its stdout:

    {"op": "start"}                  -> {"port": "/dev/pts/N"}
    {"op": "wait_enabled"}           -> {}
    {"op": "customer", "product": P} -> {"outcome": ..., "requested_at": s, "answered_at": s}
    {"op": "line_trips", "count": N} -> {"seconds": [...]}   (the floor's bare pty line)
    {"op": "sale_trips", "requests": [[cents, product], ...]}
                                     -> {"seconds": [...], "answers": [...]}  (the bare sales
                                        before i42-floor-end (2026-11-30): their ends not heard)
    {"op": "bare_customer", "cents": C, "product": P}
                                     -> {"seconds": s, "answer": ...}  (one whole bare sale)
    {"op": "stop"}                   -> {}

``line_trips`` times the floor's one line each way over a bare pty across the same boundary: the
child writes the vend request on its end (passed as ``--line-fd``) and waits for the answer, which
the parent's event loop writes back on the other end as soon as it reads the request
(:meth:`ControllerProcess.line_trips`). ``sale_trips`` writes a vend request of each amount and
product on the same line and reads the answer the parent's bare sale writes back, one after
the other with nothing more on the line (the floor until i42-floor-end (2026-11-30), still timed:
bench/hardware.py's ``*_no_end`` figures). ``bare_customer`` is one customer of the whole bare
sale (:class:`BareMachine`), made as the virtual controller makes the agent's (its ``_sell``):
the vend request written, the answer awaited, and after ``C,VEND`` the vend's success line and
the machine's status lines (after ``C,STOP`` its status), each its own write; one command a
customer, as ``customer`` is, so that the next request comes when the agent's would
(:meth:`ControllerProcess.bare_sales`). Times are the monotonic clock's, read in the child.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import tty
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kiosk_agent.platforms import mdb_protocol as wire
from kiosk_agent.sim.machine import ControllerOptions, VirtualController

# the floor's line: the controller's vend request and the agent's approve, as the wire has them
VEND_REQUEST = (wire.vend_request_line(250, "A2") + "\n").encode()  # 22 bytes
VEND_APPROVE = (wire.approve_vend(250) + "\n").encode()  # 12 bytes
VEND_REQUEST_FIELDS = VEND_REQUEST.split(b",")[:3]  # c,STATUS,VEND
# what the virtual controller writes after a vend (its _sell): the result, then its status
ENABLED_LINE = (wire.status_line(wire.ControllerStatus.ENABLED) + "\n").encode()
VEND_RESULT_LINES = (
    (wire.VEND_SUCCESS_LINE + "\n").encode(),
    (wire.status_line(wire.ControllerStatus.IDLE) + "\n").encode(),
    ENABLED_LINE,
)


@dataclass(slots=True)
class VisitTimes:
    """What the parent learns of one customer: as :class:`~kiosk_agent.sim.machine.Visit`."""

    outcome: str | None
    requested_at: float | None
    answered_at: float | None


class ControllerProcess:
    """The parent's side: a child running a :class:`VirtualController`, one command at a time."""

    def __init__(self, products: dict[str, int]) -> None:
        self.products = products
        self.visits: list[VisitTimes] = []
        self.port = ""
        self._proc: asyncio.subprocess.Process | None = None
        self._line_controller, self._line_adapter = os.openpty()
        tty.setraw(self._line_controller)
        tty.setraw(self._line_adapter)

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--line-fd", str(self._line_controller),
            "--products", json.dumps(self.products),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            pass_fds=(self._line_controller,),
        )  # fmt: skip
        self.port = (await self._call("start"))["port"]

    async def wait_enabled(self) -> None:
        await self._call("wait_enabled")

    async def customer(self, product: str) -> VisitTimes:
        answer = await self._call("customer", product=product)
        visit = VisitTimes(answer["outcome"], answer["requested_at"], answer["answered_at"])
        self.visits.append(visit)
        return visit

    async def line_trips(self, count: int) -> list[float]:
        """Seconds for one short line each way over a bare pty, this loop answering the child."""
        loop = asyncio.get_running_loop()
        buffer = bytearray()

        def answer() -> None:
            buffer.extend(os.read(self._line_adapter, 64))
            if buffer.endswith(b"\n"):
                buffer.clear()
                os.write(self._line_adapter, VEND_APPROVE)

        loop.add_reader(self._line_adapter, answer)
        try:
            seconds: list[float] = (await self._call("line_trips", count=count))["seconds"]
        finally:
            loop.remove_reader(self._line_adapter)
        return seconds

    async def bare_sales(
        self, requests: list[tuple[int, str]], program: BareProgram, *, ends: bool = True
    ) -> list[tuple[float, str]]:
        """Each request's vend request line written by the child on the floor's line and read
        here by the bare program's reader (:class:`BareLine`); each trip's seconds (request
        written -> answer read, in the child) and the answer it read. ``ends``: one command a
        customer (``bare_customer``), the child writing the vend's result after ``C,VEND`` as
        the machine does, and every sale's end awaited here before the reader goes; else the
        floor before i42-floor-end (2026-11-30), the requests one after the other in one command
        (``sale_trips``) with nothing more on the line."""
        line = BareLine(self._line_adapter, program)
        try:
            if not ends:
                answer = await self._call("sale_trips", requests=requests)
                return list(zip(answer["seconds"], answer["answers"], strict=True))
            trips = []
            for cents, product in requests:  # as the agent's customers: one call each
                answer = await self._call("bare_customer", cents=cents, product=product)
                trips.append((answer["seconds"], answer["answer"]))
            await line.finished()
            return trips
        finally:
            line.close()

    async def stop(self) -> None:
        try:
            if self._proc is not None and self._proc.returncode is None:
                await self._call("stop")
                await asyncio.wait_for(self._proc.wait(), 10)
        finally:
            os.close(self._line_controller)
            os.close(self._line_adapter)

    async def _call(self, op: str, **arguments: Any) -> dict[str, Any]:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise RuntimeError("the controller process is not started")
        proc.stdin.write(json.dumps({"op": op, **arguments}).encode() + b"\n")
        await proc.stdin.drain()
        line = await proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the controller process ended during {op!r}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the controller process failed {op!r}: {answer['error']}")
        return answer


class BareProgram(Protocol):
    """What a bare program on the floor's line does: bench/hardware.py's ``BareSale``."""

    def waits(self) -> None:
        """A vend request is read: its customer waits from now until its answer is written."""

    async def sell(self, fields: list[bytes], answer: Callable[[bytes], None]) -> None:
        """A vend request line, split on commas: the sale, its answer written by ``answer``."""

    def heard(self, fields: list[bytes]) -> None:
        """Any other line from the machine (its vend result, its status), split on commas."""


class BareLine:
    """The bare program's end of the floor's line, read as the agent reads its pty: one reader
    on the descriptor (a plain ``os.read``), each line split on commas (no parser). A vend
    request is told to the program (its customer waits from the read on) and starts a sale in
    a task of its own, as the agent's sale runs in one; any other line is handed to the program
    as it comes. A sale that fails before its answer answers
    ``failed`` (the machine waits for one); the failure is raised at :meth:`close`."""

    def __init__(self, fd: int, program: BareProgram) -> None:
        self.fd, self.program = fd, program
        self.sales: set[asyncio.Task[None]] = set()
        self.failed: list[Exception] = []
        self._buffer = bytearray()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._read)

    def _read(self) -> None:
        buffer = self._buffer
        buffer.extend(os.read(self.fd, 64))
        while (end := buffer.find(b"\n")) >= 0:
            fields = bytes(buffer[:end]).split(b",")
            del buffer[: end + 1]
            if fields[:3] == VEND_REQUEST_FIELDS:
                self.program.waits()  # from the read on, before its task's first step
                sale = self._loop.create_task(self._serve(fields))
                self.sales.add(sale)
                sale.add_done_callback(self.sales.discard)
                continue
            try:
                self.program.heard(fields)
            except Exception as exc:  # a line the program cannot take: raised at close
                self.failed.append(exc)

    async def _serve(self, fields: list[bytes]) -> None:
        answered = False

        def answer(data: bytes) -> None:
            nonlocal answered
            os.write(self.fd, data)
            answered = True

        try:
            await self.program.sell(fields, answer)
        except Exception as exc:  # the machine waits for an answer: raised once it has one
            self.failed.append(exc)
            if not answered:
                os.write(self.fd, b"failed\n")

    async def finished(self, within: float = 10.0) -> None:
        """Once every sale started has ended (its vend result heard, its capture answered)."""
        async with asyncio.timeout(within):
            while self.sales:
                await asyncio.wait(set(self.sales))

    def close(self) -> None:
        self._loop.remove_reader(self.fd)
        for sale in self.sales:
            sale.cancel()
        if self.failed:
            raise RuntimeError("a bare sale failed") from self.failed[0]


class BareMachine:
    """The machine's end of the floor's line for the whole bare sale: one customer at a time
    as :class:`~kiosk_agent.sim.machine.VirtualController` makes the agent's (its ``_sell``,
    with the bench's dispense time of 0): the vend request written, the answer awaited; after
    ``C,VEND``, a turn of the loop, then the vend's success line, the IDLE status and the
    ENABLED status, each its own write; after ``C,STOP`` the ENABLED status. One reader on the
    descriptor for the machine's life, as the virtual controller keeps on its pty."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd = fd
        self._buffer = bytearray()
        self._answer: asyncio.Future[str] | None = None
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._read)

    def _read(self) -> None:
        self._buffer.extend(os.read(self.fd, 4096))
        while (end := self._buffer.find(b"\n")) >= 0:
            line = self._buffer[:end].decode()
            del self._buffer[: end + 1]
            if self._answer is not None and not self._answer.done():
                self._answer.set_result(line)

    async def customer(self, cents: int, product: str) -> tuple[float, str]:
        """One customer: seconds from the request written to the answer read, and the answer."""
        self._answer = answered = self._loop.create_future()
        started = time.monotonic()
        os.write(self.fd, (wire.vend_request_line(cents, product) + "\n").encode())
        answer = await answered
        seconds = time.monotonic() - started
        if answer.startswith("C,VEND,"):
            await asyncio.sleep(0)  # the virtual controller's dispense time, 0 in the bench
            for line in VEND_RESULT_LINES:
                os.write(self.fd, line)
        elif answer == wire.deny_vend():
            os.write(self.fd, ENABLED_LINE)
        return seconds, answer

    def close(self) -> None:
        self._loop.remove_reader(self.fd)


async def read_when_ready(fd: int) -> bytes:
    """What a non-blocking ``fd`` holds (64 bytes at most) once the event loop sees it readable:
    a pty line read as the agent's serial link reads it, with no stack above it."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(fd, ready.set_result, None)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
    return os.read(fd, 64)


async def _line_trips(fd: int, requests: list[bytes]) -> tuple[list[float], list[str]]:
    """The child's end of the floor's line, read as the controller reads the agent's answers:
    one reader kept on the descriptor for the whole series, waking the trip's wait once a
    whole answer line is in. Each request's seconds and the answer read."""
    os.set_blocking(fd, False)
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[str] | None = None
    buffer = bytearray()

    def read() -> None:
        buffer.extend(os.read(fd, 4096))
        end = buffer.find(b"\n")
        if end >= 0 and answered is not None and not answered.done():
            answered.set_result(buffer[:end].decode())
            del buffer[: end + 1]

    seconds, answers = [], []
    loop.add_reader(fd, read)
    try:
        for request in requests:
            answered = loop.create_future()
            started = time.monotonic()
            os.write(fd, request)
            answers.append(await answered)
            seconds.append(time.monotonic() - started)
    finally:
        loop.remove_reader(fd)
    return seconds, answers


async def _serve(line_fd: int, products: dict[str, int]) -> None:
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    controller = VirtualController(ControllerOptions(products=products, dispense_time=0.0))
    bare: BareMachine | None = None  # the whole bare sale's machine, on the floor's line
    try:
        while line := await commands.readline():
            command = json.loads(line)
            op = command["op"]
            answer: dict[str, Any] = {}
            if op in ("line_trips", "sale_trips") and bare is not None:
                bare.close()  # the line is theirs now: their own reader on it, as before
                bare = None
            if op == "start":
                await controller.start()
                answer["port"] = controller.port
            elif op == "wait_enabled":
                await controller.wait_enabled()
            elif op == "customer":
                visit = await controller.customer(command["product"])
                answer.update(
                    outcome=visit.outcome.value if visit.outcome else None,
                    requested_at=visit.requested_at, answered_at=visit.answered_at,
                )  # fmt: skip
            elif op == "line_trips":
                requests = [VEND_REQUEST] * command["count"]
                answer["seconds"], _ = await _line_trips(line_fd, requests)
            elif op == "sale_trips":
                requests = [(wire.vend_request_line(cents, product) + "\n").encode()
                            for cents, product in command["requests"]]
                answer["seconds"], answer["answers"] = await _line_trips(line_fd, requests)
            elif op == "bare_customer":
                if bare is None:
                    bare = BareMachine(line_fd)
                answer["seconds"], answer["answer"] = await bare.customer(
                    command["cents"], command["product"])
            elif op == "stop":
                await controller.stop()
                print(json.dumps(answer), flush=True)
                return
            else:
                answer["error"] = f"no such command {op!r}"
            print(json.dumps(answer), flush=True)
    finally:
        if bare is not None:
            bare.close()
        await controller.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--line-fd", type=int, required=True)
    parser.add_argument("--products", type=json.loads, required=True)
    arguments = parser.parse_args()
    asyncio.run(_serve(arguments.line_fd, arguments.products))
