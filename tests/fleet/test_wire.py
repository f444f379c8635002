"""`fleet list`'s read-only visit to the broker (fleet/wire.py), against a real Mosquitto."""

from pathlib import Path

import aiomqtt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.fleet.inventory import retained
from kiosk_agent.fleet.wire import (
    PUBLISH,
    BrokerRefused,
    Frames,
    publish_parts,
    publish_qos0_packet,
)

from ..helpers import free_port
from ..mqtt_broker import start_broker, stop_broker
from .helpers import tls_listener

messages = st.lists(st.tuples(st.text(min_size=1, max_size=30).filter(lambda t: "\x00" not in t),
                              st.binary(max_size=300)), min_size=1, max_size=20)


@given(messages, st.lists(st.integers(min_value=1, max_value=50), min_size=1))
def test_packets_are_framed_however_the_stream_is_cut(
    sent: list[tuple[str, bytes]], cuts: list[int],
) -> None:
    """TCP hands bytes in pieces of any size: each PUBLISH comes out whole and in order
    (payloads past 127 bytes take a second length byte)."""
    stream = b"".join(publish_qos0_packet(topic, payload) for topic, payload in sent)
    frames, at, step = Frames(), 0, 0
    heard = []
    while at < len(stream):
        size = cuts[step % len(cuts)]
        heard += frames.feed(stream[at:at + size])
        at, step = at + size, step + 1
    assert all(kind == PUBLISH for kind, _, _ in heard)
    assert [publish_parts(flags, body)[:2] for _, flags, body in heard] == sent


@given(st.lists(st.binary(max_size=64), max_size=20))
def test_any_bytes_from_the_broker_are_framed_or_refused_never_a_crash(
    chunks: list[bytes],
) -> None:
    """Whatever a broker (or a port that is not one) sends: frames, a wait for more, or the
    one clear refusal of a malformed length."""
    frames, refused = Frames(), ""
    try:
        for chunk in chunks:
            for kind, flags, body in frames.feed(chunk):
                if kind == PUBLISH:
                    publish_parts(flags, body)
    except aiomqtt.MqttError as err:
        refused = str(err)
    assert refused in ("", "the broker sent a malformed packet (its length runs over 4 bytes)")


def test_a_length_past_four_bytes_is_refused_not_waited_on() -> None:
    """MQTT's remaining length has at most 4 bytes; a fifth would have the listing buffer a
    packet that never ends until its --wait."""
    with pytest.raises(aiomqtt.MqttError, match="malformed packet"):
        Frames().feed(bytes([PUBLISH << 4]) + b"\xff" * 4 + b"\x01")
    assert Frames().feed(bytes([PUBLISH << 4]) + b"\xff" * 3 + b"\x7f") == []  # 4: waits


@pytest.mark.mqtt
async def test_a_wrong_password_is_said_as_the_brokers_refusal(tmp_path: Path) -> None:
    (tmp_path / "users").write_text("")
    proc, port = start_broker(tmp_path, f"allow_anonymous false\npassword_file "
                                        f"{tmp_path / 'users'}\n")
    try:
        conf = {"host": "127.0.0.1", "port": port, "username": "fleet", "password": "wrong"}
        with pytest.raises(BrokerRefused, match="refused the connection: not authorized"):
            await retained(conf, ["kiosk-agent/+/state"], wait=2.0)
    finally:
        stop_broker(proc)
    with pytest.raises(ConnectionRefusedError):  # nobody listens: the connection's own error
        await retained({"host": "127.0.0.1", "port": free_port()}, ["x/+/state"], wait=1.0)


@pytest.mark.mqtt
async def test_the_listing_reads_over_tls_and_verifies_the_broker(tmp_path: Path) -> None:
    ca, tls = tls_listener(tmp_path)
    proc, port = start_broker(tmp_path, tls)
    try:
        conf = {"host": "127.0.0.1", "port": port, "tls": True, "ca_file": str(ca)}
        async with aiomqtt.Client("127.0.0.1", port, tls_params=aiomqtt.TLSParameters(
                ca_certs=str(ca))) as unit:
            await unit.publish("kiosk-agent/u1/state", b'{"status": "ok"}', qos=1, retain=True)
        found = await retained(conf, ["kiosk-agent/+/state"], wait=5.0)
        assert dict(found) == {"kiosk-agent/u1/state": '{"status": "ok"}'}
        assert found.complete
        with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):  # not our CA
            await retained({**conf, "ca_file": None}, ["kiosk-agent/+/state"], wait=2.0)
    finally:
        stop_broker(proc)
