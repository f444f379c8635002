"""The service session follows no redirect, the cable's WebSocket handshake included.

Every call through the transport asks aiohttp not to follow (``allow_redirects=False``) and reads
a 3xx as an error. ``ws_connect`` has no such switch: it always follows, so a service address
that answers the upgrade with a 307 would have the agent open its cable on whatever server the
answer names and read that server's interaction records (a charge "succeeded") as the
service's. A client middleware sees each request's answer before aiohttp decides to follow it:
:func:`refuse_upgrade_redirects` turns a 3xx to an upgrade into :class:`RedirectRefused`, and no
second request is made. The transport's own calls skip that layer (they follow nothing
anyway): only a handshake goes through it.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import hdrs

from kiosk_agent.redact import redirect_target


class RedirectRefused(aiohttp.ClientError):
    """An upgrade was answered with a redirect, not followed."""

    def __init__(self, status: int, location: str | None) -> None:
        self.status = status
        self.where = redirect_target(location)
        super().__init__(f"HTTP {status}: a redirect to {self.where}, not followed")


async def refuse_upgrade_redirects(
    request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
) -> aiohttp.ClientResponse:
    """Client middleware: a WebSocket upgrade answered 3xx raises :class:`RedirectRefused`.

    Other requests pass untouched: the transport sends them with ``allow_redirects=False`` and
    names the redirect in its own error.
    """
    response = await handler(request)
    if 300 <= response.status < 400 and hdrs.UPGRADE in request.headers:
        location = response.headers.get(hdrs.LOCATION)
        response.close()
        raise RedirectRefused(response.status, location)
    return response


def service_session(**options: Any) -> aiohttp.ClientSession:
    """An aiohttp session fit for the service clients (``options`` as ``ClientSession`` takes
    them): one whose WebSocket handshake refuses a redirect."""
    middlewares = (refuse_upgrade_redirects, *options.pop("middlewares", ()))
    return aiohttp.ClientSession(middlewares=middlewares, **options)
