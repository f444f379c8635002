"""One aiohttp session for the whole service: auth, key refresh, OAuth, ISV mid, retries, limits.

Retry rules, because money moves on some of these calls:

* A request that never left (connection refused) or that the service refused before doing
  anything (429, 401 before a refresh) is always safe to send again.
* GET, PUT and DELETE are idempotent: retried after 5xx and network errors, with capped
  exponential backoff and jitter.
* A POST that may have been processed (a lost answer, a 5xx) is never sent again blind: the caller
  gets ``ServiceUnreachableError``/``ServerError`` and reconciles by ``order_id``. Only POSTs that
  are safe to repeat (the key refresh with the same token, a WebSocket token) opt in.

Timeouts: each call has a kind (``settings.CallKind``) and the connect, read and total timeouts
of that kind (``ServiceSettings.timeouts``). The total bounds the whole call, retries, backoff,
``Retry-After`` waits and the rate limiter's queue included: a service that accepts the
connection and never answers costs a call its total timeout, then a ``ServiceUnreachableError``
that says so.

Observers: whoever wants to time the calls (the admin API's ``/metrics``) registers a
``CallObserver`` with :meth:`Transport.observe`; each finished call is reported once as its kind,
its seconds on the monotonic clock (every attempt included) and an outcome from ``CALL_OUTCOMES``.
The service layer knows nothing of who listens.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

import aiohttp
from pydantic import BaseModel

from kiosk_agent.redact import redirect_target
from kiosk_agent.service.credentials import (
    ApiCredentials,
    ApiKeyManager,
    CredentialStore,
)
from kiosk_agent.service.errors import (
    CredentialsError,
    InvalidResponseError,
    InvalidServerResponseError,
    MissingCredentialsError,
    RateLimitedError,
    ServiceError,
    ServiceUnreachableError,
    error_class_for,
    network_words,
)
from kiosk_agent.service.models.common import ErrorBody, ServiceModel
from kiosk_agent.service.models.payments import ApiKeySet
from kiosk_agent.service.parsing import BODY, decode_json, describe_body, parse, parse_json
from kiosk_agent.service.ratelimit import RateLimiter, share_limiter, shared_limiter
from kiosk_agent.service.redirects import service_session
from kiosk_agent.service.settings import NO_API_KEY, CallKind, ServiceSettings, Timeouts

_LOGGER = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

OAUTH_TOKEN_PATH = "/ords/sprint/oauth/token"  # noqa: S105 (a path, not a secret)
REFRESH_PATH = "/api/v1/api_keys/refresh"
# Terminal endpoints share the service's per-credential rate limit.
# The largest answer read: a reporting page of 1000 rows is about 1 MB.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
_RATE_LIMITED_PREFIXES = ("/api/terminal", "/api/ws-token")
_IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})

# How a call ended, for observers: answered 2xx; answered with an error (4xx/5xx, a bad body);
# no answer (network, timeout: the outcome of a POST is unknown).
CALL_OUTCOMES = ("ok", "error", "unreachable")
CallObserver = Callable[[CallKind, float, str], None]


class Auth(enum.Enum):
    API_KEY = "api_key"  # payments and terminal: the (refreshed) payments API key
    OAUTH = "oauth"  # reporting and boarding: the client-credentials access token
    NONE = "none"


class MidPlacement(enum.Enum):
    """Where an ISV key's merchant mid travels (only when ``settings.isv``)."""

    QUERY = "query"
    BODY = "body"  # send_receipt
    NONE = "none"


class Transport:
    """The shared HTTP layer under every service client.

    A ``session`` given from outside is the caller's: make it with
    ``redirects.service_session`` so that the cable's handshake refuses a redirect too.
    """

    def __init__(
        self, settings: ServiceSettings, *, session: aiohttp.ClientSession | None = None
    ) -> None:
        self.settings = settings
        self._session = session
        self._own_session = session is None
        # the middlewares of each call's request: none on the transport's own session, whose
        # one (redirects.refuse_upgrade_redirects) is for the cable's handshake alone (a call
        # follows no redirect anyway); a session given from outside keeps its own
        self._call_middlewares: tuple[()] | None = () if session is None else None
        self.store = (
            CredentialStore(settings.credentials_path) if settings.credentials_path else None
        )
        self.keys = ApiKeyManager(
            self._initial_credentials(), self._refresh_keys, self.store, missing=NO_API_KEY
        )
        self._limiter: RateLimiter | None = None
        self.keys.on_rotate(self._keep_limiter)
        self.oauth = OAuthTokens(self)
        self.rate_limited_count = 0  # 429 answers seen (diagnostics)
        self._observers: list[CallObserver] = []
        # each kind's timeouts, for the settings they were made from (_timeouts_of)
        self._timeouts_for: ServiceSettings | None = None
        self._timeouts_by_kind: dict[CallKind, tuple[Timeouts, aiohttp.ClientTimeout, float]] = {}

    def _initial_credentials(self) -> ApiCredentials | None:
        settings = self.settings
        if self.store is not None:
            try:
                saved = self.store.load()
            except CredentialsError as exc:
                _LOGGER.error("%s; falling back to the configured API key", exc)
                saved = None
            if saved is not None:
                return saved
        if settings.api_key is None:
            return None  # reporting and boarding only; payments and terminal calls will say so
        refresh = settings.refresh_token.get_secret_value() if settings.refresh_token else None
        return ApiCredentials(api_key=settings.api_key.get_secret_value(), refresh_token=refresh)

    # -- observers -----------------------------------------------------------------------------

    def observe(self, observer: CallObserver) -> Callable[[], None]:
        """Call ``observer(kind, seconds, outcome)`` after every call; returns the unsubscribe."""
        self._observers.append(observer)
        return lambda: self._observers.remove(observer) if observer in self._observers else None

    def report_call(self, kind: CallKind, started: float, outcome: str) -> None:
        """Tell the observers a call of ``kind`` begun at ``started`` (monotonic) ended so."""
        seconds = time.monotonic() - started
        for observer in list(self._observers):
            try:
                observer(kind, seconds, outcome)
            except Exception:  # an observer's bug must not turn an answered call into an error
                _LOGGER.exception("call observer failed")

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        if self._session is None:
            # A floor for anything sent on the session directly; calls through send() set their
            # own kind's timeouts.
            timeouts = self.settings.timeouts(CallKind.MONEY)
            timeout = aiohttp.ClientTimeout(total=timeouts.total, sock_connect=timeouts.connect)
            self._session = service_session(timeout=timeout, raise_for_status=False)

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None

    @property
    def limiter(self) -> RateLimiter:
        """The rate limiter of this client's API key, shared by every client of the process
        that uses the same key on the same service (taken on first use, in the event loop)."""
        if self._limiter is None:
            settings = self.settings
            self._limiter = shared_limiter(
                settings.base_url, self.keys.api_key, settings.rate_limit, settings.rate_burst
            )
        return self._limiter

    def _keep_limiter(self, rotated: ApiCredentials) -> None:
        # A client that starts later with the rotated key (read from the credentials file)
        # must find this limiter, not a fresh one.
        if self._limiter is not None:
            share_limiter(self.settings.base_url, rotated.api_key, self._limiter)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the service client is not started (use `async with`)")
        return self._session

    # -- requests ------------------------------------------------------------------------------

    def url(self, path: str) -> str:
        """An absolute URL for a path on the base address (absolute URLs pass through)."""
        if path.startswith(("http://", "https://")):
            return path
        return f"{self.settings.base_url}{path}"

    def reporting_url(self, path: str) -> str:
        return f"{self.settings.reporting_base}{path}"

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, str | int] | None = None,
        auth: Auth = Auth.API_KEY,
        mid: MidPlacement = MidPlacement.QUERY,
        retry_safe: bool | None = None,
        rate_limited: bool | None = None,
        kind: CallKind | None = None,
        what: str | None = None,
    ) -> Any:
        """Send one call and return its decoded JSON (None for an empty body).

        ``path`` is relative to the base address, or an absolute URL (reporting, boarding).
        ``retry_safe`` defaults to True for GET/PUT/DELETE; ``rate_limited`` to True for
        terminal endpoints.
        """
        label = _label(method, path, what)
        _status, body, content_type = await self.send(
            method,
            path,
            json=json,
            params=params,
            auth=auth,
            mid=mid,
            retry_safe=retry_safe,
            rate_limited=rate_limited,
            kind=kind,
            what=label,
        )
        if not body.strip():
            return None
        return decode_json(body, what=label, content_type=content_type)

    async def request_model(
        self, model: type[M], method: str, path: str, *, what: str | None = None, **kwargs: Any
    ) -> M:
        """Like :meth:`request`, validated straight from the bytes into ``model``."""
        label = _label(method, path, what)
        _status, body, _ctype = await self.send(method, path, what=label, **kwargs)
        return parse_json(model, body, what=label)

    async def oauth_request(
        self,
        method: str,
        url: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, str | int] | None = None,
        what: str | None = None,
    ) -> Any:
        """A reporting or boarding call with the OAuth access token; decoded JSON back."""
        return await self.request(
            method,
            url,
            json=json,
            params=params,
            auth=Auth.OAUTH,
            mid=MidPlacement.NONE,
            rate_limited=False,
            what=what,
        )

    async def send(
        self,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, str | int] | None = None,
        data: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: Auth = Auth.API_KEY,
        mid: MidPlacement = MidPlacement.QUERY,
        retry_safe: bool | None = None,
        rate_limited: bool | None = None,
        kind: CallKind | None = None,
        what: str = "",
    ) -> tuple[int, bytes, str]:
        """The retry loop: (status, body, content type) of a 2xx, or a typed ServiceError.

        ``kind`` (its timeouts) defaults to REPORT for OAuth calls, CONTROL for retry-safe ones
        and MONEY for the rest.
        """
        method = method.upper()
        what = what or _label(method, path, what)  # request() and request_model() name it
        if retry_safe is None:
            retry_safe = method in _IDEMPOTENT_METHODS
        if rate_limited is None:
            rate_limited = path.startswith(_RATE_LIMITED_PREFIXES)
        if kind is None:
            kind = (
                CallKind.REPORT if auth is Auth.OAUTH
                else CallKind.CONTROL if retry_safe else CallKind.MONEY
            )  # fmt: skip
        timeouts, client_timeout, patience = self._timeouts_of(kind)
        call = _Call(
            method, self.url(path), what, *self._place_mid(auth, mid, json, params),
            data, headers, auth, retry_safe, rate_limited, client_timeout,
            time.monotonic() + patience, [],
        )  # fmt: skip
        started, outcome = time.monotonic(), "error"
        try:
            async with asyncio.timeout(timeouts.total):
                answer = await self._attempts(call)
        except TimeoutError:
            outcome = "unreachable"
            unknown = "" if retry_safe else "; outcome unknown: reconcile before retrying"
            # the attempts' own failure says why ("nothing listens there"), when there was one
            why = f"; the last try: {call.failures[-1]}" if call.failures else ""
            raise ServiceUnreachableError(
                f"{what}: no answer within {timeouts.total:g} s (the {kind.value} call's total "
                f"timeout){why}{unknown}"
            ) from None
        except ServiceUnreachableError:
            outcome = "unreachable"
            raise
        except asyncio.CancelledError:
            outcome = ""  # the caller gave up: the call did not end, it was abandoned
            raise
        else:
            outcome = "ok"
            return answer
        finally:
            if outcome:
                self.report_call(kind, started, outcome)

    def _timeouts_of(self, kind: CallKind) -> tuple[Timeouts, aiohttp.ClientTimeout, float]:
        """One kind of call's timeouts, aiohttp's per-request timeout made of them and its
        patience for 429 waits: made once per kind (and per settings), not at every request."""
        settings = self.settings
        if self._timeouts_for is not settings:
            self._timeouts_for, self._timeouts_by_kind = settings, {}
        made = self._timeouts_by_kind.get(kind)
        if made is None:
            timeouts = settings.timeouts(kind)
            made = self._timeouts_by_kind[kind] = (
                timeouts,
                aiohttp.ClientTimeout(sock_connect=timeouts.connect, sock_read=timeouts.read),
                min(settings.rate_limit_patience, timeouts.total),
            )
        return made

    async def _attempts(self, call: _Call) -> tuple[int, bytes, str]:
        what, headers, auth, retry_safe = call.what, call.headers, call.auth, call.retry_safe
        rate_limited, patience_ends = call.rate_limited, call.patience_ends
        attempt = 0
        renewed = False
        limiter = self.limiter if rate_limited else None  # a property: read once a call
        while True:
            if limiter is not None:
                await limiter.acquire()
            token = await self._bearer(auth)
            call_headers = dict(headers or {})
            if token is not None:
                call_headers["Authorization"] = f"Bearer {token}"
            attempt += 1
            try:
                # the exchange in place, not a coroutine of its own: each of a call's waits
                # resumed one more frame (two Python calls a charge-card, and its making).
                # No redirect is followed: a 307 would send the call (a charge, its card
                # token) to whatever server the answer names, and read that server's answer
                # as the service's.
                async with self.session.request(
                    call.method, call.url, json=call.json, params=call.params, data=call.data,
                    headers=call_headers, timeout=call.timeout, allow_redirects=False,
                    middlewares=self._call_middlewares,
                ) as resp:  # fmt: skip
                    answer = _Answer(
                        resp.status, await _read_bounded(resp, call.what), resp.content_type,
                        resp.headers.get("Retry-After"), resp.headers.get("Location"),
                    )  # fmt: skip
            except aiohttp.ClientConnectorError as exc:
                call.failures.append(network_words(exc))
                if await self._backed_off(attempt):  # never reached the service: always safe
                    continue
                raise ServiceUnreachableError(f"{what}: {network_words(exc)}") from exc
            except (aiohttp.ClientError, TimeoutError) as exc:
                if retry_safe and await self._backed_off(attempt):
                    continue
                outcome = "" if retry_safe else "; outcome unknown: reconcile before retrying"
                raise ServiceUnreachableError(
                    f"{what}: no answer ({network_words(exc)}){outcome}"
                ) from exc
            _LOGGER.debug("%s -> %s (%d bytes)", what, answer.status, len(answer.body))

            if limiter is not None and answer.status != 429:
                limiter.succeeded()
            if 200 <= answer.status < 300:
                return answer.status, answer.body, answer.content_type
            if answer.status == 401 and auth is not Auth.NONE and not renewed:
                renewed = True  # refused before any work was done: renew once and resend
                await self._renew(auth, token)
                continue
            if answer.status == 429 and await self._waited_out(answer, rate_limited, patience_ends):
                continue  # refused before any work was done: safe for every method
            if answer.status >= 500 and retry_safe and await self._backed_off(attempt):
                continue
            raise self._status_error(answer, what)

    async def _backed_off(self, attempt: int) -> bool:
        """Sleep before retry number ``attempt`` and say True, or False when retries are spent."""
        if attempt > self.settings.max_retries:
            return False
        await asyncio.sleep(self._backoff(attempt))
        return True

    async def _waited_out(self, answer: _Answer, rate_limited: bool, patience_ends: float) -> bool:
        """Honour a 429's Retry-After when patience allows (True: send again).

        An isolated 429 costs only this call its wait; a storm of them holds every terminal
        call through the shared limiter (see ``ratelimit.py``).
        """
        self.rate_limited_count += 1
        delay = _retry_after_seconds(answer.retry_after) or self._backoff(1)
        if time.monotonic() + delay >= patience_ends:
            return False
        if rate_limited and self.limiter.refused(delay):
            return True  # the limiter holds this call with the others
        await asyncio.sleep(delay)
        return True

    # -- pieces of the loop --------------------------------------------------------------------

    def _place_mid(
        self,
        auth: Auth,
        mid: MidPlacement,
        json: Mapping[str, Any] | None,
        params: Mapping[str, str | int] | None,
    ) -> tuple[Mapping[str, Any] | None, Mapping[str, str | int] | None]:
        if not self.settings.isv or auth is not Auth.API_KEY or mid is MidPlacement.NONE:
            return json, params
        if mid is MidPlacement.BODY:
            return {**(json or {}), "mid": self.settings.mid}, params
        return json, {**(params or {}), "mid": self.settings.mid}

    async def _bearer(self, auth: Auth) -> str | None:
        if auth is Auth.API_KEY:
            return await self.keys.valid_key()
        if auth is Auth.OAUTH:
            return await self.oauth.token()
        return None

    async def _renew(self, auth: Auth, stale: str | None) -> None:
        if auth is Auth.API_KEY:
            await self.keys.refresh(stale_key=stale)
        elif auth is Auth.OAUTH:
            self.oauth.invalidate(stale)

    def _backoff(self, attempt: int) -> float:
        """Capped exponential backoff with jitter: retries of many clients do not line up."""
        settings = self.settings
        ceiling: float = min(settings.backoff_max, settings.backoff_base * 2.0 ** (attempt - 1))
        return ceiling * random.uniform(0.5, 1.0)

    def _status_error(self, answer: _Answer, what: str) -> ServiceError:
        status, body, content_type = answer.status, answer.body, answer.content_type
        if 300 <= status < 400:
            return ServiceError(
                f"{what}: HTTP {status}: a redirect to {redirect_target(answer.location)}, not "
                "followed (the configured address must be the service itself)",
                status=status,
            )
        error_body: ErrorBody | None = None
        try:
            data = decode_json(body, what=what, content_type=content_type) if body else None
            if isinstance(data, dict):
                error_body = ErrorBody.model_validate(
                    {k: v for k, v in data.items() if isinstance(v, str)}
                )
        except ServiceError:
            if status >= 500:
                return InvalidServerResponseError(
                    f"{what}: HTTP {status} with {describe_body(body, content_type)}",
                    field=BODY,
                    status=status,
                )
        code = error_body.error if error_body else None
        description = error_body.error_description if error_body else None
        message = f"{what}: HTTP {status}"
        if status == 429:
            return RateLimitedError(
                f"{message}: rate limited longer than this call may wait",
                retry_after=_retry_after_seconds(answer.retry_after),
                error=code,
                description=description,
            )
        if error_body is None and body:
            description = describe_body(body, content_type)
        return error_class_for(status)(
            message, status=status, error=code, description=description
        )

    async def _refresh_keys(self, api_key: str, refresh_token: str) -> ApiKeySet:
        """POST the refresh: current key as bearer, refresh token as ``token`` (choices.md)."""
        _, body, _ = await self.send(
            "POST",
            REFRESH_PATH,
            json={"token": refresh_token},
            headers={"Authorization": f"Bearer {api_key}"},
            auth=Auth.NONE,
            retry_safe=True,  # the same token again: the service answers the same or refuses
            rate_limited=False,
            kind=CallKind.AUTH,
            what="refresh API key",
        )
        return parse_json(ApiKeySet, body, what="refresh API key")


async def _read_bounded(resp: aiohttp.ClientResponse, what: str) -> bytes:
    """The answer's body, refused past MAX_ANSWER_BYTES without holding the rest: a body
    without end (a wrong address, a broken proxy) must not take the unit's memory."""
    length = resp.content_length
    if length is not None and length <= MAX_ANSWER_BYTES:
        return await resp.read()  # the service's answers: a length aiohttp reads no further than
    body = bytearray()
    async for chunk in resp.content.iter_chunked(64 * 1024):
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            resp.close()
            raise InvalidResponseError(
                f"{what}: field {BODY!r}: an answer larger than "
                f"{MAX_ANSWER_BYTES // (1024 * 1024)} MiB", field=BODY, status=resp.status,
            )
    return bytes(body)


class _Call(NamedTuple):
    """One call as the retry loop sends it."""

    method: str
    url: str
    what: str
    json: Mapping[str, Any] | None
    params: Mapping[str, str | int] | None
    data: Mapping[str, str] | None
    headers: Mapping[str, str] | None
    auth: Auth
    retry_safe: bool
    rate_limited: bool
    timeout: aiohttp.ClientTimeout  # connect and read, per attempt
    patience_ends: float  # monotonic: no Retry-After wait past this
    failures: list[str]  # each failed attempt in words, for the message when time runs out


class _Answer(NamedTuple):
    status: int
    body: bytes
    content_type: str
    retry_after: str | None
    location: str | None = None


class OAuthTokens:
    """The client-credentials access token for reporting and boarding, fetched once per life."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._token: str | None = None
        self._expires = 0.0
        self._lock = asyncio.Lock()
        self.fetch_count = 0

    async def token(self) -> str:
        if self._token is not None and time.monotonic() < self._expires:
            return self._token
        async with self._lock:  # one fetch however many callers arrive at once
            if self._token is not None and time.monotonic() < self._expires:
                return self._token
            return await self._fetch()

    def invalidate(self, stale: str | None) -> None:
        if stale is None or stale == self._token:
            self._token = None

    async def _fetch(self) -> str:
        settings = self._transport.settings
        if not settings.client_id or settings.client_secret is None:
            raise MissingCredentialsError(
                "no OAuth client configured: set service.client_id and service.client_secret "
                "(KIOSK_CLIENT_ID, KIOSK_CLIENT_SECRET); reporting and boarding need them"
            )
        pair = f"{settings.client_id}:{settings.client_secret.get_secret_value()}"
        basic = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        _, body, _ = await self._transport.send(
            "POST",
            self._transport.reporting_url(OAUTH_TOKEN_PATH),
            data={"grant_type": "client_credentials"},
            headers={"Authorization": basic},
            auth=Auth.NONE,
            retry_safe=True,  # asking for a token twice costs nothing
            rate_limited=False,
            kind=CallKind.AUTH,
            what="OAuth token request",  # not "token: ...": redact() would mask what follows
        )
        answer = parse(
            _OAuthAnswer,
            decode_json(body, what="OAuth token request"),
            what="OAuth token request",
        )
        lifetime = float(answer.expires_in)
        # renew a little early: 10 % of the lifetime, at most a minute
        self._expires = time.monotonic() + lifetime - min(60.0, lifetime * 0.1)
        self._token = answer.access_token
        self.fetch_count += 1
        return answer.access_token


class _OAuthAnswer(ServiceModel):
    access_token: str
    token_type: str = "bearer"  # noqa: S105 (the scheme's name)
    expires_in: int = 3600


def _label(method: str, path: str, what: str | None) -> str:
    """What a call is named in errors and logs: ``what``, else its method and path, without the
    query (values such as a filter stay out of messages)."""
    return what or f"{method} {path.split('?', 1)[0]}"


def _retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds (the service sends seconds; an HTTP date is read as well)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime

    try:
        moment: float = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, moment - time.time())
