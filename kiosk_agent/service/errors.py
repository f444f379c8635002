"""Typed errors of the payment service, one per way a call can end badly.

Every error derives :class:`ServiceError`, so a caller that only wants "did it work" catches one
class, and a caller that must decide (retry? reconcile? tell the customer?) catches the precise
one. ``status`` is the HTTP status when there was an answer; ``error`` and ``description`` are the
service's own ``error`` / ``error_description`` when its body carried them.
"""

from __future__ import annotations

import os
import socket
import sys

from kiosk_agent.redact import redact


class ServiceError(Exception):
    """Base of every error raised by the service client."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        error: str | None = None,
        description: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        # The service's own words may quote what it was sent (a token, a card number).
        self.error = redact(error) if error else error
        self.description = redact(description) if description else description
        # set on errors of a charge whose outcome is unknown: the id to reconcile it by
        self.order_id: str | None = None

    def __str__(self) -> str:
        parts = [self.message]
        if self.error and self.error not in self.message:
            parts.append(f"[{self.error}]")
        if self.description and self.description not in self.message:
            parts.append(f"({self.description})")
        return " ".join(parts)


def network_words(exc: BaseException) -> str:
    """A failed connection for people: where, and why in plain words. No library's names
    (``ClientConnectorError``) nor its internals (``ssl:default`` on plain http) reach a
    person."""
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if not type(exc).__module__.startswith("aiohttp"):  # the standard library's (`health`):
        return _os_words(exc) if isinstance(exc, OSError) else str(exc) or "failed"  # no import
    import aiohttp

    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect to {exc.host}:{exc.port}: {_os_words(exc.os_error)}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the connection was closed before the answer came"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the answer was cut short"
    if isinstance(exc, aiohttp.ClientOSError | OSError):
        return _os_words(exc)
    if isinstance(exc, aiohttp.InvalidURL):
        return f"not an address: {exc.url}"
    if isinstance(exc, aiohttp.ClientError):
        return "the connection failed"
    return str(exc) or "failed"


def describe(err: BaseException) -> str:
    """An error in words: a failed connection as where and why, no library jargon (the
    doctor's checks, `health`)."""
    if isinstance(err, TimeoutError):
        return "timed out"
    if isinstance(err, OSError) or type(err).__module__.startswith("aiohttp"):
        return network_words(err)
    return str(err) or type(err).__name__


def _os_words(err: OSError) -> str:
    if isinstance(err, socket.gaierror):
        return "no such host (the name does not resolve)"
    if isinstance(err, ConnectionRefusedError):
        return "nothing listens there (connection refused)"
    if isinstance(err, TimeoutError):
        return "no answer in time"
    # ssl as loaded by whatever made the connection: without it, no TLS error can have happened
    # (a command that reads the journal imports this module and never connects)
    ssl = sys.modules.get("ssl")
    if ssl is not None and isinstance(err, ssl.SSLError):
        return "the TLS handshake failed (is it https?)"
    if err.errno:
        return os.strerror(err.errno).lower()
    return "the connection failed"


def conflict_words(err: ServiceError, device: str) -> str:
    """A 409 from the terminal interface for people: an offline reader is offline, not busy,
    and no ``HTTP 409 [code]`` reaches the person."""
    if err.error == "terminal_offline":
        return f"terminal offline: {device} does not answer (check its power and network)"
    if err.error == "terminal_busy":
        return f"terminal busy: {device} is already reading or charging a card"
    return f"terminal refused: {err.description or err.error or err.message}"


class BadRequestError(ServiceError):
    """400: the service refused the request as given (fix the request, do not retry)."""


class AuthenticationError(ServiceError):
    """401: missing, invalid or expired credentials that a refresh could not repair."""


class MissingCredentialsError(AuthenticationError):
    """The settings lack what this call needs (no payments API key, no mid, no OAuth client).

    Raised before anything is sent; the message names the setting to add.
    """


class NotFoundError(ServiceError):
    """404: the resource does not exist (or was deleted)."""


class ConflictError(ServiceError):
    """409: the resource's state forbids the call (``terminal_busy``, ``not_cancellable``)."""


class RateLimitedError(ServiceError):
    """429 that outlasted the client's patience; ``retry_after`` is in seconds when known."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        status: int | None = 429,
        error: str | None = None,
        description: str | None = None,
    ) -> None:
        super().__init__(message, status=status, error=error, description=description)
        self.retry_after = retry_after


class ServerError(ServiceError):
    """5xx: the service failed. After a POST the outcome is unknown: reconcile, never re-send."""


class ServiceUnreachableError(ServiceError):
    """No answer (network error, timeout). After a POST the outcome is unknown: reconcile."""


class InvalidResponseError(ServiceError):
    """The service answered, but not as the interface promises; ``field`` names what was wrong.

    ``field`` is a dotted path into the body (``"terminals.0.capabilities"``), or ``"<body>"`` when
    the body itself was not JSON (an HTML error page, a truncated answer).
    """

    def __init__(self, message: str, *, field: str, status: int | None = None) -> None:
        super().__init__(message, status=status)
        self.field = field


class InvalidServerResponseError(InvalidResponseError, ServerError):
    """A 5xx whose body is not the interface's JSON (a proxy's HTML 502 page): both at once."""


# After a call that may move money, these leave its outcome unknown: the service failed (5xx),
# never answered, or answered 2xx (it did the work) with a body that cannot be read (cut short,
# wrong types). Look it up (reconcile), never call it refused nor send it again.
OUTCOME_UNKNOWN: tuple[type[ServiceError], ...] = (
    ServerError, ServiceUnreachableError, InvalidResponseError,
)


class CredentialsError(ServiceError):
    """The stored credentials cannot be read or written (corrupt or unwritable file)."""


STATUS_ERRORS: dict[int, type[ServiceError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    429: RateLimitedError,
}


def error_class_for(status: int) -> type[ServiceError]:
    """The error class of an HTTP error status (other 4xx -> ServiceError, 5xx -> ServerError)."""
    if status >= 500:
        return ServerError
    return STATUS_ERRORS.get(status, ServiceError)
