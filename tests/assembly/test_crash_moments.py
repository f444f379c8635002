"""SIGKILL at moments hypothesis picks, while one money call is slow, loses its answer or fails.

test_crash.py kills the agent once at every journal step of each flow against a service that
always answers; test_chaos.py at random moments of a long run. Here each example is a few
customers (alone, or two back to back on one terminal, the first one's capture going on while
the second is served), each with one fault armed on one money endpoint (the card's interaction,
the charge, the capture, the give-back) and the agent killed at a step or as a call answers;
then a start recovers with the faults cleared, and the service's own records judge every sale
(test_crash.assert_no_unearned_money: no sale lost or open, no double charge, no money kept
without a confirmed dispense, no authorization left hanging). ``CRASH_MOMENTS_EXAMPLES`` asks
for more examples than the suite's two (a search, not a run of the suite).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiosk_agent.sim.server import SimOptions, SimServer
from tests.assembly.crash_driver import SharedDrivers
from tests.assembly.test_crash import (
    TIME_SCALE,
    Driver,
    assert_no_unearned_money,
    journaled_sales,
    write_config,
)
from tests.helpers import sim_call

EXAMPLES = int(os.environ.get("CRASH_MOMENTS_EXAMPLES", "2"))
# a money call's answer window: 1.5 s of timeout and 0.5 s of margin (a lost answer is
# believed uncharged 2 s after its send), so an example waits seconds, not tens
TIMEOUT_S = 1.5
ENDPOINTS = ("/api/terminal/*", "/api/v1/charge", "/api/v1/capture", "/api/v1/void-or-refund")
FAULTS = ("drop_answer", "slow_answer", "server_error_after_commit", "server_error", "delay")
# cents: ..01 asks a charge-card to retry (a second order id), ..02 is declined (choices.md)
CUSTOMERS = st.one_of(
    st.tuples(st.just("charge_card"), st.sampled_from([250, 201, 102])),
    st.tuples(st.just("authorize_capture"), st.just(300)),
)


FAULT = st.none() | st.fixed_dictionaries({
    "path": st.sampled_from(ENDPOINTS),
    "fault": st.sampled_from(FAULTS),
    "delay_s": st.sampled_from([0.3, 1.0, 2.5]),  # shorter, about, longer than a pause
})
KILL_AT = st.builds(lambda n, answer: f"{n}{answer}", st.integers(1, 9), st.sampled_from(["", "a"]))


@st.composite
def customers(draw: st.DrawFn) -> dict[str, Any]:
    """One customer, or (``overlap``) two back to back on one terminal: the first vends and
    its capture goes on (waiting for the next customer's answer) while the second is killed."""
    if draw(st.booleans()):
        return {"overlap": True, "kill_at": draw(KILL_AT), "fault": draw(FAULT)}
    flow, cents = draw(CUSTOMERS)
    return {
        "overlap": False,
        "flow": flow,
        "cents": cents,
        "dispense": draw(st.sampled_from(["vended", "failed"])),
        "kill_at": draw(KILL_AT),
        "fault": draw(FAULT),
    }


async def run_customers(plan: list[dict[str, Any]], directory: Path) -> None:
    sim = SimServer(SimOptions(port=0, time_scale=TIME_SCALE, seed=8, transactions=0))
    await sim.start()
    try:
        info = sim.ready_info()
        env = {**os.environ, "KIOSK_API_KEY": info["api_key"],
               "KIOSK_CLIENT_SECRET": info["client_secret"]}
        markers = directory / "vended.txt"
        markers.touch()
        config = write_config(directory, sim, TIMEOUT_S)
        driver = Driver(SharedDrivers.shared(), config, markers, env)
        for customer in plan:
            if customer["fault"] is not None:
                await sim_call(sim, "POST", "/sim/faults", {**customer["fault"], "count": 1})
            if customer["overlap"]:
                await driver.run("overlap", customer["kill_at"])
            else:
                await driver.run(customer["flow"], customer["cents"], customer["dispense"],
                                 customer["kill_at"])
            await sim_call(sim, "DELETE", "/sim/faults")
        assert await driver.run() == "done"  # recovers the last killed sale, if any
        sales = journaled_sales(directory)
        assert driver.started_sales <= set(sales)
        await assert_no_unearned_money(sim, sales, markers)
    finally:
        await sim.stop()
        await SharedDrivers.shared().release()


@pytest.mark.slow(seconds=8)
@settings(max_examples=EXAMPLES, deadline=None)
@given(plan=st.lists(customers(), min_size=1, max_size=3))
def test_sigkill_at_generated_moments_with_a_faulty_money_call_keeps_no_unearned_money(
    plan: list[dict[str, Any]],
) -> None:
    with tempfile.TemporaryDirectory(prefix="crash-moments-") as directory:
        asyncio.run(run_customers(plan, Path(directory)))
