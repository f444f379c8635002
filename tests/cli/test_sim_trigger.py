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
