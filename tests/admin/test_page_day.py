"""The status page's day is the journal's: the card sessions it counts apart under "Sales
today" are the ones created on the clock's UTC day, as `sales --since today --until today
--kind no_selection` lists them."""

from __future__ import annotations

from typing import Any

import aiohttp

from kiosk_agent.moments import day_of, day_start
from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.kinds import SaleKind, sessions_text
from kiosk_agent.sales.states import SaleState, Step

DAY = 86_400.0


def _walked_away(journal: Journal, at: float, count: int) -> None:
    """``count`` card-first sessions created at ``at`` and ended with nothing chosen."""
    clock, kept = FakeClock(wall=at), journal.clock
    journal.clock = clock
    try:
        for n in range(count):
            session = journal.create(SaleRecord(
                sale_id=f"{int(at):x}{n:04x}", order_id=f"KAWALK{int(at)}{n}",
                source="virtual:coffee", flow="authorize_capture", terminal="SIM-0007",
                amount_cents=500, state=SaleState.STARTED,
            ))
            session = journal.record(session, Step.READ_CARD_REQUEST, SaleState.READING_CARD)
            journal.record(session, Step.READ_CARD_CANCELLED, SaleState.CANCELLED)
    finally:
        journal.clock = kept


async def test_the_pages_sessions_today_are_the_days_not_a_later_days(
    agent: Any, admin_server: Any, read_headers: dict[str, str]
) -> None:
    """A wall clock stepped back over midnight (NTP correcting a clock that ran ahead) leaves
    the journal holding sessions of a later day: the page counted every session created since
    today's midnight, those too."""
    journal = agent.journal
    midnight = day_start(day_of(journal.clock.time()))
    _walked_away(journal, midnight + 1, 1)
    _walked_away(journal, midnight + DAY + 60, 2)  # tomorrow's, by a clock that ran ahead
    todays = journal.count(since=midnight, until=midnight + DAY, kind=SaleKind.NO_SELECTION)
    assert todays == 1
    async with (
        aiohttp.ClientSession(base_url=admin_server.url, headers=read_headers) as http,
        http.get("/api/page") as answer,
    ):
        page = await answer.json()
    assert page["no_selection_today"] == f"not sales: {sessions_text(todays)}"
