import aiohttp

from kiosk_agent.sim.server import SimServer


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


async def test_unknown_path_is_a_json_404(sim: SimServer) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"{sim.base_url}/nowhere") as resp:
        assert resp.status == 404
        assert (await resp.json())["error"] == "not_found"


async def test_settle_helper_answers_settled_and_deposits(sim: SimServer) -> None:
    async with aiohttp.ClientSession() as http, http.post(f"{sim.base_url}/sim/settle") as resp:
        assert resp.status == 200
        body = await resp.json()
    assert set(body) == {"settled", "deposits"}
