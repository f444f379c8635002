"""The admin API's and the webhook receiver's configuration sections: plain voluptuous, so
checking a configuration (``check-config``, every command that reads one) does not import the
servers (aiohttp, pydantic, the status page)."""

from __future__ import annotations

import voluptuous as vol

from kiosk_agent.config.load import register_section
from kiosk_agent.web.hosts import listen_host

READ = "read"
ADMIN = "admin"
DEFAULT_MAX_BODY = 64 * 1024
ADMIN_PORT = 8124  # the admin API's port unless `admin.port` says another

TOKEN_SCHEMA = vol.Schema(
    {
        vol.Required("name"): str,
        # Use !secret; at least 24 characters so it cannot be guessed over the network.
        vol.Required("token"): vol.All(str, vol.Length(min=24, msg="use at least 24 characters")),
        vol.Optional("role", default=ADMIN): vol.In([READ, ADMIN]),
    }
)

ADMIN_SCHEMA = vol.Schema(
    {
        # Loopback by default: reach it over SSH or a VPN, or bind another address on purpose.
        vol.Optional("host", default="127.0.0.1"): listen_host,
        vol.Optional("port", default=ADMIN_PORT): vol.All(int, vol.Range(min=0, max=65535)),
        vol.Required("tokens"): vol.All([TOKEN_SCHEMA], vol.Length(min=1)),
        # Let Prometheus scrape /metrics without a token (it still sees no secrets).
        vol.Optional("metrics_public", default=False): bool,
    }
)

register_section("admin", ADMIN_SCHEMA)

WEBHOOKS_SCHEMA = vol.Schema(
    {
        # The shared secret that signs deliveries; use !secret.
        vol.Required("secret"): vol.All(str, vol.Length(min=8)),
        # Loopback by default: put a TLS reverse proxy or tunnel in front to expose it.
        vol.Optional("host", default="127.0.0.1"): listen_host,
        vol.Optional("port", default=8126): vol.All(int, vol.Range(min=0, max=65535)),
        vol.Optional("path", default="/webhooks/boarding"): vol.All(str, vol.Match(r"^/")),
        # SQLite file of received events (relative paths: next to the configuration).
        vol.Optional("store", default="webhooks.db"): str,
        vol.Optional("max_body", default=DEFAULT_MAX_BODY): vol.All(
            int, vol.Range(min=1024, max=16 * 1024 * 1024)
        ),
    }
)

register_section("webhooks", WEBHOOKS_SCHEMA)
