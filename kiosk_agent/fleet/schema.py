"""The ``upstream:`` section: its voluptuous schema, registered with the core configuration."""

from __future__ import annotations

import re
from typing import Any

import voluptuous as vol

from kiosk_agent.config.load import register_section
from kiosk_agent.fleet.discovery import release_tuple
from kiosk_agent.fleet.entities import OLDEST_HOME_ASSISTANT
from kiosk_agent.fleet.loopback import insecure_http, insecure_mqtt
from kiosk_agent.fleet.tls import ca_file_problem
from kiosk_agent.fleet.topics import (
    DEFAULT_DISCOVERY_PREFIX,
    DEFAULT_TOPIC_PREFIX,
    DEVICE_ID,
    DEVICE_ID_RULE,
    TOPIC_PREFIX,
    TOPIC_PREFIX_RULE,
)

# The `upstream:` section's defaults, each written once (tests/config/test_defaults.py); the
# sinks read them from here where a configuration was not validated (tests, commands)
HTTP_TIMEOUT = 10.0  # one heartbeat's POST
MQTT_PORT = 1883
KEEPALIVE = 60  # seconds between MQTT pings
RECONNECT_INTERVAL = 5.0  # the first reconnect waits up to this (at random)
RECONNECT_MAX = 60.0  # each next one up to twice as long, at most this

_seconds = vol.All(vol.Coerce(float), vol.Range(min=0.05, max=86400.0))
_topic_prefix = vol.All(str, vol.Match(TOPIC_PREFIX, msg=TOPIC_PREFIX_RULE))


def _refuse_clear_text(conf: dict[str, Any]) -> dict[str, Any]:
    if insecure_http(conf) and not conf["allow_insecure_http"]:
        raise vol.Invalid(
            "an http:// heartbeat to another host sends the fleet token and the reports in "
            "clear: use https://, or set allow_insecure_http: true to accept that "
            "(http:// to a loopback address is always allowed)",
            path=["url"],
        )
    return conf


HTTP_SCHEMA = vol.All(
    vol.Schema(
        {
            vol.Required("url"): vol.All(
                str, vol.Match(r"^https?://", msg="expected an http(s) URL")
            ),
            # Sent as a bearer token; use !secret. Never logged.
            vol.Optional("token"): str,
            vol.Optional("timeout", default=HTTP_TIMEOUT): _seconds,
            # http:// to a host other than this one: the token travels in clear (warned at start)
            vol.Optional("allow_insecure_http", default=False): bool,
        }
    ),
    _refuse_clear_text,
)


def _ca_file(path: str) -> str:
    """A CA file TLS loads: a key or a DER file passed before, and the unit never connected."""
    if (problem := ca_file_problem(path)) is not None:
        raise vol.Invalid(f"{path}: {problem}")
    return path


def _refuse_clear_password(conf: dict[str, Any]) -> dict[str, Any]:
    if conf.get("ca_file") and not conf["tls"]:
        # the CA would be ignored and the connection plain: the mistake behind "connection
        # reset by peer" on port 8883
        raise vol.Invalid("ca_file is only used with tls: true; add tls: true (or remove "
                          "ca_file)", path=["tls"])
    if insecure_mqtt(conf) and not conf["allow_insecure"]:
        raise vol.Invalid(
            "a password to a broker on another host without tls: true travels in clear: "
            "turn on tls (port 8883 usually), or set allow_insecure: true to accept that "
            "(a broker on a loopback address is always allowed)",
            path=["password"],
        )
    return conf


MQTT_SCHEMA = vol.All(
    vol.Schema(
        {
            vol.Required("host"): str,
            vol.Optional("port", default=MQTT_PORT): vol.All(int, vol.Range(min=1, max=65535)),
            vol.Optional("username"): str,
            vol.Optional("password"): str,
            vol.Optional("topic_prefix", default=DEFAULT_TOPIC_PREFIX): _topic_prefix,
            # Home Assistant's discovery prefix; false (or "") turns discovery off.
            vol.Optional("discovery_prefix", default=DEFAULT_DISCOVERY_PREFIX): vol.Any(
                vol.All(vol.In(("", False)), msg=TOPIC_PREFIX_RULE), _topic_prefix
            ),
            # TLS to the broker (port 8883 usually); ca_file: a private CA instead of the system's.
            vol.Optional("tls", default=False): bool,
            vol.Optional("ca_file"): vol.All(str, vol.IsFile(msg="no such file"), _ca_file),
            vol.Optional("keepalive", default=KEEPALIVE): vol.All(int, vol.Range(min=5, max=3600)),
            # the first reconnect waits up to this (at random), each next one up to twice as long,
            # at most reconnect_max: a fleet spreads its reconnects after a broker restart
            vol.Optional("reconnect_interval", default=RECONNECT_INTERVAL): _seconds,
            vol.Optional("reconnect_max", default=RECONNECT_MAX): _seconds,
            # a Home Assistant birth is answered after a random wait up to this: 1,000 units
            # of one HA re-announce over 30 s (about 570 messages a second), not in one burst
            vol.Optional("announce_spread", default=30.0): vol.All(
                vol.Coerce(float), vol.Range(min=0.0, max=3600.0)
            ),
            # a password without tls to another host: refused unless this says it is accepted
            vol.Optional("allow_insecure", default=False): bool,
        }
    ),
    _refuse_clear_password,
)

def _home_assistant_release(value: Any) -> str:
    """``upstream.home_assistant``: the release the operator runs, 2024.3 or later."""
    if not isinstance(value, str):  # YAML reads 2024.10 as the number 2024.1
        raise vol.Invalid(f"expected the release in quotes, such as \"2024.3\" (YAML reads "
                          f"{value!r} unquoted as a number, and 2024.10 as 2024.1)")
    text = value
    match = re.fullmatch(r"(\d{4})\.(\d{1,2})(\.\d+)?", text)
    if match is None or not 1 <= int(match[2]) <= 12:
        raise vol.Invalid(f"expected a Home Assistant release such as \"2024.3\" or "
                          f"\"2026.2\", not {text!r}")
    if (int(match[1]), int(match[2])) < release_tuple(OLDEST_HOME_ASSISTANT):
        raise vol.Invalid(f"Home Assistant {text} is older than the oldest supported, "
                          f"{OLDEST_HOME_ASSISTANT}")
    return f"{match[1]}.{int(match[2])}"


UPSTREAM_SCHEMA = vol.Schema(
    {
        # How this unit is named upstream; default: the host name.
        vol.Optional("device_id"): vol.All(str, vol.Match(DEVICE_ID, msg=DEVICE_ID_RULE)),
        # Home Assistant's device: its name (default: the device id), area, serial, model id;
        # support_url: the origin's support link (default: configuration_url)
        vol.Optional("name"): vol.All(str, vol.Length(min=1, max=64)),
        vol.Optional("suggested_area"): vol.All(str, vol.Length(min=1, max=64)),
        vol.Optional("serial_number"): vol.All(str, vol.Length(min=1, max=64)),
        vol.Optional("model_id"): vol.All(str, vol.Length(min=1, max=64)),
        # the device's model and board as Home Assistant shows them (default model: "card
        # payment kiosk"; hw_version: the board's own name where it says one, a Raspberry Pi's)
        vol.Optional("model"): vol.All(str, vol.Length(min=1, max=64)),
        vol.Optional("hw_version"): vol.All(str, vol.Length(min=1, max=64)),
        # the Home Assistant release that reads the discovery (default: the oldest supported,
        # 2024.3): keys only a later one takes (model_id, enum options) are sent to it alone
        vol.Optional("home_assistant"): _home_assistant_release,
        vol.Optional("support_url"): vol.All(
            str, vol.Match(r"^https?://[^\s]+$", msg="expected an http(s) URL")
        ),
        # each heartbeat waits interval +- this fraction (at random): units drift apart
        vol.Optional("jitter", default=0.1): vol.All(
            vol.Coerce(float), vol.Range(min=0.0, max=0.5)
        ),
        vol.Optional("interval", default=60.0): _seconds,
        # The first heartbeat waits for the serial links and first checks, at most this long.
        vol.Optional("start_grace", default=10.0): vol.All(
            vol.Coerce(float), vol.Range(min=0.0, max=600.0)
        ),
        # Where the unit's status page is, as Home Assistant's "Visit" link (default: the admin
        # API's address when it listens beyond loopback).
        vol.Optional("configuration_url"): vol.All(
            str, vol.Match(r"^https?://[^\s]+$", msg="expected an http(s) URL")
        ),
        # Home Assistant's buttons (restart, ping and test print each reader) and update
        # entity, on the unit's own command topics: off unless turned on
        vol.Optional("commands", default=False): bool,
        vol.Optional("queue_size", default=500): vol.All(int, vol.Range(min=1, max=100000)),
        vol.Optional("http"): HTTP_SCHEMA,
        vol.Optional("mqtt"): MQTT_SCHEMA,
    }
)

register_section("upstream", UPSTREAM_SCHEMA)
