"""Whose vend a kiosk app may report: an attack on the restart's hearing from outside.

After a restart, recovery listens for the result of each vend the last run left in flight
(sales/recovery.py), and the kiosk API takes an app's ``POST /sales/{id}/dispensed`` for a sale
it no longer knows as that result (platforms/base.py ``LateVends.restart_result``). A unit with
two kiosk apps (two triggers, each its own token and port): the tea the till's app was
dispensing when the agent stopped is the till's to report, not the screen's. Real agents on the
simulator over HTTP, a journal on disk."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from kiosk_agent.platforms.kiosk_api import KioskApi
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.models import TransactionFilter, TransStatus
from tests.helpers import until
from tests.platforms.agent_rig import running_agent

from .test_kiosk_api import TOKEN, App

TILL_TOKEN = "till-app-token-9876543210abcdef"


class _Till(App):
    """The second app: its own token."""

    async def post(self, path: str, body: Any, token: str = TILL_TOKEN) -> tuple[int, Any]:
        return await super().post(path, body, token)


async def _two_apps(tmp_path: Path, sim_settings: Any) -> AsyncIterator[tuple[App, App]]:
    """One agent, two kiosk apps that confirm their dispenses: ``screen`` (SIM-0001) and
    ``till`` (SIM-0002), each with a vend timeout of 30 s."""
    triggers = [
        {"platform": "kiosk_api", "name": name, "token": f"!secret {name}_token", "port": 0,
         "terminal": terminal, "products": {"coffee": "2.50", "tea": "1.75"},
         "confirm_dispense": True, "vend_timeout": 30}
        for name, terminal in (("screen", "SIM-0001"), ("till", "SIM-0002"))
    ]
    secrets = {"screen_token": TOKEN, "till_token": TILL_TOKEN}
    terminals = {"terminals": [{"device_id": "SIM-0001", "name": "front"},
                               {"device_id": "SIM-0002", "name": "till"}]}
    async with running_agent(tmp_path, sim_settings, triggers, secrets=secrets,
                             sections=terminals) as agent:
        screen, till = agent.platforms
        assert isinstance(screen, KioskApi)
        assert isinstance(till, KioskApi)
        async with aiohttp.ClientSession() as session:
            yield App(screen, session), _Till(till, session)


def _dispensing(app: App, sale_id: str) -> bool:
    record = app.api.agent.journal.get(sale_id)
    return record is not None and record.state is SaleState.DISPENSING


async def test_an_app_cannot_report_another_apps_vend_left_in_flight(
    tmp_path: Path, sim_settings: Any
) -> None:
    """The agent stops while the till's app dispenses a tea (the drain runs out: the sale
    parked dispensing). The next start listens for the till's result. The screen's app, with
    its own token, posts "vended" for that sale id (an id it learned elsewhere, or a bug): it
    was taken as the till's machine's word and the tea paid (the sale completed, its $1.75
    kept), money taken for a vend its own machine never confirmed. Now the screen is told the
    sale is not its own (404, as every other route of the kiosk API says of another app's
    sale), recovery still listens, and the till's own "failed" gives the money back."""
    sale_id = ""
    async for _screen, till in _two_apps(tmp_path, sim_settings):
        _, started = await till.post("/sales", {"product": "tea"})
        sale_id = started["sale_id"]
        await until(functools.partial(_dispensing, till, sale_id))
        await till.api.agent.sales.stop(grace=0.05)  # parked where it stands
    async for screen, till in _two_apps(tmp_path, sim_settings):
        agent = screen.api.agent
        assert agent.sales.listening_after_restart(sale_id) is not None

        status, answer = await screen.post(f"/sales/{sale_id}/dispensed", {"status": "vended"})

        assert status == 404, answer
        assert answer["message"] == "no such sale from this kiosk", answer
        assert agent.sales.listening_after_restart(sale_id) is not None  # still the till's
        assert agent.journal.get(sale_id).state is SaleState.DISPENSING
        status, _ = await till.post(f"/sales/{sale_id}/dispensed", {"status": "failed"})
        assert status == 202
        await asyncio.wait_for(agent.recovery.wait(), 30)
        final = agent.journal.get(sale_id)
        assert final is not None
        # a charge-card takes the money at once: all of it given back
        assert (final.state, final.reversed_cents) == (SaleState.REVERSED, 175), final.message
        query = TransactionFilter(order_id=final.order_id)
        rows = [t async for t in agent.service.reporting.transactions(query)]
        assert [r.status for r in rows] == [TransStatus.VOIDED]
        results = [s.detail for s in agent.journal.steps(sale_id) if s.step == Step.DISPENSE_RESULT]
        assert [r["status"] for r in results] == ["failed"], results
