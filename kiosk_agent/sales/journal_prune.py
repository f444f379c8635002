"""The journal's prune: finished sales older than the retention, deleted in small batches;
and the indexes a journal made before them gains, built the same way (``giving_way``).

A mixin of :class:`~kiosk_agent.sales.journal.Journal`; it works on a connection of its own, in
the agent's worker thread after it is ready (never on the path to ready).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kiosk_agent.sales.clock import Clock
from kiosk_agent.sales.journal_records import _BESIDE
from kiosk_agent.sales.states import SaleState

# How far back the charge check (sales/audit.py) reads reporting for charges the journal does
# not hold: the journal never prunes a sale younger than this and a day (Journal.prune).
CHARGE_LOOKBACK_S = 7 * 86400.0
# Sales deleted a transaction by Journal.prune: 3-4 ms of the write lock each here (some 35 ms
# on a Pi Zero), which an agent's own write waits out
PRUNE_BATCH = 50
MIN_IDLE_LOOK_S = 0.01  # how often the prune looks whether the sales let it go on
# SQLite's page cache of the prune's connection (KiB): a batch's deletes touch pages of every
# table and index. Its default, 2,000, filled over a year's prune in the worker thread's malloc
# arena and stayed there after it closed; 512 took as much CPU (40 batches of the 200,000-sale
# journal: 0.67-0.70 s against 0.65-0.72 s), 256 some 15 % more
PRUNE_CACHE_KIB = 512
# Batches in a row that may give way to the agent's own writes (prune_gives_way); the next one
# holds its turn, so a unit that never stops selling still prunes
GIVE_WAY_AT_MOST = 3
# How long a batch that gave way waits for the write it gave way to to take the lock (seconds):
# the write is in SQLite's busy wait, in sleeps of 1 to 100 ms, and a batch begun again at once
# took the lock back before it woke. Past this (a write that failed), the batch goes on
GIVE_WAY_WAIT_S = 1.0


class JournalPrune:
    """Deletes the journal's old sales (at its ``path``, by its ``clock``)."""

    path: Path
    clock: Clock
    # the prune's connection while a batch of it runs, and whether one of the agent's writes
    # asked it to give way (prune_gives_way, from the event loop's thread), and set once that
    # write holds the lock (the batch begins again only then)
    _pruning: sqlite3.Connection | None = None
    _way_asked = False
    _way_taken: threading.Event | None = None

    def prune_gives_way(self) -> threading.Event | None:
        """A batch of the prune under way rolls back now, and is done again once the sales let
        it (``idle``): called before each of the agent's own writes, on its event loop. The
        batch held the journal's write lock, and the write waited for it with the whole loop
        (SQLite's busy wait is on the caller's thread, in sleeps of 1 to 100 ms): a sale that
        began during a batch held every request 40-680 ms at load 7-9 (bench/journal.py).

        Returns the event the write sets once it holds the lock, when a batch gave way to it."""
        pruning = self._pruning
        if pruning is None:
            return None
        self._way_asked = True
        pruning.interrupt()  # a statement running ends now; between two, the flag does
        return self._way_taken

    def prune(
        self,
        keep_days: int,
        now: float | None = None,
        *,
        batch: int = PRUNE_BATCH,
        pause: float = 0.0,
        stopping: Callable[[], bool] = lambda: False,
        idle: Callable[[], bool] = lambda: True,
        idle_wait: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> int:
        """Delete finished sales older than ``keep_days``; open and attention sales are kept.

        Never one the charge check can still see: it reads reporting's charges of the last
        ``CHARGE_LOOKBACK_S`` and gives back any the journal does not hold, so a pruned sale
        whose charge is still in that window would be refunded, goods vended and all. And never
        on the wall clock's word alone, which may have been wrong when a sale was dated (a unit
        that sold before NTP set its clock dates its sales months or years back): a sale is old
        only when it was written before the first sale that is young by the wall (write order
        cannot step), and not when its money call was sent on this boot less than the retention
        ago by the monotonic clock.

        On a connection of its own, so the agent runs it in a worker thread after it is ready
        (a year of sales to read, tens of thousands to delete: seconds, which held the start and
        would hold the event loop): at most ``batch`` sales a transaction, each chosen inside
        it (a failed sale the late-charge net reopens is not deleted under it), ``pause``
        seconds between them so the agent's own writes take their turn, and none after
        ``stopping`` says so (the agent stops: the next start goes on). A batch begins once
        ``idle`` says so (no sale running), or ``idle_wait`` seconds after the last ended
        whatever it says (a unit that never stops selling still prunes): a batch holds the
        journal's write lock, and a sale's step waited for it with the whole event loop (a
        year's prune doubled a kiosk sale, 70 -> 170 ms, while it ran). A sale that begins
        during a batch all the same goes first: the batch rolls back at its word
        (:meth:`prune_gives_way`) and is done again after, ``GIVE_WAY_AT_MOST`` times in a row.
        """
        keep_s = max(keep_days * 86400.0, CHARGE_LOOKBACK_S + 86400.0)
        cutoff = (now if now is not None else self.clock.time()) - keep_s
        kept_states = (SaleState.ATTENTION.value, *[s.value for s in SaleState if not s.final])
        args: dict[str, Any] = {
            "cutoff": cutoff,
            "boot": self.clock.boot_id(),
            "mono_cutoff": self.clock.monotonic() - keep_s,
            "batch": batch,
            **{f"kept{i}": state for i, state in enumerate(kept_states)},
        }
        kept = ", ".join(f":kept{i}" for i in range(len(kept_states)))
        # the first step of a sale young by the wall: written after it, a sale is not old.
        # Read once: a step written meanwhile has a higher id.
        young_first = (
            "SELECT COALESCE(MIN(steps.id), 9223372036854775807) FROM steps "
            "JOIN sales AS young ON young.sale_id = steps.sale_id "
            "WHERE young.created_at >= :cutoff"
        )
        # the batch picked into a table of the connection's own: each delete below is then one
        # statement (one step), where a delete a sale was 150 steps a batch, each giving up
        # Python's lock and waiting to take it back from the busy event loop while this held
        # the journal's write lock: 150 ms a batch in the agent against 10 ms alone
        old = (
            "INSERT INTO temp.pruning (sale_id, created_at, rid) "  # noqa: S608 - names here
            "SELECT sale_id, created_at, rowid FROM sales "
            f"WHERE created_at < :cutoff AND state NOT IN ({kept}) "
            "AND (created_at, rowid) > (:after_at, :after_rowid) "
            "AND (SELECT MIN(id) FROM steps WHERE steps.sale_id = sales.sale_id) < :young_first "
            # the sale that holds the newest step stays: a step's id is the highest one + 1
            # (no AUTOINCREMENT, journal.py), so deleting it would give its id again, and the
            # audit's marks and the late-vend read take an id for a place in time
            "AND sale_id IS NOT (SELECT sale_id FROM steps WHERE id = (SELECT MAX(id) FROM steps)) "
            "AND NOT EXISTS (SELECT 1 FROM sale_sends WHERE sale_sends.sale_id = sales.sale_id "
            "AND sale_sends.sent_boot = :boot AND sale_sends.sent_mono > :mono_cutoff) "
            "ORDER BY created_at, rowid LIMIT :batch"
        )
        # mode=rw: a journal removed meanwhile is not made anew here (put_back writes it back)
        db = sqlite3.connect(f"file:{self.path}?mode=rw", uri=True, isolation_level=None)
        try:
            # NORMAL: a batch's COMMIT writes its WAL frames without an fsync of its own, inside
            # the write lock a sale's step may be waiting for (a batch was 20-170 ms of it at
            # load 11, and a COMMIT cannot give way). The agent's next commit (FULL) fsyncs the
            # WAL through these frames; a power cut before that loses deletions only, done
            # again by the next prune (WAL keeps the file whole either way)
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")  # as the journal's own connection
            db.execute("PRAGMA busy_timeout=5000")
            db.execute("PRAGMA temp_store=MEMORY")
            db.execute(f"PRAGMA cache_size=-{PRUNE_CACHE_KIB}")
            db.execute("CREATE TEMP TABLE pruning (sale_id TEXT, created_at REAL, rid INTEGER)")
            args["young_first"] = db.execute(young_first, args).fetchone()[0]
            args["after_at"], args["after_rowid"] = float("-inf"), -1
            pruned, gave_way = 0, 0
            self._way_taken = threading.Event()
            while True:
                if _stopped_waiting(idle, stopping, idle_wait, max(pause, MIN_IDLE_LOOK_S), sleep):
                    return pruned
                picked = self._one_batch(db, old, args, may_give_way=gave_way < GIVE_WAY_AT_MOST)
                if picked is None:
                    gave_way += 1
                    self._way_taken.wait(GIVE_WAY_WAIT_S)  # the write goes first, truly
                    continue  # it gave way to a sale: again once the sales let it
                gave_way = 0
                count, last = picked
                pruned += count
                if count < batch or stopping():
                    return pruned
                args["after_at"], args["after_rowid"] = last
                if pause:
                    sleep(pause)
        finally:
            db.close()

    def _one_batch(
        self, db: sqlite3.Connection, pick: str, args: dict[str, Any], *, may_give_way: bool
    ) -> tuple[int, tuple[float, int]] | None:
        """One batch in one transaction: the sales picked by ``pick`` and their rows deleted;
        how many, and where the next batch's pick begins. None when it gave way to one of the
        agent's writes (prune_gives_way; only ``may_give_way``): rolled back whole."""
        self._way_asked = False
        if self._way_taken is not None:
            self._way_taken.clear()
        self._pruning = db if may_give_way else None
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                self._go_on(db, pick, args)
                count, last = _picked(db)
                for table in ("steps", *_BESIDE, "sales"):
                    self._go_on(db, f"DELETE FROM {table} WHERE sale_id IN "  # noqa: S608
                                "(SELECT sale_id FROM temp.pruning)")
                self._go_on(db, "DELETE FROM temp.pruning")
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # an interrupted delete rolled it back already
                    db.execute("ROLLBACK")
                raise
        except _GaveWay:
            return None
        except sqlite3.OperationalError as err:
            if getattr(err, "sqlite_errorname", "") != "SQLITE_INTERRUPT":
                raise
            return None
        finally:
            self._pruning = None
        return count, last

    def giving_way(
        self,
        db: sqlite3.Connection,
        statement: str,
        *,
        idle: Callable[[], bool] = lambda: True,
        idle_wait: float = 0.0,
        stopping: Callable[[], bool] = lambda: False,
        sleep: Callable[[float], None] = time.sleep,
    ) -> bool:
        """One statement of housekeeping (an index a journal made before it gains: one scan of
        its table, all of it inside the write lock), on ``db``, a connection of its own in a
        worker thread, as a batch of the prune is run: begun once ``idle`` says so (or
        ``idle_wait`` seconds after), rolled back at the word of one of the agent's own writes
        (:meth:`prune_gives_way`) and begun again after it, ``GIVE_WAY_AT_MOST`` times in a row.
        On the 200,000-sale journal the late-vend index's build held the write lock 120-130 ms,
        and a sale's write begun meanwhile waited it out with the whole event loop. True once it
        ran; False when ``stopping()`` said so first (not run)."""
        gave_way = 0
        self._way_taken = threading.Event()
        while True:
            if _stopped_waiting(idle, stopping, idle_wait, MIN_IDLE_LOOK_S, sleep):
                return False
            self._way_asked = False
            self._way_taken.clear()
            self._pruning = db if gave_way < GIVE_WAY_AT_MOST else None
            try:
                self._go_on(db, statement)
                return True
            except _GaveWay:
                pass
            except sqlite3.OperationalError as err:
                if getattr(err, "sqlite_errorname", "") != "SQLITE_INTERRUPT":
                    raise
            finally:
                self._pruning = None
                if db.in_transaction:  # an interrupted statement rolled its own back already
                    db.execute("ROLLBACK")
            gave_way += 1
            self._way_taken.wait(GIVE_WAY_WAIT_S)  # the write goes first, truly

    def _go_on(self, db: sqlite3.Connection, sql: str, args: dict[str, Any] | None = None) -> None:
        """One statement of a batch, unless one of the agent's writes asked it to give way."""
        if self._way_asked:
            raise _GaveWay
        db.execute(sql, args or {})


class _GaveWay(Exception):
    """A batch of the prune rolled back for one of the agent's own writes."""


def _picked(db: sqlite3.Connection) -> tuple[int, tuple[float, int]]:
    """How many sales the batch picked, and the last one's (created_at, rowid): where the next
    batch's pick begins."""
    count = int(db.execute("SELECT COUNT(*) FROM temp.pruning").fetchone()[0])
    last = db.execute("SELECT created_at, rid FROM temp.pruning ORDER BY rowid DESC LIMIT 1")
    row = last.fetchone()
    return count, (float(row[0]), int(row[1])) if row is not None else (0.0, 0)


def _stopped_waiting(
    idle: Callable[[], bool],
    stopping: Callable[[], bool],
    longest: float,
    every: float,
    sleep: Callable[[float], None],
) -> bool:
    """Wait until ``idle()``, looked at every ``every`` seconds, at most ``longest`` seconds
    of them; True when ``stopping()`` said so meanwhile."""
    waited = 0.0
    while waited < longest and not idle():
        if stopping():
            return True
        sleep(every)
        waited += every
    return False

