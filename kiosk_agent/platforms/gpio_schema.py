"""The ``gpio`` platform's configuration: its schema, its defaults, and what keeps a valid
trigger from starting on this machine (its chip, the gpiod package).

Apart from the platform (``gpio.py``) so that checking a configuration (``check-config``, the
doctor, every command that loads one) loads neither the platform's runtime nor asyncio:
:func:`kiosk_agent.config.registry.platform_checks` finds it by its name, ``<platform>_schema``.
"""

from __future__ import annotations

import glob
import importlib.util
from pathlib import Path
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

_LINE = vol.All(int, vol.Range(min=0, max=1023))

# The `gpio` platform's defaults, written once (tests/config/test_defaults.py)
CHIP = "/dev/gpiochip0"
DEBOUNCE = 0.05  # a button's level must hold this long (seconds)
SENSOR_TIMEOUT = 5.0  # a dispense sensor that stays silent this long: nothing came out


BUTTON_SCHEMA = vol.Schema(
    {
        vol.Required("line"): _LINE,
        vol.Required("product"): vol.All(str, vol.Length(min=1)),
        vol.Required("price"): positive_price,
        vol.Required("relay"): _LINE,
        vol.Optional("pulse"): positive_float,  # seconds the relay is held on
        vol.Optional("sensor"): _LINE,  # a drop sensor that confirms the dispense
    }
)


def _unique_lines(config: dict[str, Any]) -> dict[str, Any]:
    """Each line has one use: a button, a sensor or a relay (a relay's line driven while it is
    read as a button would sell and dispense on its own)."""
    used: dict[int, str] = {}
    for index, button in enumerate(config["buttons"]):
        for key in ("line", "sensor", "relay"):
            line = button.get(key)
            if line is None:
                continue
            where = f"buttons[{index}].{key}"
            if line in used:
                raise vol.Invalid(f"line {line} is used twice ({used[line]} and {where})",
                                  path=["buttons", index, key])
            used[line] = where
    lamp = config.get("available_output")
    if lamp is not None:
        for index, button in enumerate(config["buttons"]):
            if lamp in (button["relay"], button["line"], button.get("sensor")):
                raise vol.Invalid(
                    f"available_output line {lamp} is also used by buttons[{index}]",
                    path=["available_output"],
                )
    return config


__getattr__ = schema_built_on_read(__name__, lambda: _platform_schema())


def _platform_schema() -> vol.All:
    return vol.All(
        BASE_PLATFORM_SCHEMA.extend(
            {
                vol.Optional("chip", default=CHIP): str,
                vol.Required("buttons"): vol.All([BUTTON_SCHEMA], vol.Length(min=1)),
                vol.Optional("buttons_active_low", default=True): bool,  # pressed pulls to ground
                vol.Optional("pull_up", default=True): bool,
                vol.Optional("relays_active_low", default=False): bool,
                vol.Optional("sensors_active_low", default=False): bool,
                vol.Optional("debounce", default=DEBOUNCE): positive_float,
                vol.Optional("pulse", default=0.5): positive_float,
                vol.Optional("sensor_timeout", default=SENSOR_TIMEOUT): positive_float,
                # its own bound on a dispense; none: sales.vend_timeout (docs/platforms.md)
                vol.Optional("vend_timeout"): positive_float,
                # a lamp or relay that is on while card payment works (out of service: off)
                vol.Optional("available_output"): _LINE,
                vol.Optional("available_active_low", default=False): bool,
            }
        ),
        no_enrollment,
        _unique_lines,
        max_price_check("buttons[].price"),
    )


GPIOD_INSTALL = "pip install 'kiosk-agent[gpio]'"
CHIP_PATTERN = "/dev/gpiochip*"


def gpiod_installed() -> bool:
    return importlib.util.find_spec("gpiod") is not None


def environment_problems(config: dict[str, Any]) -> list[str]:
    """What keeps this trigger from starting here: its chip, the gpiod package."""
    problems = []
    chip = config.get("chip", CHIP)
    if not Path(chip).exists():
        present = ", ".join(sorted(glob.glob(CHIP_PATTERN))) or "none"
        problems.append(f"chip {chip} does not exist on this machine (GPIO chips here: {present})")
    if not gpiod_installed():
        problems.append(f"the gpiod package is not installed: {GPIOD_INSTALL} in the agent's "
                        "virtualenv")
    return problems
