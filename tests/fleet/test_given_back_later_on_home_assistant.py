"""What others gave back later at the service, on Home Assistant, the heartbeat and the bus.

A real agent on the simulator over HTTP, its journal on disk, a real Mosquitto. Two of the
agent's own sales complete; at the service a person refunds part of one and another the whole
of the other (through the simulator's payments API); the charge check's whole read notes both.
Home Assistant's new entities read what the journal's ``sale_later`` rows hold (read here in SQL
by the test's own connection) and what the export of today's sales sums as Decimal; the day's
takings (``today_amount_cents``) and every counter of sales stay where they were: the give-back
is announced as its own kind of event, counted by no one as a second end."""

from __future__ import annotations

import json
import sqlite3
from decimal import Decimal
from typing import Any

import pytest

from kiosk_agent.export import export_sales
from kiosk_agent.fleet.component import Upstream
from kiosk_agent.moments import day_bounds
from kiosk_agent.sales.model import Flow, SaleEvent, SaleRequest
from kiosk_agent.sales.states import SaleState
from tests.assembly.agent_helpers import ScriptedDispenser
from tests.assembly.conftest import agent_factory
from tests.helpers import sim_call, until

from ..mqtt_broker import Observer, mosquitto
from . import home_assistant_rules as ha

__all__ = ["agent_factory", "mosquitto"]

UNIT = "unit-later"
STATE = f"kiosk-agent/{UNIT}/state"
CONFIGS = f"homeassistant/+/{UNIT}/+/config"


def _journal_given_back(path: Any, midnight: float, next_midnight: float) -> tuple[int, Decimal]:
    """Today's completed sales with anything given back by others, and its sum, from the
    journal's rows in SQL (not the journal's own reads that health uses)."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute(
            "SELECT l.later_cents FROM sale_later l JOIN sales s USING (sale_id) "
            "WHERE s.state = 'completed' AND s.created_at >= ? AND s.created_at < ? "
            "AND l.later_cents > 0", (midnight, next_midnight)).fetchall()
    finally:
        db.close()
    return len(rows), sum((Decimal(cents) / 100 for (cents,) in rows), Decimal(0))


def _read(report: dict[str, Any], template: str) -> Any:
    [path] = ha.template_paths(template)
    value: Any = report
    for key in path:
        value = value[key]
    return value


@pytest.mark.mqtt
async def test_home_assistant_shows_what_others_gave_back_today_and_no_count_moves_twice(
    mosquitto: int, agent_factory: Any, sim_factory: Any
) -> None:
    sim = await sim_factory(time_scale=300, transactions=0)
    observer = Observer(mosquitto)
    await observer.start(STATE)
    home_assistant = Observer(mosquitto)
    upstream = (f"upstream: {{device_id: {UNIT}, interval: 3600, start_grace: 0.05, "
                f"mqtt: {{host: 127.0.0.1, port: {mosquitto}}}}}\n")
    try:
        agent = await agent_factory(upstream, sim=sim)
        await until(lambda: agent.journal_guard.history_read)
        seen: list[SaleEvent] = []
        unlisten = agent.events.listen(seen.append)
        records = []
        for cents in (250, 175):
            sale = await agent.sales.start(
                SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=cents),
                ScriptedDispenser())
            assert (await sale.result()).state is SaleState.COMPLETED
            records.append(agent.journal.get(sale.sale_id))
        # the day's figures go out with the next beat (none is prompted by a sale): one now
        [upstream] = [c for c in agent.components if isinstance(c, Upstream)]
        upstream.heartbeat()
        await until(lambda: bool(observer.on(STATE)) and json.loads(
            observer.on(STATE)[-1])["sales"]["today_count"] == 2)
        before = agent.health.snapshot().sales
        totals = agent.health.sale_totals()
        assert (before.today_count, before.today_amount_cents) == (2, 425)
        assert (before.today_given_back_count, before.today_given_back_cents) == (0, 0)

        await sim_call(sim, "POST", "/sim/settle")
        first, second = records
        await agent.service.payments.void_or_refund(first.trans_id, amount=100,
                                                    user_identifier="jane")
        await agent.service.payments.void_or_refund(second.trans_id, user_identifier="bob")
        result = await agent.journal_guard.audit.check(settled=True)
        assert sorted(result.later) == sorted([first.sale_id, second.sale_id])

        # announced as its own kind, once a note, after its commit: what the journal holds
        later = [e for e in seen if e.given_back_later]
        assert sorted((e.sale_id, e.later_cents) for e in later) == sorted(
            [(first.sale_id, 100), (second.sale_id, 175)])
        assert all(e.state is SaleState.COMPLETED and not e.receipt for e in later)
        for event in later:
            assert event.later_cents == agent.journal.get(event.sale_id).later_cents

        # the journal's rows, and the export of today's sales summed as Decimal, say the same
        midnight, next_midnight = day_bounds(agent.clock.time())
        expected = _journal_given_back(agent.journal.path, midnight, next_midnight)
        assert expected == (2, Decimal("2.75"))
        exported = json.loads("".join(export_sales(
            agent.journal.query(since=midnight, until=next_midnight), "json")))
        by_others = [Decimal(str(row["given_back_by_others"])) for row in exported
                     if row["state"] == "completed"
                     and row["given_back_by_others"] not in ("", None)]
        assert (len(by_others), sum(by_others, Decimal(0))) == expected

        # no counter of sales or takings moved: the day's, the running totals
        after = agent.health.snapshot().sales
        assert (after.today_count, after.today_amount_cents) == (2, 425)
        assert agent.health.sale_totals() == totals
        assert (after.today_given_back_count,
                Decimal(after.today_given_back_cents) / 100) == expected

        # Home Assistant: the discovery configs (retained), each template read off the report
        def shown() -> tuple[int, Decimal] | None:
            if not observer.on(STATE):
                return None
            report = json.loads(observer.on(STATE)[-1])
            return (int(_read(report, configs["given_back_today"]["value_template"])),
                    Decimal(_read(report, configs["given_back_today_amount"]["value_template"]))
                    / 100)

        upstream.heartbeat()
        await home_assistant.start(CONFIGS)
        await home_assistant.caught_up()
        configs = {json.loads(text)["unique_id"].removeprefix(f"kiosk_agent_{UNIT}_"):
                   json.loads(text)
                   for _, text, retained in home_assistant.messages if text and retained}
        await until(lambda: shown() == expected)
        report = json.loads(observer.on(STATE)[-1])
        assert (report["sales"]["today_count"], report["sales"]["today_amount_cents"]) == (2, 425)
        amount = configs["given_back_today_amount"]
        assert amount["device_class"] == "monetary"
        assert amount["unit_of_measurement"] == "USD"
        assert amount["last_reset_value_template"] == "{{ value_json.sales.day_started }}"
        assert "device_class" not in configs["given_back_today"]
        for key in ("given_back_today", "given_back_today_amount", "sales_today_amount"):
            assert ha.violations(f"homeassistant/sensor/x/{key}/config", configs[key],
                                 "2024.3") == []

        # `kiosk-agent health` / `fleet health` say it from the same report, beside the day's
        from kiosk_agent.cli.fleet import format_health

        [line] = [x for x in format_health(report).splitlines() if x.startswith("sales:")]
        assert "2 completed, $4.25 ($2.75 given back since by others); open 0" in line, line

        # a check that finds nothing changed announces nothing and counts nothing
        count = len(seen)
        again = await agent.journal_guard.audit.check(settled=True)
        assert again.later == []
        assert [e for e in seen[count:] if e.given_back_later] == []
        assert agent.health.snapshot().sales.today_given_back_cents == 275
        unlisten()
    finally:
        await observer.stop()
        await home_assistant.stop()
