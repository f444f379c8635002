"""Hosted payment pages: create, edit, and paying on the real page."""

from __future__ import annotations

from typing import Any

import pytest

from .sim_api import Api

H = "/api/v1/hpp"


async def create_page(api: Api, **fields: Any) -> str:
    status, body = await api.post(H, {"name": "Donate", "cc_mid": "999000000001", **fields})
    assert status == 200, body
    return str(body["url"])


async def test_the_url_serves_a_real_page(api: Api) -> None:
    url = await create_page(api, amount="5.00", name_on_account="Ada <b>")
    async with api.http.get(url) as resp:
        assert resp.status == 200
        assert resp.content_type == "text/html"
        page = await resp.text()
    assert "<form" in page
    assert "Ada &lt;b&gt;" in page
    assert 'value="5.00"' in page


async def test_paying_on_the_page_charges_and_reaches_the_ledger(api: Api, sim: Any) -> None:
    url = await create_page(api, amount="7.50", lock_amount=True, disable_after_payment=True)
    form = {"card_number": "4111 1111 1111 1111", "expiration": "12/30", "amount": "1.00"}
    async with api.http.post(f"{url}/pay", data=form) as resp:
        assert resp.status == 200
        receipt = await resp.text()
    assert 'data-result="A"' in receipt
    assert "$7.50" in receipt  # the locked amount, not the one typed
    rows, _ = sim.ctx.ledger.query({"amount": 7.5, "card_number": "XXXXXXXXXXXX1111"}, 5, 0)
    assert rows
    assert "4111111111111111" not in str(rows)
    async with api.http.get(url) as resp:
        assert "no longer available" in await resp.text()


async def test_edit_keeps_fields_not_sent_and_refuses_cc_mid(api: Api) -> None:
    url = await create_page(api, amount="5.00", min_amount=None)
    page_id = url.rsplit("/", 1)[1]
    status, page = await api.put(f"{H}/{page_id}", {"name": "Tip jar"})
    assert status == 200
    assert (page["name"], page["amount"], page["url"]) == ("Tip jar", "5.00", url)
    status, body = await api.put(f"{H}/{page_id}", {"cc_mid": "999000000002"})
    assert (status, body["error"]) == (400, "cc_mid_immutable")
    assert (await api.put(f"{H}/unknown", {"name": "x"}))[0] == 404


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"cc_mid": None}, "cc_mid"),
        ({"lock_amount": True, "amount": "5.00", "min_amount": "1.00"}, "lock_amount"),
        ({"min_amount": "9.00", "max_amount": "2.00"}, "min_amount"),
        ({"amount": "five"}, "amount"),
        ({"hpp_options": [{"name": "shoe_size"}]}, "hpp_options[0].name"),
        ({"hpp_options": "all"}, "hpp_options"),
        ({"cc_mid": "123"}, "cc_mid"),
        ({"colour": "red"}, "colour"),
    ],
)
async def test_bad_pages_are_400(api: Api, fields: dict[str, Any], words: str) -> None:
    status, body = await api.post(H, {"name": "P", "cc_mid": "999000000001", **fields})
    assert status == 400
    assert words in body["error_description"]


async def test_options_are_kept(api: Api) -> None:
    url = await create_page(
        api, hpp_options=[{"name": "invoice_id", "value": "INV-9", "is_readonly": True}]
    )
    async with api.http.get(url) as resp:
        assert 'value="INV-9" readonly' in await resp.text()


async def test_a_bad_form_gets_an_html_answer(api: Api) -> None:
    url = await create_page(api, min_amount="2.00", max_amount="9.00")
    form = {"card_number": "4111111111111111", "expiration": "1230", "amount": "10.00"}
    async with api.http.post(f"{url}/pay", data=form) as resp:
        assert (resp.status, resp.content_type) == (400, "text/html")
        assert "outside" in await resp.text()
    async with api.http.post(
        f"{url}/pay", data={**form, "card_number": "12", "amount": "3"}
    ) as resp:
        assert resp.status == 400
        assert "card number" in await resp.text()
