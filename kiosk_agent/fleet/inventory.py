"""The fleet as the broker holds it: every unit's retained state and availability.

``kiosk-agent fleet list`` and ``fleet show`` read these; nothing here talks to a unit. A broker
hands every retained message of a subscription right after it (MQTT 3.1.1, 3.3.1.3), so the
collection ends once the broker has been quiet for ``quiet`` seconds (or after ``wait``).

Any client of the broker can publish on a unit's topics, so what is found there is checked
before a person sees it: a report that is not JSON, has a field of the wrong type, holds a
control character (a terminal escape) or is larger than any real report makes its unit
``invalid``, with the defect as its problem; the rest of the fleet is listed as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import math
import time
from dataclasses import dataclass
from typing import Any

from kiosk_agent.fleet.entities import STATUS_OPTIONS
from kiosk_agent.fleet.mqtt import mqtt_client, passing_client_id
from kiosk_agent.fleet.topics import DEFAULT_TOPIC_PREFIX, DEVICE_ID, OFFLINE, ONLINE
from kiosk_agent.moments import timestamp
from kiosk_agent.text import control_character

STALE_AFTER_BEATS = 3  # a unit whose report is older than this many intervals is "stale"
INVALID = "invalid"  # the status of a unit whose retained report cannot be read
# A real report is a few KiB (a unit with 16 terminals: under 10 KiB); a bigger payload is
# foreign, and kept no longer than it takes to say so (the listing's memory stays bounded).
MAX_PAYLOAD_BYTES = 64 * 1024
_OVERSIZED = "\x00oversized:"  # what is kept instead; no report or availability starts so


class Retained(dict[str, str]):
    """Topic -> payload (text) of the retained messages found; ``complete`` is False when the
    broker had not handed all of them when the wait ran out (the end marker had not come)."""

    complete = True


async def retained(
    conf: dict[str, Any], patterns: list[str], *, wait: float, quiet: float = 0.3
) -> Retained:
    """Every retained, non-empty message on ``patterns``.

    A broker hands a subscription's retained messages right after its SUBACK, and then what is
    published later: a message sent to ourselves after subscribing marks their end (checked
    first: an ACL may refuse it). Without one, the collection ends once the broker has been
    quiet for ``quiet`` seconds: a guess that a busy broker defeats."""
    found = Retained()
    client_id = passing_client_id("fleet")
    marker = f"{conf.get('topic_prefix', DEFAULT_TOPIC_PREFIX)}/{client_id}/end"
    # its own client id: reusing a unit's (or another listing's) would disconnect it
    async with mqtt_client(conf, client_id, timeout=max(wait, 5.0)) as c:
        deadline = time.monotonic() + wait
        messages = aiter(c.messages)
        marked = await _marker_comes_back(c, messages, marker, min(1.0, wait))
        # one SUBSCRIBE for all: a second one's SUBACK would queue behind every retained
        # message of the first (80 MB of foreign payloads outlasted the 5 s client timeout)
        await c.subscribe([(pattern, 1) for pattern in patterns])
        if marked:
            await c.publish(marker, b"end", qos=0)  # no PUBACK to wait for behind them all
        ended = False
        while (left := deadline - time.monotonic()) > 0:
            try:
                message = await asyncio.wait_for(
                    anext(messages), left if marked and not ended else min(quiet, left)
                )
            except TimeoutError:
                break  # the broker has handed everything it keeps
            if str(message.topic) == marker:
                ended = ended or message.payload == b"end"  # (a late probe is not the end)
            elif message.retain and message.payload:
                found[str(message.topic)] = _payload_text(message.payload)
        found.complete = ended or not marked
    return found


async def _marker_comes_back(
    client: Any, messages: Any, marker: str, within: float
) -> bool:
    """Whether a message this client publishes to ``marker`` reaches it (an ACL may refuse
    the publish or the read, without a word)."""
    await client.subscribe(marker, qos=1)
    await client.publish(marker, b"probe", qos=0)
    try:
        message = await asyncio.wait_for(anext(messages), within)
    except TimeoutError:
        return False
    return str(message.topic) == marker


def _payload_text(payload: object) -> str:
    if not isinstance(payload, bytes | bytearray):
        return str(payload)
    if len(payload) > MAX_PAYLOAD_BYTES:
        return f"{_OVERSIZED}{len(payload)}"
    return bytes(payload).decode(errors="replace")


@dataclass(frozen=True, slots=True)
class Unit:
    """One unit as its retained topics tell it."""

    device_id: str
    availability: str  # online, offline, or "" (never said, or not one of those)
    report: dict[str, Any] | None  # its last report, None when none is kept or it is invalid
    defect: str | None = None  # what is wrong with what its topics hold

    @property
    def last_seen(self) -> float | None:
        at = (self.report or {}).get("at")
        return float(at) if isinstance(at, int | float) else None

    def status(self, now: float) -> str:
        """``offline`` (its will or goodbye), ``stale`` (reports stopped), else its own."""
        if self.availability == OFFLINE:
            return OFFLINE
        if self.defect is not None:
            return INVALID
        if self.report is None:
            return "unknown"
        interval = self.report.get("interval_s")
        seen = self.last_seen
        overdue = STALE_AFTER_BEATS * interval * 1.1 if isinstance(interval, int | float) else None
        if overdue is not None and seen is not None and now - seen > overdue:
            return "stale"
        return str(self.report.get("status", "unknown"))

    def sales_today(self, now: float) -> tuple[int, int] | None:
        """(count, cents) of the unit's day, None when its last report is of an earlier day."""
        sales = (self.report or {}).get("sales") or {}
        started = sales.get("day_started_at")
        if not isinstance(started, int | float) or now >= _next_midnight(
            started, sales.get("day_started")
        ):
            return None
        return int(sales.get("today_count", 0)), int(sales.get("today_amount_cents", 0))

    def summary(self, now: float) -> dict[str, Any]:
        report = self.report or {}
        sales = self.sales_today(now)
        seen = self.last_seen
        defects = [self.defect] if self.defect is not None else []
        return {
            "device_id": self.device_id,
            "status": self.status(now),
            "online": self.availability == ONLINE,
            "problems": defects + list(report.get("problems") or []),
            "last_seen": None if seen is None else _iso(seen),
            "sales_today": sales[0] if sales else None,
            "sales_today_cents": sales[1] if sales else None,
            "version": report.get("version"),
        }


def _iso(unix_time: float) -> str:
    """ISO 8601 UTC, as every timestamp the command line prints in JSON (moments.timestamp)."""
    return timestamp(dt.datetime.fromtimestamp(unix_time, dt.UTC))


def _next_midnight(started: float, started_iso: object) -> float:
    """When the unit's day that began at ``started`` ends: its next midnight, by the offset
    its report names (``day_started``: UTC, a day of 24 hours always; an older release's local
    offset); a report without one, by this machine's."""
    zone = None
    if isinstance(started_iso, str):
        with contextlib.suppress(ValueError):
            zone = dt.datetime.fromisoformat(started_iso).tzinfo
    began = dt.datetime.fromtimestamp(started, zone)  # naive local time when zone is None
    return dt.datetime.combine(began.date() + dt.timedelta(days=1), dt.time(),
                               began.tzinfo).timestamp()


def units(topic_prefix: str, found: dict[str, str]) -> list[Unit]:
    """The units among ``<topic_prefix>/<device_id>/{state,availability}``, by device id."""
    reports: dict[str, tuple[dict[str, Any] | None, str | None]] = {}
    availability: dict[str, str] = {}
    for topic, payload in found.items():
        head, _, leaf = topic.rpartition("/")
        prefix, _, device_id = head.rpartition("/")
        if prefix != topic_prefix or not DEVICE_ID.match(device_id):
            continue
        if leaf == "availability":
            availability[device_id] = payload
        elif leaf == "state":
            reports[device_id] = read_report(payload)
    return [_unit(i, availability.get(i, ""), *reports.get(i, (None, None)))
            for i in sorted(set(reports) | set(availability))]


def _unit(
    device_id: str, availability: str, report: dict[str, Any] | None, defect: str | None
) -> Unit:
    if availability not in ("", ONLINE, OFFLINE):
        defect = defect or f"its availability is {_shown(availability)}, not online or offline"
        availability = ""
    return Unit(device_id, availability, report, defect)


def read_report(payload: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the report, None) when it can be shown, else (None, what is wrong with it)."""
    if payload.startswith(_OVERSIZED):
        size = int(payload.removeprefix(_OVERSIZED))
        return None, f"its report is {size:,} bytes, more than {MAX_PAYLOAD_BYTES:,}"
    try:
        report = json.loads(payload)
    except (ValueError, RecursionError):
        return None, f"its report is not JSON: {_shown(payload)}"
    if not isinstance(report, dict):
        return None, f"its report is a JSON {type(report).__name__}, not an object"
    defect = _control_in(report, "") or _wrong_type(report)
    return (None, defect) if defect else (report, None)


def _shown(text: str, limit: int = 40) -> str:
    """Foreign text, quoted with its control characters escaped and cut to ``limit``."""
    shown = ascii(text[:limit])
    return shown if len(shown) <= limit + 2 and len(text) <= limit else f"{shown[:limit]}..."


def _control_in(value: object, path: str) -> str | None:
    """The first string (or key) holding a control character, named by where it is."""
    if isinstance(value, str):
        control = control_character(value)
        return f"a control character ({control}) in {path or 'its report'}" if control else None
    items: list[tuple[object, object]] = []
    if isinstance(value, dict):
        items = [(key, item) for key, item in value.items()]
        for key in value:
            if (control := control_character(str(key))) is not None:
                return f"a control character ({control}) in a key of {path or 'its report'}"
    elif isinstance(value, list):
        items = list(enumerate(value))
    for key, item in items:
        if (found := _control_in(item, f"{path}.{key}" if path else str(key))) is not None:
            return found
    return None


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _unix_time(value: object) -> bool:
    # from 1970 to 2242: a time outside is no clock's reading, and would make "last seen" lie
    return _number(value) and 0 <= value < 2**33  # type: ignore[operator]


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53


def _text_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _text(value: object) -> bool:
    return isinstance(value, str)


def _maybe(accepts: Any) -> Any:
    return lambda value: value is None or accepts(value)


def _flag(value: object) -> bool:
    return value is None or isinstance(value, bool)


def _records(**fields: Any) -> Any:
    """A list of objects whose ``fields`` (name -> accepts) each hold what they should."""
    def accepts(value: object) -> bool:
        return isinstance(value, list) and all(
            isinstance(v, dict) and all(ok(v.get(k)) for k, ok in fields.items()) for v in value
        )
    return accepts


# What `fleet list` and `fleet show` read from a report: field -> (accepts, what it should be).
# Absent fields are allowed (an older unit sends fewer); present ones must be right.
_FIELDS: dict[str, tuple[Any, str]] = {
    "status": (lambda v: v in STATUS_OPTIONS, f"one of {', '.join(STATUS_OPTIONS)}"),
    "problems": (_text_list, "a list of text"),
    "at": (_unix_time, "a Unix time"),
    "interval_s": (lambda v: v is None or (_number(v) and v > 0), "a number of seconds"),
    "uptime_s": (_number, "a number of seconds"),
    "version": (lambda v: v is None or isinstance(v, str), "text"),
    "sales": (lambda v: isinstance(v, dict), "an object"),
    "service": (lambda v: isinstance(v, dict), "an object"),
    "journal": (lambda v: isinstance(v, dict), "an object"),
    "unit": (lambda v: isinstance(v, dict), "an object"),
    "terminals": (_records(device_id=_text, online=_flag, latency_ms=_maybe(_number)),
                  "a list of terminals (device_id, online, latency_ms)"),
    "availability": (_records(device_id=_text, since=_maybe(_unix_time)),
                     "a list of terminals (device_id, since)"),
    "links": (_records(name=_text, state=_text), "a list of links (name, state)"),
}
_SALES_COUNTS = ("today_count", "today_amount_cents", "open", "attention")
_SERVICE: dict[str, tuple[Any, str]] = {
    "reachable": (_flag, "true, false or null"),
    "key_expires_in_s": (_maybe(_number), "a number of seconds"),
}


def _wrong_type(report: dict[str, Any]) -> str | None:
    checks = [(name, report, rule) for name, rule in _FIELDS.items()]
    sales = report.get("sales")
    if isinstance(sales, dict):
        checks += [(f"sales.{name}", sales, (_count, "a whole number, 0 or more"))
                   for name in _SALES_COUNTS]
        checks.append(("sales.day_started_at", sales, (_unix_time, "a Unix time")))
    service = report.get("service")
    if isinstance(service, dict):
        checks += [(f"service.{name}", service, rule) for name, rule in _SERVICE.items()]
    for name, holder, (accepts, should_be) in checks:
        key = name.rpartition(".")[2]
        if key in holder and not accepts(holder[key]):
            shown = json.dumps(holder[key])  # JSON escapes every control character
            shown = shown if len(shown) <= 40 else f"{shown[:40]}..."
            return f"its report's {name} is {shown}, not {should_be}"
    return None
