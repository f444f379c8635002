"""What counts as this machine: a heartbeat or broker address that never leaves it."""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit


def is_loopback_url(url: str) -> bool:
    """Whether ``url`` names this machine (127.0.0.0/8, ::1, localhost): nothing leaves it."""
    return is_loopback_host(urlsplit(url).hostname or "")


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address, no brackets) is this machine only."""
    host = host.rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def insecure_http(conf: dict[str, Any]) -> bool:
    """An ``http://`` heartbeat URL that leaves the machine (token and reports in clear)."""
    url = str(conf["url"])
    return url.lower().startswith("http://") and not is_loopback_url(url)


def insecure_mqtt(conf: dict[str, Any]) -> bool:
    """A password to a broker on another host without TLS: it would travel in clear."""
    return (
        bool(conf.get("password"))
        and not conf.get("tls")
        and not is_loopback_host(str(conf.get("host", "")))
    )
