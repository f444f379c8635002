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
import functools
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from kiosk_agent.fleet.entities import STATUS_OPTIONS
from kiosk_agent.fleet.mqtt import passing_client_id
from kiosk_agent.fleet.topics import DEFAULT_TOPIC_PREFIX, DEVICE_ID, OFFLINE, ONLINE
from kiosk_agent.fleet.wire import Visit, visit
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
    collector = _Collector(marker, found)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    # its own client id: reusing a unit's (or another listing's) would disconnect it; a
    # read-only visit framed here (fleet.wire): through aiomqtt, 20,000 messages were over
    # a second of CPU
    link = await visit(conf, client_id, collector.heard, within=max(wait, 5.0))
    try:
        marked = await _marker_comes_back(link, collector, min(1.0, wait))
        # One SUBSCRIBE for all: a second one's SUBACK would queue behind every retained
        # message of the first (80 MB of foreign payloads outlasted the 5 s client timeout).
        # At QoS 0, as the marker: subscribed at QoS 1, the marker came back before the last
        # of the reports units keep at QoS 1 (15,481 of 20,000 messages, "complete"); QoS 0
        # keeps one order, and no acknowledgement per message.
        await _within(link.subscribe([(pattern, 0) for pattern in patterns]), deadline)
        if marked:
            link.publish(marker, b"end")
            await asyncio.wait((collector.ended, link.lost),
                               timeout=max(0.0, deadline - loop.time()),
                               return_when=asyncio.FIRST_COMPLETED)
        else:  # the broker has handed all it keeps once it has been quiet for ``quiet``
            while not link.lost.done() and (left := deadline - loop.time()) > 0:
                if (quiet_left := collector.last_heard + quiet - loop.time()) <= 0:
                    break
                await asyncio.wait((link.lost,), timeout=min(quiet_left, left))
        if link.lost.done():
            link.lost.result()  # raises why the broker closed it
    finally:
        link.close()
    found.complete = collector.ended.done() or not marked
    return found


async def _within(call: Any, deadline: float) -> None:
    """``call``, or TimeoutError at ``deadline`` (the loop's time)."""
    async with asyncio.timeout_at(max(deadline, asyncio.get_running_loop().time() + 1.0)):
        await call


class _Collector:
    """Keeps each retained message handed over (its payload read once, as text) until the
    end marker comes back; the probe that checks the marker can come back at all first."""

    def __init__(self, marker: str, found: Retained) -> None:
        self._loop = asyncio.get_running_loop()
        self._marker = marker
        self._found = found
        self.probed: asyncio.Future[None] = self._loop.create_future()
        self.ended: asyncio.Future[None] = self._loop.create_future()
        self.last_heard = self._loop.time()

    def heard(self, topic: str, payload: bytes, retained: bool) -> None:
        self.last_heard = self._loop.time()
        if topic == self._marker:
            said = self.ended if payload == b"end" else self.probed  # (a late probe is no end)
            if not said.done():
                said.set_result(None)
        elif retained and payload:
            self._found[topic] = _payload_text(payload)


async def _marker_comes_back(link: Visit, collector: _Collector, within: float) -> bool:
    """Whether a message this client publishes to the marker reaches it (an ACL may refuse
    the publish or the read, without a word)."""
    await _within(link.subscribe([(collector._marker, 0)]), asyncio.get_running_loop().time()
                  + within)
    link.publish(collector._marker, b"probe")
    await asyncio.wait((collector.probed, link.lost), timeout=within,
                       return_when=asyncio.FIRST_COMPLETED)
    return collector.probed.done()


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
        started, started_iso = sales.get("day_started_at"), sales.get("day_started")
        if not isinstance(started, int | float) or now >= _next_midnight(
            started, started_iso if isinstance(started_iso, str) else None
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


@functools.lru_cache(maxsize=64)  # a fleet's reports share a few day starts
def _next_midnight(started: float, started_iso: str | None) -> float:
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
    defect = (_control_in(report, "") if _may_hold_control(payload) else None) or _wrong_type(
        report)
    return (None, defect) if defect else (report, None)


# a JSON escape: \uXXXX, or a backslash and the one character it escapes
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|(.))")


def _may_hold_control(payload: str) -> bool:
    """Whether a string of the parsed ``payload`` may hold a control character: only when
    its text holds one (str.isprintable is False for every Cc and Cf character) or an escape
    may make one. A unit's report has neither, and is not walked string by string (a second
    a thousand reports)."""
    if not payload.isprintable():
        return True
    for code, char in _ESCAPE.findall(payload):
        if char:
            if char in "bfnrt":
                return True
        elif 0xD800 <= (point := int(code, 16)) <= 0xDFFF or control_character(chr(point)):
            return True  # a surrogate pair may make an invisible tag character
    return False


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
_SALES_COUNTS = ("today_count", "today_amount_cents", "open", "attention", "attention_cents",
                 "late_vends", "maybe_dispensed", "today_given_back_count",
                 "today_given_back_cents")
_SALES: dict[str, tuple[Any, str]] = {
    **{name: (_count, "a whole number, 0 or more") for name in _SALES_COUNTS},
    "day_started_at": (_unix_time, "a Unix time"),
}
_SERVICE: dict[str, tuple[Any, str]] = {
    "reachable": (_flag, "true, false or null"),
    "key_expires_in_s": (_maybe(_number), "a number of seconds"),
}
# (where, its rules): the report, then its sales and service objects
_RULES: tuple[tuple[str, dict[str, tuple[Any, str]]], ...] = (
    ("", _FIELDS), ("sales", _SALES), ("service", _SERVICE))


def _wrong_type(report: dict[str, Any]) -> str | None:
    """The first field of the wrong type, in words (the rules are made once, at import)."""
    for where, rules in _RULES:
        holder = report.get(where) if where else report
        if not isinstance(holder, dict):
            continue  # absent (an older unit), or itself named by the report's own rule
        for key, (accepts, should_be) in rules.items():
            if key in holder and not accepts(holder[key]):
                name = f"{where}.{key}" if where else key
                shown = json.dumps(holder[key])  # JSON escapes every control character
                shown = shown if len(shown) <= 40 else f"{shown[:40]}..."
                return f"its report's {name} is {shown}, not {should_be}"
    return None
