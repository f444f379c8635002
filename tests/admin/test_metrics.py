import re
from pathlib import Path
from typing import Any

import aiohttp

from kiosk_agent.admin.metrics import MetricsWriter, write_health, write_upstream, write_webhooks
from kiosk_agent.core.health import Health

from ..helpers import sim_call, until
from ..platforms.agent_rig import running_agent

# One sample line of the text exposition format: name, optional labels, value.
SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_]\w*="(\\.|[^"\\])*",?)*\})? \S+$')


def _samples(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) kiosk_agent_\w+ ", line), line
            continue
        assert SAMPLE.match(line), line
        name, value = line.rsplit(" ", 1)
        samples[name] = float(value)
    return samples


def test_health_as_prometheus_text() -> None:
    health = Health("2.0.0")
    health.report_terminal("SIM-0001", online=True, connected=True, latency_ms=25.0, pinged=True)
    health.report_terminal("SIM-0002", online=False)
    health.report_link('mdb:"front"', "disconnected", "gone")
    writer = MetricsWriter()
    write_health(writer, health.snapshot())
    write_upstream(writer, {"mqtt": {"sent": 3, "queued": 1, "dropped": 0, "failures": 2}})
    write_webhooks(writer, {"accepted": 5, "duplicate": 2})
    text = writer.text()
    samples = _samples(text)
    assert samples['kiosk_agent_info{version="2.0.0"}'] == 1
    assert samples['kiosk_agent_terminal_online{device_id="SIM-0001"}'] == 1
    assert samples['kiosk_agent_terminal_online{device_id="SIM-0002"}'] == 0
    assert samples['kiosk_agent_terminal_ping_latency_seconds{device_id="SIM-0001"}'] == 0.025
    assert samples['kiosk_agent_status{status="down"}'] == 0
    assert samples['kiosk_agent_status{status="degraded"}'] == 1
    # a quote in a label value is escaped, not breaking the line
    assert samples['kiosk_agent_link_up{link="mdb:\\"front\\"",state="disconnected"}'] == 0
    assert samples['kiosk_agent_upstream_sent_total{sink="mqtt"}'] == 3
    assert samples['kiosk_agent_webhooks_total{outcome="duplicate"}'] == 2
    assert "# TYPE kiosk_agent_webhooks_total counter" in text
    assert text.endswith("\n")


def test_card_payment_per_terminal_and_out_of_service_changes() -> None:
    health = Health("2.0.0")
    health.report_availability("SIM-0001", available=True, reason="", since=0.0, changes=0)
    health.report_availability("SIM-0002", available=False, reason="terminal offline", since=0.0,
                               changes=3)
    writer = MetricsWriter()
    write_health(writer, health.snapshot())
    text = writer.text()
    samples = _samples(text)
    assert samples['kiosk_agent_card_payment_available{terminal="SIM-0001"}'] == 1
    assert samples['kiosk_agent_card_payment_available{terminal="SIM-0002"}'] == 0
    assert samples['kiosk_agent_out_of_service_changes_total{terminal="SIM-0002"}'] == 3
    assert "# TYPE kiosk_agent_out_of_service_changes_total counter" in text


# -- the running agent: a terminal goes offline in the simulator, /metrics follows ---------------

QUICK_HEALTH = {"ping_interval": 1, "hold_off": 0, "recheck_interval": 0.1}
ADMIN = {"port": 0, "metrics_public": True,
         "tokens": [{"name": "ops", "token": "!secret admin_token"}]}


async def _scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url) as response:
        assert response.status == 200
        return _samples(await response.text())


async def test_metrics_follow_a_terminal_out_of_service_and_back(
    tmp_path: Path, sim: Any, sim_settings: Any
) -> None:
    available = 'kiosk_agent_card_payment_available{terminal="SIM-0001"}'
    changes = 'kiosk_agent_out_of_service_changes_total{terminal="SIM-0001"}'
    async with (
        running_agent(tmp_path, sim_settings, [], sections={"health": QUICK_HEALTH, "admin": ADMIN},
                      secrets={"admin_token": "admin-token-0123456789abcdef"}) as agent,
        aiohttp.ClientSession() as session,
    ):
        admin = next(c for c in agent.components if type(c).__name__ == "AdminServer")
        url = f"{admin.url.rstrip('/')}/metrics"
        samples = await _scrape(session, url)
        assert (samples[available], samples[changes]) == (1, 0)

        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/offline")
        await until(lambda: not agent.availability.state().available, timeout=3)
        samples = await _scrape(session, url)
        assert (samples[available], samples[changes]) == (0, 1)

        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/online")
        await until(lambda: agent.availability.state().available, timeout=3)
        samples = await _scrape(session, url)
        assert (samples[available], samples[changes]) == (1, 1)  # a counter: it never goes back
