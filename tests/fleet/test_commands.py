"""Commands from Home Assistant's buttons, on a real Mosquitto: the unit's own topics only,
who asked logged, nothing that disturbs a sale."""

import json
import logging
import signal
from types import SimpleNamespace
from typing import Any

import aiomqtt
import pytest

from kiosk_agent.fleet.commands import request_graceful_restart
from kiosk_agent.fleet.component import Upstream

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
    agent.settings = SimpleNamespace(currency="USD", terminals={"SIM-0001": "front"})
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
        ("restart", "refused: sale s-1 in progress (press again after it)"),
    }
    assert set(done[3:]) == {
        ("test_print_sim_0001", "done: SIM-0001 printed the receipt of T-77"),
        ("restart", "done: graceful stop begun (restart)"),
        ("nonsense", "refused: no such command 'nonsense'"),
    }
    assert restarts == ["asked"]  # once: not the retained press, not the other unit's
    assert terminals.pinged == ["SIM-0001"]
    assert terminals.printed == [("SIM-0001", "T-77")]
    logged = caplog.text
    assert "command ping_sim_0001 from 'ha-lobby'" in logged
    assert "command restart from an MQTT client (MQTT names no sender" in logged
    assert "a retained command on kiosk-agent/unit-cmd/command/restart is ignored" in logged
    assert "command restart ignored: its payload is not PRESS" in logged


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
