"""Which endings of a vend tell a person the product may have gone out, on the sale's flows.

Only an approved vend whose result no one heard (the sale's vend timeout: ``UNHEARD_ENDS``, and
a dispenser that raised) may have been made unheard: the give-back's ``dispense.result`` carries
the maybe (a ``late.vend`` with ``unsure`` and the vend's price) in its own commit. A failure or
cancel the machine said, a vend never sent (the link down: the platforms' "not approved" is a
CANCELLED), a customer's cancel before the vend was approved, and a machine that dies with the
agent (``virtual``: nothing can go out once the agent is gone, and a late vend while it lives is
heard) cannot have made one unheard: not told. Through the real simulator over HTTP and SQLite
on disk; the vend timeout (2 s in the test config) on a FakeClock.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.late_vends import late_vend_of
from kiosk_agent.sales.model import DispenseOutcome, DispenseStatus, Flow, UnheardOutcome
from kiosk_agent.sales.states import SaleState, Step
from tests.assembly.agent_helpers import ScriptedDispenser

from .test_flows import request, sell

ENDINGS = {
    # status the machine gives, its delay (a vend timeout needs one past 2 s), told
    "vend-timeout": (DispenseStatus.VENDED, 60.0, True),
    "failed-as-the-machine-said": (DispenseStatus.FAILED, 0.0, False),
    "cancelled-at-the-machine": (DispenseStatus.CANCELLED, 0.0, False),
}


@pytest.mark.parametrize("flow", [Flow.CHARGE_CARD, Flow.AUTHORIZE_CAPTURE])
@pytest.mark.parametrize("ending", ENDINGS)
async def test_only_a_vend_whose_result_no_one_heard_is_told(
    agent_factory: Any, ending: str, flow: Flow
) -> None:
    status, delay, told = ENDINGS[ending]
    clock = FakeClock(wall=time.time())
    agent = await agent_factory(clock=clock)
    machine = ScriptedDispenser(status, delay=delay, clock=clock)
    event = await clock.run(sell(agent, 300, machine, flow=flow, product="A1"))
    assert event.state is SaleState.REVERSED, event.message
    steps = agent.journal.steps(event.sale_id)
    late = late_vend_of(steps)
    if not told:
        assert late is None, late
        assert agent.sales.late_vends.counts() == (0, 0)
        return
    assert late is not None
    assert (late.product, late.cents, late.unsure) == ("A1", 300, "no vend result within 2 s")
    names = [s.step for s in steps]
    # in the vend timeout's own commit (one write, the same moment), before the give-back
    result = names.index(Step.DISPENSE_RESULT)
    assert names[result + 1] == Step.LATE_VEND
    assert steps[result].at == steps[result + 1].at
    assert names.index(Step.REVERSE_REQUEST) > result + 1
    assert agent.sales.late_vends.counts() == (0, 1)
    [problem] = [p for p in agent.health.snapshot().problems if "money went back" in p]
    assert "maybe: no vend result within 2 s" in problem, problem


async def test_a_customer_cancel_before_the_vend_was_approved_is_not_told(agent: Agent) -> None:
    machine = ScriptedDispenser()
    sale = await agent.sales.start(request(105, Flow.AUTHORIZE_CAPTURE), machine)
    await asyncio.sleep(0.05)
    assert await agent.sales.cancel(sale.sale_id)
    event = await asyncio.wait_for(sale.result(), 10)
    assert event.state is SaleState.CANCELLED
    assert machine.authorized == []  # no vend approved: nothing can have gone out
    assert late_vend_of(agent.journal.steps(event.sale_id)) is None
    assert agent.sales.late_vends.counts() == (0, 0)


async def test_a_machine_that_dies_with_the_agent_is_not_told(agent_factory: Any) -> None:
    """The demo's ``virtual`` machine is made with the agent: a vend it makes after the sale's
    timeout is heard while the agent lives (a late vend), and none can go out once it stops."""
    clock = FakeClock(wall=time.time())
    agent = await agent_factory(clock=clock)
    agent.sales.machine_starts_anew("virtual")
    machine = ScriptedDispenser(DispenseStatus.VENDED, delay=60.0, clock=clock)
    event = await clock.run(sell(agent, 300, machine, source="virtual:demo"))
    assert event.state is SaleState.REVERSED
    assert late_vend_of(agent.journal.steps(event.sale_id)) is None
    assert agent.sales.late_vends.counts() == (0, 0)


class UnheardMachine(ScriptedDispenser):
    """A platform that ended the approved vend with no word from the machine (a drop sensor's
    window, a controller reset mid-vend): ``DispenseOutcome.unheard``."""

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        self.authorized.append(authorized_cents)
        return UnheardOutcome(DispenseStatus.FAILED, product="A1",
                              detail="drop sensor saw nothing within 0.3s")


async def test_a_vend_the_platform_ended_unheard_is_told_and_journaled_as_unheard(
    agent: Agent,
) -> None:
    """The journal keeps the platform's word (``unheard`` on the dispense.result, only where
    set) so recovery reads the same rule (``recovery.unheard_vend``) for a sale a kill left."""
    from kiosk_agent.sales.recovery import unheard_vend

    event = await sell(agent, 300, UnheardMachine(), flow=Flow.AUTHORIZE_CAPTURE, product="A1")
    assert event.state is SaleState.REVERSED
    steps = agent.journal.steps(event.sale_id)
    late = late_vend_of(steps)
    assert late is not None
    assert (late.cents, late.unsure) == (300, "drop sensor saw nothing within 0.3s")
    [result] = [s for s in steps if s.step == Step.DISPENSE_RESULT]
    assert result.detail["unheard"] is True
    record = agent.journal.get(event.sale_id)
    assert record is not None
    # without its note (a journal of the earlier release), recovery would tell it; with it, not
    # twice
    assert unheard_vend(record, [s for s in steps if s.step != Step.LATE_VEND]) == ("A1", 300)
    assert unheard_vend(record, steps) is None
