"""Payments API keys: the seeded keys, refresh with rotation, ISV merchants, WebSocket tokens.

Seeded keys never expire; keys made by a refresh live one simulated hour and their refresh
tokens thirty simulated days (choices.md). A refresh spends the refresh token it used; the
old key stays valid until its own expiry.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kiosk_agent.sim.clock import VirtualClock
from kiosk_agent.sim.http import ApiError, bad_request
from kiosk_agent.sim.store import Store

API_KEY = "sim_api_key"
REFRESH_TOKEN = "sim_refresh_token"
ISV_API_KEY = "sim_isv_key"
PUBLIC_KEY = "sim_public_key"
MID = "999000000001"
ISV_MIDS = ("999000000001", "999000000002")

API_KEY_LIFETIME = 3600.0
REFRESH_TOKEN_LIFETIME = 30 * 86400.0
WS_TOKEN_LIFETIME = 60.0

_DDL = """
CREATE TABLE IF NOT EXISTS api_keys (
    api_key TEXT PRIMARY KEY,
    isv INTEGER NOT NULL,
    mids TEXT NOT NULL,
    expires_at REAL
);
CREATE TABLE IF NOT EXISTS refresh_tokens (
    token TEXT PRIMARY KEY,
    api_key TEXT NOT NULL,
    expires_at REAL,
    spent INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS ws_tokens (
    token TEXT PRIMARY KEY,
    api_key TEXT NOT NULL,
    expires_at REAL NOT NULL,
    used INTEGER NOT NULL DEFAULT 0
);
"""


@dataclass(frozen=True, slots=True)
class Credential:
    """Who is calling: the API key and the merchants it may act for."""

    api_key: str
    isv: bool
    mids: tuple[str, ...]

    def resolve_mid(self, requested: str | None) -> str:
        """The merchant a call acts for; ISV keys must name one of theirs (400 otherwise)."""
        if requested is None or requested == "":
            if self.isv:
                raise bad_request("an ISV key must send the merchant's mid", "mid_required")
            return self.mids[0]
        if requested not in self.mids:
            raise bad_request(
                f"mid {requested!r} is not an account this key may act for", "invalid_mid"
            )
        return requested


class Auth:
    def __init__(self, store: Store, clock: VirtualClock) -> None:
        self._store = store
        self._clock = clock
        store.create(_DDL)
        self._seed()

    def _seed(self) -> None:
        with self._store.transaction():
            self._store.execute(
                "INSERT OR IGNORE INTO api_keys VALUES (?, 0, ?, NULL)",
                (API_KEY, json.dumps([MID])),
            )
            self._store.execute(
                "INSERT OR IGNORE INTO api_keys VALUES (?, 1, ?, NULL)",
                (ISV_API_KEY, json.dumps(list(ISV_MIDS))),
            )
            self._store.execute(
                "INSERT OR IGNORE INTO refresh_tokens VALUES (?, ?, NULL, 0)",
                (REFRESH_TOKEN, API_KEY),
            )

    # -- API keys --------------------------------------------------------------------------
    def credential(self, api_key: str) -> Credential | None:
        """The credential of a valid, unexpired key."""
        row = self._store.row("SELECT * FROM api_keys WHERE api_key = ?", (api_key,))
        if row is None or _expired(row["expires_at"], self._clock.time()):
            return None
        return Credential(api_key, bool(row["isv"]), tuple(json.loads(row["mids"])))

    def authenticate(self, request: web.Request) -> Credential:
        """The bearer key's credential, or 401."""
        key = bearer_token(request)
        if key is None:
            raise ApiError(401, "unauthorized", "missing Authorization: Bearer <api key>")
        credential = self.credential(key)
        if credential is None:
            raise ApiError(401, "invalid_token", "the API key is unknown or expired")
        return credential

    def refresh(self, first: str | None, second: str | None) -> dict[str, Any]:
        """Rotate: the current key and the refresh token, in either order (choices.md)."""
        now = self._clock.time()
        for key, token in ((first, second), (second, first)):
            if key is None or token is None:
                continue
            row = self._store.row(
                "SELECT * FROM refresh_tokens WHERE token = ? AND api_key = ?", (token, key)
            )
            if row is None or row["spent"] or _expired(row["expires_at"], now):
                continue
            return self._rotate(key, token, now)
        raise ApiError(401, "invalid_grant", "no valid refresh token for this API key")

    def refresh_token_for(self, api_key: str) -> str | None:
        """The refresh token that rotates ``api_key`` now (unspent, unexpired), if any.

        After the seeded ``sim_refresh_token`` was spent (and kept so by ``--data-dir``), the
        seeded key has none: the next key of its chain carries the live refresh token.
        """
        row = self._store.row(
            "SELECT token FROM refresh_tokens WHERE api_key = ? AND spent = 0 "
            "AND (expires_at IS NULL OR expires_at > ?) ORDER BY rowid DESC LIMIT 1",
            (api_key, self._clock.time()),
        )
        return None if row is None else str(row["token"])

    def _rotate(self, old_key: str, old_token: str, now: float) -> dict[str, Any]:
        owner = self._store.row("SELECT * FROM api_keys WHERE api_key = ?", (old_key,))
        if owner is None:
            raise RuntimeError("a key rotated that is not stored")
        new_key = f"sim_key_{secrets.token_hex(16)}"
        new_token = f"sim_refresh_{secrets.token_hex(16)}"
        key_expiry = now + API_KEY_LIFETIME
        token_expiry = now + REFRESH_TOKEN_LIFETIME
        with self._store.transaction():
            self._store.execute("UPDATE refresh_tokens SET spent = 1 WHERE token = ?", (old_token,))
            self._store.execute(
                "INSERT INTO api_keys VALUES (?, ?, ?, ?)",
                (new_key, owner["isv"], owner["mids"], key_expiry),
            )
            self._store.execute(
                "INSERT INTO refresh_tokens VALUES (?, ?, ?, 0)", (new_token, new_key, token_expiry)
            )
        return {
            "api_key": new_key,
            "public_key": PUBLIC_KEY,
            "refresh_token": new_token,
            "api_key_expires_at": int(key_expiry),
            "refresh_token_expires_at": int(token_expiry),
        }

    # -- WebSocket tokens ------------------------------------------------------------------
    def issue_ws_token(self, credential: Credential) -> tuple[str, int]:
        expires_at = self._clock.time() + WS_TOKEN_LIFETIME
        token = f"sim_ws_{secrets.token_hex(16)}"
        self._store.execute(
            "INSERT INTO ws_tokens VALUES (?, ?, ?, 0)", (token, credential.api_key, expires_at)
        )
        return token, int(expires_at)

    def consume_ws_token(self, token: str) -> Credential | None:
        """The token's credential when it is fresh and unused; it is spent either way."""
        row = self._store.row("SELECT * FROM ws_tokens WHERE token = ?", (token,))
        if row is None or row["used"]:
            return None
        self._store.execute("UPDATE ws_tokens SET used = 1 WHERE token = ?", (token,))
        if row["expires_at"] <= self._clock.time():
            return None
        return self.credential(row["api_key"])


def bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def _expired(expires_at: float | None, now: float) -> bool:
    return expires_at is not None and expires_at <= now
