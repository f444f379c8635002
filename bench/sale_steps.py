"""The agent's own side of a sale, alone: CPU of a charge_card sale's journal writes and steps.

    python bench/sale_steps.py [--sales 500] [--rounds 5]

Runs the steps a kiosk API charge_card sale journals and publishes (``SaleSteps`` over a real
``Journal`` on disk and the agent's ``EventBus``): the new sale with its charge request (one
commit), the charge accepted, the approval with the vend's request (one commit), the end. No
service, no HTTP, no event loop: what is left is the sale's own Python, SQLite's statements and
the commits' fsyncs, which ``bench/agent.py``'s ``kiosk_sale_cpu_ms`` holds beside aiohttp and
asyncio. Each figure is the least of ``--rounds`` rounds (the machine's load only adds):

- ``sale_steps_cpu_ms``: CPU a sale as the field runs it (``synchronous=FULL``);
- ``sale_steps_no_fsync_cpu_ms``: the same with ``synchronous=OFF`` (the sale's Python and the
  statements; never how the agent runs), and ``fsync_cpu_ms`` the difference: the commits'
  share;
- ``statements_per_sale`` and ``commits_per_sale``, counted by SQLite's trace.

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from kiosk_agent.bus import EventBus
from kiosk_agent.sales.charge_card import ChargeCardFlow
from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.model import Flow, SaleEvent, SaleRequest
from kiosk_agent.sales.runner import new_ids
from kiosk_agent.sales.settings import SaleSettings
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.sales.steps import SaleContext

WARM_UP = 20


def one_sale(context: SaleContext) -> None:
    """The journal writes and events of a kiosk API charge_card sale, in its order."""
    sale_id, order_id = new_ids(context.unit)
    request = SaleRequest(
        source="kiosk_api:screen", flow=Flow.CHARGE_CARD, amount_cents=250, product="coffee"
    )
    record = SaleRecord(
        sale_id=sale_id, order_id=order_id, source=request.source, flow=Flow.CHARGE_CARD.value,
        terminal="SIM-0001", amount_cents=250, state=SaleState.STARTED, product="coffee",
    )
    flow = ChargeCardFlow(record, request, dispenser=None, context=context)  # type: ignore[arg-type]
    flow.open({"source": request.source, "product": request.product})
    flow.step(Step.CHARGE_CARD_ACCEPTED, interaction_id="I-0001", interaction_kind="charge_card")
    with flow.one_commit():
        flow.charge_found(Step.CHARGE_CARD_APPROVED, "T-0001", 250, {"trans_id": "T-0001"})
        flow.step(Step.DISPENSE_REQUEST, SaleState.DISPENSING, "vending up to $2.50")
    flow.finish(SaleState.COMPLETED, Step.COMPLETED, "paid $2.50 and dispensed",
                vended_cents=250, detail={"status": "vended"})


def cpu_per_sale(context: SaleContext, sales: int, rounds: int) -> float:
    """The least CPU ms a sale over ``rounds`` rounds of ``sales``."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(sales):
            one_sale(context)
        best = min(best, (time.process_time() - started) / sales * 1000)
    return best


def make_context(directory: Path) -> tuple[SaleContext, Journal]:
    journal = Journal(directory / "journal.db")
    journal.open()
    journal.reserve_wal()  # as a run's journal: commits overwrite the WAL in place
    events: EventBus[SaleEvent] = EventBus()
    events.listen(lambda _event: None)  # a listener, as health and the kiosk API are
    settings = SaleSettings(terminals=["SIM-0001"], mid="999000000001")
    return SaleContext(service=None, journal=journal, events=events, settings=settings), journal  # type: ignore[arg-type]


def counted(context: SaleContext, journal: Journal) -> tuple[int, int]:
    """(statements, commits) of one sale, from SQLite's trace."""
    seen: list[str] = []
    journal.db.set_trace_callback(seen.append)
    try:
        one_sale(context)
    finally:
        journal.db.set_trace_callback(None)
    return len(seen), sum(1 for sql in seen if sql == "COMMIT")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sales", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where the journal lives (a disk)")
    args = parser.parse_args()
    figures: dict[str, float] = {"load_average_before": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        context, journal = make_context(Path(scratch))
        for _ in range(WARM_UP):
            one_sale(context)
        statements, commits = counted(context, journal)
        full = cpu_per_sale(context, args.sales, args.rounds)
        journal.db.execute("PRAGMA synchronous=OFF")  # the measure's, never the agent's
        bare = cpu_per_sale(context, args.sales, args.rounds)
        journal.close()
    figures |= {
        "sale_steps_cpu_ms": round(full, 3),
        "sale_steps_no_fsync_cpu_ms": round(bare, 3),
        "fsync_cpu_ms": round(full - bare, 3),
        "statements_per_sale": statements,
        "commits_per_sale": commits,
        "load_average_after": round(os.getloadavg()[0], 2),
    }
    for name, value in figures.items():
        print(f"{name:28s} {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
