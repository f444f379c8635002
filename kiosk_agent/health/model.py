"""One model of the agent's health, fed by everyone and read by the admin API, upstream and doctor.

Producers push what they observe (`report_link` from serial platforms, `report_terminal`,
`report_service`, `report_credentials` and `report_journal` from the checker, `record_sale` from
the sale event bus, `report_availability` from `health.availability`); readers take an immutable
`snapshot()`.
Nothing here holds card data or secrets: terminals by device id, sales by count and cents; every
free-text detail (often an exception's message) passes through `redact` on the way in.
"""


import asyncio
import datetime as dt
import enum
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, PlainSerializer, SerializationInfo

from kiosk_agent.bus import EventBus
from kiosk_agent.data_class import data_class
from kiosk_agent.health.defaults import KEY_WARNING, PING_INTERVAL, PING_TIMEOUT
from kiosk_agent.moments import day_of, day_start, display_clock, timestamp
from kiosk_agent.money import format_cents
from kiosk_agent.redact import redact
from kiosk_agent.sales.kinds import no_selection
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.errors import (
    AuthenticationError,
    InvalidResponseError,
    RateLimitedError,
    ServerError,
    ServiceUnreachableError,
)
from kiosk_agent.tasks import BackgroundTask, wait_event

_LOGGER = logging.getLogger(__name__)

# a ping ended by the service's own failure, not the reader's (an offline reader is an answer:
# `online: false`)
SERVICE_FAILED = (ServerError, ServiceUnreachableError, RateLimitedError, InvalidResponseError)

# Link states a platform may report; anything else is shown as given and counted as unhealthy.
LINK_HEALTHY_STATES = frozenset({"connected", "open", "ready", "ok", "up"})


class Status(enum.StrEnum):
    OK = "ok"  # everything reports healthy
    DEGRADED = "degraded"  # sales may still work, someone should look
    DOWN = "down"  # no sale can succeed (service unreachable or no terminal online)


def _json_time(at: float, info: SerializationInfo) -> str | float:
    """A wall time in JSON: ISO 8601 UTC (``2026-11-28T21:47:03Z``), as every time the agent
    writes in JSON; Unix seconds only for a reader that asks (``UNIX_TIMES``: the status page's
    stream, whose times are its cursor, and the heartbeat, whose readers count with them)."""
    if info.context and info.context.get("unix_times"):
        return at
    return timestamp(at)


# A moment on the wall clock (time.time()): a float in Python, ISO 8601 UTC in JSON.
WallTime = Annotated[float, PlainSerializer(_json_time, when_used="json")]
# model_dump(mode="json", context=UNIX_TIMES): the wall times as Unix seconds
UNIX_TIMES = {"unix_times": True}


class _Model(BaseModel):
    # built on first use or after READY=1 (assembly/collector.py), not at import
    model_config = ConfigDict(frozen=True, defer_build=True)


class TerminalHealth(_Model):
    device_id: str
    name: str | None = None
    online: bool | None = None  # None: not checked yet
    connected: bool | None = None
    latency_ms: float | None = None
    last_ping_at: WallTime | None = None  # time.time() of the last answered ping
    checked_at: WallTime | None = None
    detail: str = ""


class LinkHealth(_Model):
    name: str
    state: str
    detail: str = ""
    since: WallTime  # time.time() when the link entered this state
    healthy: bool


class ServiceHealth(_Model):
    reachable: bool | None = None  # None: not checked yet
    checked_at: WallTime | None = None
    detail: str = ""
    key_expires_at: WallTime | None = None  # Unix time; None: unknown or never expires
    key_expires_in_s: float | None = None
    # False: the service refused the API key and a refresh could not replace it
    key_usable: bool | None = None
    key_detail: str = ""


class JournalHealth(_Model):
    writable: bool | None = None  # None: not checked yet
    checked_at: WallTime | None = None
    detail: str = ""
    path: str = ""
    # sales whose step could not be written: kept in memory, finished once the journal is back
    unwritten_sales: list[str] = []
    # the journal was found lost or damaged at start: what happened, where, what to do
    notice: str = ""
    # its file read whole (quick_check) after it opened: no money moves on it until then
    file_checking: bool = False
    file_damaged: bool = False  # what it found is the notice
    # reporting's recent charges compared with the journal (sales.journal_guard)
    charges_pending: bool = False  # the first comparison since start (or a fault) not made yet
    charges_checked_at: WallTime | None = None
    charges_detail: str = ""
    # not checked because the unit is not confirmed (charges_detail: its refusal): one fact,
    # shown once among the problems, as the unit's
    charges_by_unit: bool = False


class UnitHealth(_Model):
    """The unit's identity (sales/unit.py) and the money on its terminals that is not its own."""

    id: str = ""
    machine: str = ""  # the machine the journal was made on, for people
    made_at: WallTime | None = None
    # the journal was made on another machine: what differs, and what to do (empty: here)
    mismatch: str = ""
    # what tells the machine the journal was made on from this one (empty: made here)
    made_elsewhere: str = ""
    # one line a terminal another program or unit also charges on (sales/audit.ForeignCharges)
    foreign: list[str] = []
    foreign_charges: int = 0  # such charges seen since start (a counter)
    foreign_cleared: str = ""  # what the last clear said
    # open sales of the journal under another unit id, left as they are
    not_ours_open: int = 0


class AvailabilityHealth(_Model):
    """Whether card payment works on a terminal now (``health.availability`` decides)."""

    device_id: str
    available: bool
    reason: str = ""  # why not, for people; empty when available
    since: WallTime  # time.time() of the last change
    changes: int = 0  # times it went out of service since start
    # a check fails but the hold-off has not run out: still in service, not taking cards well
    failing: str = ""
    # out while the agent starts (``reason`` says for what): no outage, no problem
    starting: bool = False
    # in service, but recovery holds it after a restart (a sale the last stop or crash left
    # open on it): no new sale until it lets go. What it does, for people (empty: no hold),
    # and when it ends at the latest (a vend's timeout; None: not known)
    recovering: str = ""
    recovering_until: WallTime | None = None

    @property
    def takes_cards(self) -> bool:
        """In service and not held by recovery: a sale started now would be taken. Every face
        that says whether the terminal takes a card reads this, none decides its own."""
        return self.available and not self.recovering


class SalesHealth(_Model):
    open: int = 0
    attention: int = 0
    # the prices of the sales in attention (what a person decides on), summed once here: every
    # face (the heartbeat, Home Assistant, `health`) shows this figure, none sums its own
    attention_cents: int = 0
    # late vends no person acknowledged yet (sales/late_vends.py): products heard dispensed
    # after their sale gave up waiting, and those a dispenser's error may have let out
    late_vends: int = 0
    maybe_dispensed: int = 0
    # completed sales created today: a day is a UTC day (kiosk_agent.moments, the one rule);
    # today_amount_cents sums what they captured (the agent's takings), not net of what others
    # gave back later at the service: that is today_given_back_cents, beside it
    today_count: int = 0
    today_amount_cents: int = 0
    # of those same sales, what others (a person at the portal, another program) voided,
    # refunded or charged back at the service after the sale completed, as the charge check
    # noted it (``sale_later``; the export's given_back_by_others): sales, cents
    today_given_back_count: int = 0
    today_given_back_cents: int = 0
    day_started_at: WallTime = 0.0  # Unix time of the UTC midnight the day's figures count from


@data_class(frozen=True, slots=True)
class SaleTotals:
    """Running totals since the process started: they only grow (Prometheus counters).

    A restart starts them from zero again (Prometheus sees the reset by the lower value and by
    ``process_start_time_seconds``); a midnight changes nothing here, unlike the day's
    figures in ``SalesHealth``. Keyed by terminal (device id; "" when a sale named none).
    """

    # (terminal, final state) -> sales that reached that state; a sale held in ATTENTION and
    # resolved later counts in ATTENTION and again in its resolution
    sales: Mapping[tuple[str, SaleState], int]
    captured_cents: Mapping[str, int]  # taken and kept (COMPLETED sales)
    reversed_cents: Mapping[str, int]  # voided or refunded (REVERSED sales), holds too
    # card sessions that ended with no selection: not sales (sales.kinds), counted apart
    no_selection: Mapping[str, int] = field(default_factory=dict)


class AuditHealth(_Model):
    """The machine's own books (``audit/component.py``): its reads and what they showed."""

    machine: str  # the trigger whose sales are the machine's
    last_read_at: WallTime | None = None  # wall time of the last read that gave a file
    last_outcome: str = ""  # ok, link, unreadable, timeout, not_stored, error
    detail: str = ""  # why the last read failed
    failures: int = 0  # failed reads in a row
    next_read_in_s: float | None = None
    reads: dict[str, int] = {}  # reads since start by outcome
    mismatches: list[str] = []  # each mismatch found lately, in words, with its sale ids
    # the latest comparison when it could not be made (a machine re-initialised, another machine,
    # counters not sent), in words with when it was seen; "" once a newer read compares again
    not_compared: str = ""
    # the latest comparison when the machine's own books went back (its memory cleared, a board
    # replaced): no mismatch and no problem, a new baseline; "" once a newer read compares
    books_reset: str = ""
    low: list[str] = []  # columns low by the planogram
    sold_out: list[str] = []


class HealthSnapshot(_Model):
    version: str
    status: Status
    problems: list[str]
    started_at: WallTime
    uptime_s: float
    at: WallTime
    terminals: list[TerminalHealth]
    links: list[LinkHealth]
    service: ServiceHealth
    sales: SalesHealth
    journal: JournalHealth = JournalHealth()
    unit: UnitHealth = UnitHealth()
    availability: list[AvailabilityHealth] = []
    # unexpected errors (bugs) each part caught, logged with its traceback and kept going after,
    # counted since start: part -> count (only parts with any)
    errors: dict[str, int] = {}
    # once a stopping signal came: "stopping (draining 1 sale, until 14:03:27Z)"; else empty
    stopping: str = ""
    audit: AuditHealth | None = None


class Health:
    """The agent's health, updated in place by its parts; read through `snapshot()`."""

    def __init__(
        self,
        version: str,
        *,
        key_warning: float = KEY_WARNING,
        today: Callable[[], dt.date] | None = None,
        day_figures: Callable[[dt.date], tuple[int, int] | None] | None = None,
        given_back: Callable[[dt.date], tuple[int, int] | None] | None = None,
    ) -> None:
        self.version = version
        # the day the day's figures belong to (the agent's clock; tests move it): its UTC date
        self.today: Callable[[], dt.date] = today or _utc_today
        # (count, cents) of a day's completed sales as the journal counts them, read when the
        # day changes: a wall clock stepped back over midnight lands on a day that had sales
        self._day_figures = day_figures
        # (count, cents) others gave back later of a day's completed sales, as the journal
        # holds them: read at a start, a new day and each later give-back announced
        self._given_back = given_back
        self.key_warning = key_warning
        self._started_wall = time.time()
        self._started_mono = time.monotonic()
        self._terminals: dict[str, TerminalHealth] = {}
        self._links: dict[str, LinkHealth] = {}
        self._service = ServiceHealth()
        self._journal = JournalHealth()
        self._unit = UnitHealth()
        self._availability: dict[str, AvailabilityHealth] = {}
        self._open_sales: set[str] = set()
        self._attention_sales: dict[str, int] = {}  # sale id -> its price (cents)
        # (heard, maybe) late vends not yet acknowledged (``count_late_vends_of``)
        self._late_vends: Callable[[], tuple[int, int]] | None = None
        self._today: dt.date = self.today()
        self._today_count = 0
        self._today_cents = 0
        self._today_given_back = (0, 0)
        self._sales_total: Counter[tuple[str, SaleState]] = Counter()
        self._captured_total: Counter[str] = Counter()
        self._reversed_total: Counter[str] = Counter()
        self._no_selection_total: Counter[str] = Counter()
        self._fatal: dict[str, str] = {}
        self._not_started: dict[str, str] = {}  # trigger -> why it cannot start
        self._triggers_running = 0
        self._error_counts: dict[str, Callable[[], int]] = {}
        self._problem_sources: dict[str, Callable[[], str | None]] = {}
        self._ever_healthy: set[str] = set()  # links that have been up at least once
        self._listeners: list[Callable[[], object]] = []
        # the drain's end (Unix time) and how many sales it still waits for, once stopping
        self._stopping: tuple[Callable[[], float | None], Callable[[], int]] | None = None
        self._audit: AuditHealth | None = None
        # terminal -> (what recovery does there, until when or None): read at each snapshot
        self._holds: Callable[[], Mapping[str, tuple[str, float | None]]] | None = None

    def on_change(self, listener: Callable[[], object]) -> Callable[[], None]:
        """Call ``listener()`` after every report that may change the status or the problems
        (upstream sends what a person must act on at once); returns the unsubscribe."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _changed(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                _LOGGER.exception("health change listener failed")

    # --- producers ---------------------------------------------------------------------------

    def report_link(self, name: str, state: str, detail: str = "") -> None:
        """A serial (or other) link changed state, e.g. ``("mdb:front", "disconnected", "...")``."""
        detail = redact(detail)
        previous = self._links.get(name)
        since = previous.since if previous is not None and previous.state == state else time.time()
        if previous is None or previous.state != state:
            _LOGGER.info("link %s: %s %s", name, state, detail)
        healthy = state in LINK_HEALTHY_STATES
        if healthy:
            self._ever_healthy.add(name)
        self._links[name] = LinkHealth(
            name=name, state=state, detail=detail, since=since, healthy=healthy
        )
        self._changed()

    def report_terminal(
        self,
        device_id: str,
        *,
        online: bool | None,
        connected: bool | None = None,
        latency_ms: float | None = None,
        name: str | None = None,
        detail: str = "",
        pinged: bool = False,
    ) -> None:
        """What a terminal list or ping said; ``pinged`` marks an answered ping (sets last ping)."""
        detail = redact(detail)
        now = time.time()
        previous = self._terminals.get(device_id)
        self._terminals[device_id] = TerminalHealth(
            device_id=device_id,
            name=name if name is not None else (previous.name if previous else None),
            online=online,
            connected=connected
            if connected is not None
            else (previous.connected if previous is not None else None),
            latency_ms=latency_ms if pinged else (previous.latency_ms if previous else None),
            last_ping_at=now if pinged else (previous.last_ping_at if previous else None),
            checked_at=now,
            detail=detail,
        )
        self._changed()

    def report_service(self, reachable: bool, detail: str = "") -> None:
        self._service = self._service.model_copy(
            update={"reachable": reachable, "checked_at": time.time(), "detail": redact(detail)}
        )
        self._changed()

    def report_call_failed(self, err: BaseException) -> None:
        """A call to the service failed: a refused key (it answered) or no answer at all."""
        if isinstance(err, AuthenticationError):
            self.report_service(True)
            self.report_credentials(False, _describe(err))
        else:
            self.report_service(False, _describe(err))

    def report_credentials(self, usable: bool, detail: str = "") -> None:
        """Whether the service took the API key (False: refused, and no refresh could help)."""
        self._service = self._service.model_copy(
            update={"key_usable": usable, "key_detail": redact(detail)}
        )
        self._changed()

    def report_journal(self, writable: bool, detail: str = "") -> None:
        """Whether a write to the journal just went through (the checker's probe)."""
        previous = self._journal.writable
        if previous is not writable:
            log = _LOGGER.info if writable else _LOGGER.error
            log("journal %s %s", "writable" if writable else "NOT writable:", detail)
        self._journal = self._journal.model_copy(
            update={"writable": writable, "checked_at": time.time(), "detail": redact(detail)}
        )
        self._changed()

    def report_journal_state(self, **changes: Any) -> None:
        """The journal's other facts (unwritten sales, a start notice, the charge check)."""
        self._journal = self._journal.model_copy(update=changes)

    def report_unit(self, **changes: Any) -> None:
        """The unit's identity, a journal made elsewhere, others' charges on its terminals."""
        self._unit = self._unit.model_copy(update=changes)
        self._changed()

    @property
    def unit(self) -> UnitHealth:
        return self._unit

    def report_availability(
        self,
        device_id: str,
        *,
        available: bool,
        reason: str,
        since: float,
        changes: int,
        failing: str = "",
        starting: bool = False,
    ) -> None:
        """Card payment on a terminal works, or not and why (from ``health.availability``);
        ``failing``: why its checks fail while it is still held in service (the hold-off);
        ``starting``: it is out because the agent is starting, not in an outage."""
        self._availability[device_id] = AvailabilityHealth(
            device_id=device_id,
            available=available,
            reason=redact(reason),
            since=since,
            changes=changes,
            failing=redact(failing),
            starting=starting,
        )
        self._changed()

    def terminal(self, device_id: str) -> TerminalHealth | None:
        return self._terminals.get(device_id)

    def terminal_ids(self) -> list[str]:
        return list(self._terminals)

    @property
    def service(self) -> ServiceHealth:
        return self._service

    @property
    def journal(self) -> JournalHealth:
        return self._journal

    def report_audit(self, audit: AuditHealth) -> None:
        """The machine's books: its reads' outcome, mismatches with the journal, stock."""
        changed = self._audit is None or (
            (self._audit.failures > 0, self._audit.mismatches, self._audit.low,
             self._audit.not_compared, self._audit.books_reset)
            != (audit.failures > 0, audit.mismatches, audit.low, audit.not_compared,
                audit.books_reset)
        )
        self._audit = audit
        if changed:
            self._changed()

    def count_errors_of(self, part: str, count: Callable[[], int]) -> None:
        """Show ``count()`` (the unexpected errors ``part`` caught and went on after) in health."""
        self._error_counts[part] = count

    def report_stopping(
        self, until: Callable[[], float | None], draining: Callable[[], int]
    ) -> None:
        """A stopping signal came: new sales are refused, the ``draining()`` sales still running
        may finish until ``until()`` (Unix time, read when said: the runner keeps the drain's
        end on the monotonic clock, so a step of the wall clock moves no deadline)."""
        self._stopping = (until, draining)
        self._changed()

    def stopping_text(self) -> str:
        """``stopping (draining 2 sales, until 14:03:27Z)``; empty while not stopping."""
        if self._stopping is None:
            return ""
        read_until, draining = self._stopping
        count = draining()
        until = read_until()
        at = display_clock(until) if until is not None else "?"
        if not count:
            return "stopping (no sale running)"
        return f"stopping (draining {count} sale{'s' if count != 1 else ''}, until {at})"
    def report_problem_of(self, part: str, problem: Callable[[], str | None]) -> None:
        """Show ``problem()`` (None: none now) among the problems of every snapshot: a fault
        outside the sales that a person must fix (an upstream broker refusing the unit), or
        a fact they must look at (a product dispensed after its sale gave up waiting)."""
        self._problem_sources[part] = problem

    def report_holds_of(
        self, holds: Callable[[], Mapping[str, tuple[str, float | None]]]
    ) -> None:
        """Read the terminals recovery holds after a restart as ``holds()`` (terminal -> what
        it does there, until when) at every snapshot: in service, yet refusing new sales, and
        every face says so beside its availability (``recovering``)."""
        self._holds = holds

    def count_late_vends_of(self, counts: Callable[[], tuple[int, int]]) -> None:
        """Read the late vends not yet acknowledged as ``counts()`` (heard, maybe dispensed)
        at every snapshot: the figures the problem's words say, as numbers for the faces."""
        self._late_vends = counts

    def problem_changed(self) -> None:
        """A source of :meth:`report_problem_of` has a new problem: told at once (upstream
        sends it now, not at the next heartbeat)."""
        self._changed()

    def report_fatal(self, component: str, reason: str) -> None:
        """An internal part broke in a way a restart may cure (journal unwritable, a dead task).

        Only these withhold the systemd watchdog; an outside fault (network, terminal offline)
        does not, because restarting the agent cannot fix it.
        """
        self._fatal[component] = redact(reason)
        _LOGGER.error("fatal: %s: %s", component, reason)
        self._changed()

    def report_triggers(self, running: int, not_started: dict[str, str]) -> None:
        """The triggers started, and each that could not with why: the unit does not sell on
        those, so it is degraded (down when none runs) until the cause is fixed and it restarts."""
        self._triggers_running = running
        self._not_started = {name: redact(reason) for name, reason in not_started.items()}
        self._changed()

    def clear_fatal(self, component: str) -> None:
        if self._fatal.pop(component, None) is not None:
            self._changed()

    def settling(self) -> list[str]:
        """What is still starting (a link connecting, a check not made yet); empty: settled.

        A report made before this is empty would show start-up states as problems. A link that
        has never been up counts too: a USB adapter that appears a few seconds after boot fails
        its first open at once (``disconnected``) and is still starting, not broken."""
        pending = [
            f"link {name}"
            for name, link in self._links.items()
            if link.state == "connecting" or (not link.healthy and name not in self._ever_healthy)
        ]
        if self._service.reachable is None:
            pending.append("service check")
        if self._service.reachable and any(t.online is None for t in self._terminals.values()):
            pending.append("terminal check")
        return pending

    def alive(self) -> bool:
        """For the systemd watchdog: False only while an internal part reports itself broken."""
        return not self._fatal

    def report_key_expiry(self, expires_at: float | None) -> None:
        """When the payments API key expires (Unix time), as the credentials store knows it."""
        self._service = self._service.model_copy(update={"key_expires_at": expires_at})

    def record_sale(self, event: SaleEvent) -> None:
        """Follow one step of a sale from the agent's event bus."""
        if event.step == Step.RECEIPT:  # SaleEvent.receipt, without a call at each step
            return  # a note on a sale already counted
        if event.step == Step.SERVICE_LATER:  # SaleEvent.given_back_later: a note, no end
            self._roll_day()
            self._read_given_back()
            self._changed()
            return
        if not event.state.final:
            self._open_sales.add(event.sale_id)
            return
        # only an end counts toward the day; every read rolls it itself. A day read from the
        # journal holds this end already (journaled before it is published)
        counted = self._roll_day()
        self._open_sales.discard(event.sale_id)
        self._count_total(event)
        if event.state is SaleState.ATTENTION:
            self._attention_sales[event.sale_id] = event.amount_cents
        else:
            self._attention_sales.pop(event.sale_id, None)
        # a sale is today's when it was created today, as Journal.today and `sales --since
        # today` count it: one begun at 23:59 and paid at 00:01 is yesterday's on every face
        created = day_of(event.created_at) if event.created_at else self._today
        if event.state is SaleState.COMPLETED and created == self._today and not counted:
            self._today_count += 1
            self._today_cents += event.captured_cents  # as Journal.today sums it
        self._changed()

    def _count_total(self, event: SaleEvent) -> None:
        terminal = event.terminal or ""
        if no_selection(event):  # not a sale, on every face; its hold released is counted
            self._no_selection_total[terminal] += 1
        else:
            self._sales_total[(terminal, event.state)] += 1
        if event.state is SaleState.COMPLETED:
            self._captured_total[terminal] += event.captured_cents
        elif event.state is SaleState.REVERSED:
            self._reversed_total[terminal] += event.reversed_cents

    def sale_totals(self) -> SaleTotals:
        """The running totals (copies): what ended how, since the process started."""
        return SaleTotals(
            dict(self._sales_total), dict(self._captured_total), dict(self._reversed_total),
            dict(self._no_selection_total),
        )

    def set_sales(
        self,
        *,
        open_ids: Sequence[str] = (),
        attention: Mapping[str, int] | None = None,
        today_count: int | None = None,
        today_amount_cents: int | None = None,
    ) -> None:
        """Seed the sales figures from the journal on start (a restart must not reset them);
        ``attention``: each sale in attention's price in cents, by sale id."""
        self._roll_day()
        self._open_sales = set(open_ids)
        self._attention_sales = dict(attention or {})
        if today_count is not None:
            self._today_count = today_count
        if today_amount_cents is not None:
            self._today_cents = today_amount_cents
        self._read_given_back()
        self._changed()

    def _read_given_back(self) -> None:
        """The day's later give-backs, from the journal (kept when it cannot be read)."""
        if self._given_back is not None:
            figures = self._given_back(self._today)
            if figures is not None:
                self._today_given_back = figures

    async def follow_sales(self, events: EventBus[SaleEvent]) -> None:
        """Count every step published on ``events`` until cancelled (run as a task by the
        agent); a listener, called as each step is published."""
        await events.listen_until_cancelled(self.record_sale)

    # --- readers -----------------------------------------------------------------------------

    @property
    def uptime(self) -> float:
        return time.monotonic() - self._started_mono

    def snapshot(self) -> HealthSnapshot:
        self._roll_day()
        now = time.time()
        service = self._service
        if service.key_expires_at is not None:
            service = service.model_copy(
                update={"key_expires_in_s": round(service.key_expires_at - now, 3)}
            )
        terminals = sorted(self._terminals.values(), key=lambda t: t.device_id)
        links = sorted(self._links.values(), key=lambda link: link.name)
        late, maybe = self._late_vends() if self._late_vends is not None else (0, 0)
        sales = SalesHealth(
            open=len(self._open_sales),
            attention=len(self._attention_sales),
            attention_cents=sum(self._attention_sales.values()),
            late_vends=late,
            maybe_dispensed=maybe,
            today_count=self._today_count,
            today_amount_cents=self._today_cents,
            today_given_back_count=self._today_given_back[0],
            today_given_back_cents=self._today_given_back[1],
            day_started_at=day_start(self._today),
        )
        availability = sorted(self._availability.values(), key=lambda a: a.device_id)
        holds = self._holds() if self._holds is not None else None
        if holds:
            availability = [
                a.model_copy(update={"recovering": redact(holds[a.device_id][0]),
                                     "recovering_until": holds[a.device_id][1]})
                if a.device_id in holds else a for a in availability]
        errors = {part: n for part, count in sorted(self._error_counts.items()) if (n := count())}
        status, problems = self._judge(service, terminals, links, sales, availability)
        stopping = self.stopping_text()
        if stopping:  # said first: every other line is what a stopping unit looks like
            problems.insert(0, stopping)
            if status is Status.OK:
                status = Status.DEGRADED
        outside = [problem for source in self._problem_sources.values() if (problem := source())]
        problems += outside
        if outside and status is Status.OK:
            status = Status.DEGRADED
        if errors:  # a bug, caught: the unit works on, and a person should read the log
            counted = ", ".join(f"{part} {n}" for part, n in errors.items())
            problems.append(f"unexpected errors, logged with their tracebacks: {counted}")
            if status is Status.OK:
                status = Status.DEGRADED
        return HealthSnapshot(
            version=self.version,
            status=status,
            problems=problems,
            started_at=self._started_wall,
            uptime_s=round(self.uptime, 3),
            at=now,
            terminals=terminals,
            links=links,
            service=service,
            sales=sales,
            journal=self._journal,
            unit=self._unit,
            availability=availability,
            errors=errors,
            stopping=stopping,
            audit=self._audit,
        )

    def summary(self) -> str:
        """One line for `systemctl status`: status, terminals online, today's sales."""
        snapshot = self.snapshot()
        online = sum(1 for t in snapshot.terminals if t.online)
        sales = snapshot.sales
        text = (
            f"{snapshot.status}: {online}/{len(snapshot.terminals)} terminal(s) online, "
            f"{sales.today_count} sale(s) today ({format_cents(sales.today_amount_cents)})"
        )
        if snapshot.problems:
            text += f"; {snapshot.problems[0]}"
        return text

    def _judge(
        self,
        service: ServiceHealth,
        terminals: list[TerminalHealth],
        links: list[LinkHealth],
        sales: SalesHealth,
        availability: list[AvailabilityHealth],
    ) -> tuple[Status, list[str]]:
        problems = [f"{name} failed: {reason}" for name, reason in sorted(self._fatal.items())]
        down = bool(self._fatal)
        for trigger, reason in sorted(self._not_started.items()):
            problems.append(f"trigger {trigger} cannot start: {reason} (fix it, then restart "
                            "the agent)")
        if self._not_started and not self._triggers_running:
            down = True
        journal = self._journal
        if journal.writable is False:
            problems.append(f"journal not writable: {journal.detail}".rstrip(": "))
            down = True
        if journal.unwritten_sales:
            problems.append(f"journal: {len(journal.unwritten_sales)} sale(s) not written yet "
                            "(finished once it takes writes)")
            down = True
        if journal.notice:
            problems.append(f"journal: {journal.notice}")
        if journal.charges_detail and not journal.charges_by_unit:
            problems.append(f"journal: {journal.charges_detail}")
        unit = self._unit
        if unit.mismatch:
            problems.append(unit.mismatch)
            down = True  # no customer until a person adopts it
        problems.extend(unit.foreign)
        if unit.not_ours_open:
            problems.append(f"journal: {unit.not_ours_open} open sale(s) of another unit id "
                            "left as they are (not this unit's money): a person decides")
        if service.reachable is False:
            problems.append(f"service unreachable: {service.detail}".rstrip(": "))
            down = True
        if service.key_usable is False:
            problems.append(f"API key refused: {service.key_detail}".rstrip(": "))
            down = True
        if service.key_expires_in_s is not None and service.key_expires_in_s < self.key_warning:
            problems.append(f"API key expires in {int(service.key_expires_in_s)} s")
        checked = [t for t in terminals if t.online is not None]
        for terminal in checked:
            if not terminal.online:
                problems.append(f"terminal {terminal.device_id} offline {terminal.detail}".strip())
        if checked and not any(t.online for t in checked):
            down = True
        for link in links:
            if not link.healthy:
                problems.append(f"link {link.name} {link.state} {link.detail}".strip())
        if sales.attention:
            problems.append(f"{sales.attention} sale(s) need attention")
        for state in availability:
            if not state.available and not state.starting:  # a start is no problem
                problems.append(f"card payment unavailable on {state.device_id}: {state.reason}")
        problems.extend(_audit_problems(self._audit))
        if down:
            return Status.DOWN, problems
        return (Status.DEGRADED if problems else Status.OK), problems

    def _roll_day(self) -> bool:
        """Follow the clock's day; True when the new day's figures were read from the journal."""
        today = self.today()
        if today == self._today:
            return False
        figures = self._day_figures(today) if self._day_figures is not None else None
        self._today, (self._today_count, self._today_cents) = today, figures or (0, 0)
        self._today_given_back = (0, 0)
        self._read_given_back()
        return figures is not None


def _audit_problems(audit: AuditHealth | None) -> list[str]:
    if audit is None:
        return []
    problems = [f"audit mismatch on {audit.machine}: {text}" for text in audit.mismatches]
    if audit.not_compared:
        problems.append(f"audit of {audit.machine} {audit.not_compared}")
    if audit.failures:
        problems.append(f"audit read of {audit.machine} failing ({audit.failures} in a row): "
                        f"{audit.detail}")
    return problems



class TerminalApi(Protocol):
    """The part of the service client's terminal API the checker uses."""

    async def list(self) -> Sequence[Any]: ...

    async def ping(self, device_id: str) -> Any: ...


class HealthChecker:
    """Lists the terminals and pings the configured ones on an interval, feeding `Health`.

    Each round also probes the journal (one committed write) when given ``journal_probe``, then
    calls ``on_checked`` (``health.availability`` decides there). ``next_interval`` may shorten the
    wait before the next round (a terminal out of service is re-checked every second), and
    ``wake()`` asks for a round now.
    """

    def __init__(
        self,
        health: Health,
        terminals: TerminalApi,
        device_ids: Sequence[str] = (),
        *,
        interval: float = PING_INTERVAL,
        timeout: float = PING_TIMEOUT,
        key_expiry: Callable[[], float | None] | None = None,
        journal_probe: Callable[[], object] | None = None,
        on_checked: Callable[[], object] | None = None,
        next_interval: Callable[[float], float] | None = None,
        names: Mapping[str, str] | None = None,
    ) -> None:
        self._health = health
        # the configuration's name of each terminal wins over the service's: the one the
        # triggers and the technician use ("front", not the service's "Counter 1")
        self._names = dict(names or {})
        # e.g. ``lambda: service.transport.keys.credentials.api_key_expires_at``
        self._key_expiry = key_expiry
        self._terminals = terminals
        # Empty: ping every terminal the service lists.
        self._device_ids = list(device_ids)
        self.interval = interval
        self._timeout = timeout
        self._journal_probe = journal_probe
        self._on_checked = on_checked
        self._next_interval = next_interval
        self._wakeup = asyncio.Event()
        self.rounds = 0
        self.errors = 0  # rounds that raised (a bug): counted, logged, the loop goes on
        self._loop = BackgroundTask(self._run, "health-checker")

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    def wake(self) -> None:
        """Check now rather than at the end of the interval (a sale just failed, say)."""
        self._wakeup.set()

    async def _run(self) -> None:
        while True:
            self._wakeup.clear()
            try:
                await self.check_once()
                if self._on_checked is not None:
                    self._on_checked()
                wait = self._next_interval(self.interval) if self._next_interval else self.interval
            except Exception:
                self.errors += 1
                _LOGGER.exception("health check round failed (%d so far)", self.errors)
                wait = self.interval
            self.rounds += 1
            await wait_event(self._wakeup, max(0.0, wait))

    async def check_once(self) -> None:
        """One round: journal, the key's expiry, the terminal list (reachability), pings."""
        if self._journal_probe is not None:
            self._probe_journal(self._journal_probe)
        if self._key_expiry is not None:
            self._health.report_key_expiry(self._key_expiry())
        try:
            async with asyncio.timeout(self._timeout):
                listed = await self._terminals.list()
        except Exception as err:  # noqa: BLE001 - a refused key, or "not reachable"; say which
            self._health.report_call_failed(err)
            if not isinstance(err, AuthenticationError):
                # no reader was asked: its last round's "online" is no longer known, as where
                # the service fails a ping (the service's fault, not the reader's)
                for device_id in self._device_ids or self._health.terminal_ids():
                    self._health.report_terminal(
                        device_id, online=None, detail="not known while the service does not answer"
                    )
            return
        self._health.report_credentials(True)
        wanted = self._device_ids or [str(t.device_id) for t in listed]
        by_id = {str(t.device_id): t for t in listed}
        failed = False
        for device_id in wanted:
            failed = not await self._check_terminal(device_id, by_id.get(device_id)) or failed
        if not failed:  # reachable once its pings answered too: never True, then False again
            self._health.report_service(True)

    def _probe_journal(self, probe: Callable[[], object]) -> None:
        try:
            probe()
        except Exception as err:  # noqa: BLE001 - whatever stops a write: not writable
            from kiosk_agent.sales.journal import JournalError

            # the journal's own refusal says what failed in its words (the holder of its lock
            # named), as the first refusal said it: the readers' reasons keep the same words
            said = str(err) if isinstance(err, JournalError) else _describe(err)
            self._health.report_journal(False, said)
        else:
            self._health.report_journal(True)

    async def _check_terminal(self, device_id: str, listed: Any) -> bool:
        """Ping one terminal; False where the service itself failed the ping."""
        if listed is None:
            self._health.report_terminal(
                device_id, online=False, detail="not listed by the service"
            )
            return True
        name = self._names.get(device_id) or getattr(listed, "name", None)
        connected = getattr(listed, "connected", None)
        try:
            async with asyncio.timeout(self._timeout):
                answer = await self._terminals.ping(device_id)
        except SERVICE_FAILED as err:
            # the service failed (5xx, 429, no answer, an unreadable one), not the reader: an
            # offline reader is an answer (`online: false`). Told as the service's, so a tech
            # is not sent to the reader's power and network; the reader is not known meanwhile
            self._health.report_call_failed(err)
            self._health.report_terminal(
                device_id, online=None, connected=connected, name=name,
                detail=f"not known: the service failed its ping ({_describe(err)})",
            )
            return False
        except Exception as err:  # noqa: BLE001
            self._health.report_terminal(
                device_id, online=False, connected=connected, name=name, detail=_describe(err)
            )
            return True
        online = bool(getattr(answer, "online", False))
        self._health.report_terminal(
            device_id,
            online=online,
            connected=connected,
            name=name,
            latency_ms=getattr(answer, "latency_ms", None),
            detail="" if online else "ping: terminal offline",
            pinged=True,
        )
        return True


def _describe(err: BaseException) -> str:
    if isinstance(err, TimeoutError):
        return "timed out"
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def _utc_today() -> dt.date:
    return day_of(time.time())
