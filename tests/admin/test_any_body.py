"""No endpoint of the three local servers answers 500 to any body: generated bodies (hypothesis)
against the running agent; a refusal is a 4xx whose JSON names what was wrong."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiosk_agent.money import dollars_to_cents
from kiosk_agent.service.webhooks import sign

from .agent_thread import AgentThread, agent_thread
from .conftest import ADMIN_TOKEN, KIOSK_TOKEN, WEBHOOK_SECRET, write_config

KIOSK = """
triggers:
  - platform: kiosk_api
    name: screen
    token: !secret kiosk_token
    port: 0
    products: {coffee: "2.50"}
"""

SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    | st.integers(min_value=10**18, max_value=10**60) | st.sampled_from(["2.50", "1e2", "coffee"])
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20,
)
KIOSK_BODIES = st.fixed_dictionaries(
    {},
    optional={
        "product": JSON_VALUES, "amount": JSON_VALUES, "flow": JSON_VALUES,
        "terminal": JSON_VALUES, "email": JSON_VALUES, "status": JSON_VALUES,
        "detail": JSON_VALUES, "trans_id": JSON_VALUES,
    },
)
NESTED = st.integers(min_value=1, max_value=40_000).map(lambda n: "[" * n + "]" * n)
LONG_NUMBER = st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n)


def _encoded(value: Any) -> bytes:
    return json.dumps(value).encode() if not isinstance(value, bytes) else value


BODIES = st.one_of(
    KIOSK_BODIES.map(_encoded),
    JSON_VALUES.map(_encoded),
    NESTED.map(str.encode),
    LONG_NUMBER.map(lambda digits: b'{"amount": ' + digits.encode() + b"}"),
    st.binary(max_size=300),
)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentThread]:
    directory = tmp_path_factory.mktemp("any-body")
    with agent_thread(write_config(directory, KIOSK)) as running:
        yield running


def _refusal_is_clear(status: int, answer: Any) -> None:
    assert status < 500, (status, answer)
    if status >= 400:
        assert isinstance(answer, dict), answer
        assert answer.get("message") or answer.get("detail"), answer


@given(body=BODIES)
def test_the_kiosk_api_answers_any_sale_body_without_500(rig: AgentThread, body: bytes) -> None:
    headers = {"Authorization": f"Bearer {KIOSK_TOKEN}", "Content-Type": "application/json"}
    status, answer = rig.request("KioskApi", "POST", "/api/v1/sales", body, headers)
    _refusal_is_clear(status, answer)
    if status == 202:  # a real sale started: end it so the next example finds the terminal free
        rig.request("KioskApi", "POST", f"/api/v1/sales/{answer['sale_id']}/cancel", b"{}",
                    headers)
    status, answer = rig.request("KioskApi", "POST", "/api/v1/sales/nope/dispensed", body,
                                 headers)
    _refusal_is_clear(status, answer)


@given(body=BODIES)
def test_the_webhook_receiver_answers_any_signed_body_without_500(
    rig: AgentThread, body: bytes
) -> None:
    headers = {"X-Webhook-Signature-256": sign(body, WEBHOOK_SECRET)}
    status, answer = rig.request("WebhookReceiver", "POST", "/webhooks/boarding", body, headers)
    _refusal_is_clear(status, answer)


@settings(max_examples=60)  # each one asks the simulator: fewer, not weaker
@given(body=BODIES)
def test_the_admin_api_answers_any_action_body_without_500(rig: AgentThread, body: bytes) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    status, answer = rig.request(
        "AdminServer", "POST", "/api/terminals/SIM-0007/test-print", body, headers
    )
    _refusal_is_clear(status, answer)


QUERY_VALUES = st.text(max_size=60) | LONG_NUMBER | st.sampled_from(
    ["1e999", "nan", "-inf", "2026-13-45", "9999-12-31T23:59:59+14:00", "0", "-1"]
)


@given(name=st.sampled_from(["since", "until", "state", "limit"]), value=QUERY_VALUES)
def test_the_admin_api_answers_any_query_parameter_without_500(
    rig: AgentThread, name: str, value: str
) -> None:
    from urllib.parse import urlencode

    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    status, answer = rig.request("AdminServer", "GET", f"/api/sales?{urlencode({name: value})}",
                                 None, headers)
    _refusal_is_clear(status, answer)


RESOLVE_BODIES = st.one_of(
    BODIES,
    st.fixed_dictionaries(
        {}, optional={"as": JSON_VALUES | st.sampled_from(["captured", "reversed"]),
                      "why": JSON_VALUES | st.text(max_size=600)},
    ).map(_encoded),
)


@given(sale=st.text(max_size=40), body=RESOLVE_BODIES)
def test_the_resolve_action_answers_any_id_and_body_without_500(
    rig: AgentThread, sale: str, body: bytes
) -> None:
    from urllib.parse import quote

    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    path = f"/api/sales/{quote(sale, safe='')}/resolve"
    status, answer = rig.request("AdminServer", "POST", path, body, headers)
    _refusal_is_clear(status, answer)  # an id no route matches (empty, "..") too


@given(body=BODIES | st.dictionaries(st.just("token"), JSON_VALUES).map(_encoded))
def test_the_login_answers_any_body_without_500(rig: AgentThread, body: bytes) -> None:
    port = rig.ports["AdminServer"]
    headers = {"Content-Type": "application/json", "Origin": f"http://127.0.0.1:{port}"}
    status, answer = rig.request("AdminServer", "POST", "/session", body, headers)
    _refusal_is_clear(status, answer)
    assert status != 200  # no body but the right token opens a session


# -- headers, paths and amounts from anywhere: the kiosk API as a hostile app or page sends them --

HEADER_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"),
                      max_size=80)


def _raw_request(port: int, head: str, body: bytes) -> tuple[int, Any]:
    """One request written byte for byte (http.client refuses odd headers before sending)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode("latin-1") + body)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    status_line, _, rest = raw.partition(b"\r\n")
    payload = rest.partition(b"\r\n\r\n")[2]
    try:
        answer: Any = json.loads(payload)
    except ValueError:
        answer = payload.decode("utf-8", "replace")
    return int(status_line.split()[1]), answer


@settings(max_examples=80)
@given(
    host=HEADER_TEXT | st.sampled_from(["127.0.0.1", "localhost:8765", "[::1]:1", "[::1"]),
    origin=st.none() | HEADER_TEXT | st.sampled_from(["http://127.0.0.1:\u00b2", "null"]),
    authorization=HEADER_TEXT | st.just(f"Bearer {KIOSK_TOKEN}"),
    content_type=HEADER_TEXT | st.just("application/json"),
)
def test_the_kiosk_api_answers_any_headers_without_500(
    rig: AgentThread, host: str, origin: str | None, authorization: str, content_type: str
) -> None:
    body = b'{"product": "coffee"}'
    head = (f"POST /api/v1/sales HTTP/1.1\r\nHost: {host}\r\nAuthorization: {authorization}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            + (f"Origin: {origin}\r\n" if origin is not None else "")
            + "Connection: close\r\n\r\n")
    status, answer = _raw_request(rig.ports["KioskApi"], head, body)
    assert status < 500, (status, answer)
    if status == 202:
        _cancel(rig, answer["sale_id"])
    else:
        _refusal_is_clear(status, answer)


def _cancel(rig: AgentThread, sale_id: str) -> None:
    headers = {"Authorization": f"Bearer {KIOSK_TOKEN}", "Content-Type": "application/json"}
    rig.request("KioskApi", "POST", f"/api/v1/sales/{sale_id}/cancel", b"{}", headers)


@settings(max_examples=80)
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS", "HEAD"]),
       path=st.text(max_size=60), websocket=st.booleans())
def test_the_kiosk_api_answers_any_path_without_500(
    rig: AgentThread, method: str, path: str, websocket: bool
) -> None:
    from urllib.parse import quote

    headers = {"Authorization": f"Bearer {KIOSK_TOKEN}", "Content-Type": "application/json"}
    if websocket:  # a handshake the server refuses or takes (and the socket is then closed)
        headers |= {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    target = "/api/v1/" + quote(path, safe="/?=&")
    status, answer = rig.request("KioskApi", method, target, b"{}" if method == "POST" else None,
                                 headers)
    assert status < 500, (status, answer)
    if status == 202 and isinstance(answer, dict) and "sale_id" in answer:
        _cancel(rig, answer["sale_id"])


@settings(max_examples=80)
@given(product=st.none() | st.sampled_from(["coffee", "tea"]) | st.text(max_size=8),
       amount=st.none() | SCALARS | st.sampled_from(["2.50", "2.5", "$2.50", "100.00", "100.01",
                                                     250, 10000, 10001, "0.00", " 2.50 "]))
def test_a_kiosk_sale_is_for_the_price_asked_within_max_price(
    rig: AgentThread, product: str | None, amount: Any
) -> None:
    """A sale started is for the configured product's price or the amount given, never above
    the trigger's max_price ($100.00 by default); anything else is a 4xx naming the field."""
    body: dict[str, Any] = {}
    if product is not None:
        body["product"] = product
    if amount is not None:
        body["amount"] = amount
    headers = {"Authorization": f"Bearer {KIOSK_TOKEN}", "Content-Type": "application/json"}
    status, answer = rig.request("KioskApi", "POST", "/api/v1/sales", _encoded(body), headers)
    _refusal_is_clear(status, answer)
    if status != 202:
        assert answer.get("field") in ("amount", "product", "body", "<body>", "terminal"), answer
        return
    _cancel(rig, answer["sale_id"])
    cents = dollars_to_cents(answer["amount"])
    if product == "coffee":
        assert cents == 250, (body, answer)
    assert 0 < cents <= 10_000, (body, answer)
