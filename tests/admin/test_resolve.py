"""The admin API's view of recovery and of ATTENTION sales, and a person's resolution."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.app import load_agent
from kiosk_agent.core.sale import SaleState
from tests.core.test_recovery import leave_open

from .conftest import ADMIN_TOKEN, READ_TOKEN, write_config

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
READER = {"Authorization": f"Bearer {READ_TOKEN}"}


@pytest.fixture
async def api(tmp_path: Path, sim_settings: Any) -> AsyncIterator[tuple[Any, Any]]:
    """An agent whose journal holds one ATTENTION sale, ``crashed1``, and its admin API."""
    leave_open(tmp_path, state=SaleState.ATTENTION, answer_by=time.time() - 1)
    agent = load_agent(write_config(tmp_path), sim_settings, systemd=False)
    await agent.start()
    admin = next(c for c in agent.components if type(c).__name__ == "AdminServer")
    async with aiohttp.ClientSession(base_url=admin.url) as session:
        yield agent, session
    await agent.stop()


async def test_status_says_when_recovery_has_finished(api: tuple[Any, Any]) -> None:
    agent, session = api
    await agent.recovery.wait()
    async with session.get("/api/status", headers=READER) as response:
        status = await response.json()
    assert status["recovery"]["state"] == "done"
    assert status["recovery"]["finished_at"] >= status["recovery"]["started_at"]
    assert status["sales"]["attention"] == 1
    assert status["attention"]["errors"] == 0


async def test_an_admin_resolves_an_attention_sale(api: tuple[Any, Any]) -> None:
    agent, session = api
    body = {"as": "reversed", "why": "refunded by hand at the machine"}
    async with session.post("/api/sales/crashed1/resolve", json=body, headers=READER) as answer:
        assert answer.status == 403  # a read token cannot decide about money
    async with session.post("/api/sales/crashed1/resolve", json=body, headers=ADMIN) as answer:
        assert answer.status == 200
        sale = (await answer.json())["sale"]
    assert sale["state"] == "reversed"
    assert sale["resolution"]["as"] == "reversed"
    assert sale["resolution"]["by"] == "admin API (ops)"
    assert sale["resolution"]["why"] == "refunded by hand at the machine"
    async with session.get("/api/sales/crashed1", headers=READER) as answer:
        shown = await answer.json()
    assert shown["sale"]["resolution"]["why"] == "refunded by hand at the machine"
    assert shown["steps"][-1]["step"] == "attention.resolved"
    assert agent.health.snapshot().sales.attention == 0
    async with session.post("/api/sales/crashed1/resolve", json=body, headers=ADMIN) as answer:
        assert answer.status == 409
        assert "not attention" in (await answer.json())["detail"]


@pytest.mark.parametrize(
    ("path", "body", "status", "detail"),
    [
        ("/api/sales/crashed1/resolve", {"as": "voided", "why": "x"}, 400, "one of captured"),
        ("/api/sales/crashed1/resolve", {"as": "reversed"}, 400, '"why"'),
        ("/api/sales/crashed1/resolve", {"as": "reversed", "why": " "}, 400, "say why"),
        ("/api/sales/crashed1/resolve", {"as": 1, "why": "x"}, 400, '"as"'),
        ("/api/sales/nope/resolve", {"as": "reversed", "why": "x"}, 404, "no sale 'nope'"),
    ],
)
async def test_a_resolution_names_what_was_wrong(
    api: tuple[Any, Any], path: str, body: dict[str, Any], status: int, detail: str
) -> None:
    _agent, session = api
    async with session.post(path, json=body, headers=ADMIN) as answer:
        assert answer.status == status
        assert detail in (await answer.json())["detail"]
