"""The rotated key and refresh token: saved atomically (0600) before use, refreshed once
however many calls race for it."""

from __future__ import annotations

import asyncio
import json
import stat
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from aiohttp import web

from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.credentials import ApiCredentials, CredentialStore
from kiosk_agent.service.errors import CredentialsError
from kiosk_agent.service.settings import ServiceSettings

from .scripted_server import ScriptedServer, json_reply

TERMINALS = "/api/terminal"
ONE_TERMINAL = {"terminals": [{"device_id": "SIM-0001", "online": True}]}


def key_set(n: int) -> dict[str, object]:
    now = int(time.time())
    return {
        "api_key": f"key-{n}",
        "public_key": "pub",
        "refresh_token": f"refresh-{n}",
        "api_key_expires_at": now + 3600,
        "refresh_token_expires_at": now + 30 * 86400,
    }


def test_store_round_trip_is_owner_only(tmp_path: Path) -> None:
    store = CredentialStore(tmp_path / "state" / "credentials.json")
    saved = ApiCredentials(api_key="k", refresh_token="r", api_key_expires_at=1.0)
    store.save(saved)
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert store.load() == saved
    assert [p.name for p in store.path.parent.iterdir()] == ["credentials.json"]  # no temp left


def test_store_missing_file_is_none_and_corrupt_file_is_a_clear_error(tmp_path: Path) -> None:
    store = CredentialStore(tmp_path / "credentials.json")
    assert store.load() is None
    store.path.write_text('{"api_key": ')
    with pytest.raises(CredentialsError, match="corrupt"):
        store.load()
    store.path.write_text('{"refresh_token": "r"}')
    with pytest.raises(CredentialsError, match="api_key"):
        store.load()


def test_credentials_repr_hides_secrets() -> None:
    text = repr(ApiCredentials(api_key="secret-key", refresh_token="secret-refresh"))
    assert "secret" not in text


def test_refresh_is_due_in_the_last_tenth_of_life_at_most_a_minute_early() -> None:
    now = 1_000_000.0
    hour = ApiCredentials(api_key="k", api_key_expires_at=now + 3600, issued_at=now)
    assert not hour.refresh_due(now + 3500)
    assert hour.refresh_due(now + 3541)
    short = ApiCredentials(api_key="k", api_key_expires_at=now + 10, issued_at=now)
    assert not short.refresh_due(now + 8.9)
    assert short.refresh_due(now + 9.1)
    assert not ApiCredentials(api_key="k").refresh_due(now)  # unknown expiry: never


def test_a_device_clock_far_off_neither_refreshes_every_call_nor_trusts_a_dead_key() -> None:
    service_now = 1_800_000_000.0
    ahead = service_now + 5 * 86400  # the kiosk's clock runs days ahead
    rotated = ApiCredentials(
        api_key="k", api_key_expires_at=service_now + 3600, issued_at=ahead
    )
    assert not rotated.refresh_due(ahead + 60)  # taken as an hour from when we got it
    assert rotated.refresh_due(ahead + 3550)
    assert rotated.expired(ahead + 3601)


async def test_rotated_key_is_on_disk_before_it_is_first_used(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    path = tmp_path / "credentials.json"
    seen_on_disk: list[str] = []

    async def terminals(request: web.Request) -> web.StreamResponse:
        if request.headers["Authorization"] == "Bearer key-1":
            return web.json_response({"error": "invalid_token"}, status=401)
        # the new key is in use: it must already be saved
        seen_on_disk.append(json.loads(path.read_text())["api_key"])
        return web.json_response(ONE_TERMINAL)

    scripted.script("GET", TERMINALS, terminals)
    scripted.script("POST", "/api/v1/api_keys/refresh", json_reply(key_set(2)))
    settings = ServiceSettings(
        base_url=scripted.url, api_key="key-1", refresh_token="refresh-1", mid="1",
        credentials_path=path,
    )
    async with ServiceClient(settings) as svc:
        await svc.terminal.list()
    assert seen_on_disk == ["key-2"]
    assert json.loads(path.read_text())["refresh_token"] == "refresh-2"

    # a restart picks the rotated pair from disk, not the spent one from the settings
    async with ServiceClient(settings) as svc:
        assert svc.keys.current.api_key == "key-2"


async def test_ten_calls_racing_an_expiring_key_refresh_it_once(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    path = tmp_path / "credentials.json"
    now = time.time()
    expiring = ApiCredentials(
        api_key="key-1", refresh_token="refresh-1", api_key_expires_at=now + 1, issued_at=now - 3599
    )
    path.write_text(json.dumps(asdict(expiring)))
    refreshes = 0

    async def refresh(request: web.Request) -> web.StreamResponse:
        nonlocal refreshes
        refreshes += 1
        await asyncio.sleep(0.05)  # long enough for every racer to arrive
        return web.json_response(key_set(2))

    scripted.script("POST", "/api/v1/api_keys/refresh", refresh)
    scripted.script("GET", TERMINALS, json_reply(ONE_TERMINAL))
    settings = ServiceSettings(base_url=scripted.url, api_key="x", mid="1", credentials_path=path)
    async with ServiceClient(settings) as svc:
        await asyncio.gather(*(svc.terminal.list() for _ in range(10)))
        assert svc.transport.keys.refresh_count == 1
    assert refreshes == 1
    keys = {r.headers["Authorization"] for r in scripted.requests if r.path == TERMINALS}
    assert keys == {"Bearer key-2"}


async def test_keys_refresh_on_demand(scripted: ScriptedServer) -> None:
    scripted.script("POST", "/api/v1/api_keys/refresh", json_reply(key_set(3)))
    settings = ServiceSettings(base_url=scripted.url, api_key="k", refresh_token="r", mid="1")
    async with ServiceClient(settings) as svc:
        rotated = await svc.keys.refresh()
    assert rotated.api_key == "key-3"
    assert rotated.refresh_token == "refresh-3"
    assert rotated.api_key_expires_at is not None


async def test_unwritable_store_is_reported_and_the_new_key_still_used(
    scripted: ScriptedServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    scripted.script("POST", "/api/v1/api_keys/refresh", json_reply(key_set(4)))
    settings = ServiceSettings(
        base_url=scripted.url, api_key="k", refresh_token="r", mid="1",
        credentials_path=blocker / "credentials.json",
    )  # fmt: skip
    async with ServiceClient(settings) as svc:
        rotated = await svc.keys.refresh()  # the old refresh token is spent: go on with the new
    assert rotated.api_key == "key-4"
    assert "held in memory only" in caplog.text
    assert "key-4" not in caplog.text
    assert "refresh-4" not in caplog.text


async def test_clients_on_one_credentials_file_never_spend_a_refresh_token_twice(
    sim_settings: ServiceSettings, tmp_path: Path
) -> None:
    # The agent and a tech's `kiosk-agent keys refresh` share the agent's keys file.
    path = tmp_path / "keys.json"
    settings = sim_settings.replace(credentials_path=path)
    async with ServiceClient(settings) as agent, ServiceClient(settings) as tech:
        first = await agent.keys.refresh()  # spends the provisioned refresh token
        second = await tech.keys.refresh()  # from the saved pair, not the spent provisioned one
        third = await agent.keys.refresh()  # and the agent from the tech's
        assert len({first.api_key, second.api_key, third.api_key}) == 3
        assert json.loads(path.read_text())["api_key"] == third.api_key
        assert len(await tech.terminal.list()) == 8  # the tech's key lives until its own expiry
        # A 401 sends the tech to the file, where the agent's newer key already is.
        assert await tech.transport.keys.refresh(stale_key=second.api_key) == third.api_key
