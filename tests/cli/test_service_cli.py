"""`kiosk-agent terminals|report|payments|vault|plans|hpp|boarding|keys` against the simulator.

Most commands run in-process through the real parser and handler (the simulator shares the test's
event loop); a few run as a real subprocess to prove the entry point, the exit codes and that no
traceback ever reaches a person.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import os
import re
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.cli import build_parser, service_access
from kiosk_agent.cli import contract as cli
from kiosk_agent.cli.waiting import Progress
from kiosk_agent.sim.server import SimServer

SECRET_VALUES = ("sim_api_key", "sim_secret", "sim_refresh_token")


@pytest.fixture
def env(sim: SimServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Credentials for ``sim`` in the environment, as a tech would export them."""
    info = sim.ready_info()
    values = {
        "KIOSK_BASE_URL": info["base_url"],
        "KIOSK_API_KEY": info["api_key"],
        "KIOSK_MID": info["mid"],
        "KIOSK_CLIENT_ID": info["client_id"],
        "KIOSK_CLIENT_SECRET": info["client_secret"],
    }
    for name in cli.ENVIRONMENT.values():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(cli.CONFIG_ENV, raising=False)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


class Ran:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:
        return f"Ran(code={self.code}, out={self.out[:400]!r}, err={self.err!r})"


async def kiosk(capsys: pytest.CaptureFixture[str], *argv: str) -> Ran:
    """Run one command in-process, exactly as ``kiosk-agent`` parses and dispatches it."""
    args = build_parser(argv[0]).parse_args(list(argv))
    code = await args.handler(args)
    captured = capsys.readouterr()
    ran = Ran(code, captured.out, captured.err)
    for secret in SECRET_VALUES:
        assert secret not in ran.out + ran.err, ran
    return ran


async def sim_post(sim: SimServer, path: str) -> None:
    async with aiohttp.ClientSession() as session, session.post(f"{sim.base_url}{path}") as resp:
        assert resp.status == 200


# -- terminals ------------------------------------------------------------------------------------


async def test_terminals_lists_every_reader_with_capabilities_and_state(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], sim: SimServer
) -> None:
    ran = await kiosk(capsys, "terminals")
    assert ran.code == 0, ran
    lines = ran.out.splitlines()
    assert lines[0].split()[:6] == ["DEVICE", "CONFIGURED", "SERVICE", "NAME", "VENDOR", "MODEL"]
    assert sum(line.startswith("SIM-00") for line in lines) == 8
    assert "all 8 terminals online" in ran.out

    await sim_post(sim, "/sim/terminals/SIM-0003/offline")
    ran = await kiosk(capsys, "terminals", "--json")
    listed = {t["device_id"]: t for t in json.loads(ran.out)}
    assert listed["SIM-0003"]["online"] is False
    assert listed["SIM-0007"]["capabilities"]["receipt_printing"] is True
    assert ran.code == 1  # a reader offline is a failed check, in JSON too
    ran = await kiosk(capsys, "terminals", "list")
    assert ran.code == 1
    assert "1 of 8 offline: SIM-0003" in ran.out
    assert "Fix:" in ran.out


@pytest.fixture
async def agents_admin_api() -> Any:
    """A stand-in for the admin API of an agent that runs a simulator of its own: its
    ``GET /api/terminals`` (the admin server's answer: the service's models as JSON), with one
    reader the agent's simulator has offline; what it was asked, with which token, is kept."""
    from aiohttp import web

    from kiosk_agent.export import json_value
    from kiosk_agent.service.models.terminal import Terminal

    asked: list[tuple[str, str]] = []
    readers = [
        Terminal(device_id="SIM-0001", name="Counter 1", vendor="Simtronic", model="ST-100",
                 online=True, last_seen_at="2026-11-28T21:47:03Z"),
        Terminal(device_id="SIM-0003", name="Drive-through", vendor="Simtronic",
                 model="ST-300", online=False),
    ]

    async def terminals(request: web.Request) -> web.Response:
        asked.append((request.path, request.headers.get("Authorization", "")))
        return web.json_response({"terminals": [json_value(t) for t in readers]})

    app = web.Application()
    app.router.add_get("/api/terminals", terminals)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1], asked
    finally:
        await runner.cleanup()


def agent_config(tmp_path: Path, admin_port: int) -> Path:
    """A unit on the embedded simulator, with the admin API its agent serves."""
    config = tmp_path / "unit.yaml"
    config.write_text(
        "service: {simulator: {time_scale: 60}}\n"
        "terminals: [{device_id: SIM-0001, name: front}, {device_id: SIM-0003, name: drive}]\n"
        "journal: {path: journal.db}\n"
        f"admin: {{port: {admin_port}, tokens: [{{name: tech, token: !env_var "
        "KIOSK_TEST_ADMIN_TOKEN}]}\n"
    )
    return config


async def test_terminals_asks_the_running_agent_for_its_simulators_readers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    agents_admin_api: tuple[int, list[tuple[str, str]]],
) -> None:
    """With a configuration that embeds the simulator, `terminals` started a simulator of its
    own (a second of CPU here) and listed ITS readers, fresh and all online, while the agent
    running on that configuration had one offline. It now asks that agent."""
    port, asked = agents_admin_api
    for name in cli.ENVIRONMENT.values():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KIOSK_TEST_ADMIN_TOKEN", "a" * 24)
    config = agent_config(tmp_path, port)
    ran = await kiosk(capsys, "terminals", "-c", str(config))
    assert ran.code == 1, ran  # the agent's reader offline: a failed check
    assert asked == [("/api/terminals", "Bearer " + "a" * 24)]
    assert "started the embedded simulator" not in ran.err
    assert f"the terminals of the agent running on it (http://127.0.0.1:{port})" in ran.err
    rows = {line.split()[0]: line.split() for line in ran.out.splitlines()[1:3]}
    assert rows["SIM-0001"][1:3] == ["front", "Counter"]
    assert rows["SIM-0003"][1] == "drive"
    assert "2026-11-28 21:47:03Z" in ran.out
    assert "1 of 2 offline: SIM-0003" in ran.out
    ran = await kiosk(capsys, "terminals", "list", "--json", "-c", str(config))
    listed = {t["device_id"]: t for t in json.loads(ran.out)}
    assert listed["SIM-0003"]["online"] is False
    assert listed["SIM-0003"]["configured_name"] == "drive"
    assert listed["SIM-0001"]["last_seen_at"] == "2026-11-28T21:47:03Z"
    # as a command: neither the simulator nor the service client is imported for it
    probe = ("import contextlib, io, sys\nfrom kiosk_agent.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    code = main(['terminals', '-c', sys.argv[1]])\n"
             "heavy = [m for m in ('aiohttp', 'asyncio', 'pydantic', 'kiosk_agent.sim') "
             "if m in sys.modules]\nprint(code, heavy)\n")
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-c", probe, str(config), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, _err = await asyncio.wait_for(done.communicate(), 60)
    assert out.decode().split("\n")[-2] == "1 []"


async def test_terminals_says_at_once_that_no_agent_runs_on_a_simulator_configuration(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """No agent listens at the configuration's admin API: `terminals` started a simulator of
    its own (1.2-1.3 s on a 2-core machine) and listed its 8 fresh readers, none of them the
    unit's (the simulator the configuration names runs inside the agent). It now says at once
    that no agent runs, names the configured readers, and starts nothing (exit 4: the service
    cannot be reached)."""
    from tests.helpers import free_port

    for name in cli.ENVIRONMENT.values():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KIOSK_TEST_ADMIN_TOKEN", "a" * 24)
    port = free_port()
    config = agent_config(tmp_path, port)
    ran = await kiosk(capsys, "terminals", "-c", str(config))
    assert ran.code == 4, ran
    assert ran.out == ""
    assert (f"error: no agent runs on {config}: nothing listens at its admin API "
            f"(http://127.0.0.1:{port}); its service is the embedded simulator") in ran.err
    assert "its readers: SIM-0001 (front), SIM-0003 (drive)" in ran.err
    assert f"start it (`kiosk-agent run -c {config}`) and ask again" in ran.err
    assert "started the embedded simulator" not in ran.err
    assert not (tmp_path / "journal.db").exists()  # nothing of the unit's touched
    ran = await kiosk(capsys, "terminals", "list", "--json", "-c", str(config))
    answer = json.loads(ran.out)
    assert answer["exit_code"] == 4
    assert "its readers: SIM-0001 (front), SIM-0003 (drive)" in answer["details"]
    # without an admin: section there is no agent to ask either: said as such
    config.write_text(config.read_text().split("admin:")[0])
    ran = await kiosk(capsys, "terminals", "-c", str(config))
    assert ran.code == 4, ran
    assert f"{config} has no admin: section to ask its agent" in ran.err
    # as a command: no simulator, no service client, no event loop for it
    probe = ("import contextlib, io, sys\nfrom kiosk_agent.cli import main\n"
             "with contextlib.redirect_stderr(io.StringIO()):\n"
             "    code = main(['terminals', '-c', sys.argv[1]])\n"
             "heavy = [m for m in ('aiohttp', 'asyncio', 'pydantic', 'kiosk_agent.sim') "
             "if m in sys.modules]\nprint(code, heavy)\n")
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-c", probe, str(agent_config(tmp_path, port)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _err = await asyncio.wait_for(done.communicate(), 60)
    assert out.decode().split("\n")[-2] == "4 []"


async def test_terminals_on_a_real_service_asks_it_through_its_running_agent(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    sim: SimServer, agents_admin_api: tuple[int, list[tuple[str, str]]],
) -> None:
    """On a unit whose service is a real one, `terminals` made a service client of its own
    (aiohttp, pydantic, the OAuth exchange: 1.3 s of CPU and 7.7 s wall on the 200,000-sale
    bench's loaded machine) while its agent, which asks the service at once for its admin
    API's GET /api/terminals, ran beside it. It asks that agent now; with none to ask, the
    service itself, as before."""
    from tests.helpers import free_port, service_yaml

    port, asked = agents_admin_api
    info = sim.ready_info()
    for name in cli.ENVIRONMENT.values():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KIOSK_API_KEY", info["api_key"])
    monkeypatch.setenv("KIOSK_CLIENT_SECRET", info["client_secret"])
    monkeypatch.setenv("KIOSK_TEST_ADMIN_TOKEN", "a" * 24)
    config = agent_config(tmp_path, port)
    config.write_text(config.read_text().replace(
        "service: {simulator: {time_scale: 60}}\n", service_yaml(info)))
    ran = await kiosk(capsys, "terminals", "-c", str(config))
    assert asked == [("/api/terminals", "Bearer " + "a" * 24)]
    assert ran.code == 1, ran  # the agent's answer: its reader offline
    assert "1 of 2 offline: SIM-0003" in ran.out
    assert f"as the agent running on it (http://127.0.0.1:{port})" in ran.err
    # no agent listens there: the service itself (the simulator's eight readers, online)
    config.write_text(config.read_text().replace(f"port: {port}", f"port: {free_port()}"))
    ran = await kiosk(capsys, "terminals", "-c", str(config))
    assert ran.code == 0, ran
    assert "all 8 terminals online" in ran.out
    assert len(asked) == 1


async def test_ping_gives_a_verdict_and_a_fix(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], sim: SimServer
) -> None:
    ran = await kiosk(capsys, "terminals", "ping", "SIM-0001")
    assert ran.code == 0
    assert ran.out.startswith("OK    SIM-0001 is online")

    await sim_post(sim, "/sim/terminals/SIM-0004/offline")
    ran = await kiosk(capsys, "terminals", "ping", "SIM-0004")
    assert ran.code == 1
    assert ran.out.startswith("DOWN  SIM-0004 does not answer")
    assert "Fix:" in ran.out

    ran = await kiosk(capsys, "terminals", "ping", "SIM-9999")
    assert ran.code == 1
    assert ran.err == (
        "error: no terminal SIM-9999 on this account; `kiosk-agent terminals` lists them\n"
    )


async def test_connect_opens_a_session_or_says_why_not(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], sim: SimServer
) -> None:
    ran = await kiosk(capsys, "terminals", "connect", "SIM-0002")
    assert (ran.code, ran.out) == (0, "OK    SIM-0002 session open\n")
    await sim_post(sim, "/sim/terminals/SIM-0005/offline")
    ran = await kiosk(capsys, "terminals", "connect", "SIM-0005")
    assert ran.code == 1
    assert ran.err == (
        "error: SIM-0005: no session: terminal offline: SIM-0005 does not answer (check its "
        "power and network). Fix: `kiosk-agent terminals ping SIM-0005` to see whether it is "
        "online.\n"
    )  # offline, in words: not "busy", not "HTTP 409 [terminal_offline]"


async def test_test_print_checks_the_capability_before_printing(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    ran = await kiosk(capsys, "terminals", "test-print", "SIM-0001")
    assert ran.code == 1
    assert "SIM-0001 has no receipt printer" in ran.err
    assert "Readers that print: SIM-0007, SIM-0008" in ran.err

    charged = await kiosk(capsys, "payments", "charge", "--amount", "1.50",
                          "--token", "tok_4111111111111111", "--expiration", "1230", "--json")
    trans_id = json.loads(charged.out)["trans_id"]
    ran = await kiosk(capsys, "terminals", "test-print", "SIM-0007", "--trans-id", trans_id)
    assert ran.code == 0
    assert ran.out == f"OK    SIM-0007 printed the receipt of transaction {trans_id}\n"
    ran = await kiosk(capsys, "terminals", "test-print", "SIM-0008")  # the latest transaction
    assert ran.code == 0, ran
    assert "SIM-0008 printed the receipt" in ran.out


# -- reports --------------------------------------------------------------------------------------


async def test_report_formats_stream_the_same_records(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    table = await kiosk(capsys, "report", "transactions", "--limit", "40", "--page-size", "15")
    as_csv = await kiosk(capsys, "report", "transactions", "--limit", "40", "--format", "csv")
    as_json = await kiosk(capsys, "report", "transactions", "--limit", "40", "--format", "json")
    assert table.code == as_csv.code == as_json.code == 0
    rows = list(csv.DictReader(io.StringIO(as_csv.out)))
    records = json.loads(as_json.out)
    assert len(rows) == len(records) == 40
    assert len(table.out.splitlines()) == 41
    assert [r["trans_id"] for r in rows] == [r["trans_id"] for r in records]
    assert [r["amount"] for r in rows] == [r["amount"] for r in records]  # "12.50", exact
    assert all("." in r["amount"] and len(r["amount"].split(".")[1]) == 2 for r in rows)
    assert all("account_token" not in r for r in records)
    assert "40 transactions in" in as_json.err


async def test_report_filters_by_attribute_status_and_time(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    settled = await kiosk(capsys, "report", "transactions", "--status", "settled", "--format",
                          "csv", "--mid", env["KIOSK_MID"])
    rows = list(csv.DictReader(io.StringIO(settled.out)))
    assert rows
    assert {r["status"] for r in rows} == {"settled"}
    assert {r["mid"] for r in rows} == {env["KIOSK_MID"]}

    one = rows[len(rows) // 2]
    by_order = await kiosk(capsys, "report", "transactions", "--order-id", one["order_id"],
                           "--format", "json")
    assert [r["trans_id"] for r in json.loads(by_order.out)] == [one["trans_id"]]

    day = one["trans_date"][:10]
    window = await kiosk(capsys, "report", "transactions", "--since", day, "--until", day,
                         "--format", "csv")
    dates = {r["trans_date"][:10] for r in csv.DictReader(io.StringIO(window.out))}
    assert dates == {day}

    cases = await kiosk(capsys, "report", "chargebacks", "--status", "OPEN", "--format", "json")
    assert {c["status"] for c in json.loads(cases.out)} <= {"OPEN"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["report", "transactions", "--status", "bogus"], "--status: unknown transaction status"),
        (["report", "deposits", "--order-id", "x"], "--order-id does not apply to deposits"),
        (["report", "adjustments", "--status", "OPEN"], "--status does not apply to adjustments"),
        (["report", "chargebacks", "--status", "MAYBE"], "--status"),
        (["report", "transactions", "--since", "last week"], '--since: expected "today", '),
        (["report", "transactions", "--since", "2026-11-22", "--until", "2026-11-01"],
         "--since must be before --until"),
    ],
)
async def test_report_refuses_bad_filters_with_one_line(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    ran = await kiosk(capsys, *argv)
    assert ran.code == 2
    assert ran.err.startswith("error: ")
    assert message in ran.err
    assert ran.err.count("\n") == 1


@pytest.mark.parametrize("size", ["0", "1001", "many"])
def test_a_page_size_outside_1_to_1000_is_refused_before_anything_is_printed(
    size: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["report", "transactions", "--format", "csv", "--page-size", size]
    with pytest.raises(SystemExit) as refused:
        build_parser("report").parse_args(argv)
    assert refused.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""  # not a CSV header followed by an error
    assert "--page-size" in err


async def test_a_long_pull_shows_progress_and_stays_streamed(
    sim_factory: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = await sim_factory(seed=3, transactions=3000)
    info = sim.ready_info()
    monkeypatch.setenv("KIOSK_BASE_URL", info["base_url"])
    monkeypatch.setenv("KIOSK_CLIENT_ID", info["client_id"])
    monkeypatch.setenv("KIOSK_CLIENT_SECRET", info["client_secret"])
    monkeypatch.setattr(Progress, "PLAIN_INTERVAL_S", 0.0)
    ran = await kiosk(capsys, "report", "transactions", "--format", "csv", "--page-size", "1000")
    assert ran.code == 0
    assert len(ran.out.splitlines()) == 3001
    progress = [line for line in ran.err.splitlines() if "/s)" in line]
    assert progress
    assert all(re.fullmatch(r"[\d,]+ transactions \([\d,]+/s\)", line) for line in progress)
    assert ran.err.splitlines()[-1].startswith("3,000 transactions in ")
    quiet = await kiosk(capsys, "report", "deposits", "--quiet", "--limit", "3")
    assert quiet.err == ""


# -- payments, vault, plans, hosted pages -------------------------------------------------------


async def test_charge_capture_void_and_receipt(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("tok_4111111111111111\n"))
    auth = await kiosk(capsys, "payments", "charge", "--amount", "2.50", "--token", "-",
                       "--expiration", "1230", "--auth-only", "--order-id", "cli-auth-1")
    assert auth.code == 0, auth
    assert "A (approved)" in auth.out
    assert "$2.50" in auth.out
    assert "tok_4111111111111111" not in auth.out
    trans_id = next(line.split()[1] for line in auth.out.splitlines()
                    if line.startswith("trans_id"))

    captured = await kiosk(capsys, "payments", "capture", trans_id, "--amount", "2.00", "--json")
    assert json.loads(captured.out)["amount"] == "2.00"
    voided = await kiosk(capsys, "payments", "void", trans_id)
    assert voided.code == 0
    assert voided.out.startswith("outcome    voided")
    again = await kiosk(capsys, "payments", "void", trans_id)
    assert again.code == 1
    assert again.err.startswith("error: the service said no:")
    assert "already" in again.err

    receipt = await kiosk(capsys, "payments", "receipt", trans_id, "--email", "a@example.com")
    assert (receipt.code, receipt.out) == (0, "receipt sent\n")

    declined = await kiosk(capsys, "payments", "charge", "--amount", "3.02", "--token",
                           "tok_4111111111111111", "--expiration", "1230")
    assert declined.code == 1
    assert "C (declined)" in declined.out

    fee = await kiosk(capsys, "payments", "surcharge", "--amount", "10.00", "--bin", "411111",
                      "--json")
    quoted = json.loads(fee.out)
    expected = Decimal("10.00") * Decimal(quoted["surcharge_percent"]) / 100
    assert quoted["surcharge_amount"] == f"{expected:.2f}"  # dollars, exact, like every amount


@pytest.mark.parametrize("amount", ["2.555", "-1", "abc", "0", "2,50"])
async def test_amounts_are_dollar_strings_converted_exactly(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], amount: str
) -> None:
    ran = await kiosk(capsys, "payments", "charge", "--amount", amount, "--token", "t")
    assert ran.code == 2
    assert ran.err.startswith("error: amount")


async def test_a_token_charge_without_expiration_is_refused_before_sending(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIOSK_BASE_URL", "http://127.0.0.1:9")  # sent, it would fail with 4
    ran = await kiosk(capsys, "payments", "charge", "--amount", "2.50", "--token",
                      "tok_4111111111111111")
    assert ran.code == 2
    assert ran.err == (
        "error: payments charge --token needs --expiration MMYY (the card's expiry, e.g. 1230)\n"
    )


async def test_vault_and_plan_lifecycle(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    created = await kiosk(
        capsys, "vault", "create", "--token", "tok_4111111111111111", "--name", "Ann Lee",
        "--account-zip", "62701", "--address1", "1 Main St", "--city", "Springfield",
        "--region", "IL", "--country", "US", "--email", "ann@example.com", "--phone",
        "2175550100", "--expiration", "1230", "--json",
    )
    account = json.loads(created.out)
    assert account["last_four"] == "1111"
    assert "account_token" not in account
    uuid = account["uuid"]
    updated = await kiosk(capsys, "vault", "update", uuid, "--email", "new@example.com", "--json")
    assert json.loads(updated.out)["email"] == "new@example.com"

    plan = await kiosk(capsys, "plans", "create", "--name", "gym", "--vault-uuid", uuid,
                       "--amount", "9.99", "--start", "2026-12-01", "--until", "2027-03-01",
                       "--json")
    body = json.loads(plan.out)
    assert body["status"] == "ACTIVE"
    assert [p["payment_number"] for p in body["scheduled_payments"]] == [1, 2, 3, 4]
    shown = await kiosk(capsys, "plans", "get", str(body["id"]))
    assert re.search(r"^amount +\$9\.99$", shown.out, re.M), shown  # $9.99, as everywhere
    assert re.search(r"^  #1 +2026-12-01 00:00:00Z +\$9\.99  PENDING$", shown.out, re.M), shown
    cancelled = await kiosk(capsys, "plans", "cancel", str(body["id"]))
    assert "CANCELLED" in cancelled.out
    assert "SKIPPED" in cancelled.out
    missing = await kiosk(capsys, "plans", "get", "9999")
    assert missing.code == 1
    assert "9999" in missing.err

    deleted = await kiosk(capsys, "vault", "delete", uuid)
    assert deleted.out == f"deleted vault payment account {uuid}\n"
    gone = await kiosk(capsys, "vault", "get", uuid)
    assert gone.code == 1
    assert "404" in gone.err


async def test_hosted_page_create_and_edit(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    created = await kiosk(capsys, "hpp", "create", "--name", "Donate", "--amount", "25.00",
                          "--unlock-amount", "--min-amount", "5", "--max-amount", "100", "--json")
    page = json.loads(created.out)
    assert page["url"].endswith(page["page_id"])
    edited = await kiosk(capsys, "hpp", "edit", page["url"], "--amount", "30")
    assert edited.code == 0
    locked = await kiosk(capsys, "hpp", "create", "--name", "x", "--lock-amount", "--min-amount",
                         "1")
    assert locked.code == 2
    assert "min_amount and max_amount are valid only when lock_amount is false" in locked.err
    nothing = await kiosk(capsys, "hpp", "edit", page["page_id"])
    assert nothing.code == 2


# -- boarding and keys ----------------------------------------------------------------------------


async def test_boarding_commands(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    created = await kiosk(capsys, "boarding", "create", "--dba-name", "Corner Snacks", "--json")
    merchant_id = json.loads(created.out)["merchant_id"]
    assert json.loads(created.out)["status"] == "new"

    sent = await kiosk(capsys, "boarding", "update", str(merchant_id), "--status",
                       "sent_for_signature")
    assert sent.out.startswith("status              sent_for_signature")
    listed = await kiosk(capsys, "boarding", "merchants", "--status", "sent_for_signature",
                         "--format", "csv")
    assert str(merchant_id) in {r["merchant_id"] for r in csv.DictReader(io.StringIO(listed.out))}
    shown = await kiosk(capsys, "boarding", "merchant", str(merchant_id))
    assert "Corner Snacks" in shown.out

    refused = await kiosk(capsys, "boarding", "update", str(merchant_id), "--status", "live")
    assert refused.code == 1
    assert "merchant_status" in refused.err
    typo = await kiosk(capsys, "boarding", "update", str(merchant_id), "--status", "aproved")
    assert typo.code == 2
    assert typo.err.startswith("error: --status: unknown merchant status 'aproved'")


async def test_keys_refresh_saves_the_new_key_before_saying_so(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("KIOSK_REFRESH_TOKEN", "sim_refresh_token")
    refused = await kiosk(capsys, "keys", "refresh")
    assert refused.code == 2
    assert "refusing to rotate" in refused.err

    saved = tmp_path / "credentials.json"
    monkeypatch.setenv("KIOSK_CREDENTIALS_PATH", str(saved))
    rotated = await kiosk(capsys, "keys", "refresh")
    assert rotated.code == 0, rotated
    assert str(saved) in rotated.out
    assert saved.stat().st_mode & 0o077 == 0
    stored = json.loads(saved.read_text())
    assert stored["api_key"] not in rotated.out
    ping = await kiosk(capsys, "terminals", "ping", "SIM-0001")  # works with the rotated key
    assert ping.code == 0


# -- credentials ----------------------------------------------------------------------------------


async def test_credentials_come_from_the_config_file_with_secrets(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    for name in ("KIOSK_API_KEY", "KIOSK_CLIENT_SECRET", "KIOSK_BASE_URL"):
        monkeypatch.delenv(name)
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text(
        "api_key: sim_api_key\nrefresh_token: sim_refresh_token\nclient_secret: sim_secret\n"
    )
    secrets.chmod(0o600)
    config = tmp_path / "agent.yaml"
    config.write_text(
        "service:\n"
        f"  base_url: {env['KIOSK_BASE_URL']}\n"
        "  api_key: !secret api_key\n"
        "  refresh_token: !secret refresh_token\n"
        f"  mid: '{env['KIOSK_MID']}'\n"
        "  client_id: sim_client\n"
        "  client_secret: !secret client_secret\n"
        "terminals: [{device_id: SIM-0001, name: front}]\n"
        "journal: {path: state/journal.db}\n"
    )
    (tmp_path / "state").mkdir()
    ping = await kiosk(capsys, "terminals", "ping", "SIM-0001", "--config", str(config))
    assert ping.code == 0, ping
    monkeypatch.setenv(cli.CONFIG_ENV, str(config))
    pulled = await kiosk(capsys, "report", "deposits", "--limit", "2", "--format", "csv")
    assert len(pulled.out.splitlines()) == 3

    # The rotated key goes where the agent keeps it: keys.json beside the journal.
    rotated = await kiosk(capsys, "keys", "refresh")
    assert rotated.code == 0, rotated
    assert (tmp_path / "state" / "keys.json").is_file()
    # The provisioned pair is stale now; the saved one wins, as it does for the agent.
    secrets.write_text("api_key: stale\nrefresh_token: spent\nclient_secret: sim_secret\n")
    again = await kiosk(capsys, "terminals", "ping", "SIM-0002")
    assert again.code == 0, again

    secrets.write_text("api_key: sim_api_key\nrefresh_token: sim_refresh_token\n")
    broken = await kiosk(capsys, "report", "deposits", "--config", str(config))
    assert broken.code == 2
    assert "client_secret" in broken.err
    assert "agent.yaml:7" in broken.err


async def test_missing_credentials_name_the_variables(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KIOSK_API_KEY")
    ran = await kiosk(capsys, "terminals")
    assert ran.code == 2
    assert ran.err == (
        "error: no service credentials: set KIOSK_API_KEY in the environment, or give "
        "-c/--config FILE (or $KIOSK_CONFIG) with a service: section\n"
    )


async def test_a_config_without_client_id_names_the_missing_key(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    for name in ("KIOSK_CLIENT_ID", "KIOSK_CLIENT_SECRET", "KIOSK_BASE_URL"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("TEST_SECRET", "sim_secret")
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"service:\n  base_url: {env['KIOSK_BASE_URL']}\n"
        "  client_secret: !env_var TEST_SECRET\n  api_key: !env_var TEST_SECRET\n  mid: '1'\n"
        "terminals: [{device_id: SIM-0001}]\njournal: {path: journal.db}\n"
    )
    ran = await kiosk(capsys, "report", "transactions", "-c", str(config))
    assert ran.code == 2
    assert ran.err == (
        f"error: no service credentials: the service: section of {config} has no client_id; "
        "add it there, or set KIOSK_CLIENT_ID\n"
    )


async def test_an_unreachable_service_names_where_its_address_came_from(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    closed = "http://127.0.0.1:9"  # nothing listens on the discard port
    monkeypatch.setenv("KIOSK_BASE_URL", closed)
    ran = await kiosk(capsys, "terminals", "--timeout", "2")
    assert ran.code == 4
    # the retries end (or --timeout does first): either way the reason is said in words
    assert ran.err.startswith("error: service unreachable: list terminals: "), ran
    assert "cannot connect to 127.0.0.1:9: nothing listens there (connection refused)" in ran.err
    assert ran.err.endswith(
        ". Check KIOSK_BASE_URL and the network; --timeout gives slow links longer.\n"
    )
    assert ran.err.count("\n") == 1
    # from the configuration: its file and line, not a variable nobody set
    monkeypatch.delenv("KIOSK_BASE_URL")
    monkeypatch.setenv("TEST_SECRET", "sim_secret")
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"service:\n  api_key: !env_var TEST_SECRET\n  mid: '1'\n  base_url: {closed}\n"
        "terminals: [{device_id: SIM-0001}]\njournal: {path: journal.db}\n"
    )
    ran = await kiosk(capsys, "terminals", "-c", str(config), "--timeout", "2")
    assert ran.code == 4
    assert f"Check service.base_url at {config}:4 and the network" in ran.err
    for jargon in ("KIOSK_BASE_URL", "ssl:default", "ClientConnectorError", "Connect call"):
        assert jargon not in ran.err


async def test_reports_need_only_the_oauth_client(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KIOSK_API_KEY")
    monkeypatch.delenv("KIOSK_MID")
    args = build_parser("report").parse_args(["report", "deposits"])
    async with service_access.service_settings(args, needs="oauth") as settings:
        assert settings.api_key is None  # absent, not an empty string standing in for one
    ran = await kiosk(capsys, "report", "deposits", "--limit", "2", "--format", "csv")
    assert ran.code == 0, ran
    assert len(ran.out.splitlines()) == 3


def test_no_flag_takes_a_credential() -> None:
    """Shell history keeps flags: no option of these commands may carry a key or secret."""
    flags: set[str] = set()
    parsers = [build_parser(command) for command in ("terminals", "report", "payments", "keys")]
    while parsers:
        for action in parsers.pop()._actions:
            flags.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
    assert "--amount" in flags
    assert not [f for f in flags if any(word in f for word in ("key", "secret", "password"))]


# -- the real entry point -----------------------------------------------------------------------


async def run_process(env: dict[str, str], *argv: str, stdin: bytes = b"") -> Ran:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kiosk_agent", *argv,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, **env},
    )
    out, err = await asyncio.wait_for(process.communicate(stdin), timeout=30)
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


async def test_the_installed_command_reports_and_fails_cleanly(env: dict[str, str]) -> None:
    pulled = await run_process(env, "report", "deposits", "--limit", "3", "--format", "json")
    assert pulled.code == 0, pulled
    assert len(json.loads(pulled.out)) == 3
    wrong_key, unreachable = await asyncio.gather(  # the unreachable one backs off a while
        run_process({**env, "KIOSK_API_KEY": "wrong"}, "terminals"),
        run_process({**env, "KIOSK_BASE_URL": "http://127.0.0.1:9"}, "terminals"),
    )
    assert (wrong_key.code, unreachable.code) == (3, 4)
    for ran in (wrong_key, unreachable):
        assert ran.out == ""
        assert ran.err.startswith("error: ")
        assert ran.err.count("\n") == 1
        assert "Traceback" not in ran.err
        assert "wrong" not in ran.err  # the key given is never echoed


async def test_a_services_error_is_shown_and_never_obeyed_by_the_terminal(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The service's refusal echoes what it was sent (here a transaction id holding a terminal
    escape): the error line printed it raw, clearing the tech's screen and retitling it."""
    ran = await kiosk(capsys, "payments", "capture", "7000\x1b[2J\x1b]0;owned\x07")
    assert ran.code != 0
    assert "\x1b" not in ran.err
    assert "\x07" not in ran.err
    assert "7000\ufffd[2J\ufffd]0;owned\ufffd" in ran.err


async def test_terminals_show_the_configured_name_beside_the_services(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: only the service's names ("Counter 1"), not the configuration's, which the
    unit's triggers, logs and `events --terminal` use. (The service: the one of the
    environment, a simulator's, as a tech would point the command at it.)"""
    demo = str(Path(__file__).parents[2] / "config" / "demo.yaml")
    args = build_parser("terminals").parse_args(["terminals", "--config", demo, "--json"])
    await args.handler(args)
    listed = {t["device_id"]: t for t in json.loads(capsys.readouterr().out)}
    assert listed["SIM-0007"]["configured_name"] == "snacks-reader"
    assert listed["SIM-0001"]["configured_name"] is None  # not this unit's
    args = build_parser("terminals").parse_args(["terminals", "--config", demo])
    await args.handler(args)
    [row] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("SIM-0007")]
    assert row.split()[:2] == ["SIM-0007", "snacks-reader"]


def test_last_seen_is_never_in_the_future() -> None:
    """Before: a simulator run faster than real time showed a LAST SEEN ahead of the clock."""
    from datetime import UTC, datetime, timedelta

    from kiosk_agent.cli.terminals import seen

    now = datetime(2026, 11, 28, 19, 0, tzinfo=UTC)
    assert seen(now + timedelta(minutes=7), now) == "just now"
    assert seen(now - timedelta(minutes=7), now) == now - timedelta(minutes=7)
    assert seen(None, now) is None
