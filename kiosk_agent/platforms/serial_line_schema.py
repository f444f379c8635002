"""The ``serial_line`` platform's configuration: its schema and defaults, plain voluptuous.

Apart from the platform (``serial_line.py``) so that checking a configuration (``check-config``,
the doctor, every command that loads one) loads neither the serial link, pyserial nor asyncio:
:func:`kiosk_agent.config.registry.platform_checks` finds it by its name, ``<platform>_schema``.
"""

from __future__ import annotations

import re
import string
from typing import Any

import voluptuous as vol

from kiosk_agent.config.load import PLATFORM_SCHEMA as BASE_PLATFORM_SCHEMA
from kiosk_agent.config.load import no_enrollment, positive_float, schema_built_on_read
from kiosk_agent.platforms.serial_ports import LINE_END, RECONNECT_MAX

_TEMPLATE_FIELDS = frozenset({"product", "price", "cents", "amount", "reason"})


def _regex(*required_groups: str) -> Any:
    def validate(value: Any) -> re.Pattern[str]:
        if not isinstance(value, str):
            raise vol.Invalid(f"expected a regular expression, got {type(value).__name__}")
        try:
            pattern = re.compile(value)
        except re.error as err:
            raise vol.Invalid(f"not a valid regular expression ({err}): {value!r}") from None
        missing = [g for g in required_groups if g not in pattern.groupindex]
        if missing:
            raise vol.Invalid(f"the expression needs a named group (?P<{missing[0]}>...)")
        return pattern

    return validate


def _template(value: Any) -> str:
    if not isinstance(value, str):
        raise vol.Invalid(f"expected a text template, got {type(value).__name__}")
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
    except ValueError as err:
        raise vol.Invalid(f"not a valid template ({err}): {value!r}") from None
    unknown = sorted(f for f in fields if f not in _TEMPLATE_FIELDS)
    if unknown:
        raise vol.Invalid(
            f"unknown template field {{{unknown[0]}}}; known: "
            + ", ".join(f"{{{f}}}" for f in sorted(_TEMPLATE_FIELDS))
        )
    return value


PRICE_UNIT = "dollars"  # how a vend request's price is written unless `price_unit` says cents
LINE_BAUDRATE = 9600  # a plain serial line's usual speed (MDB adapters: serial.BAUDRATE)

def _serial_line_schema() -> vol.Schema:
    return BASE_PLATFORM_SCHEMA.extend(
        {
            vol.Required("port"): vol.All(str, vol.Length(min=1)),
            vol.Optional("baudrate", default=LINE_BAUDRATE): vol.All(int, vol.Range(min=300)),
            vol.Optional("init", default=[]): [str],
            vol.Required("vend_request"): _regex("price"),
            vol.Optional("price_unit", default=PRICE_UNIT): vol.In(["dollars", "cents"]),
            vol.Required("dispense_ok"): _regex(),
            vol.Optional("dispense_failed"): _regex(),
            vol.Optional("cancel"): _regex(),
            vol.Required("approve"): _template,
            vol.Optional("deny"): _template,
            # told to the device when its terminal goes out of service and comes back
            vol.Optional("out_of_service"): _template,
            vol.Optional("in_service"): _template,
            # its own bound on a dispense; none: sales.vend_timeout (docs/platforms.md)
            vol.Optional("vend_timeout"): positive_float,
            vol.Optional("line_end", default=LINE_END): vol.In(["\n", "\r\n", "\r"]),
            vol.Optional("silence_timeout"): positive_float,
            vol.Optional("probe"): str,
            vol.Optional("reconnect_max", default=RECONNECT_MAX): positive_float,
        }
    )


__getattr__ = schema_built_on_read(__name__, lambda: _platform_schema())


def _platform_schema() -> vol.All:
    return vol.All(_serial_line_schema(), no_enrollment)
