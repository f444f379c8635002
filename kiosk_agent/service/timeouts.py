"""The one default of ``service.timeout``, apart from the settings model: the command line's
help and completion show it without importing pydantic (``service.settings`` re-exports it and
decides every other timeout from the setting)."""

# The longest one call may take, everything included, unless configured (service.timeout) or
# given (--timeout): the one default of that setting; the config schema and the CLI refer to it.
DEFAULT_TIMEOUT = 15.0

# A read-card or charge-card interaction lives this long on the service (choices.md), when its
# record does not say; the cable's wait and the sales' bounds both start from it.
INTERACTION_LIFETIME = 180.0
