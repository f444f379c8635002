"""The status page against two attacks its other browser tests did not catch on their own:
hostile text from the journal, the machine's audit and health drawn as markup (an ``innerHTML``
where page.js uses ``textContent``), and the page framed by another site once only its
Content-Security-Policy stands in the way (``frame-ancestors``; ``X-Frame-Options`` is the
older header and hid a missing directive)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, Route, expect

from kiosk_agent.audit.component import AuditReads, Port
from kiosk_agent.sales.states import Step
from tests.admin import browser_session
from tests.admin.conftest import ADMIN_TOKEN
from tests.admin.test_page_browser import (
    DESKTOP,
    WAIT_MS,
    _attention_sale,
    _evil_site,
    _open,
    hostile_agent,
)
from tests.audit.helpers import figures
from tests.helpers import until

pytestmark = pytest.mark.asyncio(loop_scope="session")
browser = browser_session.browser
sim_factory, sim = browser_session.sim_factory, browser_session.sim
agent = browser_session.agent
__all__ = ["hostile_agent"]

# Markup a browser would build elements from, had it been given it as HTML: a <b> is not
# stopped by the Content-Security-Policy (an inline handler is), so it shows any slip
MARKUP = '<b class="x">bold</b><img src=x onerror="window.__pwned=7">'
OUT = f"{MARKUP}2"  # a second column, sold out

# page.js creates none of these elements: one that appears came from data
WATCH = """
window.__made = [];
new MutationObserver((changes) => {
  for (const change of changes) for (const node of change.addedNodes) {
    if (node.nodeType !== 1) continue;
    for (const made of [node, ...node.querySelectorAll("*")]) {
      if (["B", "IMG", "SVG", "IFRAME"].includes(made.tagName.toUpperCase()))
        window.__made.push(made.tagName);
    }
  }
}).observe(document, {childList: true, subtree: true});
"""


async def test_hostile_text_in_every_field_from_journal_audit_and_health_stays_text(
    browser: Browser, hostile_agent: Any
) -> None:
    agent = hostile_agent
    admin_server = next(c for c in agent.components if type(c).__name__ == "AdminServer")
    # health: the unit (its banner goes through setText; a terminal's detail is the older
    # test's, test_page_browser.py, and the pinger here redraws it each second)
    agent.health.report_unit(id=f"u {MARKUP}", machine=f"m {MARKUP}",
                             mismatch=f"r {MARKUP}", made_elsewhere=f"e {MARKUP}")
    # the journal: a sale at attention with a product and a message of markup
    record = await _attention_sale(agent)
    agent.journal.record(record, Step.ATTENTION_RECHECK, message=f"s {MARKUP}",
                         product=f"p {MARKUP}")
    # the machine's audit: its name (the trigger) and column names from its DEX file
    answers = [figures((2, 300), columns={MARKUP: (150, 0, 0), OUT: (250, 0, 0)}),
               figures((4, 600), columns={MARKUP: (150, 1, 1), OUT: (250, 3, 3)})]

    async def read_file() -> bytes:
        return b"an audit file"

    conf = {"trigger": f"a {MARKUP}", "planogram": {MARKUP: 3, OUT: 3}, "low_stock": 2}
    books = AuditReads(agent, conf, Port(read_file, lambda _: answers.pop(0)))
    await books.start()
    agent.components.append(books)
    await books.read_once()
    await books.read_once()

    page, seen = await _open(browser, admin_server.url, DESKTOP, ADMIN_TOKEN, init_script=WATCH)
    await expect(page.locator("#audit")).to_contain_text(f"a {MARKUP}", timeout=WAIT_MS)
    shown = {
        "cannot take cards": page.locator("#unavailable"),
        "unit id": page.locator("[data-unit=id]"),
        "unit machine": page.locator("[data-unit=machine]"),
        "unit banner": page.locator("#unit-refusal"),
        "attention": page.locator("#attention"),
        "audit sold out": page.locator("[data-audit=sold-out]"),
        "audit low": page.locator("[data-audit=low]"),
        "audit mismatch": page.locator("[data-audit=mismatch]"),
    }
    for where, locator in shown.items():
        await expect(locator, where).to_contain_text(MARKUP, timeout=WAIT_MS)
    await expect(page.locator("#unit-refusal")).to_contain_text(f"e {MARKUP}")
    await expect(page.locator("#attention")).to_contain_text(f"p {MARKUP}")
    made = await page.evaluate(
        "() => ({made: window.__made, pwned: window.__pwned ?? null,"
        " now: document.querySelectorAll('b, img, svg, iframe').length})"
    )
    assert made == {"made": [], "pwned": None, "now": 0}
    assert seen.errors == []


async def test_every_page_response_forbids_framing_and_the_policy_alone_refuses_it(
    browser: Browser, agent: Any, admin_server: Any
) -> None:
    async with aiohttp.ClientSession() as http:
        for path in ("/", "/static/page.js", "/static/page.css"):
            async with http.get(f"{admin_server.url}{path}") as r:
                assert r.status == 200, path
                policy = [d.strip() for d in r.headers["Content-Security-Policy"].split(";")]
                assert "frame-ancestors 'none'" in policy, (path, policy)
                assert r.headers["X-Frame-Options"] == "DENY", path

    # the framing site, in a browser that drops X-Frame-Options from the page's answers: the
    # Content-Security-Policy must refuse the frame by itself (browsers that honour it ignore
    # X-Frame-Options; the older header only backs it up)
    html = f'<!doctype html><body><iframe id="framed" src="{admin_server.url}/"></iframe>'
    runner, evil_url = await _evil_site(html)
    context = await browser.new_context(viewport=DESKTOP)
    refused: list[str] = []
    loaded: list[str] = []

    async def without_xfo(route: Route) -> None:
        answer = await route.fetch()
        headers = {k: v for k, v in answer.headers.items() if k.lower() != "x-frame-options"}
        await route.fulfill(response=answer, headers=headers)

    try:
        await context.route(f"{admin_server.url}/**", without_xfo)
        evil = await context.new_page()
        evil.on("console", lambda m: refused.append(m.text) if "frame-ancestors" in m.text
                else None)
        evil.on("requestfinished", lambda r: loaded.append(r.url))
        await evil.goto(evil_url)
        framed = evil.frame_locator("#framed")
        script = f"{admin_server.url}/static/page.js"
        # refused (the console says why), or framed (the page's script loaded in the frame)
        await until(lambda: refused or script in loaded, timeout=WAIT_MS / 1000)
        assert script not in loaded, "the page was drawn inside another site's frame"
        await expect(framed.locator("#token")).to_have_count(0)  # nothing drawn in the frame
        assert any("frame-ancestors 'none'" in text for text in refused), refused
    finally:
        await context.close()
        await runner.cleanup()
