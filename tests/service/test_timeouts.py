"""Timeouts: every kind of call has its connect, read and total timeouts, and a service that
accepts the connection and never answers (a black hole) costs a call its total timeout, then a
clear error; never minutes of silence."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from kiosk_agent.service.client import ServiceClient, ServiceSettings
from kiosk_agent.service.errors import ServiceUnreachableError
from kiosk_agent.service.models import InteractionStatus
from kiosk_agent.service.models.payments import ChargeRequest
from kiosk_agent.service.settings import CallKind, Timeouts

TOTAL = 1.5  # the client's --timeout in these tests
SLACK = 1.0  # what the issue allows past it


def test_one_table_of_timeouts_from_one_setting() -> None:
    settings = ServiceSettings(base_url="http://127.0.0.1:1", timeout=10)
    assert settings.timeouts(CallKind.CONTROL) == Timeouts(connect=5, read=5, total=10)
    assert settings.timeouts(CallKind.AUTH) == Timeouts(connect=5, read=5, total=10)
    assert settings.timeouts(CallKind.MONEY) == Timeouts(connect=5, read=10, total=10)
    assert settings.timeouts(CallKind.REPORT) == Timeouts(connect=5, read=10, total=10)
    assert settings.timeouts(CallKind.WEBSOCKET) == Timeouts(connect=5, read=5, total=10)
    short = settings.replace(timeout=2)  # nothing outlives the total
    for kind in CallKind:
        timeouts = short.timeouts(kind)
        assert max(timeouts.connect, timeouts.read, timeouts.total) <= 2
    default = ServiceSettings(base_url="http://127.0.0.1:1")
    assert (default.timeout, default.connect_timeout) == (15, 5)


@pytest.fixture
async def black_hole(sim_settings: ServiceSettings) -> AsyncIterator[ServiceClient]:
    """A client (total timeout TOTAL) of a simulator that now holds every call unanswered."""
    async with ServiceClient(sim_settings.replace(timeout=TOTAL)) as service:
        await service.reporting.deposits(limit=1).__anext__()  # an OAuth token, before the hole
        fault = {"path": "/*", "method": "*", "fault": "black_hole", "share": 1}
        url = f"{sim_settings.base_url}/sim/faults"
        async with service.transport.session.post(url, json=fault) as resp:
            assert resp.status == 200
        yield service


Call = Callable[[ServiceClient], Awaitable[Any]]
CALLS: dict[str, Call] = {
    "list terminals (control, retried)": lambda s: s.terminal.list(),
    "ping (control POST)": lambda s: s.terminal.ping("SIM-0001"),
    "charge (money, sent once)": lambda s: s.payments.charge(
        ChargeRequest(amount=500, account_token="9411111111111111", expiration="1230")
    ),
    "charge-card start (money)": lambda s: s.terminal.charge_card("SIM-0001", 500),
    "reporting page": lambda s: s.reporting.deposits(limit=1).__anext__(),
    "OAuth token (auth)": lambda s: s.transport.oauth._fetch(),
}


@pytest.mark.parametrize("name", list(CALLS))
async def test_a_black_hole_costs_a_call_its_total_timeout_then_a_clear_error(
    black_hole: ServiceClient, name: str
) -> None:
    started = time.monotonic()
    with pytest.raises(ServiceUnreachableError) as caught:
        await CALLS[name](black_hole)
    took = time.monotonic() - started
    assert TOTAL - 0.1 <= took <= TOTAL + SLACK, took
    message = str(caught.value)
    assert f"no answer within {TOTAL:g} s" in message
    if "money" in name:
        assert "outcome unknown" in message


async def test_a_silent_answer_is_asked_again_within_the_total(
    sim_settings: ServiceSettings,
) -> None:
    # The first GET is held, the retry answers: one read timeout (QUICK_READ is 5 s; here the
    # total of 8 s leaves room for the second attempt).
    async with ServiceClient(sim_settings.replace(timeout=8)) as service:
        url = f"{sim_settings.base_url}/sim/faults"
        fault = {"path": "/api/terminal", "method": "GET", "fault": "black_hole"}
        async with service.transport.session.post(url, json=fault) as resp:
            assert resp.status == 200
        started = time.monotonic()
        assert len(await service.terminal.list()) == 8
        assert 5 <= time.monotonic() - started < 7


async def test_a_black_holed_socket_falls_back_to_polling(sim_settings: ServiceSettings) -> None:
    settings = sim_settings.replace(timeout=TOTAL, poll_interval=0.05)
    async with ServiceClient(settings) as service:
        url = f"{sim_settings.base_url}/sim/faults"
        fault = {"path": "/cable", "method": "GET", "fault": "black_hole", "share": 1}
        async with service.transport.session.post(url, json=fault) as resp:
            assert resp.status == 200
        handle = await service.terminal.charge_card("SIM-0003", 500)
        started = time.monotonic()
        interaction = await handle.wait(timeout=10)
        assert interaction.status is InteractionStatus.SUCCEEDED
        assert handle.via == "polling"
        assert time.monotonic() - started < TOTAL + SLACK


async def test_a_silent_tcp_server_is_a_black_hole_too() -> None:
    """Not the simulator: a bare socket that accepts and never reads or writes."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = ServiceSettings(
        base_url=f"http://127.0.0.1:{port}", api_key="k", mid="1", timeout=TOTAL
    )
    try:
        async with ServiceClient(settings) as service:
            started = time.monotonic()
            with pytest.raises(ServiceUnreachableError, match="no answer within"):
                await service.terminal.list()
            assert time.monotonic() - started <= TOTAL + SLACK
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
