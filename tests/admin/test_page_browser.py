"""The status page in a real browser: Debian's chromium, driven by Playwright, against a running
agent on the simulator.

A field tech logs in on a phone, watches a reader go offline in the simulator, reads the doctor's
fix, and presses "Test print" on a laptop. Set ``KIOSK_AGENT_SCREENSHOTS=docs`` to write the
screenshots the README shows (docs/status-page-phone.png, docs/status-page-desktop.png);
otherwise they go to the test's temporary directory.
"""

import asyncio
import os
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from playwright.async_api import Browser, Locator, Page, Route, ViewportSize, expect

from kiosk_agent.admin.page import availability as page_availability
from kiosk_agent.app import load_agent
from kiosk_agent.cli.virtual import simulated_machines
from kiosk_agent.logs import refusal_counts
from kiosk_agent.moments import display_time
from kiosk_agent.sales.journal import SaleRecord
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import SaleState, Step
from tests.admin import browser_session
from tests.admin.conftest import ADMIN_TOKEN, CONFIG, READ_TOKEN, write_config
from tests.admin.test_server import _sell
from tests.helpers import until, walk_to

PHONE: ViewportSize = {"width": 360, "height": 740}
DESKTOP: ViewportSize = {"width": 1280, "height": 900}
WAIT_MS = 10_000  # the longest any expectation waits (a busy 2-core machine)

# The tests and their async fixtures on the worker's one loop, sharing its Playwright driver
# (tests/admin/browser_session.py): a driver's start was 0.37 s of CPU of each test's 0.6-0.8.
pytestmark = pytest.mark.asyncio(loop_scope="session")
browser = browser_session.browser
sim_factory, sim = browser_session.sim_factory, browser_session.sim


@pytest_asyncio.fixture(loop_scope="session")
async def agent(tmp_path: Path, sim_settings: Any) -> AsyncIterator[Any]:
    """The admin tests' agent, with terminals pinged every second (offline shows within ~1 s)."""
    path = write_config(tmp_path)
    path.write_text(CONFIG.replace("ping_interval: 3600", "ping_interval: 1"))
    agent = load_agent(path, sim_settings, systemd=False, machines=simulated_machines)
    await agent.start()
    yield agent
    await agent.stop()


def _screenshot_path(tmp_path: Path, name: str) -> Path:
    where = os.environ.get("KIOSK_AGENT_SCREENSHOTS")
    directory = Path(__file__).parents[2] / "docs" if where == "docs" else tmp_path
    return directory / name


@dataclass
class Seen:
    """What the browser did besides drawing: every URL it asked for, every error it logged."""

    urls: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def _open(
    browser: Browser, url: str, viewport: ViewportSize, token: str, timezone_id: str | None = None,
    init_script: str | None = None,
) -> tuple[Page, Seen]:
    """A fresh browser context at the page (in ``timezone_id``'s zone when given, with
    ``init_script`` run before the page's own), logged in the way a person does it."""
    context = await browser.new_context(viewport=viewport, timezone_id=timezone_id)
    if init_script is not None:
        await context.add_init_script(init_script)
    page = await context.new_page()
    seen = Seen()
    page.on("request", lambda request: seen.urls.append(request.url))
    # a script error or a blocked resource (the Content-Security-Policy) fails the test
    page.on("pageerror", lambda error: seen.errors.append(str(error)))
    page.on("console", lambda m: seen.errors.append(m.text) if m.type == "error" else None)
    await page.goto(f"{url}/")
    await expect(page.get_by_label("Admin API token")).to_be_visible()
    await page.get_by_label("Admin API token").fill(token)
    await page.get_by_role("button", name="Log in").click()
    await expect(page.locator("#board")).to_be_visible()
    return page, seen


async def _screenshot(page: Page, path: Path) -> None:
    await page.evaluate("window.scrollTo(0, 0)")  # the sticky bar stays at the top of the shot
    await page.screenshot(path=path, full_page=True)


def _terminal(page: Page, device_id: str) -> Any:
    return page.locator(f'.terminal[data-device="{device_id}"]')


async def _attention_sale(agent: Any) -> SaleRecord:
    """A sale the agent could not decide, as the flows leave one: in the journal, in health."""
    record = agent.journal.create(
        SaleRecord(
            sale_id="5a1e-attention",
            order_id="ka-5a1e",
            source="mdb:front",
            flow="charge_card",
            terminal="SIM-0001",
            amount_cents=350,
            product="B4",
            state=SaleState.STARTED,
        )
    )
    message = "the charge's outcome is unknown: the service did not answer"
    record = walk_to(
        agent.journal, record, SaleState.ATTENTION, Step.CHARGE_CARD_UNKNOWN, message=message
    )
    agent.health.record_sale(
        SaleEvent(record.sale_id, record.order_id, record.source, SaleState.ATTENTION, 350)
    )
    return record


async def test_a_tech_logs_in_on_a_phone_and_sees_a_reader_go_offline(
    browser: Browser, agent: Any, admin_server: Any, sim: Any, tmp_path: Path
) -> None:
    await _sell(agent, 250)
    await _attention_sale(agent)
    page, seen = await _open(browser, admin_server.url, PHONE, ADMIN_TOKEN)
    front = _terminal(page, "SIM-0001")
    await expect(front.locator('[data-field="online"]')).to_have_text("online", timeout=WAIT_MS)
    await expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS)
    await expect(page.locator("#today")).to_have_text("1 completed, $2.50")
    await expect(page.locator("#attention")).to_contain_text("$3.50")
    assert seen.errors == []

    async with aiohttp.ClientSession() as session:
        offline = f"{sim.base_url}/sim/terminals/SIM-0001/offline"
        async with session.post(offline) as response:
            assert response.status == 200
    began = time.monotonic()
    await expect(front.locator('[data-field="online"]')).to_have_text("OFFLINE", timeout=WAIT_MS)
    shown_after = time.monotonic() - began
    print(f"terminal offline in the simulator -> OFFLINE on the page: {shown_after:.2f} s")
    await expect(page.locator("#events")).to_contain_text("problem: terminal SIM-0001 offline")
    await expect(page.locator("#problems")).to_contain_text("terminal SIM-0001 offline")
    assert shown_after < 1.0 + 2.0  # the ping interval (1 s) and the page's share, with slack

    # the doctor's fix for the failing check, on the page
    await page.get_by_role("button", name="Run doctor checks").click()
    check = page.locator('[data-check="ping SIM-0001"]')
    await expect(check).to_contain_text("FAIL", timeout=WAIT_MS)
    await expect(check.locator(".fix")).to_have_text(
        "Fix: power-cycle the reader and check its network cable or Wi-Fi"
    )

    # readable at 360 px: nothing wider than the screen, targets big enough for gloves
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"]
    # Measured in one go: the live page re-renders its sections (each health ping, each event),
    # so a button found by one call may be replaced before a second call measures it.
    buttons = await page.evaluate(
        """() => [...document.querySelectorAll("button")]
            .filter((b) => b.checkVisibility())
            .map((b) => [b.textContent, b.getBoundingClientRect().height])"""
    )
    assert buttons
    for text, height in buttons:
        assert height >= 40, text
    await _screenshot(page, _screenshot_path(tmp_path, "status-page-phone.png"))
    # the token never travelled in a URL
    assert not [url for url in seen.urls if ADMIN_TOKEN in url]
    assert seen.errors == []


async def test_test_print_from_a_laptop(
    browser: Browser, agent: Any, admin_server: Any, tmp_path: Path
) -> None:
    await _sell(agent, 402)  # declined: a line in the history
    await _attention_sale(agent)
    page, seen = await _open(browser, admin_server.url, DESKTOP, ADMIN_TOKEN)
    await expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS)
    final = await _sell(agent, 250)  # while the page looks: its steps in the live events
    await expect(page.locator("#events")).to_contain_text(
        "→ completed · $2.50 charged", timeout=WAIT_MS
    )
    printer = _terminal(page, "SIM-0007")
    await expect(printer).to_contain_text("receipt printing", timeout=WAIT_MS)

    await printer.get_by_role("button", name="Test print").click()
    trans_id = agent.journal.get(final.sale_id).trans_id
    await expect(printer.locator(".result")).to_have_text(
        re.compile(rf"^\d\d:\d\d:\d\dZ SIM-0007 printed transaction {trans_id}$"), timeout=WAIT_MS
    )
    # a reader without a printer: the button says so instead of failing later
    front = _terminal(page, "SIM-0001")
    await expect(front.get_by_role("button", name="Test print")).to_be_disabled()
    await front.get_by_role("button", name="Ping").click()
    await expect(front.locator(".result")).to_contain_text("SIM-0001 answered in", timeout=WAIT_MS)

    # the last sales with their steps
    history = page.locator(f'#recent details[data-sale="{final.sale_id}"]')
    await history.locator("summary").click()
    await expect(history.locator("ol.steps")).to_contain_text("completed")
    await page.get_by_role("button", name="Run doctor checks").click()
    await expect(page.locator("#doctor")).to_contain_text("0 failed", timeout=WAIT_MS)
    # docs/status-page-desktop.png comes from test_page_truth.py's demo-like run
    await _screenshot(page, tmp_path / "test-print.png")
    assert seen.errors == []


async def test_a_read_only_tech_sees_everything_but_no_buttons(
    browser: Browser, agent: Any, admin_server: Any
) -> None:
    await _attention_sale(agent)
    page, seen = await _open(browser, admin_server.url, PHONE, READ_TOKEN)
    await expect(_terminal(page, "SIM-0007")).to_be_visible(timeout=WAIT_MS)
    await expect(page.get_by_role("button", name="Test print")).to_have_count(0)
    await expect(page.get_by_role("button", name="Resolve")).to_have_count(0)
    await expect(page.get_by_role("button", name="Run doctor checks")).to_be_hidden()
    await expect(page.locator("#attention")).to_contain_text("$3.50")
    assert seen.errors == []


async def test_a_wrong_token_is_refused_on_the_page(
    browser: Browser, agent: Any, admin_server: Any
) -> None:
    context = await browser.new_context(viewport=PHONE)
    page = await context.new_page()
    await page.goto(f"{admin_server.url}/")
    await page.get_by_label("Admin API token").fill("not-a-token-but-long-enough-to-try")
    await page.get_by_role("button", name="Log in").click()
    await expect(page.locator("#login-error")).to_have_text(
        "that token is not configured for this unit"
    )
    await expect(page.locator("#board")).to_be_hidden()


def _has_resolve(admin_server: Any) -> bool:
    routes = admin_server.app().router.routes()
    return any(r.resource.canonical == "/api/sales/{sale_id}/resolve" for r in routes)


async def test_an_attention_sale_is_resolved_from_the_page(
    browser: Browser, agent: Any, admin_server: Any
) -> None:
    if not _has_resolve(admin_server):
        pytest.skip("POST /api/sales/{sale_id}/resolve is not on this branch yet")
    record = await _attention_sale(agent)
    page, seen = await _open(browser, admin_server.url, PHONE, ADMIN_TOKEN)
    form = page.locator(f'form.resolve[data-sale="{record.sale_id}"]')
    await form.get_by_label("Reversed (given back)").check()
    await form.get_by_label("Why").fill("checked the bank statement: refunded by hand")
    await form.get_by_role("button", name="Resolve").click()
    await expect(page.locator("#attention")).to_contain_text("none", timeout=WAIT_MS)
    assert agent.journal.get(record.sale_id).state is not SaleState.ATTENTION
    assert seen.errors == []


# -- hostile text from every source that reaches the page ---------------------------------------

SCRIPTS = '<img src=x onerror="window.__pwned=1"></script><script>window.__pwned=2</script>'
QUOTES = "\"'`${window.__pwned=3}"
CONTROLS = "\u202eRLO\u202c \x1b[31mESC \u2066iso\u2069 nul\x00"
LONG = "W" * 5000  # no space to break at: must not widen a 360 px page
# the joiners an emoji sequence and a Persian word need: writing, not formatting
FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467 \u0646\u0627\u0646\u200c\u0628\u0631"
KIOSK_TOKEN = "kiosk-app-token-0123456789"


@pytest_asyncio.fixture(loop_scope="session")
async def hostile_agent(tmp_path: Path, sim_settings: Any) -> AsyncIterator[Any]:
    """The admin tests' agent with a kiosk app platform (it confirms its dispenses) and a serial
    device whose configured name and port are markup."""
    path = write_config(tmp_path)
    config = CONFIG + (
        "triggers:\n"
        "  - {platform: kiosk_api, name: screen, token: !secret kiosk_token, port: 0,\n"
        "     confirm_dispense: true}\n"
        # a configured name and port path reach the doctor's checks and the links list
        "  - platform: serial_line\n"
        "    name: '<svg onload=window.__pwned=5>'\n"
        "    port: '/dev/<img src=x onerror=window.__pwned=6>'\n"
        "    vend_request: '^REQ (?P<price>\\d+)$'\n"
        "    dispense_ok: '^DONE'\n"
        "    approve: 'OPEN'\n"
    )
    path.write_text(config)
    agent = load_agent(path, sim_settings, systemd=False, machines=simulated_machines)
    await agent.start()
    yield agent
    await agent.stop()


async def _kiosk_sale(agent: Any, product: str, detail: str) -> tuple[int, Any]:
    """A sale from the kiosk app with ``product``, whose dispense fails with ``detail``."""
    screen = next(p for p in agent.platforms if type(p).__name__ == "KioskApi")
    base = f"http://127.0.0.1:{screen.port}/api/v1"
    headers = {"Authorization": f"Bearer {KIOSK_TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        body = {"product": product, "amount": "2.50", "terminal": "SIM-0007"}
        async with session.post(f"{base}/sales", json=body) as r:
            if r.status != 202:
                return r.status, await r.json()
            sale_id = (await r.json())["sale_id"]
        deadline = time.monotonic() + WAIT_MS / 1000
        while time.monotonic() < deadline:
            async with session.post(
                f"{base}/sales/{sale_id}/dispensed", json={"status": "failed", "detail": detail}
            ) as r:
                if r.status == 202:
                    break
            await asyncio.sleep(0.05)
        return 202, sale_id


async def test_hostile_text_shows_as_text_and_runs_nothing(
    browser: Browser, hostile_agent: Any, tmp_path: Path
) -> None:
    agent = hostile_agent
    admin_server = next(c for c in agent.components if type(c).__name__ == "AdminServer")
    # the kiosk app: a product name and a dispense failure written as markup
    status, sale_id = await _kiosk_sale(agent, SCRIPTS, SCRIPTS + QUOTES)
    assert status == 202, sale_id
    await _until_final(agent, sale_id)
    # a long product, a service's answer and a sale's message with controls and direction marks
    status, _ = await _kiosk_sale(agent, LONG, "x")
    assert status == 400  # the kiosk app is told; the page never sees it
    agent.health.report_terminal("SIM-0001", online=True, detail=f"{SCRIPTS} {CONTROLS}")
    record = await _attention_sale(agent)
    record = agent.journal.record(
        record, Step.ATTENTION_RECHECK,
        message=f"{SCRIPTS} {CONTROLS} {LONG}", product=f"{QUOTES}{CONTROLS} {FAMILY}",
    )
    # step details are whatever a flow or platform wrote: not always a string message
    for message in (42, {"nested": SCRIPTS}, [SCRIPTS], None, True):
        odd = {"message": message, "at": SCRIPTS}
        agent.journal.record(record, Step.ATTENTION_RECHECK, detail=odd)
    page, seen = await _open(browser, admin_server.url, PHONE, ADMIN_TOKEN)
    await expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS)
    agent.events.publish(SaleEvent(
        "hostile1", "o1", "screen", SaleState.CHARGING, 250, terminal="SIM-0007",
        product=SCRIPTS, message=f"{SCRIPTS} {CONTROLS}",
    ))
    await expect(page.locator("#events")).to_contain_text("window.__pwned=2", timeout=WAIT_MS)
    recent = page.locator(f'#recent details[data-sale="{sale_id}"]')
    await expect(recent.locator("summary")).to_contain_text(SCRIPTS, timeout=WAIT_MS)
    await recent.locator("summary").click()
    await expect(recent.locator("ol.steps")).to_contain_text('onerror="window.__pwned=1"')
    await expect(_terminal(page, "SIM-0001")).to_contain_text("<script>window.__pwned=2</script>")
    await expect(page.locator("#attention")).to_contain_text(QUOTES)
    odd = page.locator(f'#recent details[data-sale="{record.sale_id}"]')
    await odd.locator("summary").click()
    await expect(odd.locator("ol.steps li")).to_have_count(8)
    await expect(odd.locator("ol.steps")).to_contain_text('{"nested":"<img src=x')
    await expect(page.locator("#doctor")).to_contain_text("checked", timeout=WAIT_MS)
    await page.get_by_role("button", name="Run doctor checks").click()
    await expect(page.locator("#doctor")).to_contain_text(
        "/dev/<img src=x onerror=window.__pwned=6>", timeout=WAIT_MS
    )
    await expect(page.locator("#links")).to_contain_text("<svg onload=window.__pwned=5>")

    shown = await page.evaluate(
        """() => ({
            pwned: window.__pwned === undefined ? null : window.__pwned,
            imgs: document.querySelectorAll("img").length,
            scripts: document.querySelectorAll("script").length,
            text: document.body.innerText,
            width: document.documentElement.scrollWidth,
        })"""
    )
    assert shown["pwned"] is None
    assert (shown["imgs"], shown["scripts"]) == (0, 1)
    # controls and direction overrides are shown as a mark, never obeyed
    for char in ("\u202e", "\u202c", "\x1b", "\u2066", "\u2069", "\x00"):
        assert char not in shown["text"], repr(char)
    assert "\ufffdRLO" in shown["text"]
    assert FAMILY in shown["text"]  # the joiners an emoji or a Persian word needs stay
    assert shown["width"] <= PHONE["width"]  # the long text wraps or is cut, the page stays
    assert LONG not in shown["text"]  # cut: a 5000-character message is not a page
    await _screenshot(page, tmp_path / "hostile.png")
    assert seen.errors == []


async def test_the_kiosk_apps_facts_say_since_when_as_a_time(
    browser: Browser, hostile_agent: Any
) -> None:
    """The kiosk app's status says since when card payment is available as Unix seconds; the
    page showed that number (``since: 1795680152.1037514``) among its words."""
    admin_server = next(c for c in hostile_agent.components if type(c).__name__ == "AdminServer")
    page, seen = await _open(browser, admin_server.url, PHONE, ADMIN_TOKEN)
    screen = page.locator('#links li[data-platform="kiosk_api:screen"]')
    await screen.locator("summary").click()
    facts = screen.locator("dl.facts")
    await expect(facts).to_contain_text("card payment", timeout=WAIT_MS)
    text = await facts.inner_text()
    assert re.search(r"since: \d\d:\d\d:\d\dZ", text), text  # today: the time of day
    assert not re.search(r"\d{9,}", text), text
    assert seen.errors == []


async def _until_final(agent: Any, sale_id: str) -> None:
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        record = agent.journal.get(sale_id)
        if record is not None and record.state.final:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"sale {sale_id} did not end")


# -- another site in the same browser ---------------------------------------------------------


async def _evil_site(html: str) -> tuple[web.AppRunner, str]:
    """A page on another origin (same host, another port: same-site, so the session cookie
    would even go along), serving ``html``."""
    app = web.Application()

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=html, content_type="text/html")

    app.router.add_get("/", index)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/"


async def test_another_site_can_neither_frame_nor_act_for_a_logged_in_tech(
    browser: Browser, agent: Any, admin_server: Any
) -> None:
    record = await _attention_sale(agent)
    page, seen = await _open(browser, admin_server.url, DESKTOP, ADMIN_TOKEN)
    await expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS)
    resolve = f"{admin_server.url}/api/sales/{record.sale_id}/resolve"
    html = f"""<!doctype html><body>
<iframe id="framed" src="{admin_server.url}/" width="600" height="400"></iframe>
<form id="f" method="post" action="{resolve}" enctype="text/plain" target="sink">
  <input name='{{"as": "captured", "why": "x", "pad": "' value='"}}'>
</form>
<iframe name="sink"></iframe>
<script>
  window.results = {{}};
  fetch("{resolve}", {{method: "POST", credentials: "include", mode: "no-cors",
    headers: {{"Content-Type": "text/plain"}}, body: '{{"as": "captured", "why": "x"}}'}})
    .then(() => window.results.post = "sent", (e) => window.results.post = String(e));
  fetch("{admin_server.url}/api/page", {{credentials: "include"}})
    .then((r) => r.text())
    .then((t) => window.results.read = t, (e) => window.results.read = "blocked");
  document.getElementById("f").submit();
</script></body>"""
    origin_refusals = refusal_counts().get(("status_page", "origin"), 0)
    runner, evil_url = await _evil_site(html)
    try:
        evil = await page.context.new_page()  # the same browser: the tech's cookie is there
        await evil.goto(evil_url)
        await evil.wait_for_function("window.results.read && window.results.post", timeout=WAIT_MS)
        results = await evil.evaluate("window.results")
        framed = evil.frame_locator("#framed")
        await expect(framed.locator("#token")).to_have_count(0)  # never drawn inside the frame
        assert results["read"] == "blocked"  # no CORS: the foreign page reads nothing
        # both posts reached the agent (same-site: with the cookie) and were refused by Origin
        deadline = time.monotonic() + WAIT_MS / 1000
        while refusal_counts().get(("status_page", "origin"), 0) < origin_refusals + 2:
            assert time.monotonic() < deadline, refusal_counts()
            await asyncio.sleep(0.02)
    finally:
        await runner.cleanup()
    assert agent.journal.get(record.sale_id).state is SaleState.ATTENTION
    assert [s.step for s in agent.journal.steps(record.sale_id)][-1] == Step.CHARGE_CARD_UNKNOWN
    assert seen.errors == []


async def test_two_techs_resolving_one_sale_from_two_phones(
    browser: Browser, agent: Any, admin_server: Any
) -> None:
    """Both have the form filled in and press Resolve at the same moment, one "captured", the
    other "reversed": the journal holds one resolution, and both phones end up showing the sale
    decided (no longer in attention)."""
    record = await _attention_sale(agent)
    opened = []
    for as_label in ("Captured (paid)", "Reversed (given back)"):
        page, seen = await _open(browser, admin_server.url, PHONE, ADMIN_TOKEN)
        form = page.locator(f'form.resolve[data-sale="{record.sale_id}"]')
        await form.get_by_label(as_label).check()
        await form.get_by_label("Why").fill(f"{as_label} by hand")
        opened.append((page, form, seen))
    # "at the same moment" made so on a machine of any speed: each post waits in its browser
    # until both were sent (at load 11-15 one phone's press came after its page had heard of
    # the other's resolution, or the refusal's console line after the page's update)
    sent: list[Route] = []
    both_sent = asyncio.Event()

    async def hold_until_both_sent(route: Route) -> None:
        sent.append(route)
        if len(sent) == len(opened):
            both_sent.set()
        await both_sent.wait()
        await route.continue_()

    async def press(page: Page, form: Locator) -> int:
        await page.route("**/resolve", hold_until_both_sent)
        async with page.expect_response("**/resolve", timeout=WAIT_MS) as answer:
            await form.get_by_role("button", name="Resolve").click()
        return (await answer.value).status

    statuses = await asyncio.gather(*(press(page, form) for page, form, _ in opened))
    assert sorted(statuses) == [200, 409]  # one resolution; the other told it came second
    for page, _, _ in opened:
        await expect(page.locator("#attention")).to_contain_text("none", timeout=WAIT_MS)
    refused_on = opened[statuses.index(409)][2]
    await until(lambda: any("status of 409 (Conflict)" in e for e in refused_on.errors))
    for _, _, seen in opened:  # the browser logs the second one's refusal; nothing else failed
        assert [e for e in seen.errors if "409" not in e] == []
    assert sum("status of 409 (Conflict)" in e for _, _, s in opened for e in s.errors) == 1
    steps = [s.step for s in agent.journal.steps(record.sale_id)]
    assert steps.count("attention.resolved") == 1
    assert agent.journal.get(record.sale_id).state in (SaleState.COMPLETED, SaleState.REVERSED)


async def test_every_time_on_the_page_is_utc_and_says_so_as_the_command_line(
    browser: Browser, agent: Any, admin_server: Any, sim: Any
) -> None:
    """Before: the page wrote times in the browser's zone with no zone named, while the command
    line writes UTC: a tech in New York saw one sale at 05:15:30 on the page and 10:15:30Z in
    `kiosk-agent sales`."""
    final = await _sell(agent, 250)
    record = agent.journal.get(final.sale_id)
    page, seen = await _open(browser, admin_server.url, PHONE, ADMIN_TOKEN,
                             timezone_id="America/New_York")
    created = datetime.fromtimestamp(record.created_at, UTC).strftime("%H:%M:%SZ")
    # as `kiosk-agent sales` writes it (the date too on another day)
    await expect(page.locator("#recent")).to_contain_text(f"{created} · SIM-0007 · $2.50 charged",
                                                          timeout=WAIT_MS)
    await expect(page.locator("#footer")).to_contain_text("times are UTC (Z)")
    await expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS)
    stamp = time.time()
    offline = f"{sim.base_url}/sim/terminals/SIM-0001/offline"  # the pings find it so: it stays
    async with aiohttp.ClientSession() as session, session.post(offline) as response:
        assert response.status == 200
    line = page.locator("#events li", has_text="problem: terminal SIM-0001 offline").first
    await expect(line).to_be_visible(timeout=WAIT_MS)
    shown = (await line.inner_text())[:9]
    assert re.fullmatch(r"\d\d:\d\d:\d\dZ", shown), shown
    moment = datetime.strptime(shown, "%H:%M:%SZ").replace(tzinfo=UTC)
    utc_now = datetime.fromtimestamp(stamp, UTC)
    # a UTC time of day within seconds of now (New York's would be 5 hours off)
    assert abs((utc_now - moment.replace(year=utc_now.year, month=utc_now.month,
                                         day=utc_now.day)).total_seconds()) % 86400 < 30

    # A late vend (a note on a reversed sale, no sale step): its sale's line says the product
    # went out, at the journal's time in UTC, and the problem shows until acknowledged; after
    # it, the line still says it (the journal keeps the note), the problem is gone.
    late = walk_to(agent.journal, agent.journal.create(SaleRecord(
        sale_id="1a7e0late", order_id="ka-1a7e", source="mdb:front", flow="authorize_capture",
        terminal="SIM-0001", amount_cents=200, product="C4", state=SaleState.STARTED,
    )), SaleState.REVERSED)  # fmt: skip
    agent.sales.late_vends.heard(late.sale_id, "C4", "mdb:front")
    [note] = [s for s in agent.journal.steps(late.sale_id) if s.step == Step.LATE_VEND]
    said = f"late vend: C4 dispensed {display_time(note.at)}, after the sale gave up waiting"
    line = page.locator(f'#recent [data-sale="{late.sale_id}"] summary')
    await expect(line).to_contain_text(said, timeout=WAIT_MS)
    await expect(line).to_have_class("bad")
    problem = page.locator("#problems li", has_text="sale 1a7e0lat (C4 on mdb:front")
    await expect(problem).to_be_visible(timeout=WAIT_MS)
    assert agent.sales.late_vends.acknowledge(late.sale_id, by="test") == [late.sale_id]
    await expect(problem).to_have_count(0, timeout=WAIT_MS)
    await expect(line).to_contain_text(said)
    assert seen.errors == []


async def test_a_page_that_fell_behind_says_how_many_steps_it_missed(
    browser: Browser, agent: Any, admin_server: Any
) -> None:
    """Before: past the stream's queue (256 steps) the page lost steps without a word."""
    page, seen = await _open(browser, admin_server.url, DESKTOP, ADMIN_TOKEN)
    await expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS)
    # every line the live list gets (it keeps the newest 100: the 256 after the gap push it out)
    await page.evaluate("""() => {
        window.shownLines = [];
        new MutationObserver((changes) => changes.forEach((c) => c.addedNodes.forEach(
            (node) => window.shownLines.push(node.textContent))))
          .observe(document.getElementById("events"), { childList: true });
    }""")
    for n in range(300):  # at once: the stream's reader runs only after the last
        agent.events.publish(SaleEvent(f"burst{n:011d}", f"o-{n}", "burst", SaleState.STARTED,
                                       100, terminal="SIM-0007", at=time.time()))
    await page.wait_for_function("() => window.shownLines.length >= 257", timeout=WAIT_MS)
    lines = [line for line in await page.evaluate("window.shownLines") if "burst" in line
             or "missed" in line]
    assert "44 event(s) missed here: this reader fell behind the agent" in lines[0]
    assert len(lines) == 257  # the gap, then the 256 steps the stream kept
    assert seen.errors == []


# One vending machine on SIM-0001 and no customer: nothing but the outage moves on the page.
IDLE_MACHINE = """
triggers:
  - platform: virtual
    name: snacks
    terminal: SIM-0001
    flow: authorize_capture
    customers: false
"""


@pytest_asyncio.fixture(loop_scope="session")
async def idle_machine(tmp_path: Path, sim_settings: Any) -> AsyncIterator[Any]:
    path = write_config(tmp_path, IDLE_MACHINE)
    path.write_text(path.read_text().replace("ping_interval: 3600", "ping_interval: 1"))
    agent = load_agent(path, sim_settings, systemd=False, machines=simulated_machines)
    await agent.start()
    yield agent
    await agent.stop()


async def _page_matches_the_agent(page: Page, agent: Any, device_id: str, sim: Any) -> None:
    """Every card of the page against what the agent holds now (its health, its availability,
    the platform's own status) and what the simulator says of the reader: the same words, not
    the words the page's code would make."""
    reader_online = sim.ctx.terminals.describe(device_id)["online"]
    await until(
        lambda: next(t.online for t in agent.health.snapshot().terminals
                     if t.device_id == device_id) is reader_online,
        timeout=WAIT_MS / 1000,
    )  # the agent's next ping has seen what the simulator holds
    snapshot = agent.health.snapshot().model_dump(mode="json")
    view = page_availability(snapshot)
    await expect(page.locator("#status")).to_have_text(snapshot["status"], timeout=WAIT_MS)
    await expect(page.locator("#available")).to_have_text(view["summary"], timeout=WAIT_MS)
    await expect(page.locator("#unavailable li")).to_have_count(len(view["cannot"]))
    for problem in snapshot["problems"]:
        await expect(page.locator("#problems")).to_contain_text(problem)
    status = next(p for p in agent.platforms if p.name == "virtual:snacks").status()
    summary = page.locator('#links li[data-platform="virtual:snacks"] summary')
    await expect(summary).to_contain_text(f"reader {status['reader']}", timeout=WAIT_MS)
    if status["available"]:
        await expect(summary).not_to_contain_text("out of service")
    else:
        await expect(summary).to_contain_text(f"out of service: {status['unavailable_reason']}")
    online = next(t for t in snapshot["terminals"] if t["device_id"] == device_id)["online"]
    assert online is reader_online
    await expect(_terminal(page, device_id).locator('[data-field="online"]')).to_have_text(
        "online" if online else "OFFLINE"
    )


async def test_every_card_follows_an_outage_and_its_end_without_a_sale(
    browser: Browser, idle_machine: Any, sim: Any
) -> None:
    """Before: the platform's line kept "reader enabled" for the whole outage (it was redrawn
    only when a sale step reloaded the page) and the Doctor card kept "0 failed" under DOWN."""
    agent = idle_machine
    admin = next(c for c in agent.components if type(c).__name__ == "AdminServer")
    page, seen = await _open(browser, admin.url, PHONE, ADMIN_TOKEN)
    await expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS)
    ping = page.locator('[data-check="ping SIM-0001"]')
    await expect(ping).to_contain_text("PASS", timeout=WAIT_MS)
    await until(lambda: agent.availability.state("SIM-0001").available)
    await _page_matches_the_agent(page, agent, "SIM-0001", sim)

    async with aiohttp.ClientSession() as session:
        async with session.post(f"{sim.base_url}/sim/terminals/SIM-0001/offline") as response:
            assert response.status == 200
        snacks = next(p for p in agent.platforms if p.name == "virtual:snacks")
        await until(lambda: snacks.status()["reader"] == "disabled", timeout=WAIT_MS / 1000)
        await _page_matches_the_agent(page, agent, "SIM-0001", sim)
        # the doctor's checks ran again by themselves: the card says what fails now
        await expect(ping).to_contain_text("FAIL", timeout=WAIT_MS)
        await expect(page.locator('[data-field="doctor-summary"]')).to_contain_text("1 failed")

        async with session.post(f"{sim.base_url}/sim/terminals/SIM-0001/online") as response:
            assert response.status == 200
        await until(lambda: snacks.status()["reader"] == "enabled", timeout=WAIT_MS / 1000)
        await _page_matches_the_agent(page, agent, "SIM-0001", sim)
        await expect(ping).to_contain_text("PASS", timeout=WAIT_MS)
        await expect(page.locator('[data-field="doctor-summary"]')).to_contain_text("0 failed")
    assert agent.journal.query(limit=1) == []  # no sale step redrew anything
    assert seen.errors == []


GPIO_NOT_HERE = """
triggers:
  - platform: gpio
    name: kiosk
    chip: /dev/gpiochip99
    terminal: SIM-0001
    buttons:
      - {line: 17, product: espresso, price: "2.50", relay: 22}
"""


async def test_a_trigger_that_cannot_start_is_on_the_page_with_why(
    browser: Browser, tmp_path: Path, sim_settings: Any
) -> None:
    """Before: the page showed nothing of a configured GPIO trigger that never started (the
    log had a traceback; health blamed a 'link' with "setup failed; see the log")."""
    agent = load_agent(write_config(tmp_path, GPIO_NOT_HERE), sim_settings, systemd=False)
    await agent.start()
    try:
        admin = next(c for c in agent.components if type(c).__name__ == "AdminServer")
        page, seen = await _open(browser, admin.url, DESKTOP, ADMIN_TOKEN)
        why = agent.not_started["gpio:kiosk"]
        assert why.startswith("chip /dev/gpiochip99 does not exist on this machine")
        [problem] = [p for p in agent.health.snapshot().problems if "gpio:kiosk" in p]
        await expect(page.locator("#problems")).to_contain_text(problem, timeout=WAIT_MS)
        await expect(page.locator("#status")).to_have_text(agent.health.snapshot().status.value)
        summary = page.locator('#links li[data-platform="gpio:kiosk"] summary')
        await expect(summary).to_have_text(f"gpio:kiosk: NOT RUNNING: cannot start: {why}")
        assert seen.errors == []
    finally:
        await agent.stop()


async def test_at_midnight_the_pages_sessions_apart_go_with_the_day(
    browser: Browser, agent: Any, admin_server: Any
) -> None:
    """At midnight the stream's health said "Sales today: 0 completed, $0.00" while the line
    under it kept yesterday's "not sales: 2 card sessions ..." until a sale or a reload: the
    page read that line only with its lists. A new day in health reads the page again."""
    from kiosk_agent.moments import day_of
    from kiosk_agent.sales.clock import FakeClock
    from tests.admin.test_page_day import DAY, _walked_away

    now = agent.journal.clock.time()
    _walked_away(agent.journal, now, 2)
    page, seen = await _open(browser, admin_server.url, DESKTOP, ADMIN_TOKEN)
    await expect(page.locator("#sessions-apart")).to_contain_text(
        "not sales: 2 card sessions ended with no selection", timeout=WAIT_MS)
    await expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS)
    # midnight passes on the agent's clock: the journal's and health's day
    agent.journal.clock = FakeClock(wall=now + DAY)
    agent.health.today = lambda: day_of(now + DAY)
    await expect(page.locator("#today")).to_have_text("0 completed, $0.00", timeout=WAIT_MS)
    await expect(page.locator("#sessions-apart")).to_be_hidden(timeout=WAIT_MS)
    assert seen.errors == []


async def test_the_page_shows_a_void_made_at_the_service_later_beside_the_days_takings(
    browser: Browser, agent: Any, admin_server: Any
) -> None:
    """A sale of $2.50 completed, the page open; a person voids it at the service and the
    charge check notes it: the event list says the note's step (not a second completed sale)
    and the day's line keeps its count and takings with what others gave back beside them, as
    the journal holds them, with no reload by hand."""
    done = await _sell(agent, 250)
    record = agent.journal.get(done.sale_id)
    page, seen = await _open(browser, admin_server.url, DESKTOP, ADMIN_TOKEN)
    await expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS)
    await expect(page.locator("#today")).to_have_text("1 completed, $2.50", timeout=WAIT_MS)
    await agent.service.payments.void_or_refund(record.trans_id, user_identifier="ops")
    assert (await agent.journal_guard.audit.check(settled=True)).later == [record.sale_id]
    noted = agent.journal.get(record.sale_id)
    assert (noted.state, noted.captured_cents, noted.later_cents) == (
        SaleState.COMPLETED, 250, 250)
    await expect(page.locator("#events")).to_contain_text(
        f"sale {record.sale_id[:8]} service.later → completed", timeout=WAIT_MS)
    await expect(page.locator("#today")).to_have_text(
        "1 completed, $2.50 ($2.50 given back since by others, at the service)",
        timeout=WAIT_MS)
    assert seen.errors == []
