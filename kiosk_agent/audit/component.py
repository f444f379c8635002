"""The `dex:` section's component: the machine's audit read on a schedule, never during a sale,
stored and reconciled (``audit/ledger.py``), shown in health.

A read starts only when no sale of the machine is in progress (the runner's live sales of the
machine's trigger), and a sale that starts during a read waits for nothing: the read runs in a
task of its own on its own port, the sale never awaits it; the read is then *unclean* (stored,
but no boundary of a comparison: the interval runs on to the next clean read). Every wait is on
the agent's clock. A failed read (the link's clear reason, unreadable data, no file within
``deadline``) is tried again after a capped exponential back-off; each outcome is counted
(``/metrics``) and the last one shown in health.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kiosk_agent.audit.books import Figures, figures_of
from kiosk_agent.audit.ledger import (
    ColumnStock,
    Recorded,
    audit_report,
    column_stock,
    record_read,
)
from kiosk_agent.audit.reconcile import Comparison
from kiosk_agent.audit.settings import BooksSettings, machine_sources
from kiosk_agent.audit.store import AuditStore
from kiosk_agent.health.model import AuditHealth
from kiosk_agent.sales.journal import JournalError
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.tasks import BackgroundTask

if TYPE_CHECKING:
    from kiosk_agent.assembly.agent import Agent

_LOGGER = logging.getLogger(__name__)

# `port: virtual:NAME`: the DEX port of the agent's own virtual machine NAME.
VIRTUAL_PORT = "virtual:"
# How often a read due while a sale of the machine runs looks again (seconds, agent's clock).
SALE_RECHECK_S = 1.0
# Every way a read ends, as counted in /metrics (kiosk_agent_audit_reads_total{outcome}).
OUTCOMES = ("ok", "link", "unreadable", "timeout", "not_stored", "error")

# Beyond the link's own deadline, the most a read may take before it is given up (seconds).
DEADLINE_MARGIN_S = 10.0

ReadFile = Callable[[], Awaitable[bytes]]
ToFigures = Callable[[bytes], Figures]


class ReadFailed(Exception):
    """A read that gave no usable file: ``outcome`` (one of OUTCOMES) and a clear reason."""

    def __init__(self, outcome: str, reason: str) -> None:
        super().__init__(reason)
        self.outcome = outcome


@dataclass(frozen=True, slots=True)
class Port:
    """How this component reaches the machine: the read and what makes figures of a file.
    ``link_errors`` are the link's and the parser's own errors: each a clear reason."""

    read_file: ReadFile
    to_figures: ToFigures
    link_errors: tuple[type[Exception], ...] = ()
    parse_errors: tuple[type[Exception], ...] = (ValueError,)


class AuditReads:
    """Built as ``AuditReads(agent, conf)`` for the `dex:` section (app.COMPONENTS)."""

    def __init__(
        self, agent: Agent, conf: Mapping[str, Any], port: Port | None = None
    ) -> None:
        self.settings = BooksSettings.from_config(conf)
        self.machine = self.settings.trigger or "machine"
        self.sources = machine_sources(self.settings.trigger, agent.config.triggers)
        self.store = AuditStore(
            lambda: agent.journal.db, gives_way=lambda: agent.journal.prune_gives_way())
        self.currency = agent.settings.currency
        self._agent = agent
        self._port = port or link_port(agent, conf, self.settings.cashless_device)
        # the agent's own virtual machine is made with this run, its books at 0: the interval
        # from a read of an earlier run to this run's first clean read is a reset of them
        port_name = str(conf.get("port") or "")
        self._new_books = (
            f"the virtual machine {port_name.removeprefix(VIRTUAL_PORT)} starts its books at 0 "
            "with each run of the agent" if port_name.startswith(VIRTUAL_PORT) else ""
        )
        self.reads: Counter[str] = Counter({outcome: 0 for outcome in OUTCOMES})
        # the machine's vends by payment kind, as its counters said at the last read
        self.vends: dict[str, int] = {}
        self.failures = 0
        self.detail = ""
        self.last_outcome = ""
        self.last_read_at: float | None = None
        self._next_at: float | None = None  # monotonic
        self._dirty = False
        self._reading = False
        self.unexpected = 0
        # mismatches, columns low, not compared, books reset: as last reported
        self._shown = (0, 0, 0, 0)
        self.done = asyncio.Event()  # set after each read (tests wait on it)
        self._one_read = asyncio.Lock()
        self._task = BackgroundTask(self._run, "audit-reads")

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        self.store.open()
        try:
            self.store.prune(self._agent.config["journal"]["keep_days"], self._agent.clock.time())
        except (sqlite3.Error, JournalError) as err:
            _LOGGER.warning("audit: old reads not pruned (%s); the next start tries again", err)
        self._agent.health.count_errors_of("audit reads", lambda: self.unexpected)
        self._report()
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    # -- the schedule ----------------------------------------------------------------------------

    async def _run(self) -> None:
        clock = self._agent.clock
        delay = self.settings.first_read
        while True:
            self._next_at = clock.monotonic() + delay
            self._report()
            await clock.sleep(delay)
            try:
                await self.read_between_sales()
            except Exception as err:  # never dies silently: counted, shown, tried again
                self.unexpected += 1
                _LOGGER.exception("audit: a read of %s failed unexpectedly", self.machine)
                self._failed("error", f"unexpected error (logged): {type(err).__name__}")
            settings = self.settings
            delay = settings.backoff(self.failures) if self.failures else settings.interval

    async def read_between_sales(self, recheck: float = SALE_RECHECK_S) -> Recorded | None:
        """A read as soon as no sale of the machine is in progress (never during one), looked
        at every ``recheck`` seconds."""
        while self.sale_in_progress():
            await self._agent.clock.sleep(recheck)
        return await self.read_once()

    def sale_in_progress(self) -> bool:
        return any(sale.source in self.sources for sale in self._agent.sales.running)

    def _on_sale(self, event: SaleEvent) -> None:
        if event.source in self.sources:
            self._dirty = True  # a sale of the machine moved during the read

    async def read_once(self) -> Recorded | None:
        """One read now, whatever the schedule: stored and compared; None when it failed.
        One read at a time on the port: a second one asked meanwhile comes after it."""
        async with self._one_read:
            return await self._read()

    async def _read(self) -> Recorded | None:
        self._dirty = self.sale_in_progress()
        unlisten = self._agent.events.listen(self._on_sale)
        self._reading = True
        try:
            try:
                data = await self._fetch()
            finally:
                unlisten()
                self._reading = False
            clean = not (self._dirty or self.sale_in_progress())
            recorded = self._keep(data, clean)
        except ReadFailed as failed:
            self._failed(failed.outcome, str(failed))
            return None
        finally:
            self.done.set()
        self._succeeded(recorded)
        return recorded

    async def _fetch(self) -> bytes:
        try:
            # the link keeps its own deadline; this bounds whatever else could hang
            bound = self.settings.deadline + DEADLINE_MARGIN_S
            return await self._agent.clock.wait_for(self._port.read_file(), bound)
        except TimeoutError:
            raise ReadFailed("timeout", f"no whole audit within {bound:g} s") from None
        except self._port.link_errors as err:
            raise ReadFailed("link", str(err) or type(err).__name__) from None

    def _keep(self, data: bytes, clean: bool) -> Recorded:
        try:
            figures = self._port.to_figures(data)
        except self._port.parse_errors as err:
            raise ReadFailed("unreadable", f"the audit could not be read: {err}") from None
        try:
            recorded = record_read(
                self.store, figures, at=self._agent.clock.time(), clean=clean,
                sources=self.sources, raw=data, currency=self.currency,
                new_books=self._new_books,
            )
        except (sqlite3.Error, JournalError) as err:
            raise ReadFailed("not_stored", f"the read could not be journaled: {err}") from None
        if clean:  # this run's baseline is taken: its reads compare as any machine's
            self._new_books = ""
        return recorded

    def _failed(self, outcome: str, reason: str) -> None:
        self.reads[outcome] += 1
        self.failures += 1
        self.last_outcome, self.detail = outcome, reason
        _LOGGER.warning("audit: read of %s failed (%s): %s; next try in %.0f s", self.machine,
                        outcome, reason, self.settings.backoff(self.failures))
        self._report()

    def _succeeded(self, recorded: Recorded) -> None:
        self.reads["ok"] += 1
        self.failures = 0
        self.last_outcome, self.detail = "ok", ""
        self.last_read_at = recorded.read.at
        figures = recorded.read.figures
        self.vends = {
            kind: counter.since_init.count
            for kind, counter in (("cash", figures.cash), ("cashless", figures.cashless))
            if counter is not None and counter.since_init is not None
        }
        comparison = recorded.comparison
        if comparison is not None and comparison.mismatch:
            _LOGGER.warning("audit mismatch on %s: %s", self.machine, comparison.text())
        if comparison is not None and comparison.verdict == "books_reset":
            # said once, here: no mismatch and no problem, a new baseline (docs/audit.md)
            _LOGGER.info("audit of %s: %s", self.machine, comparison.text())
            self._agent.event_log.record("books_reset", self.machine, {
                "text": comparison.text(), "since": comparison.since, "until": comparison.until,
            })
        self._report()

    # -- what the faces show ---------------------------------------------------------------------

    def mismatches(self) -> list[Comparison]:
        """The mismatches found within ``mismatch_shown`` of now, newest first."""
        since = self._agent.clock.time() - self.settings.mismatch_shown
        return [c for c in self.store.comparisons(100) if c.mismatch and c.until >= since]

    def figures(self) -> dict[str, Any]:
        """For ``/metrics``: reads by outcome, the machine's vends by payment kind, mismatches,
        columns low (from the last report to health: no journal read at a scrape)."""
        return {
            "reads": dict(self.reads),
            "vends": dict(self.vends),
            "mismatches": self._shown[0],
            "columns_low": self._shown[1],
            "not_compared": self._shown[2],
            "books_reset": self._shown[3],
            "last_read_at": self.last_read_at,
        }

    def report(self, since: float | None = None) -> dict[str, Any]:
        """What the faces show: the last read, each column's stock, the latest comparisons, and
        every interval since ``since`` (by default as far back as mismatches are shown)."""
        settings = self.settings
        if since is None:
            since = self._agent.clock.time() - settings.mismatch_shown
        return audit_report(self.store, settings.planogram, settings.low_stock, since=since,
                            machine=self.machine, currency=self.currency, sources=self.sources)

    def stock(self) -> list[ColumnStock]:
        return column_stock(self.store, self.settings.planogram, self.settings.low_stock)

    def _report(self) -> None:
        try:
            mismatches = self.mismatches()
            stock = self.stock()
            latest = self.store.last_comparison()
        except (sqlite3.Error, JournalError) as err:
            _LOGGER.warning("audit: cannot read the stored reads: %s", err)
            mismatches, stock, latest = [], [], None
        # the latest comparison, when it could not be made, until a newer read compares again;
        # a reset of the machine's books (a new baseline, not a problem) the same way
        not_compared = latest.text() if latest and latest.verdict == "not_compared" else ""
        books_reset = latest.text() if latest and latest.verdict == "books_reset" else ""
        self._shown = (len(mismatches), sum(1 for c in stock if c.low), int(bool(not_compared)),
                       int(bool(books_reset)))
        next_in: float | None = None
        if self._next_at is not None and not self._reading:
            # to the millisecond, up: the read is due by then, never a moment after
            left = max(0.0, self._next_at - self._agent.clock.monotonic())
            next_in = math.ceil(left * 1000) / 1000
        self._agent.health.report_audit(
            AuditHealth(
                machine=self.machine,
                last_read_at=self.last_read_at,
                last_outcome=self.last_outcome,
                detail=self.detail,
                failures=self.failures,
                next_read_in_s=next_in,
                reads=dict(self.reads),
                mismatches=[_with_sales(c) for c in mismatches],
                not_compared=not_compared,
                books_reset=books_reset,
                low=[c.column for c in stock if c.low and not c.sold_out],
                sold_out=[c.column for c in stock if c.sold_out],
            )
        )


def _with_sales(comparison: Comparison) -> str:
    ids = ", ".join(s.sale_id for s in comparison.sales) or "none"
    return f"{comparison.text()} (sales in the interval: {ids})"


def link_port(agent: Agent, conf: Mapping[str, Any], cashless_device: str) -> Port:
    """The configured DEX link (``audit/link.py``) and the EVA-DTS reader. ``port:
    virtual:NAME`` is the DEX port of the agent's own virtual machine of that name (a trigger
    with ``dex: true``): the demo's machine, read over its real pty."""
    from kiosk_agent.audit.evadts import AuditError, parse_audit
    from kiosk_agent.audit.link import LinkError, read_audit
    from kiosk_agent.audit.schema import link_settings

    async def read_file() -> bytes:
        port = _port_of(agent, str(conf["port"]))
        limits = link_settings(dict(conf), port=port)
        return await read_audit(port, conf["protocol"], clock=agent.clock, limits=limits)

    def to_figures(data: bytes) -> Figures:
        return figures_of(parse_audit(data), cashless_device)

    return Port(read_file, to_figures, (LinkError,), (AuditError,))


def _port_of(agent: Agent, port: str) -> str:
    from kiosk_agent.audit.link import LinkError

    if not port.startswith(VIRTUAL_PORT):
        return port
    name = port.removeprefix(VIRTUAL_PORT)
    for platform in agent.platforms:
        controller = getattr(platform, "controller", None)
        if platform.name in (f"virtual:{name}", name) and controller is not None:
            if controller.dex is None:
                raise LinkError(f"the virtual machine {name} has no DEX port: give its trigger "
                                "`dex: true`")
            return str(controller.dex.port)
    raise LinkError(f"no virtual machine named {name} runs in this agent")
