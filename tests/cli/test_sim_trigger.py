"""`kiosk-agent sim trigger ...`: the simulator's test helpers, played from the command line."""

from __future__ import annotations

import json

import aiohttp
import pytest

from kiosk_agent.cli import build_parser
from kiosk_agent.sim.server import SimServer


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


async def test_no_simulator_there_is_exit_4(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = await trigger(capsys, "settle", "--url", "http://127.0.0.1:9", "--timeout", "1")
    assert code == 4
    assert err.startswith("error: no simulator answered at http://127.0.0.1:9")


async def test_sim_verbose_logs_each_request_and_event_on_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`kiosk-agent sim -v` as a developer runs it: READY on stdout, one line per request and
    per event on stderr."""
    import asyncio
    import sys

    from kiosk_agent.cli.sim import parse_ready

    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kiosk_agent", "sim", "-v", "--port", "0", "--time-scale", "50",
        "--transactions", "10", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
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
        process.terminate()
        await process.wait()


def test_the_trigger_option_offers_who_the_service_says_may_move_a_merchant() -> None:
    # the parser's list is kept without pydantic (--help and completion stay quick)
    from kiosk_agent.cli.sim import MERCHANT_TRIGGERS
    from kiosk_agent.service.models.boarding import MerchantTrigger

    assert tuple(t.value for t in MerchantTrigger) == MERCHANT_TRIGGERS
    args = build_parser("sim").parse_args(
        ["sim", "trigger", "merchant-status", "1", "live", "--trigger", "SYSTEM"]
    )
    assert args.moved_by == "system"
