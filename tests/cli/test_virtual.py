"""`kiosk-agent virtual`: the vending machine as its own process, driven here as the agent would."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from pathlib import Path

import pytest

from kiosk_agent.cli import main
from kiosk_agent.cli.contract import EXIT_USAGE
from kiosk_agent.sim.machine import read_record
from tests.assembly.crash_driver import PipedCommand
from tests.child_signals import stop


async def _spawn(*args: str) -> PipedCommand:
    """``kiosk-agent virtual ARGS...`` as its own process, forked from the test process's warm
    server (not a cold interpreter's imports), its output read through pipes."""
    return await PipedCommand.start(["virtual", *args], dict(os.environ))


async def _line(stream: asyncio.StreamReader, prefix: str) -> str:
    async with asyncio.timeout(30):
        while True:
            line = (await stream.readline()).decode()
            assert line, f"stream ended before a {prefix!r} line"
            if line.startswith(prefix):
                return line.strip()


async def test_the_machine_sells_over_a_socket_and_records_what_came_out(tmp_path: Path) -> None:
    record = tmp_path / "m1.jsonl"
    proc = await _spawn(
        "--listen", "socket://127.0.0.1:0", "--name", "m1", "--record", str(record),
        "--product", "A1=1.50", "--count", "2", "--rate", "50", "--fail-rate", "0",
        "--dispense-time", "0.01", "--seed", "3",
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        ready = json.loads((await _line(proc.stdout, "READY "))[len("READY ") :])
        assert ready["name"] == "m1"
        host, port = ready["port"].removeprefix("socket://").split(":")
        # an agent that connects and goes away is not a reset: the machine waits for the next
        _, first = await asyncio.open_connection(host, int(port))
        first.close()
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"C,0\nC,SETCONF,mdb-addr=0x10\nC,1\n")
        answers = iter([b"C,VEND,1.50\n", b"C,STOP\n"])  # approve the first, deny the second
        heard: list[str] = []
        async with asyncio.timeout(30):
            while len([h for h in heard if h.startswith("c,STATUS,VEND")]) < 2:
                line = (await reader.readline()).decode().strip()
                heard.append(line)
                if line.startswith("c,STATUS,VEND"):
                    writer.write(next(answers))
        done = json.loads((await _line(proc.stdout, "DONE "))[len("DONE ") :])
        assert done == {"vended": 1, "denied": 1}
        assert "c,VEND,SUCCESS" in heard or "c,VEND,SUCCESS" in (
            (await reader.readline()).decode()
        )
        writer.close()
    finally:
        assert await stop(proc, signal.SIGTERM) == 0

    events = [(r["event"], r["visit"], r["vended_cents"]) for r in read_record(record)]
    assert events == [
        ("selection", 1, 0),
        ("approval", 1, 0),
        ("dispensed", 1, 150),
        ("session_end", 1, 150),
        ("selection", 2, 0),
        ("denial", 2, 0),
        ("session_end", 2, 0),
    ]
    lines = read_record(record)
    assert lines[1]["approved_cents"] == 150
    assert lines[-1]["outcome"] == "denied"
    assert all(line["machine"] == "m1" and line["price_cents"] == 150 for line in lines)


async def test_the_machine_answers_dex_with_its_books_cash_customers_counted() -> None:
    from kiosk_agent.audit import parse_audit
    from kiosk_agent.audit.books import figures_of
    from kiosk_agent.audit.link import read_audit

    proc = await _spawn(
        "--dex", "--product", "A1=1.50", "--count", "3", "--rate", "50", "--cash-rate", "1",
        "--seed", "3",
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        ready = json.loads((await _line(proc.stdout, "READY "))[len("READY ") :])
        await _line(proc.stdout, "DONE ")  # three customers served, all paying cash
        audit = await asyncio.wait_for(read_audit(ready["dex_port"]), 30)
    finally:
        assert await stop(proc, signal.SIGTERM) == 0
    figures = figures_of(parse_audit(audit))
    assert figures.cash is not None
    assert (figures.cash.since_init.count, figures.cash.since_init.value) == (3, 450)
    assert figures.cashless is not None
    assert figures.cashless.since_init.count == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--product", "A1=1.5x"], "price of A1"),
        (["--product", "A1"], "expected CODE=PRICE"),
        (["--listen", "tcp://127.0.0.1:9"], "expected socket://HOST:PORT"),
        (["--fail-rate", "2"], "must be from 0 to 1"),
        (["--rate", "0"], "must be a positive number"),
    ],
)
def test_bad_options_are_named(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In this process, as tests/cli/test_contract.py reads usage errors: a process each cost
    0.3-0.4 s of CPU to be told no (the real process's start is the tests above)."""
    ended: list[object] = []

    def run() -> None:
        try:
            ended.append(main(["virtual", *args]))
        except SystemExit as stopped:
            ended.append(stopped.code)

    # a machine that started would wait for its agent forever: in a thread left behind
    runner = threading.Thread(target=run, name="virtual", daemon=True)
    runner.start()
    runner.join(30)
    assert ended == [EXIT_USAGE], "the machine started on a bad option"
    assert says in capsys.readouterr().err
