"""End to end: the simulator delivers signed boarding webhooks (duplicated and reordered by its
chaos mode) to the receiver, which is restarted mid-stream; the final merchant states must equal
what the boarding API says, with every event stored exactly once."""

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

from kiosk_agent.admin.webhooks import WebhookReceiver
from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models.boarding import MerchantCreate

from ..helpers import free_port

SECRET = "whsec_sim_end_to_end"


async def _all_delivered(http: aiohttp.ClientSession, base_url: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 20
    while True:
        async with http.get(f"{base_url}/sim/events") as response:
            events = (await response.json())["items"]
        if events and all(e["delivered"] for e in events):
            return events
        assert time.monotonic() < deadline, "the simulator did not deliver every event"
        await asyncio.sleep(0.05)


async def test_simulator_deliveries_survive_duplicates_reordering_and_a_restart(
    tmp_path: Path, sim_factory
) -> None:
    port = free_port()
    conf = {"secret": SECRET, "port": port, "store": str(tmp_path / "hooks.db")}
    receiver = WebhookReceiver(SimpleNamespace(), conf)
    await receiver.start()
    sim = await sim_factory(webhook_url=receiver.url, webhook_secret=SECRET, chaos=True, seed=3)
    settings = settings_from_ready(sim.ready_info())
    base = settings.base_url
    async with ServiceClient(settings) as service, aiohttp.ClientSession() as http:

        async def force(merchant_id: int, status: str) -> None:
            url = f"{base}/sim/merchants/{merchant_id}/status"
            async with http.post(url, json={"merchant_status": status}) as response:
                assert response.status == 200, await response.text()

        merchants = [
            await service.boarding.create(MerchantCreate(dba_name=f"Kiosk {n}")) for n in range(4)
        ]
        ids = [m.merchant_id for m in merchants]
        for merchant_id in ids:
            await service.boarding.update(merchant_id, status="sent_for_signature")
        await force(ids[0], "signed")
        # the receiver goes away for a moment: deliveries fail and are retried
        await receiver.stop()
        await force(ids[0], "in_underwriting")
        await force(ids[1], "declined")
        await asyncio.sleep(0.1)
        receiver = WebhookReceiver(SimpleNamespace(), conf)
        await receiver.start()
        await force(ids[0], "boarded")
        await force(ids[0], "live")
        await force(ids[2], "deleted")
        events = await _all_delivered(http, base)

        try:
            states = {m["merchant_id"]: m for m in receiver.merchants()}
            for merchant_id in ids:
                if merchant_id == ids[2]:
                    assert states[merchant_id]["deleted"] is True
                    continue
                truth = await service.boarding.get(merchant_id)
                assert states[merchant_id]["status_id"] == truth.merchant_status_id
                assert states[merchant_id]["mid"] == truth.mid
            assert states[ids[0]]["status"] == "live"
            assert states[ids[1]]["status"] == "declined"
            assert states[ids[3]]["status"] == "sent_for_signature"
            # every event stored once, whatever the duplicates
            assert len(receiver.store) == len(events)
            retried = [e for e in events if e["attempts"] > 1]
            assert retried, "the restart should have made the simulator retry"
        finally:
            await receiver.stop()
