"""HTTP plumbing shared by every simulator module: error bodies, strict JSON bodies, a safety net.

Handlers raise :class:`ApiError`; the middleware turns it into the interface's error body
``{error, error_description}``. A malformed request is always a 400 naming what was wrong,
and an unexpected exception becomes a logged 500 while the server keeps serving.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from decimal import Decimal
from typing import Any

from aiohttp import web

from kiosk_agent.money import MoneyError, dollars_to_cents

_LOGGER = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
# A bytes marker no JSON string can contain unescaped: Decimals are written as bare numbers.
_DECIMAL_MARK = "\x00dec:"
_DECIMAL_TOKEN = re.compile(r'"\\u0000dec:(-?\d+(?:\.\d+)?)"')

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    """An error answer: ``status`` with ``{error, error_description}``."""

    def __init__(
        self,
        status: int,
        error: str,
        description: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {error}: {description}")
        self.status = status
        self.error = error
        self.description = description
        self.headers = dict(headers or {})


def bad_request(description: str, error: str = "invalid_request") -> ApiError:
    return ApiError(400, error, description)


def not_found(description: str, error: str = "not_found") -> ApiError:
    return ApiError(404, error, description)


def api_error(
    status: int, error: str, description: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    return json_response({"error": error, "error_description": description}, status, headers)


def dumps(data: Any) -> str:
    """JSON text; a ``Decimal`` is written as an exact JSON number, never through a float."""
    text = json.dumps(data, default=_encode_decimal, separators=(",", ":"))
    return _DECIMAL_TOKEN.sub(r"\1", text) if _DECIMAL_MARK[1:] in text else text


def _encode_decimal(value: Any) -> Any:
    if isinstance(value, Decimal):
        return f"{_DECIMAL_MARK}{value:f}"
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def json_response(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        text=dumps(data), status=status, headers=headers, content_type="application/json"
    )


async def read_json(request: web.Request, max_bytes: int = MAX_BODY_BYTES) -> Body:
    """The request's JSON object body, or a 400 saying exactly why not."""
    if request.content_type != "application/json":
        raise bad_request(
            f"expected Content-Type: application/json, got {request.content_type or 'none'!r}"
        )
    if request.content_length is not None and request.content_length > max_bytes:
        raise bad_request(f"body is {request.content_length} bytes; the limit is {max_bytes}")
    raw = await _read_limited(request, max_bytes)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise bad_request("body is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise bad_request(
            f"body is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}"
        ) from None
    if not isinstance(data, dict):
        raise bad_request(f"body must be a JSON object, got {_json_type(data)}")
    return Body(data)


# Where a body read ahead (by a fault that holds the request) is kept for the handler.
READ_AHEAD = web.RequestKey("sim.body", bytes)


async def read_ahead(request: web.Request, max_bytes: int = MAX_BODY_BYTES) -> None:
    """Read the body now, so the handler can still use it once the client has gone away."""
    request[READ_AHEAD] = await _read_limited(request, max_bytes)


async def _read_limited(request: web.Request, max_bytes: int) -> bytes:
    """The whole body (a read returns what has arrived, so loop), refusing more than the limit."""
    if READ_AHEAD in request:
        return request[READ_AHEAD]
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(max_bytes + 1 - size):
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise bad_request(f"body is over the limit of {max_bytes} bytes")
    return b"".join(chunks)


class Body:
    """Typed access to a JSON object's fields; every problem is a 400 naming the field."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def __contains__(self, name: str) -> bool:
        return name in self.data and self.data[name] is not None

    def _get(self, name: str, required: bool) -> Any:
        value = self.data.get(name)
        if value is None and required:
            raise bad_request(f"missing required field {name!r}")
        return value

    def text(self, name: str, *, required: bool = False, max_length: int = 512) -> str | None:
        value = self._get(name, required)
        if value is None:
            return None
        if not isinstance(value, str):
            raise bad_request(f"field {name!r} must be a string, got {_json_type(value)}")
        if required and not value.strip():
            raise bad_request(f"field {name!r} must not be empty")
        if len(value) > max_length:
            raise bad_request(f"field {name!r} is longer than {max_length} characters")
        return value

    def req_text(self, name: str, *, max_length: int = 512) -> str:
        value = self.text(name, required=True, max_length=max_length)
        if value is None:
            raise RuntimeError(f"{name} is required")
        return value

    def integer(
        self, name: str, *, required: bool = False, minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | None:  # fmt: skip
        value = self._get(name, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_request(f"field {name!r} must be an integer, got {_json_type(value)}")
        if minimum is not None and value < minimum:
            raise bad_request(f"field {name!r} must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise bad_request(f"field {name!r} must be at most {maximum}, got {value}")
        return value

    def cents(self, name: str, *, required: bool = False) -> int | None:
        """An amount in integer cents (never a float or a dollar string)."""
        return self.integer(name, required=required, minimum=1, maximum=99_999_999_99)

    def req_cents(self, name: str) -> int:
        value = self.cents(name, required=True)
        if value is None:
            raise RuntimeError(f"{name} is required")
        return value

    def dollars(self, name: str, *, required: bool = False) -> int | None:
        """A positive amount sent as dollars text (``"12.50"``), as integer cents."""
        text = self.text(name, required=required)
        if text is None:
            return None
        try:
            cents = dollars_to_cents(text)
        except MoneyError as err:
            raise bad_request(f'field {name!r} must be dollars like "12.50": {err}') from None
        if cents <= 0:
            raise bad_request(f"field {name!r} must be above zero, got {text!r}")
        return cents

    def req_dollars(self, name: str) -> int:
        value = self.dollars(name, required=True)
        if value is None:
            raise RuntimeError(f"{name} is required")
        return value

    def flag(self, name: str, *, default: bool = False) -> bool:
        value = self._get(name, False)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise bad_request(f"field {name!r} must be true or false, got {_json_type(value)}")
        return value

    def choice(
        self, name: str, allowed: tuple[str, ...], *, default: str | None = None,
        required: bool = False,
    ) -> str | None:  # fmt: skip
        value = self.text(name, required=required)
        if value is None:
            return default
        if value not in allowed:
            raise bad_request(f"field {name!r} must be one of {', '.join(allowed)}; got {value!r}")
        return value

    def array(self, name: str) -> list[Any] | None:
        value = self._get(name, False)
        if value is None:
            return None
        if not isinstance(value, list):
            raise bad_request(f"field {name!r} must be a list, got {_json_type(value)}")
        return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def query_int(
    request: web.Request, name: str, default: int, minimum: int = 0, maximum: int | None = None
) -> int:
    """An integer query parameter, or a 400 naming it."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"query parameter {name!r} must be an integer, got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and at most {maximum}" if maximum is not None else ""
        raise bad_request(f"query parameter {name!r} must be at least {minimum}{upper}")
    return value


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        return api_error(err.status, err.error, err.description, err.headers)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        # Routing errors (404 unknown path, 405 wrong method, 413) in the interface's body form.
        error = {404: "not_found", 405: "method_not_allowed"}.get(err.status, "invalid_request")
        if err.status == 413:
            return api_error(400, "invalid_request", "request body is too large")
        return api_error(err.status, error, err.reason, _passthrough_headers(err))
    except Exception:
        _LOGGER.exception("Unexpected error serving %s %s", request.method, request.path)
        return api_error(500, "server_error", "the simulator failed on this request; see its log")


def _passthrough_headers(err: web.HTTPException) -> dict[str, str]:
    allow = err.headers.get("Allow")
    return {"Allow": allow} if allow else {}
