"""The transport against a scripted server: typed errors naming the field for every bad
answer, retries only where a retry is safe, 401 renewal, 429 with Retry-After, ISV mid."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import types
from typing import Any

import pytest
from aiohttp import web

from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.errors import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InvalidResponseError,
    InvalidServerResponseError,
    NotFoundError,
    RateLimitedError,
    ServerError,
    ServiceError,
    ServiceUnreachableError,
)
from kiosk_agent.service.models import ChargeRequest
from kiosk_agent.service.settings import CallKind, ServiceSettings
from kiosk_agent.service.transport import MAX_ANSWER_BYTES

from .scripted_server import ScriptedServer, drop_connection, json_reply, raw_reply

TERMINALS = "/api/terminal"
ONE_TERMINAL = {"terminals": [{"device_id": "SIM-0001", "online": True, "connected": False}]}
KEY_SET = {
    "api_key": "key-2",
    "public_key": "pub",
    "refresh_token": "refresh-2",
    "api_key_expires_at": int(time.time()) + 3600,
    "refresh_token_expires_at": int(time.time()) + 86400,
}


async def test_html_502_page_is_a_server_error_naming_the_body(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    page = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
    scripted.script("GET", TERMINALS, raw_reply(page, status=502, content_type="text/html"))
    async with ServiceClient(scripted_settings) as svc:
        with pytest.raises(InvalidServerResponseError) as caught:
            await svc.terminal.list()
    assert isinstance(caught.value, ServerError)  # retry logic sees a 5xx
    assert caught.value.field == "<body>"
    assert caught.value.status == 502
    assert "HTML page" in str(caught.value)
    assert scripted.count("GET", TERMINALS) == 1 + scripted_settings.max_retries  # GET: retried


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (b'{"terminals": [{"device_id": "SIM-0001", "onl', "<body>", "expected JSON"),
        (b"", "<body>", "expected JSON"),
        (b'{"terminals": [{"device_id": 7, "online": true}]}', "terminals.0.device_id", "string"),
        (b'{"terminals": [{"device_id": "A", "online": "maybe"}]}', "terminals.0.online", "bool"),
        (b'{"terminals": [{"device_id": "A"}]}', "terminals.0.online", "required"),
        (b'{"terminals": {"device_id": "A"}}', "terminals", "list"),
        (b'{"items": []}', "terminals", "required"),
        (b"[1, 2]", "<body>", "object, got list"),
        (b"<html>OK</html>", "<body>", "HTML page"),
    ],
)
async def test_bad_answers_name_the_field(
    scripted: ScriptedServer,
    scripted_settings: ServiceSettings,
    body: bytes,
    field: str,
    words: str,
) -> None:
    scripted.script("GET", TERMINALS, raw_reply(body))
    async with ServiceClient(scripted_settings) as svc:
        with pytest.raises(InvalidResponseError) as caught:
            await svc.terminal.list()
    assert caught.value.field == field
    assert words in str(caught.value)
    assert field in str(caught.value)


async def test_status_errors_are_typed_with_the_service_error_code(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    scripted.script("POST", "/api/terminal/SIM-0001/read-card",
                    json_reply({"error": "terminal_busy"}, status=409))
    scripted.script("GET", "/api/v1/vault_payment_accounts/nope",
                    json_reply({"error": "not_found", "error_description": "no account"}, 404))
    plain_400 = raw_reply(b"oops", status=400, content_type="text/plain")
    scripted.script("POST", "/api/v1/capture", plain_400)
    async with ServiceClient(scripted_settings) as svc:
        with pytest.raises(ConflictError) as busy:
            await svc.terminal.read_card("SIM-0001", 100)
        with pytest.raises(NotFoundError) as missing:
            await svc.vault.get("nope")
        with pytest.raises(BadRequestError) as bad:
            await svc.payments.capture("t-1")
    assert busy.value.error == "terminal_busy"
    assert missing.value.description == "no account"
    assert bad.value.status == 400
    assert "oops" in str(bad.value)


async def test_a_service_error_quoting_card_data_is_masked(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    echo = {"error": "invalid_card",
            "error_description": "card 4111 1111 1111 1111 refused; token=tok_live_secret9"}
    scripted.script("POST", "/api/v1/charge", json_reply(echo, status=400))
    async with ServiceClient(scripted_settings) as svc:
        with pytest.raises(BadRequestError) as refused:
            await svc.payments.charge(ChargeRequest(amount=100, account_token="tok"))
    shown = f"{refused.value} {refused.value.description}"
    assert "411111******1111" in shown  # first six and last four, as PCI DSS allows
    assert "4111 1111 1111 1111" not in shown
    assert "tok_live_secret9" not in shown
    assert refused.value.error == "invalid_card"


async def test_idempotent_get_is_retried_after_5xx_and_drops(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    scripted.script(
        "GET", TERMINALS, json_reply({}, status=503), drop_connection, json_reply(ONE_TERMINAL)
    )
    async with ServiceClient(scripted_settings) as svc:
        terminals = await svc.terminal.list()
    assert [t.device_id for t in terminals] == ["SIM-0001"]
    assert scripted.count("GET", TERMINALS) == 3


async def test_charge_is_never_re_posted_after_a_lost_answer(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    scripted.script("POST", "/api/v1/charge", drop_connection)
    request = ChargeRequest(amount=100, account_token="9412345678901111", order_id="o-1")
    async with ServiceClient(scripted_settings) as svc:
        with pytest.raises(ServiceUnreachableError, match="outcome unknown") as caught:
            await svc.payments.charge(request)
    assert caught.value.order_id == "o-1"  # what the caller reconciles by
    assert scripted.count("POST", "/api/v1/charge") == 1


async def test_charge_is_never_re_posted_after_a_5xx(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    scripted.script("POST", "/api/v1/charge", json_reply({"error": "boom"}, status=500))
    request = ChargeRequest(amount=100, account_token="9412345678901111")
    async with ServiceClient(scripted_settings) as svc:
        with pytest.raises(ServerError) as caught:
            await svc.payments.charge(request)
    assert caught.value.order_id is not None  # made on the device, sent, and told
    assert scripted.count("POST", "/api/v1/charge") == 1


async def test_refused_connection_is_unreachable_after_retries() -> None:
    settings = ServiceSettings(
        base_url="http://127.0.0.1:9", api_key="k", mid="1", backoff_base=0.01, max_retries=2
    )
    async with ServiceClient(settings) as svc:
        with pytest.raises(ServiceUnreachableError, match="cannot connect"):
            await svc.terminal.list()


async def test_429_pauses_for_retry_after_then_succeeds(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    limited = json_reply({"error": "rate_limited"}, status=429, headers={"Retry-After": "0.2"})
    scripted.script("POST", "/api/terminal/SIM-0001/read-card", limited,
                    json_reply({"interaction_id": "i-1", "status": "pending"}, status=202))
    async with ServiceClient(scripted_settings) as svc:
        started = time.monotonic()
        handle = await svc.terminal.read_card("SIM-0001", 100)
        waited = time.monotonic() - started
        assert svc.transport.rate_limited_count == 1
    assert handle.interaction_id == "i-1"
    assert waited >= 0.2
    assert scripted.count("POST", "/api/terminal/SIM-0001/read-card") == 2  # 429: not processed


async def test_429_beyond_patience_is_rate_limited_error(scripted: ScriptedServer) -> None:
    server = scripted
    settings = ServiceSettings(
        base_url=server.url, api_key="k", mid="1", rate_limit_patience=0.5
    )
    server.script("GET", TERMINALS,
                  json_reply({"error": "rate_limited"}, status=429, headers={"Retry-After": "1"}))
    async with ServiceClient(settings) as svc:
        with pytest.raises(RateLimitedError) as caught:
            await svc.terminal.list()
    assert caught.value.retry_after == 1.0
    assert caught.value.error == "rate_limited"


async def test_401_refreshes_the_key_once_and_resends(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    scripted.script("GET", TERMINALS, json_reply({"error": "invalid_token"}, 401),
                    json_reply(ONE_TERMINAL))
    scripted.script("POST", "/api/v1/api_keys/refresh", json_reply(KEY_SET))
    async with ServiceClient(scripted_settings) as svc:
        await svc.terminal.list()
        assert svc.transport.keys.api_key == "key-2"
        assert svc.transport.keys.refresh_count == 1
    refresh = next(r for r in scripted.requests if r.path == "/api/v1/api_keys/refresh")
    assert refresh.headers["Authorization"] == "Bearer key-1"
    refresh_body = scripted.bodies[scripted.requests.index(refresh)]
    assert json.loads(refresh_body) == {"token": "refresh-1"}
    last = [r for r in scripted.requests if r.path == TERMINALS][-1]
    assert last.headers["Authorization"] == "Bearer key-2"


async def test_401_after_a_refresh_is_an_authentication_error(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    scripted.script("GET", TERMINALS, json_reply({"error": "invalid_token"}, 401))
    scripted.script("POST", "/api/v1/api_keys/refresh", json_reply({"error": "spent"}, 401))
    async with ServiceClient(scripted_settings) as svc:
        with pytest.raises(AuthenticationError):
            await svc.terminal.list()
    assert scripted.count("POST", "/api/v1/api_keys/refresh") == 1


async def test_isv_mid_goes_in_the_query_and_in_the_body_for_receipts(
    scripted: ScriptedServer,
) -> None:
    settings = ServiceSettings(base_url=scripted.url, api_key="isv", mid="999000000002", isv=True)
    scripted.script("GET", TERMINALS, json_reply(ONE_TERMINAL))
    scripted.script("POST", "/api/v1/send_receipt", json_reply({"sent": True}))
    async with ServiceClient(settings) as svc:
        await svc.terminal.list()
        await svc.payments.send_receipt("t-1", "a@example.com")
    listed = next(r for r in scripted.requests if r.path == TERMINALS)
    assert listed.query["mid"] == "999000000002"
    receipt = next(r for r in scripted.requests if r.path == "/api/v1/send_receipt")
    assert "mid" not in receipt.query
    body = json.loads(scripted.bodies[scripted.requests.index(receipt)])
    assert body == {"trans_id": "t-1", "email": "a@example.com", "mid": "999000000002"}


async def test_oauth_token_is_fetched_once_under_concurrency_and_sent_as_bearer(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    token = {"access_token": "oat-1", "token_type": "bearer", "expires_in": 3600}
    scripted.script("POST", "/ords/sprint/oauth/token", json_reply(token))
    scripted.script("GET", "/ords/sprint/api/3p/v1/transactions", json_reply({"items": []}))
    async with ServiceClient(scripted_settings) as svc:
        url = svc.transport.reporting_url("/ords/sprint/api/3p/v1/transactions")
        calls = (svc.transport.oauth_request("GET", url) for _ in range(10))
        answers = await asyncio.gather(*calls)
        assert svc.transport.oauth.fetch_count == 1
    assert answers == [{"items": []}] * 10
    token_call = next(r for r in scripted.requests if r.path == "/ords/sprint/oauth/token")
    assert token_call.headers["Authorization"].startswith("Basic ")
    assert scripted.bodies[scripted.requests.index(token_call)] == b"grant_type=client_credentials"
    calls = [r for r in scripted.requests if r.path.endswith("/transactions")]
    assert {r.headers["Authorization"] for r in calls} == {"Bearer oat-1"}


async def test_secrets_never_appear_in_settings_repr(scripted_settings: ServiceSettings) -> None:
    text = repr(scripted_settings)
    assert "key-1" not in text
    assert "refresh-1" not in text
    assert "secret'" not in text


async def test_observers_hear_each_call_once_with_its_kind_seconds_and_outcome(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    scripted.script("GET", TERMINALS, json_reply(ONE_TERMINAL))
    scripted.script("POST", "/api/v1/charge", drop_connection)
    scripted.script("POST", "/api/v1/void", json_reply({"error": "no"}, status=400))
    heard: list[tuple[CallKind, float, str]] = []

    def broken(kind: CallKind, seconds: float, outcome: str) -> None:
        raise RuntimeError("an observer's bug")

    async with ServiceClient(scripted_settings) as svc:
        svc.transport.observe(broken)  # logged, and the call's answer stands
        unsubscribe = svc.transport.observe(lambda *call: heard.append(call))
        await svc.terminal.list()
        with pytest.raises(ServiceUnreachableError):
            await svc.payments.charge(ChargeRequest(amount=100, account_token="9412345678901111"))
        with pytest.raises(BadRequestError):
            await svc.transport.request("POST", "/api/v1/void", json={})
        unsubscribe()
        await svc.terminal.list()
    assert [(kind, outcome) for kind, _, outcome in heard] == [
        (CallKind.CONTROL, "ok"), (CallKind.MONEY, "unreachable"), (CallKind.MONEY, "error"),
    ]
    assert all(0 <= seconds < 5 for _, seconds, _ in heard)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_is_not_followed_the_card_goes_nowhere_else(
    scripted: ScriptedServer, scripted_settings: ServiceSettings, status: int
) -> None:
    """A service address that answers "go elsewhere" (a captive portal, a hijacked DNS name, a
    proxy moved): a followed 307 would send the charge, card token and all, to that other
    server, and its answer would be read as the charge's. The client refuses instead."""
    elsewhere = ScriptedServer()
    await elsewhere.start()
    try:
        elsewhere.script("POST", "/charge", json_reply({"result_code": 1, "trans_id": "x"}))
        target = f"{elsewhere.url}/charge?session=abc123"
        scripted.script("POST", "/api/v1/charge", json_reply({}, status, {"Location": target}))
        request = ChargeRequest(amount=100, account_token="9412345678901111", order_id="o-7")
        async with ServiceClient(scripted_settings) as svc:
            with pytest.raises(ServiceError, match=rf"HTTP {status}: a redirect to ") as caught:
                await svc.payments.charge(request)
        assert f"{elsewhere.url}/charge" in str(caught.value)
        assert "abc123" not in str(caught.value)  # a query may carry a session: not repeated
        assert elsewhere.requests == []  # nothing reached the other server
        assert scripted.count("POST", "/api/v1/charge") == 1  # and nothing was sent twice
    finally:
        await elsewhere.stop()


async def test_a_call_passes_through_no_client_middleware_the_handshake_keeps_its_own(
    scripted: ScriptedServer, scripted_settings: ServiceSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The transport's session refuses a redirected WebSocket handshake in a client middleware;
    a call follows no redirect by itself (``allow_redirects=False``), so its request skips that
    layer (a coroutine and its chain every call: a kiosk API sale's charge-card)."""
    from kiosk_agent.service import redirects

    seen: list[str] = []
    real = redirects.refuse_upgrade_redirects

    async def spy(request: Any, handler: Any) -> Any:
        seen.append(request.url.path)
        return await real(request, handler)

    monkeypatch.setattr(redirects, "refuse_upgrade_redirects", spy)
    scripted.script("GET", TERMINALS, json_reply(ONE_TERMINAL))
    async with ServiceClient(scripted_settings) as svc:
        await svc.terminal.list()
        assert seen == []
        with contextlib.suppress(Exception):  # the scripted server has no WebSocket
            await (await svc.transport.session.ws_connect(f"{scripted.url}/cable")).close()
    assert seen == ["/cable"]  # the handshake still goes through it


async def test_a_failed_oauth_token_request_reads_whole_after_redaction(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    """Every log line and journal message goes through redact(), which masks what follows
    "token:": "OAuth token: HTTP 500 ..." was logged and journaled as "OAuth token: [REDACTED]
    500", which reads as if a secret had been in it and hides the status."""
    from kiosk_agent.redact import redact

    failing = json_reply({"error": "server_error"}, status=500)
    scripted.script("POST", "/ords/sprint/oauth/token", *[failing] * 10)
    async with ServiceClient(scripted_settings) as svc:
        with pytest.raises(ServiceError) as caught:
            await svc.transport.oauth._fetch()
    shown = redact(str(caught.value))
    assert "[REDACTED]" not in shown, shown
    assert "HTTP 500" in shown


async def test_an_answer_larger_than_any_page_is_refused_before_it_is_held(
    scripted: ScriptedServer, scripted_settings: ServiceSettings
) -> None:
    """A service (or whatever answers at its address) streaming a body without end: the client
    stops reading at MAX_ANSWER_BYTES and says so, naming the body, instead of holding it all."""
    sent = 0

    async def endless(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        chunk = b"[" + b"0," * (512 * 1024)
        with contextlib.suppress(ConnectionError):
            while sent < 4 * MAX_ANSWER_BYTES:
                await response.write(chunk)
                sent += len(chunk)
        return response

    scripted.script("GET", TERMINALS, endless)
    async with ServiceClient(scripted_settings.replace(max_retries=0)) as svc:
        with pytest.raises(InvalidResponseError) as caught:
            await svc.terminal.list()
    assert caught.value.field == "<body>"
    assert f"larger than {MAX_ANSWER_BYTES // (1024 * 1024)} MiB" in str(caught.value)
    assert sent < 2 * MAX_ANSWER_BYTES  # stopped reading, not read to the end


async def test_each_kind_of_calls_timeouts_are_made_once_and_follow_the_settings(
    scripted: ScriptedServer, scripted_settings: ServiceSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call's timeouts (the kind's table, aiohttp's per-request timeout, the 429 patience) are
    made once per kind, not at every request (a sale's read-card and authorization); settings
    replaced are read afresh."""
    made: list[CallKind] = []
    real = ServiceSettings.timeouts

    def counted(self: ServiceSettings, kind: CallKind) -> Any:
        made.append(kind)
        return real(self, kind)

    monkeypatch.setattr(ServiceSettings, "timeouts", counted)
    sent: list[Any] = []
    scripted.script("GET", TERMINALS, *[json_reply(ONE_TERMINAL)] * 4)
    async with ServiceClient(scripted_settings) as svc:
        real_request = svc.transport.session.request

        def request(*args: Any, **kwargs: Any) -> Any:
            sent.append(kwargs["timeout"])
            return real_request(*args, **kwargs)

        monkeypatch.setattr(svc.transport.session, "request", request)
        made.clear()  # the session's own floor, at its start
        await svc.terminal.list()
        await svc.terminal.list()
        assert made == [CallKind.CONTROL]
        assert sent[0] is sent[1]
        assert sent[0].sock_read == real(scripted_settings, CallKind.CONTROL).read
        svc.transport.settings = scripted_settings.replace(timeout=2.0)  # read afresh
        await svc.terminal.list()
        assert made == [CallKind.CONTROL, CallKind.CONTROL]
        assert sent[2].sock_read == min(2.0, real(scripted_settings, CallKind.CONTROL).read)


async def test_a_charge_card_goes_through_few_layers_of_the_transport(
    service: ServiceClient,
) -> None:
    """A charge-card's request resumes each coroutine it awaits in at every wait: the exchange
    is made in the retry loop itself (no _exchange coroutine of its own), its label made once,
    the rate limiter (a property) read once."""
    calls: list[str] = []

    def seen(frame: types.FrameType, event: str, _arg: object) -> None:
        if event == "call" and frame.f_code.co_filename.endswith("service/transport.py"):
            calls.append(frame.f_code.co_name)

    sys.setprofile(seen)
    try:
        handle = await service.terminal.charge_card("SIM-0001", 1000, order_id="o-layers")
    finally:
        sys.setprofile(None)
    assert handle.interaction_id
    assert "_exchange" not in calls
    assert calls.count("_label") == 1, calls
    assert calls.count("limiter") == 1, calls
