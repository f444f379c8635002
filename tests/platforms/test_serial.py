"""The serial base: lines, garbage, socket:// URLs, globs, reconnect with backoff, the watchdog."""

from __future__ import annotations

import asyncio
import os
import tty
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kiosk_agent.platforms.serial import (
    LinkState,
    SerialLink,
    SerialSettings,
    backoff_delay,
    resolve_port,
)
from kiosk_agent.sales.clock import FakeClock

from ..helpers import until
from .vending_rig import LineDevice


class LineServer:
    """A TCP 'adapter' for socket:// links: sends what it is told, records what it hears."""

    def __init__(self) -> None:
        self.heard: list[str] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"socket://127.0.0.1:{port}"

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        while line := await reader.readline():
            text = line.decode().strip()
            self.heard.append(text)
            if text == "PING":
                writer.write(b"PONG\n")

    def send(self, data: bytes) -> None:
        self.writers[-1].write(data)

    def drop_clients(self) -> None:
        for writer in self.writers:
            writer.close()

    async def stop(self) -> None:
        self.drop_clients()
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
async def line_server() -> AsyncIterator[LineServer]:
    server = LineServer()
    yield server
    await server.stop()


async def test_socket_url_lines_both_ways(line_server: LineServer) -> None:
    url = await line_server.start()
    lines: list[str] = []
    link = SerialLink("test", SerialSettings(port=url), lines.append)
    await link.start()
    try:
        await asyncio.wait_for(link.wait_connected(), 3)
        assert link.write_line("hello")
        await until(lambda: line_server.heard == ["hello"])
        line_server.send(b"one\r\ntwo\nthr")
        line_server.send(b"ee\n")
        await until(lambda: len(lines) == 3)
        assert lines == ["one", "two", "three"]
    finally:
        await link.stop()
    assert link.state is LinkState.CLOSED
    assert not link.write_line("after stop")


async def test_garbage_is_counted_and_dropped(line_server: LineServer) -> None:
    url = await line_server.start()
    lines: list[str] = []
    link = SerialLink("test", SerialSettings(port=url, max_line=32), lines.append)
    await link.start()
    try:
        await asyncio.wait_for(link.wait_connected(), 3)
        line_server.send(b"\xc3\xa9t\xc3\xa9\n")  # not ASCII
        line_server.send(b"bell\x07\n")  # control character
        line_server.send(b"x" * 100)  # overlong, no line end yet
        line_server.send(b"tail of the overlong run\nok\n")
        await until(lambda: lines == ["ok"])
        assert link.stats.dropped == 3
        assert link.connected
    finally:
        await link.stop()


async def test_handler_errors_do_not_break_the_link(line_server: LineServer) -> None:
    url = await line_server.start()
    seen: list[str] = []

    def handler(line: str) -> None:
        seen.append(line)
        if line == "boom":
            raise RuntimeError("handler bug")

    link = SerialLink("test", SerialSettings(port=url), handler)
    await link.start()
    try:
        await asyncio.wait_for(link.wait_connected(), 3)
        line_server.send(b"boom\nstill here\n")
        await until(lambda: seen == ["boom", "still here"])
        assert link.connected
    finally:
        await link.stop()


async def test_reconnects_when_the_far_end_goes_away(line_server: LineServer) -> None:
    url = await line_server.start()
    states: list[LinkState] = []
    connects = 0

    async def on_connected() -> None:
        nonlocal connects
        connects += 1

    link = SerialLink(
        "test",
        SerialSettings(port=url, reconnect_min=0.01, reconnect_max=0.05),
        lambda line: None,
        on_state=lambda state, detail: states.append(state),
        on_connected=on_connected,
    )
    await link.start()
    try:
        await asyncio.wait_for(link.wait_connected(), 3)
        line_server.drop_clients()
        await until(lambda: connects == 2)
        assert link.stats.reconnects == 1
        assert states == [
            LinkState.CONNECTING,
            LinkState.CONNECTED,
            LinkState.DISCONNECTED,
            LinkState.CONNECTING,
            LinkState.CONNECTED,
        ]
    finally:
        await link.stop()


async def test_watchdog_probes_then_reconnects_a_silent_link(line_server: LineServer) -> None:
    # On the links' clocks (the test's): an answered probe keeps a link however late its
    # answer comes in real time; a silent link without a probe is dropped at its first silence.
    url = await line_server.start()
    answered_clock, silent_clock = FakeClock(), FakeClock()
    answered = SerialLink(
        "answered", SerialSettings(port=url, silence_timeout=0.05, probe="PING"),
        lambda _: None, clock=answered_clock,
    )
    silent = SerialLink(
        "silent", SerialSettings(port=url, silence_timeout=0.05, reconnect_min=0.01),
        lambda _: None, clock=silent_clock,
    )
    await answered.start()
    await silent.start()
    try:
        await asyncio.wait_for(answered.wait_connected(), 30)
        for silences in range(1, 6):  # each silence probes; each answer keeps the link
            due = await answered_clock.next_due(pauses_only=False, real_timeout=30)
            await answered_clock.advance_to(due)
            # the PONG heard, and the watchdog waiting again (the answer taken as one)
            await until(lambda at=due: (answered.stats.last_rx_at == at
                                        and not answered.activity.is_set()))
            assert line_server.heard.count("PING") == silences
            assert (answered.stats.reconnects, answered.connected) == (0, True)
        await asyncio.wait_for(silent.wait_connected(), 30)
        due = await silent_clock.next_due(pauses_only=False, real_timeout=30)
        await silent_clock.advance_to(due)
        await until(lambda: silent.stats.reconnects >= 1)
        assert silent.stats.last_error == "silent for 0.1s"
        assert answered.stats.reconnects == 0
    finally:
        await answered.stop()
        await silent.stop()


async def test_a_silent_device_on_a_real_pty_is_probed_then_dropped_and_reconnected() -> None:
    # The product's clock (the machine's monotonic one, the default): a device that never
    # answers is probed after one silence and dropped after the next, then reconnected.
    device = LineDevice()
    link = SerialLink(
        "mute", SerialSettings(port=device.port, silence_timeout=0.05, probe="HELLO",
                               reconnect_min=0.01), lambda _: None,
    )
    await link.start()
    try:
        await until(lambda: link.stats.reconnects >= 1 and link.connected)
        assert link.stats.last_error == "silent for 0.1s"
        assert link.stats.connects >= 2
        await until(lambda: "HELLO" in device.heard)  # the device's read of it can come later
    finally:
        await link.stop()
        device.close()


async def test_the_watchdog_counts_silences_on_the_links_clock() -> None:
    # On a test's clock: probed at the first silence, dropped at the second, and nothing in
    # between however long the loop takes in real time.
    clock = FakeClock()
    device = LineDevice()
    link = SerialLink(
        "mute", SerialSettings(port=device.port, silence_timeout=0.05, probe="HELLO",
                               reconnect_min=0.01), lambda _: None, clock=clock,
    )
    await link.start()
    try:
        await asyncio.wait_for(link.wait_connected(), 5)
        start = clock.monotonic()
        await until(lambda: clock.pending() == [start + 0.05])
        await asyncio.sleep(0.1)  # real time passes: not the link's
        assert link.connected
        assert device.heard == []
        await clock.advance(0.05)  # one silence: the probe
        await until(lambda: device.heard == ["HELLO"])
        probed = start + 0.05
        assert link.probe_sent_at == probed
        await until(lambda: clock.pending() == [probed + 0.05])
        assert link.connected
        assert link.stats.reconnects == 0
        await clock.advance(0.05)  # a second, unanswered: dropped, then connected again
        await until(lambda: link.stats.reconnects == 1 and link.connected)
        assert link.stats.last_error == "silent for 0.1s"
        dropped = probed + 0.05
        assert clock.monotonic() == dropped
        assert link.stats.history[-3:] == [
            (dropped, LinkState.DISCONNECTED),
            (dropped, LinkState.CONNECTING),
            (dropped, LinkState.CONNECTED),
        ]
    finally:
        await link.stop()
        device.close()


async def test_one_probe_at_a_time(line_server: LineServer) -> None:
    url = await line_server.start()
    link = SerialLink(
        "probed", SerialSettings(port=url, silence_timeout=30, probe="HELLO"), lambda _: None
    )
    await link.start()
    try:
        await asyncio.wait_for(link.wait_connected(), 3)
        assert link.send_probe()
        assert not link.send_probe()  # the first is unanswered: which would an answer be for?
        await until(lambda: "HELLO" in line_server.heard)
        sent = link.probe_sent_at
        assert sent is not None
        line_server.send(b"PONG\n")
        await until(lambda: (link.stats.last_rx_at or 0) > sent)
        assert link.send_probe()  # answered: the next may go
        link.busy = lambda: True
        line_server.send(b"PONG\n")
        await until(lambda: line_server.heard.count("HELLO") == 2)
        await asyncio.sleep(0.05)
        assert not link.send_probe()  # never mid-exchange
    finally:
        await link.stop()


async def test_each_connection_is_probed_anew(line_server: LineServer) -> None:
    url = await line_server.start()
    # "HELLO" goes unanswered: each connection is probed once, then dropped as silent
    link = SerialLink(
        "mute",
        SerialSettings(port=url, silence_timeout=0.05, probe="HELLO", reconnect_min=0.01),
        lambda _: None,
    )
    await link.start()
    try:
        await until(lambda: line_server.heard.count("HELLO") >= 3)
        assert line_server.connections >= 3
    finally:
        await link.stop()


async def test_port_that_is_missing_is_retried_with_backoff(tmp_path: Path) -> None:
    port = tmp_path / "ttyUSB*"
    states: list[tuple[LinkState, str]] = []
    link = SerialLink(
        "usb",
        SerialSettings(port=str(port), reconnect_min=0.01, reconnect_max=0.02),
        lambda _: None,
        on_state=lambda state, detail: states.append((state, detail)),
    )
    await link.start()
    try:
        await until(lambda: len(states) >= 2)
        await asyncio.sleep(0.05)
        # one report per outage, however many attempts fail
        assert [s for s, _ in states] == [LinkState.CONNECTING, LinkState.DISCONNECTED]
        assert "no port matches" in states[-1][1]
        # the adapter appears (a pty linked under a name the glob matches)
        master, slave = os.openpty()
        tty.setraw(slave)
        (tmp_path / "ttyUSB3").symlink_to(os.ttyname(slave))
        await asyncio.wait_for(link.wait_connected(), 3)
        assert link.port_in_use == str(tmp_path / "ttyUSB3")
        os.write(master, b"hi\n")
    finally:
        await link.stop()
        os.close(master)
        os.close(slave)


def test_resolve_port_keeps_urls_and_paths_and_expands_globs(tmp_path: Path) -> None:
    (tmp_path / "ttyACM1").touch()
    (tmp_path / "ttyACM0").touch()
    assert resolve_port("socket://127.0.0.1:5000") == "socket://127.0.0.1:5000"
    assert resolve_port("/dev/serial/by-id/usb-x") == "/dev/serial/by-id/usb-x"
    assert resolve_port(str(tmp_path / "ttyACM*")) == str(tmp_path / "ttyACM0")
    assert resolve_port(str(tmp_path / "ttyUSB*")) is None


def test_backoff_grows_and_is_capped() -> None:
    delays = [backoff_delay(n, 0.1, 5.0) for n in range(12)]
    assert 0.075 <= delays[0] <= 0.125
    assert 0.6 <= delays[3] <= 1.0
    assert all(d <= 5.0 for d in delays)
    assert delays[-1] >= 3.75


async def test_missing_device_is_found_soon_after_it_appears_despite_backoff(
    tmp_path: Path,
) -> None:
    port = tmp_path / "usb-adapter"
    link = SerialLink(
        "usb",
        SerialSettings(port=str(port), reconnect_min=5.0, reconnect_max=30.0, appear_poll=0.02),
        lambda _: None,
    )
    await link.start()
    master, slave = os.openpty()
    try:
        await asyncio.sleep(0.1)  # several looks while the adapter is away
        tty.setraw(slave)
        port.symlink_to(os.ttyname(slave))
        appeared = asyncio.get_running_loop().time()
        await asyncio.wait_for(link.wait_connected(), 3.0)
        # seen by the 0.02 s look, not the 5 s reconnect pause (room for a busy machine)
        assert asyncio.get_running_loop().time() - appeared < 2.0
    finally:
        await link.stop()
        os.close(master)
        os.close(slave)


async def test_partial_line_at_disconnect_is_dropped_not_joined(line_server: LineServer) -> None:
    url = await line_server.start()
    lines: list[str] = []
    link = SerialLink("test", SerialSettings(port=url, reconnect_min=0.01), lines.append)
    await link.start()
    try:
        await asyncio.wait_for(link.wait_connected(), 3)
        line_server.send(b"c,STATUS,EN")  # the cable goes mid-line
        await asyncio.sleep(0.05)
        line_server.drop_clients()
        await until(lambda: line_server.connections == 2 and link.connected)
        line_server.send(b"ABLED\nc,STATUS,ENABLED\n")
        await until(lambda: len(lines) == 2)
        assert lines == ["ABLED", "c,STATUS,ENABLED"]  # nothing glued across the reconnect
        assert link.stats.dropped == 1
    finally:
        await link.stop()
