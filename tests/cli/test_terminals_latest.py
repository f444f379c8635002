"""`kiosk-agent terminals print` without --trans-id prints the newest transaction's receipt."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from kiosk_agent.cli.terminals import _latest_trans_id
from kiosk_agent.service.models.reporting import Transaction


def _reporting(*rows: dict[str, Any]) -> Any:
    async def transactions(page_size: int) -> AsyncIterator[Transaction]:
        for row in rows:
            yield Transaction.model_validate({"amount": 3, **row})

    return SimpleNamespace(reporting=SimpleNamespace(transactions=transactions))


async def test_the_newest_is_found_among_dates_with_and_without_an_offset_and_none() -> None:
    # a date-time without an offset is UTC; compared with a dated one it raised TypeError
    svc = _reporting(
        {"trans_id": "undated"},
        {"trans_id": "older", "trans_date": "2026-11-29T10:00:00.000Z"},
        {"trans_id": "newest", "trans_date": "2026-11-29T11:00:00.000"},
        {"trans_id": "east", "trans_date": "2026-11-29T19:30:00.000+09:00"},  # 10:30Z
    )
    assert await _latest_trans_id(svc) == "newest"
