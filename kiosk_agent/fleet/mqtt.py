"""The MQTT heartbeat: one connection to the broker, the unit's retained topics, HA discovery."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from typing import Any

import aiomqtt

from kiosk_agent.fleet.discovery import discovery_messages
from kiosk_agent.fleet.entities import DiscoveryOptions
from kiosk_agent.fleet.sink import SinkBase
from kiosk_agent.fleet.topics import OFFLINE, ONLINE, unit_base_topic

_LOGGER = logging.getLogger(__name__)

MAX_RECONNECT_DELAY = 60.0  # seconds


class MqttSink(SinkBase):
    """Keeps one MQTT connection; announces the unit to Home Assistant; publishes reports.

    The last will marks the unit offline when the connection drops without a goodbye; a clean
    stop publishes ``offline`` itself.
    """

    name = "mqtt"

    def __init__(
        self,
        conf: dict[str, Any],
        queue_size: int,
        device_id: str,
        version: str,
        discovery: DiscoveryOptions | None = None,
    ):
        super().__init__(queue_size)
        self._conf = conf
        self.device_id = device_id
        self._version = version
        self._discovery = discovery or DiscoveryOptions()
        self.base_topic = unit_base_topic(conf, device_id)
        self.availability_topic = f"{self.base_topic}/availability"
        self.state_topic = f"{self.base_topic}/state"
        prefix = conf.get("discovery_prefix", "homeassistant")
        # Home Assistant's birth message: it (re)started and wants the discovery again
        self.birth_topic = f"{prefix}/status" if prefix else None
        self.connected = False
        self.connects = 0
        self.announcements = 0
        self.last_report: dict[str, Any] | None = None
        self._client: aiomqtt.Client | None = None

    def _new_client(self) -> aiomqtt.Client:
        return mqtt_client(
            self._conf,
            f"kiosk-agent-{self.device_id}",
            timeout=10,
            keepalive=self._conf.get("keepalive", 60),
            will=aiomqtt.Will(self.availability_topic, OFFLINE, qos=1, retain=True),
        )

    async def _run(self) -> None:
        first_delay = self._conf.get("reconnect_interval", 5.0)
        delay = first_delay
        while True:
            try:
                async with self._new_client() as client:
                    self._client = client
                    await self._announce(client)
                    self.connected = True
                    self.connects += 1
                    delay = first_delay
                    await self._serve(client)
            except (aiomqtt.MqttError, OSError) as err:
                self._failed(f"broker {self._conf['host']}:{self._conf.get('port', 1883)}: {err}")
            finally:
                self.connected = False
                self._client = None
            await asyncio.sleep(delay)
            # capped exponential backoff: a fleet must not hammer a broker that is down
            delay = min(delay * 2, max(first_delay, MAX_RECONNECT_DELAY))

    async def _serve(self, client: aiomqtt.Client) -> None:
        """Flush on every wake-up until the connection is lost (then raise MqttError)."""
        if self.birth_topic is not None:
            await client.subscribe(self.birth_topic, qos=1)
        lost: asyncio.Future[None] = asyncio.ensure_future(self._listen(client))
        woken: asyncio.Future[Any] | None = None
        try:
            while True:
                await self._flush(client)
                woken = asyncio.ensure_future(self._wakeup.wait())
                await asyncio.wait((woken, lost), return_when=asyncio.FIRST_COMPLETED)
                if lost.done():
                    lost.result()
                self._wakeup.clear()
        finally:
            lost.cancel()
            if woken is not None:
                woken.cancel()

    async def _listen(self, client: aiomqtt.Client) -> None:
        """Hear Home Assistant's birth message until the connection drops (then MqttError).

        The message iterator is aiomqtt's one public way to hear that the link dropped."""
        async for message in client.messages:
            if self.birth_topic is None or str(message.topic) != self.birth_topic:
                continue
            payload = message.payload
            text = payload.decode(errors="replace") if isinstance(payload, bytes) else payload
            if text == ONLINE:
                _LOGGER.info("upstream mqtt: Home Assistant (re)started: announcing again")
                await self._announce(client)
                if self.last_report is not None:  # its entities get a state at once
                    await client.publish(
                        self.state_topic, json.dumps(self.last_report), qos=1, retain=True
                    )
        raise aiomqtt.MqttError("connection closed")

    async def _announce(self, client: aiomqtt.Client) -> None:
        for topic, config in discovery_messages(
            self.device_id,
            self._version,
            self.state_topic,
            self.availability_topic,
            self._conf.get("discovery_prefix", "homeassistant"),
            self._discovery,
        ):
            await client.publish(topic, json.dumps(config), qos=1, retain=True)
        await client.publish(self.availability_topic, ONLINE, qos=1, retain=True)
        self.announcements += 1

    async def _flush(self, client: aiomqtt.Client) -> None:
        while (report := self.queue.peek()) is not None:
            await client.publish(self.state_topic, json.dumps(report), qos=1, retain=True)
            self.last_report = report
            self._sent_one()

    async def stop(self) -> None:
        client = self._client
        if client is not None and self.connected:
            # A clean goodbye: the broker does not send the will on a normal DISCONNECT.
            with contextlib.suppress(aiomqtt.MqttError, TimeoutError):
                async with asyncio.timeout(2):
                    await client.publish(self.availability_topic, OFFLINE, qos=1, retain=True)
        await super().stop()


def mqtt_tls_context(conf: dict[str, Any]) -> ssl.SSLContext | None:
    """The TLS context for an `mqtt:` section; it always verifies the broker's certificate."""
    if not conf.get("tls"):
        return None
    return ssl.create_default_context(cafile=conf.get("ca_file"))


def mqtt_client(
    conf: dict[str, Any], identifier: str, *, timeout: float, **options: Any
) -> aiomqtt.Client:
    """A client of the broker an `mqtt:` section names: its address, credentials and TLS.

    ``identifier`` must be the caller's own: a second client with the running agent's id would
    disconnect it. ``options`` go to ``aiomqtt.Client`` (keepalive, will).
    """
    return aiomqtt.Client(
        conf["host"],
        conf.get("port", 1883),
        username=conf.get("username"),
        password=conf.get("password"),
        identifier=identifier,
        timeout=timeout,
        tls_context=mqtt_tls_context(conf),
        **options,
    )

