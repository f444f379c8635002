"""Where the service is and who we are to it: the settings every service client starts from.

Also the one place where the timeouts of service calls are decided (:class:`CallKind`,
:meth:`ServiceSettings.timeouts`); docs/architecture.md has them as a table.
"""


import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from kiosk_agent.data_class import data_class
from kiosk_agent.service.errors import MissingCredentialsError
from kiosk_agent.service.timeouts import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT  # one default

NO_API_KEY = (
    "no payments API key configured: set service.api_key (KIOSK_API_KEY for the command line); "
    "payments and terminal calls need it, reporting and boarding use client_id/client_secret"
)


class CallKind(enum.Enum):
    """What a call is, for its timeouts (``Transport.send`` picks it unless told)."""

    CONTROL = "control"  # terminal list/connect/ping/status/cancel/print, ws-token, GETs: small
    MONEY = "money"  # a POST that may move money or start an interaction: one attempt only
    REPORT = "report"  # reporting and boarding (OAuth): pages of rows, slower to make
    AUTH = "auth"  # the OAuth token and the API key refresh
    WEBSOCKET = "websocket"  # the cable handshake (token, then the upgrade)


@data_class(frozen=True, slots=True)
class Timeouts:
    """Seconds. ``connect``: to open the connection; ``read``: the longest silence while waiting
    for or reading the answer (one attempt); ``total``: the whole call, every attempt, backoff,
    ``Retry-After`` wait and rate-limiter queue included. No call outlives ``total``."""

    connect: float
    read: float
    total: float


# A small answer that has not started within this long is not coming: ask again (retry-safe).
QUICK_READ = 5.0
# The cable handshake is given this long at most; the wait then polls instead.
WEBSOCKET_TOTAL = 10.0


# What a simulator's READY information gives a client: where it is and its merchant's keys.
_SIMULATOR_FIELDS = ("base_url", "reporting_url", "ws_url", "api_key", "refresh_token", "mid",
                     "client_id", "client_secret")  # fmt: skip


class ServiceSettings(BaseModel):
    """Addresses, credentials and tuning of the service client.

    Secrets are ``SecretStr``: ``repr``, logs and diagnostics show ``'**********'``.
    ``credentials_path`` is where a rotated API key and refresh token are kept; when the file
    exists it wins over ``api_key``/``refresh_token`` (those were only the first provisioning).

    ``api_key`` and ``mid`` are needed by payments and terminal calls only: someone who reports
    or boards with ``client_id``/``client_secret`` leaves them out, and a payments or terminal
    call then fails at once with :class:`MissingCredentialsError` saying what to set.
    """

    # hide_input_in_errors: a refused setting may be a key or a secret; never echo it.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    base_url: str
    api_key: SecretStr | None = None
    # Given as ``mid=``; read through the ``mid`` property, which says what is missing.
    configured_mid: str | None = Field(default=None, alias="mid")
    reporting_url: str | None = None  # default: base_url
    ws_url: str | None = None  # default: base_url with ws/wss
    refresh_token: SecretStr | None = None
    isv: bool = False  # an ISV key acting for ``mid``: mid travels with every terminal call
    client_id: str | None = None
    client_secret: SecretStr | None = None
    credentials_path: Path | None = None

    # tuning
    # The longest any one call may take, everything included (the CLI's --timeout); the
    # timeouts of each kind of call derive from it and connect_timeout (see timeouts()).
    timeout: float = Field(default=DEFAULT_TIMEOUT, gt=0)
    connect_timeout: float = Field(default=5.0, gt=0)
    max_retries: int = Field(default=4, ge=0)  # retries of a retry-safe call
    backoff_base: float = Field(default=0.2, gt=0)  # first retry delay, doubled each time
    backoff_max: float = Field(default=5.0, gt=0)
    rate_limit: float = Field(default=20.0, gt=0)  # terminal requests per second, per credential
    rate_burst: int = Field(default=40, ge=1)
    # how long to ride out 429s, seconds (within the call's total timeout)
    rate_limit_patience: float = Field(default=60.0, gt=0)
    poll_interval: float = Field(default=0.25, gt=0)  # interaction polling when not on WebSocket
    websocket: bool = True  # False: wait for interactions by polling only

    @model_validator(mode="after")
    def _trim_urls(self) -> "ServiceSettings":
        for name in ("base_url", "reporting_url", "ws_url"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, value.rstrip("/"))
        if not self.base_url.startswith(("http://", "https://")):
            # not echoed: a URL may carry a password (https://user:secret@host)
            raise ValueError("base_url must start with http:// or https://")
        return self

    @model_validator(mode="after")
    def _no_blank_credentials(self) -> "ServiceSettings":
        # A blank key or mid is a configuration slip, not "not configured": say so now.
        if self.api_key is not None and not self.api_key.get_secret_value().strip():
            raise ValueError("api_key is empty: leave it out, or give the payments API key")
        if self.configured_mid is not None and not self.configured_mid.strip():
            raise ValueError("mid is empty: leave it out, or give the merchant's mid")
        return self

    @property
    def mid(self) -> str:
        """The merchant the payments key acts for; MissingCredentialsError when not configured."""
        if self.configured_mid is None:
            raise MissingCredentialsError(
                "no merchant mid configured: set service.mid (KIOSK_MID for the command line); "
                "payments and terminal calls need it"
            )
        return self.configured_mid

    @classmethod
    def reaching_simulator(cls, ready: Mapping[str, Any], **tuning: Any) -> "ServiceSettings":
        """The settings that reach a simulator as its merchant, from its READY information
        (``SimServer.ready_info()``, or the JSON of its ``READY`` line); ``tuning``: the rest."""
        reach = {name: ready[name] for name in _SIMULATOR_FIELDS}
        return cls(**reach, **tuning)

    def replace(self, **changes: Any) -> "ServiceSettings":
        """A copy with ``changes`` applied and validated (secrets given as text become secret)."""
        current = self.model_dump(by_alias=True, exclude_none=True)
        return type(self).model_validate({**current, **changes})

    def timeouts(self, kind: CallKind) -> Timeouts:
        """The connect, read and total timeouts of one kind of call: the one table of them.

        - every call: connect within ``connect_timeout``, all of it within ``timeout``;
        - CONTROL and AUTH answers are small: silence for ``QUICK_READ`` s means a lost answer,
          and a retry-safe call asks again within its total;
        - MONEY is sent once (a lost answer is reconciled, never resent blind), so its one
          attempt may wait the whole ``timeout`` for an answer; REPORT pages take time to make;
        - WEBSOCKET: the handshake gets ``WEBSOCKET_TOTAL`` s at most; the wait then polls.
        """
        total = self.timeout
        connect = min(self.connect_timeout, total)
        quick = min(QUICK_READ, total)
        if kind in (CallKind.CONTROL, CallKind.AUTH):
            return Timeouts(connect, quick, total)
        if kind is CallKind.WEBSOCKET:
            return Timeouts(connect, quick, min(WEBSOCKET_TOTAL, total))
        return Timeouts(connect, total, total)  # MONEY, REPORT

    @property
    def reporting_base(self) -> str:
        return self.reporting_url or self.base_url

    @property
    def websocket_base(self) -> str:
        if self.ws_url:
            return self.ws_url
        scheme, rest = self.base_url.split("://", 1)
        return f"{'wss' if scheme == 'https' else 'ws'}://{rest}"
