"""/metrics as Prometheus reads it: prometheus_client's own parsers, both formats, a real agent."""

import dataclasses
import datetime as dt
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.samples import Sample

from kiosk_agent.admin.metrics import AgentMetrics, Timings
from kiosk_agent.health.model import Health
from kiosk_agent.sales.model import Flow, SaleEvent, SaleRequest
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.settings import CallKind

from ..helpers import sim_call, until
from ..platforms.agent_rig import running_agent
from .test_server import VendingMachine, _sell

ROOT = Path(__file__).resolve().parents[2]
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]
ADMIN = {"port": 0, "metrics_public": True,
         "tokens": [{"name": "ops", "token": "!secret admin_token"}]}
SECRETS = {"admin_token": "admin-token-0123456789abcdef"}


def _series(samples: list[Sample]) -> dict[SeriesKey, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}


def _scraped(text: str, openmetrics: bool = False) -> dict[str, Any]:
    """Family name as the exposition writes it (counters end in _total) -> family; the parsers
    name a counter's family without its _total."""
    parse = parse_openmetrics if openmetrics else parse_text
    return {
        family.name + "_total" if family.type == "counter" else family.name: family
        for family in parse(text)
    }


def _value(families: dict[str, Any], name: str, **labels: str) -> float:
    family = next(f for f in families.values() if any(s.name == name for s in f.samples))
    [value] = [s.value for s in family.samples if s.name == name and s.labels == labels]
    return float(value)


def _health_metrics() -> AgentMetrics:
    health = Health("2.0.0")
    health.report_terminal("SIM-0001", online=True, connected=True, latency_ms=25.0, pinged=True)
    health.report_terminal("SIM-0002", online=False)
    health.report_link('mdb:"front"', "disconnected", "gone")
    health.report_availability("SIM-0002", available=False, reason="terminal offline", since=0.0,
                               changes=3)
    return AgentMetrics(SimpleNamespace(health=health), lambda name: None)


@pytest.mark.parametrize("accept", [None, OPENMETRICS])
def test_health_parses_in_both_formats_with_one_label_for_a_terminal(accept: str | None) -> None:
    body, content_type = _health_metrics().exposition(accept)
    openmetrics = accept is not None
    assert content_type.startswith(OPENMETRICS if openmetrics else "text/plain; version=0.0.4")
    families = _scraped(body.decode(), openmetrics)
    assert _value(families, "kiosk_agent_info", version="2.0.0") == 1
    assert _value(families, "kiosk_agent_terminal_online", terminal="SIM-0001") == 1
    assert _value(families, "kiosk_agent_terminal_online", terminal="SIM-0002") == 0
    assert _value(families, "kiosk_agent_terminal_ping_latency_seconds", terminal="SIM-0001") == (
        0.025
    )
    assert _value(families, "kiosk_agent_status", status="degraded") == 1
    # a quote in a label value is escaped, not breaking the line
    assert _value(families, "kiosk_agent_link_up", link='mdb:"front"', state="disconnected") == 0
    assert _value(families, "kiosk_agent_card_payment_available", terminal="SIM-0002") == 0
    assert families["kiosk_agent_out_of_service_changes_total"].type == "counter"
    assert _value(families, "kiosk_agent_out_of_service_changes_total", terminal="SIM-0002") == 3
    # every known terminal shows every outcome from zero: the first sale is an increase
    assert _value(families, "kiosk_agent_sales_total", terminal="SIM-0001", state="completed") == 0
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total",
                 "process_open_fds", "process_start_time_seconds"):
        assert name in families, name
    assert "kiosk_agent_uptime_seconds" not in families  # process_start_time_seconds says it
    labels = {label for f in families.values() for s in f.samples for label in s.labels}
    assert "device_id" not in labels
    assert all(f.documentation for f in families.values())


def _event(state: SaleState, sale_id: str = "s1", **changes: Any) -> SaleEvent:
    event = SaleEvent(sale_id, "o1", "test", state, 250, terminal="SIM-0001")
    return dataclasses.replace(event, **changes)


def test_a_sale_is_timed_from_its_start_to_its_first_end() -> None:
    metrics = _health_metrics()
    timings: Timings = metrics.timings
    timings.sale(_event(SaleState.STARTED), now=100.0)
    timings.sale(_event(SaleState.CHARGING), now=100.5)
    timings.sale(_event(SaleState.COMPLETED), now=102.25)
    timings.sale(_event(SaleState.COMPLETED, step=Step.RECEIPT), now=103.0)  # a note, not an end
    timings.sale(_event(SaleState.REVERSED, sale_id="recovered"), now=104.0)  # began elsewhere
    timings.call(CallKind.MONEY, 0.02, "ok")
    families = _scraped(metrics.exposition(None)[0].decode())
    completed = {"terminal": "SIM-0001", "state": "completed"}
    name = "kiosk_agent_sale_duration_seconds"
    assert _value(families, f"{name}_count", **completed) == 1
    assert _value(families, f"{name}_sum", **completed) == 2.25
    assert _value(families, f"{name}_bucket", **completed, le="2.0") == 0
    assert _value(families, f"{name}_bucket", **completed, le="5.0") == 1
    assert not [s for s in families[name].samples if s.labels.get("state") == "reversed"]
    calls = "kiosk_agent_service_call_duration_seconds_count"
    assert _value(families, calls, kind="money", outcome="ok") == 1


async def test_a_burst_of_sales_is_timed_whole() -> None:
    """Before: the sale timer read the event bus through a queue of 256; a burst of steps lost
    the oldest, and a sale whose start or end was lost was never timed, without a word."""
    from kiosk_agent.bus import EventBus

    events: EventBus[SaleEvent] = EventBus()
    metrics = AgentMetrics(SimpleNamespace(health=Health("2.0.0"), events=events), lambda _: None)
    metrics.start()
    try:
        for n in range(300):
            events.publish(_event(SaleState.STARTED, sale_id=f"s{n}"))
        for n in range(300):
            events.publish(_event(SaleState.COMPLETED, sale_id=f"s{n}"))
        families = _scraped(metrics.exposition(None)[0].decode())
    finally:
        await metrics.stop()
    count = "kiosk_agent_sale_duration_seconds_count"
    assert _value(families, count, terminal="SIM-0001", state="completed") == 300
    assert events.subscriber_count == 0  # stopped: it hears nothing more


# -- the running agent: a sale, a midnight, both formats --------------------------------


async def _scrape(url: str, headers: dict[str, str], accept: str | None = None) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        request_headers = {**headers, **({"Accept": accept} if accept else {})}
        async with session.get(url, headers=request_headers) as response:
            assert response.status == 200
            wanted = OPENMETRICS if accept else "text/plain; version=0.0.4"
            assert response.headers["Content-Type"].startswith(wanted)
            return _scraped(await response.text(), openmetrics=accept is not None)


def _only_growing(families: dict[str, Any]) -> dict[SeriesKey, float]:
    """Every series that must never go down: counters and histograms' buckets, counts, sums."""
    return {
        key: value
        for family in families.values()
        if family.type in ("counter", "histogram")
        for key, value in _series(family.samples).items()
        if not key[0].endswith("_created")
    }


async def test_counters_only_grow_across_local_midnight_and_a_sale_shows_in_the_histogram(
    agent: Any, admin_server: Any, read_headers: dict[str, str]
) -> None:
    url = f"{admin_server.url.rstrip('/')}/metrics"
    before = _only_growing(await _scrape(url, read_headers))
    assert (await _sell(agent, 250)).state is SaleState.COMPLETED
    assert (await _sell(agent, 402)).state is SaleState.DECLINED  # ..02: declined
    await until(lambda: agent.health.snapshot().sales.today_count == 1)
    await until(lambda: admin_server.prometheus.timings.sale_seconds.collect()[0].samples,
                timeout=3)

    tomorrow = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)
    agent.health.today = lambda: tomorrow  # midnight passes
    assert agent.health.snapshot().sales.today_count == 0  # the day's figure starts again

    for accept in (None, OPENMETRICS):
        families = await _scrape(url, read_headers, accept)
        after = _only_growing(families)
        shrunk = {key: (value, after.get(key)) for key, value in before.items()
                  if after.get(key, -1) < value}
        assert not shrunk, f"counters went down or vanished: {shrunk}"
        sold = {"terminal": "SIM-0007"}
        assert _value(families, "kiosk_agent_sales_total", **sold, state="completed") == 1
        assert _value(families, "kiosk_agent_sales_total", **sold, state="declined") == 1
        assert _value(families, "kiosk_agent_captured_cents_total", **sold) == 250
        completed = {**sold, "state": "completed"}
        count = _value(families, "kiosk_agent_sale_duration_seconds_count", **completed)
        assert count == 1
        assert 0 < _value(families, "kiosk_agent_sale_duration_seconds_sum", **completed) < 60
        assert _value(families, "kiosk_agent_sale_duration_seconds_bucket", **completed,
                      le="+Inf") == 1
        calls = "kiosk_agent_service_call_duration_seconds_count"
        assert _value(families, calls, kind="money", outcome="ok") >= 1  # the charge-card start
        assert _value(families, calls, kind="control", outcome="ok") >= 1  # the terminal list
        assert _value(families, calls, kind="websocket", outcome="ok") >= 1  # the handshake


async def test_counters_start_from_zero_after_a_restart_on_the_same_journal(
    tmp_path: Path, sim_settings: Any
) -> None:
    completed = {"terminal": "SIM-0001", "state": "completed"}
    request = SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=250,
                          terminal="SIM-0001")

    async def sales_total(agent: Any) -> float:
        [server] = [c for c in agent.components if type(c).__name__ == "AdminServer"]
        families = await _scrape(f"{server.url.rstrip('/')}/metrics", {})
        return _value(families, "kiosk_agent_sales_total", **completed)

    async with running_agent(tmp_path, sim_settings, [], sections={"admin": ADMIN},
                             secrets=SECRETS) as agent:
        assert await sales_total(agent) == 0
        sale = await agent.sales.start(request, VendingMachine())
        assert (await sale.result()).state is SaleState.COMPLETED
        await until(lambda: agent.health.snapshot().sales.today_count == 1)
        assert await sales_total(agent) == 1
    async with running_agent(tmp_path, sim_settings, [], sections={"admin": ADMIN},
                             secrets=SECRETS) as agent:  # the same journal
        assert agent.health.snapshot().sales.today_count == 1  # the journal knows today's sale
        assert await sales_total(agent) == 0  # the counter is this process's: from zero


# -- a terminal goes offline in the simulator, /metrics follows ---------------------------------

QUICK_HEALTH = {"ping_interval": 1, "hold_off": 0, "recheck_interval": 0.1}


async def test_metrics_follow_a_terminal_out_of_service_and_back(
    tmp_path: Path, sim: Any, sim_settings: Any
) -> None:
    terminal = {"terminal": "SIM-0001"}
    async with running_agent(tmp_path, sim_settings, [], sections={"health": QUICK_HEALTH,
                                                                   "admin": ADMIN},
                             secrets=SECRETS) as agent:
        admin = next(c for c in agent.components if type(c).__name__ == "AdminServer")
        url = f"{admin.url.rstrip('/')}/metrics"

        async def scrape() -> tuple[float, float]:
            families = await _scrape(url, {})
            return (_value(families, "kiosk_agent_card_payment_available", **terminal),
                    _value(families, "kiosk_agent_out_of_service_changes_total", **terminal))

        assert await scrape() == (1, 0)
        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/offline")
        await until(lambda: not agent.availability.state().available)
        assert await scrape() == (0, 1)
        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/online")
        await until(lambda: agent.availability.state().available)
        assert await scrape() == (1, 1)  # a counter: it never goes back


# -- the Grafana dashboard and the docs' table name what a scrape holds ------------------------

DASHBOARD = ROOT / "docs" / "grafana" / "kiosk-agent.json"
METRIC_NAME = re.compile(r"\b((?:kiosk_agent|process|python)_[a-z0-9_]+)\b")
# Families that appear only with a section configured or a fact known: upstream heartbeats, an
# API key with an expiry date.
CONDITIONAL = {"kiosk_agent_upstream_sent_total", "kiosk_agent_upstream_dropped_total",
               "kiosk_agent_upstream_failures_total", "kiosk_agent_upstream_queued",
               "kiosk_agent_api_key_expiry_timestamp_seconds",
               # with a dex: section only (tests/audit/test_component.py scrapes them)
               "kiosk_agent_audit_reads_total", "kiosk_agent_audit_vends_total",
               "kiosk_agent_audit_mismatch", "kiosk_agent_audit_columns_low",
               "kiosk_agent_audit_last_read_timestamp_seconds", "kiosk_agent_audit_not_compared",
               "kiosk_agent_audit_books_reset"}


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queries += [v["query"] if isinstance(v["query"], str) else v["query"]["query"]
                for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return queries


def _documented() -> set[str]:
    text = (ROOT / "docs" / "operations.md").read_text()
    return set(re.findall(r"^\| `((?:kiosk_agent|process|python)_\w+)`", text, re.M))


async def test_the_dashboard_and_the_docs_name_only_metrics_a_real_scrape_holds(
    agent: Any, admin_server: Any, read_headers: dict[str, str]
) -> None:
    assert (await _sell(agent, 250)).state is SaleState.COMPLETED
    await until(lambda: admin_server.prometheus.timings.sale_seconds.collect()[0].samples,
                timeout=3)
    families = await _scrape(f"{admin_server.url.rstrip('/')}/metrics", read_headers)
    # a family with no series yet (no refusal so far) is there all the same, with HELP and TYPE
    names = set(families) | {s.name for f in families.values() for s in f.samples}
    queries = _dashboard_queries()
    assert len(queries) >= 8
    queried = {name for query in queries for name in METRIC_NAME.findall(query)}
    assert queried - names == set(), "the dashboard queries metrics no scrape has"
    documented = _documented()
    ours = {name for name in families if name.startswith("kiosk_agent_")}
    assert ours - documented == set(), "families missing from docs/operations.md's table"
    assert documented - set(families) - CONDITIONAL == set(), "documented but never scraped"


def test_prometheus_client_is_loaded_by_the_admin_api_only() -> None:
    probe = ("import sys, kiosk_agent.cli, kiosk_agent.app, kiosk_agent.admin.server\n"
             "print('prometheus_client' in sys.modules)")
    loaded = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                            text=True).stdout.strip()
    assert loaded == "False"  # a command that serves no /metrics pays nothing for it
