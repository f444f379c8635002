"""Recovery's hold's deadline across a step of the wall clock (standing rule 12: durations on
the monotonic clock). A controller with no clock of its own boots on a stale wall time and NTP
steps it a while later, recovery already listening for a vend the last run left in flight: the
deadline is the vend's, on the monotonic clock; the wall time shown for it (the kiosk API's
``until``, its ``Retry-After``, health's ``recovering_until``, Home Assistant's ``until``, the
words "until HH:MM:SS") is read from it when shown, never fixed on the wall clock of the
moment the hearing began."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.moments import display_clock
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.states import SaleState
from tests.platforms.agent_rig import running_agent

from .test_recovery import crashed_charge, leave_open

TOKEN = "kiosk-token-for-the-clock-test"
VEND_TIMEOUT = 5.0


@pytest.mark.parametrize("stepped", [-3600.0, 3600.0], ids=["ahead at boot", "behind at boot"])
async def test_a_wall_clock_step_during_recovery_moves_no_deadline_any_face_shows(
    sim_factory: Any, tmp_path: Path, stepped: float
) -> None:
    sim = await sim_factory(time_scale=300, transactions=0)
    trans_id = await crashed_charge(sim, capture=False)
    # the wall clock at boot is off by what NTP will step it by (the real one: after the step,
    # the fake and the real wall clocks agree)
    clock = FakeClock(wall=time.time() - stepped, boot_id="fake-boot-1")
    leave_open(
        tmp_path, state=SaleState.DISPENSING, trans_id=trans_id, authorized_cents=300,
        product="B1", sent_at=clock.time() - 1, sent_mono=clock.monotonic() - 1,
        sent_boot="fake-boot-1", answer_by=clock.time() + 29,
    )
    trigger = {"platform": "kiosk_api", "name": "screen", "token": "!secret kiosk_token",
               "port": 0, "products": {"tea": "1.75"}, "confirm_dispense": True,
               "vend_timeout": VEND_TIMEOUT}
    async with running_agent(tmp_path, settings_from_ready(sim.ready_info()), [trigger],
                             secrets={"kiosk_token": TOKEN}, clock=clock,
                             sales={"vend_timeout": VEND_TIMEOUT}) as agent:
        port = agent.platforms[0].port  # type: ignore[attr-defined]
        hold = agent.sales.recovery_hold("SIM-0001")
        assert hold is not None, "recovery listens for the vend left in flight"
        assert hold.until is not None
        left = hold.until - clock.time()
        # (the vend's approval, placed from the journaled send: at most its answer window on)
        assert 0 < left <= 30 + VEND_TIMEOUT, left

        clock.step_wall(stepped)  # NTP: the wall clock steps, the monotonic one does not

        hold = agent.sales.recovery_hold("SIM-0001")
        assert hold is not None
        assert hold.until is not None
        assert abs(hold.until - clock.time() - left) < 0.01, (hold.until, clock.time(), left)
        assert display_clock(hold.until) in hold.reason, hold.reason
        [shown] = [a for a in agent.health.snapshot().availability if a.device_id == "SIM-0001"]
        assert shown.recovering_until is not None
        assert abs(shown.recovering_until - clock.time() - left) < 0.01, shown
        async with aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {TOKEN}"}) as session:
            async with session.get(f"http://127.0.0.1:{port}/api/v1/status") as answer:
                card = (await answer.json())["card_payment"]
            assert card["recovering"] is True, card
            assert abs(card["until"] - clock.time() - left) < 0.01, (card, clock.time())
            async with session.post(f"http://127.0.0.1:{port}/api/v1/sales",
                                    json={"product": "tea"}) as answer:
                assert answer.status == 409
                refused = await answer.json()
                retry = int(answer.headers["Retry-After"])
            assert abs(refused["until"] - clock.time() - left) < 0.01, (refused, clock.time())
            # the app asks again once the vend's timeout has run, not an hour later (nor at
            # once: a second after, again and again, for an hour)
            assert 1 <= retry <= left + 1, (retry, left)


async def test_the_drains_503_counts_its_retry_after_on_the_monotonic_clock(
    tmp_path: Path, sim_settings: Any
) -> None:
    """The same for the stop's drain (a restart, an upgrade): a controller that booted an hour
    ahead of the real time, NTP stepping it back meanwhile (here: before the stop). The 503's
    ``Retry-After`` was the drain's end on the agent's wall clock less the real one's (3620 s
    for a 20 s drain); it is now the seconds left on the monotonic clock, and ``until`` the
    wall time of that end as the agent's clock reads it when answering."""
    clock = FakeClock(wall=time.time() + 3600, boot_id="fake-boot-1")
    trigger = {"platform": "kiosk_api", "name": "screen", "token": "!secret kiosk_token",
               "port": 0, "products": {"tea": "1.75"}}
    async with running_agent(tmp_path, sim_settings, [trigger], secrets={"kiosk_token": TOKEN},
                             clock=clock, sales={"vend_timeout": 5.0, "stop_timeout": 20}
                             ) as agent:
        port = agent.platforms[0].port  # type: ignore[attr-defined]
        await agent.drain()  # no sale running: returns at once, the runner closed
        clock.step_wall(-3600)
        async with (
            aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session,
            session.post(f"http://127.0.0.1:{port}/api/v1/sales", json={"product": "tea"}
                         ) as answer,
        ):
            assert answer.status == 503
            body = await answer.json()
            retry = int(answer.headers["Retry-After"])
        assert 1 <= retry <= 20, retry
        assert 0 < body["until"] - clock.time() <= 20.01, (body, clock.time())  # ms rounded
        # health's words too ("stopping (no sale running)" here: no time said); the time it
        # says while sales drain is read the same way
        assert agent.sales.stopping_until is not None
        assert 0 < agent.sales.stopping_until - clock.time() <= 20
