"""The status page shows the unit as its journal holds it (``unit_ids``): its id, the machine
its journal was made on and, while the journal is found on another machine, a banner saying no
customer is taken until a person runs ``kiosk-agent unit adopt`` (with the command)."""

import json
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, expect

from kiosk_agent.app import load_agent
from kiosk_agent.sales import unit
from tests.admin import browser_session
from tests.admin.conftest import ADMIN_TOKEN, write_config
from tests.admin.test_page_browser import DESKTOP, WAIT_MS, _open
from tests.helpers import until
from tests.sales.test_unit import a_machine

# On the worker's one loop, sharing its Playwright driver (tests/admin/browser_session.py).
pytestmark = pytest.mark.asyncio(loop_scope="session")
browser = browser_session.browser
sim_factory, sim = browser_session.sim_factory, browser_session.sim


def _journal_unit(directory: Path) -> list[unit.UnitRow]:
    """The journal's own record of the unit, read apart from the agent."""
    db = sqlite3.connect(directory / "journal.db")
    try:
        return unit.rows(db)
    finally:
        db.close()


def _leave_open(directory: Path, unit_id: str) -> Any:
    """An open sale of unit ``unit_id`` (money held, capture not made), as its agent left it."""
    from kiosk_agent.sales.journal import Journal, SaleRecord
    from kiosk_agent.sales.states import SaleState
    from tests.helpers import walk_to

    key = json.loads((directory / "journal.db.unit").read_text())["key"]
    journal = Journal(directory / "journal.db")
    journal.open()
    try:
        record = journal.create(SaleRecord(
            sale_id="0c1a0e5a1e", order_id=unit.make_order_id(unit_id, key, "0c1a0e5a1e00beef"),
            source="mdb:front", flow="authorize_capture", terminal="SIM-0001",
            amount_cents=250, state=SaleState.STARTED,
        ))  # fmt: skip
        return walk_to(journal, record, SaleState.CAPTURING, authorized_cents=250,
                       vended_cents=250, trans_id="700000001234")
    finally:
        journal.close()


def _admin(agent: Any) -> Any:
    return next(c for c in agent.components if type(c).__name__ == "AdminServer")


async def _page(agent: Any) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with (
        aiohttp.ClientSession(base_url=_admin(agent).url) as session,
        session.get("/api/page", headers=headers) as r,
    ):
        assert r.status == 200
        return dict(await r.json())


async def _start(directory: Path, sim_settings: Any) -> Any:
    agent = load_agent(directory / "config.yaml", sim_settings, systemd=False)
    await agent.start()
    return agent


@pytest.mark.slow(seconds=10)
async def test_the_page_shows_the_unit_its_journal_holds_and_a_clone_until_adopted(
    tmp_path: Path, sim_settings: Any, monkeypatch: pytest.MonkeyPatch, browser: Browser
) -> None:
    from kiosk_agent.cli import build_parser

    config = write_config(tmp_path)
    monkeypatch.setenv("KIOSK_MACHINE_ROOT", str(
        a_machine(tmp_path / "pi1", "e" * 32, serial="10000000000000a1")))
    agent = await _start(tmp_path, sim_settings)
    try:
        page = await _page(agent)
    finally:
        await agent.stop()
    [made] = _journal_unit(tmp_path)
    theirs = _leave_open(tmp_path, made.unit_id)  # the original's charge, held, not captured
    assert page["unit"]["id"] == made.unit_id
    assert page["unit"]["machine"] == made.machine.describe()
    assert page["unit"]["made_at"] == pytest.approx(made.made_at)
    assert page["unit"]["confirmed"] is True
    assert page["unit"]["banner"] == page["unit"]["command"] == ""

    # the same card in another board: the same machine-id, another serial
    monkeypatch.setenv("KIOSK_MACHINE_ROOT", str(
        a_machine(tmp_path / "pi2", "e" * 32, serial="10000000000000b2")))
    clone = await _start(tmp_path, sim_settings)
    try:
        page = await _page(clone)
        shown = page["unit"]
        assert shown["id"] == made.unit_id  # still the journal's one id
        assert shown["machine"] == made.machine.describe()
        assert shown["confirmed"] is False
        assert shown["command"] == f"kiosk-agent unit adopt -c {config}"
        assert shown["banner"].startswith(
            f"This unit takes no customer until a person runs {shown['command']} here")
        assert "10000000000000a1, here serial:10000000000000b2" in shown["made_elsewhere"]
        key = json.loads((tmp_path / "journal.db.unit").read_text())["key"]
        assert key not in json.dumps(page)

        tab, seen = await _open(browser, _admin(clone).url, DESKTOP, ADMIN_TOKEN)
        banner = tab.locator("#unit-banner")
        await expect(banner).to_be_visible(timeout=WAIT_MS)
        await expect(banner).to_contain_text("takes no customer", timeout=WAIT_MS)
        await expect(tab.locator("#unit-command")).to_have_text(shown["command"])
        await expect(tab.locator('[data-unit="id"]')).to_have_text(made.unit_id)
        await expect(tab.locator('[data-unit="confirmed"]')).to_contain_text("NO")

        parser = build_parser("unit")
        args = parser.parse_args(["unit", "adopt", "-c", str(config)])
        assert await args.handler(args) == 0
        await until(lambda: clone.unit.confirmed, timeout=5)
        former, adopted = _journal_unit(tmp_path)
        assert former == made
        # the page follows the journal without a reload: the new id, no banner
        await expect(tab.locator('[data-unit="id"]')).to_have_text(adopted.unit_id,
                                                                    timeout=WAIT_MS)
        await expect(banner).to_be_hidden(timeout=WAIT_MS)
        await expect(tab.locator('[data-unit="machine"]')).to_have_text(
            adopted.machine.describe())
        assert seen.errors == []
        page = await _page(clone)
        assert page["unit"]["id"] == adopted.unit_id
        assert page["unit"]["confirmed"] is True
        assert page["unit"]["banner"] == ""

        # the original's open sale: on the page's "needs a person" list with why, not as open
        why = (f"made by unit {made.unit_id} before this journal was adopted: its money is "
               "that unit's; the agent will not move it")
        [listed] = page["attention"]
        assert (listed["sale_id"], listed["state"], listed["why"]) == (
            theirs.sale_id, theirs.state.value, why)
        assert theirs.sale_id not in {s["sale_id"] for s in page["open"]}
        assert any("1 open sale(s) of another unit id" in p for p in page["health"]["problems"])
        await tab.reload()
        await expect(tab.locator(f'#attention [data-sale="{theirs.sale_id}"] [data-why]')
                     ).to_have_text(why, timeout=WAIT_MS)
        await clone.attention.sweep()  # the sweeper leaves it and its money alone
        assert clone.journal.get(theirs.sale_id) == theirs
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with (
            aiohttp.ClientSession(base_url=_admin(clone).url) as session,
            session.post(f"/api/sales/{theirs.sale_id}/resolve", headers=headers,
                         json={"as": "reversed", "why": "the original unit voided it"}) as r,
        ):
            assert r.status == 200, await r.text()
        resolved = clone.journal.get(theirs.sale_id)
        assert resolved is not None
        assert resolved.state.value == "reversed"
        steps = clone.journal.steps(theirs.sale_id)
        assert [s.step for s in steps[-2:]] == ["attention.resolved"] * 2  # words, no money
        await until(lambda: not clone.health.snapshot().unit.not_ours_open, timeout=5)
        page = await _page(clone)
        assert page["attention"] == []
        assert not any("another unit id" in p for p in page["health"]["problems"])
    finally:
        await clone.stop()
