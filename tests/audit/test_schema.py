"""The dex: section: what it holds, its defaults, and every mistake named."""

from __future__ import annotations

import pytest

from kiosk_agent.audit.link_settings import LinkProtocol
from kiosk_agent.audit.schema import link_settings
from kiosk_agent.config.load import ConfigInvalid, load_config

BASE = "service: {simulator: {time_scale: 50}}\nterminals: [{device_id: SIM-0001}]\n"


def test_a_dex_section_gives_the_link_its_settings(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(BASE + "dex: {port: 'socket://127.0.0.1:7001', comm_id: KSK42}\n")
    section = load_config(path).get("dex")
    settings = link_settings(section)
    assert settings.port == "socket://127.0.0.1:7001"
    assert settings.protocol is LinkProtocol.DEX
    assert (settings.baudrate, settings.comm_id, settings.deadline) == (9600, "KSK42", 120.0)
    assert link_settings(section, port="/dev/ttyUSB3").port == "/dev/ttyUSB3"


def test_every_mistake_in_the_dex_section_is_named(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(
        BASE + "dex: {port: /dev/ttyUSB0, baudrate: 1234, comm_id: 'TOO-LONG-AN-ID', "
        "protocol: x25}\n"
    )
    with pytest.raises(ConfigInvalid) as caught:
        load_config(path)
    assert sorted(str(e).split(": ", 1)[1] for e in caught.value.errors) == [
        "dex.baudrate: value must be one of [1200, 2400, 4800, 9600, 19200, 38400], got 1234",
        "dex.comm_id: 1 to 10 letters or digits",
        "dex.protocol: value must be one of ['ddcmp', 'dex_ucs'], got 'x25'",
    ]
