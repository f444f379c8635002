"""OAuth 2.0 client credentials for reporting and boarding.

``POST {reporting_url}/ords/sprint/oauth/token`` with HTTP Basic ``client_id:client_secret`` and
the form ``grant_type=client_credentials`` (the provider's published shape) answers
``{access_token, token_type: "bearer", expires_in}``. A token lives one simulated hour, so
``expires_in`` (real seconds, as a client counts them) shrinks with the time scale, down to one
second. Tokens are
kept in the store, so a simulator restarted on its data directory still honours them.
"""

from __future__ import annotations

import base64
import binascii
import math
import secrets

from aiohttp import web

from kiosk_agent.sim.auth import bearer_token
from kiosk_agent.sim.clock import VirtualClock
from kiosk_agent.sim.context import SimContext
from kiosk_agent.sim.http import ApiError, bad_request, json_response
from kiosk_agent.sim.store import Store

CLIENT_ID = "sim_client"
CLIENT_SECRET = "sim_secret"
TOKEN_PATH = "/ords/sprint/oauth/token"
TOKEN_LIFETIME_S = 3600.0  # simulated seconds

_DDL = """
CREATE TABLE IF NOT EXISTS oauth_tokens (
    token TEXT PRIMARY KEY,
    client_id TEXT NOT NULL,
    expires_at REAL NOT NULL
);
"""


class OAuthIssuer:
    """Issues and checks the bearer tokens of reporting and boarding."""

    def __init__(
        self,
        store: Store,
        clock: VirtualClock,
        client_id: str = CLIENT_ID,
        client_secret: str = CLIENT_SECRET,
    ) -> None:
        self._store = store
        self._clock = clock
        self._client_id = client_id
        self._client_secret = client_secret
        store.create(_DDL)

    def issue(self, client_id: str, client_secret: str) -> dict[str, object]:
        """A new token for valid client credentials, else 401 ``invalid_client``."""
        id_ok = secrets.compare_digest(client_id.encode(), self._client_id.encode())
        secret_ok = secrets.compare_digest(client_secret.encode(), self._client_secret.encode())
        if not (id_ok and secret_ok):
            raise ApiError(401, "invalid_client", "unknown client_id or wrong client_secret")
        now = self._clock.time()
        # expires_in is whole real seconds, at least one; the token lasts exactly that long,
        # so even at a huge time scale a client can use the token it was just given.
        expires_in = max(1, math.ceil(self._clock.real_seconds(TOKEN_LIFETIME_S)))
        token = f"sim_oauth_{secrets.token_hex(20)}"
        with self._store.transaction():
            # Spent tokens are dropped here rather than by a timer: issuing is rare.
            self._store.execute("DELETE FROM oauth_tokens WHERE expires_at <= ?", (now,))
            self._store.execute(
                "INSERT INTO oauth_tokens VALUES (?, ?, ?)",
                (token, client_id, now + expires_in * self._clock.time_scale),
            )
        return {
            "access_token": token,
            "token_type": "bearer",
            "expires_in": expires_in,
        }

    def valid(self, token: str) -> bool:
        row = self._store.row("SELECT expires_at FROM oauth_tokens WHERE token = ?", (token,))
        return row is not None and float(row["expires_at"]) > self._clock.time()

    def require(self, request: web.Request) -> None:
        """401 unless the request carries a live OAuth bearer token."""
        token = bearer_token(request)
        if token is None:
            raise ApiError(401, "unauthorized", "missing Authorization: Bearer <access token>")
        if not self.valid(token):
            raise ApiError(401, "invalid_token", "the access token is unknown or expired")


ISSUER_KEY = web.AppKey("sim_oauth", OAuthIssuer)


def require_token(request: web.Request) -> None:
    """The bearer check of every reporting and boarding handler."""
    request.app[ISSUER_KEY].require(request)


def parse_basic(header: str | None) -> tuple[str, str] | None:
    """``Basic base64(id:secret)`` -> ``(id, secret)``; ``None`` when absent or malformed."""
    if not header:
        return None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded.strip():
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    client_id, sep, client_secret = decoded.partition(":")
    return (client_id, client_secret) if sep else None


async def token(request: web.Request) -> web.Response:
    """``POST /ords/sprint/oauth/token``."""
    if request.content_type != "application/x-www-form-urlencoded":
        raise bad_request(
            "expected Content-Type: application/x-www-form-urlencoded, "
            f"got {request.content_type or 'none'!r}"
        )
    form = await request.post()
    grant_type = form.get("grant_type")
    if grant_type is None:
        raise bad_request("missing form field 'grant_type'")
    if grant_type != "client_credentials":
        raise bad_request(
            f"grant_type must be 'client_credentials', got {grant_type!r}",
            "unsupported_grant_type",
        )
    credentials = parse_basic(request.headers.get("Authorization"))
    if credentials is None:
        # RFC 6749 2.3.1 also allows the credentials in the form body.
        form_id, form_secret = form.get("client_id"), form.get("client_secret")
        if isinstance(form_id, str) and isinstance(form_secret, str):
            credentials = (form_id, form_secret)
    if credentials is None:
        raise ApiError(
            401, "invalid_client", "missing HTTP Basic Authorization with client_id:client_secret"
        )
    answer = request.app[ISSUER_KEY].issue(*credentials)
    # RFC 6749 5.1: token answers must not be cached.
    return json_response(answer, headers={"Cache-Control": "no-store", "Pragma": "no-cache"})


def setup(app: web.Application, ctx: SimContext) -> None:
    app[ISSUER_KEY] = OAuthIssuer(ctx.store, ctx.clock)
    app.router.add_post(TOKEN_PATH, token)
