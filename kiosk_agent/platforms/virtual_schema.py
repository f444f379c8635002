"""The ``virtual`` platform's configuration: its schema, plain voluptuous.

Apart from the platform (``virtual.py``) so that checking a configuration (``check-config``, the
doctor, every command that loads one) loads neither the machine's driver nor asyncio:
:func:`kiosk_agent.config.registry.platform_checks` finds it by its name, ``<platform>_schema``.
"""

from __future__ import annotations

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
from kiosk_agent.platforms.mdb_schema import Mode, check_modes


def _products(value: Any) -> dict[str, int]:
    if not isinstance(value, dict) or not value:
        raise vol.Invalid("expected a map of product code to price, like {A1: \"1.50\"}")
    # every bad price at once, each at its own key: a tech fixes them in one go
    prices: dict[str, int] = {}
    errors: list[vol.Invalid] = []
    for code, price in value.items():
        try:
            prices[str(code)] = positive_price(price)
        except vol.Invalid as err:
            errors.append(vol.Invalid(err.msg, path=[code]))
    if errors:
        raise vol.MultipleInvalid(errors)
    return prices


def _virtual_schema() -> vol.Schema:
    return BASE_PLATFORM_SCHEMA.extend(
        {
            vol.Optional("products", default={"A1": "1.50", "A2": "2.50", "B1": "3.25"}): _products,
            vol.Optional("mode", default=Mode.SELECTION_FIRST.value): vol.In(
                [m.value for m in Mode]
            ),
            vol.Optional("max_funds", default="5.00"): positive_price,
            vol.Optional("customers", default=True): bool,  # random customers keep coming
            vol.Optional("gap", default=[1.0, 3.0]): vol.All(
                [positive_float], vol.Length(min=2, max=2)
            ),
            vol.Optional("fail_rate", default=0.1): vol.All(vol.Coerce(float), vol.Range(0, 1)),
            vol.Optional("walk_away_rate", default=0.05): vol.All(
                vol.Coerce(float), vol.Range(0, 1)
            ),
            # share of customers who pay cash: no sale, counted in the machine's books
            # (docs/audit.md)
            # a DEX port answering with the machine's books (a `dex:` section's
            # `port: virtual:NAME`)
            vol.Optional("dex", default=False): bool,
            vol.Optional("cash_rate", default=0.0): vol.All(vol.Coerce(float), vol.Range(0, 1)),
            vol.Optional("dispense_time", default=0.5): positive_float,
            # its own bound on a dispense; none: sales.vend_timeout (docs/platforms.md)
            vol.Optional("vend_timeout"): positive_float,
            vol.Optional("seed"): int,
        }
    )


__getattr__ = schema_built_on_read(__name__, lambda: _platform_schema())


def _platform_schema() -> vol.All:
    return vol.All(
        _virtual_schema(), no_enrollment, check_modes, max_price_check("products{}", "max_funds")
    )
