"""Upstream status: a heartbeat over HTTP POST and over MQTT with Home Assistant discovery.

Each heartbeat is built from `Health.snapshot()` through an allow-list of fields, so a report can
only carry what the health model holds (counts, cents, states, device ids), never a card number,
token or key. Every sink has its own bounded queue: what could not be sent while the network was
down is sent, oldest first, once it is back; when the queue is full the oldest report is dropped
and counted, because the newest state is the one an operator needs.

The first heartbeat waits until the agent has settled (serial links connected, the first checks
made) or ``start_grace`` has passed, so a start is not reported as a problem. Home Assistant
discovery follows HA's MQTT discovery schemas (checked in tests against the rules of HA 2024.3
and 2026.2): per-entity config topics with origin (``o``), ``expire_after`` of three heartbeat
intervals, ``total_increasing`` for the daily sales count and ``total`` with a ``last_reset`` for
the daily amount. The sink re-announces when HA's birth message (``<prefix>/status`` = online)
arrives; ``kiosk-agent fleet forget`` clears a decommissioned unit's retained topics.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import json
import logging
import socket
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import aiomqtt
import voluptuous as vol

from kiosk_agent.core.config import register_section
from kiosk_agent.core.health import Health, HealthSnapshot
from kiosk_agent.redact import redact
from kiosk_agent.tasks import BackgroundTask, cancel_and_wait

_LOGGER = logging.getLogger(__name__)

ONLINE = "online"
MAX_RECONNECT_DELAY = 60.0  # seconds
OFFLINE = "offline"

_seconds = vol.All(vol.Coerce(float), vol.Range(min=0.05, max=86400.0))



def is_loopback_url(url: str) -> bool:
    """Whether ``url`` names this machine (127.0.0.0/8, ::1, localhost): nothing leaves it."""
    return is_loopback_host(urlsplit(url).hostname or "")


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address, no brackets) is this machine only."""
    host = host.rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def insecure_http(conf: dict[str, Any]) -> bool:
    """An ``http://`` heartbeat URL that leaves the machine (token and reports in clear)."""
    url = str(conf["url"])
    return url.lower().startswith("http://") and not is_loopback_url(url)


def _refuse_clear_text(conf: dict[str, Any]) -> dict[str, Any]:
    if insecure_http(conf) and not conf["allow_insecure_http"]:
        raise vol.Invalid(
            "an http:// heartbeat to another host sends the fleet token and the reports in "
            "clear: use https://, or set allow_insecure_http: true to accept that "
            "(http:// to a loopback address is always allowed)",
            path=["url"],
        )
    return conf


HTTP_SCHEMA = vol.All(
    vol.Schema(
        {
            vol.Required("url"): vol.All(
                str, vol.Match(r"^https?://", msg="expected an http(s) URL")
            ),
            # Sent as a bearer token; use !secret. Never logged.
            vol.Optional("token"): str,
            vol.Optional("timeout", default=10.0): _seconds,
            # http:// to a host other than this one: the token travels in clear (warned at start)
            vol.Optional("allow_insecure_http", default=False): bool,
        }
    ),
    _refuse_clear_text,
)

MQTT_SCHEMA = vol.Schema(
    {
        vol.Required("host"): str,
        vol.Optional("port", default=1883): vol.All(int, vol.Range(min=1, max=65535)),
        vol.Optional("username"): str,
        vol.Optional("password"): str,
        vol.Optional("topic_prefix", default="kiosk-agent"): str,
        # Home Assistant's discovery prefix; false turns discovery off.
        vol.Optional("discovery_prefix", default="homeassistant"): vol.Any(str, False),
        # TLS to the broker (port 8883 usually); ca_file: a private CA instead of the system's.
        vol.Optional("tls", default=False): bool,
        vol.Optional("ca_file"): str,
        vol.Optional("keepalive", default=60): vol.All(int, vol.Range(min=5, max=3600)),
        vol.Optional("reconnect_interval", default=5.0): _seconds,
    }
)

UPSTREAM_SCHEMA = vol.Schema(
    {
        # How this unit is named upstream; default: the host name.
        vol.Optional("device_id"): vol.All(str, vol.Match(r"^[A-Za-z0-9_-]+$")),
        vol.Optional("interval", default=60.0): _seconds,
        # The first heartbeat waits for the serial links and first checks, at most this long.
        vol.Optional("start_grace", default=10.0): vol.All(
            vol.Coerce(float), vol.Range(min=0.0, max=600.0)
        ),
        # Where the unit's status page is, as Home Assistant's "Visit" link (default: the admin
        # API's address when it listens beyond loopback).
        vol.Optional("configuration_url"): vol.All(
            str, vol.Match(r"^https?://[^\s]+$", msg="expected an http(s) URL")
        ),
        vol.Optional("queue_size", default=500): vol.All(int, vol.Range(min=1, max=100000)),
        vol.Optional("http"): HTTP_SCHEMA,
        vol.Optional("mqtt"): MQTT_SCHEMA,
    }
)

register_section("upstream", UPSTREAM_SCHEMA)


def build_report(device_id: str, snapshot: HealthSnapshot) -> dict[str, Any]:
    """The heartbeat body: the health snapshot's fields, nothing else."""
    sales = snapshot.sales.model_dump(mode="json")
    # Home Assistant's last_reset of the daily amount: ISO 8601 with the offset
    sales["day_started"] = (
        dt.datetime.fromtimestamp(snapshot.sales.day_started_at).astimezone().isoformat()
    )
    return {
        "device_id": device_id,
        "version": snapshot.version,
        "status": str(snapshot.status),
        "problems": snapshot.problems,
        "at": snapshot.at,
        "uptime_s": snapshot.uptime_s,
        "service": snapshot.service.model_dump(mode="json"),
        "sales": sales,
        "terminals": [t.model_dump(mode="json") for t in snapshot.terminals],
        "terminals_online": sum(1 for t in snapshot.terminals if t.online),
        "links": [link.model_dump(mode="json") for link in snapshot.links],
        "journal": snapshot.journal.model_dump(mode="json"),
        "availability": [a.model_dump(mode="json") for a in snapshot.availability],
        "out_of_service": [a.device_id for a in snapshot.availability if not a.available],
    }


class ReportQueue:
    """Bounded FIFO of reports not yet sent; drops the oldest when full and counts it."""

    def __init__(self, size: int) -> None:
        self._items: deque[dict[str, Any]] = deque()
        self._size = size
        self.dropped = 0

    def put(self, report: dict[str, Any]) -> None:
        if len(self._items) >= self._size:
            self._items.popleft()
            self.dropped += 1
        self._items.append(report)

    def peek(self) -> dict[str, Any] | None:
        return self._items[0] if self._items else None

    def pop(self) -> None:
        self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)


class Sink(Protocol):
    name: str
    queue: ReportQueue
    sent: int
    failures: int
    last_sent_at: float | None
    last_error: str

    def wake(self) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class _SinkBase:
    name = "sink"

    def __init__(self, queue_size: int) -> None:
        self.queue = ReportQueue(queue_size)
        self.sent = 0
        self.failures = 0
        self.last_sent_at: float | None = None
        self.last_error = ""
        self._wakeup = asyncio.Event()
        self._loop = BackgroundTask(self._run, f"upstream-{self.name}")

    def wake(self) -> None:
        self._wakeup.set()

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def _run(self) -> None:
        raise NotImplementedError

    def _sent_one(self) -> None:
        self.queue.pop()
        self.sent += 1
        self.last_sent_at = time.time()
        self.last_error = ""

    def _failed(self, error: str) -> None:
        error = redact(error)  # a URL or broker message may carry a credential
        self.failures += 1
        if error != self.last_error:
            _LOGGER.warning("upstream %s: %s (%d queued)", self.name, error, len(self.queue))
        self.last_error = error


class HttpSink(_SinkBase):
    """POSTs each report as JSON; anything but a 2xx keeps it queued for the next heartbeat."""

    name = "http"

    def __init__(self, conf: dict[str, Any], queue_size: int) -> None:
        super().__init__(queue_size)
        self._url: str = conf["url"]
        self._insecure = insecure_http(conf)
        self._timeout = aiohttp.ClientTimeout(total=conf.get("timeout", 10.0))
        self._headers = {"Content-Type": "application/json"}
        if conf.get("token"):
            self._headers["Authorization"] = f"Bearer {conf['token']}"
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._insecure:
            _LOGGER.warning(
                "upstream http: %s is plain http to another host (allow_insecure_http): the "
                "fleet token and every report travel in clear; use https://",
                self._url,
            )
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await self.flush()

    async def flush(self) -> None:
        assert self._session is not None
        while (report := self.queue.peek()) is not None:
            try:
                async with self._session.post(self._url, data=json.dumps(report)) as response:
                    if response.status >= 300:
                        self._failed(f"HTTP {response.status} from {self._url}")
                        return
            except (aiohttp.ClientError, TimeoutError, OSError) as err:
                self._failed(f"{type(err).__name__} posting to {self._url}")
                return
            self._sent_one()


class MqttSink(_SinkBase):
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


@dataclass(frozen=True, slots=True)
class DiscoveryOptions:
    """What Home Assistant's discovery says beyond the topics (from the agent's configuration)."""

    expire_after: int | None = None  # seconds; a frozen unit's values go unavailable after it
    configuration_url: str | None = None  # the unit's status page ("Visit" in HA)
    currency: str = "USD"  # the daily amount's unit (ISO 4217, as HA's monetary class wants)


# The statuses the Status sensor can have (Home Assistant device_class enum options).
STATUS_OPTIONS = ["ok", "degraded", "down"]
# Origin info: who published the configs (the project has no public support URL to give).
ORIGIN = {"name": "kiosk-agent"}
# Every discovery config of a unit as (component, key): what `fleet forget` clears too.
DISCOVERY_ENTITIES = [
    ("sensor", "status"),
    ("sensor", "uptime"),
    ("sensor", "terminals_online"),
    ("sensor", "sales_today"),
    ("sensor", "sales_today_amount"),
    ("sensor", "open_sales"),
    ("sensor", "attention_sales"),
    ("binary_sensor", "problem"),
]


def discovery_topic(prefix: str, component: str, device_id: str, key: str) -> str:
    return f"{prefix}/{component}/{device_id}/{key}/config"


def discovery_messages(
    device_id: str,
    version: str,
    state_topic: str,
    availability_topic: str,
    prefix: str | bool,
    options: DiscoveryOptions | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """Home Assistant MQTT discovery: one device, seven sensors and a Problem binary sensor.

    Full key names (HA takes them and its abbreviations alike). HA's rules kept, from its
    ``mqtt/sensor.py`` and ``sensor/const.py``: ``last_reset_value_template`` only with
    ``state_class: total``; ``options`` only with ``device_class: enum``, and then neither a
    state class nor a unit; ``monetary`` only with ``state_class: total``; ``expire_after`` a
    positive integer; origin needs a ``name``.
    """
    if not prefix:
        return []
    options = options or DiscoveryOptions()
    device: dict[str, Any] = {
        "identifiers": [f"kiosk_agent_{device_id}"],
        "name": f"Kiosk {device_id}",
        "manufacturer": "kiosk-agent",
        "model": "kiosk-agent",
        "sw_version": version,
    }
    if options.configuration_url:
        device["configuration_url"] = options.configuration_url
    common: dict[str, Any] = {
        "state_topic": state_topic,
        "availability_topic": availability_topic,
        "payload_available": ONLINE,
        "payload_not_available": OFFLINE,
        "device": device,
        "origin": {**ORIGIN, "sw_version": version},
    }
    if options.expire_after:
        common["expire_after"] = options.expire_after
    configs: dict[str, dict[str, Any]] = {
        "status": {
            "name": "Status",
            "value_template": "{{ value_json.status }}",
            "device_class": "enum",
            "options": STATUS_OPTIONS,
        },
        "uptime": {
            "name": "Uptime",
            "value_template": "{{ value_json.uptime_s | int }}",
            "unit_of_measurement": "s",
            "device_class": "duration",
            "entity_category": "diagnostic",
        },
        "terminals_online": {
            "name": "Terminals online",
            "value_template": "{{ value_json.terminals_online }}",
            "state_class": "measurement",
        },
        "sales_today": {
            # drops to 0 at local midnight: a meter reset for total_increasing, never a negative
            "name": "Sales today",
            "value_template": "{{ value_json.sales.today_count }}",
            "state_class": "total_increasing",
        },
        "sales_today_amount": {
            # cents on the wire (exact), currency units for people; monetary takes only
            # state_class total, so the midnight reset is told by last_reset
            "name": "Sales today amount",
            "value_template": "{{ (value_json.sales.today_amount_cents / 100) | round(2) }}",
            "unit_of_measurement": options.currency,
            "device_class": "monetary",
            "state_class": "total",
            "last_reset_value_template": "{{ value_json.sales.day_started }}",
        },
        "open_sales": {
            "name": "Open sales",
            "value_template": "{{ value_json.sales.open }}",
            "state_class": "measurement",
        },
        "attention_sales": {
            "name": "Sales needing attention",
            "value_template": "{{ value_json.sales.attention }}",
            "state_class": "measurement",
        },
        "problem": {
            "name": "Problem",
            "device_class": "problem",
            "value_template": "{{ 'OFF' if value_json.status == 'ok' else 'ON' }}",
            # the problems themselves, as the Problem sensor's attributes
            "json_attributes_topic": state_topic,
            "json_attributes_template": (
                "{{ {'problems': value_json.problems, "
                "'out_of_service': value_json.out_of_service | default([])} | tojson }}"
            ),
        },
    }
    messages: list[tuple[str, dict[str, Any]]] = []
    for component, key in DISCOVERY_ENTITIES:
        config = {**configs[key], "unique_id": f"kiosk_agent_{device_id}_{key}", **common}
        messages.append((discovery_topic(str(prefix), component, device_id, key), config))
    return messages


def unit_base_topic(mqtt: dict[str, Any], device_id: str) -> str:
    """Where a unit's own topics live: ``<topic_prefix>/<device_id>``."""
    return f"{mqtt.get('topic_prefix', 'kiosk-agent')}/{device_id}"


def unit_topics(mqtt: dict[str, Any], device_id: str) -> list[str]:
    """Every retained topic a unit publishes: state, availability, each discovery config."""
    base = unit_base_topic(mqtt, device_id)
    topics = [f"{base}/state", f"{base}/availability"]
    prefix = mqtt.get("discovery_prefix", "homeassistant")
    if prefix:
        topics += [discovery_topic(prefix, c, device_id, key) for c, key in DISCOVERY_ENTITIES]
    return topics


def configuration_url(agent: Any, conf: dict[str, Any]) -> str | None:
    """The status page's address for HA: configured, else the admin API's when reachable."""
    if conf.get("configuration_url"):
        return str(conf["configuration_url"])
    config = getattr(agent, "config", None)
    admin = config.get("admin") if config is not None else None
    if not admin:
        return None
    host = str(admin.get("host", "127.0.0.1"))
    if is_loopback_host(host):
        return None  # loopback only: nobody else can open it
    if host in ("0.0.0.0", "::"):  # noqa: S104 - reading the configuration, not binding
        host = socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{admin.get('port', 8124)}/"


class Upstream:
    """The `upstream:` component: a heartbeat every `interval` to each configured sink."""

    def __init__(self, agent: Any, conf: dict[str, Any]) -> None:
        conf = UPSTREAM_SCHEMA(conf)
        self._health: Health = agent.health
        self.device_id: str = conf.get("device_id") or host_device_id()
        self._interval: float = conf["interval"]
        self._start_grace: float = conf["start_grace"]
        self.sinks: list[Sink] = []
        if "http" in conf:
            self.sinks.append(HttpSink(conf["http"], conf["queue_size"]))
        if "mqtt" in conf:
            settings = getattr(agent, "settings", None)
            discovery = DiscoveryOptions(
                # three heartbeats missed: the unit is frozen even if its connection is open
                expire_after=max(1, round(3 * self._interval)),
                configuration_url=configuration_url(agent, conf),
                currency=str(getattr(settings, "currency", "USD")),
            )
            self.sinks.append(
                MqttSink(
                    conf["mqtt"], conf["queue_size"], self.device_id, self._health.version,
                    discovery,
                )
            )
        self._loop = BackgroundTask(self._run, "upstream-heartbeat")
        self.heartbeats = 0
        self.first_report_waited_s: float | None = None
        # a terminal going out of (or back into) service is reported at once, not next interval
        self._availability: Any = getattr(agent, "availability", None)
        self._changed = asyncio.Event()

    async def start(self) -> None:
        for sink in self.sinks:
            await sink.start()
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        for sink in self.sinks:
            await sink.stop()

    async def _run(self) -> None:
        changes = getattr(self._availability, "changes", None)
        async with contextlib.AsyncExitStack() as stack:
            if changes is not None:
                queue = await stack.enter_async_context(changes.subscribe())
                follower = asyncio.ensure_future(self._follow(queue))
                stack.push_async_callback(cancel_and_wait, follower)
            await self._settle()
            while True:
                self._changed.clear()
                self.heartbeat()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self._interval)

    async def _follow(self, queue: asyncio.Queue[Any]) -> None:
        while True:
            await queue.get()
            self._changed.set()

    async def _settle(self) -> None:
        """Before the first report: wait for the links and first checks, or the start grace."""
        started = time.monotonic()
        deadline = started + max(0.0, self._start_grace - self._health.uptime)
        while True:
            pending = self._health.settling()
            if not pending:
                break
            if time.monotonic() >= deadline:
                _LOGGER.info("upstream: first report after the start grace; still settling: %s",
                             ", ".join(pending))
                break
            await asyncio.sleep(0.05)
        self.first_report_waited_s = round(time.monotonic() - started, 3)

    def heartbeat(self) -> dict[str, Any]:
        """Queue one report on every sink and wake them; returns the report."""
        report = build_report(self.device_id, self._health.snapshot())
        for sink in self.sinks:
            sink.queue.put(report)
            sink.wake()
        self.heartbeats += 1
        return report

    def stats(self) -> dict[str, dict[str, float]]:
        """Per-sink counters for metrics and the admin API."""
        return {
            sink.name: {
                "sent": sink.sent,
                "queued": len(sink.queue),
                "dropped": sink.queue.dropped,
                "failures": sink.failures,
                "last_sent_at": sink.last_sent_at or 0.0,
            }
            for sink in self.sinks
        }


def host_device_id() -> str:
    """The default ``upstream.device_id``: the host name, in the characters topics allow."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname())
