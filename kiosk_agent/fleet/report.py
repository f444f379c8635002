"""The heartbeat body, built from the health snapshot through an allow-list of fields.

A report can only carry what the health model holds (counts, cents, states, device ids), never a
card number, token or key.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import zoneinfo
from pathlib import Path
from typing import Any

from kiosk_agent.core.health import HealthSnapshot


def build_report(
    device_id: str, snapshot: HealthSnapshot, interval: float | None = None
) -> dict[str, Any]:
    """The heartbeat body: the health snapshot's fields, nothing else.

    Times for people and Home Assistant's timestamp sensors are ISO 8601 with the offset
    (``started``, ``reported``, ``service.key_expires``, ``sales.day_started``); ``at`` stays
    Unix time. ``interval_s`` tells a reader when the next report is due (``fleet list`` marks
    a unit stale after three).
    """
    sales = snapshot.sales.model_dump(mode="json")
    # Home Assistant's last_reset of the daily amount
    sales["day_started"] = iso(snapshot.sales.day_started_at)
    service = snapshot.service.model_dump(mode="json")
    expires = snapshot.service.key_expires_at
    service["key_expires"] = iso(expires) if expires is not None else None
    return {
        "device_id": device_id,
        "version": snapshot.version,
        "status": str(snapshot.status),
        "problems": snapshot.problems,
        "at": snapshot.at,
        "reported": iso(snapshot.at),
        "started": iso(snapshot.started_at),
        "uptime_s": snapshot.uptime_s,
        "interval_s": interval,
        # the unit's zone by name: when its day ends (a DST day is 23 or 25 hours)
        "time_zone": local_zone_name(),
        "service": service,
        "sales": sales,
        "terminals": [t.model_dump(mode="json") for t in snapshot.terminals],
        "terminals_online": sum(1 for t in snapshot.terminals if t.online),
        "terminal_states": terminal_states(snapshot),
        "links": [link.model_dump(mode="json") for link in snapshot.links],
        "journal": snapshot.journal.model_dump(mode="json"),
        "availability": [a.model_dump(mode="json") for a in snapshot.availability],
        "out_of_service": [a.device_id for a in snapshot.availability if not a.available],
    }


def terminal_states(snapshot: HealthSnapshot) -> dict[str, dict[str, bool | None]]:
    """Per terminal: online (None: not checked yet) and whether it takes cards now."""
    available = {a.device_id: a.available for a in snapshot.availability}
    states: dict[str, dict[str, bool | None]] = {}
    for device_id in sorted({t.device_id for t in snapshot.terminals} | set(available)):
        terminal = next((t for t in snapshot.terminals if t.device_id == device_id), None)
        states[device_id] = {
            "online": terminal.online if terminal is not None else None,
            "available": available.get(device_id),
        }
    return states


def iso(unix_time: float) -> str:
    """Unix time as local ISO 8601 with its offset, to the second."""
    return dt.datetime.fromtimestamp(unix_time).astimezone().isoformat(timespec="seconds")


def local_zone_name(
    localtime: Path = Path("/etc/localtime"), timezone: Path = Path("/etc/timezone")
) -> str | None:
    """This machine's time zone by its IANA name (``America/New_York``): ``TZ``, else the
    zone ``/etc/localtime`` links to, else ``/etc/timezone``; None when none names a zone."""
    candidates = [os.environ.get("TZ", "").lstrip(":")]
    with contextlib.suppress(OSError):
        candidates.append(str(localtime.resolve()).partition("zoneinfo/")[2])
    with contextlib.suppress(OSError):
        candidates.append(timezone.read_text().strip())
    for name in candidates:
        if name and zone(name) is not None:
            return name
    return None


def zone(name: str) -> zoneinfo.ZoneInfo | None:
    """The zone called ``name``; None for a name that is none (or a path, or garbage)."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError, OSError):
        return None
