import asyncio
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.assembly.systemd import (
    STOP_MARGIN,
    SystemdLifecycle,
    SystemdNotifier,
    Watchdog,
    watchdog_interval,
)
from kiosk_agent.health.model import Health
from kiosk_agent.sales.settings import STOP_TIMEOUT
from kiosk_agent.web.schema import http_schema
from tests.child_signals import send_signal, stop
from tests.cli.agent_process import AgentProcess, money_agrees, sale_reaches, write_config
from tests.cli.kiosk_app_rig import TOKEN, App, kiosk_app
from tests.helpers import until

UNIT = Path(__file__).parents[2] / "systemd" / "kiosk-agent.service"


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A real unix datagram socket standing in for systemd's notify socket."""
    path = str(tmp_path / "notify")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.settimeout(2)
    yield path, server
    server.close()


def _received(server: socket.socket) -> list[str]:
    return server.recv(4096).decode().split("\n")


def test_ready_status_and_stopping_reach_the_socket(notify_socket) -> None:
    path, server = notify_socket
    notifier = SystemdNotifier.from_env({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert notifier.ready("3 terminals")
    assert _received(server) == ["READY=1", "STATUS=3 terminals"]
    notifier.status("two\nlines")
    assert _received(server) == ["STATUS=two lines"]
    notifier.stopping()
    assert _received(server) == ["STOPPING=1"]
    notifier.close()


def test_the_drain_says_stopping_with_the_time_the_stop_may_take(notify_socket) -> None:
    path, server = notify_socket
    lifecycle = SystemdLifecycle(environ={"NOTIFY_SOCKET": path})
    lifecycle.stopping("stopping (draining 1 sale,\nuntil 14:03:27Z)", 30.0)
    assert _received(server) == [
        "STOPPING=1",
        "STATUS=stopping (draining 1 sale, until 14:03:27Z)",
        f"EXTEND_TIMEOUT_USEC={int((30.0 + STOP_MARGIN) * 1_000_000)}",
    ]
    asyncio.run(lifecycle.stop())  # said once: the stop's end sends no second STOPPING=1
    server.settimeout(0.05)
    with pytest.raises(TimeoutError):
        server.recv(4096)


def test_the_units_stop_timeout_is_the_drain_plus_the_stops_margin() -> None:
    """systemd must not kill a drain the configuration allows: TimeoutStopSec is the default
    sales.stop_timeout plus what the rest of the stop takes (parking, HTTP servers' grace)."""
    settings = dict(line.split("=", 1) for line in UNIT.read_text().splitlines() if "=" in line)
    assert float(settings["TimeoutStopSec"]) == STOP_TIMEOUT + STOP_MARGIN
    assert http_schema()({})["shutdown_grace"] < STOP_MARGIN
    assert settings["KillMode"] == "mixed"


def _unit_environment() -> dict[str, str]:
    lines = UNIT.read_text().splitlines()
    return dict(line.split("=", 2)[1:] for line in lines if line.startswith("Environment="))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc arenas")
def test_the_units_environment_keeps_a_worker_threads_allocations_on_the_main_arena(
    tmp_path: Path,
) -> None:
    """glibc gives a thread that allocates an arena of its own, outside the main heap, and keeps
    what was freed there: the journal's passes in worker threads left an idle agent 2.1 MB on
    a year's journal. Under the unit's environment a worker thread allocates from the main
    heap, as the agent's loop does."""
    probe = (
        "import ctypes, sqlite3, threading\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.malloc.restype = ctypes.c_void_p\n"
        "found = []\n"
        "def worker():\n"
        f"    db = sqlite3.connect({str(tmp_path / 'pass.db')!r})\n"
        "    db.execute('PRAGMA quick_check').fetchall(); db.close()\n"
        "    found.append(libc.malloc(1000))\n"
        "thread = threading.Thread(target=worker); thread.start(); thread.join()\n"
        "heap = [line.split()[0] for line in open('/proc/self/maps') if line.rstrip()"
        ".endswith('[heap]')]\n"
        "low, high = (int(x, 16) for x in heap[0].split('-'))\n"
        "print('main' if low <= found[0] < high else 'own')\n"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    as_by_hand = subprocess.run([sys.executable, "-c", probe], env=environment,
                                capture_output=True, text=True, check=True, timeout=60)
    assert as_by_hand.stdout.strip() == "own"  # what the unit's setting is for
    under_the_unit = subprocess.run([sys.executable, "-c", probe],
                                    env={**environment, **_unit_environment()},
                                    capture_output=True, text=True, check=True, timeout=60)
    assert under_the_unit.stdout.strip() == "main"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's thread cache")
def test_the_units_environment_gives_freed_blocks_back_to_the_heap() -> None:
    """glibc keeps up to seven freed blocks of each size to 1 KiB in a cache of the thread's
    own, for that size only (still counted in use): what the start freed stayed there, some
    180 KB of an idle agent. Under the unit's environment a freed block is the heap's again."""
    probe = (
        "import ctypes\n"
        "class Info(ctypes.Structure):\n"
        "    _fields_ = [(name, ctypes.c_size_t) for name in 'arena ordblks smblks hblks hblkhd"
        " usmblks fsmblks uordblks fordblks keepcost'.split()]\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.malloc.restype = ctypes.c_void_p\n"
        "libc.free.argtypes = [ctypes.c_void_p]\n"
        "libc.mallinfo2.restype = Info\n"
        "blocks = [libc.malloc(1000) for _ in range(7)]\n"
        "libc.malloc(1000)  # between the blocks and the heap's top: freed, they stay in it\n"
        "in_use = libc.mallinfo2().uordblks\n"
        "for block in blocks:\n"
        "    libc.free(block)\n"
        "print(in_use - libc.mallinfo2().uordblks)\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    as_by_hand = subprocess.run([sys.executable, "-c", probe], env=environment,
                                capture_output=True, text=True, check=True, timeout=60)
    assert int(as_by_hand.stdout) < 1000  # what the unit's setting is for: all seven cached
    under_the_unit = subprocess.run([sys.executable, "-c", probe],
                                    env={**environment, **_unit_environment()},
                                    capture_output=True, text=True, check=True, timeout=60)
    assert int(under_the_unit.stdout) >= 7 * 1000


@pytest.mark.slow(seconds=3)
async def test_the_agent_sells_under_the_units_environment(
    sim_factory: Any, tmp_path: Path
) -> None:
    """The unit's Environment= changes how Python runs the agent and every library it uses
    (PYTHONOPTIMIZE=2: no docstrings, no asserts): a real `kiosk-agent run` under it starts,
    sells a coffee through the kiosk API to its end, and its journal and the simulator's ledger
    agree on the money."""
    environment = _unit_environment()
    assert environment["PYTHONOPTIMIZE"] == "2"
    sim = await sim_factory(transactions=0)
    journal = tmp_path / "journal.db"
    agent = AgentProcess(write_config(tmp_path, sim, journal, kiosk_app()), sim, cold=True)
    agent.env |= {**environment, "KIOSK_APP_TOKEN": TOKEN}
    try:
        await agent.start()
        await agent.wait_ready()
        found = re.search(r"kiosk API on 127\.0\.0\.1:(\d+)", agent.text())
        assert found, agent.text()[-3000:]
        async with aiohttp.ClientSession() as session:
            app = App(session, int(found.group(1)))
            sale = await app.buy_coffee()
            await sale_reaches(journal, sale, "dispensing")
            status, body, _ = await app.call("POST", f"/sales/{sale}/dispensed",
                                             {"status": "vended"})
            assert status == 202, body
            await sale_reaches(journal, sale, "completed")
        agent.send(signal.SIGTERM)
        assert await agent.exit_code() == 0, agent.text()[-3000:]
    finally:
        await agent.close()
    assert "Traceback" not in agent.text(), agent.text()[-3000:]
    await money_agrees(sim, journal)  # captured $2.50, nothing voided or refunded


def test_abstract_namespace_socket() -> None:
    name = f"kiosk-agent-test-{os.getpid()}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind("\0" + name)
    server.settimeout(2)
    try:
        notifier = SystemdNotifier(f"@{name}")
        notifier.watchdog()
        assert _received(server) == ["WATCHDOG=1"]
        notifier.close()
    finally:
        server.close()


def test_without_systemd_everything_is_a_quiet_no_op() -> None:
    notifier = SystemdNotifier.from_env({})
    assert not notifier.enabled
    assert notifier.ready() is False
    assert watchdog_interval({}) is None


def test_a_vanished_socket_does_not_raise(tmp_path: Path) -> None:
    notifier = SystemdNotifier(str(tmp_path / "gone"))
    assert notifier.watchdog() is False


def test_watchdog_interval_is_half_of_watchdog_sec() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}) is None


def test_watchdog_is_withheld_on_lag_or_ill_health(notify_socket) -> None:
    path, server = notify_socket
    healthy = True
    dog = Watchdog(SystemdNotifier(path), 1.0, max_lag=0.5, is_healthy=lambda: healthy)
    assert dog.beat(0.01)
    assert _received(server) == ["WATCHDOG=1"]
    assert not dog.beat(0.9)
    healthy = False
    assert not dog.beat(0.0)
    assert (dog.fed, dog.withheld) == (1, 2)
    server.settimeout(0.05)
    with pytest.raises(TimeoutError):
        server.recv(4096)


async def test_lifecycle_feeds_while_the_loop_runs_and_stops_when_blocked(notify_socket) -> None:
    path, server = notify_socket
    server.setblocking(False)
    # WatchdogSec=1 -> a beat every 0.5 s, withheld past 0.5 s of lag: a loop starved of all but
    # 10 ms of every 400 still feeds it (at 0.1 s, its 50 ms bound withheld every beat)
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"}
    lifecycle = SystemdLifecycle(environ=env)
    await lifecycle.start("ready")
    dog = lifecycle.watchdog
    assert dog is not None
    await until(lambda: dog.fed >= 2)  # a beat on a busy machine may lag and be withheld
    withheld = dog.withheld
    time.sleep(1.2)  # block the loop: the next beat sees the lag (0.7 s at least) and withholds
    await until(lambda: dog.withheld > withheld)
    await lifecycle.stop()
    messages = []
    while True:
        try:
            messages.append(server.recv(4096).decode())
        except BlockingIOError:
            break
    assert messages[0] == "READY=1\nSTATUS=ready"
    assert messages[-1] == "STOPPING=1"
    assert messages.count("WATCHDOG=1") == lifecycle.watchdog.fed


def test_status_line_follows_the_agent_and_is_sent_only_on_change(notify_socket) -> None:
    path, server = notify_socket
    health = Health("1")
    health.report_terminal("SIM-0001", online=True, pinged=True)
    dog = Watchdog(SystemdNotifier(path), 1.0, status_text=health.summary)
    dog.beat(0.0)
    assert _received(server) == ["STATUS=ok: 1/1 terminal(s) online, 0 sale(s) today ($0.00)"]
    assert _received(server) == ["WATCHDOG=1"]
    dog.beat(0.0)  # unchanged: no new STATUS
    assert _received(server) == ["WATCHDOG=1"]
    health.report_terminal("SIM-0001", online=False, detail="timed out")
    dog.beat(0.0)
    assert _received(server)[0].startswith("STATUS=down: 0/1 terminal(s) online")


async def test_kiosk_agent_run_speaks_to_systemd(tmp_path: Path) -> None:
    """The real command under a stand-in for systemd: READY, a fed watchdog, then STOPPING."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "service:\n  simulator: {time_scale: 50}\n"
        "terminals:\n  - device_id: SIM-0001\n"
        "journal: {path: journal.db}\n"
    )
    path = str(tmp_path / "notify")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.setblocking(False)
    env = {**os.environ, "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"}
    env.pop("WATCHDOG_PID", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kiosk_agent",
        "run",
        "--config",
        str(config),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    loop = asyncio.get_running_loop()
    messages: list[str] = []

    async def until(text: str) -> None:
        async with asyncio.timeout(20):
            while not any(text in m for m in messages):
                messages.append((await loop.sock_recv(server, 4096)).decode())

    try:
        await until("READY=1")
        await until("WATCHDOG=1")
        send_signal(proc, signal.SIGTERM)
        await until("STOPPING=1")
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        await stop(proc)
        server.close()
    assert messages[0].startswith("READY=1")
