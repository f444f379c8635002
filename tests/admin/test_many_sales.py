"""A journal of many sales (10,000 and more, written as the flows write them), read on every face:
`GET /api/sales` answered its newest 100 and said nothing of the rest, so a client could not
tell a page from the whole; the CLI said "N more (older)". Each figure is compared with the
journal's own rows, read with SQL."""

from __future__ import annotations

import csv
import io
from typing import Any

import aiohttp
import pytest

from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.states import SaleState, Step
from tests.admin.test_sales_export import _cli
from tests.admin.test_server import _sell

SALES = 10_050


def _many_sales(journal: Journal, count: int) -> None:
    """``count`` charge-card sales a few seconds apart, written as the flow writes them (one
    commit for all), ending every way a charge-card sale ends: paid, declined, given back after
    a failed vend, for a person."""
    clock, kept = FakeClock(wall=1_790_000_000.0), journal.clock
    journal.clock = clock
    try:
        with journal.batch():
            for n in range(count):
                if n % 3:  # every third shares its time with the one before: pages split no tie
                    clock.step_wall(7)
                sale = journal.create(SaleRecord(
                    sale_id=f"{n:08x}{'f' * 24}", order_id=f"KAMANY{n:06d}", source="test",
                    flow="charge_card", terminal="SIM-0007", amount_cents=100 + n % 900,
                    state=SaleState.STARTED, product="A1",
                ))
                sale = journal.record(sale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
                if n % 10 == 1:
                    journal.record(sale, Step.CHARGE_CARD_DECLINED, SaleState.DECLINED)
                    continue
                if n % 97 == 5:
                    journal.record(sale, Step.CHARGE_CARD_UNKNOWN, SaleState.ATTENTION)
                    continue
                paid = sale.amount_cents
                sale = journal.record(sale, Step.DISPENSE_REQUEST, SaleState.DISPENSING,
                                      trans_id=f"T{n}", authorized_cents=paid,
                                      captured_cents=paid)
                if n % 10 == 3:  # the vend failed: refunded
                    sale = journal.record(sale, Step.REVERSE_REQUEST, SaleState.REVERSING)
                    journal.record(sale, Step.REVERSE_DONE, SaleState.REVERSED,
                                   reversed_cents=paid)
                    continue
                journal.record(sale, Step.COMPLETED, SaleState.COMPLETED)
    finally:
        journal.clock = kept


@pytest.mark.slow(seconds=8)
async def test_the_api_says_how_many_more_sales_than_its_page_and_every_face_adds_up(
    agent: Any, admin_server: Any, read_headers: dict[str, str], capsys: pytest.CaptureFixture[str],
    tmp_path: Any,
) -> None:
    _many_sales(agent.journal, SALES)
    db = agent.journal.db
    total, kept_cents = db.execute(
        "SELECT COUNT(*), SUM(captured_cents - reversed_cents) FROM sales"
    ).fetchone()
    by_state = dict(db.execute("SELECT state, COUNT(*) FROM sales GROUP BY state").fetchall())
    assert total == SALES
    assert set(by_state) == {"completed", "declined", "reversed", "attention"}

    async with aiohttp.ClientSession(base_url=admin_server.url, headers=read_headers) as http:
        async def records(**params: str) -> dict[str, Any]:
            async with http.get("/api/sales", params=params) as answer:
                assert answer.status == 200, await answer.text()
                body: dict[str, Any] = await answer.json()
                return body

        page = await records()
        assert (len(page["sales"]), page["more"]) == (100, total - 100)
        page = await records(state="reversed", limit="10000")
        assert (len(page["sales"]), page["more"]) == (by_state["reversed"], 0)
        page = await records(state="attention", limit=str(by_state["attention"]))
        assert (len(page["sales"]), page["more"]) == (by_state["attention"], 0)
        async with http.get("/api/sales", params={"format": "csv"}) as answer:
            exported = list(csv.DictReader(io.StringIO(await answer.text())))

    # the export: every sale, its money adding up to what the journal kept
    assert len(exported) == total
    assert sum(_cents(r["captured"]) - _cents(r["reversed"]) for r in exported) == kept_cents
    refunded = [r for r in exported if r["state"] == "reversed"]
    assert all(r["captured"] == r["reversed"] == r["amount"] for r in refunded)  # money back

    config = str(tmp_path / "config.yaml")
    code, _, err = await _cli(capsys, "sales", "-c", config)
    assert code == 0
    assert err.strip() == f"{total - 25:,} more (older); use --limit N or --all"


def _cents(dollars: str) -> int:
    whole, cents = dollars.split(".")
    return int(whole) * 100 + int(cents)


@pytest.mark.slow(seconds=3)
async def test_the_api_pages_through_every_sale_by_a_cursor_none_lost_none_twice(
    agent: Any, admin_server: Any, read_headers: dict[str, str]
) -> None:
    """`more` said there were more; `until` could not fetch them exactly (the records' times
    are to the second; sales share a second). `before` (a sale id: the page's `next`) pages
    through the window in the journal's order, a sale made meanwhile shifting nothing."""
    _many_sales(agent.journal, 2_345)
    db = agent.journal.db
    every = [row[0] for row in db.execute(
        "SELECT sale_id FROM sales ORDER BY created_at DESC, rowid DESC")]
    refunded = [row[0] for row in db.execute(
        "SELECT sale_id FROM sales WHERE state = 'reversed' ORDER BY created_at DESC, rowid DESC")]
    async with aiohttp.ClientSession(base_url=admin_server.url, headers=read_headers) as http:
        async def walk(**params: str) -> list[str]:
            seen: list[str] = []
            cursor: dict[str, str] = {}
            while True:
                async with http.get("/api/sales", params={**params, **cursor}) as answer:
                    assert answer.status == 200, await answer.text()
                    page = await answer.json()
                seen += [s["sale_id"] for s in page["sales"]]
                if not seen:
                    return seen
                assert page["more"] == len(every if not params.get("state") else refunded) - len(
                    seen)
                if page["next"] is None:
                    return seen
                assert page["next"] == seen[-1]
                cursor = {"before": page["next"]}
                if len(seen) == 1000:  # a customer meanwhile: newer, on no page of this walk
                    await _sell(agent, 250)

        assert await walk(limit="500") == every
        assert await walk(limit="100", state="reversed") == refunded
        # an export from a cursor on: the sales after it, none of the page before
        async with http.get("/api/sales", params={"format": "csv", "before": every[99]}) as answer:
            exported = [row["sale_id"] for row in csv.DictReader(io.StringIO(await answer.text()))]
        assert exported == every[100:]
        async with http.get("/api/sales", params={"before": "nosuchsale"}) as answer:
            assert answer.status == 400
            assert (await answer.json())["detail"] == (
                "before: no sale 'nosuchsale' in the journal (give a sale_id: a page's next)")
