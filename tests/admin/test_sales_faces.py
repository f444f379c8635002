"""Every face counts sales by one rule (kiosk_agent.sales.kinds): after a demo-like run, the
demo's summary, `kiosk-agent sales` (table, JSON, CSV), `GET /api/sales` (records and export),
the status page's recent sales and "Sales today" (health, the page, Home Assistant's
``sales_today``) are compared with the journal.

A card-first machine opens card sessions before anyone chooses: a customer who walks away, and
the session open when the agent stops, end with nothing chosen and nothing kept. The demo said
"not a sale" of them while `sales` listed them as sales (issue 32).
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.app import load_agent
from kiosk_agent.cli.contract import load
from kiosk_agent.cli.demo import journal_tally
from kiosk_agent.moments import day_of
from kiosk_agent.money import format_cents
from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.kinds import no_selection, sessions_text
from kiosk_agent.sales.states import SaleState
from tests.admin.conftest import CONFIG, READ_TOKEN, write_config
from tests.cli.test_contract import run
from tests.helpers import until

# As config/demo.yaml: a coffee machine taking the card first, whose customers often walk away
# from the session they took, and a snack machine choosing first (one product declined).
TRIGGERS = """
triggers:
  - platform: virtual
    name: coffee
    terminal: SIM-0007
    mode: card_first
    max_funds: "5.00"
    flow: authorize_capture
    products: {K1: "1.80", K3: "3.10"}
    gap: [0.05, 0.2]
    fail_rate: 0.2
    walk_away_rate: 0.5
    dispense_time: 0.05
    seed: 11
  - platform: virtual
    name: snacks
    terminal: SIM-0001
    flow: authorize_capture
    products: {A1: "1.50", B2: "1.02"}
    gap: [0.05, 0.2]
    fail_rate: 0
    dispense_time: 0.05
    seed: 7
"""


def _journal(path: Path) -> tuple[list[SaleRecord], set[str]]:
    """The journal's sales, newest first, and those whose machine named a choice."""
    journal = Journal(path)
    journal.open_to_read()
    try:
        records = list(journal)
        chosen = {r.sale_id for r in records
                  if any(s.detail.get("product") for s in journal.steps(r.sale_id))}
        return records, chosen
    finally:
        journal.close()


@pytest.fixture
async def sold(tmp_path: Path, sim_settings: Any) -> AsyncIterator[tuple[Path, Any]]:
    """A demo-like run ended (its last card session closed at the stop), then the agent again
    with no machine: every face read at rest. (config, the quiet agent)."""
    from kiosk_agent.cli.virtual import simulated_machines

    config = write_config(tmp_path, TRIGGERS)
    agent = load_agent(config, sim_settings, systemd=False, machines=simulated_machines)
    await agent.start()

    def enough() -> bool:
        ended = [r for r in agent.journal.query() if r.state.final]
        apart = sum(1 for r in ended if no_selection(r))
        reversed_sales = sum(1 for r in ended if r.state is SaleState.REVERSED and r.product)
        return apart >= 2 and len(ended) - apart >= 4 and reversed_sales >= 1

    try:
        await until(enough, timeout=30)
    finally:
        await agent.stop()
    config.write_text(CONFIG)  # the same journal, no machine: nothing moves while faces are read
    quiet = load_agent(config, sim_settings, systemd=False)
    await quiet.start()
    yield config, quiet
    await quiet.stop()


async def test_every_face_counts_the_sales_the_journal_holds_by_one_rule(
    sold: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    config, agent = sold
    records, chosen = _journal(config.parent / "journal.db")
    assert all(r.state.final for r in records), records
    sales = [r for r in records if not no_selection(r)]
    apart = [r for r in records if no_selection(r)]
    assert apart
    assert sales
    # what the rule calls a session with no selection: a card-first session, nothing chosen,
    # nothing kept; a customer who chose is a sale however the vend went
    assert all(r.source == "virtual:coffee" and not r.product and r.captured_cents == 0
               for r in apart)
    assert all(r.product for r in sales)
    # a customer who chose and got nothing (a failed vend, the hold released) made a sale
    assert chosen == {r.sale_id for r in sales}
    assert any(r.state is SaleState.REVERSED for r in sales), "no failed vend in this run"
    completed = [r for r in sales if r.state is SaleState.COMPLETED]

    # the demo's summary (read from the journal as the demo reads it)
    tally = journal_tally(load(config, check_platforms=False), since=0)
    assert tally.sales == len(sales)
    assert tally.apart == len(apart)
    assert tally.ends[SaleState.COMPLETED] == len(completed)
    assert tally.captured_cents == sum(r.captured_cents for r in sales)
    assert tally.text().endswith(f"; {sessions_text(len(apart))}")

    # `kiosk-agent sales`: the table, its JSON and CSV, and the sessions apart
    async def cli(*extra: str) -> tuple[str, str]:
        capsys.readouterr()
        code, out, err = await run(capsys, ["sales", "-c", str(config), *extra])
        assert code == 0, err
        return out, err

    table, said = await cli("--all")
    assert table.rstrip().splitlines()[-1] == f"{len(sales)} sales"
    assert f"not sales: {sessions_text(len(apart))}" in said
    listed, _ = await cli("--json")
    assert [s["sale_id"] for s in json.loads(listed)] == [r.sale_id for r in sales]
    listed, _ = await cli("--json", "--kind", "no_selection")
    assert [s["sale_id"] for s in json.loads(listed)] == [r.sale_id for r in apart]
    listed, _ = await cli("--format", "csv", "--kind", "all")
    exported_kinds = {row["sale_id"]: row["kind"] for row in csv.DictReader(io.StringIO(listed))}
    assert exported_kinds == {r.sale_id: "no_selection" if no_selection(r) else "sale"
                              for r in records}
    table, _ = await cli("--all", "--kind", "all")
    assert table.rstrip().splitlines()[-1] == (
        f"{len(sales)} sales, {sessions_text(len(apart))}"
    )

    # the admin API: the records, the count apart, the export; the page's recent sales
    admin = next(c for c in agent.components if type(c).__name__ == "AdminServer")
    headers = {"Authorization": f"Bearer {READ_TOKEN}"}
    async with aiohttp.ClientSession(base_url=admin.url, headers=headers) as http:
        async with http.get("/api/sales", params={"limit": "1000"}) as answer:
            body = await answer.json()
        assert [s["sale_id"] for s in body["sales"]] == [r.sale_id for r in sales]
        assert body["no_selection"] == len(apart)
        async with http.get("/api/sales", params={"kind": "no_selection"}) as answer:
            body = await answer.json()
        assert [s["sale_id"] for s in body["sales"]] == [r.sale_id for r in apart]
        assert {s["kind"] for s in body["sales"]} == {"no_selection"}
        async with http.get("/api/sales", params={"kind": "all", "limit": "1000"}) as answer:
            body = await answer.json()
        assert {s["sale_id"] for s in body["sales"] if s["kind"] == "sale"} == {
            r.sale_id for r in sales
        }
        async with http.get("/api/sales", params={"format": "csv"}) as answer:
            exported = list(csv.DictReader(io.StringIO(await answer.text())))
        assert [row["order_id"] for row in exported] == [r.order_id for r in sales]
        async with http.get("/api/sales", params={"kind": "some"}) as answer:
            assert answer.status == 400
            assert "kind must be one of sale, no_selection, all" in (await answer.text())
        async with http.get("/api/page") as answer:
            page = await answer.json()
        shown = [s["sale_id"] for s in page["recent"]]
        assert shown == [r.sale_id for r in sales][: len(shown)]
        sessions_today = sum(1 for r in apart if day_of(r.created_at) == day_of(time.time()))
        assert page["no_selection_today"] == (
            f"not sales: {sessions_text(sessions_today)}" if sessions_today else ""
        )
        # "Sales today": completed sales created today (the page, health, Home Assistant)
        async with http.get("/api/health") as answer:
            health = await answer.json()
    today = day_of(agent.clock.time())
    assert health["sales"]["today_count"] == sum(
        1 for r in completed if day_of(r.created_at) == today
    )
    assert page["health"]["sales"]["today_count"] == health["sales"]["today_count"]
    assert page["today_amount"] == format_cents(sum(
        r.captured_cents for r in completed if day_of(r.created_at) == today
    ))
