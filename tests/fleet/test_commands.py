"""Commands from Home Assistant's buttons, on a real Mosquitto: the unit's own topics only,
who asked logged, nothing that disturbs a sale."""

import json
import logging
import re
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import aiomqtt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiosk_agent.cli.contract import EXIT_QUIT
from kiosk_agent.fleet.commands import NotAPress, asked_by, request_graceful_restart
from kiosk_agent.fleet.component import Upstream

from ..cli.agent_process import AgentProcess, money_agrees, sale_reaches, states
from ..cli.kiosk_app_rig import TOKEN, App, configured, kiosk_app
from ..helpers import until
from ..mqtt_broker import mosquitto
from .helpers import settled_agent

__all__ = ["mosquitto"]  # the broker fixture, imported for the tests below


class Sales:
    """The agent's sale runner as commands see it."""

    def __init__(self) -> None:
        self.running: list[Any] = []

    def busy_reason(self, device_id: str) -> str | None:
        return f"sale {self.running[0].sale_id} is started" if self.running else None


class Terminals:
    def __init__(self) -> None:
        self.pinged: list[str] = []
        self.printed: list[tuple[str, str]] = []

    async def ping(self, device_id: str) -> Any:
        self.pinged.append(device_id)
        return SimpleNamespace(online=True, latency_ms=7.0)

    async def list(self) -> list[Any]:
        printing = SimpleNamespace(receipt_printing=True)
        return [SimpleNamespace(device_id="SIM-0001", capabilities=printing)]

    async def print_receipt(self, device_id: str, trans_id: str) -> None:
        self.printed.append((device_id, trans_id))


@pytest.mark.mqtt
async def test_commands_come_on_the_units_own_topics_only_and_never_disturb_a_sale(
    mosquitto: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "kiosk_agent.fleet")
    agent = settled_agent()
    agent.settings = SimpleNamespace(currency="USD", terminals={"SIM-0001": "front"},
                                     stop_timeout=120.0)
    agent.sales = Sales()
    terminals = Terminals()
    agent.service = SimpleNamespace(terminal=terminals)
    agent.journal = SimpleNamespace(query=lambda **_: [SimpleNamespace(trans_id="T-77")])
    base = "kiosk-agent/unit-cmd"
    async with aiomqtt.Client("127.0.0.1", mosquitto) as home_assistant:
        # a retained press (a careless client): it would restart the unit at every connect
        await home_assistant.publish(f"{base}/command/restart", "PRESS", qos=1, retain=True)
    conf = {"device_id": "unit-cmd", "interval": 3600, "commands": True,
            "mqtt": {"host": "127.0.0.1", "port": mosquitto, "discovery_prefix": False}}
    upstream = Upstream(agent, conf)
    restarts: list[str] = []
    upstream._request_restart = lambda: restarts.append("asked") and None  # type: ignore[func-returns-value]
    sink = upstream.mqtt
    assert sink is not None
    await upstream.start()
    try:
        await until(lambda: sink.online)
        async with aiomqtt.Client("127.0.0.1", mosquitto) as home_assistant:
            # cleared: an empty payload, handed to the unit's live subscription unflagged
            await home_assistant.publish(f"{base}/command/restart", b"", qos=1, retain=True)
            # another unit's command topic: not this unit's business
            await home_assistant.publish("kiosk-agent/unit-other/command/restart", "PRESS",
                                         qos=1)
            await home_assistant.publish(f"{base}/command/ping_sim_0001",
                                         json.dumps({"by": "ha-lobby"}), qos=1)
            await until(lambda: len(upstream.commands_done) == 1)
            agent.sales.running = [SimpleNamespace(sale_id="s-1")]
            await home_assistant.publish(f"{base}/command/test_print_sim_0001", "PRESS", qos=1)
            await home_assistant.publish(f"{base}/command/restart", "PRESS", qos=1)
            await until(lambda: len(upstream.commands_done) == 3)
            agent.sales.running = []
            await home_assistant.publish(f"{base}/command/test_print_sim_0001", "PRESS", qos=1)
            await home_assistant.publish(f"{base}/command/restart", "PRESS", qos=1)
            await home_assistant.publish(f"{base}/command/nonsense", "PRESS", qos=1)
            await until(lambda: len(upstream.commands_done) == 6)
    finally:
        await upstream.stop()
    done = list(upstream.commands_done)
    assert done[0] == ("ping_sim_0001", "done: SIM-0001 online")
    assert set(done[1:3]) == {
        ("test_print_sim_0001", "refused: SIM-0001 busy (sale s-1 is started)"),
        # the restart waits for the drain: the sale in progress finishes first
        ("restart", "done: draining, then restart: new sales refused, sale s-1 in progress "
                    "finishes first (within sales.stop_timeout, 120 s)"),
    }
    assert set(done[3:]) == {
        ("test_print_sim_0001", "done: SIM-0001 printed the receipt of T-77"),
        # a second stopping signal would end the drain and park the sale: not sent
        ("restart", "refused: the agent is already stopping (its drain goes on)"),
        ("nonsense", "refused: no such command 'nonsense'"),
    }
    # once: not the retained press, not the other unit's, not the press during the drain
    assert restarts == ["asked"]
    assert terminals.pinged == ["SIM-0001"]
    assert terminals.printed == [("SIM-0001", "T-77")]
    logged = caplog.text
    assert f"command ping_sim_0001 on {base}/command/ping_sim_0001 by 'ha-lobby'" in logged
    assert f"command restart on {base}/command/restart by not given" in logged
    assert "a retained command on kiosk-agent/unit-cmd/command/restart is ignored" in logged
    assert (f"command restart on {base}/command/restart ignored: its payload is not PRESS"
            in logged)


def test_who_asked_is_the_presss_own_word_printable_and_bounded() -> None:
    assert asked_by(b"PRESS") == "not given"  # Home Assistant's button
    assert asked_by(b'{"by": "ha-lobby"}') == "'ha-lobby'"
    assert asked_by(b"{}") == "not given"
    refused = 'its "by" is not printable ASCII of 1 to 64 characters'
    for by in ("\x1b[2Jfaked", "line\nforged log line", "x" * 65, "", 7, None, "caf\u00e9"):
        with pytest.raises(NotAPress, match=re.escape(refused)):
            asked_by(json.dumps({"by": by}).encode())
    for payload in (b"", b"press", b"[1]", b"\xff", b"[" * 100_000):
        with pytest.raises(NotAPress, match="its payload is not PRESS"):
            asked_by(payload)


@settings(max_examples=50)  # a cheap check: the refusals are few and plain
@given(st.binary(max_size=200) | st.dictionaries(st.text(max_size=4), st.text(max_size=80)).map(
    lambda d: json.dumps(d).encode()))
def test_whatever_a_client_publishes_is_a_press_with_a_printable_name_or_named_refused(
    payload: bytes,
) -> None:
    try:
        by = asked_by(payload)
    except NotAPress:
        return
    assert by.isascii()
    assert by.isprintable()
    assert len(by) <= 66


def test_commands_are_off_unless_configured() -> None:
    agent = settled_agent()
    upstream = Upstream(agent, {"mqtt": {"host": "broker"}})
    assert upstream.mqtt is not None
    assert upstream.mqtt.on_command is None  # not subscribed to any command topic
    assert not upstream.mqtt._discovery.commands


def test_a_restart_is_refused_where_nothing_would_restart_the_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only `kiosk-agent run` handles SIGQUIT (its graceful stop, exit 131, which systemd's
    Restart=on-failure starts again); elsewhere the signal would kill the process (or, where
    the shell that started it ignores it, do nothing)."""
    for disposition in (signal.SIG_DFL, signal.SIG_IGN):  # a shell's background job: ignored
        monkeypatch.setattr(signal, "getsignal", lambda _signum, d=disposition: d)
        assert request_graceful_restart() == (
            "the agent is not run by `kiosk-agent run` (nothing would restart it)")
    monkeypatch.undo()
    assert request_graceful_restart() == (
        "the agent is not run by `kiosk-agent run` (nothing would restart it)")


@pytest.mark.mqtt
@pytest.mark.slow(seconds=12)
async def test_a_restart_pressed_during_a_sale_waits_for_the_drain_and_the_sale_is_sold(
    mosquitto: int, sim_factory: Any, tmp_path: Path
) -> None:
    """A real `kiosk-agent run` with a coffee dispensing when Home Assistant's Restart is
    pressed: new sales are refused at once, the coffee the app confirms after the press is
    heard and sold, a second press does not cut the drain short, and the agent exits 131 (for
    systemd to start it again)."""
    sim = await sim_factory(time_scale=50, seed=3, transactions=0)
    journal = tmp_path / "journal.db"
    upstream = f"""\
upstream:
  device_id: unit-drain
  interval: 3600
  commands: true
  mqtt: {{host: 127.0.0.1, port: {mosquitto}, discovery_prefix: false}}
"""
    config = configured(tmp_path, sim, journal, kiosk_app() + upstream, stop_timeout=20)
    agent = AgentProcess(config, sim)
    agent.env["KIOSK_APP_TOKEN"] = TOKEN
    base = "kiosk-agent/unit-drain"
    async with aiohttp.ClientSession() as session, aiomqtt.Client(
        "127.0.0.1", mosquitto
    ) as home_assistant:
        await home_assistant.subscribe(f"{base}/availability", qos=1)
        try:
            await agent.start()
            await agent.wait_ready()
            async for message in home_assistant.messages:  # its commands are heard from now
                if message.payload == b"online":
                    break
            found = re.search(r"kiosk API on 127\.0\.0\.1:(\d+)", agent.text())
            assert found, agent.text()[-3000:]
            app = App(session, int(found.group(1)))
            sale = await app.buy_coffee()
            await sale_reaches(journal, sale, "dispensing")
            press = json.dumps({"by": "ha-lobby"})
            await home_assistant.publish(f"{base}/command/restart", press, qos=1)
            await agent.wait_for_log("stopping: stopping (draining 1 sale, until ")
            status, body, _ = await app.call("POST", "/sales", {"product": "coffee"})
            assert (status, body["error"]) == (503, "stopping"), body
            await home_assistant.publish(f"{base}/command/restart", press, qos=1)
            await agent.wait_for_log("already stopping")
            # the coffee came out after the press: heard, the sale sold
            status, body, _ = await app.call("POST", f"/sales/{sale}/dispensed",
                                             {"status": "vended"})
            assert status == 202, body
            assert await agent.exit_code() == EXIT_QUIT, agent.text()[-3000:]
        finally:
            await agent.close()
    log = agent.text()
    assert "command restart on kiosk-agent/unit-drain/command/restart by 'ha-lobby'" in log
    assert (f"command restart done: draining, then restart: new sales refused, sale {sale} "
            "in progress finishes first (within sales.stop_timeout, 20 s)") in log
    assert "command restart refused: the agent is already stopping (its drain goes on)" in log
    assert states(journal) == {sale: "completed"}, log[-3000:]
    await money_agrees(sim, journal)  # captured $2.50, nothing voided or refunded
