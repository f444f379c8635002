"""No local server of the agent answers 500 (rule 10). A handler's unexpected error (a bug) is
a clear refusal: 503 with Retry-After, in the JSON error form of that server's own API, logged
with its traceback, counted under the server's own name and shown in health (DEGRADED); the
server goes on answering. One guard for all (LocalSite): the kiosk API, the admin API (and its
status page) and the webhook receiver, each tried here over real HTTP on a running agent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.app import load_agent

from .conftest import ADMIN_TOKEN, KIOSK_TOKEN, WEBHOOK_SECRET, _component, write_config
from .test_any_body import KIOSK
from .test_webhooks import envelope, signed


@pytest.fixture
async def agent(tmp_path: Path, sim_settings: Any) -> AsyncIterator[Any]:
    agent = load_agent(write_config(tmp_path, KIOSK), sim_settings, systemd=False)
    await agent.start()
    yield agent
    await agent.stop()


def _broken(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("a bug in a handler")


def _counted(agent: Any, name: str) -> bool:
    return any("unexpected errors" in p and f"{name} 1" in p
               for p in agent.health.snapshot().problems)


async def _refused(response: aiohttp.ClientResponse) -> dict[str, Any]:
    assert response.status == 503, (response.status, await response.text())
    assert response.headers["Retry-After"] == "5"
    body: dict[str, Any] = await response.json()
    assert body["error"] == "unavailable"
    assert "RuntimeError" not in str(body)  # no traceback told
    assert "bug" not in str(body)
    return body


async def test_each_local_servers_unexpected_error_is_a_503_counted_under_its_name(
    agent: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    kiosk = next(p for p in agent.platforms if type(p).__name__ == "KioskApi")
    admin = _component(agent, "AdminServer")
    hooks = _component(agent, "WebhookReceiver")
    bearer = {"Authorization": f"Bearer {KIOSK_TOKEN}"}
    async with aiohttp.ClientSession() as session:
        # the kiosk API: its form {error, field, message}
        monkeypatch.setattr(kiosk, "card_payment", _broken)
        async with session.get(f"http://127.0.0.1:{kiosk.port}/api/v1/status",
                               headers=bearer) as response:
            body = await _refused(response)
        assert body["field"] is None
        assert "message" in body
        monkeypatch.undo()
        assert kiosk.status()["unexpected"] == 1
        assert _counted(agent, kiosk.name)
        async with session.get(f"http://127.0.0.1:{kiosk.port}/api/v1/status",
                               headers=bearer) as response:
            assert response.status == 200  # it goes on
        async with session.get(f"http://127.0.0.1:{kiosk.port}/nope",
                               headers=bearer) as response:
            assert response.status == 404  # aiohttp's own answers are not bugs
        assert kiosk.status()["unexpected"] == 1

        # the admin API and its status page: {error, detail}
        monkeypatch.setattr(agent.health, "snapshot", _broken)
        for path in ("/api/status", "/api/health", "/api/page"):  # the last: the status page
            async with session.get(admin.url + path,
                                   headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as response:
                assert "detail" in await _refused(response)
        monkeypatch.undo()
        problems = agent.health.snapshot().problems
        assert any("admin API 3" in p for p in problems), problems
        async with session.get(admin.url + "/api/status",
                               headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as response:
            assert response.status == 200

        # the webhook receiver: {error, detail}; the event was stored, so its retry is a duplicate
        monkeypatch.setattr(hooks.reducer, "apply", _broken)
        raw, headers = signed(envelope("k-1"), WEBHOOK_SECRET)
        async with session.post(hooks.url, data=raw, headers=headers) as response:
            assert "detail" in await _refused(response)
        monkeypatch.undo()
        assert _counted(agent, "webhook receiver")
        raw, headers = signed(envelope("k-2"), WEBHOOK_SECRET)
        async with session.post(hooks.url, data=raw, headers=headers) as response:
            assert response.status == 200

    logged = [r for r in caplog.records if r.exc_info and "failed unexpectedly" in r.getMessage()]
    assert len(logged) == 5
    assert not [r for r in logged if KIOSK_TOKEN in r.getMessage() or ADMIN_TOKEN in r.getMessage()]
    assert str(agent.health.snapshot().status) != "ok"
