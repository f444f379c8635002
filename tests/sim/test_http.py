"""HTTP plumbing: error bodies, exact Decimal JSON, the safety net, and no 500 on bad input."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kiosk_agent.sim.http import (
    ApiError,
    Body,
    dumps,
    error_middleware,
    json_response,
    read_json,
)

from .sim_api import Api


def test_decimals_are_exact_json_numbers() -> None:
    text = dumps({"amount": Decimal("12.50"), "rate": Decimal("0.0195"), "neg": Decimal("-3")})
    assert text == '{"amount":12.50,"rate":0.0195,"neg":-3}'
    assert json.loads(text, parse_float=Decimal)["amount"] == Decimal("12.50")
    assert dumps({"note": "dec:1"}) == '{"note":"dec:1"}'


@pytest.fixture
async def tiny_server() -> AsyncIterator[str]:
    """A minimal app with the simulator's middleware: one failing and one echoing handler."""

    async def boom(_: web.Request) -> web.Response:
        raise RuntimeError("a bug")

    async def echo(request: web.Request) -> web.Response:
        body = await read_json(request)
        return json_response({"n": body.integer("n", required=True)})

    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/boom", boom)
    app.router.add_post("/echo", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.mark.parametrize(
    ("sent", "refusal"),
    [
        ("12.505", 'must be dollars like "12.50"'),
        ("0.00", "must be above zero, got '0.00'"),
        (12.5, "must be a string"),
    ],
)
def test_dollar_fields_become_cents_or_a_400_naming_the_field(sent: Any, refusal: str) -> None:
    assert Body({"amount": "12.50"}).req_dollars("amount") == 1250
    assert Body({}).dollars("amount") is None
    with pytest.raises(ApiError, match=refusal) as caught:
        Body({"amount": sent}).dollars("amount")
    assert caught.value.status == 400
    assert "'amount'" in caught.value.description


async def test_an_unexpected_exception_is_a_500_and_serving_goes_on(tiny_server: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{tiny_server}/boom") as resp:
            assert resp.status == 500
            assert (await resp.json())["error"] == "server_error"
        async with http.post(f"{tiny_server}/echo", json={"n": 3}) as resp:
            assert (resp.status, await resp.json()) == (200, {"n": 3})
        async with http.get(f"{tiny_server}/echo") as resp:
            assert (resp.status, (await resp.json())["error"]) == (405, "method_not_allowed")


ROUTES = [
    ("POST", "/api/v1/charge"),
    ("POST", "/api/v1/capture"),
    ("POST", "/api/v1/void-or-refund"),
    ("POST", "/api/v1/send_receipt"),
    ("POST", "/api/v1/api_keys/refresh"),
    ("POST", "/api/v1/vault_payment_accounts"),
    ("PUT", "/api/v1/vault_payment_accounts/x"),
    ("POST", "/api/v1/billing_plans"),
    ("POST", "/api/v1/hpp"),
    ("PUT", "/api/v1/hpp/x"),
    ("POST", "/api/terminal/SIM-0001/read-card"),
    ("POST", "/api/terminal/SIM-0001/charge-card"),
    ("POST", "/api/terminal/SIM-0001/print-receipt"),
]
GARBAGE: list[Any] = [
    None,
    [],
    "text",
    17,
    {"amount": None},
    {"amount": {"cents": 1}},
    {"amount": 10**30},
    {"trans_id": ["a"], "email": 5},
    {"name": "x" * 100_000},
    {"mid": 999000000001},
    {"rrule_pattern": "\x00"},
    {"hpp_options": [1, 2]},
    {"account_token": "", "expiration": "", "amount": 0},
]


async def test_malformed_bodies_are_4xx_never_500(
    sim_factory: Any, http: aiohttp.ClientSession
) -> None:
    sim = await sim_factory(rate_limit="100000/1")
    api = Api(http, sim.base_url, "sim_api_key")
    for method, path in ROUTES:
        for garbage in GARBAGE:
            status, body = await api.call(method, path, garbage)
            assert 400 <= status < 500, (method, path, garbage, status, body)
            assert body["error_description"], (method, path, garbage)
        async with api.http.request(
            method, sim.base_url + path, data=b"\x00\x01", headers=api.headers()
        ) as resp:
            assert resp.status == 400
    assert (await api.get("/api/terminal"))[0] == 200  # still serving


async def test_a_body_arriving_in_pieces_is_read_whole(tiny_server: str) -> None:
    async def pieces() -> AsyncIterator[bytes]:
        for part in (b'{"n": ', b" " * 5000, b"42", b" " * 5000, b"}"):
            yield part
            await asyncio.sleep(0.01)

    async with aiohttp.ClientSession() as http:
        headers = {"Content-Type": "application/json"}
        async with http.post(f"{tiny_server}/echo", data=pieces(), headers=headers) as resp:
            assert (resp.status, await resp.json()) == (200, {"n": 42})

        async def endless() -> AsyncIterator[bytes]:
            for _ in range(100):
                yield b" " * 1024

        async with http.post(f"{tiny_server}/echo", data=endless(), headers=headers) as resp:
            assert resp.status == 400
            assert "limit" in (await resp.json())["error_description"]
