"""A field tech with a reader down: when the service fails the health checker's pings (503s
from its terminal interface) while the simulator holds the reader online, `kiosk-agent health`
and `/api/health` name the service, never "terminal offline" (whose fix is the reader's power
and network). Seen on the demo (i42-newcomer): `health` said `SIM-0007 OFFLINE` and `OUT OF
SERVICE: terminal offline: ServerError: ping SIM-0007: HTTP 503`, and `service: reachable`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.admin.conftest import ADMIN_TOKEN
from tests.admin.test_sales_export import _cli
from tests.helpers import sim_call, until

_FAILING_PINGS = {"path": "/api/terminal/*", "method": "POST", "fault": "unavailable",
                  "count": 100000}


async def test_pings_the_service_fails_are_told_as_the_services_not_the_readers(
    sim: Any, agent: Any, admin_server: Any, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert agent.health.snapshot().service.reachable is True
    await sim_call(sim, "POST", "/sim/faults", _FAILING_PINGS)
    agent.availability.wake()
    await until(lambda: agent.health.snapshot().service.reachable is False)
    await until(lambda: not agent.availability.state("SIM-0001").available)

    # what the service holds: both readers listed online (its terminal list still answers)
    listed = {str(t.device_id): t.online for t in await agent.service.terminal.list()}
    assert (listed["SIM-0001"], listed["SIM-0007"]) == (True, True)

    monkeypatch.setenv("KIOSK_AGENT_TOKEN", ADMIN_TOKEN)
    code, out, _ = await _cli(capsys, "health", "--url", admin_server.url, "--json")
    health = json.loads(out)
    assert (code, health["status"]) == (1, "down")
    assert health["service"]["reachable"] is False
    assert "503" in health["service"]["detail"]
    for terminal in health["terminals"]:  # not known: never "offline" on the service's fault
        assert terminal["online"] is None, terminal
        assert terminal["detail"].startswith("not known: the service failed its ping"), terminal
    assert not [p for p in health["problems"] if "offline" in p], health["problems"]
    assert [p for p in health["problems"] if p.startswith("service unreachable: ")]
    for state in health["availability"]:
        assert state["available"] is False
        assert state["reason"].startswith("service unreachable: "), state

    code, text, _ = await _cli(capsys, "health", "--url", admin_server.url)
    assert code == 1
    assert "OFFLINE" not in text, text
    assert "terminal offline" not in text, text
    assert "service:  UNREACHABLE" in text, text
    # what to run next: the doctor names the fix of each failing part (no config with --url)
    assert [line for line in text.splitlines() if line.startswith("next:")] == [
        "next:     `" + _program() + " doctor -c FILE` checks each part and says how to fix "
        "what fails"], text

    # the service answers again: the readers are pinged, online, and back in service
    await sim_call(sim, "DELETE", "/sim/faults")
    agent.availability.wake()
    await until(lambda: agent.health.snapshot().service.reachable is True)
    await until(lambda: agent.availability.state("SIM-0001").available)
    snapshot = agent.health.snapshot()
    assert [t.online for t in snapshot.terminals] == [True, True]
    assert snapshot.problems == []
    code, text, _ = await _cli(capsys, "health", "--url", admin_server.url)
    assert code == 0
    assert "next:" not in text, text  # nothing to do


def _program() -> str:
    import sys

    from kiosk_agent.cli.contract import program_command

    return program_command(sys.argv[0])



async def test_readers_are_not_shown_online_while_the_service_does_not_answer(
    sim: Any, agent: Any, admin_server: Any, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The terminal list not answering (no reader asked): `health` showed each reader
    `online, connected, ping N ms` from the round before, beside `service: UNREACHABLE`. What
    a reader's state is, nobody knows meanwhile: `unchecked`, as where the service fails a
    ping; the simulator still holds both online, and they read so again once it answers."""
    agent.availability.wake()  # a round of pings first: both readers answered online
    await until(lambda: [t.online for t in agent.health.snapshot().terminals] == [True, True]
                and all(t.last_ping_at for t in agent.health.snapshot().terminals))
    await sim_call(sim, "POST", "/sim/faults", {"path": "/api/terminal", "method": "GET",
                                                "fault": "unavailable", "count": 100000})
    agent.availability.wake()
    await until(lambda: agent.health.snapshot().service.reachable is False)
    monkeypatch.setenv("KIOSK_AGENT_TOKEN", ADMIN_TOKEN)
    code, out, _ = await _cli(capsys, "health", "--url", admin_server.url, "--json")
    health = json.loads(out)
    assert (code, health["status"]) == (1, "down")
    for terminal in health["terminals"]:
        assert terminal["online"] is None, terminal
        assert terminal["detail"] == "not known while the service does not answer", terminal
    code, text, _ = await _cli(capsys, "health", "--url", admin_server.url)
    terminal_lines = [line for line in text.splitlines() if line.startswith("terminal:")]
    assert len(terminal_lines) == 2, text
    assert all(" unchecked" in line and " online" not in line for line in terminal_lines), text

    await sim_call(sim, "DELETE", "/sim/faults")
    agent.availability.wake()
    await until(lambda: agent.health.snapshot().service.reachable is True)
    assert [t.online for t in agent.health.snapshot().terminals] == [True, True]
