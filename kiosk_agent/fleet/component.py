"""The ``upstream:`` component: a heartbeat every ``interval`` to each configured sink.

The first heartbeat waits until the agent has settled (serial links up once, the first checks
made, the sales a crash left open recovered) or ``start_grace`` has passed, so a start is not
reported as a problem. After that a report goes out every ``interval`` (moved at random by up to
``jitter`` of it, so a fleet started together drifts apart), and at once when the status or the
problems change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import re
import socket
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kiosk_agent.admin.schema import ADMIN_PORT
from kiosk_agent.fleet.backoff import jittered
from kiosk_agent.fleet.commands import (
    PING,
    RESTART,
    NotAPress,
    asked_by,
    request_graceful_restart,
    terminal_commanded,
)
from kiosk_agent.fleet.entities import (
    DEFAULT_MODEL,
    EVENT_BACK_IN_SERVICE,
    EVENT_OUT_OF_SERVICE,
    EVENT_SALE_ATTENTION,
    OLDEST_HOME_ASSISTANT,
    DiscoveryOptions,
)
from kiosk_agent.fleet.http import HttpSink
from kiosk_agent.fleet.loopback import is_loopback_host
from kiosk_agent.fleet.mqtt import BirthPolicy, MqttSink
from kiosk_agent.fleet.report import build_report, iso
from kiosk_agent.fleet.schema import UPSTREAM_SCHEMA
from kiosk_agent.fleet.sink import Sink
from kiosk_agent.fleet.topics import command_topic
from kiosk_agent.health.model import Health, HealthSnapshot
from kiosk_agent.redact import redact
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sales.terminal_actions import ActionRefused, ping_terminal, print_test_receipt
from kiosk_agent.service.errors import ServiceError
from kiosk_agent.tasks import BackgroundTask

_LOGGER = logging.getLogger(__name__)

CHANGE_GAP = 1.0  # seconds between two reports sent at once for a change
TROUBLE_GRACE = 30.0  # seconds an upstream may fail before health shows it (at most interval)
STOPPED = "stopped"  # the status of a clean stop's last report (entities.STATUS_OPTIONS)


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
    return f"http://{host}:{admin.get('port', ADMIN_PORT)}/"


class Upstream:
    """The `upstream:` component: a heartbeat every `interval` (each unit's own, jittered) to
    each configured sink, and at once when something a person must act on changes."""

    def __init__(
        self,
        agent: Any,
        conf: dict[str, Any],
        *,
        change_gap: float = CHANGE_GAP,
        births: BirthPolicy | None = None,
        rng: random.Random | None = None,
        clock: Clock | None = None,
    ) -> None:
        """Every wait runs on ``clock``'s monotonic time (default: the agent's, else the
        machine's): the heartbeat schedule, the first report's settling, and the MQTT sink's
        reconnect back-off, birth policy and log limit."""
        clock = clock or getattr(agent, "clock", None) or SYSTEM_CLOCK
        conf = UPSTREAM_SCHEMA(conf)
        self._health: Health = agent.health
        self.device_id: str = conf.get("device_id") or host_device_id()
        self._interval: float = conf["interval"]
        self._jitter: float = conf["jitter"]
        self._start_grace: float = conf["start_grace"]
        self._change_gap = change_gap
        self._rng = rng or random.Random()
        self._clock = clock
        self.sinks: list[Sink] = []
        self.mqtt: MqttSink | None = None
        if "http" in conf:
            self.sinks.append(HttpSink(conf["http"], conf["queue_size"]))
        if "mqtt" in conf:
            self.mqtt = MqttSink(
                conf["mqtt"],
                self.device_id,
                self._health.version,
                discovery_options(agent, conf),
                births=births or BirthPolicy(spread=conf["mqtt"]["announce_spread"]),
                rng=self._rng,
                clock=clock,
            )
            self.sinks.append(self.mqtt)
            if conf["commands"]:
                self.mqtt.on_command = self._on_command
        self._agent = agent
        self._request_restart: Callable[[], str | None] = request_graceful_restart
        self._command_tasks: set[asyncio.Task[None]] = set()
        # (key, outcome), newest last; the last hundred (a client may press for ever)
        self.commands_done: deque[tuple[str, str]] = deque(maxlen=100)
        self._commands_running: set[str] = set()  # one of each at a time
        self._restart_asked = False  # the restart's stopping signal is sent once
        self.command_errors = 0  # unexpected errors in a command (a bug): counted in health
        # a destination failing this long is a problem: a broker restart (every unit back
        # within seconds) is not, a refused password is, within one interval
        trouble_grace = min(self._interval, TROUBLE_GRACE)
        self._health.count_errors_of("upstream commands", lambda: self.command_errors)
        for sink in self.sinks:
            self._health.count_errors_of(f"upstream {sink.name}", lambda s=sink: s.unexpected)
            self._health.report_problem_of(f"upstream {sink.name}",
                                           lambda s=sink: s.trouble(trouble_grace))
        self._loop = BackgroundTask(self._run, "upstream-heartbeat")
        self.heartbeats = 0
        self.prompt_heartbeats = 0  # sent at once for a change, not on the schedule
        self.first_report_waited_s: float | None = None
        self._recovery: Any = getattr(agent, "recovery", None)
        self._sales: Any = getattr(agent, "events", None)  # the sale event bus, when there is one
        self._sales_runner: Any = getattr(agent, "sales", None)  # says when the stop began
        self._changed = asyncio.Event()
        self._unfollow: Callable[[], None] | None = None
        self._told: tuple[str, tuple[str, ...]] | None = None  # status and problems last sent
        self._last_beat = -math.inf
        self._last_report: dict[str, Any] | None = None
        self._available: dict[str, bool] = {}

    async def start(self) -> None:
        for sink in self.sinks:
            await sink.start()
        self._unfollow = self._health.on_change(self._changed.set)
        self._loop.start()

    async def stop(self) -> None:
        """The last report says the unit stopped (retained: what the broker keeps until the
        next start), then each sink says goodbye (MQTT: ``offline``)."""
        if self._unfollow is not None:
            self._unfollow()
        for task in list(self._command_tasks):
            task.cancel()
        await self._loop.stop()
        if self.heartbeats:  # a unit that never reported keeps the last run's word
            stopped = self.final_report()
            for sink in self.sinks:
                sink.queue.put(stopped)
        # together: the stop waits for the slowest goodbye (sink.GOODBYE_TIMEOUT), not their sum
        outcomes = await asyncio.gather(*(sink.stop() for sink in self.sinks),
                                        return_exceptions=True)
        for sink, outcome in zip(self.sinks, outcomes, strict=True):
            if isinstance(outcome, Exception):
                _LOGGER.error("upstream %s failed to stop", sink.name, exc_info=outcome)

    def final_report(self) -> dict[str, Any]:
        """A clean stop's report: ``stopped``, the time it stopped, and the problems of the
        last report before the stop (the links closing, the terminals let go are the stop, not
        faults: a journal that took no writes before it still did not)."""
        report = build_report(self.device_id, self._health.snapshot(), self._interval)
        last = self._last_report or report
        report.update(status=STOPPED, problems=last["problems"],
                      out_of_service=last["out_of_service"], stopped=iso(self._clock.time()))
        return report

    def _stopping(self) -> bool:
        """The agent's stop has begun: what changes now (links closed) is no news to report."""
        return bool(getattr(self._sales_runner, "stopping", False))

    async def _run(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            if self._sales is not None and self.mqtt is not None:
                # a listener, in publish: a queue would lose the oldest steps under a burst,
                # and with them an attention alert, without a word
                stack.callback(self._sales.listen(self._alert_on_attention))
            await self._settle()
            while True:
                self._changed.clear()
                if not self._stopping():
                    self.heartbeat()
                await self._until_next_beat()

    async def _until_next_beat(self) -> None:
        """The unit's next scheduled beat, or sooner when what a person must act on changed
        (a sale into attention, a terminal out of service, a link down): at once, but at most
        one such report per ``change_gap``, so a flapping part does not flood the broker."""
        clock = self._clock
        deadline = clock.monotonic() + jittered(self._interval, self._jitter, self._rng)
        while (remaining := deadline - clock.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):  # (a stop's cancellation goes through)
                await clock.wait_for(self._changed.wait(), remaining)
            self._changed.clear()
            if self._stopping():
                continue  # the stop's own report (final_report) says it
            if self._told is not None and _must_tell(self._health.snapshot()) != self._told:
                await clock.sleep(max(0.0, self._last_beat + self._change_gap - clock.monotonic()))
                self.prompt_heartbeats += 1
                return

    def _alert_on_attention(self, event: Any) -> None:
        """A sale that goes into attention, or whose step could not be written, fires Home
        Assistant's Alert event."""
        needs_a_look = str(getattr(event, "state", "")) == "attention" or getattr(
            event, "unwritten", False
        )
        if needs_a_look and not getattr(event, "receipt", False):
            if self.mqtt is None:
                raise RuntimeError("an MQTT event without an MQTT connection")
            self.mqtt.publish_event(
                EVENT_SALE_ATTENTION,
                sale_id=event.sale_id,
                terminal=event.terminal,
                amount_cents=event.amount_cents,
                reason=redact(event.message),  # it leaves the unit: the last safety net
                at=iso(event.at or self._clock.time()),
            )

    async def _settle(self) -> None:
        """Before the first report: wait for the links, first checks and recovery of the sales
        a crash left open, or the start grace; what is still settling then is reported."""
        started = self._clock.monotonic()
        deadline = started + max(0.0, self._start_grace - self._health.uptime)
        while True:
            pending = self._health.settling()
            if self._recovery is not None and getattr(self._recovery, "state", "") == "running":
                pending.append("recovery")
            if not pending:
                break
            if self._clock.monotonic() >= deadline:
                _LOGGER.info(
                    "upstream: first report after the start grace; still settling: %s",
                    ", ".join(pending),
                )
                break
            await self._clock.sleep(0.05)
        self.first_report_waited_s = round(self._clock.monotonic() - started, 3)

    def heartbeat(self) -> dict[str, Any]:
        """Queue one report on every sink and wake them; returns the report."""
        snapshot = self._health.snapshot()
        report = build_report(self.device_id, snapshot, self._interval)
        for sink in self.sinks:
            sink.queue.put(report)
            sink.wake()
        self.heartbeats += 1
        self._last_report = report
        self._told = _must_tell(snapshot)
        self._last_beat = self._clock.monotonic()
        self._tell_availability(snapshot)
        return report

    def _tell_availability(self, snapshot: HealthSnapshot) -> None:
        """A terminal out of (or back in) service fires Home Assistant's Alert event; one that
        waits for the agent's start, and its first time in service, fire none."""
        for state in snapshot.availability:
            before = self._available.get(state.device_id, True)
            self._available[state.device_id] = state.available or state.starting
            if self.mqtt is None or before == self._available[state.device_id]:
                continue
            kind = EVENT_BACK_IN_SERVICE if state.available else EVENT_OUT_OF_SERVICE
            self.mqtt.publish_event(
                kind, terminal=state.device_id, reason=state.reason, at=iso(state.since)
            )

    # -- commands from Home Assistant (upstream.commands) ---------------------------------------

    def _on_command(self, key: str, payload: bytes) -> None:
        """A command on the unit's own topic: done in a task of its own (the MQTT loop goes on
        hearing), logged with who asked and what came of it."""
        if self.mqtt is None:
            raise RuntimeError("an MQTT event without an MQTT connection")
        topic = command_topic(self.mqtt.base_topic, key)
        try:
            by = asked_by(payload)
        except NotAPress as err:
            _LOGGER.warning("upstream mqtt: command %s on %s ignored: %s", key, topic, err)
            return
        if key in self._commands_running:  # pressed again before it was done: once is enough
            return
        _LOGGER.info("upstream mqtt: command %s on %s by %s", key, topic, redact(by))
        self._commands_running.add(key)
        task = asyncio.ensure_future(self._run_command(key))
        self._command_tasks.add(task)
        task.add_done_callback(self._command_tasks.discard)

    async def _run_command(self, key: str) -> None:
        try:
            outcome = await self._command(key)
        except (ActionRefused, ServiceError) as err:
            outcome = f"failed: {err}"
        except Exception:  # a bug: logged, counted in health; the unit goes on
            self.command_errors += 1
            _LOGGER.exception("upstream mqtt: command %s failed unexpectedly", key)
            outcome = "failed unexpectedly"
        self._commands_running.discard(key)
        self.commands_done.append((key, outcome))
        level = logging.INFO if outcome.startswith("done") else logging.WARNING
        _LOGGER.log(level, "upstream mqtt: command %s %s", key, redact(outcome))

    async def _command(self, key: str) -> str:
        """What the command does; its outcome in words (``done...``, ``refused: ...``)."""
        sales = self._sales_runner
        if key == RESTART:
            return self._restart()
        terminals = self.mqtt._discovery.terminals if self.mqtt is not None else ()
        device_id = terminal_commanded(key, terminals)
        service = getattr(self._agent, "service", None)
        if device_id is None or service is None:
            return f"refused: no such command {key!r}"
        if key.startswith(PING):
            answer = await ping_terminal(self._agent, service, device_id)
            return f"done: {device_id} {'online' if answer.online else 'offline'}"
        busy = sales.busy_reason(device_id) if sales is not None else None
        if busy:
            return f"refused: {device_id} busy ({busy})"
        trans_id = await print_test_receipt(self._agent, service, device_id)
        return f"done: {device_id} printed the receipt of {trans_id}"

    def _restart(self) -> str:
        """The graceful stop a stopping signal starts (the drain: new sales refused, the sales
        in progress heard to their end), then the restart. Asked once: a second stopping
        signal would end the drain and park the sale a customer is being served."""
        sales = self._sales_runner
        if self._restart_asked or getattr(sales, "stopping", False):
            return "refused: the agent is already stopping (its drain goes on)"
        refused = self._request_restart()
        if refused:
            return f"refused: {refused}"
        self._restart_asked = True
        running = [r.sale_id for r in getattr(sales, "running", [])]
        if not running:
            return "done: graceful stop begun (restart)"
        settings = getattr(self._agent, "settings", None)
        within = getattr(settings, "stop_timeout", None)
        bound = f" (within sales.stop_timeout, {within:g} s)" if within else ""
        return (f"done: draining, then restart: new sales refused, sale {', '.join(running)} "
                f"in progress finishes first{bound}")

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


# Figures that move without news: a time left ("API key expires in 3600 s" counts down) and
# the counts of one caught bug repeating. Ids (SIM-0001) and counts of sales stay: a second
# sale into attention, or another terminal out of service, is news.
_TICKING = re.compile(r"\d+(\.\d+)? ?m?s\b")
_REPEATING = "unexpected errors"


def _must_tell(snapshot: HealthSnapshot) -> tuple[str, tuple[str, ...]]:
    """What a person must act on: the status and the problems, their ticking figures left
    out."""
    problems = tuple(sorted(
        re.sub(r"\d+", "#", p) if p.startswith(_REPEATING) else _TICKING.sub("#", p)
        for p in snapshot.problems
    ))
    return str(snapshot.status), problems


def discovery_options(agent: Any, conf: dict[str, Any]) -> DiscoveryOptions:
    """Home Assistant's view of this unit, from the upstream section and the agent."""
    settings = getattr(agent, "settings", None)
    terminals: dict[str, str] = dict(getattr(settings, "terminals", None) or {})
    return DiscoveryOptions(
        # three heartbeats missed (with their jitter): the unit is frozen even if its
        # connection is open
        expire_after=max(1, math.ceil(round(3 * conf["interval"] * (1 + conf["jitter"]), 3))),
        configuration_url=configuration_url(agent, conf),
        currency=str(getattr(settings, "currency", "USD")),
        name=conf.get("name"),
        suggested_area=conf.get("suggested_area"),
        serial_number=conf.get("serial_number"),
        model=conf.get("model", DEFAULT_MODEL),
        model_id=conf.get("model_id"),
        hw_version=conf.get("hw_version") or board_name(),
        mac=network_mac(),
        home_assistant=conf.get("home_assistant", OLDEST_HOME_ASSISTANT),
        support_url=conf.get("support_url"),
        terminals=tuple(terminals.items()),
        audit="dex" in (getattr(getattr(agent, "config", None), "data", None) or {}),
        commands=conf["commands"],
    )


def host_device_id() -> str:
    """The default ``upstream.device_id``: the host name in the characters a device id allows
    (``topics.DEVICE_ID``: ASCII letters, digits, - and _), each other one ``_``."""
    name = "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "_"
                   for c in socket.gethostname())
    return name or "kiosk"


def board_name(path: Path = Path("/proc/device-tree/model")) -> str | None:
    """The board's own name where its firmware gives one ("Raspberry Pi 4 Model B Rev 1.4")."""
    try:
        name = path.read_bytes().rstrip(b"\x00").decode("ascii", "replace").strip()
    except OSError:
        return None
    return name[:64] or None


def network_mac(net: Path = Path("/sys/class/net")) -> str | None:
    """The MAC address of the unit's first network interface (by name) that has one: Home
    Assistant's "mac" connection, which merges the unit with what else knows the device."""
    try:
        interfaces = sorted(p for p in net.iterdir() if p.name != "lo")
    except OSError:
        return None
    for interface in interfaces:
        try:
            mac = (interface / "address").read_text().strip().lower()
        except OSError:
            continue
        if re.fullmatch(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", mac) and mac != "00:00:00:00:00:00":
            return mac
    return None
