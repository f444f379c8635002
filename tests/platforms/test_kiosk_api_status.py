"""The kiosk API's status says whether card payment works now, and why not (out of service)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from ..helpers import sim_call, until
from .agent_rig import running_agent
from .test_kiosk_api import TOKEN, App

QUICK_HEALTH = {"health": {"ping_interval": 1, "hold_off": 0, "recheck_interval": 0.1}}


async def test_status_says_card_payment_is_unavailable_and_why(
    tmp_path: Path, sim: Any, sim_settings: Any
) -> None:
    trigger = {"platform": "kiosk_api", "name": "screen", "token": "!secret kiosk_token",
               "port": 0, "products": {"coffee": "2.50"}}
    async with (
        running_agent(tmp_path, sim_settings, [trigger], secrets={"kiosk_token": TOKEN},
                      sections=QUICK_HEALTH) as agent,
        aiohttp.ClientSession() as session,
    ):
        app = App(agent.platforms[0], session)
        status, body = await app.get("/status")
        assert status == 200
        assert body["card_payment"]["available"] is True

        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/offline")
        await until(lambda: not app.api.card_payment()["available"], timeout=3)
        _, body = await app.get("/status")
        assert body["card_payment"]["available"] is False
        assert body["card_payment"]["reason"] == "terminal offline"
        assert body["card_payment"]["terminal"] == "SIM-0001"

        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/online")
        await until(lambda: app.api.card_payment()["available"], timeout=2)
