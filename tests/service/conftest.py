"""Fixtures of the service client tests: the scripted server and settings pointing at it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kiosk_agent.service.settings import ServiceSettings

from .scripted_server import ScriptedServer


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedServer]:
    server = ScriptedServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def scripted_settings(scripted: ScriptedServer) -> ServiceSettings:
    """Settings on the scripted server with quick retries."""
    return ServiceSettings(
        base_url=scripted.url,
        api_key="key-1",
        refresh_token="refresh-1",
        mid="999000000001",
        client_id="client",
        client_secret="secret",
        backoff_base=0.01,
        backoff_max=0.05,
        max_retries=3,
        timeout=5,
    )
