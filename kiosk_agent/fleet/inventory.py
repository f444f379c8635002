"""The fleet as the broker holds it: every unit's retained state and availability.

``kiosk-agent fleet list`` and ``fleet show`` read these; nothing here talks to a unit. A broker
hands every retained message of a subscription right after it (MQTT 3.1.1, 3.3.1.3), so the
collection ends once the broker has been quiet for ``quiet`` seconds (or after ``wait``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from kiosk_agent.fleet.mqtt import mqtt_client
from kiosk_agent.fleet.topics import DEVICE_ID, OFFLINE, ONLINE

STALE_AFTER_BEATS = 3  # a unit whose report is older than this many intervals is "stale"


async def retained(
    conf: dict[str, Any], patterns: list[str], *, wait: float, quiet: float = 0.3
) -> dict[str, str]:
    """Every retained, non-empty message on ``patterns``: topic -> payload (text)."""
    found: dict[str, str] = {}
    # its own client id: reusing a unit's would disconnect it
    async with mqtt_client(conf, f"kiosk-agent-fleet-{os.getpid()}", timeout=max(wait, 5.0)) as c:
        for pattern in patterns:
            await c.subscribe(pattern, qos=1)
        deadline = time.monotonic() + wait
        messages = aiter(c.messages)
        while (left := deadline - time.monotonic()) > 0:
            try:
                message = await asyncio.wait_for(anext(messages), min(quiet, left))
            except TimeoutError:
                break  # the broker has handed everything it keeps
            payload = message.payload
            text = payload.decode(errors="replace") if isinstance(payload, bytes) else ""
            if message.retain and text:
                found[str(message.topic)] = text
    return found


@dataclass(frozen=True, slots=True)
class Unit:
    """One unit as its retained topics tell it."""

    device_id: str
    availability: str  # online, offline, or "" (never said)
    report: dict[str, Any] | None  # its last report, None when none is kept

    @property
    def last_seen(self) -> float | None:
        at = (self.report or {}).get("at")
        return float(at) if isinstance(at, int | float) else None

    def status(self, now: float) -> str:
        """``offline`` (its will or goodbye), ``stale`` (reports stopped), else its own."""
        if self.availability == OFFLINE:
            return OFFLINE
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
        if not isinstance(started, int | float) or now - started >= 86400 + 3600:
            return None
        return int(sales.get("today_count", 0)), int(sales.get("today_amount_cents", 0))

    def summary(self, now: float) -> dict[str, Any]:
        report = self.report or {}
        sales = self.sales_today(now)
        return {
            "device_id": self.device_id,
            "status": self.status(now),
            "online": self.availability == ONLINE,
            "problems": list(report.get("problems") or []),
            "last_seen": self.last_seen,
            "sales_today": sales[0] if sales else None,
            "sales_today_cents": sales[1] if sales else None,
            "version": report.get("version"),
        }


def units(topic_prefix: str, found: dict[str, str]) -> list[Unit]:
    """The units among ``<topic_prefix>/<device_id>/{state,availability}``, by device id."""
    reports: dict[str, dict[str, Any] | None] = {}
    availability: dict[str, str] = {}
    for topic, payload in found.items():
        head, _, leaf = topic.rpartition("/")
        prefix, _, device_id = head.rpartition("/")
        if prefix != topic_prefix or not DEVICE_ID.match(device_id):
            continue
        if leaf == "availability":
            availability[device_id] = payload
        elif leaf == "state":
            reports[device_id] = _report(payload)
    ids = sorted(set(reports) | set(availability))
    return [Unit(i, availability.get(i, ""), reports.get(i)) for i in ids]


def _report(payload: str) -> dict[str, Any] | None:
    with contextlib.suppress(ValueError):
        report = json.loads(payload)
        if isinstance(report, dict):
            return report
    return None  # a foreign or broken payload: the unit is listed, its report unknown
