"""Thousands of simulated units in one process, each a real MQTT connection, cheaply.

``bench/fleet.py --part scale`` starts a few of these processes (``--sim-units``). A unit here is
not the agent's ``MqttSink``: the sink's aiomqtt client (paho underneath, a task per publish, a
timer a second) costs one loaded core for about 2,000 units, and the units timed out before the
broker was busy. Each unit here is a minimal MQTT 3.1.1 client on an asyncio protocol, and sends
the broker what the sink sends, built by the product's own code: its client id and last will,
the discovery configs (``discovery_messages``), the report (``build_report``), ``online``
after it; on each connect it reads its configs back as the sink does (the birth topic, its
own configs and its end marker subscribed, the marker sent) and publishes what the product's
``fleet.announce.plan_announce`` says the broker lacks; it waits for each QoS 1
acknowledgement in turn as the sink does, pings at the keepalive, and after a lost
connection waits the sink's back-off (``fleet.backoff.Backoff`` with the shipped
``reconnect_interval`` and ``reconnect_max``).

The process builds its units and says so (``{"built": n}``), starts them at ``go`` on stdin,
then prints one JSON status line a second: connected, online, and back (online on a connection
made after the last ``mark``, a command on stdin); ``stop`` (or the end of stdin) ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from kiosk_agent.fleet.announce import END, KEPT_WAIT, config_payloads, plan_announce
from kiosk_agent.fleet.backoff import Backoff
from kiosk_agent.fleet.component import Upstream
from kiosk_agent.fleet.discovery import discovery_messages
from kiosk_agent.fleet.mqtt import STABLE_AFTER
from kiosk_agent.fleet.report import build_report
from kiosk_agent.fleet.schema import KEEPALIVE, RECONNECT_INTERVAL, RECONNECT_MAX
from kiosk_agent.fleet.topics import OFFLINE, ONLINE
from kiosk_agent.fleet.wire import (
    CONNACK,
    CONNECT,
    PUBACK,
    PUBLISH,
    SUBACK,
    Frames,
    length_prefixed,
    packet,
    publish_parts,
    publish_qos0_packet,
    subscribe_packet,
)

ACK_TIMEOUT_S = 10.0  # what aiomqtt waits for an acknowledgement (the sink's connect_timeout)
CONNECTING_AT_ONCE = 200  # handshakes under way at once in one process (the listen backlog)

PINGREQ = b"\xc0\x00"


def connect_packet(client_id: str, will_topic: str, keepalive: int) -> bytes:
    # clean session, a will at QoS 1, retained: what aiomqtt sends for the sink's Will
    flags = 0x02 | 0x04 | 0x08 | 0x20
    body = (length_prefixed("MQTT") + bytes((4, flags)) + keepalive.to_bytes(2, "big")
            + length_prefixed(client_id) + length_prefixed(will_topic) + length_prefixed(OFFLINE))
    return packet(CONNECT << 4, body)


def publish_packet(topic: str, payload: bytes, packet_id: int, *, retain: bool) -> bytes:
    return packet((PUBLISH << 4) | 0x02 | int(retain),
                  length_prefixed(topic) + packet_id.to_bytes(2, "big") + payload)


class Link(asyncio.Protocol):
    """One connection: frames what arrives, answers the broker's QoS 1 messages, and settles
    the futures of what waits for an answer (CONNACK, PUBACK, SUBACK by packet id)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.frames = Frames()  # the product's framing (fleet list's)
        self.waiting: dict[tuple[int, int], asyncio.Future[bytes]] = {}
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.last_sent = time.monotonic()
        # what the broker hands this connection: (topic, payload, retained)
        self.on_publish: Callable[[str, bytes, bool], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("connection lost"))
        self.waiting.clear()

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
            self.last_sent = time.monotonic()

    async def ask(self, data: bytes, answer: int, packet_id: int = 0) -> bytes:
        """Send ``data`` and wait for its answer: a lost connection fails it at once."""
        if self.lost.done():
            raise ConnectionError("connection lost")
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.waiting[(answer, packet_id)] = future
        self.send(data)
        try:
            async with asyncio.timeout(ACK_TIMEOUT_S):
                return await future
        finally:
            self.waiting.pop((answer, packet_id), None)

    def data_received(self, data: bytes) -> None:
        for kind, flags, body in self.frames.feed(data):
            if kind == PUBLISH:  # the unit's configs read back, its marker, births
                topic, payload, retained, packet_id = publish_parts(flags, body)
                if packet_id:
                    self.send(packet(PUBACK << 4, packet_id))
                if self.on_publish is not None:
                    self.on_publish(topic, payload, retained)
            elif kind in (PUBACK, SUBACK):
                self._settle(kind, int.from_bytes(body[:2], "big"), body)
            elif kind == CONNACK:
                self._settle(kind, 0, body)

    def _settle(self, kind: int, packet_id: int, body: bytes) -> None:
        future = self.waiting.get((kind, packet_id))
        if future is not None and not future.done():
            future.set_result(bytes(body))


class SimulatedUnit:
    """What one unit's MQTT sink sends, over a ``Link``."""

    def __init__(self, upstream: Upstream, port: int, rng: random.Random) -> None:
        sink = upstream.mqtt
        assert sink is not None
        self.sink = sink
        self.port = port
        self.client_id = f"kiosk-agent-{sink.device_id}"
        self.configs = config_payloads(discovery_messages(
            sink.device_id, sink._version, sink.state_topic, sink.availability_topic,
            sink._prefix, sink._discovery, sink.event_topic))
        snapshot = upstream._health.snapshot()
        self.report = json.dumps(build_report(sink.device_id, snapshot,
                                              upstream._interval)).encode()
        self.backoff = Backoff(RECONNECT_INTERVAL, RECONNECT_MAX, rng)
        self.link: Link | None = None
        self.connects = 0
        self.online_on = 0  # the connect (by number) on which `online` was said; 0: not now
        self.announced = 0  # connects on which it published configs (all, or what changed)
        self._packet_id = 0

    def next_id(self) -> int:
        self._packet_id = self._packet_id % 65535 + 1
        return self._packet_id

    async def publish(self, link: Link, topic: str, payload: bytes) -> None:
        packet_id = self.next_id()
        await link.ask(publish_packet(topic, payload, packet_id, retain=True), PUBACK, packet_id)

    async def run(self, connecting: asyncio.Semaphore) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                async with connecting:
                    _, link = await loop.create_connection(Link, "127.0.0.1", self.port)
                    self.link = link
                    answer = await link.ask(connect_packet(self.client_id,
                                                           self.sink.availability_topic,
                                                           KEEPALIVE), CONNACK)
                if answer[1:2] != b"\x00":
                    raise ConnectionError(f"refused: {answer.hex()}")
                self.connects += 1
                connected_at = time.monotonic()
                try:
                    await self.serve(link)
                finally:
                    if time.monotonic() - connected_at >= STABLE_AFTER:  # as the sink does
                        self.backoff.reset()
            except (OSError, TimeoutError):
                pass
            finally:
                self.online_on = 0
                if self.link is not None and self.link.transport is not None:
                    self.link.transport.abort()
                self.link = None
            await asyncio.sleep(self.backoff.next())

    async def serve(self, link: Link) -> None:
        """The sink's order: its configs read back, what the broker lacks of them announced
        (the product's plan), the report, then ``online``; then hold the connection until it
        is lost."""
        sink = self.sink
        kept = await self.configs_kept(link)
        plan = plan_announce(sink.device_id, sink._prefix, self.configs, kept,
                             first=self.connects == 1)
        for topic, payload in plan.publish:
            await self.publish(link, topic, payload)
        for topic in plan.clear:
            await self.publish(link, topic, b"")
        self.announced += bool(plan.publish or plan.clear)
        await self.publish(link, sink.state_topic, self.report)
        await self.publish(link, sink.availability_topic, ONLINE.encode())
        self.online_on = self.connects
        await link.lost

    async def configs_kept(self, link: Link) -> dict[str, bytes] | None:
        """What the sink's ``_configs_kept`` does: subscribe (the birth topic at QoS 1, the
        configs and the end marker at 0), send the marker, keep each retained config handed
        back until the marker comes; None when it does not come within ``KEPT_WAIT``."""
        sink = self.sink
        if sink.birth_topic is None or sink.configs_filter is None:
            return None
        kept: dict[str, bytes] = {}
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def heard(topic: str, payload: bytes, retained: bool) -> None:
            if topic == sink.end_topic:
                if payload == END and not ended.done():
                    ended.set_result(None)
            elif retained and topic != sink.birth_topic:
                kept[topic] = payload

        link.on_publish = heard
        try:
            packet_id = self.next_id()
            await link.ask(subscribe_packet(packet_id, [(sink.birth_topic, 1),
                                                        (sink.configs_filter, 0),
                                                        (sink.end_topic, 0)]), SUBACK, packet_id)
            link.send(publish_qos0_packet(sink.end_topic, END))
            async with asyncio.timeout(KEPT_WAIT):
                await asyncio.wait((ended, link.lost), return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            return None
        finally:
            link.on_publish = None
        if not ended.done():
            raise ConnectionError("connection lost")
        return kept


def make_units(first: int, count: int, port: int, interval: float,
               agent: Callable[[int], Any]) -> list[SimulatedUnit]:
    """Units ``first`` .. ``first + count - 1``, each an ``Upstream`` of ``agent(index)`` as
    the agent makes it (not started: only its sink's topics, options and report are used)."""
    units = []
    for index in range(first, first + count):
        conf = {"device_id": f"unit-{index:05d}", "interval": interval,
                "mqtt": {"host": "127.0.0.1", "port": port}}
        units.append(SimulatedUnit(Upstream(agent(index), conf), port, random.Random(index)))
    return units


async def keep_alive(units: list[SimulatedUnit]) -> None:
    """A PINGREQ from each connection quiet for most of its keepalive (one timer for all)."""
    while True:
        await asyncio.sleep(5.0)
        quiet_since = time.monotonic() - (KEEPALIVE - 10)
        for unit in units:
            if unit.link is not None and unit.link.last_sent < quiet_since:
                unit.link.send(PINGREQ)


def status(units: list[SimulatedUnit], marks: dict[int, int]) -> dict[str, Any]:
    return {
        "connected": sum(unit.link is not None and unit.connects > 0 for unit in units),
        "online": sum(unit.online_on > 0 for unit in units),
        "back": sum(unit.online_on > marks.get(id(unit), 1 << 30) for unit in units),
        "connects": sum(unit.connects for unit in units),
        "announces": sum(unit.announced for unit in units),
    }


async def serve_units(first: int, count: int, port: int, interval: float,
                      agent: Callable[[int], Any]) -> None:
    units = make_units(first, count, port, interval, agent)
    commands: asyncio.Queue[str] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    reader = loop.run_in_executor(None, _read_commands, loop, commands)
    # built (the simulation's own cost, seconds of CPU a thousand units): the units start at
    # "go", all processes' together
    print(json.dumps({"built": len(units)}), flush=True)
    if await commands.get() != "go":
        return
    connecting = asyncio.Semaphore(CONNECTING_AT_ONCE)
    tasks = [asyncio.ensure_future(unit.run(connecting)) for unit in units]
    tasks.append(asyncio.ensure_future(keep_alive(units)))
    marks: dict[int, int] = {}
    try:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    command = await commands.get()
                    if command == "stop":
                        return
                    if command == "mark":
                        marks = {id(unit): unit.connects for unit in units}
            print(json.dumps(status(units, marks)), flush=True)
    finally:
        for task in tasks:
            task.cancel()
        for unit in units:
            if unit.link is not None and unit.link.transport is not None:
                unit.link.transport.abort()
        reader.cancel()


def _read_commands(loop: asyncio.AbstractEventLoop, commands: asyncio.Queue[str]) -> None:
    for line in sys.stdin:
        loop.call_soon_threadsafe(commands.put_nowait, line.strip())
    loop.call_soon_threadsafe(commands.put_nowait, "stop")
