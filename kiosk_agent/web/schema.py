"""The ``http:`` section: the limits of every local HTTP server (admin API, webhook receiver,
kiosk API), one place. Voluptuous alone: checking a configuration imports no aiohttp, no server
(web/server.py's HttpLimits takes its defaults from here)."""

from __future__ import annotations

import voluptuous as vol

from kiosk_agent.validators import positive_float


def http_schema() -> vol.Schema:
    """Limits of every local HTTP server (admin API, webhook receiver, kiosk API): one place.
    Built on each call: a server reads it once as it starts (config/load.py says why)."""
    return vol.Schema(
        {
            # a new connection must send its first request's headers within this (seconds)
            vol.Optional("header_timeout", default=10.0): positive_float,
            # a request body must arrive whole within this (seconds)
            vol.Optional("body_timeout", default=30.0): positive_float,
            # an idle connection (or a slow next request) is closed after this (seconds)
            vol.Optional("keepalive_timeout", default=15.0): positive_float,
            # open connections per server; past it the oldest idle one is closed first
            vol.Optional("max_connections", default=256): vol.All(int, vol.Range(min=4, max=4096)),
            # event streams (WebSocket, server-sent events) per server, apart from the connections:
            # past it a new stream is refused, and requests never wait behind streams
            vol.Optional("max_streams", default=32): vol.All(int, vol.Range(min=1, max=1024)),
            # once max_connections are open, newcomers accepted a second (a quarter of them let in
            # without a request yet); the rest wait in the kernel's queue: a flood's churn has a
            # CPU bound
            vol.Optional("accept_rate_at_cap", default=300.0): vol.All(
                vol.Coerce(float), vol.Range(min=1, max=100000)
            ),
            # how long a stop waits for requests in progress (seconds)
            vol.Optional("shutdown_grace", default=5.0): positive_float,
        }
    )
