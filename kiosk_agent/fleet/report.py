"""The heartbeat body, built from the health snapshot through an allow-list of fields.

A report can only carry what the health model holds (counts, cents, states, device ids), never a
card number, token or key.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from kiosk_agent.health.model import UNIX_TIMES, HealthSnapshot
from kiosk_agent.moments import timestamp


def build_report(
    device_id: str, snapshot: HealthSnapshot, interval: float | None = None
) -> dict[str, Any]:
    """The heartbeat body: the health snapshot's fields, nothing else.

    Times for people and Home Assistant's timestamp sensors are ISO 8601 in UTC
    (``started``, ``reported``, ``service.key_expires``, ``sales.day_started``: the UTC midnight
    the day's figures count from); ``at`` stays Unix time. ``interval_s`` tells a reader when
    the next report is due (``fleet list`` marks a unit stale after three). The health
    model's other times stay Unix seconds here (``UNIX_TIMES``): the fleet's readers count
    with them.
    """
    sales = snapshot.sales.model_dump(mode="json", context=UNIX_TIMES)
    # Home Assistant's last_reset of the daily amount
    sales["day_started"] = iso(snapshot.sales.day_started_at)
    service = snapshot.service.model_dump(mode="json", context=UNIX_TIMES)
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
        "service": service,
        "sales": sales,
        "terminals": [t.model_dump(mode="json", context=UNIX_TIMES) for t in snapshot.terminals],
        "terminals_online": sum(1 for t in snapshot.terminals if t.online),
        "terminal_states": terminal_states(snapshot),
        "links": [link.model_dump(mode="json", context=UNIX_TIMES) for link in snapshot.links],
        "journal": snapshot.journal.model_dump(mode="json", context=UNIX_TIMES),
        # the unit's own id (in its order ids), the machine its journal was made on, a clone
        "unit": snapshot.unit.model_dump(mode="json", context=UNIX_TIMES),
        "availability": [a.model_dump(mode="json", context=UNIX_TIMES)
                         for a in snapshot.availability],
        "out_of_service": [a.device_id for a in snapshot.availability
                           if not a.available and not a.starting],
        "starting": [a.device_id for a in snapshot.availability if a.starting],
        "audit": audit_state(snapshot),
    }


def audit_state(snapshot: HealthSnapshot) -> dict[str, Any] | None:
    """The machine's books (a `dex:` section): columns low, a mismatch, the last read."""
    audit = snapshot.audit
    if audit is None:
        return None
    return {
        "columns_low": len(audit.low) + len(audit.sold_out),
        "low": audit.low,
        "sold_out": audit.sold_out,
        "mismatch": bool(audit.mismatches),
        "mismatches": audit.mismatches,
        "not_compared": audit.not_compared,
        "books_reset": audit.books_reset,
        "last_read": iso(audit.last_read_at) if audit.last_read_at is not None else None,
        "last_outcome": audit.last_outcome,
    }


def terminal_states(snapshot: HealthSnapshot) -> dict[str, dict[str, Any]]:
    """Per terminal: online (None: not checked yet), in service (``available``) and whether it
    takes a card now (``takes_cards``: in service and not held by recovery after a restart,
    whose sale there is refused), with why not (``reason``, "" when it does) and until when
    (``until``, ISO 8601 UTC, while recovery listens for a vend a restart left; else None)."""
    availability = {a.device_id: a for a in snapshot.availability}
    states: dict[str, dict[str, Any]] = {}
    for device_id in sorted({t.device_id for t in snapshot.terminals} | set(availability)):
        terminal = next((t for t in snapshot.terminals if t.device_id == device_id), None)
        state = availability.get(device_id)
        held = state is not None and state.available and bool(state.recovering)
        until = state.recovering_until if held and state is not None else None
        states[device_id] = {
            "online": terminal.online if terminal is not None else None,
            "available": state.available if state is not None else None,
            "takes_cards": state.takes_cards if state is not None else None,
            "reason": (state.recovering if held else state.reason) if state is not None else "",
            "until": iso(until) if until is not None else None,
        }
    return states


def iso(unix_time: float) -> str:
    """Unix time as ISO 8601 UTC to the second, as every time the agent writes in JSON."""
    return timestamp(dt.datetime.fromtimestamp(unix_time, dt.UTC))
