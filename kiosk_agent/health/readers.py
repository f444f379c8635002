"""How many readers can take cards now, in words: the status page's and ``kiosk-agent
health``'s one reading of a health snapshot (a dict, as the admin API sends it).

Apart from the page (``admin/page.py``, which imports aiohttp's server): ``health`` asks the
agent over a plain socket and must not import a web server to say "2 of 2 readers".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def availability(snapshot: dict[str, Any]) -> dict[str, Any]:
    """How many readers can take cards now, and which cannot and why: the agent's own
    out-of-service decision per terminal (``health.availability``, in the health snapshot), and a
    terminal whose checks fail while it is held in service a moment longer (the hold-off: one
    lost ping must not take a reader off the bus) counted as one that cannot, with its trouble:
    "2 of 2 can take cards" beside an OFFLINE terminal would be a lie for that moment.
    A terminal out while the agent starts says so (``starting``, its reason "starting: ...").
    A terminal in service that recovery holds after a restart (``recovering``: a sale the last
    stop or crash left open on it) takes no new sale meanwhile, and is one that cannot, saying
    what recovery does there and until when (``until``: Unix time, or None when not known).
    ``level`` is ``ok`` when all can, ``degraded`` when some cannot, ``down`` when none can."""
    states = snapshot.get("availability") or []
    names = {t["device_id"]: t.get("name") for t in snapshot.get("terminals", [])}
    out = [s for s in states if not takes_cards(s) or s.get("failing")]
    able = len(states) - len(out)
    if not states:
        return {"available": False, "level": "down", "summary": "no reader checked yet",
                "reason": "no terminal checked yet", "able": 0, "total": 0, "cannot": [],
                "terminals": states}  # fmt: skip
    cannot = [
        {
            "device_id": s["device_id"],
            "name": names.get(s["device_id"]),
            "reason": _cannot_reason(s),
            "since": s.get("since") if not s.get("available") else None,
            "starting": bool(s.get("starting")),
            "until": s.get("recovering_until") if held_by_recovery(s) else None,
        }
        for s in out
    ]
    readers = "reader" if len(states) == 1 else "readers"
    return {
        "available": able > 0,
        "level": "ok" if not out else "degraded" if able else "down",
        "summary": f"{able} of {len(states)} {readers} can take cards",
        "reason": "; ".join(f"{c['device_id']}: {c['reason']}" for c in cannot),
        "able": able,
        "total": len(states),
        "cannot": cannot,
        "terminals": states,
    }


def takes_cards(state: Mapping[str, Any]) -> bool:
    """``AvailabilityHealth.takes_cards`` of a terminal's availability as the snapshot holds it
    (a dict): in service and not held by recovery. The page, its event log and ``kiosk-agent
    health`` read it here, none its own. A state naming no ``available`` (the model always
    names it) is read as out of service: never said to take cards on a guess."""
    return bool(state.get("available")) and not state.get("recovering")


def held_by_recovery(state: Mapping[str, Any]) -> bool:
    """In service, but held by recovery: what it does there is why it cannot take cards."""
    return bool(state.get("available")) and bool(state.get("recovering"))


def _cannot_reason(state: dict[str, Any]) -> str:
    if held_by_recovery(state):
        return str(state["recovering"])
    if state.get("available"):
        return f"{state['failing']} (checked again before it is taken out of service)"
    reason = state.get("reason") or "unavailable"
    return f"starting: {reason}" if state.get("starting") else reason
