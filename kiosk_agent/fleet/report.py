"""The heartbeat body, built from the health snapshot through an allow-list of fields.

A report can only carry what the health model holds (counts, cents, states, device ids), never a
card number, token or key.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from kiosk_agent.core.health import HealthSnapshot


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

