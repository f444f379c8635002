"""The machine's books on the status page, in a real browser: what health holds, shown."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.async_api import Browser, expect

from kiosk_agent.audit.component import AuditReads, Port
from tests.admin import browser_session
from tests.admin.conftest import READ_TOKEN
from tests.admin.test_page_browser import DESKTOP, WAIT_MS, _open
from tests.audit.helpers import figures

# On the worker's one loop, sharing its Playwright driver (tests/admin/browser_session.py).
pytestmark = pytest.mark.asyncio(loop_scope="session")
browser = browser_session.browser
sim_factory, sim = browser_session.sim_factory, browser_session.sim
agent = browser_session.agent


async def test_the_page_shows_the_last_read_the_columns_out_and_the_mismatch(
    agent: Any, admin_server: Any, browser: Browser
) -> None:
    answers = [figures((2, 300), columns={"A1": (150, 0, 0), "A2": (250, 0, 0)}),
               figures((4, 600), columns={"A1": (150, 1, 1), "A2": (250, 3, 3)})]

    async def read_file() -> bytes:
        return b"an audit file"

    port = Port(read_file, lambda _: answers.pop(0))
    conf = {"trigger": "lobby", "planogram": {"A1": 5, "A2": 3}, "low_stock": 1}
    books = AuditReads(agent, conf, port)
    await books.start()
    agent.components.append(books)
    await books.read_once()
    await books.read_once()
    page, seen = await _open(browser, admin_server.url, DESKTOP, READ_TOKEN)
    card = page.locator("#audit")
    await expect(card.locator("[data-audit=sold-out]")).to_have_text("A2", timeout=WAIT_MS)
    await expect(card.locator("[data-audit=low]")).to_have_text("none")
    mismatch = books.mismatches()[0].text()
    await expect(card.locator("[data-audit=mismatch]")).to_contain_text(mismatch)
    await expect(page.locator("#problems")).to_contain_text("audit mismatch on lobby")
    assert seen.errors == []


async def test_the_page_says_the_machines_books_reset_once_as_the_store_holds_it(
    agent: Any, admin_server: Any, browser: Browser
) -> None:
    answers = [figures((40, 6000))]

    async def read_file() -> bytes:
        return b"an audit file"

    books = AuditReads(agent, {"trigger": "lobby"}, Port(read_file, lambda _: answers.pop(0)))
    await books.start()
    agent.components.append(books)
    await books.read_once()
    page, seen = await _open(browser, admin_server.url, DESKTOP, READ_TOKEN)
    card = page.locator("#audit")
    await expect(card.locator("[data-audit=last-read]")).not_to_have_text("none yet",
                                                                         timeout=WAIT_MS)
    answers.append(figures((1, 150)))  # its DA2 went down: the machine's books went back
    await books.read_once()
    stored = books.store.last_comparison()
    assert stored is not None
    assert (stored.verdict, stored.cause) == ("books_reset", "reinitialised")
    await expect(card.locator("[data-audit=books-reset]")).to_have_text(
        stored.text(), timeout=WAIT_MS
    )
    # no mismatch, yet not "no mismatch" in green: the interval was not checked
    await expect(card.locator("[data-audit=mismatch]")).to_have_text(
        "no mismatch; not checked since the machine's books were reset (below)")
    await expect(card.locator("[data-audit=mismatch]")).not_to_have_class("good")
    await expect(card.locator("[data-audit=not-compared]")).to_have_count(0)
    # no problem; said once in the page's event log, as health holds it
    await expect(page.locator("#problems")).not_to_contain_text("lobby")
    said = page.locator("#events li", has_text="lobby: the machine's books were reset")
    await expect(said).to_have_count(1, timeout=WAIT_MS)
    await expect(said).to_contain_text(stored.text())
    # the next read compares again (nothing sold since): the store's latest is a match, and the
    # card's line goes
    answers.append(figures((1, 150)))
    await books.read_once()
    latest = books.store.last_comparison()
    assert latest is not None
    assert latest.verdict == "match"
    await expect(card.locator("[data-audit=books-reset]")).to_have_count(0, timeout=WAIT_MS)
    await expect(card.locator("[data-audit=mismatch]")).to_have_text("no mismatch")
    await expect(said).to_have_count(1)
    assert seen.errors == []
