"""What people see while recovery holds a terminal after a restart, against what it holds.

A first agent stops while the touchscreen app dispenses (the sale parked dispensing, on disk);
the next one's recovery listens for that vend until its vend timeout, its terminal refusing new
sales meanwhile. A real agent on the simulator over HTTP, its journal on disk, a real Mosquitto:
Home Assistant's Card payments entity (read through its discovery config's templates), the
kiosk API's status and its 409, and `kiosk-agent health`'s lines must say the terminal takes no
card now, why and until when: the journal's row (the sale, its terminal, its dispense request)
and the runner's hearing (its deadline), not the entity code's own figures."""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.moments import display_clock
from kiosk_agent.sales.states import SaleState, Step

from ..helpers import until
from ..mqtt_broker import Observer, mosquitto
from ..platforms.agent_rig import running_agent
from . import home_assistant_rules as ha
from .test_money_on_home_assistant import _read

__all__ = ["mosquitto"]

UNIT = "unit-7"
STATE = f"kiosk-agent/{UNIT}/state"
CONFIGS = f"homeassistant/+/{UNIT}/+/config"
KIOSK_TOKEN = "kiosk-app-token-0123456789"
VEND_TIMEOUT = 30


async def _call(method: str, port: int, path: str, body: Any = None
                ) -> tuple[int, Any, dict[str, str]]:
    """The touchscreen app's call to the agent's kiosk API: status, body, headers."""
    async with aiohttp.ClientSession() as session, session.request(
        method, f"http://127.0.0.1:{port}/api/v1{path}", json=body,
        headers={"Authorization": f"Bearer {KIOSK_TOKEN}"},
    ) as answer:
        return answer.status, await answer.json(), dict(answer.headers)


@pytest.mark.mqtt
async def test_every_face_says_recovery_holds_the_terminal_and_until_when(
    mosquitto: int, tmp_path: Path, sim_settings: Any
) -> None:
    trigger = {"platform": "kiosk_api", "name": "screen", "token": "!secret kiosk_token",
               "port": 0, "products": {"tea": "1.75"}, "confirm_dispense": True,
               "vend_timeout": VEND_TIMEOUT}
    secrets = {"kiosk_token": KIOSK_TOKEN}
    async with running_agent(tmp_path, sim_settings, [trigger], secrets=secrets) as first:
        status, started, _ = await _call("POST", first.platforms[0].port, "/sales",
                                         {"product": "tea"})
        assert status == 202, started
        sale_id = started["sale_id"]
        await until(lambda: (r := first.journal.get(sale_id)) is not None
                    and r.state is SaleState.DISPENSING)
        await first.sales.stop(grace=0.05)  # parked where it stands
    db = sqlite3.connect(tmp_path / "journal.db")
    [(state, terminal)] = db.execute(
        "SELECT state, terminal FROM sales WHERE sale_id = ?", (sale_id,)).fetchall()
    [(asked_at,)] = db.execute(
        "SELECT at FROM steps WHERE sale_id = ? AND step = ?",
        (sale_id, Step.DISPENSE_REQUEST.value)).fetchall()
    db.close()
    assert (state, terminal) == ("dispensing", "SIM-0001")

    observer = Observer(mosquitto)
    await observer.start(STATE)
    home_assistant = Observer(mosquitto)
    upstream = {"device_id": UNIT, "interval": 3600, "start_grace": 0.05,
                "mqtt": {"host": "127.0.0.1", "port": mosquitto}}
    try:
        async with running_agent(tmp_path, sim_settings, [trigger], secrets=secrets,
                                 sections={"upstream": upstream}) as second:
            port = second.platforms[0].port
            vend = second.sales.restart_vend(sale_id)
            assert vend is not None
            assert vend.terminal == terminal
            # the kiosk API first (the touchscreen app): its status says the terminal takes
            # no card now, why and until when, and a sale is refused naming it
            status, body, _ = await _call("GET", port, "/status")
            card = body["card_payment"]
            assert (card["available"], card.get("recovering")) == (False, True), card
            # its deadline: the vend approved (the journal's dispense request) + the timeout,
            # as the runner's hearing holds it
            assert abs(card["until"] - (asked_at + VEND_TIMEOUT)) < 1.0, (card, asked_at)
            # read from the vend's deadline on the monotonic clock as it is shown (a step of
            # the wall clock moves no deadline: test_recovery_hold_clock.py)
            due = time.time() + (vend.due - time.monotonic())
            assert abs(card["until"] - due) < 0.01, (card, due)
            words = f"listening for the vend result of sale {sale_id[:8]}"
            whens = {display_clock(due + d) for d in (-0.01, 0.0, 0.01)}
            assert any(when in card["reason"] for when in whens), card
            assert words in card["reason"], card
            status, refused, headers = await _call("POST", port, "/sales", {"product": "tea"})
            assert status == 409, refused
            assert (refused["error"], refused["recovering"]) == ("terminal_busy", True), refused
            assert abs(refused["until"] - due) < 0.01, (refused, due)
            assert words in refused["message"]
            retry = int(headers["Retry-After"])
            assert 1 <= retry <= math.ceil(due - time.time()) + 1, retry
            db = sqlite3.connect(tmp_path / "journal.db")
            [(count,)] = db.execute("SELECT count(*) FROM sales").fetchall()
            db.close()
            assert count == 1  # nothing journaled for the refused one

            def card_payments() -> dict[str, Any]:
                reports = observer.on(STATE)
                return json.loads(reports[-1])["terminal_states"][terminal] if reports else {}

            await until(lambda: card_payments().get("takes_cards") is False)
            assert second.recovery.state == "running"
            await home_assistant.start(CONFIGS)
            await home_assistant.caught_up()
            configs = {json.loads(text)["unique_id"]: json.loads(text)
                       for _, text, retained in home_assistant.messages if text and retained}
            config = configs[f"kiosk_agent_{UNIT}_card_payments_sim_0001"]
            report = json.loads(observer.on(STATE)[-1])
            # Home Assistant's Card payments: off (running: takes cards now), in service still
            assert _read(report, config["value_template"]) is False
            assert report["terminal_states"][terminal]["available"] is True
            assert config["json_attributes_topic"] == config["state_topic"]
            attributes = {}
            for path in ha.template_paths(config["json_attributes_template"]):
                value: Any = report
                for key in path:
                    value = value[key]
                attributes[path[-1]] = value
            reason, until_iso = attributes["reason"], attributes["until"]
            assert words in reason, reason
            assert any(when in reason for when in whens), reason
            assert until_iso in {time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(due + d))
                                 for d in (-0.01, 0.0, 0.01)}, (until_iso, due)
            # the unit online, its Status degraded, as before
            assert report["status"] == "degraded"
            # /metrics says what Home Assistant says: no card taken now
            assert _card_payment_metric(second, terminal) == 0

            # `kiosk-agent health` and the status page: no reader takes cards, and why
            from kiosk_agent.cli.fleet import format_health
            from kiosk_agent.health.readers import availability

            snapshot = second.health.snapshot().model_dump(mode="json")  # /api/health's
            for read in (report, snapshot):  # `fleet show`, and `kiosk-agent health`
                lines = format_health(read).splitlines()
                assert any(line.startswith(f"card:     {terminal}") and "HELD" in line
                           and words in line for line in lines), lines
            shown = availability(snapshot)
            assert shown["summary"] == "0 of 1 reader can take cards", shown
            [cannot] = shown["cannot"]
            assert words in cannot["reason"], cannot
            assert cannot["until"] is not None, cannot

            # the app says "vended": the sale is captured, the hold goes, every face says so
            status, _, _ = await _call("POST", port, f"/sales/{sale_id}/dispensed",
                                       {"status": "vended"})
            assert status == 202
            await asyncio.wait_for(second.recovery.wait(), 30)
            assert second.sales.recovery_hold(terminal) is None
            await until(lambda: card_payments().get("takes_cards") is True)
            assert card_payments() == {"online": card_payments()["online"], "available": True,
                                       "takes_cards": True, "reason": "", "until": None}
            status, body, _ = await _call("GET", port, "/status")
            assert (body["card_payment"]["available"], body["card_payment"]["recovering"]) == (
                True, False), body
            assert availability(second.health.snapshot().model_dump(mode="json"))[
                "summary"] == "1 of 1 reader can take cards"
            assert _card_payment_metric(second, terminal) == 1
            assert second.journal.get(sale_id).state is SaleState.COMPLETED
    finally:
        await observer.stop()
        await home_assistant.stop()


def _card_payment_metric(agent: Any, terminal: str) -> float:
    """The agent's /metrics gauge of whether ``terminal`` takes a card now, as scraped."""
    from prometheus_client.parser import text_string_to_metric_families

    from kiosk_agent.admin.metrics import AgentMetrics

    body, _ = AgentMetrics(agent, lambda name: None).exposition(None)
    [value] = [sample.value for family in text_string_to_metric_families(body.decode())
               for sample in family.samples
               if sample.name == "kiosk_agent_card_payment_available"
               and sample.labels == {"terminal": terminal}]
    return float(value)
