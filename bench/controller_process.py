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
                                     -> {"seconds": [...], "answers": [...]}  (the bare sales)
    {"op": "stop"}                   -> {}

``line_trips`` times the floor's one line each way over a bare pty across the same boundary: the
child writes the vend request on its end (passed as ``--line-fd``) and waits for the answer, which
the parent's event loop writes back on the other end as soon as it reads the request
(:meth:`ControllerProcess.line_trips`). ``sale_trips`` writes a vend request of each amount and
product on the same line and reads the answer the parent's bare sale writes back
(:meth:`ControllerProcess.bare_sales`; bench/hardware.py's whole floor). Times are the monotonic
clock's, read in the child.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import tty
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kiosk_agent.platforms import mdb_protocol as wire
from kiosk_agent.sim.machine import ControllerOptions, VirtualController

# the floor's line: the controller's vend request and the agent's approve, as the wire has them
VEND_REQUEST = (wire.vend_request_line(250, "A2") + "\n").encode()  # 22 bytes
VEND_APPROVE = (wire.approve_vend(250) + "\n").encode()  # 12 bytes


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
        self, requests: list[tuple[int, str]], sell: Callable[[list[bytes]], Awaitable[bytes]]
    ) -> list[tuple[float, str]]:
        """Each request's vend request line written by the child on the floor's line and read
        here as the agent reads its pty (this loop's reader, a plain ``os.read``, the line split
        on commas, no parser); ``sell`` is handed the split line, in a task of its own as the
        agent's sale runs in one, and its answer written back. Each trip's seconds (request
        written -> answer read, in the child) and the answer it read."""
        loop = asyncio.get_running_loop()
        buffer = bytearray()
        sales: set[asyncio.Task[None]] = set()
        failed: list[Exception] = []

        async def serve(fields: list[bytes]) -> None:
            try:
                os.write(self._line_adapter, await sell(fields))
            except Exception as exc:  # the child waits for an answer: raised once it has one
                failed.append(exc)
                os.write(self._line_adapter, b"failed\n")

        def read() -> None:
            buffer.extend(os.read(self._line_adapter, 64))
            while (end := buffer.find(b"\n")) >= 0:
                sale = loop.create_task(serve(bytes(buffer[:end]).split(b",")))
                sales.add(sale)
                sale.add_done_callback(sales.discard)
                del buffer[: end + 1]

        loop.add_reader(self._line_adapter, read)
        try:
            answer = await self._call("sale_trips", requests=requests)
        finally:
            loop.remove_reader(self._line_adapter)
        if failed:
            raise RuntimeError("a bare sale failed") from failed[0]
        return list(zip(answer["seconds"], answer["answers"], strict=True))

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
    try:
        while line := await commands.readline():
            command = json.loads(line)
            op = command["op"]
            answer: dict[str, Any] = {}
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
            elif op == "stop":
                await controller.stop()
                print(json.dumps(answer), flush=True)
                return
            else:
                answer["error"] = f"no such command {op!r}"
            print(json.dumps(answer), flush=True)
    finally:
        await controller.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--line-fd", type=int, required=True)
    parser.add_argument("--products", type=json.loads, required=True)
    arguments = parser.parse_args()
    asyncio.run(_serve(arguments.line_fd, arguments.products))
