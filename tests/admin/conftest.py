"""A real agent on the simulator, with the admin API and the webhook receiver on loopback."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Playwright, async_playwright

from kiosk_agent.app import load_agent
from tests.admin.chromium import CHROMIUM, SharedChromium, connect

ADMIN_TOKEN = "admin-token-0123456789abcdef"
READ_TOKEN = "read-token-0123456789abcdefgh"
WEBHOOK_SECRET = "whsec_0123456789"
KIOSK_TOKEN = "kiosk-app-token-0123456789"

CONFIG = """
service:
  simulator: {time_scale: 50}
terminals:
  - device_id: SIM-0001
    name: front
  - device_id: SIM-0007
    name: printer
journal: {path: journal.db}
health: {ping_interval: 3600}
admin:
  port: 0
  tokens:
    - {name: ops, token: !secret admin_token}
    - {name: grafana, token: !secret read_token, role: read}
webhooks:
  port: 0
  secret: !secret webhook_secret
"""


@pytest.fixture(scope="session")
def shared_chromium() -> Iterator[SharedChromium]:
    """One chromium for this pytest worker's browser tests, stopped at the session's end."""
    chromium = SharedChromium()
    yield chromium
    chromium.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def playwright() -> AsyncIterator[Playwright]:
    """The worker's one Playwright driver (tests/admin/browser_session.py), started at its first
    browser test. Defined here, once: a module that took it as its own attribute made a driver of
    its own (three in one worker), and a whole run's worker once hung at its end in a driver's
    stop. The stop is bounded: a driver that does not answer it ends with the worker."""
    driver = await async_playwright().start()
    yield driver
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(driver.stop(), 10)


@pytest.fixture
async def browser(shared_chromium: SharedChromium) -> AsyncIterator[Browser]:
    """The worker's chromium over CDP: each test opens its own contexts, which closing the
    connection throws away (chromium keeps running); a chromium that died is started again."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `./dev test` installs it (apt-get)")
    async with async_playwright() as playwright:
        browser = await connect(playwright, shared_chromium)
        yield browser
        await browser.close()


def write_config(directory: Path, extra: str = "") -> Path:
    (directory / "secrets.yaml").write_text(
        f"admin_token: {ADMIN_TOKEN}\nread_token: {READ_TOKEN}\nwebhook_secret: {WEBHOOK_SECRET}\n"
        f"kiosk_token: {KIOSK_TOKEN}\n"
    )
    (directory / "secrets.yaml").chmod(0o600)
    path = directory / "config.yaml"
    path.write_text(CONFIG + extra)
    return path


@pytest.fixture
async def agent(tmp_path: Path, sim_settings: Any) -> AsyncIterator[Any]:
    agent = load_agent(write_config(tmp_path), sim_settings, systemd=False)
    await agent.start()
    yield agent
    await agent.stop()


def _component(agent: Any, class_name: str) -> Any:
    return next(c for c in agent.components if type(c).__name__ == class_name)


@pytest.fixture
def admin_server(agent: Any) -> Any:
    return _component(agent, "AdminServer")


@pytest.fixture
def webhook_receiver(agent: Any) -> Any:
    return _component(agent, "WebhookReceiver")


@pytest.fixture
def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def read_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {READ_TOKEN}"}


@pytest.fixture
def webhook_secret() -> str:
    return WEBHOOK_SECRET


@pytest.fixture
async def api(admin_server: Any) -> Any:
    # unsafe=True: keep cookies for 127.0.0.1 (an IP host), as a browser does
    async with aiohttp.ClientSession(
        base_url=admin_server.url, cookie_jar=aiohttp.CookieJar(unsafe=True)
    ) as session:
        yield session
