"""The MQTT heartbeat against a real Mosquitto: a TCP proxy between the unit and the broker plays
the network (cutting it drops the connection without a goodbye, as a pulled cable would)."""

import json
from pathlib import Path

import aiomqtt
import pytest

from kiosk_agent.fleet.component import Upstream

from ..helpers import until
from ..mqtt_broker import Observer, mosquitto, start_broker, stop_broker
from . import home_assistant_rules as ha
from .helpers import TcpProxy, make_certificates, settled_agent

__all__ = ["mosquitto"]  # the broker fixture, imported for the tests below

# --- MQTT ---------------------------------------------------------------------------------------


@pytest.mark.mqtt
async def test_mqtt_discovery_heartbeat_last_will_and_catch_up(mosquitto: int) -> None:
    proxy = TcpProxy(mosquitto)
    await proxy.open()
    observer = Observer(mosquitto)
    await observer.start("kiosk-agent/unit-9/#", "homeassistant/+/unit-9/#")
    conf = {
        "device_id": "unit-9",
        "interval": 3600,
        "queue_size": 2,
        "mqtt": {"host": "127.0.0.1", "port": proxy.port, "reconnect_interval": 0.1},
    }
    upstream = Upstream(settled_agent(), conf)
    availability = "kiosk-agent/unit-9/availability"
    state = "kiosk-agent/unit-9/state"
    await upstream.start()
    try:
        await until(lambda: len(observer.on(state)) == 1)
        assert observer.on(availability) == ["online"]
        problem = json.loads(observer.on("homeassistant/binary_sensor/unit-9/problem/config")[0])
        assert problem["state_topic"] == state
        assert problem["device"]["sw_version"] == "9.9.9"
        assert json.loads(observer.on(state)[0])["terminals_online"] == 1

        # Pull the cable: the broker publishes the last will.
        await proxy.cut()
        await until(lambda: observer.on(availability)[-1:] == ["offline"])
        missed = [upstream.heartbeat() for _ in range(3)]
        sink = upstream.sinks[0]
        await until(lambda: sink.failures >= 1)
        assert sink.queue.dropped == 1

        # The network comes back: online again, and the kept reports arrive oldest first.
        await proxy.open()
        await until(lambda: len(observer.on(state)) == 3)
        assert observer.on(availability)[-1] == "online"
        assert [json.loads(p)["at"] for p in observer.on(state)[1:]] == [
            r["at"] for r in missed[1:]
        ]
    finally:
        await upstream.stop()
    # A clean stop says goodbye itself.
    await until(lambda: observer.on(availability)[-1:] == ["offline"])
    await observer.stop()
    await proxy.cut()


@pytest.mark.mqtt
async def test_mqtt_over_tls_verifies_the_broker(tmp_path: Path) -> None:
    ca = make_certificates(tmp_path)
    tls = f"cafile {ca}\ncertfile {tmp_path / 'server.crt'}\nkeyfile {tmp_path / 'server.key'}\n"
    proc, port = start_broker(tmp_path, tls)
    try:
        mqtt = {"host": "127.0.0.1", "port": port, "tls": True, "reconnect_interval": 0.1}
        conf = {"interval": 3600, "mqtt": {**mqtt, "ca_file": str(ca)}}
        trusted = Upstream(settled_agent(), conf)
        await trusted.start()
        try:
            await until(lambda: trusted.sinks[0].sent == 1)
        finally:
            await trusted.stop()
        # without the private CA the broker's certificate is refused: nothing is sent
        untrusted = Upstream(settled_agent(), {"interval": 3600, "mqtt": mqtt})
        await untrusted.start()
        try:
            await until(lambda: untrusted.sinks[0].failures >= 1)
            assert untrusted.sinks[0].sent == 0
            assert untrusted.stats()["mqtt"]["queued"] == 1
        finally:
            await untrusted.stop()
    finally:
        stop_broker(proc)


@pytest.mark.mqtt
async def test_home_assistants_birth_message_brings_the_discovery_again(mosquitto: int) -> None:
    observer = Observer(mosquitto)
    await observer.start("kiosk-agent/unit-b/#", "homeassistant/+/unit-b/#")
    conf = {
        "device_id": "unit-b",
        "interval": 3600,
        "mqtt": {"host": "127.0.0.1", "port": mosquitto, "reconnect_interval": 0.1},
    }
    upstream = Upstream(settled_agent(), conf)
    problem_topic = "homeassistant/binary_sensor/unit-b/problem/config"
    await upstream.start()
    try:
        await until(lambda: len(observer.on("kiosk-agent/unit-b/state")) == 1)
        configs = [t for t, _, _ in observer.messages if t.endswith("/config")]
        assert len(configs) == 8
        for topic in configs:  # what the broker hands Home Assistant passes HA's rules
            payload = json.loads(observer.on(topic)[0])
            assert ha.violations(topic, payload, "2024.3") == []
            assert ha.violations(topic, payload, "2026.2") == []
        assert json.loads(observer.on(problem_topic)[0])["expire_after"] == 10800

        # Home Assistant restarts and says so: the unit announces itself and its state again
        async with aiomqtt.Client("127.0.0.1", mosquitto) as home_assistant:
            await home_assistant.publish("homeassistant/status", "online", qos=1)
        await until(lambda: len(observer.on(problem_topic)) == 2)
        await until(lambda: len(observer.on("kiosk-agent/unit-b/state")) == 2)
        assert upstream.sinks[0].announcements == 2  # type: ignore[attr-defined]
        assert observer.on("kiosk-agent/unit-b/availability")[-1] == "online"
    finally:
        await upstream.stop()
        await observer.stop()
