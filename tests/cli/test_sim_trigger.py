"""`kiosk-agent sim trigger ...`: the simulator's test helpers, played from the command line."""

from __future__ import annotations

import json
import signal

import aiohttp
import pytest

from kiosk_agent.cli import build_parser
from kiosk_agent.sim.server import SimServer
from tests.child_signals import stop
from tests.helpers import free_port


async def trigger(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    args = build_parser("sim").parse_args(["sim", "trigger", *argv])
    code = await args.handler(args)
    out, err = capsys.readouterr()
    return code, out, err


async def test_a_reader_goes_offline_and_comes_back(
    sim: SimServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = await trigger(capsys, "terminal-offline", "SIM-0003", "--url", sim.base_url)
    assert (code, out) == (0, "SIM-0003 is offline\n")
    async with aiohttp.ClientSession() as http:
        ping = await http.post(f"{sim.base_url}/api/terminal/SIM-0003/ping",
                               headers={"Authorization": "Bearer sim_api_key"})
        assert (await ping.json())["online"] is False
    code, out, _ = await trigger(capsys, "terminal-online", "SIM-0003", "--url", sim.base_url)
    assert (code, out) == (0, "SIM-0003 is online\n")


async def test_settle_and_merchant_status_from_the_environment(
    sim: SimServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIOSK_BASE_URL", sim.base_url)
    code, out, _ = await trigger(capsys, "settle")
    assert code == 0
    assert out.startswith("settled ")
    code, out, err = await trigger(capsys, "merchant-status", "424242", "live", "--json")
    assert code == 1  # no such merchant: the simulator's words, and JSON for a script
    assert "merchant_not_found" in err
    assert json.loads(out)["exit_code"] == 1


async def test_no_simulator_there_is_exit_4_in_plain_words(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: `ClientConnectorError ... ssl:default [Connect call failed ...]`."""
    url = f"http://127.0.0.1:{free_port()}"
    code, _, err = await trigger(capsys, "settle", "--url", url, "--timeout", "1")
    assert code == 4
    assert err.splitlines()[0] == (
        f"error: no simulator at {url}: cannot connect to 127.0.0.1:{url.rsplit(':', 1)[1]}: "
        "nothing listens there (connection refused)"
    )
    assert "ClientConnectorError" not in err
    assert "ssl:default" not in err


async def test_ready_made_sales_approved_and_declined_as_reporting_holds_them(
    sim: SimServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = await trigger(capsys, "sale", "--url", sim.base_url, "--terminal", "SIM-0002")
    assert code == 0
    trans_id = out.rsplit(" ", 1)[1].strip()
    assert out == f"SIM-0002: $2.50 approved, transaction {trans_id}\n"
    code, out, _ = await trigger(capsys, "declined", "--url", sim.base_url, "--json")
    answer = json.loads(out)
    assert (code, answer["status"], answer["result"]["result"]) == (0, "succeeded", "C")
    async with aiohttp.ClientSession() as http:
        listed = await http.get(f"{sim.base_url}/sim/stats")
        assert listed.status == 200


async def test_faults_by_name_no_json_to_write(
    sim: SimServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = await trigger(capsys, "service-500", "--url", sim.base_url)
    assert (code, out) == (0, "armed f1: the next 1 call(s) to POST /api/v1/* answered 500, "
                              "nothing made (0 taken so far); `kiosk-agent sim trigger clear` "
                              "disarms it\n")
    code, out, _ = await trigger(capsys, "lost-answer", "--url", sim.base_url, "--count", "2")
    assert out.startswith("armed f2: the next 2 call(s) to POST /api/v1/charge made, then its "
                          "answer lost")
    code, out, _ = await trigger(capsys, "fault", "LATENCY", "--delay", "0.5", "--path",
                                 "/api/terminal/*", "--url", sim.base_url)
    assert out.startswith("armed f3: every call to POST /api/terminal/* slowed down by 0.5 s (")
    async with aiohttp.ClientSession() as http:  # what the simulator holds, not what was said
        armed = (await (await http.get(f"{sim.base_url}/sim/faults")).json())["faults"]
    assert [(f["fault"], f["path"], f["count"]) for f in armed] == [
        ("server_error", "/api/v1/*", 1), ("drop_answer", "/api/v1/charge", 2),
        ("latency", "/api/terminal/*", None),
    ]
    assert armed[2]["delay_s"] == 0.5
    code, out, _ = await trigger(capsys, "faults", "--url", sim.base_url)
    assert len(out.splitlines()) == 3
    code, out, _ = await trigger(capsys, "clear", "--url", sim.base_url)
    assert (code, out) == (0, "every fault disarmed\n")
    code, out, _ = await trigger(capsys, "faults", "--url", sim.base_url)
    assert out == "no fault armed\n"


async def test_reader_offline_is_the_terminals_helper(
    sim: SimServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = await trigger(capsys, "reader-offline", "SIM-0004", "--url", sim.base_url)
    assert (code, out) == (0, "SIM-0004 is offline\n")
    code, out, _ = await trigger(capsys, "reader-online", "SIM-0004", "--url", sim.base_url)
    assert (code, out) == (0, "SIM-0004 is online\n")


def test_the_parsers_copies_are_the_simulators() -> None:
    from kiosk_agent.cli.sim import FAULTS, SIM_API_KEY
    from kiosk_agent.sim import auth, faults

    assert faults.FAULTS == FAULTS
    assert auth.API_KEY == SIM_API_KEY


async def test_sim_verbose_logs_each_request_and_event_on_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`kiosk-agent sim -v` as a developer runs it: READY on stdout, one line per request and
    per event on stderr."""
    import asyncio
    import os

    from kiosk_agent.cli.sim import parse_ready
    from tests.assembly.crash_driver import PipedCommand

    # its own process, forked from the test process's warm server (not a cold interpreter)
    process = await PipedCommand.start(
        ["sim", "-v", "--port", "0", "--time-scale", "50", "--transactions", "10"],
        dict(os.environ),
    )
    try:
        assert process.stdout is not None
        assert process.stderr is not None
        info = parse_ready((await asyncio.wait_for(process.stdout.readline(), 30)).decode())
        assert info is not None
        code, _, _ = await trigger(capsys, "terminal-offline", "SIM-0003", "--url",
                                   info["base_url"])
        assert code == 0
        lines: list[str] = []
        while not any("event: terminal SIM-0003 offline" in line for line in lines) or not any(
            "POST /sim/terminals/SIM-0003/offline" in line for line in lines
        ):
            lines.append((await asyncio.wait_for(process.stderr.readline(), 10)).decode())
        request = next(line for line in lines if "POST /sim/terminals/SIM-0003/offline" in line)
        assert " 200 " in request
    finally:
        await stop(process, signal.SIGTERM)


def test_the_trigger_option_offers_who_the_service_says_may_move_a_merchant() -> None:
    # the parser's list is kept without pydantic (--help and completion stay quick)
    from kiosk_agent.cli.sim import MERCHANT_TRIGGERS
    from kiosk_agent.service.models.boarding import MerchantTrigger

    assert tuple(t.value for t in MerchantTrigger) == MERCHANT_TRIGGERS
    args = build_parser("sim").parse_args(
        ["sim", "trigger", "merchant-status", "1", "live", "--trigger", "SYSTEM"]
    )
    assert args.moved_by == "system"
