"""The ``health:`` section's defaults, each written once: its schema (health/schema.py) and the
objects it configures (Health, HealthChecker, Availability) take them from here
(tests/config/test_defaults.py). Plain numbers: importing them registers no section and loads
no configuration code."""

PING_INTERVAL = 60.0  # how often the checker lists the terminals and pings each one
PING_TIMEOUT = 10.0  # a ping slower than this counts as "terminal offline"
KEY_WARNING = 86400.0  # warn when the API key expires sooner than this
HOLD_OFF = 0.5  # out of service only after a terminal stays unusable this long
RECHECK_INTERVAL = 1.0  # while unusable (or holding off): check this often


def section_defaults() -> dict[str, float]:
    """What the ``health:`` section reads when a configuration leaves it out (the schema's
    defaults: tests/health/test_health.py holds them equal), without building the schema: an
    agent whose configuration has no ``health:`` imports no health.schema."""
    return {
        "ping_interval": PING_INTERVAL,
        "ping_timeout": PING_TIMEOUT,
        "key_warning": KEY_WARNING,
        "hold_off": HOLD_OFF,
        "recheck_interval": RECHECK_INTERVAL,
    }
