"""The day's later give-backs in health: read from a journal on disk, at a start, at each
announced give-back and at a new day; never counted as a sale or takings."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from kiosk_agent.health.model import Health
from kiosk_agent.moments import day_start
from kiosk_agent.sales.fake_clock import FakeClock
from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.journal_records import Later
from kiosk_agent.sales.model import Flow
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.sales.steps import event_of

from ..helpers import walk_to

DAY = dt.date(2026, 11, 30)


def test_a_later_give_back_is_read_from_the_journal_and_counted_as_no_sale(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "journal.db", clock=FakeClock(wall=day_start(DAY) + 3600))
    journal.open()
    try:
        record = journal.create(SaleRecord(
            sale_id="later001", order_id="KALATER001", source="test",
            flow=Flow.CHARGE_CARD.value, terminal="SIM-0001", amount_cents=250,
            state=SaleState.STARTED))  # fmt: skip
        record = walk_to(journal, record, SaleState.COMPLETED, captured_cents=250)
        days = [DAY]
        health = Health("test", today=lambda: days[0],
                        day_figures=lambda d: journal.today(day_start(d)),
                        given_back=lambda d: journal.given_back_today(day_start(d)))
        health.set_sales(today_count=0, today_amount_cents=0)
        health.record_sale(event_of(record, Step.COMPLETED, clock=journal.clock))
        assert health.snapshot().sales.today_given_back_cents == 0

        noted = journal.record(record, Step.SERVICE_LATER, detail={"cents": 100},
                               later=Later(100, "partly_refunded", "jane",
                                           day_start(DAY) + 7200))
        event = event_of(noted, Step.SERVICE_LATER, clock=journal.clock)
        assert event.given_back_later
        assert event.later_cents == 100
        totals = health.sale_totals()
        health.record_sale(event)
        health.record_sale(event)  # heard twice: read, not added

        sales = health.snapshot().sales
        assert (sales.today_count, sales.today_amount_cents) == (1, 250)
        assert (sales.today_given_back_count, sales.today_given_back_cents) == (1, 100)
        assert health.sale_totals() == totals
        assert journal.given_back_today(day_start(DAY)) == (1, 100)

        # a restart reads it with the day's figures; the next day starts from the journal's
        again = Health("test", today=lambda: days[0],
                       given_back=lambda d: journal.given_back_today(day_start(d)))
        again.set_sales(today_count=1, today_amount_cents=250)
        assert again.snapshot().sales.today_given_back_cents == 100
        days[0] = DAY + dt.timedelta(days=1)
        assert (health.snapshot().sales.today_given_back_count,
                health.snapshot().sales.today_given_back_cents) == (0, 0)
        days[0] = DAY  # a wall clock stepped back over midnight: the day's notes again
        assert health.snapshot().sales.today_given_back_cents == 100
    finally:
        journal.close()
