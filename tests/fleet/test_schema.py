"""The `upstream:` section: bad fields named; credentials in clear refused unless allowed."""

from pathlib import Path
from typing import Any

import pytest
import voluptuous as vol

from kiosk_agent.app import load_agent
from kiosk_agent.cli import main
from kiosk_agent.config.load import ConfigInvalid
from kiosk_agent.fleet.component import Upstream
from kiosk_agent.fleet.mqtt import mqtt_tls_context
from kiosk_agent.fleet.schema import UPSTREAM_SCHEMA

from .helpers import make_certificates, settled_agent


def test_schema_names_the_bad_field() -> None:
    with pytest.raises(vol.Invalid, match="url"):
        UPSTREAM_SCHEMA({"http": {"url": "ftp://x"}})
    conf = UPSTREAM_SCHEMA({"mqtt": {"host": "broker"}})
    assert conf["mqtt"]["port"] == 1883
    assert conf["interval"] == 60.0


# --- HTTP in clear: the fleet token must not leave the machine unencrypted ------------------------


def _fleet_config(directory: Path, http: str) -> Path:
    (directory / "secrets.yaml").write_text("fleet_token: fleet-token-0123456789\n")
    (directory / "secrets.yaml").chmod(0o600)
    path = directory / "config.yaml"
    path.write_text(
        "service:\n  simulator: {time_scale: 50}\n"
        "terminals:\n  - device_id: SIM-0001\n"
        "journal: {path: journal.db}\n"
        f"upstream:\n  device_id: store-42\n  http: {http}\n"
    )
    return path


def test_check_config_refuses_a_heartbeat_in_clear_to_another_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _fleet_config(
        tmp_path, "{url: 'http://fleet.example.com/hb', token: !secret fleet_token}"
    )
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "upstream.http.url: an http:// heartbeat to another host sends the fleet token" in err
    assert "allow_insecure_http: true" in err
    assert "fleet-token-0123456789" not in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "url",
    [
        "https://fleet.example.com/hb",
        "http://127.0.0.1:8080/hb",
        "http://127.0.1.1/hb",
        "http://[::1]:8080/hb",
        "http://localhost/hb",
        "http://localhost./hb",
    ],
)
def test_https_and_loopback_heartbeats_need_no_permission(url: str) -> None:
    conf = UPSTREAM_SCHEMA({"http": {"url": url, "token": "t"}})
    assert conf["http"]["allow_insecure_http"] is False


@pytest.mark.parametrize(
    "url",
    [
        "http://fleet.example.com/hb",
        "http://10.0.0.7/hb",
        "http://localhost.evil.example/hb",
        "http://127.0.0.1.evil.example/hb",
        "http://[::ffff:10.0.0.7]/hb",
        "http://user@10.0.0.7/hb",
    ],
)
def test_clear_text_heartbeats_to_other_hosts_need_permission(url: str) -> None:
    with pytest.raises(vol.Invalid, match="allow_insecure_http"):
        UPSTREAM_SCHEMA({"http": {"url": url, "token": "t"}})
    allowed = UPSTREAM_SCHEMA({"http": {"url": url, "allow_insecure_http": True}})
    assert allowed["http"]["url"] == url


async def test_the_agent_refuses_to_start_a_heartbeat_in_clear(tmp_path: Path) -> None:
    path = _fleet_config(tmp_path, "{url: 'http://10.0.0.7/hb', token: !secret fleet_token}")
    with pytest.raises(ConfigInvalid, match=r"upstream\.http\.url"):
        load_agent(path, None, systemd=False)
    with pytest.raises(vol.Invalid, match="allow_insecure_http"):  # the component itself too
        Upstream(settled_agent(), {"http": {"url": "http://10.0.0.7/hb"}})


@pytest.mark.parametrize(
    "mqtt",
    [
        {"host": "broker.example.com", "username": "u", "password": "p", "tls": True},
        {"host": "127.0.0.1", "username": "u", "password": "p"},
        {"host": "localhost", "password": "p"},
        {"host": "broker.example.com"},  # no password: nothing secret to carry
    ],
)
def test_mqtt_credentials_in_clear_only_to_this_machine(mqtt: dict[str, Any]) -> None:
    assert UPSTREAM_SCHEMA({"mqtt": mqtt})["mqtt"]["allow_insecure"] is False


@pytest.mark.parametrize("host", ["broker.example.com", "10.0.0.7", "localhost.evil.example"])
def test_a_password_on_plain_mqtt_to_another_host_is_refused(host: str) -> None:
    mqtt = {"host": host, "username": "store-42", "password": "p"}
    with pytest.raises(vol.Invalid, match="allow_insecure: true") as refused:
        UPSTREAM_SCHEMA({"mqtt": mqtt})
    assert refused.value.path == ["mqtt", "password"]
    assert UPSTREAM_SCHEMA({"mqtt": {**mqtt, "allow_insecure": True}})["mqtt"]["host"] == host


@pytest.mark.parametrize("device_id", ["+", "#", "a/b", "unit 1", ""])
def test_a_device_id_is_one_plain_topic_level(device_id: str) -> None:
    with pytest.raises(vol.Invalid, match="letters, digits"):
        UPSTREAM_SCHEMA({"device_id": device_id})


@pytest.mark.parametrize("key", ["topic_prefix", "discovery_prefix"])
@pytest.mark.parametrize(
    "prefix", ["a/+", "#", "kiosk/#/x", "a/", "/a", "a//b", "$SYS/x", "a\x00b", "a\ud800"]
)
def test_a_topic_prefix_is_plain_topic_levels(key: str, prefix: str) -> None:
    """Before: check-config took `topic_prefix: "a/+"`; the unit then met a publish with a
    wildcard, its MQTT task ended (the ValueError was not one it expected), and it published
    nothing, saying nothing until its stop showed the traceback."""
    with pytest.raises(vol.Invalid, match="topic levels") as refused:
        UPSTREAM_SCHEMA({"mqtt": {"host": "broker", key: prefix}})
    assert refused.value.path == ["mqtt", key]


def test_plain_prefixes_are_taken_and_discovery_can_be_off() -> None:
    mqtt = {"host": "broker", "topic_prefix": "fleet/eu-west", "discovery_prefix": "ha eu"}
    assert UPSTREAM_SCHEMA({"mqtt": mqtt})["mqtt"]["topic_prefix"] == "fleet/eu-west"
    for off in (False, ""):
        conf = UPSTREAM_SCHEMA({"mqtt": {"host": "broker", "discovery_prefix": off}})
        assert not conf["mqtt"]["discovery_prefix"]
    with pytest.raises(vol.Invalid, match="topic levels"):
        UPSTREAM_SCHEMA({"mqtt": {"host": "broker", "topic_prefix": ""}})


def test_check_config_refuses_a_broker_password_in_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "secrets.yaml").write_text("mqtt_password: broker-pass-0123456789\n")
    (tmp_path / "secrets.yaml").chmod(0o600)
    path = tmp_path / "config.yaml"
    path.write_text(
        "service:\n  simulator: {time_scale: 50}\nterminals:\n  - device_id: SIM-0001\n"
        "upstream:\n  mqtt: {host: mqtt.example.com, username: store-42, "
        "password: !secret mqtt_password}\n"
    )
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "upstream.mqtt.password: a password to a broker on another host without tls" in err
    assert "broker-pass-0123456789" not in err


def test_tls_mistakes_are_named_when_the_config_is_checked(tmp_path: Path) -> None:
    """Before: a ca_file without tls: true was ignored (plain MQTT to port 8883: "connection
    reset by peer" every back-off step), and a missing ca_file was "[Errno 2] No such file or
    directory" at each reconnect, naming no file."""
    ca = tmp_path / "ca.pem"
    with pytest.raises(vol.Invalid, match=r"no such file .*\['ca_file'\]"):
        UPSTREAM_SCHEMA({"mqtt": {"host": "broker", "tls": True, "ca_file": str(ca)}})
    make_certificates(tmp_path)
    (tmp_path / "ca.crt").rename(ca)
    with pytest.raises(vol.Invalid, match=r"ca_file is only used with tls: true; .*\['tls'\]"):
        UPSTREAM_SCHEMA({"mqtt": {"host": "broker", "port": 8883, "ca_file": str(ca)}})
    conf = UPSTREAM_SCHEMA({"mqtt": {"host": "broker", "tls": True, "ca_file": str(ca)}})
    ca.write_text("not a certificate\n")  # changed since the config was checked: named
    with pytest.raises(OSError, match=rf"tls ca_file {ca}: holds no certificate TLS can load"):
        mqtt_tls_context(conf["mqtt"])


@pytest.mark.parametrize(
    ("content", "named"),
    [("not a certificate\n", "holds no certificate TLS can load"),
     ("key", "holds no certificate TLS can load"),  # the server's key given as the CA
     ("", "holds no certificate TLS can load")],
)
def test_a_ca_file_that_is_not_a_certificate_is_refused_by_check_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, named: str
) -> None:
    """Before: any file passed `check-config`, and `doctor` then said "the connection failed"."""
    make_certificates(tmp_path)
    ca = tmp_path / "given.pem"
    ca.write_text((tmp_path / "server.key").read_text() if content == "key" else content)
    path = tmp_path / "config.yaml"
    path.write_text(
        "service:\n  simulator: {time_scale: 50}\n"
        "terminals:\n  - device_id: SIM-0001\n"
        "journal: {path: journal.db}\n"
        f"upstream:\n  mqtt: {{host: 127.0.0.1, tls: true, ca_file: {ca}}}\n"
    )
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"upstream.mqtt.ca_file: {ca}: {named}" in err
    assert "(-----BEGIN CERTIFICATE-----)" in err


# --- which Home Assistant reads the discovery -------------------------------------------------


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (2024.3, "in quotes"),  # YAML's number: 2024.10 would read as 2024.1
        ("2023.12", "older than the oldest supported, 2024.3"),
        ("2024.13", "not '2024.13'"),
        ("latest", "not 'latest'"),
    ],
)
def test_a_home_assistant_release_not_understood_is_named(given: object, named: str) -> None:
    with pytest.raises(vol.Invalid, match=named) as caught:
        UPSTREAM_SCHEMA({"home_assistant": given})
    assert caught.value.path == ["home_assistant"]


def test_a_home_assistant_release_is_kept_as_year_and_month() -> None:
    assert UPSTREAM_SCHEMA({"home_assistant": "2026.02.3"})["home_assistant"] == "2026.2"
    assert "home_assistant" not in UPSTREAM_SCHEMA({})  # unsaid: the oldest's rules
