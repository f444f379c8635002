"""What Home Assistant reads of a real agent's money states, against the journal's rows.

A real agent on the simulator over HTTP, its journal on disk, a real Mosquitto: a second MQTT
client subscribes as Home Assistant does (the retained discovery configs, the state topic) and
what each entity's template reads is compared with the journal's rows, summed as Decimal, never
with the entity code's own formatting."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.model import Flow
from kiosk_agent.sales.resolve import resolve
from kiosk_agent.sales.states import SaleState, Step

from ..helpers import until, walk_to
from ..mqtt_broker import Observer, mosquitto
from ..platforms.agent_rig import running_agent
from . import home_assistant_rules as ha

__all__ = ["mosquitto"]

UNIT = "unit-9"
STATE = f"kiosk-agent/{UNIT}/state"
CONFIGS = f"homeassistant/+/{UNIT}/+/config"


def _sale(journal: Journal, n: int, cents: int, state: SaleState) -> SaleRecord:
    record = journal.create(SaleRecord(
        sale_id=f"money{n:03d}", order_id=f"KAMONEY{n:03d}", source="mdb:front",
        flow=Flow.AUTHORIZE_CAPTURE.value, terminal="SIM-0001", amount_cents=cents,
        product=f"A{n}", state=SaleState.STARTED,
    ))  # fmt: skip
    return walk_to(journal, record, state)  # type: ignore[no-any-return]


def _seeded(path: Path) -> None:
    """Two sales in attention ($2.50, $1.25), a sale given back whose product came out late
    (heard) and one whose dispenser raised after its relay fired (maybe dispensed)."""
    journal = Journal(path)
    journal.open()
    _sale(journal, 1, 250, SaleState.ATTENTION)
    _sale(journal, 2, 125, SaleState.ATTENTION)
    late = _sale(journal, 3, 175, SaleState.REVERSED)
    journal.record(late, Step.LATE_VEND, detail={"product": "A3", "source": "mdb:front"})
    maybe = _sale(journal, 4, 300, SaleState.REVERSED)
    journal.record(maybe, Step.LATE_VEND, detail={"product": "A4", "source": "mdb:front",
                                                  "unsure": "relay fault after it fired"})
    journal.close()


def _read(report: dict[str, Any], template: str) -> Any:
    """The value at the one report path ``template`` reads (what HA renders it from)."""
    [path] = ha.template_paths(template)
    value: Any = report
    for key in path:
        value = value[key]
    return value


def _journal_figures(path: Path) -> dict[str, Any]:
    """What the journal's rows hold, read in SQL by a connection of the test's own (not the
    journal's readers that health uses): its sales in attention and their prices, and its late
    vends with no ``late.vend.seen`` after them."""
    db = sqlite3.connect(path)
    try:
        prices = [cents for (cents,) in db.execute(
            "SELECT amount_cents FROM sales WHERE state = 'attention'")]
        late: dict[str, dict[str, Any]] = {}
        for sale_id, step, detail in db.execute(
                "SELECT sale_id, step, detail FROM steps WHERE step IN ('late.vend', "
                "'late.vend.seen') ORDER BY id"):
            if step == "late.vend.seen":
                late.pop(sale_id, None)
            else:
                late[sale_id] = json.loads(detail)
    finally:
        db.close()
    return {
        "attention": len(prices),
        "attention_amount": sum((Decimal(cents) / 100 for cents in prices), Decimal(0)),
        "late_vends": sum(1 for d in late.values() if not d.get("unsure")),
        "maybe_dispensed": sum(1 for d in late.values() if d.get("unsure")),
    }


@pytest.mark.mqtt
async def test_home_assistant_reads_the_journals_attention_and_late_vends(
    mosquitto: int, tmp_path: Path, sim_settings: Any
) -> None:
    path = tmp_path / "journal.db"
    _seeded(path)
    expected = _journal_figures(path)
    assert expected == {"attention": 2, "attention_amount": Decimal("3.75"), "late_vends": 1,
                        "maybe_dispensed": 1}
    observer = Observer(mosquitto)
    await observer.start(STATE)
    home_assistant = Observer(mosquitto)  # comes later: handed the retained configs
    upstream = {"device_id": UNIT, "interval": 3600, "start_grace": 0.05,
                "mqtt": {"host": "127.0.0.1", "port": mosquitto}}
    try:
        async with running_agent(tmp_path, sim_settings, [],
                                 sections={"upstream": upstream}) as agent:
            await agent.settled.wait()
            await until(lambda: observer.on(STATE))
            await home_assistant.start(CONFIGS)
            await home_assistant.caught_up()
            configs = {json.loads(text)["unique_id"]: json.loads(text)
                       for _, text, retained in home_assistant.messages if text and retained}
            report = json.loads(observer.on(STATE)[-1])

            def config(key: str) -> dict[str, Any]:
                return configs[f"kiosk_agent_{UNIT}_{key}"]

            shown = {
                "attention": _read(report, config("attention_sales")["value_template"]),
                "attention_amount": Decimal(_read(
                    report, config("attention_amount")["value_template"])) / 100,
                "late_vends": _read(report, config("late_vends")["value_template"]),
                "maybe_dispensed": _read(report, config("maybe_dispensed")["value_template"]),
            }
            assert shown == expected, (shown, expected)
            # HA shows the wire's cents in the currency's units, to the cent
            assert "_cents / 100) | round(2)" in config("attention_amount")["value_template"]
            # money entities: HA's monetary class, the currency as their unit, no "sales"
            for key in ("sales_today_amount", "attention_amount"):
                assert config(key)["device_class"] == "monetary", config(key)
                assert config(key)["unit_of_measurement"] == "USD", config(key)
                assert ha.violations(f"homeassistant/sensor/x/{key}/config", config(key),
                                     "2024.3") == []
            # counts: plain measurements, never monetary
            for key in ("attention_sales", "late_vends", "maybe_dispensed"):
                assert "device_class" not in config(key), config(key)
            # every entity with a state goes stale three intervals (and jitter) after the last
            # report of a unit that stopped answering
            for key in ("attention_sales", "attention_amount", "late_vends", "maybe_dispensed"):
                assert config(key)["expire_after"] == int(3 * 3600 * 1.1), config(key)
            # the problem HA's Problem entity carries says the same counts
            assert report["status"] != "ok"
            assert "2 sale(s) need attention" in report["problems"]
            assert any("1 product(s) dispensed after the sale gave up waiting and 1 product(s) "
                       "that may have been dispensed" in p for p in report["problems"])

            # `kiosk-agent health` / `fleet health` say the same figures from the same report
            from kiosk_agent.cli.fleet import format_health

            [line] = [x for x in format_health(report).splitlines() if x.startswith("sales:")]
            assert line.endswith(f"attention 2 (${expected['attention_amount']})"), line
            # a person resolves the $2.50 sale (as the admin API does) and acknowledges the
            # heard late vend (as `sales late-vends --ack` does): HA hears the journal's new
            # figures with no heartbeat's interval to wait for
            resolve(agent.journal, "money001", "reversed", "refunded by hand", "test",
                    agent.events)
            agent.sales.late_vends.acknowledge("money003", by="test")
            expected = _journal_figures(path)
            assert expected == {"attention": 1, "attention_amount": Decimal("1.25"),
                                "late_vends": 0, "maybe_dispensed": 1}

            def now_shown() -> dict[str, Any]:
                sales = json.loads(observer.on(STATE)[-1])["sales"]
                return {"attention": sales["attention"],
                        "attention_amount": Decimal(sales["attention_cents"]) / 100,
                        "late_vends": sales["late_vends"],
                        "maybe_dispensed": sales["maybe_dispensed"]}

            await until(lambda: now_shown() == expected)
    finally:
        await observer.stop()
        await home_assistant.stop()


KIOSK_TOKEN = "kiosk-app-token-0123456789"


async def _post(port: int, path: str, body: Any) -> tuple[int, Any]:
    """The touchscreen app's call to the agent's kiosk API."""
    async with aiohttp.ClientSession() as session, session.post(
        f"http://127.0.0.1:{port}/api/v1{path}", json=body,
        headers={"Authorization": f"Bearer {KIOSK_TOKEN}"},
    ) as answer:
        return answer.status, await answer.json()


@pytest.mark.mqtt
async def test_home_assistant_sees_recovery_listen_and_stop(
    mosquitto: int, tmp_path: Path, sim_settings: Any
) -> None:
    """A first agent stops while the app dispenses a $1.75 tea (the sale parked dispensing).
    The next one's recovery listens for the app's result: Home Assistant sees the unit online
    (never unavailable while it listens), the Problem on with recovery's words naming the
    journal's sale and terminal; the app says "vended", the sale is captured, and the problem
    goes with the next report."""
    trigger = {"platform": "kiosk_api", "name": "screen", "token": "!secret kiosk_token",
               "port": 0, "products": {"tea": "1.75"}, "confirm_dispense": True,
               "vend_timeout": 30}
    secrets = {"kiosk_token": KIOSK_TOKEN}
    async with running_agent(tmp_path, sim_settings, [trigger], secrets=secrets) as first:
        status, started = await _post(first.platforms[0].port, "/sales", {"product": "tea"})
        assert status == 202, started
        sale_id = started["sale_id"]

        def dispensing() -> bool:
            record = first.journal.get(sale_id)
            return record is not None and record.state is SaleState.DISPENSING

        await until(dispensing)
        await first.sales.stop(grace=0.05)  # parked where it stands
    db = sqlite3.connect(tmp_path / "journal.db")
    [(state, terminal)] = db.execute(
        "SELECT state, terminal FROM sales WHERE sale_id = ?", (sale_id,)).fetchall()
    db.close()
    assert state == "dispensing"

    observer = Observer(mosquitto)
    availability = f"kiosk-agent/{UNIT}/availability"
    await observer.start(STATE, availability)
    upstream = {"device_id": UNIT, "interval": 3600, "start_grace": 0.05,
                "mqtt": {"host": "127.0.0.1", "port": mosquitto}}
    listening = "recovery listens for the vend result a restart left in flight"
    try:
        async with running_agent(tmp_path, sim_settings, [trigger], secrets=secrets,
                                 sections={"upstream": upstream}) as second:
            def problems() -> list[str]:
                reports = observer.on(STATE)
                return json.loads(reports[-1])["problems"] if reports else []

            await until(lambda: any(listening in p for p in problems()))
            assert second.recovery.state == "running"  # still listening, as HA shows it
            report = json.loads(observer.on(STATE)[-1])
            [said] = [p for p in report["problems"] if listening in p]
            assert f"sale {sale_id[:8]} on terminal {terminal} for " in said, said
            assert report["status"] == "degraded", report["status"]
            # online once this run's first report is on the broker (it comes just after):
            # listening is not unavailable
            await until(lambda: observer.on(availability)[-1:] == ["online"])
            assert second.recovery.state == "running"
            assert any(listening in p for p in problems())

            status, _ = await _post(second.platforms[0].port, f"/sales/{sale_id}/dispensed",
                                    {"status": "vended"})
            assert status == 202
            await asyncio.wait_for(second.recovery.wait(), 30)
            await until(lambda: not any(listening in p for p in problems()))
            db = sqlite3.connect(tmp_path / "journal.db")
            [(state, captured)] = db.execute(
                "SELECT state, captured_cents FROM sales WHERE sale_id = ?",
                (sale_id,)).fetchall()
            db.close()
            assert (state, Decimal(captured) / 100) == ("completed", Decimal("1.75"))
            assert observer.on(availability)[-1] == "online"
            assert json.loads(observer.on(STATE)[-1])["status"] == "ok"
    finally:
        await observer.stop()


def test_the_attention_amount_follows_the_sales_events_as_they_end() -> None:
    """Live (no restart): a sale that ends in attention adds its price, one resolved from
    attention takes it away, one that ends otherwise never counts; the figure is the one the
    heartbeat carries (build_report), not one of its own."""
    from kiosk_agent.fleet.report import build_report
    from kiosk_agent.health.model import Health
    from kiosk_agent.sales.model import SaleEvent

    health = Health("1.0")
    health.set_sales(attention={"seeded01": 300})

    def ended(sale_id: str, cents: int, state: SaleState) -> None:
        health.record_sale(SaleEvent(sale_id, f"KA{sale_id}", "mdb:front", state, cents,
                                     terminal="SIM-0001"))

    ended("live0001", 250, SaleState.ATTENTION)
    ended("live0002", 125, SaleState.ATTENTION)
    ended("live0003", 999, SaleState.COMPLETED)
    sales = build_report("unit-9", health.snapshot())["sales"]
    assert (sales["attention"], Decimal(sales["attention_cents"]) / 100) == (3, Decimal("6.75"))
    ended("live0001", 250, SaleState.REVERSED)  # a person gave it back (sales resolve)
    ended("seeded01", 300, SaleState.COMPLETED)  # the sweep captured it
    sales = build_report("unit-9", health.snapshot())["sales"]
    assert (sales["attention"], Decimal(sales["attention_cents"]) / 100) == (1, Decimal("1.25"))
    assert (sales["late_vends"], sales["maybe_dispensed"]) == (0, 0)  # no watch: none counted
