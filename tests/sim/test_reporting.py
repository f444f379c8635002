"""Reporting collections over real HTTP: ORDS pages, q filters, dollars, live transactions."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.service.models.reporting import TransactionFilter
from kiosk_agent.sim.server import SimServer

from .sim_api import Api
from .test_oauth import oauth_api

PREFIX = "/ords/sprint/api/3p/v1"


@pytest.fixture
async def reporting(sim: SimServer, http: aiohttp.ClientSession) -> Api:
    return await oauth_api(http, sim)


async def page(reporting: Api, collection: str, **params: Any) -> dict[str, Any]:
    query = {k: (json.dumps(v) if k == "q" else str(v)) for k, v in params.items()}
    status, body = await reporting.get(f"{PREFIX}/{collection}", params=query)
    assert status == 200, body
    return body


async def all_items(reporting: Api, collection: str, **params: Any) -> list[dict[str, Any]]:
    """Every item, following the ``next`` links as a client would."""
    body = await page(reporting, collection, **params)
    items = list(body["items"])
    while body["hasMore"]:
        (link,) = [link["href"] for link in body["links"] if link["rel"] == "next"]
        async with reporting.http.get(link, headers=reporting.headers()) as resp:
            body = await resp.json()
        items.extend(body["items"])
    return items


async def test_transactions_come_in_ords_pages(reporting: Api) -> None:
    first = await page(reporting, "transactions")

    assert (first["limit"], first["offset"], first["count"], first["hasMore"]) == (25, 0, 25, True)
    assert [link["rel"] for link in first["links"]] == ["self", "next"]
    everything = await all_items(reporting, "transactions", limit=60)
    assert len(everything) == 200  # the sim fixture's data set
    assert len({row["trans_id"] for row in everything}) == 200
    last = await page(reporting, "transactions", limit=1000, offset=190)
    assert (last["count"], last["hasMore"]) == (10, False)
    assert [link["rel"] for link in last["links"]] == ["self"]


async def test_limit_and_offset_are_checked(reporting: Api) -> None:
    for params in ({"limit": "1001"}, {"limit": "0"}, {"offset": "-1"}, {"limit": "ten"}):
        status, body = await reporting.get(f"{PREFIX}/transactions", params=params)
        assert status == 400, params
        assert next(iter(params)) in body["error_description"]


async def test_q_filters_combine_with_and(reporting: Api) -> None:
    everything = await all_items(reporting, "transactions", limit=1000)
    settled_on_second = [
        row for row in everything if row["mid"] == "999000000002" and row["trans_status_id"] == 3
    ]

    found = await all_items(
        reporting, "transactions", limit=1000, q={"mid": "999000000002", "trans_status_id": 3}
    )

    assert found == settled_on_second
    assert found
    one = found[0]
    by_funding = await all_items(
        reporting, "transactions", q={"funding_master_id": one["funding_master_id"]}
    )
    assert one in by_funding
    assert {row["funding_master_id"] for row in by_funding} == {one["funding_master_id"]}


async def test_amounts_are_dollars_as_exact_json_numbers(reporting: Api) -> None:
    async with reporting.http.get(
        reporting.base_url + f"{PREFIX}/transactions",
        params={"q": '{"trans_status_id": 3}'},
        headers=reporting.headers(),
    ) as resp:
        exact = json.loads(await resp.text(), parse_float=Decimal)
    row = exact["items"][0]
    assert isinstance(row["amount"], Decimal)  # a JSON number, not a string
    assert row["amount"] == row["amount"].quantize(Decimal("0.01"))

    by_amount = await all_items(
        reporting, "transactions", q={"mid": row["mid"], "amount": float(row["amount"])}
    )
    assert row["trans_id"] in {found["trans_id"] for found in by_amount}
    assert {Decimal(str(found["amount"])) for found in by_amount} == {row["amount"]}


@pytest.mark.parametrize(
    ("q", "named"),
    [
        ('{"colour": "red"}', "'colour'"),
        ("{mid: 1}", "not JSON"),
        ('["mid"]', "JSON object"),
        ('{"mid": ["999000000001"]}', "'mid'"),
        ('{"amount": "twelve"}', "amount"),
    ],
)
async def test_bad_q_is_a_400_naming_the_problem(reporting: Api, q: str, named: str) -> None:
    status, body = await reporting.get(f"{PREFIX}/transactions", params={"q": q})
    assert status == 400
    assert body["error"] == "invalid_query"
    assert named in body["error_description"]


async def test_deposits_chargebacks_adjustments_are_collections(reporting: Api) -> None:
    deposits = await all_items(reporting, "deposits", limit=1000)
    chargebacks = await all_items(reporting, "chargebacks", limit=1000)
    adjustments = await all_items(reporting, "adjustments", limit=1000)

    assert deposits
    assert adjustments
    deposit = deposits[0]
    in_batch = await all_items(reporting, "transactions", q={"batch_id": deposit["batch_id"]})
    assert len(in_batch) == deposit["transaction_count"]
    net = sum(
        (-1 if row["trans_status_id"] == 5 else 1) * Decimal(str(row["amount"])) for row in in_batch
    )
    assert net == Decimal(str(deposit["amount"]))
    for chargeback in chargebacks:
        assert chargeback["status"] in ("OPEN", "WON", "LOST")
        assert "*" in chargeback["card_number"]
    fees = await all_items(reporting, "adjustments", q={"category": "monthly_fee"})
    assert fees
    assert all(Decimal(str(fee["amount"])) == Decimal("-9.95") for fee in fees)
    status, body = await reporting.get(f"{PREFIX}/chargebacks", params={"q": '{"trans": 1}'})
    assert (status, body["error"]) == (400, "invalid_query")


async def test_live_charges_settlement_and_refunds_are_reported(
    sim: SimServer, reporting: Api, api: Api
) -> None:
    charge = await api.charge(1234, order_id="LIVE-ORDER-1")
    rows = await all_items(reporting, "transactions", q={"order_id": "LIVE-ORDER-1"})
    assert [(r["trans_id"], r["trans_status_id"]) for r in rows] == [(charge["trans_id"], 2)]
    assert Decimal(str(rows[0]["amount"])) == Decimal("12.34")

    status, settled = await api.post("/sim/settle")
    assert status == 200
    assert settled["settled"] >= 1
    (sale,) = await all_items(reporting, "transactions", q={"trans_id": charge["trans_id"]})
    assert sale["trans_status_id"] == 3
    deposits = await all_items(reporting, "deposits", q={"batch_id": sale["batch_id"]})
    assert len(deposits) == 1
    assert deposits[0]["funding_master_id"] == sale["funding_master_id"]

    status, refund = await api.post(
        "/api/v1/void-or-refund", {"trans_id": charge["trans_id"], "mid": sim.ready_info()["mid"]}
    )
    assert status == 200, refund
    refunds = await all_items(
        reporting, "transactions", q={"related_trans_id": charge["trans_id"]}
    )
    assert [(r["trans_status_id"], r["order_id"]) for r in refunds] == [(5, "LIVE-ORDER-1")]


async def test_data_set_survives_a_restart_on_its_data_dir(
    sim_factory, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    first = await sim_factory(data_dir=tmp_path, transactions=80)
    before = await all_items(await oauth_api(http, first), "transactions", limit=1000)
    await first.stop()

    second = await sim_factory(data_dir=tmp_path, transactions=80)
    after = await all_items(await oauth_api(http, second), "transactions", limit=1000)

    assert after == before
    assert len(after) == 80


async def test_the_service_client_reads_every_collection(service, api: Api) -> None:
    charge = await api.charge(250, order_id="CLIENT-ORDER-1")
    (found,) = [t async for t in service.reporting.transactions(
        TransactionFilter(order_id="CLIENT-ORDER-1")
    )]  # fmt: skip
    assert (found.trans_id, found.amount_cents) == (charge["trans_id"], 250)
    everything = [t async for t in service.reporting.transactions(page_size=70)]
    assert len(everything) == 201  # the data set and the charge
    assert [d async for d in service.reporting.deposits()]
    assert [a async for a in service.reporting.adjustments()]
