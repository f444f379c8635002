"""OAuth client credentials for reporting and boarding, over real HTTP."""

from __future__ import annotations

import asyncio
import base64

import aiohttp

from kiosk_agent.sim.clock import VirtualClock
from kiosk_agent.sim.oauth import TOKEN_PATH, OAuthIssuer, parse_basic
from kiosk_agent.sim.server import SimServer
from kiosk_agent.sim.store import Store

from .sim_api import Api

TRANSACTIONS = "/ords/sprint/api/3p/v1/transactions"


def basic(client_id: str, secret: str) -> str:
    return "Basic " + base64.b64encode(f"{client_id}:{secret}".encode()).decode()


async def request_token(
    http: aiohttp.ClientSession,
    sim: SimServer,
    *,
    authorization: str | None = None,
    form: dict[str, str] | None = None,
    send_basic: bool = True,
) -> tuple[int, dict[str, str]]:
    info = sim.ready_info()
    headers = {}
    if send_basic:
        headers["Authorization"] = authorization or basic(info["client_id"], info["client_secret"])
    data = {"grant_type": "client_credentials"} if form is None else form
    async with http.post(sim.reporting_url + TOKEN_PATH, data=data, headers=headers) as resp:
        return resp.status, await resp.json()


async def oauth_api(http: aiohttp.ClientSession, sim: SimServer) -> Api:
    """An :class:`Api` on the reporting address carrying a fresh OAuth token."""
    status, answer = await request_token(http, sim)
    assert status == 200, answer
    return Api(http, sim.reporting_url, answer["access_token"])


async def test_client_credentials_give_a_bearer_token_scaled_by_time(
    sim: SimServer, http: aiohttp.ClientSession
) -> None:
    status, answer = await request_token(http, sim)

    assert status == 200
    assert answer["token_type"] == "bearer"
    assert answer["expires_in"] == 72  # one simulated hour at time scale 50
    reporting = Api(http, sim.reporting_url, answer["access_token"])
    status, page = await reporting.get(TRANSACTIONS)
    assert status == 200
    assert page["count"] == 25


async def test_wrong_or_missing_client_credentials_are_401(
    sim: SimServer, http: aiohttp.ClientSession
) -> None:
    status, answer = await request_token(http, sim, authorization=basic("sim_client", "nope"))
    assert (status, answer["error"]) == (401, "invalid_client")

    async with http.post(
        sim.reporting_url + TOKEN_PATH, data={"grant_type": "client_credentials"}
    ) as resp:
        assert resp.status == 401
        assert "Basic" in (await resp.json())["error_description"]


async def test_credentials_in_the_form_body_are_accepted(
    sim: SimServer, http: aiohttp.ClientSession
) -> None:
    form = {"grant_type": "client_credentials", "client_id": "sim_client"}
    form["client_secret"] = "sim_secret"
    status, answer = await request_token(http, sim, form=form, send_basic=False)
    assert status == 200
    assert answer["access_token"].startswith("sim_oauth_")


async def test_bad_grant_type_and_body_are_400(sim: SimServer, http: aiohttp.ClientSession) -> None:
    status, answer = await request_token(http, sim, form={"grant_type": "password"})
    assert (status, answer["error"]) == (400, "unsupported_grant_type")
    status, answer = await request_token(http, sim, form={})
    assert status == 400
    assert "grant_type" in answer["error_description"]

    info = sim.ready_info()
    headers = {"Authorization": basic(info["client_id"], info["client_secret"])}
    async with http.post(
        sim.reporting_url + TOKEN_PATH, json={"grant_type": "client_credentials"}, headers=headers
    ) as resp:
        assert resp.status == 400
        assert "x-www-form-urlencoded" in (await resp.json())["error_description"]


async def test_reporting_without_a_valid_token_is_401(
    sim: SimServer, http: aiohttp.ClientSession
) -> None:
    status, answer = await Api(http, sim.reporting_url, None).get(TRANSACTIONS)
    assert (status, answer["error"]) == (401, "unauthorized")
    # A payments API key is not an OAuth token.
    status, answer = await Api(http, sim.reporting_url, "sim_api_key").get(TRANSACTIONS)
    assert (status, answer["error"]) == (401, "invalid_token")


async def test_token_expires_after_its_expires_in(sim_factory, http: aiohttp.ClientSession) -> None:
    sim = await sim_factory(time_scale=7200)  # one simulated hour is half a real second
    status, answer = await request_token(http, sim)
    assert answer["expires_in"] == 1  # never below one whole second
    reporting = Api(http, sim.reporting_url, answer["access_token"])
    assert (await reporting.get(TRANSACTIONS, params={"limit": "1"}))[0] == 200

    await asyncio.sleep(1.05)

    status, answer = await reporting.get(TRANSACTIONS, params={"limit": "1"})
    assert (status, answer["error"]) == (401, "invalid_token")


def test_parse_basic_reads_only_well_formed_headers() -> None:
    assert parse_basic(basic("sim_client", "a:b")) == ("sim_client", "a:b")
    assert parse_basic("Bearer abc") is None
    assert parse_basic("Basic !!!") is None
    assert parse_basic("Basic " + base64.b64encode(b"no-colon").decode()) is None
    assert parse_basic(None) is None


def test_a_token_lives_one_simulated_hour(tmp_path) -> None:
    store = Store(tmp_path)
    issuer = OAuthIssuer(store, VirtualClock(time_scale=1))

    answer = issuer.issue("sim_client", "sim_secret")

    assert answer["expires_in"] == 3600
    assert issuer.valid(str(answer["access_token"]))
    assert not issuer.valid("sim_oauth_made_up")
    store.close()
