"""The kiosk API's status says whether card payment works now, and why not (out of service)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

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


async def test_a_sale_is_refused_at_once_while_out_of_service(
    tmp_path: Path, sim: Any, sim_settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    trigger = {"platform": "kiosk_api", "name": "screen", "token": "!secret kiosk_token",
               "port": 0, "products": {"coffee": "2.50"}}
    async with (
        running_agent(tmp_path, sim_settings, [trigger], secrets={"kiosk_token": TOKEN},
                      sections=QUICK_HEALTH) as agent,
        aiohttp.ClientSession() as session,
    ):
        app = App(agent.platforms[0], session)
        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/offline")
        await until(lambda: not agent.availability.state().available, timeout=3)

        for body in ({"product": "coffee"}, {"amount": "1.00", "terminal": "front"}):
            status, answer = await app.post("/sales", body)
            assert status == 503
            assert answer == {
                "error": "out_of_service",
                "field": "terminal",
                "message": "card payment unavailable on SIM-0001: terminal offline",
                "reason": "terminal offline",
                "terminal": "SIM-0001",
            }
        assert list(agent.journal) == []  # nothing journaled, nothing sent to the terminal
        assert app.api.status()["refused_out_of_service"] == 2
        async with session.post(f"{app.base}/sales", json={"product": "coffee"},
                                headers={"Authorization": f"Bearer {TOKEN}"}) as response:
            assert response.status == 503
            assert response.headers["Retry-After"] == "1"

        # an app that keeps trying: each try refused, a few log lines, still nothing journaled
        with caplog.at_level(logging.INFO, logger="kiosk_agent.platforms.kiosk_api"):
            answers = await asyncio.gather(
                *(app.post("/sales", {"product": "coffee"}) for _ in range(100))
            )
        assert {status for status, _ in answers} == {503}
        refused_lines = [r for r in caplog.records if "sale refused" in r.getMessage()]
        assert len(refused_lines) <= 5
        assert list(agent.journal) == []
        # a bad body is still a 400 naming the field; an unknown terminal too
        status, answer = await app.post("/sales", {"amount": "abc"})
        assert (status, answer["field"]) == (400, "amount")
        status, answer = await app.post("/sales", {"amount": "1.00", "terminal": "nope"})
        assert (status, answer["field"]) == (400, "terminal")

        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/online")
        await until(lambda: agent.availability.state().available, timeout=3)
        status, answer = await app.post("/sales", {"product": "coffee"})
        assert status == 202
        assert [r.sale_id for r in agent.journal] == [answer["sale_id"]]
