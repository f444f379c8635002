import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.cli import main
from kiosk_agent.cli.sim import parse_ready
from kiosk_agent.sim.server import SimOptions, SimServer

from ..child_signals import send_signal
from .sim_api import Api
from .test_vault import ACCOUNT


async def test_ready_info_names_addresses_and_seeded_credentials(sim: SimServer) -> None:
    info = sim.ready_info()
    assert info["base_url"] == f"http://127.0.0.1:{sim.port}"
    assert info["reporting_url"] == info["base_url"]
    assert info["ws_url"] == f"ws://127.0.0.1:{sim.port}"
    assert info["api_key"] == "sim_api_key"
    assert info["refresh_token"] == "sim_refresh_token"
    assert info["isv_api_key"] == "sim_isv_key"
    assert info["mid"] == "999000000001"
    assert info["isv_mids"] == ["999000000001", "999000000002"]
    assert (info["client_id"], info["client_secret"]) == ("sim_client", "sim_secret")
    # the sim fixture runs 50 times faster: interactions live 180 / 50 real seconds
    assert (info["time_scale"], info["interaction_lifetime_s"]) == (50, 3.6)


async def test_unknown_path_is_a_json_404(sim: SimServer) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"{sim.base_url}/nowhere") as resp:
        assert resp.status == 404
        assert (await resp.json())["error"] == "not_found"


async def test_settle_helper_answers_settled_and_deposits(sim: SimServer) -> None:
    async with aiohttp.ClientSession() as http, http.post(f"{sim.base_url}/sim/settle") as resp:
        assert resp.status == 200
        body = await resp.json()
    assert set(body) == {"settled", "deposits"}


async def test_a_restart_on_the_data_dir_loses_nothing(sim_factory: Any, tmp_path: Path) -> None:
    first = await sim_factory(data_dir=tmp_path, time_scale=1000)
    assert first.ready_info()["refresh_token"] == "sim_refresh_token"
    async with aiohttp.ClientSession() as http:
        api = Api(http, first.base_url, "sim_api_key")
        sale = await api.charge(1234, order_id="persist-1")
        _, keys = await api.post("/api/v1/api_keys/refresh", {"token": "sim_refresh_token"})
        _, account = await api.post("/api/v1/vault_payment_accounts", ACCOUNT)
        _, pending = await api.post("/api/terminal/SIM-0001/read-card", {"amount": 1005})
        await first.stop()

        second = await sim_factory(data_dir=tmp_path, time_scale=1000)
        api = Api(http, second.base_url, keys["api_key"])
        assert second.ctx is not None
        assert second.ctx.ledger.get(sale["trans_id"])["amount_cents"] == 1234
        assert (await api.charge(1234, order_id="persist-1"))["trans_id"] == sale["trans_id"]
        assert (await api.get(f"/api/v1/vault_payment_accounts/{account['uuid']}"))[0] == 200
        status, body = await api.post(
            "/api/v1/api_keys/refresh", {"token": "sim_refresh_token"}, key="sim_api_key"
        )
        assert (status, body["error"]) == (401, "invalid_grant")
        # READY offers no spent token: sim_api_key has no live refresh token any more
        assert second.ready_info()["refresh_token"] is None
        assert second.ready_info()["api_key"] == "sim_api_key"
        # the interaction left pending carries on and expires on the restored clock
        path = f"/api/terminal/SIM-0001/read-card/{pending['interaction_id']}"
        async with asyncio.timeout(10):  # 0.18 s at this scale; a busy machine gets room
            while (record := (await api.get(path))[1])["status"] == "pending":
                await asyncio.sleep(0.01)
        assert record["status"] == "expired"


async def test_kiosk_agent_sim_prints_ready_and_stops_on_sigterm(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("kiosk-agent")),
        *("sim", "--port", "0", "--time-scale", "10", "--transactions", "20"),
        *("--data-dir", str(tmp_path)),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 20)).decode()
        info = parse_ready(line)
        assert info is not None, line
        async with aiohttp.ClientSession() as http:
            api = Api(http, info["base_url"], info["api_key"])
            status, body = await api.get("/api/terminal")
            assert (status, len(body["terminals"])) == (200, 8)
    finally:
        send_signal(process, signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 10) == 0
    assert (tmp_path / "sim.db").exists()


# The command's refusals, through its own main() in this process: the installed command's start
# is the test above's (a cold interpreter each was a second of CPU for what argparse and the
# simulator's start say).
def test_kiosk_agent_sim_refuses_a_bad_rate_limit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["sim", "--rate-limit", "fast"])
    assert refused.value.code == 2
    assert "R/S" in capsys.readouterr().err


def test_kiosk_agent_sim_explains_a_data_dir_it_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    assert main(["sim", "--port", "0", "--data-dir", str(not_a_dir)]) == 1
    said = capsys.readouterr().err
    assert "cannot start the simulator" in said
    assert "Traceback" not in said


async def test_a_busy_port_is_an_error_and_the_server_can_try_again(sim: SimServer) -> None:
    clash = SimServer(SimOptions(port=sim.port))
    with pytest.raises(OSError, match="address already in use"):
        await clash.start()
    clash.options.port = 0
    await clash.start()
    assert clash.port != sim.port
    await clash.stop()


@pytest.mark.parametrize(
    "argv",
    [
        ["--time-scale", "0"],
        ["--time-scale", "nan"],
        ["--transactions", "-5"],
        ["--port", "70000"],
        ["--rate-limit", "20/x"],
    ],
)
def test_sim_command_line_refuses_bad_values(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from kiosk_agent.cli import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser("sim").parse_args(["sim", *argv])
    assert exited.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_sim_command_line_maps_onto_sim_options(tmp_path: Path) -> None:
    from kiosk_agent.cli import build_parser
    from kiosk_agent.cli.sim import options_from_args

    args = build_parser("sim").parse_args(
        ["sim", "--port", "0", "--time-scale", "60", "--seed", "7", "--transactions", "5",
         "--rate-limit", "50/1", "--data-dir", str(tmp_path), "--chaos"]
    )  # fmt: skip
    assert options_from_args(args) == SimOptions(
        port=0, time_scale=60, seed=7, transactions=5, rate_limit="50/1", data_dir=tmp_path,
        chaos=True,
    )  # fmt: skip
