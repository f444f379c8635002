"""The worker's shared chromium: a test's closed connection leaves it running, a dead one is
started again, and stopping it leaves no process and no profile behind."""

import os
import signal
import socket
from pathlib import Path

import pytest
from playwright.async_api import Browser, Playwright
from playwright.async_api import Error as PlaywrightError

from tests.admin.chromium import ChromiumStartError, SharedChromium, connect, running_in_group

# The async tests attach through the worker's Playwright driver, on its loop
# (tests/admin/browser_session.py), as the browser tests do: not a driver of their own each.
on_the_drivers_loop = pytest.mark.asyncio(loop_scope="session")


async def _read_heading(browser: Browser) -> str:
    context = await browser.new_context()
    page = await context.new_page()
    await page.goto("data:text/html,<h1>shared</h1>")
    return await page.inner_text("h1")


@on_the_drivers_loop
async def test_closing_a_test_s_connection_leaves_the_shared_chromium_running(
    shared_chromium: SharedChromium, playwright: Playwright
) -> None:
    endpoint = shared_chromium.endpoint()
    process = shared_chromium.process
    first = await playwright.chromium.connect_over_cdp(endpoint)
    assert await _read_heading(first) == "shared"
    await first.close()

    assert process is not None
    assert process.poll() is None
    assert shared_chromium.endpoint() == endpoint
    second = await playwright.chromium.connect_over_cdp(endpoint)
    left = [page.url for context in second.contexts for page in context.pages]
    assert not [url for url in left if url.startswith("data:")]  # the first one's are gone
    assert await _read_heading(second) == "shared"
    await second.close()


@on_the_drivers_loop
async def test_a_chromium_that_died_is_started_again_and_stop_leaves_nothing_behind(
    playwright: Playwright,
) -> None:
    chromium = SharedChromium()
    try:
        first_endpoint = chromium.endpoint()
        first = chromium.process
        assert first is not None
        profile = Path(chromium._profile)
        assert profile.is_dir()
        os.killpg(first.pid, signal.SIGKILL)  # a crash, as the next test would find it
        first.wait()

        second_endpoint = chromium.endpoint()
        assert chromium.starts == 2
        assert second_endpoint != first_endpoint
        assert not profile.exists()  # the dead one's profile went with it
        browser = await playwright.chromium.connect_over_cdp(second_endpoint)
        assert await _read_heading(browser) == "shared"
        await browser.close()
    finally:
        second = chromium.process
        second_profile = Path(chromium._profile)
        chromium.stop()
    assert second is not None
    assert second.returncode is not None
    assert not second_profile.exists()
    assert running_in_group(second.pid) == []  # no renderer or zygote left behind


def test_a_chromium_that_never_listens_is_a_clear_error() -> None:
    chromium = SharedChromium(executable="/bin/false")
    with pytest.raises(ChromiumStartError, match=r"/bin/false printed no 'DevTools listening"):
        chromium.endpoint()
    assert chromium.process is None


@on_the_drivers_loop
async def test_an_attach_that_hangs_is_tried_again_on_a_chromium_started_anew(
    playwright: Playwright,
) -> None:
    """The first endpoint accepts the connection and never answers (a chromium hung while
    attaching): it is stopped, a new one started, and the test gets a browser from that."""
    silent = socket.create_server(("127.0.0.1", 0))  # listens, never speaks WebSocket
    port = silent.getsockname()[1]

    class HangsFirst(SharedChromium):
        def endpoint(self) -> str:
            if self.starts == 0 and self.attach_failures == 0:
                return f"ws://127.0.0.1:{port}/devtools/browser/hung"
            return super().endpoint()

    chromium = HangsFirst()
    try:
        browser = await connect(playwright, chromium, timeout_s=1.0)
        assert await _read_heading(browser) == "shared"
        await browser.close()
        assert chromium.attach_failures == 1
        assert chromium.starts == 1
    finally:
        chromium.stop()
        silent.close()


@on_the_drivers_loop
async def test_a_second_attach_that_fails_fails_the_test(playwright: Playwright) -> None:
    silent = socket.create_server(("127.0.0.1", 0))
    port = silent.getsockname()[1]

    class AlwaysHangs(SharedChromium):
        def endpoint(self) -> str:
            return f"ws://127.0.0.1:{port}/devtools/browser/hung"

    try:
        with pytest.raises(PlaywrightError, match=r"[Tt]imeout"):
            await connect(playwright, AlwaysHangs(), timeout_s=0.5)
    finally:
        silent.close()
