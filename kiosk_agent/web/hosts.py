"""The ``host`` a local server listens on (the admin API, the webhook receiver, a kiosk API):
one contract, one place.

Two questions, asked at two times:

- can it ever be an address of a machine? (:func:`listen_host`, in the configuration's schema:
  an IP address no interface can have, a URL, a ``host:port``, a name that is not a name, is a
  mistake in the file, refused with the fix);
- is it this machine's address now? (:func:`address_problem`, by ``check-config`` and
  ``doctor``: a LAN address DHCP has not given yet is no mistake, the agent waits for it (web/
  server.py's PortWait), so it is a warning there, not an error).

Only voluptuous and the standard library: a configuration is checked without aiohttp.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from typing import Any

import voluptuous as vol

# One label of a host name (RFC 1123): letters, digits and hyphens, not at either end; an
# underscore too, which /etc/hosts may hold (not obviously wrong)
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")
_DOTTED_DIGITS = re.compile(r"^[0-9.]+$")
_EXAMPLE = "e.g. 127.0.0.1 (this machine only), 192.168.1.20 (one of its addresses) or 0.0.0.0"


def listen_host(value: Any) -> str:
    """A host a server may listen on: an IP address some interface can have, a host name, or
    ``""`` (every address). Anything else is refused with what to write instead."""
    if not isinstance(value, str):
        raise vol.Invalid(f"expected an address or a host name, {_EXAMPLE}")
    if value == "":
        return value
    if value != value.strip() or any(c.isspace() for c in value):
        raise vol.Invalid(f"{value!r} has spaces in it: write the address alone, {_EXAMPLE}")
    if "/" in value:
        raise vol.Invalid(f"{value} is not an address: write the address alone, without "
                          f"http:// or a path, {_EXAMPLE}")
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return _host_name(value)
    problem = _never_here(address)
    if problem:
        raise vol.Invalid(f"{value} {problem}: no machine listens there; {_EXAMPLE}")
    return value


def _never_here(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why no interface can have ``address`` (or None: some machine may)."""
    if address.is_multicast:
        return "is a multicast address"
    if isinstance(address, ipaddress.IPv4Address):
        if address == ipaddress.IPv4Address("255.255.255.255"):
            return "is the broadcast address"
        if address.is_reserved:
            return "is in 240.0.0.0/4, reserved"
        if address in ipaddress.IPv4Network("0.0.0.0/8") and int(address):
            return "is in 0.0.0.0/8 (0.0.0.0 alone means every address)"
    elif address.is_link_local and not address.scope_id:
        return "is link-local without its interface (write it fe80::...%eth0)"
    return None


def _host_name(value: str) -> str:
    if value.startswith("["):
        raise vol.Invalid(f"{value}: write an IPv6 address without its brackets, e.g. ::1")
    if ":" in value:
        head, _, tail = value.rpartition(":")
        if tail.isdigit() and head and ":" not in head:
            raise vol.Invalid(f"{value}: the port goes in port:, not in host: host: {head}")
        raise vol.Invalid(f"{value} is not an IPv6 address: {_EXAMPLE}, or ::1")
    if _DOTTED_DIGITS.match(value):
        raise vol.Invalid(f"{value} is not an IPv4 address: four numbers of 0-255 joined by "
                          f"dots, {_EXAMPLE}")
    try:
        ascii_name = value if value.isascii() else value.encode("idna").decode("ascii")
    except UnicodeError:
        ascii_name = ""
    labels = ascii_name.removesuffix(".").split(".")
    if not ascii_name or len(ascii_name) > 253 or not all(_LABEL.match(x) for x in labels):
        raise vol.Invalid(f"{value} is neither an IP address nor a host name (letters, digits "
                          f"and hyphens, parts joined by dots): {_EXAMPLE}")
    return value


def address_problem(host: str) -> str | None:
    """Why ``host`` (valid by :func:`listen_host`) is not one of this machine's addresses now,
    or None where a server could listen on it now: a name that does not resolve here, or an
    address no interface has. Each address it names is bound once (port 0), then let go."""
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 - every address: always here
        return None
    try:
        infos = socket.getaddrinfo(host.encode("ascii") if host.isascii() else host, 0,
                                   type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as err:
        return (f"{host} does not resolve here now ({err.strerror or err}): the agent waits "
                "for it (DNS not up yet at boot) and serves once it resolves; if it never "
                "will, correct the host or write its address")
    for family, kind, proto, _name, address in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind(address)
            except OSError as err:
                if err.errno != errno.EADDRNOTAVAIL:
                    return f"{host}: {address[0]}: {err.strerror or err}"
                shown = host if host == address[0] else f"{host} ({address[0]})"
                return (f"{shown} is not on this machine now: the agent waits for it (a LAN "
                        "address DHCP gives at boot) and serves once it appears; if it never "
                        "will, change the host to one of this machine's addresses "
                        "(`ip -brief address` lists them)")
    return None


def listen_hosts(config: Any) -> list[tuple[list[str | int], str]]:
    """Where a configuration has a local server listen: each ``host`` (its path in the file,
    e.g. ``["admin", "host"]`` or ``["triggers", 2, "host"]``, and its value)."""
    hosts: list[tuple[list[str | int], str]] = []
    for section in ("admin", "webhooks"):
        conf = config.get(section)
        if isinstance(conf, dict) and isinstance(conf.get("host"), str):
            hosts.append(([section, "host"], conf["host"]))
    for index, trigger in enumerate(config.triggers):
        if trigger.get("platform") == "kiosk_api" and isinstance(trigger.get("host"), str):
            hosts.append((["triggers", index, "host"], trigger["host"]))
    return hosts
