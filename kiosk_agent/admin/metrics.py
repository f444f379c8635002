"""Prometheus `/metrics` in the text exposition format (version 0.0.4), written by hand.

Why not prometheus_client: every figure here already lives in the health model and a few counters,
and is read at scrape time; the client library's global registry and collector classes would add a
dependency and a second source of truth for ~60 lines of formatting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from kiosk_agent.core.health import HealthSnapshot, Status

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "kiosk_agent_"

Labels = Mapping[str, str]
Sample = tuple[Labels, float]


class MetricsWriter:
    def __init__(self) -> None:
        self._lines: list[str] = []

    def gauge(self, name: str, help_text: str, samples: Iterable[Sample]) -> None:
        self._family(name, "gauge", help_text, samples)

    def counter(self, name: str, help_text: str, samples: Iterable[Sample]) -> None:
        self._family(name, "counter", help_text, samples, suffix="_total")

    def _family(
        self, name: str, kind: str, help_text: str, samples: Iterable[Sample], suffix: str = ""
    ) -> None:
        full = PREFIX + name
        self._lines.append(f"# HELP {full}{suffix} {_escape_help(help_text)}")
        self._lines.append(f"# TYPE {full}{suffix} {kind}")
        for labels, value in samples:
            self._lines.append(f"{full}{suffix}{_labels(labels)} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{_escape_label(str(value))}"' for key, value in labels.items())
    return "{" + inner + "}"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def write_health(writer: MetricsWriter, snapshot: HealthSnapshot) -> None:
    writer.gauge("info", "Agent version.", [({"version": snapshot.version}, 1)])
    writer.gauge("uptime_seconds", "Seconds since the agent started.", [({}, snapshot.uptime_s)])
    writer.gauge(
        "status",
        "Overall health: 1 for the current status.",
        [({"status": str(s)}, int(snapshot.status is s)) for s in Status],
    )
    writer.gauge(
        "service_reachable",
        "1 when the payment service answered the last check.",
        [({}, int(bool(snapshot.service.reachable)))],
    )
    if snapshot.service.key_expires_at is not None:
        writer.gauge(
            "api_key_expiry_timestamp_seconds",
            "When the payments API key expires (Unix time).",
            [({}, snapshot.service.key_expires_at)],
        )
    terminals = snapshot.terminals
    writer.gauge(
        "terminal_online",
        "1 when the terminal answered its last ping.",
        [({"device_id": t.device_id}, int(bool(t.online))) for t in terminals],
    )
    writer.gauge(
        "terminal_connected",
        "1 when the terminal has a session.",
        [({"device_id": t.device_id}, int(bool(t.connected))) for t in terminals],
    )
    writer.gauge(
        "terminal_ping_latency_seconds",
        "Latency of the last answered ping.",
        [
            ({"device_id": t.device_id}, t.latency_ms / 1000)
            for t in terminals
            if t.latency_ms is not None
        ],
    )
    writer.gauge(
        "terminal_last_ping_timestamp_seconds",
        "When the terminal last answered a ping (Unix time).",
        [({"device_id": t.device_id}, t.last_ping_at) for t in terminals if t.last_ping_at],
    )
    availability = snapshot.availability
    writer.gauge(
        "card_payment_available",
        "1 when the terminal can take cards now; 0 while it is out of service.",
        [({"terminal": a.device_id}, int(a.available)) for a in availability],
    )
    writer.counter(
        "out_of_service_changes",
        "Times the terminal went out of service since the agent started.",
        [({"terminal": a.device_id}, a.changes) for a in availability],
    )
    writer.gauge(
        "link_up",
        "1 when the serial link is in a healthy state.",
        [({"link": link.name, "state": link.state}, int(link.healthy)) for link in snapshot.links],
    )
    sales = snapshot.sales
    writer.gauge("sales_open", "Sales not yet finished.", [({}, sales.open)])
    writer.gauge("sales_attention", "Sales a person must look at.", [({}, sales.attention)])
    writer.gauge("sales_today", "Completed sales since local midnight.", [({}, sales.today_count)])
    writer.gauge(
        "sales_today_amount_cents",
        "Amount of completed sales since local midnight, in cents.",
        [({}, sales.today_amount_cents)],
    )


def write_upstream(writer: MetricsWriter, stats: Mapping[str, Mapping[str, float]]) -> None:
    for key, help_text in (
        ("sent", "Heartbeats delivered upstream."),
        ("dropped", "Heartbeats dropped because the queue was full."),
        ("failures", "Failed attempts to deliver heartbeats."),
    ):
        writer.counter(
            f"upstream_{key}", help_text, [({"sink": sink}, s[key]) for sink, s in stats.items()]
        )
    writer.gauge(
        "upstream_queued",
        "Heartbeats waiting to be sent.",
        [({"sink": sink}, s["queued"]) for sink, s in stats.items()],
    )


def write_webhooks(writer: MetricsWriter, outcomes: Mapping[str, int]) -> None:
    writer.counter(
        "webhooks",
        "Webhook deliveries by outcome.",
        [({"outcome": outcome}, count) for outcome, count in sorted(outcomes.items())],
    )


def write_refusals(
    writer: MetricsWriter,
    refusals: Mapping[tuple[str, str], int],
    suppressed: Mapping[str, int],
) -> None:
    """Refusals an outsider can repeat (core.logging.RefusalLog), logged or summarised."""
    writer.counter(
        "refusals",
        "Refused requests and lines (bad tokens, forged webhooks, floods...) by source, reason.",
        [({"source": s, "reason": r}, n) for (s, r), n in sorted(refusals.items())],
    )
    writer.counter(
        "log_lines_suppressed",
        "Refusal log lines folded into a per-interval summary, by source.",
        [({"source": source}, n) for source, n in sorted(suppressed.items())],
    )


def write_http(writer: MetricsWriter, connections: Mapping[str, int]) -> None:
    writer.gauge(
        "http_connections",
        "Open connections per local HTTP server.",
        [({"server": name}, n) for name, n in sorted(connections.items())],
    )
