"""The `dex:` section's keys for the books: whose sales are the machine's, when reads come and
how failures back off, what each column holds. The link's keys (port, protocol, baudrate,
comm_id, deadline) are the link's (``audit/schema.py``); these are added to the same section
(docs/audit.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import voluptuous as vol

from kiosk_agent.audit.link_settings import DEADLINE

# The books' defaults, each written once (tests/config/test_defaults.py)
INTERVAL = 3600.0  # a read every hour
FIRST_READ = 30.0  # the first one this long after the start
RETRY_MIN = 30.0  # a failed read tried again after this, doubled each failure
RETRY_MAX = 1800.0  # up to this
CASHLESS_DEVICE = "DA"  # the unit is cashless device 1 on the machine's bus
LOW_STOCK = 2  # a column with this many left or fewer is low
MISMATCH_SHOWN = 86400.0  # a mismatch found stays a problem in health this long


def _capacities(value: Any) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise vol.Invalid("expected a map of column to capacity, like {A1: 10, A2: 8}")
    found: dict[str, int] = {}
    errors: list[vol.Invalid] = []
    for column, capacity in value.items():
        if isinstance(capacity, bool) or not isinstance(capacity, int) or not 0 < capacity <= 9999:
            errors.append(vol.Invalid(
                f"capacity of column {column} must be a whole number from 1 to 9999, "
                f"got {capacity!r}", path=[column]))
        else:
            found[str(column)] = capacity
    if errors:
        raise vol.MultipleInvalid(errors)
    return found


def _seconds(low: float, high: float) -> Any:
    return vol.All(vol.Coerce(float), vol.Range(min=low, max=high))


# Added to the `dex:` section's schema beside the link's keys.
BOOKS_KEYS: dict[Any, Any] = {
    # the trigger whose card sales are this machine's (its `name:`, or `platform:name`)
    vol.Optional("trigger"): vol.All(str, vol.Length(min=1, max=100)),
    # a read every `interval` seconds, the first one `first_read` seconds after the start
    vol.Optional("interval", default=INTERVAL): _seconds(60, 7 * 86400),
    vol.Optional("first_read", default=FIRST_READ): _seconds(0, 86400),
    # a failed read is tried again after `retry_min` seconds, doubled each failure up to `retry_max`
    vol.Optional("retry_min", default=RETRY_MIN): _seconds(1, 86400),
    vol.Optional("retry_max", default=RETRY_MAX): _seconds(1, 7 * 86400),
    # the cashless device the unit is on the machine's bus: DA (device 1) or DB (device 2)
    vol.Optional("cashless_device", default=CASHLESS_DEVICE): vol.In(["DA", "DB"]),
    # capacity per column; a column at or under `low_stock` left is low
    vol.Optional("planogram", default={}): _capacities,
    vol.Optional("low_stock", default=LOW_STOCK): vol.All(int, vol.Range(min=0, max=9999)),
    # how long a mismatch found stays a problem in health (seconds)
    vol.Optional("mismatch_shown", default=MISMATCH_SHOWN): _seconds(60, 90 * 86400),
}


@dataclass(frozen=True, slots=True)
class BooksSettings:
    trigger: str | None = None
    interval: float = INTERVAL
    first_read: float = FIRST_READ
    retry_min: float = RETRY_MIN
    retry_max: float = RETRY_MAX
    deadline: float = DEADLINE
    cashless_device: str = CASHLESS_DEVICE
    planogram: Mapping[str, int] = field(default_factory=dict)
    low_stock: int = LOW_STOCK
    mismatch_shown: float = MISMATCH_SHOWN

    @classmethod
    def from_config(cls, conf: Mapping[str, Any]) -> BooksSettings:
        names = {f for f in cls.__dataclass_fields__ if f in conf}
        return cls(**{name: conf[name] for name in names})

    def backoff(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failed reads in a row: the serial links' capped
        exponential back-off, jitter and all (a fleet's units do not retry in step)."""
        from kiosk_agent.platforms.serial import backoff_delay  # the link's: not for a check

        return backoff_delay(max(0, failures - 1), self.retry_min, self.retry_max)


def machine_sources(trigger: str | None, triggers: Sequence[Mapping[str, Any]]) -> list[str]:
    """The sale sources (``platform:name``) of the configured trigger named ``trigger``."""
    if trigger is None:
        return []
    found = []
    for conf in triggers:
        source = f"{conf['platform']}:{conf.get('name') or ''}"
        if trigger in (source, conf.get("name")):
            found.append(source)
    if not found and ":" in trigger:  # an unnamed trigger's source, as its platform names it
        found.append(trigger)
    return found
