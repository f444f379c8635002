"""Prometheus ``/metrics``: one registry per admin server, written by prometheus_client.

The text format (0.0.4) or OpenMetrics, whichever the scraper's ``Accept`` asks for. What is
in it:

- the process, as every Python exporter shows it (``process_*``: resident memory, CPU seconds,
  open file descriptors, start time; ``python_info``, ``python_gc_*``);
- the agent's state, read from its parts at scrape time (``AgentCollector``): health, terminals,
  links, upstream, webhooks, refusals, and the running sale totals (``health.model.SaleTotals``):
  monotonic counters per outcome, from zero at each start;
- two histograms fed as things happen (``Timings``): how long each sale took, by terminal and
  how it ended, and how long each service call took, by kind (``service.settings.CallKind``)
  and outcome, reported by the service transport to its observers.

A terminal is labelled ``terminal`` everywhere. docs/operations.md has the table of every family.

This module imports prometheus_client: the admin server imports it when it starts, so a command
that never serves ``/metrics`` never loads it (its cost is in pyproject.toml's comment).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kiosk_agent.health.model import HealthSnapshot, SaleTotals, Status
from kiosk_agent.logs import refusal_counts, suppressed_counts
from kiosk_agent.sales.journal import JournalError
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import SaleState
from kiosk_agent.service.settings import CallKind
from kiosk_agent.web.server import live_sites

PREFIX = "kiosk_agent_"

# Histograms' ``_created`` series are extra gauges nobody queries; counters here have none either.
disable_created_metrics()  # type: ignore[no-untyped-call]

# A sale: a tenth of a second on a fast simulator to the interaction lifetime (180 s; 1.1 L + 5 s
# is followed) and the black-hole bounds beyond it (2T + M + 1.1 L: about 4 minutes).
SALE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 240, 300)
# A service call: a few milliseconds on loopback to the total timeout T (15 s by default).
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30)
# Sales started and not yet ended that the sale timer remembers (it forgets the oldest beyond).
_MAX_TIMED = 1000

FINAL_STATES = tuple(state for state in SaleState if state.final)


class AgentMetrics:
    """The registry behind ``/metrics`` for one agent: collectors, histograms, exposition."""

    def __init__(self, agent: Any, component: Callable[[str], Any]) -> None:
        """``component(class_name)``: the agent's component of that class, or None."""
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.registry.register(AgentCollector(agent, component))
        self.timings = Timings(self.registry)
        self._agent = agent
        self._unsubscribe: Callable[[], None] | None = None
        self._unlisten: Callable[[], None] | None = None

    def start(self) -> None:
        """Time every service call and every sale from now on."""
        service = getattr(self._agent, "service", None)
        if service is not None:
            self._unsubscribe = service.transport.observe(self.timings.call)
        events = getattr(self._agent, "events", None)
        if events is not None:
            # a listener, in publish: a queue would lose steps past its size under a burst,
            # and a sale whose end was lost would never be timed
            self._unlisten = events.listen(self.timings.sale)

    async def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """(body, content type): OpenMetrics when ``accept`` asks for it, else the text format."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


class Timings:
    """The two histograms: sale durations (from the event bus) and service call durations."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sale_seconds = Histogram(
            PREFIX + "sale_duration_seconds",
            "Seconds from a sale's start to its end, by terminal and final state.",
            ["terminal", "state"],
            buckets=SALE_BUCKETS,
            registry=registry,
        )
        self.call_seconds = Histogram(
            PREFIX + "service_call_duration_seconds",
            "Seconds a call to the payment service took (every attempt), by kind and outcome.",
            ["kind", "outcome"],
            buckets=CALL_BUCKETS,
            registry=registry,
        )
        self._started: dict[str, float] = {}  # sale_id -> monotonic time its start was heard

    def call(self, kind: CallKind, seconds: float, outcome: str) -> None:
        self.call_seconds.labels(kind=kind.value, outcome=outcome).observe(seconds)

    def sale(self, event: SaleEvent, now: float | None = None) -> None:
        """One step of a sale: its start starts the timer, its (first) end observes it.

        A sale begun before this process (finished by recovery) has no start here and is not
        timed; it is counted in ``kiosk_agent_sales_total`` all the same."""
        now = time.monotonic() if now is None else now
        if event.receipt or event.given_back_later:
            return
        if event.state is SaleState.STARTED:
            if len(self._started) >= _MAX_TIMED:
                self._started.pop(next(iter(self._started)))
            self._started.setdefault(event.sale_id, now)
        elif event.state.final:
            started = self._started.pop(event.sale_id, None)
            if started is not None:
                labels = {"terminal": event.terminal or "", "state": event.state.value}
                self.sale_seconds.labels(**labels).observe(now - started)


class AgentCollector(Collector):
    """The agent's own families, read from its parts at every scrape."""

    def __init__(self, agent: Any, component: Callable[[str], Any]) -> None:
        self._agent = agent
        self._component = component

    def collect(self) -> Iterator[Metric]:
        health = self._agent.health
        snapshot = health.snapshot()
        yield from health_families(snapshot)
        terminals = {t.device_id for t in snapshot.terminals}
        terminals |= {a.device_id for a in snapshot.availability}
        yield from sale_families(health.sale_totals(), terminals)
        upstream = self._component("Upstream")
        if upstream is not None:
            yield from upstream_families(upstream.stats())
        receiver = self._component("WebhookReceiver")
        if receiver is not None:
            yield from webhook_families(receiver.outcomes)
        books = self._component("AuditReads")
        if books is not None:
            yield from audit_families(books.figures())
        late = getattr(getattr(self._agent, "sales", None), "late_vends", None)
        if late is not None:
            yield from late_vend_families(late)
        yield from refusal_families(refusal_counts(), suppressed_counts())
        yield from http_families({site.name: site.open_connections for site in live_sites()})


Sample = tuple[Mapping[str, str], float]


def gauge(
    name: str, help_text: str, samples: Iterable[Sample], labels: Iterable[str] = ()
) -> Metric:
    return _family(GaugeMetricFamily, name, help_text, samples, labels)


def counter(
    name: str, help_text: str, samples: Iterable[Sample], labels: Iterable[str] = ()
) -> Metric:
    """``name`` without ``_total``: the exposition adds it."""
    return _family(CounterMetricFamily, name, help_text, samples, labels)


def _family(
    kind: type[GaugeMetricFamily] | type[CounterMetricFamily],
    name: str,
    help_text: str,
    samples: Iterable[Sample],
    labels: Iterable[str],
) -> Metric:
    names = list(labels)
    family = kind(PREFIX + name, help_text, labels=names)
    for values, value in samples:
        family.add_metric([values[n] for n in names], value)
    return family


def health_families(snapshot: HealthSnapshot) -> Iterator[Metric]:
    yield gauge("info", "Agent version.", [({"version": snapshot.version}, 1)], ["version"])
    yield gauge(
        "status",
        "Overall health: 1 for the current status.",
        [({"status": str(s)}, int(snapshot.status is s)) for s in Status],
        ["status"],
    )
    yield gauge(
        "service_reachable",
        "1 when the payment service answered the last check.",
        [({}, int(bool(snapshot.service.reachable)))],
    )
    if snapshot.service.key_expires_at is not None:
        yield gauge(
            "api_key_expiry_timestamp_seconds",
            "When the payments API key expires (Unix time).",
            [({}, snapshot.service.key_expires_at)],
        )
    terminals = snapshot.terminals
    by_terminal = ["terminal"]
    yield gauge(
        "terminal_online",
        "1 when the terminal answered its last ping.",
        [({"terminal": t.device_id}, int(bool(t.online))) for t in terminals],
        by_terminal,
    )
    yield gauge(
        "terminal_connected",
        "1 when the terminal has a session.",
        [({"terminal": t.device_id}, int(bool(t.connected))) for t in terminals],
        by_terminal,
    )
    yield gauge(
        "terminal_ping_latency_seconds",
        "Latency of the last answered ping.",
        [
            ({"terminal": t.device_id}, t.latency_ms / 1000)
            for t in terminals
            if t.latency_ms is not None
        ],
        by_terminal,
    )
    yield gauge(
        "terminal_last_ping_timestamp_seconds",
        "When the terminal last answered a ping (Unix time).",
        [({"terminal": t.device_id}, t.last_ping_at) for t in terminals if t.last_ping_at],
        by_terminal,
    )
    availability = snapshot.availability
    yield gauge(
        "card_payment_available",
        "1 when the terminal can take cards now; 0 while it is out of service or recovery "
        "holds it after a restart.",
        [({"terminal": a.device_id}, int(a.takes_cards)) for a in availability],
        by_terminal,
    )
    yield counter(
        "out_of_service_changes",
        "Times the terminal went out of service since the agent started.",
        [({"terminal": a.device_id}, a.changes) for a in availability],
        by_terminal,
    )
    yield gauge(
        "link_up",
        "1 when the serial link is in a healthy state.",
        [({"link": link.name, "state": link.state}, int(link.healthy)) for link in snapshot.links],
        ["link", "state"],
    )
    yield counter(
        "unexpected_errors",
        "Unexpected errors (bugs) a part of the agent caught, logged and went on after.",
        [({"part": part}, n) for part, n in snapshot.errors.items()],
        ["part"],
    )
    unit = snapshot.unit
    yield counter(
        "foreign_charges",
        "Charges of another program or unit seen on this unit's terminals since it started "
        "(each once; never given back).",
        [({}, unit.foreign_charges)],
    )
    yield gauge(
        "unit_confirmed",
        "1 when the journal was made on this machine (or adopted here); 0: no customer taken.",
        [({}, int(not unit.mismatch))],
    )
    sales = snapshot.sales
    yield gauge("sales_open", "Sales not yet finished.", [({}, sales.open)])
    yield gauge("sales_attention", "Sales a person must look at now.", [({}, sales.attention)])
    yield gauge("sales_attention_cents", "The prices of the sales in attention, in cents.",
                [({}, sales.attention_cents)])


def sale_families(totals: SaleTotals, terminals: Iterable[str]) -> Iterator[Metric]:
    """The running totals; every known terminal shows every outcome from zero, so the first
    sale of a kind is an increase Prometheus sees, not a series that appears at 1."""
    known = sorted(set(terminals) | {t for t, _ in totals.sales} | set(totals.captured_cents)
                   | set(totals.no_selection))
    yield counter(
        "sales",
        "Sales that reached each final state since the agent started, by terminal.",
        [
            ({"terminal": t, "state": s.value}, totals.sales.get((t, s), 0))
            for t in known
            for s in FINAL_STATES
        ],
        ["terminal", "state"],
    )
    yield counter(
        "captured_cents",
        "Cents taken and kept (completed sales) since the agent started, by terminal.",
        [({"terminal": t}, totals.captured_cents.get(t, 0)) for t in known],
        ["terminal"],
    )
    yield counter(
        "reversed_cents",
        "Cents voided or refunded (reversed sales; an authorization hold released included) "
        "since the agent started, by terminal.",
        [({"terminal": t}, totals.reversed_cents.get(t, 0)) for t in known],
        ["terminal"],
    )
    yield counter(
        "card_sessions_no_selection",
        "Card sessions that ended with nothing chosen and nothing kept (a card-first machine's "
        "customer who walked away): not sales, so not in sales_total; by terminal.",
        [({"terminal": t}, totals.no_selection.get(t, 0)) for t in known],
        ["terminal"],
    )


def upstream_families(stats: Mapping[str, Mapping[str, float]]) -> Iterator[Metric]:
    for key, help_text in (
        ("sent", "Heartbeats delivered upstream."),
        ("dropped", "Heartbeats dropped: the queue was full (MQTT: a newer one replaced it)."),
        ("failures", "Failed attempts to deliver heartbeats."),
    ):
        yield counter(
            f"upstream_{key}",
            help_text,
            [({"sink": sink}, s[key]) for sink, s in stats.items()],
            ["sink"],
        )
    yield gauge(
        "upstream_queued",
        "Heartbeats waiting to be sent.",
        [({"sink": sink}, s["queued"]) for sink, s in stats.items()],
        ["sink"],
    )


def webhook_families(outcomes: Mapping[str, int]) -> Iterator[Metric]:
    yield counter(
        "webhooks",
        "Webhook deliveries by outcome.",
        [({"outcome": outcome}, count) for outcome, count in sorted(outcomes.items())],
        ["outcome"],
    )


def audit_families(figures: Mapping[str, Any]) -> Iterator[Metric]:
    """The machine's books (``audit.component.AuditReads.figures``)."""
    yield counter(
        "audit_reads",
        "Reads of the machine's audit (DEX) by outcome.",
        [({"outcome": outcome}, n) for outcome, n in figures["reads"].items()],
        ["outcome"],
    )
    yield counter(
        "audit_vends",
        "The machine's own vend counters by payment kind (since its initialisation), as last read.",
        [({"payment": kind}, n) for kind, n in figures["vends"].items()],
        ["payment"],
    )
    yield gauge(
        "audit_mismatch",
        "Intervals lately where the machine's card vends differ from the journal's (0: none).",
        [({}, figures["mismatches"])],
    )
    yield gauge("audit_columns_low", "Columns low or sold out by the planogram.",
                [({}, figures["columns_low"])])
    yield gauge(
        "audit_not_compared",
        "1 while the latest comparison could not be made (another machine, the cashless device "
        "changed, counters not sent); 0 once a read compares again.",
        [({}, figures.get("not_compared", 0))],
    )
    yield gauge(
        "audit_books_reset",
        "1 while the latest comparison is a reset of the machine's own books (no mismatch, a "
        "new baseline); 0 once a read compares again.",
        [({}, figures.get("books_reset", 0))],
    )
    if figures["last_read_at"] is not None:
        yield gauge("audit_last_read_timestamp_seconds", "When the machine's audit was last read.",
                    [({}, figures["last_read_at"])])


def late_vend_families(late: Any) -> Iterator[Metric]:
    """The late vends health shows (sales/late_vends.py), read from the journal at the scrape:
    an acknowledgement by ``kiosk-agent sales late-vends --ack`` in another process counts."""
    try:
        unseen = len(late.unseen())
    except (sqlite3.Error, JournalError):  # the journal's own health says why
        return
    yield gauge(
        "late_vends_unacknowledged",
        "Products the machine said it dispensed after their sale gave up waiting (unpaid), "
        "within 24 h and not yet acknowledged (kiosk-agent sales late-vends --ack).",
        [({}, unseen)],
    )


def refusal_families(
    refusals: Mapping[tuple[str, str], int], suppressed: Mapping[str, int]
) -> Iterator[Metric]:
    """Refusals an outsider can repeat (logs.RefusalLog), logged or summarised."""
    yield counter(
        "refusals",
        "Refused requests and lines (bad tokens, forged webhooks, floods...) by source, reason.",
        [({"source": s, "reason": r}, n) for (s, r), n in sorted(refusals.items())],
        ["source", "reason"],
    )
    yield counter(
        "log_lines_suppressed",
        "Refusal log lines folded into a per-interval summary, by source.",
        [({"source": source}, n) for source, n in sorted(suppressed.items())],
        ["source"],
    )


def http_families(connections: Mapping[str, int]) -> Iterator[Metric]:
    yield gauge(
        "http_connections",
        "Open connections per local HTTP server.",
        [({"server": name}, n) for name, n in sorted(connections.items())],
        ["server"],
    )

