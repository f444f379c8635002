"""Whether a kept sale's money request never left (sales/unwritten.py ``_never_sent``), read
against a journal on disk: only a request memory holds and the journal does not may be taken as
never sent; one on disk, of this attempt or an earlier one, may have been sent."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.journal_records import HeldStep
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.sales.unwritten import UnwrittenSales

from ..helpers import walk_to


@pytest.fixture
def journal(tmp_path: Path) -> Any:
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    yield journal
    journal.close()


def _sale(journal: Journal, n: int) -> SaleRecord:
    return journal.create(SaleRecord(
        sale_id=f"sale-{n}", order_id=f"KA{n:06d}", source="test", flow="charge_card",
        terminal="SIM-0001", amount_cents=250, product="A1", state=SaleState.STARTED,
    ))


def _never_sent(journal: Journal, record: SaleRecord, held: list[HeldStep]) -> bool:
    # the kept sale as memory holds it: its record on disk, the steps the journal could not take
    unwritten = UnwrittenSales(journal, runner=None, recovery=None)  # type: ignore[arg-type]
    return unwritten._never_sent(SimpleNamespace(record=record, held=held))  # type: ignore[arg-type]


def test_a_request_only_memory_holds_never_left(journal: Journal) -> None:
    record = _sale(journal, 1)
    held = [HeldStep(Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)]
    assert _never_sent(journal, record, held)


def test_a_request_on_disk_may_have_been_sent(journal: Journal) -> None:
    """An earlier request of the sale on disk (its call may have left, its answer lost): a
    request held after it does not make the sale's money unsent."""
    record = walk_to(journal, _sale(journal, 2), SaleState.CHARGING, Step.CHARGE_CARD_REQUEST)
    assert [s.step for s in journal.steps(record.sale_id)][-1] == Step.CHARGE_CARD_REQUEST
    held = [HeldStep(Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)]
    assert not _never_sent(journal, record, held)


def test_no_request_held_is_no_proof(journal: Journal) -> None:
    record = _sale(journal, 3)
    assert not _never_sent(journal, record, [HeldStep(Step.RECOVERY_START)])
