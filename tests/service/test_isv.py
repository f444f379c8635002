"""An ISV key acting for one of its merchants: mid in the query, in the body for receipts."""

from __future__ import annotations

from typing import Any

import pytest

from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.errors import BadRequestError
from kiosk_agent.service.models import ChargeRequest
from kiosk_agent.sim.server import SimServer


def isv_settings(sim: SimServer, base: Any, mid: str) -> Any:
    info = sim.ready_info()
    return base.replace(api_key=info["isv_api_key"], refresh_token=None, isv=True, mid=mid)


async def test_isv_key_acts_for_its_merchant(sim: SimServer, sim_settings: Any) -> None:
    mid = sim.ready_info()["isv_mids"][1]
    async with ServiceClient(isv_settings(sim, sim_settings, mid)) as svc:
        assert len(await svc.terminal.list()) == 8
        charged = await svc.payments.charge(
            ChargeRequest(amount=450, account_token="9412345678901111", expiration="1230")
        )
        assert charged.mid == mid
        interaction = await (await svc.terminal.charge_card("SIM-0004", 450)).wait(timeout=10)
        assert interaction.charge_result is not None
        assert interaction.charge_result.mid == mid
        assert (await svc.payments.send_receipt(charged.trans_id, "isv@example.com")).sent


async def test_isv_key_with_a_foreign_mid_is_refused(sim: SimServer, sim_settings: Any) -> None:
    async with ServiceClient(isv_settings(sim, sim_settings, "123456789012")) as svc:
        with pytest.raises(BadRequestError) as caught:
            await svc.terminal.list()
    assert caught.value.error == "invalid_mid"
