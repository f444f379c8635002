"""A short, read-only visit to the broker in MQTT 3.1.1: what ``fleet list`` needs, and no more.

The agent's own connection is aiomqtt's (paho underneath). Reading a fleet's retained topics
through it cost about 60 us of CPU a message, one event-loop turn and a few system calls per
packet: 20,000 messages (10,000 units' reports and availability) were over a second of CPU
before anything was shown. Here the messages are framed from whatever arrives at once, and a
PUBLISH costs a few microseconds. It connects (address, credentials and TLS as the ``mqtt:``
section says, ``fleet.mqtt.mqtt_tls_context``), subscribes at QoS 0, publishes at QoS 0 and
reads; nothing else (no session, no QoS 1 publish, no reconnect).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiomqtt

from kiosk_agent.fleet.schema import KEEPALIVE, MQTT_PORT

CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, SUBACK, PINGREQ, DISCONNECT = 1, 2, 3, 4, 8, 9, 12, 14
# MQTT 3.1.1, 3.2.2.3: why a broker refuses a connection
REFUSALS = {
    1: "unacceptable protocol version",
    2: "client identifier rejected",
    3: "server unavailable",
    4: "bad user name or password",
    5: "not authorized",
}


class BrokerRefused(aiomqtt.MqttError):
    """The broker answered the connect with a refusal (its words in the message)."""


def _length(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def length_prefixed(value: str | bytes) -> bytes:
    """An MQTT string: its length in two bytes, then its UTF-8."""
    raw = value.encode() if isinstance(value, str) else value
    return len(raw).to_bytes(2, "big") + raw


def packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + _length(len(body)) + body


def connect_packet(client_id: str, *, keepalive: int, username: str | None = None,
                   password: str | None = None) -> bytes:
    """A clean session, no will."""
    flags = 0x02 | (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    body = (length_prefixed("MQTT") + bytes((4, flags)) + keepalive.to_bytes(2, "big")
            + length_prefixed(client_id))
    if username is not None:
        body += length_prefixed(username)
    if password is not None:
        body += length_prefixed(password)
    return packet(CONNECT << 4, body)


def subscribe_packet(packet_id: int, topics: list[tuple[str, int]]) -> bytes:
    body = packet_id.to_bytes(2, "big") + b"".join(
        length_prefixed(topic) + bytes((qos,)) for topic, qos in topics)
    return packet((SUBSCRIBE << 4) | 0x02, body)


def publish_qos0_packet(topic: str, payload: bytes, *, retain: bool = False) -> bytes:
    return packet((PUBLISH << 4) | int(retain), length_prefixed(topic) + payload)


class Frames:
    """Complete MQTT packets out of a byte stream: (type, flags, body)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        self._buffer += data
        buffer, at, frames = self._buffer, 0, []
        while True:
            index, length, shift = at + 1, 0, 0
            while index < len(buffer) and buffer[index] & 0x80:  # the remaining length
                length += (buffer[index] & 0x7F) << shift
                shift += 7
                index += 1
                if index - at > 4:  # MQTT's is at most 4 bytes: not a stream to wait on
                    raise aiomqtt.MqttError("the broker sent a malformed packet (its length "
                                            "runs over 4 bytes)")
            if index >= len(buffer):
                break  # not all of its header has arrived
            length += buffer[index] << shift
            index += 1
            if index + length > len(buffer):
                break  # not all of its body has arrived
            frames.append((buffer[at] >> 4, buffer[at] & 0x0F, bytes(buffer[index:index + length])))
            at = index + length
        del buffer[:at]
        return frames


def publish_parts(flags: int, body: bytes) -> tuple[str, bytes, bool, bytes]:
    """(topic, payload, retained, packet id: empty at QoS 0) of a PUBLISH."""
    topic_end = 2 + int.from_bytes(body[:2], "big")
    packet_id = b""
    if (flags >> 1) & 3:
        packet_id = body[topic_end: topic_end + 2]
        payload = body[topic_end + 2:]
    else:
        payload = body[topic_end:]
    return body[2:topic_end].decode("utf-8", "replace"), payload, bool(flags & 1), packet_id


class Visit(asyncio.Protocol):
    """One connection: ``on_publish(topic, payload, retained)`` for each message handed over;
    CONNACK and SUBACK settle what waits for them."""

    def __init__(self, on_publish: Callable[[str, bytes, bool], None]) -> None:
        self.on_publish = on_publish
        self.transport: asyncio.Transport | None = None
        self._frames = Frames()
        loop = asyncio.get_running_loop()
        self.lost: asyncio.Future[None] = loop.create_future()
        self._answers: dict[tuple[int, int], asyncio.Future[bytes]] = {}
        self._packet_id = 0
        self._ping: asyncio.TimerHandle | None = None

    def keep_alive(self, keepalive: float) -> None:
        """A PINGREQ every half ``keepalive``: a listing given a long --wait is not dropped
        by the broker (at 1.5 keepalives of silence) while it reads (the network's own time,
        as aiomqtt's keep-alive)."""
        if keepalive > 0 and not self.lost.done():
            self._ping = asyncio.get_running_loop().call_later(keepalive / 2, self._pinged,
                                                               keepalive)

    def _pinged(self, keepalive: float) -> None:
        self.send(packet(PINGREQ << 4, b""))
        self.keep_alive(keepalive)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not isinstance(transport, asyncio.Transport):
            raise TypeError(f"transport: {type(transport).__name__}, not Transport")
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ping is not None:
            self._ping.cancel()
        if not self.lost.done():
            why = exc or "by the broker"
            self.lost.set_exception(aiomqtt.MqttError(f"connection closed: {why}"))
            self.lost.exception()  # read here; raised again to whoever waits
        for future in self._answers.values():
            if not future.done():
                future.set_exception(aiomqtt.MqttError("connection closed"))

    def data_received(self, data: bytes) -> None:
        for kind, flags, body in self._frames.feed(data):
            if kind == PUBLISH:
                topic, payload, retained, packet_id = publish_parts(flags, body)
                if packet_id:  # a QoS 1 message (a subscription at 0 gets none): acknowledged
                    self.send(packet(PUBACK << 4, packet_id))
                self.on_publish(topic, payload, retained)
            elif kind in (CONNACK, SUBACK):
                key = (kind, 0 if kind == CONNACK else int.from_bytes(body[:2], "big"))
                future = self._answers.pop(key, None)
                if future is not None and not future.done():
                    future.set_result(body)

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def ask(self, data: bytes, answer: int, packet_id: int = 0) -> bytes:
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._answers[(answer, packet_id)] = future
        self.send(data)
        done, _ = await asyncio.wait((future, self.lost), return_when=asyncio.FIRST_COMPLETED)
        if future in done:
            return future.result()
        future.cancel()
        self.lost.result()  # raises why it ended
        raise aiomqtt.MqttError("connection closed")  # pragma: no cover

    async def subscribe(self, topics: list[tuple[str, int]]) -> None:
        self._packet_id = self._packet_id % 65535 + 1
        await self.ask(subscribe_packet(self._packet_id, topics), SUBACK, self._packet_id)

    def publish(self, topic: str, payload: bytes) -> None:
        self.send(publish_qos0_packet(topic, payload))

    def close(self) -> None:
        if self._ping is not None:
            self._ping.cancel()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(packet(DISCONNECT << 4, b""))
            self.transport.close()


async def visit(
    conf: dict[str, Any], client_id: str, on_publish: Callable[[str, bytes, bool], None],
    *, within: float,
) -> Visit:
    """Connected to the broker an ``mqtt:`` section names, or OSError (unreachable, TLS),
    TimeoutError or ``BrokerRefused``. ``close()`` it when done."""
    from kiosk_agent.fleet.mqtt import mqtt_tls_context

    host = conf["host"]
    keepalive = conf.get("keepalive", KEEPALIVE)
    tls = mqtt_tls_context(conf)
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(within):
        _, link = await loop.create_connection(
            lambda: Visit(on_publish), host, conf.get("port", MQTT_PORT), ssl=tls,
            server_hostname=host if tls is not None else None)
        try:
            answer = await link.ask(connect_packet(
                client_id, keepalive=keepalive,
                username=conf.get("username"), password=conf.get("password")), CONNACK)
        except BaseException:
            link.close()
            raise
    code = answer[1] if len(answer) > 1 else 255
    if code:
        link.close()
        raise BrokerRefused(f"the broker refused the connection: "
                            f"{REFUSALS.get(code, f'code {code}')}")
    link.keep_alive(keepalive)
    return link
