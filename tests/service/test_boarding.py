"""Boarding against the simulator: every merchant call, and webhooks received end to end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.errors import BadRequestError, ConflictError, NotFoundError
from kiosk_agent.service.models.boarding import (
    Merchant,
    MerchantCreate,
    MerchantFilter,
    MerchantReason,
    MerchantStatus,
    MerchantUpdate,
)
from kiosk_agent.service.webhooks import (
    MemoryIdempotencyStore,
    MerchantStateReducer,
    Receipt,
    WebhookPayloadError,
    WebhookProcessor,
    WebhookSignatureError,
)
from kiosk_agent.sim.server import SimServer
from kiosk_agent.sim.webhooks import dispatcher_for

from ..helpers import until

SECRET = "whsec_boarding_test"


async def test_create_get_and_update_a_merchant(service: ServiceClient) -> None:
    created = await service.boarding.create(
        MerchantCreate(dba_name="Corner Snacks", legal_name="Corner Snacks LLC")
    )
    assert isinstance(created, Merchant)
    assert created.status is MerchantStatus.NEW
    assert created.mid is None  # no mid until boarded
    assert created.created is not None

    fetched = await service.boarding.get(created.merchant_id)
    assert fetched.dba_name == "Corner Snacks"
    assert fetched.legal_name == "Corner Snacks LLC"

    sent = await service.boarding.update(created.merchant_id, status="sent_for_signature")
    assert sent.status is MerchantStatus.SENT_FOR_SIGNATURE
    resent = await service.boarding.update(created.merchant_id, status="sent_for_signature")
    assert resent.status is MerchantStatus.SENT_FOR_SIGNATURE
    retracted = await service.boarding.update(
        created.merchant_id, MerchantUpdate(merchant_status=MerchantStatus.NEW)
    )
    assert retracted.status is MerchantStatus.NEW

    renamed = await service.boarding.update(created.merchant_id, dba_name="Corner Snacks 2")
    assert renamed.dba_name == "Corner Snacks 2"
    assert renamed.updated is not None
    assert created.updated is not None
    assert renamed.updated >= created.updated


async def test_moves_the_api_may_not_make_are_refused(service: ServiceClient) -> None:
    merchant = await service.boarding.create(MerchantCreate(dba_name="Vend-o-Matic"))
    with pytest.raises(BadRequestError, match="merchant_status"):
        await service.boarding.update(merchant.merchant_id, status="live")
    with pytest.raises(NotFoundError):
        await service.boarding.get(999_999_999)
    with pytest.raises(ValueError, match="merchant_status") as typo:
        await service.boarding.update(merchant.merchant_id, status="aproved")
    assert "expected a merchant status (new, sent_for_signature" in str(typo.value)
    assert "aproved" not in str(typo.value)  # a refused value is never echoed back
    with pytest.raises(ValueError, match="nothing to update"):
        await service.boarding.update(merchant.merchant_id)


async def test_merchants_list_pages_and_filters(service: ServiceClient) -> None:
    made = [
        await service.boarding.create(MerchantCreate(dba_name=f"Kiosk {n}", external_crm_id="crm"))
        for n in range(7)
    ]
    await service.boarding.update(made[0].merchant_id, status="sent_for_signature")

    everyone = [m async for m in service.boarding.merchants(page_size=3)]
    assert {m.merchant_id for m in made} <= {m.merchant_id for m in everyone}
    assert len({m.merchant_id for m in everyone}) == len(everyone)

    out = [
        m
        async for m in service.boarding.merchants(
            MerchantFilter(merchant_status_id="sent_for_signature")
        )
    ]
    assert made[0].merchant_id in {m.merchant_id for m in out}
    assert {m.status for m in out} == {MerchantStatus.SENT_FOR_SIGNATURE}

    named = [m async for m in service.boarding.merchants(MerchantFilter(dba_name="Kiosk 4"))]
    assert [m.merchant_id for m in named] == [made[4].merchant_id]
    assert len([m async for m in service.boarding.merchants(limit=2)]) == 2


# -- webhooks from the simulator, received for real ----------------------------------------------


class Receiver:
    """A webhook endpoint on 127.0.0.1 that answers like the agent's receiver should."""

    def __init__(self, processor: WebhookProcessor) -> None:
        self.processor = processor
        self.receipts: list[Receipt] = []
        self.refused: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            receipt = await self.processor.process(raw, request.headers)
        except WebhookSignatureError as err:
            self.refused.append(str(err))
            return web.json_response({"error": str(err)}, status=401)
        except WebhookPayloadError as err:
            self.refused.append(str(err))
            return web.json_response({"error": str(err)}, status=400)
        self.receipts.append(receipt)
        return web.json_response({"ok": True})


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    hook = Receiver(WebhookProcessor(SECRET, MemoryIdempotencyStore(), MerchantStateReducer()))
    app = web.Application()
    app.router.add_post("/hooks", hook.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield hook, f"http://127.0.0.1:{port}/hooks"
    await runner.cleanup()


async def sim_post(sim: SimServer, path: str, body: dict[str, Any]) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{sim.base_url}{path}", json=body) as response,
    ):
        assert response.status == 200, await response.text()


async def wait_delivered(sim: SimServer, *, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Until every event the simulator made has been delivered; its ``/sim/events`` list."""
    deadline = asyncio.get_running_loop().time() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(f"{sim.base_url}/sim/events") as response:
                events: list[dict[str, Any]] = (await response.json())["items"]
            if events and all(event["delivered"] for event in events):
                return events
            assert asyncio.get_running_loop().time() < deadline, events
            await asyncio.sleep(0.05)


async def test_reordered_and_duplicated_webhooks_end_in_the_services_state(
    sim_factory: Any, receiver: tuple[Receiver, str]
) -> None:
    hook, url = receiver
    sim = await sim_factory(seed=5, webhook_url=url, webhook_secret=SECRET, chaos=True)
    assert sim.ctx is not None
    dispatcher = dispatcher_for(sim.ctx)
    # the events are made as one burst, however slow the machine: chaos then reorders them by
    # its seeded delays (2 simulated seconds at most, 40 ms here; calls further apart never swap)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as svc:
        with dispatcher.held():
            live = await svc.boarding.create(MerchantCreate(dba_name="Goes Live"))
            await svc.boarding.update(live.merchant_id, status="sent_for_signature")
            await svc.boarding.update(live.merchant_id, status="sent_for_signature")  # resent
            for status in ("signed", "in_underwriting", "boarded", "live"):
                await sim_post(sim, f"/sim/merchants/{live.merchant_id}/status",
                               {"merchant_status": status, "trigger": "system"})
            gone = await svc.boarding.create(MerchantCreate(dba_name="Changes Its Mind"))
            await svc.boarding.update(gone.merchant_id, status="sent_for_signature")
            await svc.boarding.update(gone.merchant_id, status="new")  # retracted
            await sim_post(sim, f"/sim/merchants/{gone.merchant_id}/status",
                           {"merchant_status": "deleted", "trigger": "ui"})
        events = await wait_delivered(sim)
        await until(lambda: not dispatcher.busy)  # chaos duplicates may trail the first delivery
        final_live = await svc.boarding.get(live.merchant_id)

    assert hook.refused == []
    new = [r for r in hook.receipts if not r.duplicate]
    assert len(new) == len(events)  # each event taken once, however often it came
    assert any(r.duplicate for r in hook.receipts), "chaos sent no duplicate with this seed"
    arrival = [r.event.envelope.timestamp for r in new]
    assert arrival != sorted(arrival), "chaos did not reorder with this seed"

    reducer = hook.processor.reducer
    state = reducer.get(live.merchant_id)
    assert state is not None
    assert state.status is MerchantStatus.LIVE
    assert state.status_id == final_live.merchant_status_id
    assert state.mid == final_live.mid
    assert state.var is not None
    assert state.var.mid == final_live.mid

    deleted = reducer.get(gone.merchant_id)
    assert deleted is not None
    assert deleted.deleted
    assert deleted.reason is MerchantReason.DELETED

    reasons = [r.event.payload.reason for r in new if r.event.event_type.startswith("merchant.")
               and r.event.payload.merchant_id == live.merchant_id]  # type: ignore[union-attr]
    assert MerchantReason.RESENT in reasons


async def test_deliveries_signed_with_another_secret_are_refused(
    sim_factory: Any, receiver: tuple[Receiver, str]
) -> None:
    hook, url = receiver
    sim = await sim_factory(seed=6, webhook_url=url, webhook_secret="not-the-shared-secret")
    async with ServiceClient(settings_from_ready(sim.ready_info())) as svc:
        merchant = await svc.boarding.create(MerchantCreate(dba_name="Forged"))
        await until(lambda: hook.refused)
    assert "does not match" in hook.refused[0]
    assert hook.receipts == []
    assert hook.processor.reducer.get(merchant.merchant_id) is None


async def test_a_merchant_update_with_conflicting_state_is_a_typed_error(
    sim: SimServer, service: ServiceClient
) -> None:
    merchant = await service.boarding.create(MerchantCreate(dba_name="Already Live"))
    await sim_post(sim, f"/sim/merchants/{merchant.merchant_id}/status",
                   {"merchant_status": "live"})
    with pytest.raises(ConflictError, match="cannot move"):
        await service.boarding.update(merchant.merchant_id, status="sent_for_signature")
