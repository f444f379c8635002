"""The ``mdb`` platform's configuration: its schema and defaults, plain voluptuous.

Apart from the platform (``mdb.py``) so that checking a configuration (``check-config``, the
doctor, every command that loads one) loads neither the adapter link, pyserial nor asyncio:
:func:`kiosk_agent.config.registry.platform_checks` finds it by its name, ``<platform>_schema``.
"""

from __future__ import annotations

import enum
from typing import Any

import voluptuous as vol

from kiosk_agent.config.load import PLATFORM_SCHEMA as BASE_PLATFORM_SCHEMA
from kiosk_agent.config.load import (
    max_price_check,
    no_enrollment,
    positive_float,
    positive_price,
    schema_built_on_read,
)
from kiosk_agent.platforms.mdb_units import AmountUnit
from kiosk_agent.platforms.serial_ports import BAUDRATE, RECONNECT_MAX
from kiosk_agent.sales.model import Flow

# The `mdb` platform's defaults, written once (tests/config/test_defaults.py)
ADDRESS = 0x10  # the MDB cashless device 1's address
NO_MAX_FUNDS = 0  # no `max_funds`: a card-first session offers what the price list allows


class Mode(enum.StrEnum):
    SELECTION_FIRST = "selection_first"
    CARD_FIRST = "card_first"


def _address(value: Any) -> int:
    try:
        number = int(value, 0) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise vol.Invalid(f"expected an MDB address like 0x10, got {value!r}") from None
    if number not in (0x10, 0x60):
        raise vol.Invalid(f"cashless devices use MDB address 0x10 or 0x60, got {value!r}")
    return number


def _mdb_schema() -> vol.Schema:
    return BASE_PLATFORM_SCHEMA.extend(
        {
            vol.Required("port"): vol.All(str, vol.Length(min=1)),
            vol.Optional("baudrate", default=BAUDRATE): vol.All(int, vol.Range(min=1200)),
            vol.Optional("mode", default=Mode.SELECTION_FIRST.value): vol.In(
                [m.value for m in Mode]
            ),
            vol.Optional("address", default=ADDRESS): _address,
            vol.Optional("amount_unit", default=AmountUnit.DOLLARS.value): vol.In(
                [u.value for u in AmountUnit]
            ),
            # card first: the most a customer may spend in one session
            vol.Optional("max_funds"): positive_price,
            # its own bound on a dispense; none: sales.vend_timeout (docs/platforms.md)
            vol.Optional("vend_timeout"): positive_float,
            # card first: its own time to choose (seconds); none: sales.choice_timeout
            vol.Optional("session_timeout"): positive_float,
            vol.Optional("silence_timeout"): positive_float,
            vol.Optional("probe"): str,
            vol.Optional("reconnect_max", default=RECONNECT_MAX): positive_float,
        }
    )


def check_modes(config: dict[str, Any]) -> dict[str, Any]:
    if config["mode"] == Mode.CARD_FIRST.value:
        if "max_funds" not in config:
            raise vol.Invalid("card_first mode needs max_funds", path=["max_funds"])
        if config["flow"] != Flow.AUTHORIZE_CAPTURE.value:
            raise vol.Invalid(
                "card_first mode needs flow: authorize_capture (only the chosen price is captured)",
                path=["flow"],
            )
    return config


__getattr__ = schema_built_on_read(__name__, lambda: _platform_schema())


def _platform_schema() -> vol.All:
    return vol.All(_mdb_schema(), no_enrollment, check_modes, max_price_check("max_funds"))
