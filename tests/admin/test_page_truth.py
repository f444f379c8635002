"""The status page tells the truth: during a demo-like run (two virtual vending machines selling
on their own, one reader taken offline in the simulator) a real chromium reads the page, and
every amount, state, card and availability it shows is compared with the journal and the
simulator.
"""

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from playwright.async_api import Browser, expect

from kiosk_agent.app import load_agent
from kiosk_agent.cli.virtual import simulated_machines
from kiosk_agent.money import format_cents
from kiosk_agent.sales.journal import SaleRecord
from kiosk_agent.sales.states import SaleState
from tests.admin import browser_session
from tests.admin.conftest import ADMIN_TOKEN, CONFIG, write_config
from tests.admin.test_page_browser import (
    DESKTOP,
    PHONE,
    WAIT_MS,
    _open,
    _screenshot,
    _screenshot_path,
    _terminal,
)
from tests.helpers import until

# On the worker's one loop, sharing its Playwright driver (tests/admin/browser_session.py).
pytestmark = pytest.mark.asyncio(loop_scope="session")
browser = browser_session.browser
sim_factory, sim = browser_session.sim_factory, browser_session.sim

# As config/demo.yaml: a coffee machine taking the card first (the agent authorizes $5.00, the
# customer's choice is captured) and a snack machine choosing first; nobody walks away here.
DEMO_LIKE = CONFIG.replace("ping_interval: 3600", "ping_interval: 1") + """
triggers:
  - platform: virtual
    name: coffee
    terminal: SIM-0007
    mode: card_first
    max_funds: "5.00"
    flow: authorize_capture
    products: {K1: "1.80", K3: "3.10"}
    gap: [0.05, 0.2]
    fail_rate: 0
    walk_away_rate: 0
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

# The interface numbers card networks; the project names them (docs/interface-choices.md).
BRANDS = {"1": "Visa", "2": "Mastercard", "3": "American Express", "4": "Discover"}


@pytest_asyncio.fixture(loop_scope="session")
async def selling(tmp_path: Path, sim_settings: Any) -> AsyncIterator[Any]:
    path = write_config(tmp_path)
    path.write_text(DEMO_LIKE)
    agent = load_agent(path, sim_settings, systemd=False, machines=simulated_machines)
    await agent.start()
    yield agent
    await agent.stop()


def _expected_money(sale: SaleRecord) -> str:
    """What the page must say a sale's money is, worked out here from the journal's cents."""
    if sale.state is SaleState.COMPLETED:
        return f"{format_cents(sale.captured_cents - sale.reversed_cents)} charged"
    if not sale.state.final:
        if sale.authorized_cents:
            return f"{format_cents(sale.authorized_cents)} authorized"
        return f"{format_cents(sale.amount_cents)} requested"
    return "nothing charged"


async def _until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_MS / 1000 * 3
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not seen in time: {what}")


def _finished(agent: Any) -> list[SaleRecord]:
    return [s for s in agent.journal.query(limit=20) if s.state.final]


async def test_the_page_shows_what_was_charged_the_card_by_name_and_how_many_readers_work(
    browser: Browser, selling: Any, sim: Any, tmp_path: Path
) -> None:
    agent = selling
    admin = next(c for c in agent.components if type(c).__name__ == "AdminServer")
    await _until(
        lambda: sum(1 for s in _finished(agent) if s.flow == "authorize_capture"
                    and s.state is SaleState.COMPLETED and s.captured_cents < s.amount_cents) >= 2,
        "two card-first sales captured below the $5.00 authorized",
    )
    # before a login, nothing claims to be offline (nobody asked to be live yet)
    context = await browser.new_context(viewport=PHONE)
    login_page = await context.new_page()
    await login_page.goto(f"{admin.url}/")
    await expect(login_page.get_by_label("Admin API token")).to_be_visible()
    assert "offline" not in (await login_page.locator("body").inner_text()).lower()
    await context.close()

    page, seen = await _open(browser, admin.url, DESKTOP, ADMIN_TOKEN)
    await expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS)
    await expect(page.locator("#events li[data-step]").first).to_be_visible(timeout=WAIT_MS)
    await expect(page.locator("#available")).to_have_text(
        "2 of 2 readers can take cards", timeout=WAIT_MS
    )
    await expect(page.locator("#available")).to_have_class(re.compile(r"\bgood\b"))

    # the machines sell while the page looks; every sale the page shows as ended is compared
    # with the journal (an ended sale never changes; one still running is skipped)
    await _until(lambda: len(_finished(agent)) >= 8, "sales while the page looks")
    await page.reload()
    await expect(page.locator("#board")).to_be_visible()
    rows = page.locator("#recent details[data-sale]")
    await expect(rows.first).to_be_visible(timeout=WAIT_MS)
    shown = await rows.evaluate_all(
        """(rows) => rows.map((r) => ({sale: r.dataset.sale,
            summary: r.querySelector("summary").textContent,
            more: r.querySelector("p.muted").textContent}))"""
    )
    checked = below_authorized = 0
    for row in shown:
        sale = agent.journal.get(row["sale"])
        # "22:14:05 · SIM-0007 · $1.80 charged · completed · K1"
        if row["summary"].split(" · ")[3] != sale.state.value:
            assert not SaleState(row["summary"].split(" · ")[3]).final, row  # ended ones stay
            continue  # drawn while it ran: it has moved on since
        assert f" · {_expected_money(sale)} · {sale.state.value}" in row["summary"], row
        if sale.state is SaleState.COMPLETED and sale.captured_cents != sale.amount_cents:
            # the amount asked (the $5.00 authorized) is never shown as if it were taken
            assert format_cents(sale.amount_cents) not in row["summary"], row
            below_authorized += 1
        if sale.card_brand:
            assert f" · {BRANDS[sale.card_brand]} {sale.last_four}" in row["more"], row
            assert f" · {sale.card_brand} {sale.last_four}" not in row["more"], row
        checked += 1
    assert checked >= 6, shown
    assert below_authorized >= 1, shown

    # live events name the step, and the money as the journal has it when the sale ended
    events = page.locator("#events li[data-sale]")
    # the list is the reloaded page's own: a step after the reload comes (at once on a loaded
    # machine, where comparing the rows took long; a moment later on a fast one)
    await expect(events.first).to_be_visible(timeout=WAIT_MS)
    lines = await events.evaluate_all(
        "(lis) => lis.map((li) => [li.dataset.sale, li.dataset.step, li.textContent])"
    )
    assert lines
    for sale_id, step, text in lines:
        assert step, text
        assert f" sale {sale_id[:8]} {step} → " in text, text
        sale = agent.journal.get(sale_id)
        if sale is not None and sale.state is SaleState.COMPLETED and "→ completed" in text:
            assert f"· {format_cents(sale.captured_cents)} charged" in text, text

    # a reader goes offline in the simulator: 1 of 2, amber, and which one and why
    offline = f"{sim.base_url}/sim/terminals/SIM-0001/offline"
    async with aiohttp.ClientSession() as session, session.post(offline) as response:
        assert response.status == 200
    await expect(page.locator("#available")).to_have_text(
        "1 of 2 readers can take cards", timeout=WAIT_MS
    )
    await expect(page.locator("#available")).to_have_class(re.compile(r"\bwarn\b"))
    # "1 of 2" from the first failed check (held in service a moment: the hold-off), then the
    # agent's decision: out of service, and why
    await until(lambda: not agent.availability.state("SIM-0001").available)
    reason = agent.availability.state("SIM-0001").reason
    cannot = page.locator('#unavailable li[data-device="SIM-0001"]')
    name = next(t.name for t in agent.health.snapshot().terminals if t.device_id == "SIM-0001")
    await expect(cannot).to_contain_text(f"{name} (SIM-0001) cannot: {reason}")
    await expect(page.locator("#available")).to_have_text("1 of 2 readers can take cards")
    snapshot = agent.health.snapshot()
    assert [a.device_id for a in snapshot.availability if not a.available] == ["SIM-0001"]
    # every part follows the outage as it happens, not only after a sale step reloads a list:
    # the machine's reader steps aside, the status and the problems are the agent's own, and
    # the Doctor card runs again and names the reader (issue 32: "reader enabled" and
    # "0 failed" were shown for a whole outage)
    snacks = page.locator('#links li[data-platform="virtual:snacks"] summary')
    await expect(snacks).to_contain_text(f"virtual:snacks: out of service: {reason}")
    await expect(snacks).not_to_contain_text("reader enabled")
    await _the_page_shows_the_agents_health(page, agent)
    await _the_doctor_card_is_the_doctors(page, admin.url, lambda doctor: any(
        c["verdict"] == "FAIL" and "SIM-0001" in c["name"] for c in doctor["checks"]))

    # the offline reader: Connect and Test print cannot work, so they are off, and say why
    front = _terminal(page, "SIM-0001")
    await expect(front.locator('[data-field="online"]')).to_have_text("OFFLINE")
    await expect(front.get_by_role("button", name="Connect")).to_be_disabled()
    await expect(front.get_by_role("button", name="Test print")).to_be_disabled()
    await expect(front.locator('[data-field="why-disabled"]')).to_contain_text("offline")
    # Ping is how a tech checks: it stays, and its answers replace each other
    for _ in range(2):
        await front.get_by_role("button", name="Ping").click()
        await expect(front.get_by_role("button", name="Ping")).to_be_enabled(timeout=WAIT_MS)
    await expect(front.locator(".result")).to_have_count(1)
    await expect(front.locator(".result")).to_contain_text("SIM-0001 does not answer")
    assert "HTTP 409" not in await page.locator("body").inner_text()

    # links and platforms read as words, not a dump of keys and nulls
    coffee = page.locator('#links li[data-platform="virtual:coffee"]')
    await expect(coffee.locator("summary")).to_contain_text("virtual:coffee: reader enabled")
    await coffee.locator("summary").click()
    # opened, it stays open while the list is redrawn at each health change
    await expect(coffee.locator("dl.facts")).to_contain_text("steps aside after sale")
    links_text = await page.locator("#links").inner_text()
    assert "null" not in links_text, links_text
    assert "{" not in links_text, links_text
    assert "unavailable_reason" not in links_text
    assert "[object" not in links_text, links_text
    facts = await coffee.locator("dl.facts").inner_text()
    assert re.search(r"^reader\s+enabled$", facts, re.M), facts
    assert re.search(r"^steps aside after sale\s+no$", facts, re.M), facts
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= DESKTOP["width"]
    await _screenshot(page, _screenshot_path(tmp_path, "status-page-desktop.png"))

    # the reader comes back: every part follows again, and the doctor no longer fails it
    online = f"{sim.base_url}/sim/terminals/SIM-0001/online"
    async with aiohttp.ClientSession() as session, session.post(online) as response:
        assert response.status == 200
    await expect(page.locator("#available")).to_have_text(
        "2 of 2 readers can take cards", timeout=WAIT_MS
    )
    await expect(page.locator("#unavailable li")).to_have_count(0)
    await expect(snacks).to_contain_text("virtual:snacks: reader enabled", timeout=WAIT_MS)
    await expect(snacks).not_to_contain_text("out of service")
    await until(lambda: agent.availability.state("SIM-0001").available)
    await _the_page_shows_the_agents_health(page, agent)
    await _the_doctor_card_is_the_doctors(page, admin.url, lambda doctor: not any(
        c["verdict"] == "FAIL" and "SIM-0001" in c["name"] for c in doctor["checks"]))
    assert seen.errors == []


async def _the_page_shows_the_agents_health(page: Any, agent: Any) -> None:
    """The status pill and the problems card say what the agent's health says, both read at
    one moment (the page follows each change: it catches up within the wait)."""
    deadline = time.monotonic() + WAIT_MS / 1000 * 3
    while True:
        shown = (await page.locator("#status").text_content(),
                 await page.locator("#problems li").all_text_contents())
        snapshot = agent.health.snapshot()
        held = (snapshot.status.value, list(snapshot.problems) or ["none"])
        if shown == held:
            return
        assert time.monotonic() < deadline, (shown, held)
        await asyncio.sleep(0.05)


async def _the_doctor_card_is_the_doctors(page: Any, url: str, wanted: Any) -> None:
    """The Doctor card shows the doctor's latest run (GET /api/doctor), once that run says
    what ``wanted`` asks of it: it runs again by itself when the health's problems change."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    doctor: dict[str, Any] = {}

    async def latest() -> bool:
        nonlocal doctor
        async with aiohttp.ClientSession(headers=headers) as session, session.get(
            f"{url}/api/doctor"
        ) as answer:
            doctor = await answer.json()
        return bool(doctor.get("finished_at")) and not doctor.get("running") and wanted(doctor)

    deadline = time.monotonic() + WAIT_MS / 1000 * 3
    while not await latest():
        assert time.monotonic() < deadline, f"the doctor never ran as wanted: {doctor}"
        await asyncio.sleep(0.1)
    summary = page.locator('[data-field="doctor-summary"]')
    await expect(summary).to_contain_text(
        f"{doctor['failed']} failed, {len(doctor['checks'])} checked", timeout=WAIT_MS
    )


async def test_none_of_the_readers_can_take_cards_is_red(
    browser: Browser, selling: Any, sim: Any
) -> None:
    admin = next(c for c in selling.components if type(c).__name__ == "AdminServer")
    page, seen = await _open(browser, admin.url, PHONE, ADMIN_TOKEN)
    async with aiohttp.ClientSession() as session:
        for device in ("SIM-0001", "SIM-0007"):
            async with session.post(f"{sim.base_url}/sim/terminals/{device}/offline") as r:
                assert r.status == 200
    await expect(page.locator("#available")).to_have_text(
        "0 of 2 readers can take cards", timeout=WAIT_MS
    )
    await expect(page.locator("#available")).to_have_class(re.compile(r"\bbad\b"))
    await expect(page.locator("#unavailable li")).to_have_count(2)
    assert seen.errors == []
