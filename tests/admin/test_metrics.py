import re

from kiosk_agent.admin.metrics import MetricsWriter, write_health, write_upstream, write_webhooks
from kiosk_agent.core.health import Health

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
