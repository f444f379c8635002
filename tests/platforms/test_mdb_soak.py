"""A thousand customers through the mdb platform over a real pty: no sale lost, none doubled."""

from __future__ import annotations

import random
import time
from collections import Counter

from kiosk_agent.sales.states import SaleState
from kiosk_agent.sim.machine import VirtualController, VisitOutcome

from .vending_rig import make_machine

CUSTOMERS = 1000


async def test_thousand_sales_soak(controller: VirtualController) -> None:
    controller.options.dispense_time = 0.0
    machine = await make_machine(controller, vend_timeout=2.0)
    machine.desk.card_time = 0.0
    rng = random.Random(5)
    started = time.monotonic()
    try:
        for _ in range(CUSTOMERS):
            product = rng.choice(["A1", "A2", "B1", "D2"])
            await controller.customer(product, fail=rng.random() < 0.1)
        finals = await machine.desk.settled()
    finally:
        await machine.device.stop()
    elapsed = time.monotonic() - started

    visits = controller.visits
    assert len(visits) == CUSTOMERS
    assert len(finals) == CUSTOMERS, "every vend request became exactly one sale"
    assert len({f.sale_id for f in finals}) == CUSTOMERS
    by_outcome = Counter(v.outcome for v in visits)
    by_state = Counter(f.state for f in finals)
    assert by_outcome[VisitOutcome.VENDED] == by_state[SaleState.COMPLETED]
    assert by_outcome[VisitOutcome.FAILED] == by_state[SaleState.REVERSED]
    assert by_outcome[VisitOutcome.DENIED] == by_state[SaleState.DECLINED]
    assert set(by_outcome) <= {VisitOutcome.VENDED, VisitOutcome.FAILED, VisitOutcome.DENIED}
    # the money: captured exactly what came out, sale by sale
    for visit, final in zip(visits, finals, strict=True):
        assert final.product == visit.product
        vended = visit.price_cents if visit.outcome is VisitOutcome.VENDED else 0
        assert final.captured_cents == vended
    assert machine.device.link.stats.dropped == 0
    assert machine.device.stats.unknown_lines == 0
    print(f"{CUSTOMERS} sales in {elapsed:.1f}s")
