"""A flood of event streams never locks the kiosk app's sales out.

Streams take their own slots (``http.max_streams``), apart from the connections requests use;
a client that never reads, or sends a frame the app never would, costs a bounded amount.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.platforms.kiosk_api import KioskApi
from kiosk_agent.service.models import TransactionFilter, TransStatus
from kiosk_agent.web.server import MAX_STREAM_FRAME

from .agent_rig import running_agent

TOKEN = "kiosk-app-token-0123456789"
STREAMS = 8
WAIT_S = 30.0  # a hang's guard, not a bound


@pytest.fixture
async def agent(tmp_path: Path, sim_settings: Any) -> AsyncIterator[Agent]:
    trigger = {"platform": "kiosk_api", "name": "screen", "token": "!secret kiosk_token",
               "port": 0, "products": {"coffee": "2.50"}}
    async with running_agent(
        tmp_path, sim_settings, [trigger], secrets={"kiosk_token": TOKEN},
        sections={"http": {"max_connections": 8, "max_streams": STREAMS}},
    ) as running:
        yield running


async def test_every_stream_slot_taken_and_a_sale_is_still_served_at_once(agent: Agent) -> None:
    [api] = agent.platforms
    assert isinstance(api, KioskApi)
    base = f"http://127.0.0.1:{api.port}/api/v1"
    site = api._site
    async with aiohttp.ClientSession() as flood, aiohttp.ClientSession() as app:
        # every stream slot taken by sockets that never read, and more knocking
        sockets = [await flood.ws_connect(f"{base}/events?token={TOKEN}") for _ in range(STREAMS)]
        assert site.streams == STREAMS
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await flood.ws_connect(f"{base}/events?token={TOKEN}")
        assert refused.value.status == 503

        # the honest app's sale is served at once: while every stream slot is still taken (a
        # sale that waited for a slot would wait for ever; a bound of 2 s of wall time on the
        # answer was passed at load 11-15), and runs to its end
        async with asyncio.timeout(WAIT_S), app.post(
            f"{base}/sales", json={"product": "coffee"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as response:
            assert response.status == 202
            started = await response.json()
        assert site.streams == STREAMS
        async with asyncio.timeout(10):
            while True:
                async with app.get(f"{base}/sales/{started['sale_id']}",
                                   headers={"Authorization": f"Bearer {TOKEN}"}) as response:
                    if (await response.json())["final"]:
                        break
                await asyncio.sleep(0.05)
        rows = [t async for t in agent.service.reporting.transactions(
            TransactionFilter(order_id=started["order_id"]))]
        assert [r.status for r in rows] == [TransStatus.CAPTURED]

        # a frame the app never sends is refused before it is buffered: the socket is closed
        big = sockets.pop()
        await big.send_bytes(b"x" * (MAX_STREAM_FRAME * 64))
        async with asyncio.timeout(5):
            while (await big.receive()).type not in (aiohttp.WSMsgType.CLOSE,
                                                     aiohttp.WSMsgType.CLOSED):
                pass  # the sale's steps it had not read yet
        assert big.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
        for ws in sockets:
            await ws.close()
    async with asyncio.timeout(5):
        while site.streams:  # every slot is given back when the streams close
            await asyncio.sleep(0.02)
