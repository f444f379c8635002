"""The kiosk app's side of a real agent process: its token, its trigger and its calls.

Shared by the tests that drive a `kiosk-agent run` through the kiosk API (tests/cli/
test_agent_drain.py, tests/fleet/test_commands.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from .agent_process import write_config

TOKEN = "kiosk-app-token-0123456789"


def configured(directory: Path, sim: Any, journal: Path, trigger: str, stop_timeout: float) -> Path:
    """The process helpers' configuration, with the trigger and a drain of ``stop_timeout``."""
    path = write_config(directory, sim, journal, trigger)
    text = path.read_text()
    path.write_text(
        text.replace("sales: {", f"sales: {{stop_timeout: {stop_timeout}, vend_timeout: 60, ")
    )
    return path


def kiosk_app(vend_timeout: float = 60) -> str:
    """A touchscreen kiosk whose app confirms each dispense (POST .../dispensed) within
    ``vend_timeout`` seconds (also how long a restart listens for a confirmation)."""
    return f"""\
triggers:
  - platform: kiosk_api
    name: screen
    token: !env_var KIOSK_APP_TOKEN
    port: 0
    confirm_dispense: true
    vend_timeout: {vend_timeout}
    products: {{coffee: "2.50"}}
"""


class App:
    """The kiosk app's side of the API, on the port the agent logged."""

    def __init__(self, session: aiohttp.ClientSession, port: int) -> None:
        self.session = session
        self.base = f"http://127.0.0.1:{port}/api/v1"

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any, Any]:
        async with self.session.request(
            method, self.base + path, json=body, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as response:
            return response.status, await response.json(), response.headers

    async def buy_coffee(self) -> str:
        status, body, _ = await self.call("POST", "/sales", {"product": "coffee"})
        assert status == 202, body
        return str(body["sale_id"])
