"""The ``health:`` section of the configuration: plain voluptuous, so checking a configuration
does not import the health model (pydantic)."""

from __future__ import annotations

import voluptuous as vol

from kiosk_agent.config.load import register_section
from kiosk_agent.health.defaults import (
    HOLD_OFF,
    KEY_WARNING,
    PING_INTERVAL,
    PING_TIMEOUT,
    RECHECK_INTERVAL,
)

HEALTH_SCHEMA = vol.Schema(
    {
        # How often the checker lists the terminals and pings each one (seconds).
        vol.Optional("ping_interval", default=PING_INTERVAL): vol.All(
            vol.Coerce(float), vol.Range(min=1.0, max=86400.0)
        ),
        # A ping slower than this counts as "terminal offline" (seconds).
        vol.Optional("ping_timeout", default=PING_TIMEOUT): vol.All(
            vol.Coerce(float), vol.Range(min=0.5, max=300.0)
        ),
        # Warn when the API key expires sooner than this (seconds).
        vol.Optional("key_warning", default=KEY_WARNING): vol.All(
            vol.Coerce(float), vol.Range(min=0.0)
        ),
        # Out of service: how long a terminal must stay unusable before the readers step aside
        # (seconds; the checker re-checks every recheck_interval meanwhile). 0: at once.
        vol.Optional("hold_off", default=HOLD_OFF): vol.All(
            vol.Coerce(float), vol.Range(min=0.0, max=3600.0)
        ),
        # While a terminal is unusable (or in its hold-off), check this often instead of
        # ping_interval, so the readers come back as soon as the terminal answers (seconds).
        vol.Optional("recheck_interval", default=RECHECK_INTERVAL): vol.All(
            vol.Coerce(float), vol.Range(min=0.1, max=60.0)
        ),
    }
)

register_section("health", HEALTH_SCHEMA)
