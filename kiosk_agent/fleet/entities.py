"""The entities a unit shows in Home Assistant: what each one reads from the report."""

from __future__ import annotations

from dataclasses import dataclass


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

