"""Browser tests on the worker's one event loop, sharing one Playwright driver.

Playwright's Python side talks to a Node.js driver process; ``async_playwright()`` starts one
(0.37 s of CPU on this machine, most of what a browser test spent besides its agent) and its
objects belong to the event loop that started it. A test module whose tests share the
worker's driver runs its tests, and the async fixtures they use, on the session's loop::

    pytestmark = pytest.mark.asyncio(loop_scope="session")
    browser, sim, sim_factory = browser_session.browser, browser_session.sim, ...

and declares its own async fixtures with ``@pytest_asyncio.fixture(loop_scope="session")``
(the driver itself, ``playwright``, is tests/admin/conftest.py's: one definition, one driver)
(each still made and ended for each test: only the loop is shared). ``browser`` is then a
fresh CDP connection to the worker's chromium for each test, as tests/admin/conftest.py's is,
through the shared driver.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Playwright

from kiosk_agent.app import load_agent
from kiosk_agent.service.settings import ServiceSettings
from kiosk_agent.sim.server import SimServer
from tests.admin.chromium import CHROMIUM, SharedChromium, connect
from tests.admin.conftest import write_config
from tests.conftest import SimFactory, simulators


@pytest_asyncio.fixture(loop_scope="session")
async def browser(
    shared_chromium: SharedChromium, playwright: Playwright
) -> AsyncIterator[Browser]:
    """The worker's chromium over CDP, a connection of the test's own: each test opens its own
    contexts, which closing the connection throws away (chromium keeps running)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `./dev test` installs it (apt-get)")
    connected = await connect(playwright, shared_chromium)
    yield connected
    await connected.close()


@pytest_asyncio.fixture(loop_scope="session")
async def sim_factory() -> AsyncIterator[SimFactory]:
    """tests/conftest.py's ``sim_factory``, on the session's loop."""
    async with simulators() as start:
        yield start


@pytest_asyncio.fixture(loop_scope="session")
async def sim(sim_factory: SimFactory) -> SimServer:
    """tests/conftest.py's ``sim``, on the session's loop."""
    return await sim_factory(seed=1)


@pytest_asyncio.fixture(loop_scope="session")
async def agent(tmp_path: Path, sim_settings: ServiceSettings) -> AsyncIterator[Any]:
    """tests/admin/conftest.py's ``agent``, on the session's loop."""
    started = load_agent(write_config(tmp_path), sim_settings, systemd=False)
    await started.start()
    yield started
    await started.stop()
