"""The journal's guard: its file checked before it opens, its faults acted on at once.

Before the journal opens (``inspect_journal``):

- a journal missing, empty (0 bytes) or without its tables where the marker beside it
  (``journal.db.in-use``) says one was in use is *lost*: it was deleted, truncated, or its WAL
  was removed before the sales reached the database. Said with its path and what to do;
- a journal SQLite cannot read whole (``PRAGMA quick_check``) is *damaged*: it is moved aside
  with its WAL (``journal.db.damaged-<UTC time>``, kept for a person) and a new one is begun.

Either way the sales it held are unknown to this run, so the unit takes no customer until
reporting's recent charges were compared with the (new) journal (``sales.audit``).

While running (``JournalGuard``): every journal write reports to it. A failed one takes every
terminal out of service at once (health names the journal; the checker then probes every
``recheck_interval``); the first write that works again brings them back, has the kept unwritten
sales finished, and has the charges compared again. A sale left unwritten for
``restart_after`` seconds withholds the systemd watchdog: the agent is restarted and recovery
runs on what the journal holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from kiosk_agent.sales.audit import (
    CHECK_PAGE_SIZE,
    START_CHECK_PAGE_SIZE,
    START_WAIT_ROWS,
    AuditResult,
    ChargeAudit,
)
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sales.journal import (
    Journal,
    JournalError,
    JournalTooNew,
    integrity,
)
from kiosk_agent.sales.journal_inspect import (
    JournalNotice,
    _not_damage,
    damage_note,
    inspect_journal,
    taken_ahead,
)
from kiosk_agent.sales.settings import (
    CHARGE_CHECK_INTERVAL,
    CHARGE_HISTORY_INTERVAL,
    UNWRITTEN_RESTART_AFTER,
)
from kiosk_agent.sales.unwritten import UnwrittenSales
from kiosk_agent.tasks import BackgroundTask

_LOGGER = logging.getLogger(__name__)

FATAL_COMPONENT = "journal"
# Below this much free space (or on a read-only file system) the journal is probed at once,
# before any write fails: an idle unit learns its disk is full within a second.
LOW_SPACE_BYTES = 256 * 1024
DISK_WATCH_S = 1.0
FILE_COMPONENT = "journal file"  # the fatal a damaged file reports: a restart moves it aside


class JournalFacts(Protocol):
    @property
    def charges_pending(self) -> bool: ...


class GuardedHealth(Protocol):
    """What the guard tells health (``health.model.Health``): the sale domain imports no health."""

    @property
    def journal(self) -> JournalFacts: ...

    def report_journal(self, writable: bool, detail: str = "") -> None: ...

    def report_journal_state(self, **changes: Any) -> None: ...

    def report_unit(self, **changes: Any) -> None: ...

    def report_fatal(self, component: str, reason: str) -> None: ...

    def clear_fatal(self, component: str) -> None: ...


def disk_fault(directory: Path) -> str | None:
    """What is wrong with the journal's file system (full, out of inodes, read-only), for
    people; None when it is neither (or cannot be looked at)."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    if stat.f_flag & os.ST_RDONLY:
        return f"the file system of {directory} is read-only"
    free = stat.f_bavail * stat.f_frsize
    if free < LOW_SPACE_BYTES:
        return f"the file system of {directory} is full ({free:,} bytes free)"
    if stat.f_files and not stat.f_favail:  # the WAL and its shared memory are files to make
        return f"the file system of {directory} has no inodes left (no file can be made)"
    return None


class JournalGuard:
    """Acts on every journal write's outcome; keeps charges and unwritten sales in check."""

    def __init__(
        self,
        journal: Journal,
        health: GuardedHealth,
        unwritten: UnwrittenSales,
        audit: ChargeAudit,
        *,
        evaluate: Callable[[], None],
        wake_checker: Callable[[], None],
        running: Callable[[], set[str]],
        after: Callable[[], Awaitable[object]] | None = None,
        audit_interval: float = CHARGE_CHECK_INTERVAL,
        history_interval: float = CHARGE_HISTORY_INTERVAL,
        audit_retry: float = 5.0,
        restart_after: float = UNWRITTEN_RESTART_AFTER,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.journal = journal
        self.clock = clock  # the checks' rounds and the disk's waits (tests give a FakeClock)
        self.health = health
        self.unwritten = unwritten
        self.audit = audit
        self._evaluate = evaluate
        self._wake_checker = wake_checker
        self._running = running
        self._after = after  # the first check waits for it (recovery)
        self.audit_interval = audit_interval
        # how often a check reads the settled charges too (each terminal's whole history):
        # at every start, after every journal fault, and at least this often
        self.history_interval = history_interval
        self._history_next = 0.0  # monotonic; 0: the next check reads them
        self.audit_retry = audit_retry
        self.restart_after = restart_after
        self.notice: JournalNotice | None = None
        self.write_failures = 0
        self._broken = False
        self._disk_bad = False  # the last look at the file system found it full or read-only
        self._audit_due = asyncio.Event()
        self._wakeup = asyncio.Event()  # something changed: look again now
        self._checked = asyncio.Event()  # set once charges_pending is first cleared
        # set then, or once the start's first check has read more than START_WAIT_ROWS rows
        self._triggers_may_start = asyncio.Event()
        self._file_check: asyncio.Task[bool] | None = None  # the file read whole, after open
        self._loop = BackgroundTask(self._run, "journal-guard")
        journal.on_write = self.written
        audit.before_money = self.file_intact  # it reads before the verdict, gives back after
        unwritten.on_change = self._unwritten_changed

    # -- start -----------------------------------------------------------------------------------

    def before_open(self) -> None:
        """Check the file (lost; damaged: all but its steps, or whole when the last run found
        it damaged) and say so; the first charge check is then due."""
        ahead = taken_ahead(self.journal.path)
        if ahead is not None:  # begun before the agent was imported (inspect_ahead)
            self.notice = ahead.result()
        else:
            self.notice = inspect_journal(self.journal.path, whole=False, clock=self.clock)
        self.health.report_journal_state(path=str(self.journal.path), charges_pending=True)
        if self.notice is not None:
            _LOGGER.error("journal: %s", self.notice.message)
            self.health.report_journal_state(notice=self.notice.message)

    async def open_journal(self, waiting: Callable[[str], None] = lambda fault: None) -> None:
        """Check the file (:meth:`before_open`) and open the journal. While its file system is
        full, out of inodes or read-only and the open fails on it, look again every
        ``DISK_WATCH_S`` (told to ``waiting`` each time): exiting could not help, and under
        systemd a unit whose restarts failed ten times in five minutes stays down, not back by
        itself once space returns. Nothing starts meanwhile: no customer is taken, no sale
        recovered before it opens."""
        said = False
        while True:
            if self.notice is None:  # found lost or damaged (moved aside): kept as found; else
                self.before_open()  # looked at again each time (the disk may have hidden it)
            try:
                self.journal.open()
            except JournalTooNew:
                raise
            except JournalError as err:
                fault = disk_fault(self.journal.path.parent)
                if fault is None:
                    raise
                if not said:
                    _LOGGER.error("%s (%s); waiting for it to take writes before anything "
                                  "starts", err, fault)
                    said = True
                waiting(fault)
            else:
                if said:
                    _LOGGER.warning("journal: its file system takes writes again; starting")
                if self.notice is None:  # a journal begun anew now holds nothing to read
                    self._file_check = asyncio.create_task(self._read_whole(),
                                                           name="journal-file-check")
                return
            await self.clock.sleep(DISK_WATCH_S)

    async def _read_whole(self) -> bool:
        """SQLite's ``quick_check`` of the whole file, in a worker thread on a connection of its
        own, as the running doctor's (a year of sales: a second of a core, which held the
        start before it opened). Until it is done no money moves on the journal: the
        terminals are out of service; recovery, and the charge check before it journals or
        gives back a charge, wait (:meth:`file_intact`).
        Damage found: said in health, the unit stays out of service, and the watchdog is
        withheld; the restart reads the file whole before it opens and moves it aside."""
        path = self.journal.path
        self.health.report_journal_state(file_checking=True)
        self._evaluate()
        try:
            problems = await asyncio.to_thread(integrity, path, quick=True)
        except Exception as err:  # the check itself broke: said, and no money waits on it
            _LOGGER.exception("journal: its file could not be checked")
            problems = [f"cannot check: {type(err).__name__}: {err}"]
        damage = [p for p in problems if p != "no sales table: the journal is empty"]
        if not damage or _not_damage(damage):
            self.health.report_journal_state(file_checking=False)
            self._evaluate()
            return True
        found = "; ".join(damage[:3])
        message = (f"the journal at {path} is damaged ({found}); nothing is charged or given "
                   "back on it. A restart (systemd's watchdog makes one) moves it aside, "
                   "begins a new journal and compares reporting's charges with it")
        with contextlib.suppress(OSError):  # a disk that cannot take it: found again anyway
            damage_note(path).write_text(found + "\n")
        self.notice = JournalNotice("damaged", message)
        self.health.report_journal_state(file_checking=False, file_damaged=True, notice=message)
        self.health.report_fatal(FILE_COMPONENT, "damaged (the journal's notice says where and "
                                 "what): a restart moves it aside")
        self._evaluate()
        return False

    def note_damage(self, err: BaseException) -> None:
        """A read or write met a damaged page (SQLite: "malformed", "not a database"), at
        start before the file was read whole, or later: the next start reads it whole before
        it opens, and moves it aside. Without this a start that fails on such a page would be
        restarted onto the same page, again and again."""
        text = str(err).lower()
        if not any(sign in text for sign in ("malformed", "not a database")):
            return
        _LOGGER.error("journal: its file is damaged (%s); the next start reads it whole and "
                      "moves it aside", err)
        with contextlib.suppress(OSError):
            damage_note(self.journal.path).write_text(f"{err}\n")

    async def file_intact(self) -> bool:
        """Whether the journal's file read whole (:meth:`_read_whole`), once it is known: the
        gate before money moves on it. True at once when nothing is being read."""
        if self._file_check is None:
            return True
        return await asyncio.shield(self._file_check)

    def start(self) -> None:
        self.unwritten.start()
        self._loop.start()
        self._audit_due.set()
        self._wakeup.set()

    async def stop(self) -> None:
        await self._loop.stop()
        await self.unwritten.stop()
        if self._file_check is not None:
            # its worker thread reads the file on a connection of its own, which no cancel
            # ends: done before the journal closes and its claim is let go (as the prune's,
            # the index's and the checkpoint's threads), else the next agent on this path
            # opens the journal beside a reader of this one
            await asyncio.gather(asyncio.shield(self._file_check), return_exceptions=True)

    def check_again(self) -> None:
        """Compare the charges now, the settled ones too (the unit's id changed: adopted)."""
        self._audit_due.set()
        self._history_next = 0.0
        self._wakeup.set()

    async def first_check(self) -> AuditResult | None:
        """Wait until the first charge comparison of this start has been made."""
        await self._checked.wait()
        return self.audit.last

    async def before_triggers(self) -> None:
        """What the start waits for before its triggers (bounded by the caller): the first
        charge comparison made, or under way past ``START_WAIT_ROWS`` of reporting's rows (a
        busy day's unsettled charges: read on while the unit sells, as the settled are). A lost
        or damaged journal keeps its terminals out of service until the comparison is made
        (health/availability.py), whatever the triggers do."""
        await self._triggers_may_start.wait()

    def _read_on_while_selling(self) -> None:
        if not self._triggers_may_start.is_set():
            _LOGGER.info("charge check: more than %d of reporting's rows; the triggers start "
                         "while it reads the rest", START_WAIT_ROWS)
            self._triggers_may_start.set()

    @property
    def history_read(self) -> bool:
        """Whether a check read the settled charges too (on an intact journal, the check right
        after the start's first) and is not due to read them again now."""
        return self._history_next > 0.0

    # -- every write -----------------------------------------------------------------------------

    def written(self, err: JournalError | None) -> None:
        """The journal's listener: ``err`` None when a write went through."""
        if err is None:
            if self._broken:
                self._broken = False
                self.health.report_journal(True)
                _LOGGER.warning("journal takes writes again")
                self.unwritten.wake()
                self._audit_due.set()  # what was lost meanwhile is looked for in reporting
                self._history_next = 0.0  # settled since, too
                self._wakeup.set()
                self._evaluate()
            return
        self.write_failures += 1
        self.note_damage(err)
        if not self._broken:
            self._broken = True
            self.health.report_journal(False, str(err))
            self._evaluate()
            self._wake_checker()
            self._wakeup.set()

    def _unwritten_changed(self) -> None:
        self.health.report_journal_state(unwritten_sales=self.unwritten.sale_ids)
        self._evaluate()
        self._wakeup.set()

    # -- the loop: charge checks, a restart when nothing else helps -----------------------------

    async def _run(self) -> None:
        if self._after is not None:
            try:
                await self._after()
            except Exception:  # recovery broke (a failing disk): the checks go on regardless
                _LOGGER.exception("recovery ended with an error; charges are checked anyway")
        next_check = self.clock.monotonic()
        while True:
            self._wakeup.clear()
            now = self.clock.monotonic()
            if not self._broken and (self._audit_due.is_set() or now >= next_check):
                self._audit_due.clear()
                retry = await self._check_charges()
                retry_in = self.audit_retry if retry else self.audit_interval
                next_check = self.clock.monotonic() + retry_in
            wait = next_check - self.clock.monotonic()
            # the clock's wait_for (asyncio.timeout on the real one, not asyncio.wait_for: on
            # 3.11 a wake-up that lands with a stop's cancel would swallow the cancel)
            with contextlib.suppress(TimeoutError):
                await self.clock.wait_for(self._wakeup.wait(), max(0.05, wait))

    async def _check_charges(self) -> bool:
        """One comparison; True when it must be tried again soon (it could not be made)."""
        settled = self.clock.monotonic() >= self._history_next
        # A start on an intact journal: the triggers wait for the unsettled charges only (a few
        # rows); the settled, every charge a terminal ever made (a year: thousands of rows, the
        # start's 5 s bound), are read by the check that follows at once, with sales going on
        history_next = settled and self.notice is None and not self._checked.is_set()
        if history_next:
            settled = False
        # the start's first check, which the triggers wait for: the client's larger pages
        first = not self._checked.is_set()
        page_size = START_CHECK_PAGE_SIZE if first else CHECK_PAGE_SIZE
        try:
            result = await self.audit.check(
                self._running(), settled=settled, page_size=page_size,
                long=self._read_on_while_selling if first else None,
            )
        except JournalError as err:  # the journal broke while the check wrote: once it is back
            self._audit_due.set()
            self._wakeup.set()
            _LOGGER.warning("charge check stopped: %s", err)
            return True
        except Exception as err:
            _LOGGER.exception("charge check failed")
            result = AuditResult(at=self.clock.time(), error=f"{type(err).__name__}: {err}")
        pending = self.health.journal.charges_pending
        foreign = self.audit.foreign
        self.health.report_unit(foreign=foreign.lines(), foreign_charges=foreign.counted,
                                foreign_cleared=foreign.cleared)
        if result.ok and settled:
            self._history_next = self.clock.monotonic() + self.history_interval
        if result.ok:
            detail = ""
            if result.unaccounted:
                ended = ", ".join(f"{e.sale_id} {e.state.value}" for e in result.events)
                detail = f"{len(result.unaccounted)} charge(s) it did not hold were found: {ended}"
            self.health.report_journal_state(
                charges_pending=False, charges_checked_at=result.at,
                charges_detail=detail if result.unaccounted else "", charges_by_unit=False,
            )
        elif pending and self.notice is None:
            # reporting cannot answer, and nothing says the journal lost anything: the unit
            # takes customers; the check runs again at the next interval
            self.health.report_journal_state(
                charges_pending=False, charges_detail=f"charges not checked: {result.error}",
                charges_by_unit=result.by_unit,
            )
        else:
            self.health.report_journal_state(charges_detail=f"charges not checked: {result.error}",
                                             charges_by_unit=result.by_unit)
        if not self.health.journal.charges_pending:
            self._checked.set()
            self._triggers_may_start.set()
        if pending != self.health.journal.charges_pending:
            self._evaluate()
        if history_next and result.ok:  # the settled now, as every start reads them
            self._audit_due.set()
            self._wakeup.set()
        return self.health.journal.charges_pending

    def watch(self) -> None:
        """Every ``DISK_WATCH_S``, from the agent's one watch of its journal (beside its files):
        a disk turned full or read-only, sales that stay unwritten too long."""
        self._withhold_watchdog_if_stuck()
        self._watch_disk()

    def _watch_disk(self) -> None:
        """A file system turned full or read-only has the checker probe the journal now (a
        probe that fails takes the unit out of service); a write, not this look, decides."""
        bad = disk_fault(self.journal.path.parent) is not None
        if bad and not self._disk_bad and not self._broken:
            self._wake_checker()
        self._disk_bad = bad

    def _withhold_watchdog_if_stuck(self) -> None:
        age = self.unwritten.oldest_age()
        if age > self.restart_after:
            self.health.report_fatal(
                FATAL_COMPONENT,
                f"{len(self.unwritten.sale_ids)} sale(s) not journaled for {age:.0f} s; a "
                "restart lets recovery finish them",
            )
        elif not self.unwritten.sale_ids:
            self.health.clear_fatal(FATAL_COMPONENT)
