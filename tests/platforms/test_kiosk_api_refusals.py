"""What the kiosk app's API refuses, one request a case, on one agent and simulator for the
module (``refusing_app``): started for each case, they were some 40 starts of the agent and the
simulator, a tenth of a second of CPU each. Each case proves it left the agent as it found it
(nothing journaled), and the module holds nothing else: its event loop never stands still with
an agent's timers in it while other tests run. A test that starts a sale is in test_kiosk_api.py,
on an agent of its own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.sales import runner
from kiosk_agent.sim.context import SimOptions
from kiosk_agent.sim.server import SimServer

from .test_kiosk_api import CUSTOMER, PLAN, App, _app

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def refusing_app(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[App]:
    sim = SimServer(SimOptions(port=0, time_scale=50, transactions=200, seed=1))  # `sim`'s own
    await sim.start()
    try:
        settings = settings_from_ready(sim.ready_info())
        async for app in _app(tmp_path_factory.mktemp("refusing"), settings):
            yield app
    finally:
        await sim.stop()


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"amount": 2.5}, "amount", 'expected an amount like "2.50"'),
        ({"amount": "abc"}, "amount", "expected an amount like"),
        ({"product": "coffee", "amount": "3.00"}, "amount", "coffee costs 2.50, not 3.00"),
        ({}, "amount", "required"),
        ({"amount": "1.00", "flow": "barter"}, "flow", "expected one of charge_card"),
        ({"amount": "1.00", "email": "nope"}, "email", "expected an e-mail address"),
        ({"amount": "1.00", "terminal": "SIM-9999"}, "terminal", "unknown terminal"),
        ({"product": 7}, "product", "expected a string"),
        ([1, 2], "body", "expected a JSON object"),
    ],
)
async def test_bad_bodies_name_the_field(
    refusing_app: App, body: Any, field: str, message: str
) -> None:
    status, answer = await refusing_app.post("/sales", body)
    assert status == 400
    assert answer["field"] == field
    assert message in answer["message"]
    assert refusing_app.api.agent.journal.count() == 0


@pytest.mark.parametrize(
    ("amount", "error"),
    [
        (10**20, "at most"),
        ("1e2", "expected an amount"),
        ("1_0.00", "expected an amount"),
        ("\u0662.\u0665\u0660", "expected an amount"),
        ("150.00", "above this machine's max_price $100.00"),
        (15_000, "above this machine's max_price $100.00"),
    ],
)
async def test_hostile_amounts_are_refused_naming_the_field(
    refusing_app: App, amount: Any, error: str
) -> None:
    status, body = await refusing_app.post("/sales", {"amount": amount})
    assert status == 400
    assert body["field"] == "amount"
    assert error in body["message"]
    assert refusing_app.api.agent.journal.count() == 0


@pytest.mark.parametrize(
    ("body", "field", "error"),
    [
        ({"amount": "1.00", "product": "W" * 101}, "product", "101 characters; at most 100"),
        ({"amount": "1.00", "product": "tea\x1b[2J"}, "product", "control character (U+001B)"),
        ({"amount": "1.00", "product": "\u202eaet"}, "product", "control character (U+202E)"),
        ({"amount": "1.00", "product": "tea\x00"}, "product", "control character (U+0000)"),
        ({"amount": "1.00", "terminal": "SIM\n0001"}, "terminal", "control character (U+000A)"),
        ({"amount": "1.00", "terminal": "S" * 65}, "terminal", "at most 64"),
        ({"amount": "1.00", "email": "a@b\u2066c"}, "email", "control character (U+2066)"),
    ],
)
async def test_names_people_read_later_must_be_plain_and_short(
    refusing_app: App, body: dict[str, Any], field: str, error: str
) -> None:
    """A product name goes to the journal, the status page, the CLI's tables and receipts: a
    terminal escape or a right-to-left override there would show something else."""
    status, answer = await refusing_app.post("/sales", body)
    assert (status, answer["field"]) == (400, field)
    assert error in answer["message"]
    assert refusing_app.api.agent.journal.count() == 0


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"customer": None}, "customer", "required to save a card"),
        ({"customer": {**CUSTOMER, "account_zip": ""}}, "customer.account_zip", "required"),
        ({"customer": {k: v for k, v in CUSTOMER.items() if k != "phone"}}, "customer.phone",
         "required"),
        ({"customer": {**CUSTOMER, "account_zip": "1" * 20}}, "customer.account_zip",
         "at most 10"),
        ({"customer": {**CUSTOMER, "account_zip": "12345!"}}, "customer.account_zip",
         "a ZIP or postal code"),
        ({"customer": {**CUSTOMER, "country": "USA"}}, "customer.country", "two-letter"),
        ({"customer": {**CUSTOMER, "city": 7}}, "customer.city", "expected text"),
        ({"customer": {**CUSTOMER, "name": "Pat\x1b[2J"}}, "customer.name", "U+001B"),
        ({"customer": {**CUSTOMER, "nickname": "x"}}, "customer.nickname", "unknown"),
        ({"customer": "Pat"}, "customer", "expected an object"),
        ({"email": None}, "email", "required to save a card"),
        ({"plan": {**PLAN, "amount": "0"}}, "plan.amount", "above zero"),
        ({"plan": {**PLAN, "rrule": "FREQ=MONTHLY"}}, "plan.rrule", "RRULE"),
        ({"flow": "charge_card"}, "customer", "only an enroll sale"),
        ({"amount": None}, "amount", "required for an enrollment without a plan"),
        ({"amount": "0"}, "amount", "above zero"),
    ],
)
async def test_an_enrollment_without_what_the_vault_needs_is_refused_naming_the_field(
    refusing_app: App, change: dict[str, Any], field: str, message: str
) -> None:
    body = {"flow": "enroll", "amount": "1.00", "email": "pat@example.com", "customer": CUSTOMER,
            **change}
    status, answer = await refusing_app.post(
        "/sales", {k: v for k, v in body.items() if v is not None})
    assert status == 400
    assert answer["field"] == field
    assert message in answer["message"]
    assert refusing_app.api.agent.journal.count() == 0  # refused before anything is journaled


async def test_an_unexpected_error_in_a_start_is_not_called_the_apps_amount(
    refusing_app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ValueError out of the start that is not about the amount (here: making the sale's
    ids, as a unit's id the agent cannot write would). Before, every ValueError was answered
    400 "amount": the app told its customer the price was wrong. It is the site's counted,
    logged 503 "unavailable", naming no field; nothing is journaled, and the API goes on."""

    def ids_fail(unit: object) -> tuple[str, str]:
        raise ValueError("a unit id that is not hexadecimal")

    site = refusing_app.api._site
    unexpected = site.unexpected
    monkeypatch.setattr(runner, "new_ids", ids_fail)
    status, answer = await refusing_app.post("/sales", {"amount": "1.00"})
    assert status == 503
    assert (answer["error"], answer["field"]) == ("unavailable", None)
    assert "amount" not in answer["message"]
    assert site.unexpected == unexpected + 1  # counted, shown in health
    assert refusing_app.api.status()["unexpected"] == unexpected + 1
    assert refusing_app.api.agent.journal.count() == 0
    monkeypatch.undo()
    status, answer = await refusing_app.post("/sales", {"amount": "0.00"})
    assert (status, answer["field"]) == (400, "amount")  # the API goes on, and names it
