"""The MQTT heartbeat: one connection to the broker, the unit's retained topics, HA discovery.

Built to hold for thousands of units on one broker:

- on connect a unit reads its discovery configs back and publishes only what the broker lacks
  (``fleet.announce``): a broker restart with persistence costs no re-announce;
- reconnects wait a random time below a doubling ceiling (``fleet.backoff``), so a broker
  restart is not met by every unit in the same second;
- Home Assistant's birth message (``<prefix>/status`` = ``online``) is answered by one
  re-announce after the births have stopped for ``BirthPolicy.settle`` (plus a per-unit random
  delay), never sooner than ``min_gap`` after the last one; the gap doubles while births keep
  coming (up to ``max_gap``). Any broker client can publish a birth message: a storm of them
  costs each unit one announce, and one log line a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import secrets
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiomqtt

from kiosk_agent.fleet.announce import END, KEPT_WAIT, config_payloads, end_topic, plan_announce
from kiosk_agent.fleet.backoff import Backoff
from kiosk_agent.fleet.discovery import discovery_messages, own_config
from kiosk_agent.fleet.entities import DiscoveryOptions
from kiosk_agent.fleet.loopback import insecure_mqtt
from kiosk_agent.fleet.schema import KEEPALIVE, MQTT_PORT, RECONNECT_INTERVAL, RECONNECT_MAX
from kiosk_agent.fleet.sink import GOODBYE_TIMEOUT, SinkBase
from kiosk_agent.fleet.tls import ca_file_problem
from kiosk_agent.fleet.topics import (
    DEFAULT_DISCOVERY_PREFIX,
    OFFLINE,
    ONLINE,
    unit_base_topic,
)
from kiosk_agent.logs import RefusalLog
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.tasks import cancel_requested

_LOGGER = logging.getLogger(__name__)
T = TypeVar("T")

MAX_EVENTS = 100  # Home Assistant events kept while the broker is away (oldest dropped)
# A connection counts as a success (the reconnect back-off starts over) once it has held this
# long. Reset at the CONNACK instead, two agents with one device id (a copied configuration)
# take the client id from each other at the first back-off step forever: measured on Mosquitto,
# 9 reconnects and announces a second each (16 retained publishes apiece).
STABLE_AFTER = 30.0


@dataclass(frozen=True, slots=True)
class BirthPolicy:
    """How the unit answers Home Assistant's birth messages (seconds)."""

    settle: float = 1.0  # the births must have stopped this long
    # plus a random delay up to this, so a fleet does not answer at once: 1,000 units in one
    # burst overflow the broker's queue for Home Assistant (upstream.mqtt.announce_spread)
    spread: float = 30.0
    longest: float = 10.0  # a storm that never stops is answered after this anyway
    min_gap: float = 5.0  # never two announces closer than this
    max_gap: float = 60.0  # births that keep coming double the gap up to this


class MqttSink(SinkBase):
    """Keeps one MQTT connection; announces the unit to Home Assistant; publishes reports.

    The last will marks the unit offline when the connection drops without a goodbye; a clean
    stop publishes ``offline`` itself. Only the newest report waits while the broker is away:
    the state topic says how the unit is now, and Home Assistant records each message as a
    change at the moment it arrives (hundreds of old states replayed after an outage, across a
    fleet, would be millions of false changes). Alerts wait in order, each its own event.
    """

    name = "mqtt"

    def __init__(
        self,
        conf: dict[str, Any],
        device_id: str,
        version: str,
        discovery: DiscoveryOptions | None = None,
        *,
        births: BirthPolicy | None = None,
        rng: random.Random | None = None,
        clock: Clock = SYSTEM_CLOCK,
        connect_timeout: float = 10.0,
    ):
        """Every wait of the sink (reconnect back-off, birth policy, log limit) runs on
        ``clock``'s monotonic time; aiomqtt's own timeouts stay real."""
        # a newer report replaces the one not sent yet (counted as dropped)
        super().__init__(1, clock)
        self._conf = conf
        self.device_id = device_id
        self._version = version
        self._discovery = discovery or DiscoveryOptions()
        self.base_topic = unit_base_topic(conf, device_id)
        self.availability_topic = f"{self.base_topic}/availability"
        self.state_topic = f"{self.base_topic}/state"
        self.event_topic = f"{self.base_topic}/event"
        self._prefix = conf.get("discovery_prefix", DEFAULT_DISCOVERY_PREFIX)
        # Home Assistant's birth message: it (re)started and wants the discovery again
        self.birth_topic = f"{self._prefix}/status" if self._prefix else None
        # every config under this unit's device id: those it no longer announces (a terminal
        # replaced) are cleared, so Home Assistant removes their entities
        self.configs_filter = f"{self._prefix}/+/{device_id}/+/config" if self._prefix else None
        # on connect the unit reads its configs back, up to its own marker (fleet.announce)
        self.end_topic = end_topic(self.base_topic)
        self._kept: dict[str, bytes] | None = None  # the configs read back, while reading
        self._kept_all = asyncio.Event()  # the marker came back: every kept config was handed
        self._said_unread = False
        self._announced: set[str] = set()
        self._stale_configs: list[str] = []
        self.configs_cleared = 0
        self._rng = rng or random.Random()
        self._connect_timeout = connect_timeout
        self._backoff = Backoff(
            conf.get("reconnect_interval", RECONNECT_INTERVAL),
            conf.get("reconnect_max", RECONNECT_MAX),
            self._rng,
        )
        self._births = births or BirthPolicy()
        self._birth_log = RefusalLog(
            _LOGGER,
            "mqtt_birth",
            first=1,
            interval=60.0,
            level=logging.INFO,
            clock=clock,
            what="birth message(s)",
        )
        self._birth_first: float | None = None  # when the births now waited on began
        self._birth_last = 0.0
        self._birth_delay = 0.0
        self._announce_gap = self._births.min_gap
        self._last_announce = -float("inf")
        self.reannounce_at: float | None = None
        self.births_heard = 0
        self._dropped_in_row = 0  # connections lost soon after connecting, none refused between
        self.connected = False
        self.connects = 0
        self.announcements = 0  # announces that published configs (all, or what changed)
        self.announces_skipped = 0  # connects that found every config kept as it would be
        self.configs_published = 0
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self.events_sent = 0
        self.last_report: dict[str, Any] | None = None
        self._client: aiomqtt.Client | None = None
        # the connection's listener: it ends (MqttError) when the connection is lost
        self._lost: asyncio.Future[None] | None = None
        # announces and `online` hold it: a stop's goodbye waits for them, and none starts after
        self._announcing = asyncio.Lock()
        self._stopping = False
        self.online = False  # `online` said on this connection (after a report of this run)
        # commands (upstream.commands): the handler, set by Upstream; None: not subscribed
        self.on_command: Callable[[str, bytes], None] | None = None
        self.commands_filter = f"{self.base_topic}/command/+"
        self._retained_commands: set[str] = set()

    def publish_event(self, event_type: str, **attributes: Any) -> None:
        """Fire Home Assistant's Alert event entity (not retained: a replay is not an event)."""
        self.events.append({"event_type": event_type, **attributes})
        self.wake()

    async def start(self) -> None:
        if insecure_mqtt(self._conf):
            _LOGGER.warning(
                "upstream mqtt: the password to %s travels in clear (no tls, allow_insecure)",
                self._conf["host"],
            )
        await super().start()

    def _new_client(self) -> aiomqtt.Client:
        return mqtt_client(
            self._conf,
            f"kiosk-agent-{self.device_id}",
            timeout=self._connect_timeout,
            keepalive=self._conf.get("keepalive", KEEPALIVE),
            will=aiomqtt.Will(self.availability_topic, OFFLINE, qos=1, retain=True),
        )

    async def _run(self) -> None:
        while True:
            connected_at: float | None = None
            try:
                async with self._new_client() as client:
                    self._client = client
                    self._lost = asyncio.ensure_future(self._listen(client))
                    self.online = False
                    connected_at = self._clock.monotonic()
                    kept = await self._configs_kept(client)
                    await self._announce(client, first=self.connects == 0, kept=kept)
                    if self.last_report is not None and not self.queue:
                        # a broker restarted without persistence lost it: HA would show
                        # "unknown" until the next beat
                        await self._publish_state(client, self.last_report)
                        await self._say_online(client)
                    self.connected = True
                    self.connects += 1
                    self._reached()
                    await self._serve(client)
            except (aiomqtt.MqttError, OSError) as err:
                unanswered = _unanswered(err) if connected_at is None else ""
                self._failed(f"broker {self._conf['host']}:{self._conf.get('port', MQTT_PORT)}: "
                             f"{err}{self._short_lived(connected_at)}{unanswered}")
            except Exception as err:  # noqa: BLE001 - a bug must not end the unit's reports
                self._unexpected(err)
            finally:
                self.connected = False
                self._stop_listening()
                if self._client is not None:
                    _heard_disconnect(self._client)
                self._client = None
            if cancel_requested():  # the stop's cancel, handed back by aiomqtt as its error
                raise asyncio.CancelledError
            await self._clock.sleep(self._backoff.next())

    async def _say_online(self, client: aiomqtt.Client) -> None:
        """``online``, once a report of this run is on the broker: before it, the retained
        report is the last run's (a problem long gone, or sales that were open), and Home
        Assistant would show it as now. Never after a stop's goodbye."""
        if self.online:
            return
        async with self._announcing:
            if not self._stopping:
                await self._publish(client, self.availability_topic, ONLINE, retain=True)
                self.online = True

    def _short_lived(self, connected_at: float | None) -> str:
        """Start the back-off over after a connection that held; else say what may be wrong.

        A twin (another client with this id) takes the connection again and again, the broker
        there between; a broker that restarts drops it once and refuses the next connect."""
        if connected_at is None:
            self._dropped_in_row = 0
            return ""  # never connected: the broker is away or refused (its words say which)
        held = self._clock.monotonic() - connected_at
        if held >= STABLE_AFTER:
            self._backoff.reset()
            self._dropped_in_row = 0
            return ""
        self._dropped_in_row += 1
        if self._dropped_in_row < 2:
            return f" ({held:.1f} s after connecting)"
        return (f" ({held:.1f} s after connecting, {self._dropped_in_row} times in a row; "
                f"another client with the id kiosk-agent-{self.device_id}, such as a second "
                "unit with this device_id, takes the connection so)")

    async def _configs_kept(self, client: aiomqtt.Client) -> dict[str, bytes] | None:
        """The unit's retained configs as the broker holds them (topic -> payload), read back
        on connect; None when the unit announces nothing, or they were not all handed back
        within ``KEPT_WAIT`` (an ACL that refuses the marker, a broker far behind).

        Subscribed with the birth topic, as before: a retained config of its own that it no
        longer announces is cleared. At QoS 0: a config that does not come back is published
        again, never skipped."""
        if self.birth_topic is None or self.configs_filter is None:
            return None
        self._kept, self._kept_all = {}, asyncio.Event()
        try:
            await self._or_lost(client.subscribe(
                [(self.birth_topic, 1), (self.configs_filter, 0), (self.end_topic, 0)]))
            await client.publish(self.end_topic, END, qos=0)
            await self._clock.wait_for(self._or_lost(self._kept_all.wait()), KEPT_WAIT)
        except TimeoutError:
            if not self._said_unread:
                self._said_unread = True
                _LOGGER.info("upstream mqtt: the broker did not hand back this unit's discovery "
                             "configs within %g s (busy, or its ACL refuses %s): announcing "
                             "every config", KEPT_WAIT, self.end_topic)
            return None
        finally:
            kept, self._kept = self._kept, None
        return kept

    async def _serve(self, client: aiomqtt.Client) -> None:
        """Flush on every wake-up until the connection is lost (then raise MqttError)."""
        if self.on_command is not None:  # the unit's own command topics only
            await self._or_lost(client.subscribe(self.commands_filter, qos=1))
        if self._lost is None:
            self._lost = asyncio.ensure_future(self._listen(client))
        lost = self._lost
        waits: list[asyncio.Future[Any]] = []
        try:
            while True:
                await self._flush(client)
                if self._reannounce_due():
                    await self._hear_arrived(client, lost)
                if self._reannounce_due():
                    await self._reannounce(client)
                waits = [asyncio.ensure_future(self._wakeup.wait())]
                if self.reannounce_at is not None:
                    waits.append(asyncio.ensure_future(self._sleep_until(self.reannounce_at)))
                await asyncio.wait((*waits, lost), return_when=asyncio.FIRST_COMPLETED)
                for wait in waits:
                    wait.cancel()
                if lost.done():
                    lost.result()
                self._wakeup.clear()
        finally:
            self._stop_listening()
            for wait in waits:
                wait.cancel()

    async def _sleep_until(self, moment: float) -> None:
        """Until ``moment`` on the sink's clock: the wait is measured when it begins (a task
        starts a turn later, and the clock may have moved past it meanwhile)."""
        if (delay := moment - self._clock.monotonic()) > 0:
            await self._clock.sleep(delay)

    def _stop_listening(self) -> None:
        """The connection is over: its listener ends, and why it ended is read (asyncio logs
        a task's error that nobody read)."""
        lost, self._lost = self._lost, None
        if lost is None:
            return
        if lost.done():
            if not lost.cancelled():
                lost.exception()
        else:
            lost.cancel()

    async def _publish(
        self, client: aiomqtt.Client, topic: str, payload: str | bytes, *, retain: bool = False
    ) -> None:
        """Publish at QoS 1 and wait for the broker's acknowledgement, or fail (MqttError) at
        once when the connection is lost meanwhile. aiomqtt waits out its whole timeout (10 s)
        for an acknowledgement that cannot come on a connection reset; what was not
        acknowledged stays to be sent on the next connection."""
        await self._or_lost(client.publish(topic, payload, qos=1, retain=retain))

    async def _or_lost(self, call: Awaitable[T]) -> T:
        """``call``'s result, or MqttError at once when the connection is lost first."""
        lost = self._lost
        sending = asyncio.ensure_future(call)
        if lost is None:
            return await sending
        try:
            await asyncio.wait((sending, lost), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not sending.done():
                sending.cancel()
        if sending.done() and not sending.cancelled():
            return sending.result()  # its own error, if it has one
        if not lost.cancelled():
            lost.result()  # raises why the connection ended
        raise aiomqtt.MqttError("connection closed before the broker answered")

    def _reannounce_due(self) -> bool:
        return self.reannounce_at is not None and self._clock.monotonic() >= self.reannounce_at

    async def _hear_arrived(self, client: aiomqtt.Client, lost: asyncio.Future[None]) -> None:
        """Let the listener read the messages that already arrived: a birth that came before
        the births settled, read late by a busy machine, belongs to the storm it ends."""
        for _ in range(len(client.messages)):  # bounded: a flood that never stops still waits
            if not len(client.messages) or lost.done():
                return
            await asyncio.sleep(0)

    async def _listen(self, client: aiomqtt.Client) -> None:
        """Hear Home Assistant's birth message until the connection drops (then MqttError).

        The message iterator is aiomqtt's one public way to hear that the link dropped."""
        async for message in client.messages:
            if message.topic.matches(self.commands_filter):
                self._command(message)
                continue
            if self._kept is not None and self._read_back(message):
                continue
            if not message.retain:  # a retained one is old (the subscription hands it over)
                if str(message.topic) == self.birth_topic and message.payload in (b"online",
                                                                                  ONLINE):
                    self.heard_birth()
            elif self._stale(message):
                self._stale_configs.append(str(message.topic))
                self.wake()
        raise aiomqtt.MqttError("connection closed")

    def _read_back(self, message: aiomqtt.Message) -> bool:
        """A config of the unit's read back on connect, or the marker that ends them."""
        if self._kept is None:
            raise RuntimeError("a config read back outside the read-back")
        if str(message.topic) == self.end_topic:
            if message.payload == END:
                self._kept_all.set()
            return True
        if (message.retain and self.configs_filter is not None
                and message.topic.matches(self.configs_filter)):
            payload = message.payload
            self._kept[str(message.topic)] = (payload if isinstance(payload, bytes)
                                              else str(payload or "").encode())
            return True
        return False

    def _command(self, message: aiomqtt.Message) -> None:
        """A command on the unit's own topic, to ``on_command``; a retained one would act at
        every connect (and after every broker restart): ignored, said once per topic."""
        key = str(message.topic).rsplit("/", 1)[1]
        payload = message.payload if isinstance(message.payload, bytes) else b""
        if message.retain:
            if key not in self._retained_commands:
                self._retained_commands.add(key)
                _LOGGER.warning("upstream mqtt: a retained command on %s is ignored (it would "
                                "act at every connect); clear it with an empty retained "
                                "message", message.topic)
            return
        if self.on_command is not None:
            self.on_command(key, payload)

    def _stale(self, message: aiomqtt.Message) -> bool:
        """A retained config of this unit's own that it no longer announces."""
        topic = str(message.topic)
        if (not self._announced or self.configs_filter is None or topic in self._announced
                or not message.topic.matches(self.configs_filter)):
            return False
        payload = message.payload
        return isinstance(payload, str | bytes | bytearray) and own_config(self.device_id,
                                                                           payload)

    def heard_birth(self) -> None:
        """A birth message: (re)schedule the one re-announce that answers it and its fellows."""
        now = self._clock.monotonic()
        self.births_heard += 1
        policy = self._births
        if self._birth_first is None:
            self._birth_first = now
            self._birth_delay = self._rng.uniform(0.0, policy.spread)
            if now - self._birth_last < self._announce_gap:  # births keep coming: back off
                self._announce_gap = min(self._announce_gap * 2, policy.max_gap)
            else:
                self._announce_gap = policy.min_gap
        self._birth_last = now
        due = min(now + policy.settle, self._birth_first + policy.longest) + self._birth_delay
        self.reannounce_at = max(due, self._last_announce + self._announce_gap)
        self._birth_log(
            "birth",
            "upstream mqtt: Home Assistant (re)started: announcing again in %.1f s",
            self.reannounce_at - now,
        )
        self.wake()

    async def _reannounce(self, client: aiomqtt.Client) -> None:
        self.reannounce_at = None
        self._birth_first = None
        await self._announce(client)
        if self.last_report is not None:  # its entities get a state at once
            await self._publish_state(client, self.last_report)
            await self._say_online(client)

    async def _publish_state(self, client: aiomqtt.Client, report: dict[str, Any]) -> None:
        await self._publish(client, self.state_topic, json.dumps(report), retain=True)

    async def _announce(
        self, client: aiomqtt.Client, *, first: bool = False,
        kept: dict[str, bytes] | None = None,
    ) -> None:
        """Every config, or with ``kept`` (what the broker holds) only those it lacks or
        holds otherwise, and the clears of the unit's own configs no longer announced."""
        async with self._announcing:
            if not self._stopping:
                await self._announce_now(client, first=first, kept=kept)

    async def _announce_now(
        self, client: aiomqtt.Client, *, first: bool, kept: dict[str, bytes] | None
    ) -> None:
        wanted = config_payloads(discovery_messages(
            self.device_id,
            self._version,
            self.state_topic,
            self.availability_topic,
            self._prefix,
            self._discovery,
            self.event_topic,
        ))
        self._announced = {topic for topic, _ in wanted}
        plan = plan_announce(self.device_id, self._prefix, wanted, kept, first=first)
        for topic, payload in plan.publish:
            await self._publish(client, topic, payload, retain=True)
            self.configs_published += 1
        for topic in plan.clear:  # unchecked: configs an earlier version announced
            await self._publish(client, topic, b"", retain=True)
            if plan.checked:
                self._cleared(topic)
        if not plan.publish and not plan.clear:
            self.announces_skipped += 1  # the broker keeps them all as they are
            return
        self.announcements += 1
        self._last_announce = self._clock.monotonic()

    async def _flush(self, client: aiomqtt.Client) -> None:
        while (report := self.queue.peek()) is not None:
            await self._publish_state(client, report)
            self.last_report = report
            self._took(report)
            await self._say_online(client)
        while self.events:
            await self._publish(client, self.event_topic, json.dumps(self.events[0]))
            self.events.popleft()
            self.events_sent += 1
        while self._stale_configs:
            topic = self._stale_configs[0]
            await self._publish(client, topic, b"", retain=True)
            self._stale_configs.pop(0)
            self._cleared(topic)

    def _cleared(self, topic: str) -> None:
        self.configs_cleared += 1
        _LOGGER.info("upstream mqtt: cleared %s, no longer announced (Home Assistant "
                     "removes its entity)", topic)

    def _took(self, report: dict[str, Any]) -> None:
        """The broker took ``report``: off the queue, unless the stop's goodbye (which may
        send the same one meanwhile) took it off already."""
        if self.queue.peek() is report:
            self._sent_one()

    async def stop(self) -> None:
        self._stopping = True
        client = self._client
        if client is not None:  # connected, perhaps still announcing
            # A clean goodbye: the report that says the unit stopped (queued by Upstream.stop),
            # then `offline`; the broker does not send the will on a normal DISCONNECT. It is
            # the last word: an announce under way finishes first.
            with contextlib.suppress(aiomqtt.MqttError, TimeoutError):
                async with asyncio.timeout(GOODBYE_TIMEOUT), self._announcing:
                    if (report := self.queue.peek()) is not None:
                        await self._publish_state(client, report)
                        self._took(report)
                    await self._publish(client, self.availability_topic, OFFLINE, retain=True)
        await super().stop()


def _heard_disconnect(client: aiomqtt.Client) -> None:
    """The connection is over and its loss was handled here: aiomqtt keeps why it dropped in a
    future that only its message iterator reads. Dropped while the unit published (an announce
    waiting for its acknowledgements), nothing read it, and asyncio logged "Future exception
    was never retrieved" with a traceback at ERROR, once per drop."""
    disconnected = getattr(client, "_disconnected", None)
    if isinstance(disconnected, asyncio.Future) and disconnected.done() and not (
            disconnected.cancelled()):
        disconnected.exception()


def _unanswered(err: BaseException) -> str:
    """What a connect that timed out may mean: a broker that refuses what a unit sends (a QoS 1
    retained last will) closes the connection without an answer under MQTT 3.1.1."""
    if isinstance(err, aiomqtt.MqttError) and "timed out" in str(err).lower():
        return (" (no answer to the connect: a broker that allows no QoS 1 or no retained "
                "messages closes it unanswered; `kiosk-agent doctor` checks that)")
    return ""


def mqtt_tls_context(conf: dict[str, Any]) -> ssl.SSLContext | None:
    """The TLS context for an `mqtt:` section; it always verifies the broker's certificate."""
    if not conf.get("tls"):
        return None
    ca_file = conf.get("ca_file")
    if ca_file and (problem := ca_file_problem(ca_file)) is not None:
        # gone or not a certificate since the config was checked: said so, not "failed"
        raise CaFileError(f"tls ca_file {ca_file}: {problem}")
    return ssl.create_default_context(cafile=ca_file)


class CaFileError(OSError):
    """The CA file does not load (its words name why)."""


def passing_client_id(role: str) -> str:
    """A client id for a command's short visit to the broker (``fleet list``, ``doctor``).

    Random: the broker allows one connection per id, and a pid is no name (every container
    runs its command as pid 1). The ``.`` keeps it apart from every unit's id
    (``kiosk-agent-<device_id>``: a device id holds no ``.``)."""
    return f"kiosk-agent.{role}-{secrets.token_hex(6)}"


def mqtt_client(
    conf: dict[str, Any], identifier: str, *, timeout: float, **options: Any
) -> aiomqtt.Client:
    """A client of the broker an `mqtt:` section names: its address, credentials and TLS.

    ``identifier`` must be the caller's own: a second client with the running agent's id would
    disconnect it. ``options`` go to ``aiomqtt.Client`` (keepalive, will).
    """
    return aiomqtt.Client(
        conf["host"],
        conf.get("port", MQTT_PORT),
        username=conf.get("username"),
        password=conf.get("password"),
        identifier=identifier,
        timeout=timeout,
        tls_context=mqtt_tls_context(conf),
        **options,
    )
