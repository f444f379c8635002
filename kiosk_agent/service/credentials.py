"""The payments API key and its refresh token: rotated in one place, saved before they are used.

A refresh spends the old refresh token. If the new pair lived only in memory, a crash right after
the refresh would leave the device with a spent token and no way back in. So the new pair is
written to disk atomically (temp file, fsync, rename, 0600) *before* any request uses the new key.

Refreshes are single-flight: however many calls find the key expiring (or get a 401) at once, the
service sees one refresh and every caller continues with its result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path

from kiosk_agent import durable
from kiosk_agent.data_class import data_class
from kiosk_agent.service.errors import (
    AuthenticationError,
    CredentialsError,
    MissingCredentialsError,
    ServiceError,
)
from kiosk_agent.service.models.payments import ApiKeySet

_LOGGER = logging.getLogger(__name__)

# Refresh when less than this share of the key's life is left (and at most this many seconds
# ahead): a one-hour key is refreshed a minute early, a key shortened by a time scale in step.
REFRESH_SHARE = 0.1
REFRESH_AHEAD_MAX = 60.0
NOMINAL_KEY_LIFETIME = 3600.0  # a payments API key lives one hour (pub)
MAX_PLAUSIBLE_LIFETIME = 2 * 86400.0


@data_class(frozen=True, slots=True)
class ApiCredentials:
    """A payments API key with its refresh token and expiry times (Unix seconds; None: unknown)."""

    api_key: str
    refresh_token: str | None = None
    api_key_expires_at: float | None = None
    refresh_token_expires_at: float | None = None
    public_key: str | None = None
    issued_at: float | None = None

    def __repr__(self) -> str:
        return f"ApiCredentials(api_key_expires_at={self.api_key_expires_at})"

    def refresh_due(self, now: float) -> bool:
        """True when the key expires soon enough that it should be refreshed now."""
        expires = self._local_expiry(now)
        if expires is None:
            return False
        ahead = min(REFRESH_AHEAD_MAX, self._lifetime(now) * REFRESH_SHARE)
        return now >= expires - ahead

    def expired(self, now: float) -> bool:
        expires = self._local_expiry(now)
        return expires is not None and now >= expires

    def _lifetime(self, now: float) -> float:
        # The service's expiry against our clock at issue. A kiosk's clock can be far off (no
        # RTC before NTP): a lifetime that is negative or absurd means the clocks disagree, and
        # the key is taken to live its nominal hour from when we got it, so a wrong clock can
        # neither make every call refresh nor keep a dead key forever (a 401 still renews it).
        if self.api_key_expires_at is None:
            raise RuntimeError("an API key without its expiry")
        issued = self.issued_at if self.issued_at is not None else now
        life = self.api_key_expires_at - issued
        return life if 0 < life <= MAX_PLAUSIBLE_LIFETIME else NOMINAL_KEY_LIFETIME

    def _local_expiry(self, now: float) -> float | None:
        if self.api_key_expires_at is None:
            return None
        issued = self.issued_at if self.issued_at is not None else now
        return issued + self._lifetime(now)

    @classmethod
    def from_key_set(cls, keys: ApiKeySet, now: float) -> ApiCredentials:
        return cls(
            api_key=keys.api_key,
            refresh_token=keys.refresh_token,
            api_key_expires_at=float(keys.api_key_expires_at),
            refresh_token_expires_at=float(keys.refresh_token_expires_at),
            public_key=keys.public_key,
            issued_at=now,
        )


class CredentialStore:
    """The credentials file: JSON, mode 0600, replaced atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> ApiCredentials | None:
        """The saved credentials, or None when there is no file yet."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CredentialsError(f"cannot read credentials file {self.path}: {exc}") from exc
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            if not isinstance(data.get("api_key"), str):
                raise KeyError("api_key")
            fields = ApiCredentials.__dataclass_fields__
            return ApiCredentials(**{k: v for k, v in data.items() if k in fields})
        except (ValueError, TypeError, KeyError) as exc:
            raise CredentialsError(f"credentials file {self.path} is corrupt: {exc!r}") from exc

    def save(self, credentials: ApiCredentials) -> None:
        """Write atomically: a crash leaves either the old file or the new one, never half."""
        directory = self.path.parent
        temp = directory / f".{self.path.name}.{os.getpid()}.tmp"
        data = json.dumps(asdict(credentials)).encode()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.fchmod(fd, 0o600)  # O_CREAT's mode is masked by umask; be exact
                os.write(fd, data)
            finally:
                os.close(fd)
            durable.replace(temp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise CredentialsError(f"cannot save credentials to {self.path}: {exc}") from exc


# (current api key, refresh token) -> the new key set, from the service
Refresher = Callable[[str, str], Awaitable[ApiKeySet]]


class ApiKeyManager:
    """Hands out a valid API key, refreshing it once however many callers need it at once.

    ``credentials`` is None when no key is configured (a reporting-only client): asking for a
    key then raises :class:`MissingCredentialsError` with ``missing``, the message that says
    what to set.
    """

    def __init__(
        self,
        credentials: ApiCredentials | None,
        refresher: Refresher,
        store: CredentialStore | None = None,
        clock: Callable[[], float] = time.time,
        *,
        missing: str = "no payments API key configured",
    ) -> None:
        self._credentials = credentials
        self._refresher = refresher
        self._store = store
        self._clock = clock
        self._lock = asyncio.Lock()
        self.refresh_count = 0
        self._missing = missing
        self._listeners: list[Callable[[ApiCredentials], None]] = []

    @property
    def configured(self) -> bool:
        return self._credentials is not None

    @property
    def credentials(self) -> ApiCredentials:
        if self._credentials is None:
            raise MissingCredentialsError(self._missing)
        return self._credentials

    @property
    def api_key(self) -> str:
        return self.credentials.api_key

    def on_rotate(self, listener: Callable[[ApiCredentials], None]) -> None:
        """Call ``listener`` with the new credentials after each saved rotation (e.g. health)."""
        self._listeners.append(listener)

    async def valid_key(self) -> str:
        """The key to send now: refreshed first when it is about to expire."""
        current = self.credentials
        if not current.refresh_due(self._clock()) or current.refresh_token is None:
            return current.api_key
        try:
            return await self.refresh(stale_key=current.api_key)
        except ServiceError as exc:
            if current.expired(self._clock()):
                raise
            # The old key still works for a while: carry on and try again on the next call.
            _LOGGER.warning("API key refresh ahead of expiry failed, will retry: %s", exc)
            return current.api_key

    async def refresh(self, stale_key: str | None = None) -> str:
        """Rotate the key unless another caller already replaced ``stale_key``; the new key."""
        async with self._lock:
            current = await self._latest()
            if stale_key is not None and current.api_key != stale_key:
                return current.api_key  # rotated by a concurrent caller while we waited
            if current.refresh_token is None:
                raise AuthenticationError("the API key was refused and there is no refresh token")
            keys = await self._refresher(current.api_key, current.refresh_token)
            rotated = ApiCredentials.from_key_set(keys, self._clock())
            if self._store is not None:
                await asyncio.to_thread(self._save_or_log, rotated)
            self._credentials = rotated
            self.refresh_count += 1
            _LOGGER.info("API key rotated; new key expires at %s", rotated.api_key_expires_at)
            for listener in self._listeners:
                listener(rotated)
            return rotated.api_key

    async def _latest(self) -> ApiCredentials:
        """Ours, or the saved pair when someone else rotated since we read it.

        Another client on the same file (in this process, or ``kiosk-agent keys refresh`` run
        beside the agent) may have spent our refresh token: the saved pair holds the live one.
        """
        current = self.credentials
        if self._store is None:
            return current
        try:
            saved = await asyncio.to_thread(self._store.load)
        except CredentialsError as exc:
            _LOGGER.warning("%s; going on with the key held in memory", exc)
            return current
        if saved is None or saved.api_key == current.api_key or not _newer(saved, current):
            return current
        self._credentials = saved
        _LOGGER.info("API key rotated by another client; taking the saved one")
        for listener in self._listeners:
            listener(saved)
        return saved

    def _save_or_log(self, credentials: ApiCredentials) -> None:
        if self._store is None:
            raise RuntimeError("credentials saved without a store")
        try:
            self._store.save(credentials)
        except CredentialsError as exc:
            # The old refresh token is already spent, so the new pair must still be used; say
            # loudly that a restart would not find it.
            _LOGGER.error("%s; the rotated key is held in memory only", exc)


def _newer(saved: ApiCredentials, current: ApiCredentials) -> bool:
    """True when ``saved`` was issued after ``current`` (provisioned keys have no issue time)."""
    if saved.issued_at is None:
        return False
    return current.issued_at is None or saved.issued_at > current.issued_at
