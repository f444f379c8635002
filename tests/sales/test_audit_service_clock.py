"""The charge check's window against the service's clock: an attack from outside on where the
check looks. Real agents on the simulator over HTTP, the journal on disk."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.models import TransStatus
from tests.sales.test_audit import TIME_SCALE, _charge, checked_start, give_backs_of, own, statuses


def _dated(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="milliseconds")


async def test_one_charge_the_service_dated_ahead_does_not_hide_the_units_lost_charge(
    agent_factory: Any, sim_factory: Any
) -> None:
    """Another program's charge on the unit's reader that the service dated 30 days ahead (its
    clock off for a moment) moved the check's window with it: the window ends at the service's
    latest date when that is later than the unit's (a unit's clock not yet set), so it began
    23 days ahead and a charge of the unit's own that its journal lost, dated now, was outside
    it: never given back, never told, until it was older than the window. One date ahead of
    the unit's own charges proves nothing of the unit's clock: the window ends at the latest
    date of the unit's own charges (the journal's sales') when later than now, and the lost
    charge is given back."""
    sim = await sim_factory(time_scale=TIME_SCALE, transactions=0)
    agent = await checked_start(agent_factory, sim=sim)
    lost = await _charge(agent, own(agent, 0x7200), 275, capture=True)
    template = sim.ctx.ledger.get(lost)
    assert template is not None
    del template["seq"]
    sim.ctx.ledger.add_many([{
        **template, "trans_id": "900000000001", "order_id": "POS-0001",
        "trans_date": _dated(time.time() + 30 * 86400),
    }])  # fmt: skip

    result = await agent.journal_guard.audit.check(settled=False)

    assert result.ok, result.error
    assert result.unaccounted == [lost]
    assert result.foreign == ["900000000001"]  # shown: another's, never moved
    assert (await statuses(agent, own(agent, 0x7200)))[lost] is TransStatus.VOIDED
    assert [state for _, state in give_backs_of(agent, lost)] == [SaleState.REVERSED.value]
