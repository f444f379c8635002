"""The Agent: one process on the kiosk that owns the service client, the journal, the sale runner,
the event bus, the health model, the platforms and the components.

Start order: the claim on the journal (one agent per journal), journal, service client,
terminals, recovery (in the background, holding the terminals it works on), the first charge
check (with no sale to recover, while the terminals are being listed), platforms, components,
then systemd READY. Stop order is the reverse,
and a running sale is finished or safely parked in the journal before anything else goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import operator
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from kiosk_agent import __version__
from kiosk_agent.assembly.collector import Settling, settle_after_ready
from kiosk_agent.assembly.systemd import SystemdLifecycle
from kiosk_agent.bus import EventBus
from kiosk_agent.config.load import Config
from kiosk_agent.config.registry import CannotStart, PlatformInstance
from kiosk_agent.data_class import data_class
from kiosk_agent.health.availability import Availability
from kiosk_agent.health.defaults import section_defaults
from kiosk_agent.health.model import Health, HealthChecker
from kiosk_agent.moments import day_of, day_start
from kiosk_agent.sales.attention import AttentionSweeper
from kiosk_agent.sales.audit import ChargeAudit
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sales.events import EventLog
from kiosk_agent.sales.journal import (
    CHECKPOINT_STOP_WAIT_S,
    CHECKPOINT_WAITS_FOR_CUSTOMER_S,
    Journal,
    JournalError,
)
from kiosk_agent.sales.journal_guard import DISK_WATCH_S, JournalGuard
from kiosk_agent.sales.machine import Machine, this_machine
from kiosk_agent.sales.model import Flow, SaleEvent
from kiosk_agent.sales.owner import JournalLock
from kiosk_agent.sales.receipts import ReceiptSettings
from kiosk_agent.sales.recovery import Recovery
from kiosk_agent.sales.runner import STOPPING, SaleRunner
from kiosk_agent.sales.settings import SaleSettings
from kiosk_agent.sales.steps import SaleContext, SaleSteps
from kiosk_agent.sales.unit import OwnUnit
from kiosk_agent.sales.unit import load as load_unit
from kiosk_agent.sales.unwritten import UnwrittenSales
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.errors import ServiceError
from kiosk_agent.service.models import Terminal
from kiosk_agent.service.settings import DEFAULT_TIMEOUT, ServiceSettings
from kiosk_agent.service.timeouts import INTERACTION_LIFETIME
from kiosk_agent.tasks import BackgroundTask, cancel_and_wait

_LOGGER = logging.getLogger(__name__)

# While recovery runs, systemd's start timeout is pushed back by this much every 10 s.
_START_EXTENSION = 30.0
# between two of the prune's batches: the agent's own writes take the journal meanwhile
PRUNE_PAUSE_S = 0.02
# the prune's batches wait for no sale to be running, at most this long each (Journal.prune)
PRUNE_IDLE_WAIT_S = 5.0


class Component(Protocol):
    """A section's component (admin, upstream, webhooks): built as ``Factory(agent, conf)``."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


PlatformSetup = Callable[["Agent", dict[str, Any]], Awaitable[PlatformInstance]]
ComponentFactory = Callable[["Agent", Any], Component]


@data_class(slots=True)
class _PendingPlatform:
    setup: PlatformSetup
    conf: dict[str, Any]


def service_settings_from_config(
    config: Config, simulator: Mapping[str, Any] | None = None
) -> ServiceSettings:
    """The ServiceSettings of a configuration, the one place they are made from one.

    A configured service: its ``service:`` section, the rotated key kept at
    ``credentials_path`` (else ``keys.json`` beside the journal). An embedded simulator
    (``service: {simulator: ...}``): the addresses and seeded keys of the one started for it,
    given as its READY information (``simulator``). Every setting left out keeps the one
    default :class:`ServiceSettings` declares."""
    conf = dict(config["service"])
    if "simulator" in conf:
        if simulator is None:
            raise ValueError("a simulator configuration has no fixed endpoints: start it first")
        return ServiceSettings.reaching_simulator(simulator)
    credentials = conf.pop("credentials_path", None)
    journal_dir = config.resolve(config["journal"]["path"]).parent
    return ServiceSettings(
        **conf,
        credentials_path=config.resolve(credentials) if credentials else journal_dir / "keys.json",
    )


def sale_settings_from_config(
    config: Config, mid: str, request_timeout: float = DEFAULT_TIMEOUT
) -> SaleSettings:
    sales = config["sales"]
    receipts = config["receipts"]
    simulator = config["service"].get("simulator")
    time_scale = float(simulator["time_scale"]) if simulator else 1.0
    return SaleSettings(
        mid=mid,
        terminals={t["device_id"]: t.get("name", "") for t in config["terminals"]},
        retries=sales["retries"],
        card_timeout=sales["card_timeout"],
        vend_timeout=sales["vend_timeout"],
        choice_timeout=sales["choice_timeout"],
        currency=sales["currency"],
        interaction_lifetime=sales.get("interaction_lifetime", INTERACTION_LIFETIME / time_scale),
        stop_timeout=sales["stop_timeout"],
        request_timeout=request_timeout,
        answer_margin=sales["answer_margin"],
        receipts=ReceiptSettings(print=receipts["print"], email=receipts["email"]),
    )


class Agent:
    """The running agent. Platforms use ``agent.sales``, ``agent.events`` and ``agent.health``."""

    def __init__(
        self,
        config: Config,
        service_settings: ServiceSettings,
        *,
        version: str = __version__,
        systemd: SystemdLifecycle | None = None,
        journal: Journal | None = None,
        service: ServiceClient | None = None,
        owner: JournalLock | None = None,
        clock: Clock = SYSTEM_CLOCK,
        machine: Machine | None = None,
        machines: Any = None,
    ) -> None:
        self.config = config
        self.version = version
        self.clock = clock  # every sale's waits and deadlines (tests give a FakeClock)
        # the machine it runs on (tests give a made-up one); the unit's id is read at start
        self.machine = machine or this_machine()
        self.unit = OwnUnit.fresh()
        # the simulated machines' factory for `virtual` triggers (platforms/virtual.py's
        # MachineFactory), given by the CLI: nothing below it imports kiosk_agent.sim
        self.machines = machines
        # the look-up of its local servers' host names (web/server.py's Resolve): getaddrinfo
        # when None; a test sets its own resolver here before start (a name not resolving yet)
        self.listen_resolve: Callable[..., Awaitable[list[tuple[Any, ...]]]] | None = None
        self.settings = sale_settings_from_config(
            config, service_settings.mid, service_settings.timeout
        )
        self._assemble_service_and_journal(service_settings, service, journal, owner)
        self._assemble_health(config.get("health") or section_defaults())
        self._assemble_sales(config["sales"])
        self._count_errors_in_health()
        self._lifecycle_before_start(systemd)

    # -- assembly (the steps of __init__, in order) ----------------------------------------------

    def _assemble_service_and_journal(
        self,
        service_settings: ServiceSettings,
        service: ServiceClient | None,
        journal: Journal | None,
        owner: JournalLock | None,
    ) -> None:
        self.service = service or ServiceClient(service_settings)
        # the terminal client warns once when the service's interactions live otherwise
        self.service.terminal.expected_lifetime = self.settings.interaction_lifetime
        path = self.config.resolve(self.config["journal"]["path"])
        self.journal = journal or Journal(path, self.clock)
        # one agent per journal: claimed before anything reads it, let go after it is closed
        self.owner = owner or JournalLock(self.journal.path)
        self._journal_watch = BackgroundTask(self._watch_journal, "journal-watch")
        # a checkpoint a commit asked for (_checkpoint_soon)
        self._checkpointing: asyncio.Task[None] | None = None
        # the state a step reached names its kind: listeners of some states only skip the rest
        self.events: EventBus[SaleEvent] = EventBus(kind=operator.attrgetter("state"))

    def _assemble_health(self, health_conf: Mapping[str, Any]) -> None:
        """Health, the agent's event log, out of service per terminal, and the checker."""
        self.health = Health(
            self.version, key_warning=health_conf["key_warning"],
            # the day of the clock the journal dates its sales by, as Journal.today counts it
            today=lambda: day_of(self.clock.time()), day_figures=self._day_figures,
            given_back=self._given_back,
        )  # fmt: skip
        keys = self.service.transport.keys
        # out of service, gracefully: the agent's events in the journal, one decider for all
        self.event_log = EventLog(lambda: self.journal.db, self.clock,
                                  gives_way=lambda: self.journal.prune_gives_way())
        self.availability = Availability(
            self.health,
            list(self.settings.terminals),
            resolve=self.settings.resolve_terminal,
            hold_off=health_conf["hold_off"],
            recheck_interval=health_conf["recheck_interval"],
            log=self.event_log,
            starting=True,  # until the readers are enabled, being out is part of starting
        )
        self._checker = HealthChecker(
            self.health,
            self.service.terminal,
            list(self.settings.terminals),
            interval=health_conf["ping_interval"],
            timeout=health_conf["ping_timeout"],
            key_expiry=lambda: keys.credentials.api_key_expires_at if keys.configured else None,
            journal_probe=self._probe_journal,
            on_checked=self.availability.evaluate,
            next_interval=self.availability.next_check_in,
            names=self.settings.terminals,
        )
        self.availability.wake = self._checker.wake

    def _assemble_sales(self, sales_conf: Mapping[str, Any]) -> None:
        """The runner, recovery, the attention sweeper and the journal's guard, on one context."""
        context = SaleContext(
            self.service,
            self.journal,
            self.events,
            self.settings,
            capabilities=self.can_print,
            clock=self.clock,
            on_unwritten=self._keep_unwritten,
            unit=self.unit,
        )
        self.sales = SaleRunner(context)
        # a product dispensed after its sale gave up waiting: a problem until a person saw it
        self.sales.late_vends.on_change = self.health.problem_changed
        self.health.report_problem_of("late vends", self.sales.late_vends.problem)
        self.health.count_late_vends_of(self.sales.late_vends.counts)
        # a card wait's unsubscribe frame is sent once no customer waits for an answer
        self.service.terminal.cable.leave_when = self.sales.when_no_terminal_held
        self.recovery = Recovery(context, runner=self.sales)
        # while it listens for a vend a restart left in flight, its terminal takes no sale
        self.health.report_problem_of("restart hearing", self.recovery.listening_problem)
        self.recovery.on_listening_change = self.health.problem_changed
        # ... and every face says the terminal is held, what recovery does there, until when
        self.health.report_holds_of(self._recovery_holds)
        self.sales.on_recovery_hold = self.health.problem_changed
        self.attention = AttentionSweeper(context, interval=sales_conf["attention_recheck"])
        # a step that cannot be written, a journal lost or damaged, a charge it does not hold
        self.unwritten = UnwrittenSales(self.journal, self.sales, self.recovery)
        self.journal_guard = JournalGuard(
            self.journal,
            self.health,
            self.unwritten,
            ChargeAudit(context, max_give_back=sales_conf["charge_check_max_give_back"],
                        told=self.sales.late_vends.noted),
            evaluate=self.availability.evaluate,
            wake_checker=self._checker.wake,
            running=lambda: {r.sale_id for r in self.sales.running},
            after=self.recovery.wait,
            audit_interval=sales_conf["charge_check_interval"],
            history_interval=sales_conf["charge_history_interval"],
            restart_after=sales_conf["unwritten_restart_after"],
            # its rounds (a charge check each 15 min, the disk's watch) stay on the system
            # clock under a test's FakeClock too: next_due() would take them for a sale's pauses
            clock=SYSTEM_CLOCK,
        )
        self.recovery.before_money = self.journal_guard.file_intact

    def _count_errors_in_health(self) -> None:
        """The parts whose unexpected errors health counts and shows (nothing dies silently)."""
        self.settling = Settling()  # the models built after READY=1 (assembly/collector.py)
        self.prune_errors = 0  # unexpected errors of the prune after READY=1 (Agent._prune)
        for part, count in {
            "health check": lambda: self._checker.errors,
            "availability": lambda: self.availability.listener_errors,
            "sale event listeners": lambda: self.events.listener_errors,
            "model builds after ready": lambda: self.settling.errors,
            "attention sweeper": lambda: self.attention.stats.unexpected,
            "unwritten sales": lambda: self.unwritten.unexpected,
            "journal prune": lambda: self.prune_errors,
            "journal checkpoint due": lambda: self.journal.checkpoint_due_errors,
        }.items():
            self.health.count_errors_of(part, count)

    def _lifecycle_before_start(self, systemd: SystemdLifecycle | None) -> None:
        """What is wired before start (platforms, components) and the lifecycle's flags."""
        self.settled = asyncio.Event()  # set once what READY=1 does not wait for is done
        self.platforms: list[PlatformInstance] = []
        self.not_started: dict[str, str] = {}  # trigger -> why it could not start
        self.components: list[Component] = []
        self._pending_platforms: list[_PendingPlatform] = []
        self._pending_components: list[tuple[ComponentFactory, Any]] = []
        self._terminals: dict[str, Terminal] = {}
        self._start_listing: asyncio.Future[None] | None = None  # the start's terminal list
        self._tasks: list[asyncio.Task[Any]] = []
        self._ready_task: asyncio.Task[None] | None = None  # READY=1 once recovery has finished
        self._systemd = systemd
        self.started = False
        self.ready_at: float | None = None
        self.stopped = asyncio.Event()
        self._stopping = threading.Event()  # told to work in threads (the prune)
        self._prune_thread: asyncio.Future[int] | None = None
        # checkpoints' worker threads still running (the watch's look and a commit's due may
        # each have one): a stop waits for them before it closes the journal
        self._checkpoint_threads: set[asyncio.Future[int]] = set()
        self._index_thread: asyncio.Future[list[str]] | None = None

    # -- wiring (by app.py, before start) --------------------------------------------------------

    def add_platform(self, setup: PlatformSetup, conf: dict[str, Any]) -> None:
        if conf.get("flow") is not None:  # its flow's module loaded now, not at its first sale
            self.sales.prepare_flow(Flow(conf["flow"]))
        if conf.get("max_price") is not None:  # the runner holds every platform to it
            self.sales.limit_trigger(conf["platform"], conf.get("name"), conf["max_price"])
        if conf["platform"] == "virtual":  # its simulated machine is made anew with the agent
            self.sales.machine_starts_anew("virtual")
        if conf.get("vend_timeout") is not None:  # recovery listens that long after a restart
            self.sales.trigger_vend_timeout(conf["platform"], conf.get("name"),
                                            conf["vend_timeout"])
        self._pending_platforms.append(_PendingPlatform(setup, conf))

    def add_component(self, factory: ComponentFactory, conf: Any) -> None:
        self._pending_components.append((factory, conf))

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start everything; if any part fails, what already started is stopped again."""
        try:
            await self._start()
        except BaseException as err:
            self.journal_guard.note_damage(err)  # a damaged page met: read whole next time
            await self.stop()
            raise

    async def _start(self) -> None:
        started = time.monotonic()
        self.owner.acquire()  # another agent on this journal: refused here, nothing read yet
        # lost or damaged: named (a damaged one moved aside); a full or read-only disk: waited for
        await self.journal_guard.open_journal(self._waiting_for_disk)
        self._read_unit()
        self._journal_watch.start()
        # open now: its checkpoints are the agent's from here, not from the watch's first look
        # a second on (customers in that second ran the WAL past its reserve)
        with contextlib.suppress(sqlite3.Error, JournalError):  # a disk failing: the watch's
            self._checkpoints_aside()
        self.event_log.open()
        await self.service.start()
        # With no open sale to recover (the usual start), the terminal list's round trip goes
        # on beside the first charge check's (reporting's token and queries): one after the
        # other, each waited for the service in turn before the triggers started. Until the
        # readers are enabled a terminal not listed yet is only starting
        # (health/availability.py). Recovery's sales are started on a listed terminal, as ever.
        listing = self._start_listing = asyncio.ensure_future(self.refresh_terminals())
        try:
            if self.journal.open_sales():
                await listing
            open_ids = self._start_recovery_and_checks()
        except BaseException:
            await _ended(listing)
            raise
        await listing
        self.availability.evaluate(at_start=True)
        if self.recovery.state == "done":
            # nothing to recover: the triggers start once reporting's charges were compared
            # (the usual case, a few ms), or once that comparison has read more than a page of
            # rows (a busy day's unsettled charges: read on while the unit sells); past the
            # bound they start all the same (out of service until then on a lost or damaged
            # journal: health/availability.py)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(5.0, self.settings.request_timeout)):
                    await self.journal_guard.before_triggers()
        not_started = self.not_started = await self._start_platforms()
        self.availability.readers_started()  # from now on a new reason is an outage
        for factory, conf in self._pending_components:
            component = factory(self, conf)
            await component.start()
            self.components.append(component)
        self.attention.start()
        # another unit's open sales resolved by a person with `sales resolve`: told to the bus
        self.attention.outside.follow(self.recovery.not_ours)
        ready_text = f"ready: {len(self.platforms)} trigger(s)"
        if not_started:  # not "ready": which trigger does not run, and why
            total = len(self.platforms) + len(not_started)
            ready_text = f"started with {len(self.platforms)} of {total} trigger(s); " + "; ".join(
                f"{name} cannot start: {why}" for name, why in not_started.items()
            )
        if self._systemd is not None:
            # READY=1 once recovery has finished: outside tools start on a settled journal
            await self._systemd.start(ready_text, ready=self.recovery.state == "done")
            if self.recovery.state != "done":
                self._ready_task = asyncio.create_task(self._ready_after_recovery(ready_text))
                self._tasks.append(self._ready_task)
        self.started = True
        self.ready_at = time.monotonic()
        # The health checker's rounds begin once the triggers run: the terminals were just
        # listed above, and its first round (the list again, a ping each, a journal write) was
        # a tenth of the CPU above the libraries' imports before READY=1
        self._checker.start()
        self._tasks.append(asyncio.create_task(self._after_ready()))
        _LOGGER.log(
            logging.WARNING if not_started else logging.INFO,
            "agent %s ready in %.0f ms: %d trigger(s), %d component(s), %d open sale(s)%s",
            self.version,
            (self.ready_at - started) * 1000,
            len(self.platforms),
            len(self.components),
            len(open_ids),
            "; NOT ready to sell on " + ", ".join(not_started) if not_started else "",
        )

    def _recovery_holds(self) -> dict[str, tuple[str, float | None]]:
        """The terminals recovery holds after a restart, as health reads them."""
        return {device_id: (hold.reason, hold.until)
                for device_id, hold in self.sales.recovery_holds().items()}

    def _day_figures(self, day: dt.date) -> tuple[int, int] | None:
        """A day's completed sales as the journal counts them; None where it cannot be read."""
        try:
            return self.journal.today(day_start(day))
        except (sqlite3.Error, JournalError) as err:  # the journal's own health says why
            _LOGGER.warning("the day's sales could not be read from the journal: %s", err)
            return None

    def _given_back(self, day: dt.date) -> tuple[int, int] | None:
        """What others gave back later of a day's completed sales, as the journal holds it;
        None where it cannot be read."""
        try:
            return self.journal.given_back_today(day_start(day))
        except (sqlite3.Error, JournalError) as err:  # the journal's own health says why
            _LOGGER.warning("the day's later give-backs could not be read from the journal: %s",
                            err)
            return None

    def _start_recovery_and_checks(self) -> list[str]:
        """The journal's open sales and the day's figures in health, recovery started on the
        open sales, then the journal's guard (its first charge check waits for recovery);
        returns the open sales' ids."""
        open_ids = [r.sale_id for r in self.journal.open_sales()]
        count, cents = self.journal.today()
        self.health.set_sales(
            open_ids=open_ids,
            attention={r.sale_id: r.amount_cents for r in self.journal.attention_sales()},
            today_count=count,
            today_amount_cents=cents,
        )
        self._tasks.append(asyncio.create_task(self.health.follow_sales(self.events)))
        self._tasks.append(asyncio.create_task(self.availability.follow_sales(self.events)))
        self.recovery.start()
        self.health.report_unit(not_ours_open=len(self.recovery.not_ours))
        self.journal_guard.start()
        return open_ids

    async def _start_platforms(self) -> dict[str, str]:
        """Start each trigger; those that cannot start, by name with why (logged, in health).
        One broken trigger must not keep the others (or recovery) from running."""
        not_started: dict[str, str] = {}
        for pending in self._pending_platforms:
            conf = pending.conf
            name = f"{conf.get('platform')}:{conf.get('name') or conf.get('platform')}"
            try:
                self.platforms.append(await pending.setup(self, conf))
            except CannotStart as err:  # said in words: no traceback for a known cause
                _LOGGER.error("trigger %s cannot start: %s", name, err)
                not_started[name] = str(err)
            except Exception as err:
                _LOGGER.exception("trigger %s cannot start", name)
                not_started[name] = f"{type(err).__name__}: {err} (its traceback is in the log)"
        if not_started:
            self.health.report_triggers(len(self.platforms), not_started)
        return not_started

    async def _watch_journal(self) -> None:
        """Every second (the one timer an idle agent has), the journal's disk and files as they
        must be while the agent runs: the file system not full nor read-only, no sale unwritten
        too long (JournalGuard.watch); its claim put back if a person removed its file (else a
        second agent would start on this journal too: sales/owner.py), and the journal itself
        written back if its file was removed (else every later step would be lost with it:
        Journal.put_back); sales resolved by another process (`kiosk-agent sales resolve`)
        told to the bus (OutsideResolutions)."""
        claimed, said = True, ""
        while True:
            await asyncio.sleep(DISK_WATCH_S)
            try:
                if self.journal.on_checkpoint_due is None:  # the start's could not: from here on
                    self._checkpoints_aside()
                self.journal_guard.watch()
                self.attention.outside.watch()
                if self.recovery.not_ours:  # another unit's open sales a person resolved
                    self._count_not_ours()
                if not self.unit.confirmed:  # `kiosk-agent unit adopt` from another process
                    self._read_unit()
                if claimed and not self.owner.keep():
                    claimed = False
                    self.health.report_journal_state(
                        notice=f"{self.owner.path} was removed while this agent ran and another "
                        "agent claimed the journal since: stop that one"
                    )
                done = self.journal.put_back()
                if done is not None:
                    _LOGGER.warning("journal: %s while the agent ran; the open journal written "
                                    "back there, nothing lost", done)
                await self._checkpoint_aside()
            except JournalError as err:
                if str(err) != said:  # once, not every second
                    _LOGGER.error("journal: %s", err)
                said = str(err)
            except Exception:  # never dies silently: said, and the next look tries again
                _LOGGER.exception("journal: watching its disk and files failed")

    def _checkpoints_aside(self) -> None:
        """The journal's commits leave the WAL's checkpoints to the agent
        (Journal.checkpoint_aside), each asked for by the commit that makes one due."""
        self.journal.checkpoint_aside()
        self.journal.on_checkpoint_due = self._checkpoint_soon

    def _checkpoint_soon(self) -> None:
        """A commit brought a checkpoint due (``Journal.on_checkpoint_due``): run now, not at the
        watch's next look a second later, one at a time. Customers back to back wrote ~100 sales
        a second (bench/hardware.py): by the next look the WAL was three times its reserve, and
        each commit past the reserve fsynced the file's new size too (docs/architecture.md)."""
        if self._checkpointing is None or self._checkpointing.done():
            self._checkpointing = asyncio.create_task(
                self._checkpoint_now(), name="journal-checkpoint"
            )

    async def _checkpoint_now(self) -> None:
        try:
            await self._checkpoint_aside()
        except Exception:  # never a silent death: the next due (or the watch's look) tries again
            _LOGGER.exception("journal: its checkpoint failed")

    async def _checkpoint_aside(self) -> None:
        """The WAL copied into the database in a worker thread, not inside a sale's commit on the
        event loop (Journal.checkpoint_aside); one that fails is tried again at the next due.
        Not while a customer waits for a machine's answer, if that ends within a second: the
        thread's CPU would be theirs to wait (sales/answers.py, as a released sale's capture)."""
        if not self.journal.checkpoint_due():
            return
        await self.sales.context.customers.none_waiting(CHECKPOINT_WAITS_FOR_CUSTOMER_S)
        try:
            # shielded: a stop cancels the task, not the thread, and waits for the thread to
            # end (told by _stopping) before it closes the journal and lets its claim go
            thread = asyncio.ensure_future(
                asyncio.to_thread(self.journal.checkpoint, self._stopping.is_set)
            )
            self._checkpoint_threads.add(thread)
            thread.add_done_callback(self._checkpoint_thread_ended)
            await asyncio.shield(thread)
        except sqlite3.Error as err:
            _LOGGER.warning("journal: its WAL not copied into the database now (%s); "
                            "the next checkpoint tries again", err)

    async def _checkpoint_ended(self) -> bool:
        """A checkpoint's worker thread still running (its task cancelled by the stop) ends
        before the journal closes and its claim is let go: else a second agent could open the
        journal while that thread's connection still writes (RESTART tried again). Told to stop
        trying (``_stopping``), it ends within one try; bounded all the same (a disk that hangs)."""
        if not self._checkpoint_threads:
            return True
        _, running = await asyncio.wait(self._checkpoint_threads, timeout=CHECKPOINT_STOP_WAIT_S)
        if running:
            _LOGGER.error("journal: its checkpoint's thread still runs %g s into the stop; the "
                          "journal's claim is kept until this process ends",
                          CHECKPOINT_STOP_WAIT_S)
            return False
        return True

    def _checkpoint_thread_ended(self, thread: asyncio.Future[int]) -> None:
        self._checkpoint_threads.discard(thread)
        if not thread.cancelled():
            thread.exception()  # retrieved: its caller says it, unless a stop cancelled that

    def _count_not_ours(self) -> None:
        """Health's count of another unit's open sales, once a person resolved some."""
        still = [sale_id for sale_id in self.recovery.not_ours
                 if (record := self.journal.get(sale_id)) is not None and not record.state.final]
        if len(still) != len(self.recovery.not_ours):
            self.recovery.not_ours = still
            self.health.report_unit(not_ours_open=len(still))

    def _read_unit(self) -> None:
        """The unit's id from the journal, judged against this machine (sales/unit.py); a
        journal made on another machine takes no customer and moves no money until adopted."""
        was, confirmed = self.unit.id, self.unit.confirmed
        try:
            found = load_unit(self.journal.db, self.journal.path, self.machine, self.clock)
        except (sqlite3.Error, JournalError) as err:  # a disk that takes no writes: no id kept
            if not self.unit.fault:
                _LOGGER.error("journal: the unit's id cannot be read or kept: %s", err)
            self.unit.fault = str(err)
            self.health.report_unit(mismatch=self.unit.refusal())
            self.availability.evaluate()
            return
        self.unit.fault = ""
        for name in ("id", "key", "legacy", "machine", "made_at", "mismatch"):
            setattr(self.unit, name, getattr(found, name))
        if self.unit.mismatch and (confirmed or was != found.id):
            _LOGGER.error("%s", self.unit.refusal())
        elif not confirmed and self.unit.confirmed and self.started:  # refused until now
            if was == found.id:  # the journal holds it again (it could not be read)
                _LOGGER.warning("journal: the unit's id is read again: unit %s", found.id)
            else:
                _LOGGER.warning("unit adopted on this machine: unit %s (was %s)", found.id, was)
            self.journal_guard.check_again()
        self.health.report_unit(
            id=self.unit.id, machine=self.unit.machine.describe(), made_at=self.unit.made_at,
            mismatch="" if self.unit.confirmed else self.unit.refusal(),
            made_elsewhere=self.unit.mismatch,
        )
        if self.started or not confirmed:
            self.availability.evaluate()

    def _waiting_for_disk(self, fault: str) -> None:
        if self._systemd is not None:  # the start goes on: systemd must neither time it out
            self._systemd.extend_start(_START_EXTENSION)  # nor count a failed start
            self._systemd.notifier.status(f"waiting for the journal: {fault}")

    async def _prune(self) -> None:
        """Housekeeping, after ready: old sales deleted in a worker thread, a batch at a time
        (Journal.prune). A year of sales held the start 1.5 s before READY=1. A disk that
        cannot take it now (full) leaves it to the next start."""
        keep_days = self.config["journal"]["keep_days"]
        try:
            self.event_log.prune(keep_days)
            # shielded: a stop cancels this task, not the thread, and waits for the thread to
            # end its batch before it closes the journal (stop)
            self._prune_thread = asyncio.ensure_future(asyncio.to_thread(
                self.journal.prune, keep_days, pause=PRUNE_PAUSE_S, stopping=self._stopping.is_set,
                idle=self.sales.idle, idle_wait=PRUNE_IDLE_WAIT_S,
            ))
            pruned = await asyncio.shield(self._prune_thread)
        except (sqlite3.Error, JournalError) as err:
            _LOGGER.warning("journal: old sales not pruned (%s); the next start tries again", err)
            return
        except Exception:  # a bug: said and counted in health, and what follows it still runs
            self.prune_errors += 1
            _LOGGER.exception("journal: pruning old sales failed; the next start tries again")
            return
        if pruned:
            _LOGGER.info("journal: %d finished sale(s) older than the retention removed", pruned)

    async def _after_ready(self) -> None:
        """What READY=1 does not wait for, a step per loop turn so sales go on meanwhile: the
        models a sale needs built, start-up frozen (assembly/collector.py), the journal's WAL grown
        ahead so commits overwrite it in place (Journal.reserve_wal, one step, 12 ms), old sales
        pruned; none of them in the turn of another."""
        await settle_after_ready(self.settling)
        await asyncio.sleep(0)  # the freeze's turn ends here
        self.journal.reserve_wal()
        await asyncio.sleep(0)
        await self._build_indexes()
        await self._prune()
        self.settled.set()

    async def _build_indexes(self) -> None:
        """A journal made before the late-vend or the no-selection index gains it here, after
        ready, in a worker thread (Journal.build_indexes: one scan of a table each, begun when
        no sale runs and giving way to the agent's own writes, as the prune's batches; the
        late-vend read looks among this start's steps meanwhile). A failure is said; the next
        start tries again."""
        if not self.journal.indexes_to_build:
            return
        try:
            self._index_thread = asyncio.ensure_future(asyncio.to_thread(
                self.journal.build_indexes, idle=self.sales.idle, idle_wait=PRUNE_IDLE_WAIT_S,
                stopping=self._stopping.is_set,
            ))
            built = await asyncio.shield(self._index_thread)
        except (sqlite3.Error, JournalError) as err:
            _LOGGER.warning("journal: the journal's indexes not built (%s); the next start "
                            "tries again", err)
        else:
            if built:
                _LOGGER.info("journal: index(es) built: %s", ", ".join(built))

    async def _ready_after_recovery(self, ready_text: str) -> None:
        if self._systemd is None:
            raise RuntimeError("ready after recovery without a systemd lifecycle")
        recovered = asyncio.ensure_future(self.recovery.wait())
        while not recovered.done():
            self._systemd.extend_start(_START_EXTENSION)
            await asyncio.wait({recovered}, timeout=10)
        self._systemd.ready(ready_text)

    async def stop(self, interrupt: asyncio.Event | None = None) -> None:
        """Stop: drain (:meth:`drain`), park what is still open, then everything else.

        ``interrupt`` (a second stopping signal) ends the drain early: what is open then is
        parked exactly as at the drain's deadline."""
        self._stopping.set()  # the prune's worker thread stops between its batches
        await self.drain(interrupt)
        if self._systemd is not None:
            await self._systemd.stop()
        # parked before the platforms stop: a platform's stop ends its machine's session, and
        # that must not read as the dispense's result (nothing dispensed: money given back)
        await self.sales.stop(grace=0)
        for platform in reversed(self.platforms):
            with contextlib.suppress(Exception):
                await platform.stop()
        await self.recovery.stop()
        await self.attention.stop()
        await self.journal_guard.stop()
        await self._checker.stop()
        for component in reversed(self.components):
            try:
                await component.stop()
            except Exception:
                _LOGGER.exception("component %s failed to stop", type(component).__name__)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._prune_thread is not None:  # told to stop: it ends after the batch it is in
            await asyncio.gather(self._prune_thread, return_exceptions=True)
        if self._index_thread is not None:  # its own connection: done before the journal closes
            await asyncio.gather(self._index_thread, return_exceptions=True)
        await self.service.close()
        await self._journal_watch.stop()
        self.journal.on_checkpoint_due = None
        await cancel_and_wait(self._checkpointing)
        ended = await self._checkpoint_ended()
        self.journal.close()
        if ended:  # else the claim stays until this process ends: that thread may still write
            self.owner.release()
        self.started = False
        self.stopped.set()

    async def drain(self, interrupt: asyncio.Event | None = None) -> None:
        """The first part of a stop: no new customer, and the sales already running finish.

        New triggers are refused at once (the runner, and every terminal out of service: the
        MDB reader leaves the bus after its session, the kiosk API answers 503); a sale still
        waiting for its card is cancelled (nobody paid yet); every other sale keeps running,
        and every platform keeps hearing its machine, until it ends, ``sales.stop_timeout``
        has passed on the sale clock, or ``interrupt`` is set. Health says so meanwhile
        (``stopping (draining 1 sale, until 14:03:27Z)``), and systemd hears STOPPING=1 with
        the time the stop may take. Once is enough: a second call returns at once."""
        if self.sales.stopping:
            return
        seconds = self.settings.stop_timeout
        until = self.clock.time() + seconds
        self.sales.close(until)  # before anything else: no sale may open while the rest goes
        if self._ready_task is not None:
            # a stop during recovery: no READY=1 (nor more start time) after STOPPING=1
            self._ready_task.cancel()
        self.availability.stop_taking_cards(STOPPING)
        for platform in self.platforms:
            draining = getattr(platform, "drain", None)
            if draining is not None:
                try:
                    draining()
                except Exception:
                    _LOGGER.exception("platform %s failed to start draining", platform.name)
        self.sales.cancel_unpaid()
        self.health.report_stopping(lambda: self.sales.stopping_until,
                                    lambda: len(self.sales.running))
        if self._systemd is not None:
            self._systemd.stopping(self.health.stopping_text(), seconds)
        running = len(self.sales.running)
        if not running:
            return
        _LOGGER.warning("stopping: %s", self.health.stopping_text())
        left = await self.sales.drain(seconds, interrupt)
        if left:
            why = ("a second stopping signal ended the drain"
                   if interrupt is not None and interrupt.is_set()
                   else f"sales.stop_timeout ({seconds:g} s) has passed")
            _LOGGER.warning("stopping: %s; %d sale(s) still running are parked: the next "
                            "start finishes each", why, left)

    async def __aenter__(self) -> Agent:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- the journal -----------------------------------------------------------------------------

    def _keep_unwritten(self, steps: SaleSteps) -> None:
        self.unwritten.keep(steps)

    def _probe_journal(self) -> None:
        """The checker's journal probe: one committed write; its outcome acts at once, as any
        journal write's does (a failure takes the unit out of service before the round ends)."""
        try:
            self.event_log.probe()
        except sqlite3.Error as err:  # a lock another process holds is named, as any write's
            refused = self.journal.refusal(err)
            self.journal_guard.written(refused)
            # raised named too: the checker's report of it is health's journal detail (before,
            # its bare "database is locked" took the holder's name out of health a second after
            # the first refusal had said it)
            raise refused from err
        except Exception as err:
            self.journal_guard.written(JournalError(f"cannot write the journal at "
                                                    f"{self.journal.path}: {err}"))
            raise
        self.journal.wrote()
        self.journal_guard.written(None)

    # -- terminals -------------------------------------------------------------------------------

    async def refresh_terminals(self) -> None:
        """Learn the terminals' capabilities; a failure is reported, not fatal."""
        try:
            listed = await self.service.terminal.list()
        except ServiceError as err:
            _LOGGER.warning("cannot list the terminals: %s", err)
            self.health.report_call_failed(err)
            return
        self.health.report_service(True)
        self._terminals = {t.device_id: t for t in listed}
        for device_id, name in self.settings.terminals.items():
            terminal = self._terminals.get(device_id)
            if terminal is None:
                _LOGGER.warning("configured terminal %s is not known to the service", device_id)
                self.health.report_terminal(device_id, online=False, name=name, detail="unknown")
            else:
                self.health.report_terminal(
                    device_id, online=terminal.online, connected=terminal.connected, name=name
                )

    async def can_print(self, device_id: str) -> bool:
        """Whether the terminal prints receipts: its capabilities say, not its model."""
        if device_id not in self._terminals:
            await self.refresh_terminals()
        terminal = self._terminals.get(device_id)
        return terminal is not None and terminal.capabilities.receipt_printing


async def _ended(task: asyncio.Future[Any]) -> None:
    """``task`` cancelled and waited for; what it raised meanwhile is taken, not raised (the
    start already fails for its own error)."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()
