"""A local server's ``host`` as the configuration is checked (web/hosts.py): one that can never
be a machine's address is refused as a mistake with its line and fix; one that is not on this
machine now (a LAN address before DHCP) is valid, the agent waits for it, and ``check-config``
and ``doctor`` say so as a warning."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from aiohttp import web

from kiosk_agent.cli import main
from kiosk_agent.config.load import load_config
from kiosk_agent.doctor import check_listen_addresses
from kiosk_agent.verdicts import Report, Verdict
from kiosk_agent.web.server import ListenError, LocalSite

from .test_address_wait import Address

_TOKEN = "kiosk-token-0123456789"


def _config(directory: Path, body: str) -> Path:
    path = directory / "config.yaml"
    path.write_text(textwrap.dedent("""\
        service: {simulator: {}}
        terminals: [{device_id: SIM-0001}]
        journal: {path: journal.db}
        """) + body)
    secrets = directory / "secrets.yaml"
    secrets.write_text(f"kiosk_token: {_TOKEN}\nadmin_token: {'a' * 24}\nhook: {'h' * 16}\n")
    secrets.chmod(0o600)
    return path


def _kiosk_api(name: str, host: str) -> str:
    return (f"  - platform: kiosk_api\n    name: {name}\n    token: !secret kiosk_token\n"
            f'    host: "{host}"\n')


def test_check_config_refuses_a_host_no_machine_can_have_each_on_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: any text passed (`host: str`); at start 999.1.1.1 said 'unknown error -2', and
    240.0.0.1 or 10.1 (an address no interface can have) would now wait for ever."""
    path = _config(tmp_path, textwrap.dedent("""\
        admin:
          host: 224.0.0.251
          tokens: [{name: tech, token: !secret admin_token}]
        webhooks:
          host: http://192.168.1.20
          secret: !secret hook
        triggers:
        """) + "".join(_kiosk_api(f"k{i}", host) for i, host in enumerate(
        ["999.1.1.1", "localhost:8765", "240.0.0.1", "10.1", "[::1]", "kiosk..lan"])))
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    for line, mistake in [
        (5, "admin.host: 224.0.0.251 is a multicast address: no machine listens there"),
        (8, "webhooks.host: http://192.168.1.20 is not an address: write the address alone"),
        (14, "triggers[0].host: 999.1.1.1 is not an IPv4 address: four numbers of 0-255"),
        (18, "triggers[1].host: localhost:8765: the port goes in port:, not in host: "
             "host: localhost"),
        (22, "triggers[2].host: 240.0.0.1 is in 240.0.0.0/4, reserved"),
        (26, "triggers[3].host: 10.1 is not an IPv4 address"),
        (30, "triggers[4].host: [::1]: write an IPv6 address without its brackets"),
        (34, "triggers[5].host: kiosk..lan is neither an IP address nor a host name"),
    ]:
        assert f"config.yaml:{line}: {mistake}" in err, (mistake, err)
    assert "8 mistakes in" in err


async def test_check_config_and_doctor_warn_of_an_address_not_on_this_machine_now(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Valid (DHCP may give it at boot: the agent waits for it), but said, with its line."""
    missing = Address().host
    path = _config(tmp_path, "triggers:\n" + _kiosk_api("screen", missing)
                   + _kiosk_api("till", "127.0.0.1") + textwrap.dedent(f"""\
                   admin:
                     host: {missing}
                     tokens: [{{name: tech, token: !secret admin_token}}]
                   """))
    assert main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert f"{path}: valid" in out
    first, second = err.splitlines()  # in the file's order
    assert first.startswith(
        f"warning: config.yaml:8: triggers[0].host: {missing} is not on this machine now: the "
        "agent waits for it (a LAN address DHCP gives at boot) and serves once it appears; if "
        "it never will, change the host"), first
    assert second.startswith(f"warning: config.yaml:14: admin.host: {missing} is not on this "
                             "machine now: "), second
    assert main(["check-config", str(path), "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert [w.split(": ")[1] for w in warnings] == ["triggers[0].host", "admin.host"]

    report = Report()
    await check_listen_addresses(report, load_config(path))
    [check] = report.checks
    assert (check.name, check.verdict) == ("listen addresses", Verdict.WARN)
    assert check.detail == "2 of 3 not on this machine now: served once they are"
    assert sorted(note.split(":")[0] for note in check.notes) == ["admin.host",
                                                                   "triggers[0].host"]
    assert all(f": {missing} is not on this machine now" in note for note in check.notes)


async def test_doctor_passes_hosts_on_this_machine(tmp_path: Path) -> None:
    path = _config(tmp_path, "triggers:\n" + _kiosk_api("screen", "127.0.0.1")
                   + _kiosk_api("all", "0.0.0.0"))  # noqa: S104
    report = Report()
    await check_listen_addresses(report, load_config(path))
    [check] = report.checks
    assert (check.name, check.verdict) == ("listen addresses", Verdict.PASS)
    assert check.detail == ("triggers[0].host 127.0.0.1, triggers[1].host 0.0.0.0: on this "
                            "machine")


async def test_a_name_that_does_not_resolve_is_refused_in_words_not_an_errno() -> None:
    """Before: `cannot listen on ...: unknown error -2; check the host and port`. A site that
    does not wait (the agent's own servers do: tests/web/test_name_wait.py)."""
    site = LocalSite("no-such-host.invalid", 0, name="admin", wait_for_port=False)
    with pytest.raises(ListenError) as refused:
        await site.start(web.Application())
    text = str(refused.value)
    assert text.startswith("[Errno -2] admin: cannot listen on no-such-host.invalid:0: "), text
    assert "unknown error" not in text
    assert text.endswith("the name does not resolve here: correct the host, or write its "
                         "address"), text
