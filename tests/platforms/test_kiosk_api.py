"""The kiosk app's API over real HTTP and WebSocket, with the real Agent on the simulator."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sys
import types
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.money import cents_to_dollars
from kiosk_agent.platforms.kiosk_api import PLATFORM_SCHEMA, KioskApi
from kiosk_agent.sales.clock import Clock
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.sim.context import SimOptions
from kiosk_agent.sim.server import SimServer
from tests.admin.test_any_body import KIOSK_BODIES
from tests.assembly.test_slow_service import arm_cleared, held_by_the_service, ledger

from ..helpers import ErrorLog, sim_call, until
from .agent_rig import (
    losing_authorization_answers,
    running_agent,
    stopped_on_failure,
    until_final,
)
from .test_late_vends import told_to_a_person

TOKEN = "kiosk-app-token-0123456789"


class App:
    """The touchscreen app's side: an aiohttp session with the bearer token."""

    def __init__(self, api: KioskApi, session: aiohttp.ClientSession) -> None:
        self.api = api
        self.base = f"http://127.0.0.1:{api.port}/api/v1"
        self.session = session

    async def post(self, path: str, body: Any, token: str = TOKEN) -> tuple[int, Any]:
        async with self.session.post(
            self.base + path, json=body, headers={"Authorization": f"Bearer {token}"}
        ) as response:
            return response.status, await response.json()

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.session.get(
            self.base + path, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as response:
            return response.status, await response.json()

    def sale_stream(self, sale_id: str) -> Any:
        """The sale's own event stream (a WebSocket), as the app opens it."""
        return self.session.ws_connect(f"{self.base}/sales/{sale_id}/events?token={TOKEN}")

    async def follow(self, sale_id: str) -> list[dict[str, Any]]:
        steps = []
        async with self.sale_stream(sale_id) as ws:
            async for message in ws:
                steps.append(message.json())
        return steps

    async def confirm(self, sale_id: str, dispensed: dict[str, str]) -> tuple[dict[str, Any], int]:
        """Follows the sale's stream to its end, telling ``dispensed`` (POST .../dispensed) when
        a step says it is dispensing, as an app that confirms does: the last step, and the
        status that answer got."""
        told = 0
        async with self.sale_stream(sale_id) as ws:
            async for message in ws:
                step = message.json()
                if step["state"] == "dispensing":
                    told, _ = await self.post(f"/sales/{sale_id}/dispensed", dispensed)
                last = step
        return last, told


async def _app(tmp_path: Path, sim_settings: Any, **options: Any) -> AsyncIterator[App]:
    trigger = {"platform": "kiosk_api", "name": "screen", "token": "!secret kiosk_token", "port": 0,
               "products": {"coffee": "2.50", "tea": "1.75"}, **options}
    secrets = {"kiosk_token": TOKEN}
    async with running_agent(tmp_path, sim_settings, [trigger], secrets=secrets) as agent:
        [api] = agent.platforms
        assert isinstance(api, KioskApi)
        async with aiohttp.ClientSession() as session:
            yield App(api, session)


@pytest.fixture
async def app(tmp_path: Path, sim_settings: Any) -> AsyncIterator[App]:
    async for a in _app(tmp_path, sim_settings):
        yield a


async def test_start_a_sale_and_follow_it_live(app: App) -> None:
    status, started = await app.post("/sales", {"product": "coffee"})
    assert status == 202
    assert started["amount"] == "2.50"

    steps = await asyncio.wait_for(app.follow(started["sale_id"]), 10)
    states = [s["state"] for s in steps]
    assert states[-1] == "completed"
    assert "charging" in states  # charge_card: the terminal reads and charges in one step
    assert steps[-1]["captured_cents"] == 250
    assert steps[-1]["product"] == "coffee"

    status, latest = await app.get(f"/sales/{started['sale_id']}")
    assert status == 200
    assert latest["state"] == "completed"
    # joining after the end gets the final step at once
    assert [s["state"] for s in await app.follow(started["sale_id"])] == ["completed"]


async def test_declined_card_and_free_amount(app: App) -> None:
    status, started = await app.post("/sales", {"amount": "4.02", "product": "snack"})
    assert status == 202
    steps = await asyncio.wait_for(app.follow(started["sale_id"]), 10)
    assert steps[-1]["state"] == "declined"
    assert steps[-1]["captured_cents"] == 0


async def test_cancel_while_waiting_for_the_card(app: App) -> None:
    # ..05: no card comes; a read-card (authorize_capture) can be cancelled, a charge-card not
    status, started = await app.post("/sales", {"amount": 305, "flow": "authorize_capture"})
    assert status == 202
    follower = asyncio.create_task(app.follow(started["sale_id"]))
    await asyncio.sleep(0.1)
    status, answer = await app.post(f"/sales/{started['sale_id']}/cancel", {})
    assert status == 202
    assert answer["cancelled"] is True
    steps = await asyncio.wait_for(follower, 10)
    assert steps[-1]["state"] == "cancelled"


async def test_a_sale_whose_authorization_lost_its_answer_does_not_make_the_next_409(
    tmp_path: Path, sim_factory: Any
) -> None:
    # The authorization's answer is lost (the service commits it late): while reporting is
    # asked what became of the hold, the next customer's sale is taken, not refused.
    sim, settings, clock = await losing_authorization_answers(sim_factory)
    trigger = {"platform": "kiosk_api", "name": "screen", "token": "!secret kiosk_token",
               "port": 0, "products": {"coffee": "2.50", "tea": "1.75"},
               "flow": "authorize_capture"}
    async with (
        running_agent(tmp_path, settings, [trigger], time_scale=300, clock=clock,
                      sales={"vend_timeout": 5.0, "answer_margin": 3.0},
                      secrets={"kiosk_token": TOKEN}) as agent,
        aiohttp.ClientSession() as session,
        stopped_on_failure(agent, clock),
    ):  # fmt: skip
        [api] = agent.platforms
        assert isinstance(api, KioskApi)
        app = App(api, session)
        status, first = await app.post("/sales", {"product": "coffee"})
        assert status == 202
        await held_by_the_service(sim)
        await clock.advance(2.0)  # the agent gives up on the authorization
        await clock.next_due()  # no row yet: looking again later
        assert agent.journal.get(first["sale_id"]).state is SaleState.UNRESOLVED
        await arm_cleared(sim)  # the service commits it now, its answer going to nobody

        status, second = await app.post("/sales", {"product": "tea"})
        assert status == 202, second
        await asyncio.wait_for(until_final(agent, second["sale_id"]), 60)  # a hang's guard
        assert agent.journal.get(second["sale_id"]).state is SaleState.COMPLETED
        assert agent.journal.get(first["sale_id"]).state is SaleState.UNRESOLVED

        async with asyncio.timeout(60):  # a hang's guard
            while not await ledger(agent, first["order_id"]):  # the late authorization
                await asyncio.sleep(0.01)
        await clock.run(until_final(agent, first["sale_id"]))
        assert agent.journal.get(first["sale_id"]).state is SaleState.REVERSED


async def test_busy_terminal_is_409(app: App) -> None:
    _, first = await app.post("/sales", {"amount": "3.05", "flow": "authorize_capture"})
    status, second = await app.post("/sales", {"product": "tea"})
    assert status == 409
    assert second["error"] == "terminal_busy"
    await app.post(f"/sales/{first['sale_id']}/cancel", {})


def _capturing(app: App, sale_id: str) -> bool:
    record = app.api.agent.journal.get(sale_id)
    return record is not None and record.state is SaleState.CAPTURING


async def test_a_sale_that_only_captures_leaves_the_terminal_to_the_next_202(
    tmp_path: Path, sim: Any, sim_settings: Any
) -> None:
    # The service is slow on the capture: the coffee's sale is paid and dispensed, only the
    # capture is left (the payments API's, not the terminal's), so the next customer starts.
    await sim_call(sim, "POST", "/sim/faults",
                   {"path": "/api/v1/capture", "fault": "delay", "delay_s": 0.5})
    async for app in _app(tmp_path, sim_settings, flow="authorize_capture"):
        _, first = await app.post("/sales", {"product": "coffee"})
        await until(functools.partial(_capturing, app, first["sale_id"]))
        status, second = await app.post("/sales", {"product": "tea"})
        assert status == 202, second
        assert _capturing(app, first["sale_id"])  # its capture is still with the service
        first_steps, second_steps = await asyncio.wait_for(
            asyncio.gather(app.follow(first["sale_id"]), app.follow(second["sale_id"])), 10
        )
        assert first_steps[-1]["captured_cents"] == 250
        assert second_steps[-1]["captured_cents"] == 175


async def test_unknown_sale_is_404(app: App) -> None:
    status, answer = await app.get("/sales/0123456789abcdef")
    assert status == 404
    assert answer["field"] == "sale_id"
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await app.session.ws_connect(f"{app.base}/sales/0123456789abcdef/events?token={TOKEN}")
    assert refused.value.status == 404


async def test_token_is_required(app: App) -> None:
    status, _answer = await app.post("/sales", {"product": "tea"}, token="wrong-token-0000000000")
    assert status == 401
    async with app.session.get(f"{app.base}/status") as response:
        assert response.status == 401
    assert app.api.status()["rejected"] == 2


async def test_app_confirms_the_dispense(tmp_path: Path, sim_settings: Any) -> None:
    async for app in _app(tmp_path, sim_settings, confirm_dispense=True,
                          flow="authorize_capture"):
        _, vended = await app.post("/sales", {"product": "tea"})
        last, status = await app.confirm(vended["sale_id"], {"status": "vended"})
        assert status == 202
        assert last["state"] == "completed"
        assert last["captured_cents"] == 175

        _, failed = await app.post("/sales", {"product": "coffee"})
        last, _ = await app.confirm(failed["sale_id"], {"status": "failed", "detail": "cup jammed"})
        assert last["state"] == "reversed"
        status, _answer = await app.post(f"/sales/{failed['sale_id']}/dispensed",
                                        {"status": "vended"})
        assert status == 409


def test_schema_requires_a_real_token_and_loopback_default() -> None:
    config = PLATFORM_SCHEMA({"platform": "kiosk_api", "token": TOKEN})
    assert config["host"] == "127.0.0.1"
    with pytest.raises(Exception, match="at least 16 characters"):
        PLATFORM_SCHEMA({"platform": "kiosk_api", "token": "short"})


async def test_markup_and_any_printable_script_in_a_name_are_fine(app: App) -> None:
    markup = {"amount": "1.00", "product": "<b>tea</b> & \"milk\" \u00e9\u00e8 \u6f22"}
    status, started = await app.post("/sales", markup)
    assert status == 202, started  # shown as text, never taken for markup
    await app.post(f"/sales/{started['sale_id']}/cancel", {})


@pytest.mark.parametrize(
    "product",
    [
        "\u0646\u0627\u0646\u200c\u0628\u0631\u0646\u062c\u06cc",  # Persian: a ZWNJ
        "\u0915\u094d\u200d\u0937",  # Devanagari: a zero-width joiner
        "\U0001f468\u200d\U0001f469\u200d\U0001f467 pack",  # an emoji family
    ],
)
async def test_joiners_that_scripts_and_emoji_need_are_fine(app: App, product: str) -> None:
    status, started = await app.post("/sales", {"amount": "1.00", "product": product})
    assert status == 202, started


# -- as a browser would meet it ----------------------------------------------------------------


async def _raw_post(
    app: App, path: str, data: bytes | str, headers: dict[str, str]
) -> tuple[int, Any]:
    async with app.session.post(app.base + path, data=data, headers=headers) as response:
        return response.status, await response.json()


async def test_a_cross_site_form_post_with_a_leaked_token_starts_no_sale(app: App) -> None:
    """What a page on any site can send without a CORS preflight: text/plain or a form, the
    token in the URL (a form cannot set Authorization). None of it reaches a sale."""
    body = '{"product": "coffee"}'
    status, answer = await _raw_post(
        app, f"/sales?token={TOKEN}", body, {"Content-Type": "text/plain"}
    )
    assert (status, answer["error"]) == (401, "unauthorized")  # a query token is not enough
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        headers = {**auth, "Content-Type": content_type}
        status, answer = await _raw_post(app, "/sales", body, headers)
        assert status == 415, content_type
        assert answer["field"] == "Content-Type"
        assert "application/json" in answer["message"]
    assert app.api.status()["sales_known"] == 0
    status, _ = await _raw_post(app, "/sales", body, {**auth, "Content-Type": "application/json"})
    assert status == 202  # the app's own request, as before


async def test_dns_rebinding_a_foreign_host_is_refused(app: App) -> None:
    """A page on evil.example re-pointed at 127.0.0.1 still names evil.example as Host."""
    port = app.api.port
    headers = {"Authorization": f"Bearer {TOKEN}", "Host": f"evil.example:{port}"}
    async with app.session.post(app.base + "/sales", json={"product": "tea"},
                                headers=headers) as response:
        assert response.status == 403
        answer = await response.json()
    assert (answer["error"], answer["field"]) == ("bad_host", "Host")
    assert "evil.example" in answer["message"]
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await app.session.ws_connect(f"{app.base}/events?token={TOKEN}",
                                     headers={"Host": "evil.example"})
    assert refused.value.status == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "LOCALHOST"):
        async with app.session.get(app.base + "/status", headers={
            "Authorization": f"Bearer {TOKEN}", "Host": host}) as response:
            assert response.status == 200, host
    assert app.api.status()["sales_known"] == 0


async def test_an_allowed_host_header_is_parsed_once_and_a_refused_one_is_never_kept(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each request's Host header was parsed again (``_host_name``: five calls, twice a sale);
    one found allowed is kept as sent, so the app's next requests compare it alone. A refused
    one is parsed and refused every time, and a host sending many spellings keeps a few."""
    from kiosk_agent.platforms import kiosk_api

    parsed: list[str] = []
    parse = kiosk_api._host_name
    monkeypatch.setattr(kiosk_api, "_host_name", lambda header: parsed.append(header) or parse(
        header))
    port = app.api.port

    async def status_for(host: str) -> int:
        async with app.session.get(app.base + "/status", headers={
                "Authorization": f"Bearer {TOKEN}", "Host": host}) as response:
            return response.status

    for _ in range(3):
        assert await status_for(f"127.0.0.1:{port}") == 200
        assert await status_for(f"evil.example:{port}") == 403
    assert parsed == [f"127.0.0.1:{port}", f"evil.example:{port}", f"evil.example:{port}",
                      f"evil.example:{port}"]
    assert f"evil.example:{port}" not in app.api._hosts_seen
    for other_port in range(1, 41):  # allowed, each spelled its own way
        assert await status_for(f"localhost:{other_port}") == 200
    assert len(app.api._hosts_seen) == kiosk_api._HOSTS_SEEN_KEPT
    assert await status_for(f"localhost:{40}") == 200  # past the kept ones: parsed, allowed
    assert await status_for("evil.example") == 403


async def test_a_foreign_origin_is_refused_and_loopback_pages_are_not(app: App) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for origin in ("https://evil.example", "null", "http://localhost.evil.example:8080",
                   "http://127.0.0.1:80x"):
        async with app.session.post(app.base + "/sales", json={"product": "tea"},
                                    headers={**auth, "Origin": origin}) as response:
            assert response.status == 403, origin
            assert (await response.json())["error"] == "bad_origin"
    # cross-site WebSocket hijacking: the browser sends the page's Origin on the handshake
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await app.session.ws_connect(f"{app.base}/events?token={TOKEN}",
                                     origin="https://evil.example")
    assert refused.value.status == 403
    async with app.session.ws_connect(f"{app.base}/events?token={TOKEN}",
                                      origin="http://localhost:3000") as ws:
        assert not ws.closed
    async with app.session.get(app.base + "/status",
                               headers={**auth, "Origin": "http://127.0.0.1:5173"}) as response:
        assert response.status == 200


async def test_the_allow_lists_are_configurable(tmp_path: Path, sim_settings: Any) -> None:
    async for app in _app(tmp_path, sim_settings, allowed_hosts=["kiosk.local"],
                          allowed_origins=["app://kiosk", "http://kiosk.local:*"]):
        auth = {"Authorization": f"Bearer {TOKEN}"}
        cases = [
            ({"Host": "kiosk.local:8765"}, 200),
            ({"Host": "localhost"}, 403),  # the list replaces the default
            ({"Host": "127.0.0.1"}, 200),  # the bound host is always allowed
            ({"Origin": "app://kiosk"}, 200),
            ({"Origin": "http://kiosk.local:8080"}, 200),
            ({"Origin": "http://localhost:3000"}, 403),
        ]
        for headers, expected in cases:
            async with app.session.get(app.base + "/status",
                                       headers={**auth, **headers}) as response:
                assert response.status == expected, headers


def test_schema_defaults_to_loopback_allow_lists() -> None:
    config = PLATFORM_SCHEMA({"platform": "kiosk_api", "token": TOKEN})
    assert config["allowed_hosts"] == ["127.0.0.1", "localhost", "::1"]
    assert "http://localhost:*" in config["allowed_origins"]
    with pytest.raises(Exception, match="list of names"):
        PLATFORM_SCHEMA({"platform": "kiosk_api", "token": TOKEN, "allowed_hosts": "any"})


HOSTILE_BODIES = [
    (b'{"amount": ' + b"9" * 5000 + b"}", "5000 characters"),
    (b'{"amount": ' + b"[" * 30000 + b"]" * 30000 + b"}", "nests deeper than"),
    (b'{"amount": 1e999}', "out of range"),
    (b'{"amount": NaN}', "NaN is not a JSON number"),
    (b'{"amount": -Infinity}', "-Infinity is not a JSON number"),
    (b'{"product": "\\ud800"}', "unpaired surrogate"),
    (b'{"amount": "2.50"', "not JSON"),
    (b"\xff\xfe", "not UTF-8"),
]


@pytest.mark.parametrize(("raw", "message"), HOSTILE_BODIES)
async def test_hostile_bodies_get_a_400_naming_the_fault(
    app: App, raw: bytes, message: str
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    status, answer = await _raw_post(app, "/sales", raw, headers)
    assert status == 400
    assert message in answer["message"]
    assert len(answer["message"]) < 200  # the body is described, never echoed
    status, _ = await app.post("/sales", {"product": "tea"})
    assert status == 202  # and the API goes on


CUSTOMER = {
    "name": "Pat Doe", "account_zip": "12345", "address1": "1 Main St", "city": "Springfield",
    "region": "IL", "country": "US", "phone": "+1 555 0100",
}  # fmt: skip
PLAN = {"name": "locker-monthly", "amount": "9.99",
        "rrule": "DTSTART:20270101T000000Z\nRRULE:FREQ=MONTHLY;INTERVAL=1"}


async def test_an_enrollment_from_the_app_saves_the_card_with_the_customers_details(
    app: App,
) -> None:
    """Before: an enrollment without an amount was refused (the API made it 0, the runner
    wants one above zero), and the body could not carry the billing details the vault requires,
    so one with an amount read the card, then failed ('account_zip' must not be empty)."""
    body = {"flow": "enroll", "email": "pat@example.com", "customer": CUSTOMER, "plan": PLAN}
    status, started = await app.post("/sales", body)
    assert status == 202, started
    steps = await asyncio.wait_for(app.follow(started["sale_id"]), 10)
    assert steps[-1]["state"] == "completed", steps[-1]["message"]
    assert steps[-1]["captured_cents"] == 0  # saving a card takes no money
    sale = app.api.agent.journal.get(started["sale_id"])
    account = await app.api.agent.service.vault.get(sale.vault_uuid)
    assert (account.name, account.account_zip, account.city, account.email) == (
        "Pat Doe", "12345", "Springfield", "pat@example.com")
    plan = await app.api.agent.service.plans.get(int(sale.plan_id))
    assert plan.payment_account_uuid == sale.vault_uuid


async def test_an_app_that_fell_behind_is_told_how_many_steps_it_missed_and_where(
    app: App,
) -> None:
    """Before: an app reading the event stream slower than the agent wrote it lost the steps
    past its queue (256) without a word."""
    from kiosk_agent.sales.model import SaleEvent

    async with app.session.ws_connect(f"{app.base}/events?token={TOKEN}") as ws:
        await until(lambda: app.api.agent.events.subscriber_count > 0 and _streaming(app))
        ids = [f"burst{n:011d}" for n in range(300)]
        for sale_id in ids:  # at once: no reader runs meanwhile
            app.api.agent.events.publish(SaleEvent(
                sale_id=sale_id, order_id=f"o-{sale_id}", source=app.api.name,
                state=SaleState.STARTED, amount_cents=100,
            ))  # fmt: skip
        app.api.agent.events.publish(SaleEvent(  # not this app's: neither queued nor counted
            sale_id="other", order_id="o", source="mdb:front", state=SaleState.STARTED,
            amount_cents=100))
        messages = [await asyncio.wait_for(ws.receive_json(), 10) for _ in range(257)]
    assert messages[0]["gap"] is True
    assert messages[0]["missed"] == 44  # the first 44 are lost, and said to be, first
    assert "44 step(s) missed here" in messages[0]["message"]
    assert [m["sale_id"] for m in messages[1:]] == ids[44:]


async def test_each_step_is_encoded_once_however_many_streams_send_it(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: every open stream encoded each step itself (an app following its sale and the
    app-wide stream paid the JSON twice). Both streams still send the same text."""
    from kiosk_agent.platforms import kiosk_api

    encoded: list[str] = []

    def counted(event: Any) -> dict[str, Any]:
        encoded.append(event.state.value)
        return kiosk_api_event_json(event)

    kiosk_api_event_json = kiosk_api.event_json
    monkeypatch.setattr(kiosk_api, "event_json", counted)
    async with app.session.ws_connect(f"{app.base}/events?token={TOKEN}") as everything:
        await until(lambda: _streaming(app))
        status, started = await app.post("/sales", {"product": "coffee"})
        assert status == 202
        async with app.sale_stream(started['sale_id']) as one_sale:
            its_texts = [message.data async for message in one_sale]
        all_texts = []
        while not all_texts or not json.loads(all_texts[-1])["final"]:
            all_texts.append((await asyncio.wait_for(everything.receive(), 10)).data)
    assert json.loads(its_texts[-1])["state"] == "completed"
    # the sale's stream joined late: its first step is the latest one, sent at the join
    assert its_texts[1:] == all_texts[-len(its_texts) + 1 :]
    assert len(encoded) == len(all_texts) + 1  # each step once, and the join's


async def test_a_stream_of_one_sale_encodes_no_other_sales_steps(
    tmp_path: Path, sim_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: while any stream was open, every step of this app's was encoded, also those of
    sales no open stream follows (a busy kiosk with several terminals)."""
    from kiosk_agent.platforms import kiosk_api
    from kiosk_agent.sales.model import SaleEvent

    encoded: list[str] = []
    kiosk_api_event_json = kiosk_api.event_json

    def counted(event: Any) -> dict[str, Any]:
        encoded.append(event.sale_id)
        return kiosk_api_event_json(event)

    monkeypatch.setattr(kiosk_api, "event_json", counted)
    async for app in _app(tmp_path, sim_settings, confirm_dispense=True):
        _, started = await app.post("/sales", {"product": "tea"})
        sale_id = started["sale_id"]
        async with app.sale_stream(sale_id) as ws:
            async for message in ws:
                if message.json()["state"] != "dispensing":
                    continue
                for n in range(3):  # another terminal's sales, from the same app
                    app.api.agent.events.publish(SaleEvent(
                        sale_id=f"other{n}", order_id=f"o-{n}", source=app.api.name,
                        state=SaleState.STARTED, amount_cents=100,
                    ))  # fmt: skip
                status, _ = await app.post(f"/sales/{sale_id}/dispensed", {"status": "vended"})
                assert status == 202
        status, others = await app.get("/sales/other1")  # known, and encoded when asked
        assert (status, others["sale_id"]) == (200, "other1")
    assert encoded.count("other0") == encoded.count("other2") == 0
    assert encoded.count("other1") == 1
    assert encoded.count(sale_id) >= 3


async def test_a_stream_offers_no_compression_to_a_client_that_asks(app: App) -> None:
    """A browser offers permessage-deflate; a step is a few hundred bytes on the kiosk's own
    machine, so zlib on each frame would cost CPU and save nothing worth it."""
    async with app.session.ws_connect(f"{app.base}/events?token={TOKEN}", compress=15) as ws:
        assert ws.compress == 0
        assert "permessage-deflate" not in ws._response.headers.get(
            "Sec-WebSocket-Extensions", ""
        )


def _streaming(app: App) -> bool:
    return bool(app.api._sockets)  # the stream's subscription is open


# -- a service answering more than was asked ------------------------------------------------------


class AnswerRewritingProxy:
    """Real HTTP between the agent and the simulator; each JSON answer under ``only`` passes
    through ``rewrite`` (bytes in, bytes out) on its way back: a service answering in the wrong
    unit, or cut short."""

    def __init__(self, upstream: str, only: str, rewrite: Callable[[bytes], bytes]) -> None:
        self.upstream = upstream
        self.only = only  # a part of the path whose answers are rewritten
        self.rewrite = rewrite
        self.rewritten = 0
        self.runner: aiohttp.web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = aiohttp.web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self.runner = aiohttp.web.AppRunner(app)
        await self.runner.setup()
        site = aiohttp.web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    def settings(self, sim: Any) -> Any:
        """The agent's service settings reaching the simulator through this proxy, polling."""
        ready = {**sim.ready_info(), "base_url": self.url, "reporting_url": self.url}
        return settings_from_ready(ready, websocket=False)

    async def _forward(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with aiohttp.ClientSession() as session, session.request(
            request.method, self.upstream + request.path_qs, data=await request.read(),
            headers=headers,
        ) as answer:
            body = await answer.read()
            if answer.content_type == "application/json" and self.only in request.path:
                changed = self.rewrite(body)
                self.rewritten += changed != body
                body = changed
            return aiohttp.web.Response(body=body, status=answer.status,
                                        content_type=answer.content_type)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def amounts_times(factor: int, divisor: int = 1) -> Callable[[bytes], bytes]:
    """Every charge result (a dict with ``trans_id`` and an integer ``amount``) times ``factor``
    (and divided by ``divisor``, whole cents: a partial approval)."""

    def inflate(value: Any) -> Any:
        if isinstance(value, dict):
            if "trans_id" in value and isinstance(value.get("amount"), int):
                value = {**value, "amount": value["amount"] * factor // divisor}
            return {k: inflate(v) for k, v in value.items()}
        if isinstance(value, list):
            return [inflate(v) for v in value]
        return value

    return lambda body: json.dumps(inflate(json.loads(body))).encode()


def cut_short(body: bytes) -> bytes:
    return body[: len(body) // 2]


@contextlib.asynccontextmanager
async def answers_rewritten(
    sim: Any, only: str, rewrite: Callable[[bytes], bytes]
) -> AsyncIterator[AnswerRewritingProxy]:
    proxy = AnswerRewritingProxy(sim.ready_info()["base_url"], only, rewrite)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


async def a_coffee_answered(
    tmp_path: Path, sim: Any, flow: str, answered_at: str, rewrite: Callable[[bytes], bytes]
) -> Any:
    """One coffee ($2.50) sold from the app while the service's answers at ``answered_at`` are
    rewritten (at least one was): the sale as the journal ends it."""
    async with answers_rewritten(sim, answered_at, rewrite) as proxy:
        async for app in _app(tmp_path, proxy.settings(sim), flow=flow):
            status, started = await app.post("/sales", {"product": "coffee"})
            assert status == 202
            await asyncio.wait_for(until_final(app.api.agent, started["sale_id"]), 15)
            record = app.api.agent.journal.get(started["sale_id"])
            assert proxy.rewritten
    return record


# where each flow's money is answered: the authorization, or the terminal's charge
@pytest.mark.parametrize(("flow", "answered_at"), [("authorize_capture", "/api/v1/charge"),
                                                   ("charge_card", "/charge-card")])
async def test_a_service_answering_more_than_asked_never_vends_or_captures_above_the_price(
    tmp_path: Path, sim: Any, flow: str, answered_at: str
) -> None:
    """The service answers 100 times the price (the wrong unit): the app is told to dispense
    the price asked at most and the capture takes no more; a charge answered above the price is
    not called paid (ATTENTION names both amounts). Never $250.00 for a coffee."""
    # the service does answer 25000
    record = await a_coffee_answered(tmp_path, sim, flow, answered_at, amounts_times(100))
    assert record.vended_cents == 250, record
    if flow == "authorize_capture":  # the hold is more: the capture takes the price
        assert (record.state, record.captured_cents) == (SaleState.COMPLETED, 250)
    else:  # the charge says it took more: not called paid; reporting or a person says
        assert record.state is SaleState.ATTENTION, record
        assert "charge answered $250.00 for the $2.50 asked" in record.message


async def test_a_partial_authorization_vends_nothing_and_gives_the_hold_back(
    tmp_path: Path, sim: Any
) -> None:
    """The service approves $1.25 of a $2.50 coffee (a partial approval): the sale's money rule
    (sales.model.vend_refusal) says no before any dispense, whatever the platform; the app
    hears the sale end without a vend and the hold goes back. Before, the app (which needs no
    confirmation) vended and the capture took $1.25: a coffee at half price."""
    record = await a_coffee_answered(
        tmp_path, sim, "authorize_capture", "/api/v1/charge", amounts_times(1, 2)
    )
    assert record.state is SaleState.REVERSED, record
    assert (record.vended_cents, record.captured_cents) == (0, 0), record
    assert "selection coffee costs $2.50, above the $1.25 authorized" in record.message, record


async def test_a_capture_answered_above_what_it_asked_is_not_called_paid(
    tmp_path: Path, sim: Any
) -> None:
    """The capture of $2.50 answers $250.00 taken (the wrong unit): the sale is not completed
    as paid at the service's figure; it waits in attention, naming both amounts."""
    record = await a_coffee_answered(
        tmp_path, sim, "authorize_capture", "/api/v1/capture", amounts_times(100)
    )
    assert record.state is SaleState.ATTENTION, record
    assert "capture answered $250.00 for the $2.50 asked" in record.message


@pytest.mark.parametrize(("flow", "answered_at"), [("authorize_capture", "/api/v1/charge"),
                                                   ("charge_card", "/charge-card")])
async def test_a_negative_amount_answered_is_no_answer_and_moves_no_money_backwards(
    tmp_path: Path, sim: Any, flow: str, answered_at: str, caplog: pytest.LogCaptureFixture
) -> None:
    """-250 cents answered for a $2.50 sale: an answer the client refuses naming ``amount``, as
    any malformed one (the truth is then looked up), never a vend of -$2.50 nor a bug's
    traceback."""
    record = await a_coffee_answered(tmp_path, sim, flow, answered_at, amounts_times(-1))
    assert 0 <= record.vended_cents <= 250, record
    assert 0 <= record.captured_cents <= 250, record
    assert "internal error" not in record.message, record
    assert "flow error" not in caplog.text


async def test_an_authorization_answered_cut_short_is_a_lost_answer_not_a_refusal(
    tmp_path: Path, sim: Any
) -> None:
    """The service authorized and its 200 answer was cut in half: the hold exists. The sale is
    not 'refused' (FAILED, the hold left on the card): the answer is lost, found in reporting by
    the order id, and given back."""
    record = await a_coffee_answered(
        tmp_path, sim, "authorize_capture", "/api/v1/charge", cut_short
    )
    assert record.state is SaleState.REVERSED, record
    assert record.reversed_cents == 250, record


ANSWER_VALUES = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
                 | st.floats() | st.text(max_size=12) | st.sampled_from(["A", "B", "C", "2.50"]))
ANSWER_CHANGES = st.one_of(
    st.fixed_dictionaries({}, optional={"amount": ANSWER_VALUES, "result": ANSWER_VALUES,
                                        "trans_id": ANSWER_VALUES, "order_id": ANSWER_VALUES}),
    st.integers(min_value=0, max_value=400),  # cut after this many bytes
)


def _changed_answer(change: dict[str, Any] | int) -> Callable[[bytes], bytes]:
    def rewrite(body: bytes) -> bytes:
        if isinstance(change, int):
            return body[:change]
        answer = json.loads(body)
        return json.dumps({**answer, **change} if isinstance(answer, dict) else answer).encode()

    return rewrite


@pytest.mark.slow(seconds=10)
@settings(max_examples=15, deadline=None, derandomize=True,
          phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(change=ANSWER_CHANGES, flow=st.sampled_from(["authorize_capture", "charge_card"]))
def test_any_answer_to_a_money_call_ends_the_sale_and_takes_no_more_than_the_price(
    tmp_path_factory: Any, change: dict[str, Any] | int, flow: str
) -> None:
    """The service's answer to the authorization (or charge_card's interaction) changed or cut
    anywhere: the sale ends, keeps at most the price asked, and no bug's traceback is logged."""
    asyncio.run(_any_answer(tmp_path_factory.mktemp("answer"), change, flow))


async def _any_answer(workdir: Path, change: dict[str, Any] | int, flow: str) -> None:
    sim = SimServer(SimOptions(port=0, time_scale=200, transactions=0, seed=1))
    await sim.start()
    errors = ErrorLog()
    only = "/api/v1/charge" if flow == "authorize_capture" else "/charge-card"
    try:
        async with asyncio.timeout(25), answers_rewritten(sim, only, _changed_answer(change)) as p:
            async for app in _app(workdir, p.settings(sim), flow=flow):
                status, started = await app.post("/sales", {"product": "coffee"})
                assert status == 202
                await until_final(app.api.agent, started["sale_id"])
                record = app.api.agent.journal.get(started["sale_id"])
                assert 0 <= record.vended_cents <= 250, record
                kept = record.captured_cents - record.reversed_cents
                assert kept <= 250, record
                assert record.state is not SaleState.COMPLETED or record.captured_cents == 250
    finally:
        errors.close()
        await sim.stop()
    assert not errors.records, [r.getMessage() for r in errors.records]


async def test_a_sales_stream_reads_nothing_until_the_app_speaks(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: each sale's stream started a task to read what the app sends (nothing, until
    the close it answers with) and armed a heartbeat timer, both ended with the sale: a task
    and two timers a sale. Now neither, and the close handshake is whole (1000 both ways)."""
    from kiosk_agent.platforms import kiosk_api

    readers: list[object] = []
    drain = kiosk_api._drain

    async def counted(ws: Any) -> None:
        readers.append(ws)
        await drain(ws)

    monkeypatch.setattr(kiosk_api, "_drain", counted)
    for _ in range(2):
        _, started = await app.post("/sales", {"product": "coffee"})
        async with app.sale_stream(started['sale_id']) as ws:
            [server_side] = app.api._sockets
            assert server_side._heartbeat is None  # aiohttp's: no timer armed or re-armed
            steps = [message.json() async for message in ws]
        assert steps[-1]["state"] == "completed"
        assert ws.close_code == 1000  # the agent's close, answered by the app
        await until(lambda: not app.api._sockets)
    assert readers == []


async def test_an_app_that_closes_its_sales_stream_early_is_answered_at_once(
    tmp_path: Path, sim_settings: Any
) -> None:
    """The app gives up following a sale that waits for it: its close is answered then, not
    when the sale ends, and the stream's slot is free; the sale goes on."""
    async for app in _app(tmp_path, sim_settings, confirm_dispense=True):
        _, started = await app.post("/sales", {"product": "tea"})
        sale_id = started["sale_id"]
        async with app.sale_stream(sale_id) as ws:
            async for message in ws:
                if message.json()["state"] == "dispensing":
                    break
            assert await asyncio.wait_for(ws.close(), 5)  # answered by the agent's close
        assert ws.close_code == 1000
        await until(functools.partial(_no_stream, app))
        assert app.api._site.streams == 0
        status, _ = await app.post(f"/sales/{sale_id}/dispensed", {"status": "vended"})
        assert status == 202
        await until(functools.partial(_ended, app, sale_id))
        assert app.api._latest[sale_id].state is SaleState.COMPLETED


async def test_an_app_that_pings_or_drops_its_sales_stream_is_heard(
    tmp_path: Path, sim_settings: Any
) -> None:
    """What the app sends is read from its first byte: a ping is answered while the sale
    waits, and a connection dropped without a close frees the stream before the sale ends."""
    async for app in _app(tmp_path, sim_settings, confirm_dispense=True):
        _, started = await app.post("/sales", {"product": "tea"})
        sale_id = started["sale_id"]
        async with app.session.ws_connect(
            f"{app.base}/sales/{sale_id}/events?token={TOKEN}", autoping=False
        ) as ws:
            while (await asyncio.wait_for(ws.receive_json(), 5))["state"] != "dispensing":
                pass
            await ws.ping(b"still here")
            pong = await asyncio.wait_for(ws.receive(), 5)
            assert (pong.type, pong.data) == (aiohttp.WSMsgType.PONG, b"still here")
            assert app.api._sockets
            ws._conn.transport.abort()  # type: ignore[union-attr]  # gone, no close frame
            await until(functools.partial(_no_stream, app))
            assert app.api._site.streams == 0
        assert not app.api._latest[sale_id].state.final  # the sale still waits for the app
        status, _ = await app.post(f"/sales/{sale_id}/dispensed", {"status": "vended"})
        assert status == 202


def _no_stream(app: App) -> bool:
    return not app.api._sockets


def _ended(app: App, sale_id: str) -> bool:
    return app.api._latest[sale_id].state.final


@given(
    message=st.text(max_size=40), product=st.one_of(st.none(), st.text(max_size=12)),
    at=st.floats(min_value=0, max_value=4e9), cents=st.integers(0, 10**9),
    state=st.sampled_from(SaleState),
)  # fmt: skip
def test_a_frame_is_the_text_json_dumps_makes_of_it(
    message: str, product: str | None, at: float, cents: int, state: SaleState
) -> None:
    """A step's frame comes from one JSON encoder made once, not one made a call by json.dumps:
    the same text, escapes, floats and all."""
    from kiosk_agent.platforms.kiosk_api import event_json, event_text
    from kiosk_agent.sales.model import SaleEvent

    event = SaleEvent(sale_id="s1", order_id="KA1", source="kiosk_api:screen", state=state,
                      amount_cents=cents, captured_cents=cents // 2, product=product,
                      terminal="SIM-0001", message=message, at=at)  # fmt: skip
    assert event_text(event) == json.dumps(event_json(event))
    assert event_json(event)["amount"] == cents_to_dollars(cents)
    assert event_json(event)["state"] == state.value


def test_a_sales_amount_is_written_out_once_for_all_its_frames() -> None:
    from kiosk_agent.money import MoneyError
    from kiosk_agent.platforms.kiosk_api import _dollars, event_text
    from kiosk_agent.sales.model import SaleEvent

    event = SaleEvent(sale_id="s1", order_id="KA1", source="kiosk_api:screen",
                      state=SaleState.CHARGING, amount_cents=987_654_301)  # fmt: skip
    before = _dollars.cache_info().misses
    for _ in range(5):
        assert '"amount": "9876543.01"' in event_text(event)
    assert _dollars.cache_info().misses == before + 1
    _dollars(1)
    with pytest.raises(MoneyError):
        _dollars(True)  # not taken for the 1 just made


async def test_a_streams_frames_are_sent_from_one_coroutine_of_the_api(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each wake-up of a stream resumes every coroutine its handler awaits in: a sale's stream
    sent its frames three deep (_sale_events, _stream, _stream_in_slot; the app-wide one two),
    a Python call each at every wake-up. Both routes are one coroutine now, and send the same."""
    import sys

    from aiohttp import web

    senders: list[list[str]] = []
    send_str = web.WebSocketResponse.send_str

    async def recorded(ws: web.WebSocketResponse, *args: Any, **kwargs: Any) -> None:
        if ws not in app.api._sockets:  # the simulator's cable, in this process too
            return await send_str(ws, *args, **kwargs)
        frame, names = sys._getframe(1), []
        while frame is not None:
            if frame.f_globals.get("__name__") == "kiosk_agent.platforms.kiosk_api":
                names.append(frame.f_code.co_name)
            frame = frame.f_back
        senders.append(names)
        return await send_str(ws, *args, **kwargs)

    monkeypatch.setattr(web.WebSocketResponse, "send_str", recorded)
    async with app.session.ws_connect(f"{app.base}/events?token={TOKEN}") as everything:
        await until(lambda: _streaming(app))
        _, started = await app.post("/sales", {"product": "coffee"})
        steps = await asyncio.wait_for(app.follow(started["sale_id"]), 10)
        seen = [json.loads((await asyncio.wait_for(everything.receive(), 10)).data)]
        while not seen[-1]["final"]:
            seen.append(json.loads((await asyncio.wait_for(everything.receive(), 10)).data))
    assert steps[-1]["state"] == seen[-1]["state"] == "completed"
    # the sale's own stream sent its join's step so; the later ones went from the listener
    assert len(senders) == len(seen) + 1
    assert all(names == ["_stream", "_auth"] for names in senders), senders


@given(
    status=st.sampled_from([202, 400, 404, 409, 503]), error=st.text(max_size=20),
    field=st.one_of(st.none(), st.text(max_size=20)), message=st.text(max_size=80),
)  # fmt: skip
def test_an_answer_is_the_text_json_dumps_makes_of_it(
    status: int, error: str, field: str | None, message: str
) -> None:
    """The 202 and the refusals come from the frames' encoder made once, not json.dumps's made a
    call (three Python calls at each sale's 202): the same text, escapes and all."""
    from kiosk_agent.platforms.kiosk_api import _error

    response = _error(status, error, field, message)
    assert response.status == status
    assert response.content_type == "application/json"
    assert response.text == json.dumps({"error": error, "field": field, "message": message})


async def test_a_sales_own_stream_writes_its_steps_from_the_listener_while_the_app_is_silent(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: each step went through the stream's queue, a wake-up of its handler and aiohttp's
    send coroutines. Now the listener writes it at once: the handler sends the join's step only
    and wakes once, at the end; the app reads the same frames as the app-wide stream's."""
    from aiohttp import web

    from kiosk_agent.bus import Subscription

    sent_by_handler: list[str] = []
    waits: list[int] = []
    send_str, next_step = web.WebSocketResponse.send_str, Subscription.next

    async def recorded(ws: web.WebSocketResponse, data: str, *args: Any) -> None:
        if ws in app.api._sockets:
            sent_by_handler.append(json.loads(data)["state"])
        await send_str(ws, data, *args)

    async def counted(queue: Subscription[Any], *until: Any) -> Any:
        waits.append(len(until))
        return await next_step(queue, *until)

    monkeypatch.setattr(web.WebSocketResponse, "send_str", recorded)
    monkeypatch.setattr(Subscription, "next", counted)
    async with app.session.ws_connect(f"{app.base}/events?token={TOKEN}") as everything:
        await until(lambda: _streaming(app))
        _, started = await app.post("/sales", {"product": "coffee"})
        async with app.sale_stream(started["sale_id"]) as one_sale:
            its_texts = [message.data async for message in one_sale]
        all_texts = [(await asyncio.wait_for(everything.receive(), 10)).data]
        while not json.loads(all_texts[-1])["final"]:
            all_texts.append((await asyncio.wait_for(everything.receive(), 10)).data)
    assert json.loads(its_texts[-1])["state"] == "completed"
    assert its_texts[1:] == all_texts[-len(its_texts) + 1 :]  # the same text, byte for byte
    assert len(sent_by_handler) == len(all_texts) + 1  # and of its own stream, the join's step
    assert waits.count(2) == 1  # the sale's stream waited once: for its end or the app


async def test_a_sales_own_stream_queues_its_steps_once_the_app_speaks(
    tmp_path: Path, sim_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener writes a step only while the app has sent nothing: once it speaks (a ping,
    its close) aiohttp may write on the socket too (a pong), so the handler sends the rest."""
    from aiohttp import web

    sent_by_handler: list[str] = []
    send_str = web.WebSocketResponse.send_str

    async def recorded(ws: web.WebSocketResponse, data: str, *args: Any) -> None:
        frame = json.loads(data)
        if "sale_id" in frame:  # not the simulator's cable, in this process too
            sent_by_handler.append(frame["state"])
        await send_str(ws, data, *args)

    monkeypatch.setattr(web.WebSocketResponse, "send_str", recorded)
    async for app in _app(tmp_path, sim_settings, confirm_dispense=True):
        _, started = await app.post("/sales", {"product": "tea"})
        sale_id = started["sale_id"]
        states = []
        async with app.sale_stream(sale_id) as ws:
            async for message in ws:
                states.append(message.json()["state"])
                if states[-1] == "dispensing" and states.count("dispensing") == 1:
                    await ws.ping()  # the app speaks
                    await asyncio.sleep(0.05)
                    status, _ = await app.post(f"/sales/{sale_id}/dispensed", {"status": "vended"})
                    assert status == 202
        assert states[-1] == "completed"
        assert states.count("completed") == 1
        # the join's step by the handler, the next ones at once (the app silent), and after
        # its ping the end by the handler again
        assert sent_by_handler == [states[0], "completed"]


class _Transport:
    def __init__(self, buffered: int = 0) -> None:
        self.buffered = buffered
        self.written: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def write(self, data: bytes) -> None:
        self.written.append(data)


@pytest.mark.parametrize("buffered", [0, 1])
async def test_a_step_is_written_at_once_only_to_a_socket_that_took_every_byte(
    buffered: int,
) -> None:
    """A slow app (bytes still waiting for its socket) gets its steps through the stream's
    bounded queue, as before: its bound and its gaps; a quick one, at once."""
    from types import SimpleNamespace

    from kiosk_agent.bus import EventBus
    from kiosk_agent.platforms.kiosk_api import _write_at_once, text_frame
    from kiosk_agent.sales.model import SaleEvent

    transport = _Transport(buffered)
    heard = asyncio.get_running_loop().create_future()
    ws, request = SimpleNamespace(closed=False), SimpleNamespace(transport=transport)
    bus: EventBus[Any] = EventBus()
    async with bus.subscribe(key="s1") as queue:
        written = _write_at_once(queue, ws, request, heard)  # type: ignore[arg-type]
        assert written is not None
        for state in (SaleState.CHARGING, SaleState.COMPLETED):
            event = SaleEvent(sale_id="s1", order_id="o", source="kiosk_api:screen",
                              state=state, amount_cents=250)  # fmt: skip
            bus.publish((event, f'{{"state": "{state.value}"}}'), "s1")
        if buffered:
            assert transport.written == []
            assert queue.qsize() == 2
            assert not written.done()
        else:
            assert queue.empty()
            assert written.done()
            assert transport.written == [text_frame('{"state": "charging"}'),
                                         text_frame('{"state": "completed"}')]  # fmt: skip
        heard.set_result(None)  # the app spoke: queued from now on
        transport.buffered = 0
        bus.publish((event, "{}"), "s1")
        assert queue.qsize() == 1 + 2 * buffered


@given(st.text(max_size=70_000).filter(lambda t: len(t) < 300 or len(t) > 60_000)
       | st.integers(0, 3).map(lambda n: "x" * (125 + n))
       | st.integers(0, 3).map(lambda n: "y" * (65_534 + n)))  # fmt: skip
@settings(max_examples=60, deadline=None)
def test_a_frame_written_at_once_is_the_bytes_aiohttps_writer_sends(text: str) -> None:
    from types import SimpleNamespace

    from aiohttp import WSMsgType
    from aiohttp._websocket.writer import WebSocketWriter

    from kiosk_agent.platforms.kiosk_api import text_frame

    async def aiohttps(text: str) -> bytes:
        transport = _Transport()
        protocol = SimpleNamespace(_paused=False)
        writer = WebSocketWriter(protocol, transport, use_mask=False)  # type: ignore[arg-type]
        await writer.send_frame(text.encode(), WSMsgType.TEXT)
        return b"".join(transport.written)

    assert text_frame(text) == asyncio.run(aiohttps(text))


async def _a_coffee_sale_profiled_by(
    count: Callable[[types.FrameType, str, object], None], app: App
) -> list[dict[str, Any]]:
    """A coffee sale followed to its end with ``count`` as the profile function: its steps."""
    sys.setprofile(count)
    try:
        _, started = await app.post("/sales", {"product": "coffee"})
        steps: list[dict[str, Any]] = await asyncio.wait_for(app.follow(started["sale_id"]), 10)
    finally:
        sys.setprofile(None)
    return steps


async def test_a_sales_steps_do_not_call_the_listeners_of_other_states(app: App) -> None:
    """Before: availability's listener (it acts on a FAILED or ATTENTION end) and attention's
    (on ATTENTION or an end) were called on each of a sale's six steps; the agent's bus knows a
    step's state and calls them on those only. The kiosk API's and health's hear every step."""
    import collections

    calls: collections.Counter[str] = collections.Counter()
    watched = {"on_sale_event", "_seen", "_follow", "record_sale"}

    def count(frame: types.FrameType, event: str, _arg: object) -> None:
        if event == "call" and frame.f_code.co_name in watched:
            calls[frame.f_code.co_name] += 1

    steps = await _a_coffee_sale_profiled_by(count, app)
    assert steps[-1]["state"] == "completed"
    assert calls["_follow"] == calls["record_sale"] >= 5
    assert calls["on_sale_event"] == 0  # a completed sale is no suspect end
    assert 1 <= calls["_seen"] < calls["_follow"]  # its end (and a receipt note, if any)


async def test_a_sales_stream_dropped_while_the_app_is_silent_takes_no_more_frames(
    tmp_path: Path, sim_settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The listener writes a sale's steps while its app is silent: an app gone without a word
    (its connection cut) is no longer written to; the stream ends, the sale goes on."""
    errors = ErrorLog()
    try:
        async for app in _app(tmp_path, sim_settings, confirm_dispense=True):
            _, started = await app.post("/sales", {"product": "tea"})
            sale_id = started["sale_id"]
            async with app.sale_stream(sale_id) as ws:
                while (await asyncio.wait_for(ws.receive_json(), 5))["state"] != "dispensing":
                    pass
                ws._conn.transport.abort()  # type: ignore[union-attr]  # gone, not a byte sent
                await until(functools.partial(_no_stream, app))
            status, _ = await app.post(f"/sales/{sale_id}/dispensed", {"status": "vended"})
            assert status == 202
            await until(functools.partial(_ended, app, sale_id))
            assert app.api._latest[sale_id].state is SaleState.COMPLETED
            assert app.api._site.streams == 0
    finally:
        errors.close()
    assert errors.records == []
    assert "socket.send() raised exception" not in caplog.text


async def test_a_sale_reads_no_enum_value_property_nor_the_receipt_property(app: App) -> None:
    """Before: a kiosk API sale read an enum member's ``.value`` 24 times (the journal's state,
    was-state and step texts at each write, the sale's row, the flow, the interaction kind, the
    log line), each two Python calls of enum's property, and ``SaleEvent.receipt`` 12 times
    (the kiosk API's and health's listeners at each step). Their texts are read as
    ``_value_`` and the step compared where it is needed: none of those calls is left."""
    import collections

    calls: collections.Counter[str] = collections.Counter()

    def count(frame: types.FrameType, event: str, _arg: object) -> None:
        if event == "call":
            code = frame.f_code
            if (code.co_name == "value" and code.co_filename.endswith("enum.py")) or (
                code.co_name == "receipt" and code.co_filename.endswith("model.py")
            ):
                calls[code.co_name] += 1

    steps = await _a_coffee_sale_profiled_by(count, app)
    assert steps[-1]["state"] == "completed"
    assert calls == {}, calls


async def test_a_sale_whose_app_does_not_confirm_arms_no_vend_timer(app: App) -> None:
    """An app that does not confirm its dispense (``confirm_dispense: false``, the fixture's)
    has its outcome at once: the vend timeout around it was an ``asyncio.timeout`` entered and
    a timer armed and cancelled each sale. The sale's bounds are now the money call's and the
    card wait's, each on the sale's clock; the dispense ends before any is entered."""
    import collections

    bounded_from: collections.Counter[str] = collections.Counter()

    def count(frame: types.FrameType, event: str, _arg: object) -> None:
        code = frame.f_code
        if event == "call" and code.co_name == "wait_for" and code.co_filename.endswith(
            "clock.py"
        ) and frame.f_back is not None:
            bounded_from[frame.f_back.f_code.co_name] += 1

    steps = await _a_coffee_sale_profiled_by(count, app)
    assert steps[-1]["state"] == "completed"
    assert bounded_from["money_call"] >= 1
    assert bounded_from["wait_interaction"] >= 1
    assert bounded_from["_dispense"] == bounded_from["wait_at_most"] == 0, bounded_from


async def test_a_vended_reported_after_the_vend_timeout_is_told_as_a_product_gone_unpaid(
    tmp_path: Path, sim_settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The app confirms the tea only after the sale stopped waiting (its vend timeout) and
    gave the money back. The agent cannot take it again; it answers the app why, says once at
    WARNING that the product went out unpaid, and counts it in the kiosk's status."""
    async for app in _app(tmp_path, sim_settings, confirm_dispense=True, vend_timeout=0.3):
        _, started = await app.post("/sales", {"product": "tea"})
        sale_id = started["sale_id"]
        await until(functools.partial(_ended, app, sale_id))
        assert app.api._latest[sale_id].state is SaleState.REVERSED
        with caplog.at_level("WARNING"):
            status, answer = await app.post(f"/sales/{sale_id}/dispensed", {"status": "vended"})
            again, _ = await app.post(f"/sales/{sale_id}/dispensed", {"status": "vended"})
        assert (status, again) == (409, 409)
        assert "went out unpaid" in answer["message"]
        assert (app.api.status()["late_vends"], app.api.status()["last_late_vend_sale"]) == (
            1, sale_id)  # fmt: skip
        # said once as gone out (the vend timeout's give-back said "may have gone out" first)
        [said] = [r.getMessage() for r in caplog.records
                  if sale_id in r.getMessage() and "went out unpaid" in r.getMessage()]
        assert "tea went out unpaid" in said
        await told_to_a_person(app.api.agent, sale_id, "tea")


@contextlib.asynccontextmanager
async def _confirming_on(
    clock: Clock, tmp_path: Path, sim_settings: Any, **options: Any
) -> AsyncIterator[tuple[Agent, App]]:
    """A kiosk whose app confirms each dispense, its agent on ``clock`` (30 s vend timeout)."""
    trigger = {"platform": "kiosk_api", "name": "screen", "token": "!secret kiosk_token",
               "port": 0, "products": {"tea": "1.75", "coffee": "2.50"},
               "confirm_dispense": True, **options}
    async with (
        running_agent(tmp_path, sim_settings, [trigger], clock=clock,
                      sales={"vend_timeout": 30.0}, secrets={"kiosk_token": TOKEN}) as agent,
        aiohttp.ClientSession() as session,
    ):  # fmt: skip
        [api] = agent.platforms
        assert isinstance(api, KioskApi)
        yield agent, App(api, session)


@pytest.mark.parametrize("flow", ["charge_card", "authorize_capture"])
async def test_an_app_that_confirms_is_given_up_on_at_its_vend_timeout_on_the_sale_clock(
    tmp_path: Path, sim_settings: Any, flow: str
) -> None:
    """i37-sale enters the vend timeout only once a dispense waits (sales/clock.wait_at_most).
    An app that confirms its dispense still has it, in each flow, on the sale's clock: not a
    moment early, and at the bound the money is given back and a late 'vended' told."""
    import time

    from kiosk_agent.sales.clock import FakeClock

    clock = FakeClock(wall=time.time())
    async with _confirming_on(clock, tmp_path, sim_settings, flow=flow) as (agent, app):
        api = app.api
        _, started = await app.post("/sales", {"product": "tea"})
        sale_id = started["sale_id"]
        await until(lambda: api._latest[sale_id].state is SaleState.DISPENSING)
        await until(lambda: clock.monotonic() + 30.0 in clock.pending())
        await clock.advance(29.9)
        for _ in range(20):
            await asyncio.sleep(0)
        assert api._latest[sale_id].state is SaleState.DISPENSING
        await clock.advance(0.1)
        await until(functools.partial(_ended, app, sale_id))
        assert api._latest[sale_id].state is SaleState.REVERSED, api._latest[sale_id].message
        record = agent.journal.get(sale_id)
        assert record is not None
        assert record.state is SaleState.REVERSED
        status, answer = await app.post(f"/sales/{sale_id}/dispensed", {"status": "vended"})
        assert status == 409
        assert "went out unpaid" in answer["message"]


async def test_late_vendeds_for_two_sales_given_back_are_each_told_once(
    tmp_path: Path, sim_settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An attack on e119073/bfafd93 (LateVends): two sales in a row time out and give the money
    back; the app then confirms both, the first after the second gave up too, each twice. Each
    is its own product gone unpaid (named, counted once); neither sale's journal moves."""
    import time

    from kiosk_agent.sales.clock import FakeClock

    clock = FakeClock(wall=time.time())
    async with _confirming_on(clock, tmp_path, sim_settings) as (agent, app):
        api = app.api
        given_back = []
        for product in ("tea", "coffee"):
            _, started = await app.post("/sales", {"product": product})
            sale_id = started["sale_id"]
            await until(lambda: api._latest[sale_id].state is SaleState.DISPENSING)  # noqa: B023
            await until(lambda: clock.monotonic() + 30.0 in clock.pending())
            await clock.advance(30.0)
            await until(functools.partial(_ended, app, sale_id))
            assert api._latest[sale_id].state is SaleState.REVERSED
            given_back.append((sale_id, product))
        with caplog.at_level("WARNING"):
            for sale_id, _ in given_back * 2:
                status, _answer = await app.post(
                    f"/sales/{sale_id}/dispensed", {"status": "vended"})
                assert status == 409
        assert app.api.status()["late_vends"] == 2
        assert app.api.status()["last_late_vend_sale"] == given_back[1][0]
        for sale_id, product in given_back:
            said = [r.getMessage() for r in caplog.records
                    if sale_id in r.getMessage() and "went out unpaid" in r.getMessage()]
            assert len(said) == 1, said
            assert f"{product} went out unpaid" in said[0]
            record = agent.journal.get(sale_id)
            assert record is not None
            assert record.state is SaleState.REVERSED
            # one late.vend heard each, however many times the app said it, after the vend
            # timeout's maybe (the give-back's, 2026-11-30)
            assert [(s.detail["product"], bool(s.detail.get("unsure")))
                    for s in agent.journal.steps(sale_id)
                    if s.step == "late.vend"] == [(product, True), (product, False)]
        problems = [p for p in agent.health.snapshot().problems if "gave up waiting" in p]
        [problem] = problems
        assert problem.startswith("2 product(s)"), problem


async def test_an_unknown_path_or_method_is_checked_first_then_answered_as_aiohttp_does(
    app: App,
) -> None:
    """The checks stand before every route, not only the API's own: an outsider (no token, a
    foreign Host) learns nothing of which paths exist. With them passed, aiohttp's own 404, and
    405 with the methods a known path allows."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    foreign = {**auth, "Host": "evil.example"}
    for method, path in (("GET", "/nope"), ("GET", "/sales"), ("DELETE", "/status"),
                         ("PUT", "/sales/x/cancel"), ("GET", "/../../etc/passwd")):
        async with app.session.request(method, app.base + path) as response:
            assert response.status == 401, (method, path)
            assert (await response.json())["error"] == "unauthorized"
        async with app.session.request(method, app.base + path, headers=foreign) as response:
            assert response.status == 403, (method, path)
    rejected = app.api.rejected
    async with app.session.get(app.base + "/nope", headers=auth) as response:
        assert response.status == 404
    async with app.session.get(f"http://127.0.0.1:{app.api.port}/", headers=auth) as response:
        assert response.status == 404
    async with app.session.get(app.base + "/sales", headers=auth) as response:
        assert response.status == 405
        assert response.headers["Allow"] == "POST"
    async with app.session.delete(app.base + "/sales/x", headers=auth) as response:
        assert response.status == 405
        assert set(response.headers["Allow"].split(",")) == {"GET", "HEAD"}
    assert app.api.rejected == rejected  # past the checks: not counted as refused


async def test_a_request_runs_no_middleware_chain(app: App) -> None:
    """The checks guard each route themselves and the server counts a request around the app:
    aiohttp then builds and runs no middleware chain for the kiosk API (its
    _fix_request_current_app layer and the chain's cache, some 25 Python calls at each of a
    sale's requests and stream wake-ups). The simulator in this process keeps its own."""
    chains: list[int | None] = []  # the port of each request a middleware chain ran for
    checked: list[str] = []

    def seen(frame: types.FrameType, event: str, _arg: object) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code.co_filename.endswith("web_middlewares.py") and code.co_name == "impl":
            chains.append(frame.f_locals["request"].url.port)
        elif code.co_filename.endswith("kiosk_api.py") and code.co_name == "_auth":
            checked.append(frame.f_locals["request"].path)

    sys.setprofile(seen)
    try:
        status, _ = await app.get("/status")
    finally:
        sys.setprofile(None)
    assert status == 200
    assert checked == ["/api/v1/status"]  # the checks ran, once
    assert app.api.port not in chains


async def _tea_left_dispensing(tmp_path: Path, sim_settings: Any, vend_timeout: float) -> str:
    """A first agent (the app confirms its dispenses, ``vend_timeout``) sells the tea and stops
    while the app dispenses it (the drain runs out: the sale parked dispensing). The sale's id."""
    async for first in _app(tmp_path, sim_settings, confirm_dispense=True,
                            vend_timeout=vend_timeout):
        _, started = await first.post("/sales", {"product": "tea"})
        sale_id = started["sale_id"]
        await until(functools.partial(_in_state, first, sale_id, SaleState.DISPENSING))
        await first.api.agent.sales.stop(grace=0.05)  # parked where it stands
    return sale_id


async def test_a_vended_after_a_restart_mid_dispense_reaches_a_person(
    tmp_path: Path, sim_settings: Any
) -> None:
    """The agent stops while the app dispenses the tea (the drain runs out: the sale parked
    dispensing); the next start's recovery listens for the app's result until the vend timeout
    (2 s), hears nothing and gives the money back; then the app says "vended". The new process
    knows the sale only from recovery (SaleRunner.left_dispensing): the app hears why (409,
    gone out unpaid), and a person is told; no money moves."""
    sale_id = await _tea_left_dispensing(tmp_path, sim_settings, vend_timeout=2)
    async for second in _app(tmp_path, sim_settings, confirm_dispense=True, vend_timeout=2):
        agent = second.api.agent
        await asyncio.wait_for(agent.recovery.wait(), 30)
        assert agent.journal.get(sale_id).state is SaleState.REVERSED
        status, answer = await second.post(f"/sales/{sale_id}/dispensed", {"status": "vended"})
        assert status == 409
        assert "went out unpaid" in answer["message"]
        await told_to_a_person(agent, sale_id, "tea")


@pytest.mark.parametrize("said", ["vended", "failed"])
async def test_a_restart_mid_dispense_still_hears_the_apps_result(
    tmp_path: Path, sim_settings: Any, said: str
) -> None:
    """Standing rule 13: the agent restarts (same boot) while the app dispenses the tea. The
    next start's recovery keeps the sale's dispense open to the app's report until the vend
    timeout: a "vended" posted meanwhile is answered 202 and completes the sale (paid, no late
    vend), a "failed" gives the money back. Before, recovery refunded at once and a "vended"
    was a product gone out unpaid."""
    sale_id = await _tea_left_dispensing(tmp_path, sim_settings, vend_timeout=30)
    async for second in _app(tmp_path, sim_settings, confirm_dispense=True, vend_timeout=30):
        agent = second.api.agent
        assert agent.recovery.state == "running"  # listening, the sale still dispensing
        assert agent.journal.get(sale_id).state is SaleState.DISPENSING
        status, _ = await second.post(f"/sales/{sale_id}/dispensed", {"status": said})
        assert status == 202
        await asyncio.wait_for(agent.recovery.wait(), 30)
        final = agent.journal.get(sale_id)
        assert final is not None
        if said == "vended":
            assert (final.state, final.captured_cents) == (SaleState.COMPLETED, 175)
        else:
            assert final.state is SaleState.REVERSED, final.message
        assert not [s for s in agent.journal.steps(sale_id) if s.step == Step.LATE_VEND]


def _in_state(app: App, sale_id: str, state: SaleState) -> bool:
    record = app.api.agent.journal.get(sale_id)
    return record is not None and record.state is state


def test_a_sale_that_names_no_flow_takes_the_configured_one_without_an_enum_lookup() -> None:
    """Most sales name no flow: the configured one is made once with the API, not looked up
    by value at each sale (the enum's __call__ and __new__, and _flow: three Python calls a
    sale); a flow named in the body is still checked, and a wrong one refused."""
    from kiosk_agent.platforms.kiosk_api import BadRequest
    from kiosk_agent.sales.model import Flow
    from tests.helpers import PythonCalls

    config = PLATFORM_SCHEMA({
        "platform": "kiosk_api", "token": TOKEN, "products": {"coffee": "2.50"},
        "flow": "authorize_capture",
    })  # fmt: skip
    api = KioskApi(None, config)
    with PythonCalls() as calls:
        request = api._sale_request({"product": "coffee"})
    assert request.flow is Flow.AUTHORIZE_CAPTURE
    assert request.amount_cents == 250
    assert not {"__call__", "__new__", "_flow"} & set(calls), calls
    assert api._sale_request({"product": "coffee", "flow": "charge_card"}).flow is Flow.CHARGE_CARD
    with pytest.raises(BadRequest, match="expected one of"):
        api._sale_request({"product": "coffee", "flow": "barter"})


async def test_a_sales_charge_result_is_validated_once(app: App) -> None:
    """Before: a charge-card's result was validated as a ``ChargeResult`` twice a sale, once
    when its record came (``parse_interaction``: a succeeded charge's result is checked against
    its kind's model) and again when the sale read it (``charge_card_result``), the same dict
    each time. The sale now takes the model its record's check made."""
    import collections

    from kiosk_agent.service.models.payments import ChargeResult

    validated: collections.Counter[str] = collections.Counter()

    def count(frame: types.FrameType, event: str, _arg: object) -> None:
        code = frame.f_code
        if event == "call" and code.co_name == "model_validate" and frame.f_locals.get(
            "cls"
        ) is ChargeResult:
            validated["ChargeResult"] += 1

    steps = await _a_coffee_sale_profiled_by(count, app)
    assert steps[-1]["state"] == "completed"
    assert steps[-1]["captured_cents"] == 250
    assert validated["ChargeResult"] == 1, validated


async def test_a_sales_own_messages_show_its_price_without_formatting_it_each_time(
    app: App,
) -> None:
    """Before: a charge_card sale formatted its price for its messages three times
    (``format_cents`` and ``cents_to_dollars``, two Python calls each): asking, vending, paid.
    The flow's own two take a price's text made once; the messages read the same."""
    import collections

    calls: collections.Counter[str] = collections.Counter()

    def count(frame: types.FrameType, event: str, _arg: object) -> None:
        if event == "call" and frame.f_code.co_name == "format_cents":
            calls["format_cents"] += 1

    await _a_coffee_sale_profiled_by(count, app)  # the price's text made, as at a first sale
    calls.clear()
    published: list[str] = []
    unlisten = app.api.agent.events.listen(lambda event: published.append(event.message))
    try:
        steps = await _a_coffee_sale_profiled_by(count, app)
    finally:
        unlisten()
    assert steps[-1]["message"] == "paid $2.50 and dispensed"
    assert any(m.startswith("asking for $2.50 on SIM-") for m in published), published
    assert "vending up to $2.50" in published
    assert published[-1] == "paid $2.50 and dispensed"
    assert calls["format_cents"] == 1, calls  # the shared flow's "vending up to"


async def test_a_plain_sales_body_is_checked_without_calls_for_what_it_does_not_hold(
    app: App,
) -> None:
    """Before: a sale's body checks called ``_plain`` on its product, the terminal and its
    e-mail (``text_fault`` on each text), the configured terminal's too (checked against the
    terminals when the config was read, not the app's text), and ``_enrollment`` for a sale that
    names no customer nor plan. The app's own texts are still checked each (the refusals'
    tests), the configured terminal is taken as it is, and a plain sale calls no enrollment."""
    import collections

    calls: collections.Counter[str] = collections.Counter()
    watched = {"_plain", "text_fault", "_enrollment"}

    def count(frame: types.FrameType, event: str, _arg: object) -> None:
        if event == "call" and frame.f_code.co_name in watched:
            calls[frame.f_code.co_name] += 1

    steps = await _a_coffee_sale_profiled_by(count, app)
    assert steps[-1]["state"] == "completed"
    assert steps[-1]["terminal"].startswith("SIM-")  # the configured (or only) one
    assert calls == {"_plain": 1, "text_fault": 1}, calls  # the product's
    status, refused = await app.post("/sales", {"product": "coffee", "terminal": "SIM\x01"})
    assert (status, refused["field"]) == (400, "terminal")
    status, refused = await app.post("/sales", {"product": "coffee", "customer": {}})
    assert (status, refused["field"]) == (400, "customer")
    status, refused = await app.post("/sales", {"product": "coffee", "email": "x" * 300 + "@a"})
    assert (status, refused["field"]) == (400, "email")


async def test_a_sale_given_back_tells_the_app_what_was_given_back(
    tmp_path: Path, sim_settings: Any
) -> None:
    """A charge-card sale whose dispense failed is refunded (voided): its steps carry
    ``reversed_cents`` beside ``captured_cents``, the journal's own figures, on the stream and
    in ``GET /sales/{id}``, so an app can say "$2.50 given back" without reading the state.
    Before, a step said captured 250 and nothing of the give-back."""
    async for app in _app(tmp_path, sim_settings, confirm_dispense=True):
        _, failed = await app.post("/sales", {"product": "coffee"})
        last, _ = await app.confirm(failed["sale_id"], {"status": "failed", "detail": "cup jammed"})
        assert last["state"] == "reversed"
        record = app.api.agent.journal.get(failed["sale_id"])
        assert record is not None
        assert (last["captured_cents"], last["reversed_cents"]) == (
            record.captured_cents, record.reversed_cents) == (250, 250)
        status, latest = await app.get(f"/sales/{failed['sale_id']}")
        assert status == 200
        assert latest["reversed_cents"] == 250
        _, paid = await app.post("/sales", {"amount": 150})
        last, _ = await app.confirm(paid["sale_id"], {"status": "vended"})
        assert (last["state"], last["captured_cents"], last["reversed_cents"]) == (
            "completed", 150, 0)


def _checked_as_before(api: KioskApi, body: dict[str, Any]) -> Any:
    """What ``_sale_request`` answered before the plain sale's cut (5a05e42): every body went
    through ``_enrollment``, the terminal (the body's, else the configured one) and the e-mail
    through ``_plain``. The cut must answer every body the same."""
    from kiosk_agent.platforms.kiosk_api import (
        MAX_EMAIL_CHARS,
        MAX_NAME_CHARS,
        MAX_PRODUCT_CHARS,
        BadRequest,
        _enrollment,
        _plain,
    )
    from kiosk_agent.sales.model import SaleRequest

    try:
        product = body.get("product")
        if product is not None and not isinstance(product, str):
            raise BadRequest("product", "expected a string")
        _plain("product", product, MAX_PRODUCT_CHARS)
        asked = body.get("flow")
        flow = api._default_flow if asked is None else api._flow(asked)
        customer, plan = _enrollment(body, flow)
        amount = api._amount(body, product, api.config["products"], flow, plan)
        terminal = body.get("terminal", api.config.get("terminal"))
        if terminal is not None and not isinstance(terminal, str):
            raise BadRequest("terminal", "expected a device id or terminal name")
        _plain("terminal", terminal, MAX_NAME_CHARS)
        email = body.get("email")
        if email is not None and (not isinstance(email, str) or "@" not in email):
            raise BadRequest("email", "expected an e-mail address")
        _plain("email", email, MAX_EMAIL_CHARS)
    except BadRequest as err:
        return ("refused", err.field, err.message)
    return SaleRequest(
        source=api.name, flow=flow, amount_cents=amount, product=product, terminal=terminal,
        email=email, plan=plan, metadata=customer, max_cents=api.config["max_price"],
        vend_timeout=api.config.get("vend_timeout"),
    )  # fmt: skip


def _checked_now(api: KioskApi, body: dict[str, Any]) -> Any:
    from kiosk_agent.platforms.kiosk_api import BadRequest

    try:
        return api._sale_request(body)
    except BadRequest as err:
        return ("refused", err.field, err.message)


# The fields the plain sale's cut skips checks for, in odd forms: absent, null, empty, wrong
# type, a control character, too long, and right (the any-body tests' scalars and trees too)
_ODD_TEXT = st.sampled_from(["", " ", "SIM-0001", "SIM\x01", "x" * 65, "pat@example.com",
                             "x" * 250 + "@a.b", "pat@\x00", "@", "no-at-sign"])
_ODD = st.none() | st.booleans() | st.integers() | st.floats() | _ODD_TEXT | st.text(max_size=8)
_ODD_VALUES = _ODD | st.lists(_ODD, max_size=2) | st.dictionaries(st.text(max_size=6), _ODD,
                                                                  max_size=2)
_A_CUSTOMER = st.fixed_dictionaries(
    {"name": st.just("Pat Doe"), "account_zip": st.just("12345"), "address1": st.just("1 Main"),
     "city": st.just("Springfield"), "region": st.just("IL"), "phone": st.just("555-123-4567")},
    optional={"country": st.sampled_from(["US", "US", "us", ""]), "address2": st.just("Apt 2")},
)  # fmt: skip
_A_PLAN = st.fixed_dictionaries(
    {"amount": st.sampled_from(["9.99", "9.99", "0", 5]), "rrule": st.just(PLAN["rrule"])},
    optional={"name": _ODD},
)  # fmt: skip


def _mostly(right: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(right, right, right, _ODD_VALUES)


_ODD_FIELDS = {"terminal": _mostly(st.sampled_from(["SIM-0001", "front", None])),
               "email": _mostly(st.just("pat@example.com"))}
_PRODUCTS = st.sampled_from(["coffee"] * 6 + ["tea", "", "caf\x07", None])
_PLAIN_SALES = st.fixed_dictionaries(
        {"product": _PRODUCTS},
        optional={"flow": st.sampled_from(["charge_card", "authorize_capture"]), **_ODD_FIELDS,
                  "amount": st.sampled_from(["2.50", "0.01", 0])},
)
SALE_BODIES = st.one_of(
    KIOSK_BODIES,  # the any-body tests' (any JSON in each field a sale or dispense reads)
    _PLAIN_SALES, _PLAIN_SALES,  # a plain sale, its terminal and e-mail odd or right
    # a plain sale naming a customer or a plan (refused: only an enroll sale saves them)
    st.fixed_dictionaries(
        {"product": _PRODUCTS, "customer": _A_CUSTOMER | _ODD_VALUES},
        optional={"plan": _A_PLAN | _ODD_VALUES, **_ODD_FIELDS},
    ),
    # an enrollment, right or with one field odd
    st.fixed_dictionaries(
        {"flow": st.just("enroll"), "email": _mostly(st.just("pat@example.com")),
         "customer": _mostly(_A_CUSTOMER), "plan": _mostly(_A_PLAN)},
        optional={
                  "terminal": _ODD_FIELDS["terminal"], "product": _PRODUCTS},
    ),
)  # fmt: skip


@settings(max_examples=400, deadline=None, derandomize=True)
@given(body=SALE_BODIES, configured=st.sampled_from([None, "SIM-0001", "front"]),
       default_flow=st.sampled_from(["charge_card", "authorize_capture", "enroll"]))
def test_any_sale_body_is_answered_as_before_the_plain_sales_cut(
    body: dict[str, Any], configured: str | None, default_flow: str
) -> None:
    """The cut skips ``_enrollment`` for a sale naming no customer nor plan, the configured
    terminal's text check, and the e-mail's when none is sent: bodies holding those fields in
    odd forms (null, empty, wrong type, control characters, too long, an enroll sale's right
    ones) get the same SaleRequest, or the same refusal of the same field, as before."""
    config = PLATFORM_SCHEMA({
        "platform": "kiosk_api", "token": TOKEN, "products": {"coffee": "2.50"},
        "flow": default_flow, **({"terminal": configured} if configured else {}),
    })  # fmt: skip
    api = KioskApi(None, config)
    assert _checked_now(api, body) == _checked_as_before(api, body)


async def test_a_sale_the_202_named_is_known_to_the_apps_next_request_and_its_stream(
    app: App,
) -> None:
    # 8a1e44a publishes a sale's opening two loop turns after its commit, once its read-card
    # request is on the wire, and the 202 is written in the commit's turn: the app's very next
    # request (read from the socket a turn later at the soonest, its handler run after that)
    # finds the sale as the journal holds it, never a 404, and its stream starts from that step
    status, started = await app.post("/sales", {"amount": 305, "flow": "authorize_capture"})
    assert status == 202
    sale_id = started["sale_id"]
    status, latest = await app.get(f"/sales/{sale_id}")
    record = app.api.agent.journal.get(sale_id)
    assert record is not None
    assert status == 200
    assert latest["state"] == record.state.value == "reading_card"
    async with app.sale_stream(sale_id) as ws:
        first = await asyncio.wait_for(ws.receive_json(), 10)
        assert first["state"] == "reading_card"
        status, answer = await app.post(f"/sales/{sale_id}/cancel", {})
        assert (status, answer["cancelled"]) == (202, True)
        rest = [message.json() async for message in ws]
    assert rest[-1]["state"] == "cancelled"
    final = app.api.agent.journal.get(sale_id)
    assert final is not None
    assert final.state.value == "cancelled"
