"""The durable journal: every sale and every step, on disk before the call it leads to.

SQLite in WAL mode with ``synchronous=FULL``: a step is committed (fsynced) before the flow makes
the external call the step announces, so after a crash or a power cut the journal always says
what might have happened, and recovery can find out what did. The one kind of step that
announces no call and moves no money, the card read's interaction id (``UNSYNCED_STEPS``), is
committed without an fsync of its own: a killed process keeps it, the next commit makes it
durable. A step written in :meth:`Journal.fsync_shared` (the capture request) is fsynced with
another sale's commit made beside it, else by the journal itself: its caller waits for that
before it announces it or makes its call. Writes are synchronous on purpose: each is one small
transaction (about a millisecond on flash), and ordering is then trivially right.

Nothing here ever holds a card number, a card token, an API key or a secret: sales carry the
locally made ``order_id``, the service's ``interaction_id`` and ``trans_id``, amounts, states, and
at most the card brand and the last four digits.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import itertools
import json
import logging
import os
import re
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the journal's commands (`kiosk-agent sales`) run without an event loop
    import asyncio

from kiosk_agent import durable
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sales.journal_prune import (
    CHARGE_LOOKBACK_S,
    PRUNE_BATCH,
    JournalPrune,
)
from kiosk_agent.sales.journal_reads import JournalReads
from kiosk_agent.sales.journal_records import (
    _BESIDE,
    _BESIDE_COLUMNS,
    _COLUMN_SET,
    _SALES_COLUMNS,
    _SELECT_SALES,
    LATER_COLUMNS,
    HeldStep,
    SaleRecord,
    StepRecord,
    replaced,
    transaction,
)
from kiosk_agent.sales.kinds import NO_SELECTION_SQL

# the platforms hear it as one of the dispenser contract's refusals
from kiosk_agent.sales.model import JournalError as JournalError
from kiosk_agent.sales.states import (
    REOPENED_AFTER,
    SaleState,
    Step,
    TransitionRefused,
    check_transition,
)

# the journal's public names, wherever they live (callers import them from here)
__all__ = [
    "ASIDE_CACHE_KIB",
    "CHARGE_LOOKBACK_S",
    "MARKER_SUFFIX",
    "PRUNE_BATCH",
    "SCHEMA_VERSION",
    "UNSYNCED_STEPS",
    "WAL_RESERVE_BYTES",
    "HeldStep",
    "Journal",
    "JournalDamaged",
    "JournalError",
    "JournalTooNew",
    "SaleMoved",
    "SaleRecord",
    "StepRecord",
    "integrity",
    "marker_path",
    "side_files",
    "transaction",
]

# What a reader must understand to use the journal. Bumped only by a change an older release
# cannot read past (a renamed column, a changed meaning): new facts go into new tables, which
# the previous release never reads, so it still runs on a journal this one wrote
# (docs/operations.md, "Rolling back"). A release refuses, before writing anything, a journal
# whose version is above its own.
SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sales (
    sale_id          TEXT PRIMARY KEY,
    order_id         TEXT NOT NULL UNIQUE,
    source           TEXT NOT NULL,
    flow             TEXT NOT NULL,
    terminal         TEXT NOT NULL,
    product          TEXT,
    amount_cents     INTEGER NOT NULL,
    currency         TEXT NOT NULL DEFAULT 'USD',
    state            TEXT NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 1,
    interaction_id   TEXT,
    interaction_kind TEXT,
    trans_id         TEXT,
    authorized_cents INTEGER NOT NULL DEFAULT 0,
    vended_cents     INTEGER NOT NULL DEFAULT 0,
    captured_cents   INTEGER NOT NULL DEFAULT 0,
    reversed_cents   INTEGER NOT NULL DEFAULT 0,
    reverse_trans_id TEXT,
    card_brand       TEXT,
    last_four        TEXT,
    vault_uuid       TEXT,
    plan_id          TEXT,
    message          TEXT NOT NULL DEFAULT '',
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    finished_at      REAL,
    answer_by        REAL,
    resolution       TEXT
);
CREATE INDEX IF NOT EXISTS sales_state_created ON sales(state, created_at);
CREATE INDEX IF NOT EXISTS sales_created ON sales(created_at);
CREATE TABLE IF NOT EXISTS steps (
    id       INTEGER PRIMARY KEY,
    sale_id  TEXT NOT NULL REFERENCES sales(sale_id),
    at       REAL NOT NULL,
    step     TEXT NOT NULL,
    state    TEXT NOT NULL,
    detail   TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS steps_sale ON steps(sale_id);
CREATE TABLE IF NOT EXISTS sale_sends (
    sale_id   TEXT PRIMARY KEY REFERENCES sales(sale_id),
    sent_at   REAL,
    sent_mono REAL,
    sent_boot TEXT
);
CREATE TABLE IF NOT EXISTS sale_later (
    sale_id      TEXT PRIMARY KEY REFERENCES sales(sale_id),
    later_cents  INTEGER,
    later_status TEXT,
    later_by     TEXT,
    later_at     REAL
);
"""

# Partial indexes added after journals were in use: each built at open where its table has no
# row yet; on a journal made before it, after ready in a worker thread (Journal.build_indexes,
# giving way to the agent's own writes): each is one scan of its table, all of it inside the
# journal's write lock, on bench/journal.py's 200,000 sales:
# steps_late_vend: the products dispensed after their sale gave up waiting, and a person's
# acknowledgement of each (sales/late_vends.py): health reads them at every snapshot, and no
# other step's write pays for it. A scan of 1.18 million steps: 100-107 ms of a core (101-156 ms
# wall at load 5); meanwhile the late-vend read looks among the steps written since the open
# sales_no_selection: the card sessions that ended with no selection (sales.kinds), so every
# face counts them apart from an index (a scan of 200,000 sales took 0.17 s). Its build: 23-24 ms
# of a core at open (25-66 ms wall at load 8.5); meanwhile the counts read the rows themselves
_LATE_VEND_INDEX = """CREATE INDEX IF NOT EXISTS steps_late_vend ON steps(at)
    WHERE step IN ('late.vend', 'late.vend.seen')"""
_NO_SELECTION_INDEX = """CREATE INDEX IF NOT EXISTS sales_no_selection ON sales(created_at)
    WHERE """ + NO_SELECTION_SQL
_LATE_INDEXES = {  # name: (its table, its statement)
    "sales_no_selection": ("sales", _NO_SELECTION_INDEX),
    "steps_late_vend": ("steps", _LATE_VEND_INDEX),
}

# Indexes a later one replaced (sales_state_created leads with the state): dropped on open, so a
# write keeps one index of the state up to date, not two.
_RETIRED_INDEXES = ("sales_state",)

# The steps' ids come from the rowid (the highest one + 1), not AUTOINCREMENT: that rewrote its
# row of sqlite_sequence, a WAL page, in every commit of a step (a window's three fsynced commits
# and the floor's alike). An id is still never reused: only the prune deletes steps, and it
# keeps the sale that holds the newest one (journal_prune.py). A journal made with it loses the
# keyword on open (_steps_without_autoincrement): the same table on disk, no rebuild.
_AUTOINCREMENT = re.compile(r"\s+AUTOINCREMENT\b", re.IGNORECASE)

# Columns added after version 1, with their type: added in place to an older journal on open.
_ADDED_COLUMNS = {
    "answer_by": "REAL",
    "resolution": "TEXT",
}

_LOGGER = logging.getLogger(__name__)

_SIDE = ("-wal", "-shm")
# What SQLite lets the WAL hold before it checkpoints on its own (wal_autocheckpoint: 1000
# pages of 4 KiB by default): grown ahead once a run (Journal.reserve_wal).
WAL_RESERVE_BYTES = 1000 * 4096
# Rows a running agent writes between two of its checkpoints (Journal.checkpoint_due), told
# by the commit that reaches it (Journal.on_checkpoint_due): a sale over mdb writes some 19
# rows in some 38 pages of WAL (2 a row: each commit writes the newest page of each table and
# index it touches), so 300 rows are some 16 sales and 600 pages, under the 1,000 that
# WAL_RESERVE_BYTES grows it to with room for the wait below. At 1,000 rows, looked at once a
# second, a burst of customers (bench/hardware.py) ran it to three times its reserve.
CHECKPOINT_AFTER_ROWS = 300
# A checkpoint's RESTART that cannot now is tried again this often, this far apart (a thread's)
RESTART_TRIES = 10
RESTART_RETRY_S = 0.002
# A due checkpoint waits this long at most for no customer to be waiting for a machine's answer
# (sales/answers.py, WaitingCustomers): its worker thread's 2-3 ms of CPU at a tenth of a core
# was 25 ms more of one customer's vend -> approve, once every ~70 sales (bench/pi.py). One
# watch period: the journal watch (which waits with it) looks again at most a second late.
CHECKPOINT_WAITS_FOR_CUSTOMER_S = 1.0
# A stop waits this long at most for a checkpoint's worker thread (told to stop trying, it ends
# within one RESTART try) before it closes the journal (Agent._checkpoint_ended)
CHECKPOINT_STOP_WAIT_S = 10.0
WAL_ROOM_NEEDED = 16 * WAL_RESERVE_BYTES  # free space under which it is not grown
_WAL_SPILL_CACHE_KIB = 64  # SQLite's page cache while growing it: full at once, so it spills
# SQLite's page cache of the journal's own connection. A sale's commit touches a few dozen
# pages (the newest of each table and index); SQLite's default, 2,000 KiB, filled with pages of
# a year's journal as the agent sold and was held for good: RSS grew by it after the first
# 1,000 sales (bench/journal.py). Full at READY=1 at this size, so it does not grow after.
CACHE_KIB = 512
# ... of a connection opened for one job in a worker thread (the whole file's quick check, a
# checkpoint): each page read once, so a cache saves nothing (a quick check of 200,000 sales
# took as much CPU with 64 KiB as with 2,000), and the 2 MB it filled, freed at close, stayed
# in that thread's malloc arena (malloc_trim gave 2.4 MB of it back after a doctor's run)
ASIDE_CACHE_KIB = 64
_WAL_RESERVE = "wal_reserve"  # the scratch table that grows it, never committed
# Beside the journal, written once it holds its tables: "a journal was in use here". A journal
# found missing or empty while this exists was lost (deleted, truncated, its WAL removed).
MARKER_SUFFIX = ".in-use"


# Steps committed without an fsync of their own (``synchronous=NORMAL`` for their one
# transaction). In WAL mode such a commit is written into the WAL at once, into the OS's page
# cache: a killed process keeps it, only a power cut can undo it, and the next commit (FULL)
# fsyncs the WAL through it. Only a step that moves no money and announces no call: the card
# read's interaction id, which recovery cancels the read by after a kill; after a power cut it
# finds a read without an id, as after a kill before the read's answer (the lost-read wait).
# And a card-first customer's choice (the vend it pays for, up to the price held, was fsynced
# with the approval): recovery listens for that vend only on the boot that made it, which a
# kill does not end and a power cut does; without the choice it gives the money back at once.
# Every other step, and every money step, is fsynced before what it announces (docs/journal.md).
UNSYNCED_STEPS = frozenset({Step.READ_CARD_ACCEPTED, Step.DISPENSE_CHOSEN})

# Turns of the event loop a commit made in fsync_shared() waits for another sale's fsynced
# commit before the journal fsyncs it alone. Back to back, the next customer's sale is written
# one turn after the previous customer's capture request (59 of 60 bench customers; the 60th
# had no next); a lone customer's waits two turns, a few microseconds each.
FSYNC_SHARED_TURNS = 2
# A write refused for the lock (another process holds it) touched no page of the journal.
_LOCK_REFUSED = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_WAL_WRITE_LOCK_BYTE = 120  # the WAL write lock's byte in the -shm file (SQLite's unix VFS)
# How long a write waits for the lock once one found it held past the busy wait by another
# process (a tech's sqlite3 shell): until a write goes through again. SQLite's busy wait is on
# the event loop's thread; at 5 s for every write the loop stood still nearly the whole time
# the shell held the lock.
_BUSY_ELSEWHERE_MS = 100

# a sale's flow is fixed: the states it may be in follow from it
_UPDATABLE = _COLUMN_SET - {"sale_id", "order_id", "created_at", "flow"}
# Keys that must never reach the journal, whatever a caller passes in a step's detail.
_FORBIDDEN_DETAIL = frozenset(
    {"token", "account_token", "api_key", "refresh_token", "card_number", "secret", "password"}
)


class JournalTooNew(JournalError):
    """The journal was written by a newer release (a higher schema version): refused before
    anything is written, so a rollback never damages what the newer release kept."""


class JournalDamaged(JournalError):
    """The journal's file is there but SQLite cannot read it whole (``quick_check`` failed)."""


WriteListener = Callable[["JournalError | None"], None]


class SaleMoved(Exception):
    """A write found the sale in another state than the writer saw (``if_state``, by default
    the record's own): someone else (another process on the same journal) wrote first.
    ``state`` is what it is now."""

    def __init__(self, sale_id: str, state: SaleState | None) -> None:
        shown = state.value if state is not None else "gone"
        super().__init__(f"sale {sale_id} is {shown} now")
        self.sale_id = sale_id
        self.state = state


class Journal(JournalReads, JournalPrune):
    """The sales journal on disk. Open once per process; every write is its own transaction."""

    def __init__(self, path: Path | str, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = Path(path)
        self.clock = clock  # dates the records (wall time: for people, never for a wait)
        self._db: sqlite3.Connection | None = None
        self._copy_dir: Path | None = None  # a copy read in its place (open_to_read)
        self._reopen = False  # put back, not reopened yet (put_back tries again)
        self._identity: tuple[int, int] | None = None  # the file open(): put_back compares
        self._batching = False  # inside batch(): writes join its one transaction
        # a sale created inside the batch, written at its end (or at the journal's next
        # statement): one INSERT of the row in its last state and one of its steps
        self._created: _Created | None = None
        # steps of a sale on disk taken inside the batch, written at its end (or at the
        # journal's next statement): one UPDATE of the row and one INSERT of the steps
        self._updated: _Updated | None = None
        # the state of each sale this batch wrote, as it wrote it (the batch holds the lock)
        self._batch_states: dict[str, str] = {}
        # the partial indexes open() left for after ready (build_indexes), by name
        self.indexes_to_build: tuple[str, ...] = ()
        self._fsync_shared = False  # inside fsync_shared(): commits without an fsync of their own
        # another process held the write lock past the busy wait: writes wait _BUSY_ELSEWHERE_MS
        # for it until one commits
        self._held_elsewhere = False
        self._fsync_owed = False  # a commit since this connection's last fsynced one made none
        self._fsync_waiters: list[asyncio.Future[None]] = []  # fsynced(): woken by the next
        # checkpoints made off this connection (checkpoint_aside), not inside a commit of its
        # own: the running agent's, whose commits are on its event loop
        self._checkpoints_aside = False
        self._changes_at_checkpoint = 0
        # Told by the commit that brings the rows written since the last checkpoint aside to
        # CHECKPOINT_AFTER_ROWS (and by each commit after it until checkpoint_due() is asked):
        # the running agent checkpoints then, not at its next once-a-second look, by which a
        # burst of customers had run the WAL past its reserve (each commit past it fsyncs the
        # file's new size too)
        self.on_checkpoint_due: Callable[[], None] | None = None
        self.checkpoint_due_errors = 0  # on_checkpoint_due raised (a bug): counted, not fatal
        # Told after every write: None when it went through, the error when it did not (the
        # agent takes the unit out of service at once, from whichever path wrote).
        self.on_write: WriteListener | None = None

    @property
    def marker(self) -> Path:
        return marker_path(self.path)

    # -- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except (sqlite3.Error, OSError) as err:
            raise JournalError(f"cannot open the journal at {self.path}: {err}") from err
        try:
            db.row_factory = sqlite3.Row
            _refuse_newer(db, self.path)
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(self._connection_settings())  # the setup's too: its commits
            _migrate(db)
            self.indexes_to_build = _late_indexes(db)
            self.late_vend_after = (
                int(db.execute("SELECT max(id) FROM steps").fetchone()[0])
                if "steps_late_vend" in self.indexes_to_build else None
            )
            # the sales are the operator's business: the database and its WAL are private
            for part in (self.path, *(self.path.with_name(self.path.name + s) for s in _SIDE)):
                if part.exists():
                    part.chmod(0o600)
            if not self.marker.exists():
                self.marker.write_text("a kiosk-agent journal is in use beside this file\n")
            self._identity = _identity(self.path)
            db = self._for_the_run(db)
        except JournalError:
            db.close()
            raise
        except (sqlite3.Error, OSError) as err:
            db.close()
            raise JournalError(f"cannot open the journal at {self.path}: {err}") from err
        self._db = db
        self._held_elsewhere = False  # its settings' busy wait
        self._changes_at_checkpoint = 0  # a connection's total_changes start at 0

    def _for_the_run(self, setup: sqlite3.Connection) -> sqlite3.Connection:
        """A connection of its own for the run, ``setup`` (which checked and migrated the
        journal) closed: Python keeps every statement a connection ran prepared (up to 128),
        and the setup's 17-22 (the schema's, the migration's, the PRAGMAs'), run once a start,
        held some 35-60 KB of SQLite's memory for the whole run. This one's settings go in one
        script, which Python does not keep. It reads the journal before the setup closes, so
        the setup's close is not the file's last connection's: no checkpoint, the WAL stays as
        it is."""
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.row_factory = sqlite3.Row
            db.executescript(self._connection_settings())
            db.executescript("SELECT 1 FROM sales LIMIT 0")  # the file held open as a reader's
        except sqlite3.Error:
            db.close()
            raise
        setup.close()
        return db

    def _connection_settings(self) -> str:
        """The settings of a connection that writes the journal (each connection's own), as one
        script: the setup's and the run's alike."""
        # FULL: a committed step survives a power cut, not only a process crash.
        settings = [
            "PRAGMA synchronous=FULL", "PRAGMA foreign_keys=ON", "PRAGMA busy_timeout=5000",
            f"PRAGMA cache_size=-{CACHE_KIB}",
        ]
        if self._checkpoints_aside:
            settings.append("PRAGMA wal_autocheckpoint=0")
        return "; ".join(settings) + ";"

    def open_to_read(self) -> None:
        """Open for reading only (``sales``, ``sales attention``, ``sales show``, doctor): it
        never writes, so it reads beside a running agent and on a disk that is full or
        read-only, where :meth:`open` (which may migrate, and makes the WAL) cannot. Where
        SQLite cannot read the journal in place (a WAL journal on a file system that cannot
        take its shared-memory file; an older schema), a private copy of it and its WAL is
        read instead."""
        if not self.path.exists():
            raise JournalError(f"cannot open the journal at {self.path}: no such file")
        try:
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        except sqlite3.Error as err:
            raise JournalError(f"cannot open the journal at {self.path}: {err}") from err
        try:
            _refuse_newer(db, self.path)
            db.execute(f"{_SELECT_SALES} LIMIT 0")  # the tables as this release reads them
        except JournalError:
            db.close()
            raise
        except sqlite3.Error:
            db.close()
            db = self._read_a_copy()
        db.row_factory = sqlite3.Row
        self._db = db

    def _read_a_copy(self) -> sqlite3.Connection:
        copy_dir = Path(tempfile.mkdtemp(prefix="kiosk-agent-journal-"))
        copy = copy_dir / self.path.name
        try:
            for source, target in zip((self.path, *side_files(self.path)),
                                      (copy, *side_files(copy)), strict=True):
                if source.exists() and not source.name.endswith("-shm"):
                    shutil.copyfile(source, target)
            db = sqlite3.connect(copy, isolation_level=None, check_same_thread=False)
            try:
                db.row_factory = sqlite3.Row
                _refuse_newer(db, self.path)
                _migrate(db)  # the copy's, never the journal's
                for name in _late_indexes(db):  # a command's own: on no path to ready
                    db.execute(_LATE_INDEXES[name][1])
                db.execute("PRAGMA query_only=ON")
            except BaseException:
                db.close()
                raise
        except (OSError, sqlite3.Error) as err:
            shutil.rmtree(copy_dir, ignore_errors=True)
            raise JournalError(f"cannot read the journal at {self.path}: {err}") from err
        self._copy_dir = copy_dir  # removed by close()
        return db

    def checkpoint_aside(self) -> None:
        """From now on this connection's commits leave the WAL's checkpoints to :meth:`checkpoint`
        (when :meth:`checkpoint_due`). SQLite's own runs inside the commit that passes 1,000
        pages of WAL: it copies them into the database and fsyncs it, 10-13 ms of a commit on
        the 2-core machine's disk against 0.27 ms (every 330th commit of a bare loop), more on a
        year's journal and an SD card, and the running agent's commits are on its event loop: a
        customer's sale and every request waited for it."""
        self._checkpoints_aside = True
        self._changes_at_checkpoint = self.db.total_changes
        self.db.execute("PRAGMA wal_autocheckpoint=0")

    def checkpoint_due(self) -> bool:
        """This connection has written ``CHECKPOINT_AFTER_ROWS`` rows since the last checkpoint
        made aside: True once, and the count starts again (the caller then runs
        :meth:`checkpoint`). Asked on the connection's own thread."""
        if not self._checkpoint_owed():
            return False
        self._changes_at_checkpoint = self.db.total_changes
        return True

    def _checkpoint_owed(self) -> bool:
        db = self._db
        return (self._checkpoints_aside and db is not None
                and db.total_changes - self._changes_at_checkpoint >= CHECKPOINT_AFTER_ROWS)

    def checkpoint(self, stopping: Callable[[], bool] | None = None) -> int:
        """Copy the WAL into the database on a connection of its own (for a worker thread: it
        touches nothing of this one); the frames copied. PASSIVE: it waits for no writer and no
        reader, and what it cannot copy now the next one does. A committed step is durable in
        the WAL already: this only keeps the WAL from growing past what reserve_wal grew it to.

        Then RESTART, waiting for nobody (``busy_timeout`` 0): when no write is under way it
        takes the write lock, copies what was committed during the pass (a few frames) and, with
        no reader inside the WAL, leaves it whole in the database, so the next commit writes the
        WAL from its beginning again. A WAL is only begun again after a pass that left nothing
        behind, and with sales and the prune writing, a commit always landed during a PASSIVE
        pass: on the 200,000-sale journal the WAL grew to 1.1 GB in 13 minutes of the prune and
        kiosk sales, and its index (mapped into the agent, 32 KiB for every 16 MiB of WAL) by
        2.1 MB of the agent's RSS (bench/journal.py). A RESTART that cannot now (a write under
        way, a reader still in an older snapshot) is tried again ``RESTART_TRIES`` times,
        ``RESTART_RETRY_S`` apart, waiting for nobody each time: customers back to back keep a
        write under way much of the time, and a burst ran the WAL past its reserve before the
        next checkpoint. Where it cannot, the next checkpoint tries. ``stopping()`` True ends
        the tries (a stop waits for this thread before it closes the journal)."""
        aside = sqlite3.connect(f"file:{self.path}?mode=rw", uri=True, isolation_level=None)
        try:
            aside.execute("PRAGMA busy_timeout=5000")
            aside.execute(f"PRAGMA cache_size=-{ASIDE_CACHE_KIB}")
            row = aside.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            aside.execute("PRAGMA busy_timeout=0")
            for _ in range(RESTART_TRIES):
                with contextlib.suppress(sqlite3.OperationalError):  # busy, said as an error
                    if aside.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0] == 0:
                        break
                if stopping is not None and stopping():
                    break
                time.sleep(RESTART_RETRY_S)
        finally:
            aside.close()
        return int(row[2]) if row is not None else 0

    def build_indexes(
        self,
        *,
        idle: Callable[[], bool] = lambda: True,
        idle_wait: float = 0.0,
        stopping: Callable[[], bool] = lambda: False,
        sleep: Callable[[float], None] = time.sleep,
    ) -> list[str]:
        """Build the partial indexes a journal made before them lacks (open() left them for
        after ready: each a scan of its table), on a connection of its own, in a worker thread,
        each begun once ``idle`` says so and giving way to the agent's own writes as the prune's
        batches do (:meth:`giving_way`); the reads use each from then on. The names built now;
        none after ``stopping()`` says so (the next start builds what is left)."""
        built: list[str] = []
        if not self.indexes_to_build:
            return built
        aside = sqlite3.connect(f"file:{self.path}?mode=rw", uri=True, isolation_level=None)
        try:
            aside.execute("PRAGMA busy_timeout=5000")
            aside.execute(f"PRAGMA cache_size=-{ASIDE_CACHE_KIB}")
            for name in self.indexes_to_build:
                if not self.giving_way(aside, _LATE_INDEXES[name][1], idle=idle,
                                       idle_wait=idle_wait, stopping=stopping, sleep=sleep):
                    break
                built.append(name)
                if name == "steps_late_vend":
                    self.late_vend_after = None
        finally:
            aside.close()
            self.indexes_to_build = tuple(n for n in self.indexes_to_build if n not in built)
        return built

    def reserve_wal(self) -> bool:
        """Grow the WAL file to what it holds between two checkpoints, so that a commit
        overwrites the file in place instead of lengthening it. True when it was grown.

        A commit that lengthens the file fsyncs its new size too (the file system's own journal):
        0.26-0.32 ms a commit on this ext4 disk against 0.12-0.14 ms in place, and more on an SD
        card. SQLite deletes the WAL when its last connection closes, so every run grows it
        again. It is grown by a transaction that is rolled back: with a page cache of 16 pages,
        SQLite spills the filler's pages into the WAL as uncommitted frames, and the rollback
        only moves the WAL's end back to where it was. So the reserve is written once (4 MB),
        never fsynced, never copied into the database (committed chunks and a checkpoint wrote
        16.7 MB a start, fsynced each, and left 4 MB of free pages in the database), and a crash
        midway leaves nothing: frames of no commit are ignored when the WAL is read. One
        synchronous step (12 ms of CPU here; the chunked way's longest step took as long):
        the transaction holds the journal's one connection, so no sale may write in between.
        Best effort: a failing disk ends it quietly (health shows that disk).
        """
        wal = self.path.with_name(self.path.name + "-wal")
        try:
            if wal.exists() and wal.stat().st_size >= WAL_RESERVE_BYTES:
                return False
            disk = os.statvfs(self.path.parent)
            if disk.f_bavail * disk.f_frsize < WAL_ROOM_NEEDED:
                return False  # a tight disk keeps its room for sales
            # an older release grew it with committed chunks: a run that stopped midway left this
            self.db.execute(f"DROP TABLE IF EXISTS {_WAL_RESERVE}")
            # every frame back in the database, so the reserve starts the WAL at its beginning
            # (PASSIVE: never waits for a reader, a tech's `kiosk-agent sales`)
            self.db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            self._spill_into_the_wal()
            # the filler's rows were rolled back: no frame of them for a checkpoint to copy
            self._changes_at_checkpoint = self.db.total_changes
        except (sqlite3.Error, OSError) as err:
            _LOGGER.warning("journal: the WAL was not grown ahead (%s); commits lengthen it", err)
            return False
        return True

    def _spill_into_the_wal(self) -> None:
        page = int(self.db.execute("PRAGMA page_size").fetchone()[0])
        cache = int(self.db.execute("PRAGMA cache_size").fetchone()[0])
        # a full cache is what makes SQLite write the pages out; it also keeps the filler out of
        # the cache (left at its default, 1.6 MB held for nothing)
        self.db.execute(f"PRAGMA cache_size=-{_WAL_SPILL_CACHE_KIB}")
        cache_bytes = _WAL_SPILL_CACHE_KIB * 1024
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.execute(f"CREATE TABLE {_WAL_RESERVE} (filler BLOB)")
                self.db.executemany(
                    f"INSERT INTO {_WAL_RESERVE} VALUES (zeroblob(?))",  # noqa: S608
                    # the last pages stay in the cache, never written: as many more as it holds
                    itertools.repeat((page - 100,), (WAL_RESERVE_BYTES + cache_bytes) // page),
                )
            finally:
                self.db.execute("ROLLBACK")
        finally:
            with contextlib.suppress(sqlite3.Error, JournalError):
                self.db.execute(f"PRAGMA cache_size={cache}")

    def put_back(self) -> str | None:
        """Write the open journal back to its path when its file was removed under it (a person
        or a script cleaning up) or replaced by another file (a backup moved over it): every
        later step would go into a file nobody can open again, and the next start would find
        the journal lost (or old) and give back charges of vended sales. A file found in its
        place is kept beside it (``journal.db.replaced-<UTC time>``). What was done, for the
        log; None when its file is where it was, or a write is under way (the next look does
        it). Raises :class:`JournalError` when it cannot be done."""
        if self._reopen:  # written back, but the journal did not open there yet
            self.open()
            self._reopen = False
            return f"{self.path} was removed (written back before, opened there now)"
        if self._db is None or self._batching or self._db.in_transaction:
            return None
        try:
            found = _identity(self.path)
        except OSError:
            return None
        if found == self._identity:
            return None
        what = f"{self.path} was removed"
        fresh = self.path.with_name(self.path.name + ".restoring")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fresh.unlink(missing_ok=True)
            self._db.execute("VACUUM INTO ?", (str(fresh),))  # every committed step, whole
            if found is not None:
                moment = dt.datetime.fromtimestamp(self.clock.time(), dt.UTC)
                stamp = moment.strftime("%Y%m%dT%H%M%SZ")
                kept = self.path.with_name(f"{self.path.name}.replaced-{stamp}")
                self.path.rename(kept)
                what = f"{self.path} was replaced by another file (kept as {kept})"
            # in place before the old connection closes: until then it holds every step; on
            # disk, the rename too, before the old file's last connection lets it go
            durable.replace(fresh, self.path)
        except (sqlite3.Error, OSError) as err:
            fresh.unlink(missing_ok=True)
            raise JournalError(f"cannot put the journal back at {self.path}: {err}") from err
        self._reopen = True  # from here the file at the path is the journal, whole
        self.close()  # the removed file's WAL and shared memory go with its last connection
        for stale in side_files(self.path):  # unless a reader still holds them: never pair
            with contextlib.suppress(OSError):  # them with the new file
                stale.unlink(missing_ok=True)
        self.open()
        self._reopen = False
        return what

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._copy_dir is not None:
            shutil.rmtree(self._copy_dir, ignore_errors=True)
            self._copy_dir = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise JournalError("the journal is not open")
        if self._created is not None or self._updated is not None:
            self._write_held()  # a statement of the batch's: what it holds is in first
        return self._db

    def _write_held(self) -> None:
        """What this batch holds so far (a sale created in it, a sale's steps), written now, in
        the batch's transaction: before the journal's next statement (:attr:`db` calls it), or
        another sale's step. Nothing held: nothing written. A failing disk fails the batch; a
        sale found moved raises :class:`SaleMoved`."""
        db = self._db
        if db is None:
            raise JournalError("the journal is not open")
        try:
            self._write_created(db)
            self._write_updated(db)
        except sqlite3.Error as err:
            raise self._write_failed(err) from err

    def _write_created(self, db: sqlite3.Connection) -> None:
        """The sale created in this batch, with its steps so far, as the disk is to hold it."""
        created, self._created = self._created, None
        if created is None:
            return
        db.execute(_INSERT_SALE, created.row)
        self._batch_states[created.sale_id] = created.row["state"]
        _write_beside(db, created.sale_id, created.row)
        steps = created.steps
        db.execute(_insert_steps_sql(len(steps)), [value for row in steps for value in row])

    def _write_updated(self, db: sqlite3.Connection) -> None:
        """The steps of a sale on disk taken in this batch: the row's changes in one UPDATE,
        checked against the state the batch's first step found it in (the batch holds the
        write lock from its BEGIN: nobody else can move it meanwhile), its steps in one INSERT."""
        updated, self._updated = self._updated, None
        if updated is None:
            return
        values = updated.assignments
        values["sale_id"], values["was"] = updated.sale_id, updated.was
        if db.execute(_update_sql(tuple(values)), values).rowcount != 1:
            row = db.execute(
                "SELECT state FROM sales WHERE sale_id = ?", (updated.sale_id,)
            ).fetchone()
            raise SaleMoved(updated.sale_id, None if row is None else SaleState(row[0]))
        self._batch_states[updated.sale_id] = updated.state
        if updated.beside is not None:
            _write_beside(db, updated.sale_id, updated.beside)
        steps = updated.steps
        db.execute(_insert_steps_sql(len(steps)), [value for row in steps for value in row])

    # -- writes ----------------------------------------------------------------------------------

    def batch(self) -> _Batch:
        """The writes inside are one transaction: one commit (one fsync) for them all.

        For steps that follow each other with nothing in between that the journal must hold
        first (no call, no vend): the last of them is durable before what it announces, and a
        crash before the commit leaves the sale as it was before the first, which recovery
        handles as it always did. Synchronous code only inside (no await): another sale's write
        must not join the transaction. Any exception rolls every write of the batch back. A
        sale's steps inside are written at its end, one UPDATE and one INSERT a sale
        (:meth:`_update_in_batch`): a sale moved before the batch raises SaleMoved there.
        """
        return _Batch(self)

    def _told_written(self, *, fsynced: bool = True) -> None:
        """A write was taken: told at once, or by its batch's commit (which may still fail)."""
        if not self._batching:
            self._tell(None)
            self._committed(fsynced=fsynced)

    def _committed(self, *, fsynced: bool) -> None:
        """A commit of this connection: one fsynced makes every commit before it durable too
        (the WAL's fdatasync covers the whole file), so whoever waits in fsynced() is woken.
        Then, the bookkeeping done, ``on_checkpoint_due`` if a checkpoint is due: a callback
        that raises (a bug) is logged and counted (``checkpoint_due_errors``, in health), never
        the commit's failure (it committed), nor left to strand the waiters."""
        if self._held_elsewhere:
            self._wait_for_the_lock(held_elsewhere=False)
        if not fsynced:
            self._fsync_owed = True
        else:
            self._fsync_owed = False
            waiters, self._fsync_waiters = self._fsync_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        if self.on_checkpoint_due is not None and self._checkpoint_owed():
            try:
                self.on_checkpoint_due()
            except Exception:
                self.checkpoint_due_errors += 1
                _LOGGER.exception("journal: telling that a checkpoint is due failed")

    def _fail_waiters(self, failed: JournalError) -> None:
        """Whoever waits in fsynced() learns that what it wrote is not durable."""
        waiters, self._fsync_waiters = self._fsync_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(failed)

    @contextlib.contextmanager
    def fsync_shared(self) -> Iterator[None]:
        """The writes inside are committed without an fsync of their own (``synchronous=NORMAL``:
        a killed process keeps them); their caller announces them, and makes the call they lead
        to, only after :meth:`fsynced`. Synchronous code only inside."""
        self._fsync_shared = True
        try:
            yield
        finally:
            self._fsync_shared = False

    async def fsynced(self) -> None:
        """Return once every commit so far is durable: with the next fsynced commit of this
        connection if one comes within ``FSYNC_SHARED_TURNS`` turns of the event loop (another
        sale's, written beside this one), else by the WAL's own fdatasync then, on the loop as a
        commit's is. A failing fdatasync is a failed write (told, raised as JournalError), and so is
        any other write that fails meanwhile (but for the lock: ``_write_failed``)."""
        if not self._fsync_owed:
            return
        import asyncio  # here: only a running agent waits; the commands import no loop

        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._fsync_waiters.append(waiter)
        if len(self._fsync_waiters) == 1:  # the first since the last fsync: the turns count
            loop.call_soon(self._fsync_after, FSYNC_SHARED_TURNS, self._fsync_waiters)
        await waiter

    def _fsync_after(self, turns: int, waiters: list[asyncio.Future[None]]) -> None:
        if self._fsync_waiters is not waiters:
            return  # a commit made them durable meanwhile, and woke them
        if turns > 0:
            import asyncio  # as in fsynced()

            asyncio.get_running_loop().call_soon(self._fsync_after, turns - 1, waiters)
            return
        if self._db is None:  # closed meanwhile (a stop): not a disk's fault, not told
            self._fail_waiters(JournalError(f"the journal at {self.path} closed before an fsync"))
            return
        try:
            _fdatasync(side_files(self.path)[0])
        except OSError as err:
            failed = JournalError(f"cannot write the journal at {self.path}: {err}")
            self._tell(failed)
            self._fail_waiters(failed)
            return
        self._committed(fsynced=True)

    def _transaction(self, *, fsynced: bool = True) -> _WriteTransaction:
        """One write's transaction, or the batch's it joins (which commits or rolls back).
        ``fsynced=False``: committed without an fsync of its own (``UNSYNCED_STEPS``,
        :meth:`fsync_shared`)."""
        if self._batching:
            return _WriteTransaction(self.db, joins=True, way_taken=None)
        return _WriteTransaction(
            self.db, joins=False, way_taken=self.prune_gives_way(), fsynced=fsynced
        )

    def create(self, sale: SaleRecord, detail: Mapping[str, Any] | None = None) -> SaleRecord:
        """Write a new sale and its first step in one transaction (always STARTED)."""
        check_transition(sale.sale_id, sale.flow, None, sale.state, Step.CREATED)
        if self._batching:
            return self._create_in_batch(sale, detail)
        return self._write_whole(sale, Step.CREATED, detail)

    def _create_in_batch(
        self, sale: SaleRecord, detail: Mapping[str, Any] | None
    ) -> SaleRecord:
        """A sale created inside a batch is held until the batch's end (or the journal's next
        statement: :attr:`db`), so that its later steps in the batch (a flow's opening step)
        change the row held instead of updating it on disk: the sale is written once, in its
        last state, with its steps in one statement. Nobody else can write it meanwhile: it is
        on disk from the commit on, as when it was inserted first."""
        if self._created is not None or self._updated is not None:  # what it holds: first
            self._write_held()
        now = self.clock.time()
        sale = replaced(sale, updated_at=now, created_at=now)
        self._created = _Created(
            sale.sale_id, sale.row(), [_step_row(sale.sale_id, now, Step.CREATED, sale.state,
                                                 detail)]
        )
        return sale

    def record(
        self,
        sale: SaleRecord,
        step: Step,
        state: SaleState | None = None,
        detail: Mapping[str, Any] | None = None,
        *,
        if_state: SaleState | None = None,
        **changes: Any,
    ) -> SaleRecord:
        """Write one step (and the sale's new fields) durably; return the updated sale.

        The one way a sale changes. The move is checked against the table
        (``states.check_transition``: :class:`TransitionRefused`, nothing written); the sale
        must still be in ``if_state`` on disk (default: the state ``sale`` says it is in),
        checked by the write itself in the same transaction, else :class:`SaleMoved`: two
        writers (another process on the same journal, a person) cannot both decide it."""
        unknown = set(changes) - _UPDATABLE
        if unknown:
            raise ValueError(f"not journal fields: {', '.join(sorted(unknown))}")
        now = self.clock.time()
        new_state = state or sale.state
        changed = frozenset(changes)  # what the caller sets: a note on a settled sale sets none
        if new_state.final and new_state is not sale.state and sale.finished_at is None:
            changes.setdefault("finished_at", now)
        updated = replaced(sale, state=new_state, updated_at=now, **changes)
        assignments = {k: v for k, v in changes.items() if k not in _BESIDE_COLUMNS}
        beside = len(assignments) != len(changes)
        expected = sale.state if if_state is None else if_state
        if new_state is not expected:
            # Set only when it moves: an UPDATE that names an indexed column rewrites the row's
            # entry in that index even to the same value, a WAL page of sales_state_created in
            # every commit of a step that keeps the state. The UPDATE's own check (state = was)
            # already says the row holds it. Its text as _value_: .value is two Python calls.
            assignments["state"] = new_state._value_
        assignments["updated_at"] = now
        created = self._created
        if (created is not None and created.sale_id == sale.sale_id
                and created.row["state"] == expected._value_ and step not in REOPENED_AFTER):
            # created in this batch: checked against the table in memory (nothing on disk to
            # read), the row held takes the changes, the step joins its steps
            named = check_transition(sale.sale_id, sale.flow, expected, new_state, step, None,
                                     changed)
            row = created.row
            row.update(changes)
            row["state"], row["updated_at"] = new_state._value_, now
            created.steps.append(_step_row(sale.sale_id, now, named, new_state, detail))
            return updated
        if self._batching and step not in REOPENED_AFTER:
            return self._update_in_batch(sale, updated, step, detail, expected, changed,
                                         assignments, beside)
        return self._write_step(sale, updated, step, detail, expected, changed, assignments,
                                beside)

    def _write_step(
        self,
        sale: SaleRecord,
        updated: SaleRecord,
        step: Step,
        detail: Mapping[str, Any] | None,
        expected: SaleState,
        changed: frozenset[str],
        assignments: dict[str, Any],
        beside: bool,
    ) -> SaleRecord:
        """:meth:`record`'s write of one step at once, in a transaction of its own (or the
        batch's it joins: a step reopening a sale, ``REOPENED_AFTER``): checked against the
        table, its UPDATE checked by ``AND state =`` (another writer moved it: SaleMoved, or
        the refusal the disk's state gives), the row beside, the step's INSERT. The same
        arguments as :meth:`_update_in_batch`, which holds the step for the batch's end
        instead (tests/sales/test_journal_batches.py compares the two)."""
        new_state, now = updated.state, updated.updated_at
        try:
            fsynced = not self._fsync_shared and step not in UNSYNCED_STEPS
            with self._transaction(fsynced=fsynced) as db:
                named = self._check_in_memory(db, sale, expected, new_state, step, changed)
                assignments["sale_id"], assignments["was"] = sale.sale_id, expected._value_
                moved = db.execute(_update_sql(tuple(assignments)), assignments)
                if moved.rowcount != 1:  # another writer moved it: the disk says where to
                    self._check(db, sale, expected, new_state, step, changed)
                    raise SaleMoved(sale.sale_id, None)  # pragma: no cover - _check raised
                if beside:
                    _write_beside(db, sale.sale_id, updated.row())
                self._insert_step(db, sale.sale_id, now, named, new_state, detail)
        except sqlite3.Error as err:
            raise self._write_failed(err) from err
        if self._batching:
            self._batch_states[sale.sale_id] = new_state._value_
        self._told_written(fsynced=fsynced)
        return updated

    def _update_in_batch(
        self,
        sale: SaleRecord,
        updated: SaleRecord,
        step: Step,
        detail: Mapping[str, Any] | None,
        expected: SaleState,
        changed: frozenset[str],
        assignments: dict[str, Any],
        beside: bool,
    ) -> SaleRecord:
        """A step of a sale on disk inside a batch: checked against the table in memory, held
        until the batch's end (:meth:`_write_updated`), so that a batch's steps of one sale are
        one UPDATE and one INSERT, not one each a step. The batch holds the write lock: the
        sale's state on disk is the one its first step found, checked by that UPDATE at the
        batch's end (a sale moved before the batch: :class:`SaleMoved` then, the batch rolled
        back whole); a later step from another state than the one held raises it at once. A
        step of another sale writes the steps held first (the steps' order is the writes')."""
        held, created = self._updated, self._created
        state = self._batch_states.get(sale.sale_id)
        if held is not None and held.sale_id == sale.sale_id:
            state = held.state
        elif created is not None and created.sale_id == sale.sale_id:
            state = created.row["state"]
        if state is not None and state != expected._value_:
            raise SaleMoved(sale.sale_id, SaleState(state))  # as this batch wrote it: moved
        if held is not None and held.sale_id != sale.sale_id:
            self._write_held()
            held = None
        new_state = updated.state
        try:
            named = check_transition(sale.sale_id, sale.flow, expected, new_state, step, None,
                                     changed)
        except TransitionRefused:
            self._check(self.db, sale, expected, new_state, step, changed)  # moved: says so
            raise
        if held is None:
            if self._created is not None:  # the sale created in the batch goes in first
                self._write_held()
            held = self._updated = _Updated(sale.sale_id, expected._value_)
        held.assignments.update(assignments)
        held.state = new_state._value_
        if beside:  # as one statement a step: only a step that sets them writes them
            held.beside = updated.row()
        held.steps.append(_step_row(sale.sale_id, updated.updated_at, named, new_state, detail))
        return updated

    def _check_in_memory(
        self,
        db: sqlite3.Connection,
        sale: SaleRecord,
        expected: SaleState,
        wanted: SaleState,
        step: Step,
        changed: frozenset[str],
    ) -> Step:
        """The move against the table from the state the writer expects, read from nothing:
        the UPDATE then writes only if the sale is still in it on disk (compare and write in
        one statement, inside the write transaction). A reopening step, which depends on how
        the sale ended, and a refused move read the disk (a moved sale says so first)."""
        if step in REOPENED_AFTER:
            return self._check(db, sale, expected, wanted, step, changed)
        try:
            return check_transition(sale.sale_id, sale.flow, expected, wanted, step, None, changed)
        except TransitionRefused:
            self._check(db, sale, expected, wanted, step, changed)
            raise

    def _check(
        self,
        db: sqlite3.Connection,
        sale: SaleRecord,
        expected: SaleState,
        wanted: SaleState,
        step: Step,
        changed: frozenset[str],
    ) -> Step:
        """The sale as it is on disk, inside the write transaction, against the table."""
        row = db.execute(
            "SELECT state, flow FROM sales WHERE sale_id = ?", (sale.sale_id,)
        ).fetchone()
        if row is None:
            raise SaleMoved(sale.sale_id, None)
        current = SaleState(row[0])
        if current is not expected:
            raise SaleMoved(sale.sale_id, current)
        last = None
        if step in REOPENED_AFTER:  # only a reopening step depends on how the sale ended
            found = db.execute(
                "SELECT step FROM steps WHERE sale_id = ? ORDER BY id DESC LIMIT 1",
                (sale.sale_id,),
            ).fetchone()
            last = None if found is None else str(found[0])
        return check_transition(sale.sale_id, row[1], current, wanted, step, last, changed)

    def _insert_step(
        self,
        db: sqlite3.Connection,
        sale_id: str,
        at: float,
        step: Step,
        state: SaleState,
        detail: Mapping[str, Any] | None,
    ) -> None:
        db.execute(_INSERT_STEP, _step_row(sale_id, at, step, state, detail))

    def _write_failed(self, err: sqlite3.Error) -> JournalError:
        # a full or failing disk: the flow must stop before the call this step announces
        failed = self.refusal(err)
        if (getattr(err, "sqlite_errorcode", None) or 0) & 0xFF not in _LOCK_REFUSED:
            # Pages written before it may be lost with it, a waiter's among them (the WAL is one
            # file), and Linux reports a failed writeback once: a later fdatasync could succeed
            # over pages never written. What waits for an fsync is not durable.
            self._fail_waiters(failed)
        self._tell(failed)
        return failed

    def refusal(self, err: sqlite3.Error) -> JournalError:
        """What a write on the run connection that failed with ``err`` tells: the journal, the
        error and, for a lock held past the busy wait by another process, who holds it (the
        busy wait then short until a write goes through: :meth:`wrote`)."""
        code = (getattr(err, "sqlite_errorcode", None) or 0) & 0xFF
        return JournalError(f"cannot write the journal at {self.path}: {err}"
                            + (self._lock_held_by() if code == sqlite3.SQLITE_BUSY else ""))

    def wrote(self) -> None:
        """A write on the run connection went through outside the journal's own (the event
        log's, the health probe's): the busy wait is the usual again."""
        if self._held_elsewhere:
            self._wait_for_the_lock(held_elsewhere=False)

    def _lock_held_by(self) -> str:
        """Who kept the write lock past the busy wait, where another process did (a tech's
        ``sqlite3`` shell in a transaction, a copy of the agent): SQLite's WAL write lock is a
        POSIX lock on byte 120 of the ``-shm`` file (``WALINDEX_LOCK_OFFSET``), read from the
        kernel's table; the agent's own threads are not named (they give way)."""
        from kiosk_agent.lock_holders import describe, holders

        found = holders(self.path.with_name(self.path.name + "-shm"), kind="POSIX",
                        byte=_WAL_WRITE_LOCK_BYTE)
        if not found:
            return ""
        if not self._held_elsewhere:
            self._wait_for_the_lock(held_elsewhere=True)
        return (f" (its write lock is held by another process: {describe(found)}; end that "
                "process's transaction, or the process)")

    def _wait_for_the_lock(self, *, held_elsewhere: bool) -> None:
        """The run connection's busy wait: short while another process keeps the write lock
        (the probe, the unwritten sales' retries and any step each find it held in 0.1 s, not
        5 s of the event loop), the usual 5 s again after the first commit that goes through."""
        if self._db is None:
            return
        with contextlib.suppress(sqlite3.Error):
            self._db.execute(
                f"PRAGMA busy_timeout={_BUSY_ELSEWHERE_MS if held_elsewhere else 5000}")
            self._held_elsewhere = held_elsewhere

    def _tell(self, err: JournalError | None) -> None:
        if self.on_write is not None:
            self.on_write(err)

    def restore(
        self,
        sale_id: str,
        held: Sequence[HeldStep],
        step: Step,
        detail: Mapping[str, Any] | None = None,
    ) -> SaleRecord:
        """Write ``step`` (a note where the disk left the sale), then the steps memory took while
        the journal could not (``held``, in order): one transaction. Each is replayed from the
        sale as the disk holds it through the transition table, as any write (:meth:`record`):
        a move the table refuses raises :class:`TransitionRefused`, one another writer decided
        first :class:`SaleMoved`, and nothing is written. The held steps come last: the sale
        ends on its own last step, as if its writes had never failed (the late-charge net
        reads it). A sale the journal does not hold at all cannot be restored."""
        with self.batch():
            try:
                current = self.get(sale_id)
            except sqlite3.Error as err:  # a disk that fails reads too: not writable, as any
                raise self._write_failed(err) from err
            if current is None:
                raise SaleMoved(sale_id, None)
            current = self.record(current, step, None, detail)
            for taken in held:
                current = self.record(current, taken.step, taken.state, taken.detail,
                                      **dict(taken.changes))
            return current

    def _write_whole(
        self,
        sale: SaleRecord,
        step: Step,
        detail: Mapping[str, Any] | None,
    ) -> SaleRecord:
        """The sale's whole row, created now, and one step."""
        now = self.clock.time()
        sale = replaced(sale, updated_at=now, created_at=now)
        row = sale.row()
        try:
            with self._transaction() as db:
                db.execute(_INSERT_SALE, row)
                _write_beside(db, sale.sale_id, row)
                self._insert_step(db, sale.sale_id, now, step, sale.state, detail)
        except sqlite3.Error as err:
            raise self._write_failed(err) from err
        self._told_written()
        return sale


class _Batch:
    """:meth:`Journal.batch`'s transaction while its ``with`` runs: a class, not a generator
    context manager (entered and left in two Python calls where that took six, with two
    generator resumptions; four batches a kiosk API sale)."""

    __slots__ = ("_changes", "_db", "_journal")

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    def __enter__(self) -> None:
        journal = self._journal
        if journal._batching:
            raise RuntimeError("journal batches do not nest")
        db = self._db = journal.db
        way_taken = journal.prune_gives_way()
        self._changes = db.total_changes
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as err:
            raise journal._write_failed(err) from err
        except BaseException:  # an interrupt right after it: no transaction left open
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise
        journal._batching = True
        journal._batch_states.clear()
        if way_taken is not None:
            way_taken.set()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        journal, db = self._journal, self._db
        journal._batching = False
        if exc_type is not None:  # anything raised inside: every write of the batch rolled back
            journal._created = journal._updated = None
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            return
        try:
            if journal._created is not None or journal._updated is not None:
                journal._write_created(db)
                journal._write_updated(db)
            db.execute("COMMIT")
        except sqlite3.Error as err:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise journal._write_failed(err) from err
        except BaseException:  # an interrupt in the sale created in the batch: none left open
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise
        journal._tell(None)  # taken: only now (a write inside a batch is not durable before this)
        if db.total_changes != self._changes:  # with no row written, SQLite fsyncs nothing
            journal._committed(fsynced=True)


class _Created:
    """A sale created inside a batch, not written yet: its row (the sale's columns and those
    kept beside it) and its steps' rows (``_step_row``), in order."""

    __slots__ = ("row", "sale_id", "steps")

    def __init__(self, sale_id: str, row: dict[str, Any], steps: list[tuple[Any, ...]]) -> None:
        self.sale_id = sale_id
        self.row = row
        self.steps = steps


class _Updated:
    """A sale on disk's steps taken inside a batch, not written yet: the state it was in
    (``was``, its UPDATE's check), the row's changes, the row kept beside it (when a step set
    any of those), its state after them, and its steps' rows (``_step_row``), in order."""

    __slots__ = ("assignments", "beside", "sale_id", "state", "steps", "was")

    def __init__(self, sale_id: str, was: str) -> None:
        self.sale_id = sale_id
        self.was = self.state = was
        self.assignments: dict[str, Any] = {}
        self.beside: dict[str, Any] | None = None
        self.steps: list[tuple[Any, ...]] = []


class _WriteTransaction:
    """``transaction(db)`` for one write of a sale, or nothing when it joins a batch. A class,
    not a generator: two generator context managers a write were a tenth of its Python.

    Not ``fsynced``: the connection is ``synchronous=NORMAL`` for this transaction alone (SQLite
    refuses to change it inside one), and FULL again after it whatever happened, so that no
    other write on the connection (a money step, the events, the probe) commits without one."""

    __slots__ = ("db", "fsynced", "joins", "way_taken")

    def __init__(
        self,
        db: sqlite3.Connection,
        *,
        joins: bool,
        way_taken: threading.Event | None,
        fsynced: bool = True,
    ) -> None:
        self.db = db
        self.joins = joins
        self.way_taken = way_taken  # a batch of the prune gave way: told once the lock is held
        self.fsynced = fsynced

    def __enter__(self) -> sqlite3.Connection:
        if not self.joins:
            try:  # an interrupt right after the PRAGMA too: FULL again
                if not self.fsynced:
                    self.db.execute("PRAGMA synchronous=NORMAL")
                self.db.execute("BEGIN IMMEDIATE")
            except BaseException:
                self._ended()
                raise
            if self.way_taken is not None:
                self.way_taken.set()
        return self.db

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if self.joins:
            return  # the batch commits or rolls back
        try:
            self.db.execute("COMMIT" if kind is None else "ROLLBACK")
        finally:
            self._ended()

    def _ended(self) -> None:
        """A COMMIT that failed may leave its transaction open (SQLite rolls back on most of
        its errors, not all): undone, so that the next write can begin and FULL can be set
        again after an unsynced one."""
        try:
            if self.db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK")
        finally:  # an interrupt during the ROLLBACK too
            if not self.fsynced:
                self.db.execute("PRAGMA synchronous=FULL")


def _fdatasync(path: Path) -> None:
    """What a FULL commit ends with, for every commit made before it: the WAL's fdatasync (a
    file's data is the file's, whichever descriptor asks)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _refuse_newer(db: sqlite3.Connection, path: Path) -> None:
    """A journal of a newer schema is refused before anything is written to it."""
    found = int(db.execute("PRAGMA user_version").fetchone()[0])
    if found > SCHEMA_VERSION:
        raise JournalTooNew(
            f"the journal at {path} has schema version {found}, written by a newer release; "
            f"this release reads up to version {SCHEMA_VERSION}. Nothing was written to it. "
            "Run the newer release again (its sales are kept there), or move the journal aside "
            "to start this release on a new one"
        )


def _migrate(db: sqlite3.Connection) -> None:
    """Bring the journal to this schema in one transaction; the version is written inside it,
    so it never says more than the tables hold (a failed migration leaves the old version).
    A journal already at this schema is only read: the transaction takes the write lock, and
    a command that opens the journal to write beside the running agent (``sales resolve``,
    ``sales late-vends --ack``, ``unit adopt``) took it for nothing, ahead of a customer's
    commit."""
    if _up_to_date(db):
        return
    with transaction(db):
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        _add_missing_columns(db)
        _move_beside(db)
        _steps_without_autoincrement(db)
        for index in _RETIRED_INDEXES:
            db.execute(f"DROP INDEX IF EXISTS {index}")
        if int(db.execute("PRAGMA user_version").fetchone()[0]) < SCHEMA_VERSION:
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


_SCHEMA_NAMES = frozenset(re.findall(r"CREATE (?:TABLE|INDEX) IF NOT EXISTS (\w+)", _SCHEMA))


def _up_to_date(db: sqlite3.Connection) -> bool:
    """Whether :func:`_migrate` would change nothing: this version, every table and index of
    the schema, no retired index, every added column and none of those kept beside (read in
    a read transaction: no write lock). A journal whose steps the migration could not make
    plain yet (a defensive SQLite, an id a prune left in ``sqlite_sequence``) is tried again at
    each open, as every journal was before."""
    if int(db.execute("PRAGMA user_version").fetchone()[0]) != SCHEMA_VERSION:
        return False
    # name -> its statement (tables and indexes share one namespace: "steps" is the table)
    schema = {row[0]: row[1] for row in db.execute("SELECT name, sql FROM sqlite_master")}
    if not schema.keys() >= _SCHEMA_NAMES or schema.keys() & set(_RETIRED_INDEXES):
        return False
    columns = {row[1] for row in db.execute("PRAGMA table_info(sales)")}
    if not set(_ADDED_COLUMNS) <= columns or columns & _BESIDE_COLUMNS:
        return False
    # steps made AUTOINCREMENT lose the keyword in the migration (_steps_without_autoincrement)
    return not _AUTOINCREMENT.search(str(schema["steps"]))


def _late_indexes(db: sqlite3.Connection) -> tuple[str, ...]:
    """Make each of ``_LATE_INDEXES`` missing now where its table has no row (nothing to scan);
    the names of those still missing (built after ready: Journal.build_indexes)."""
    present = {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type = "
                                             "'index'")}
    left = []
    for name, (table, statement) in _LATE_INDEXES.items():
        if name in present:
            continue
        if db.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() is None:  # noqa: S608
            db.execute(statement)
        else:
            left.append(name)
    return tuple(left)


def _add_missing_columns(db: sqlite3.Connection) -> None:
    """Bring a journal written by an older version up to this schema (columns only ever grow)."""
    present = {row["name"] for row in db.execute("PRAGMA table_info(sales)")}
    for name, kind in _ADDED_COLUMNS.items():
        if name not in present:
            db.execute(f"ALTER TABLE sales ADD COLUMN {name} {kind}")


def _steps_without_autoincrement(db: sqlite3.Connection) -> None:
    """A journal whose ``steps`` table was made ``AUTOINCREMENT`` keeps it, without the keyword:
    its text in the schema edited in place (SQLite's own way for a change that leaves every page
    as it is: the table's rows, ids and indexes are the same either way), the schema's version
    moved on so that every connection reads it again, its ``sqlite_sequence`` row dropped (only
    once no id above the highest step was given: else at a later open). Inside the migration's
    transaction: instant on a year's journal (no table rebuilt). A SQLite that refuses the edit
    (built or configured defensive) leaves the table as it was: the journal works the same, a
    page more a commit."""
    row = db.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'steps'"
    ).fetchone()
    if row is None or not _AUTOINCREMENT.search(str(row[0])):
        return
    # Ids above the newest step were given and pruned (the previous release's prune took the
    # sale that held its newest steps: a unit that sold nothing for its retention): only
    # sqlite_sequence remembers them, and without it the next step would take one again. The
    # keyword stays until a step is written above them (its id is then the highest): the next
    # open drops it.
    given = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'steps'").fetchone()
    newest = int(db.execute("SELECT COALESCE(MAX(id), 0) FROM steps").fetchone()[0])
    if given is not None and int(given[0]) > newest:
        _LOGGER.info("journal: the steps table keeps AUTOINCREMENT until a step is written above "
                     "the ids pruned (up to %d, the highest now %d)", int(given[0]), newest)
        return
    version = int(db.execute("PRAGMA schema_version").fetchone()[0])
    db.execute("PRAGMA writable_schema=ON")
    try:
        db.execute(
            "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'steps'",
            (_AUTOINCREMENT.sub("", str(row[0])),),
        )
    except sqlite3.DatabaseError as err:
        if not db.in_transaction:  # an interrupt, a full disk, an I/O error: SQLite rolled the
            raise  # migration back, and its rest would run outside it, each statement alone
        # the statement alone failed (a SQLite that refuses the edit): nothing changed
        _LOGGER.info("journal: the steps table keeps AUTOINCREMENT (%s)", err)
        return
    else:
        db.execute(f"PRAGMA schema_version={version + 1}")
    finally:
        db.execute("PRAGMA writable_schema=OFF")
    db.execute("DELETE FROM sqlite_sequence WHERE name = 'steps'")


def _move_beside(db: sqlite3.Connection) -> None:
    """A journal whose ``sales`` table holds columns now kept beside it (a development build
    added them there): their values move to their table and the columns go."""
    present = {row["name"] for row in db.execute("PRAGMA table_info(sales)")}
    for table, columns in _BESIDE.items():
        there = [c for c in columns if c in present]
        if not there:
            continue
        names = ", ".join(there)
        db.execute(
            f"INSERT OR IGNORE INTO {table} (sale_id, {names}) SELECT sale_id, {names} "  # noqa: S608
            f"FROM sales WHERE " + " OR ".join(f"{c} IS NOT NULL" for c in there)
        )
        for column in there:
            db.execute(f"ALTER TABLE sales DROP COLUMN {column}")


# A step's detail as stored: keys sorted, what JSON cannot say as its text. One encoder for
# every step (json.dumps with options makes one a call: half a step's encoding).
_DETAIL_JSON = json.JSONEncoder(sort_keys=True, default=str).encode
_INSERT_SALE = (
    f"INSERT INTO sales ({', '.join(_SALES_COLUMNS)}) "  # noqa: S608 - names from this module
    f"VALUES ({', '.join(f':{c}' for c in _SALES_COLUMNS)})"
)


_INSERT_STEP = "INSERT INTO steps (sale_id, at, step, state, detail) VALUES (?, ?, ?, ?, ?)"


def _step_row(
    sale_id: str, at: float, step: Step, state: SaleState, detail: Mapping[str, Any] | None
) -> tuple[Any, ...]:
    """A step's row as ``_INSERT_STEP`` takes it: its detail as stored, never a forbidden key."""
    text = "{}"  # most steps: no detail to encode
    if detail:
        text = _DETAIL_JSON({k: v for k, v in detail.items() if k not in _FORBIDDEN_DETAIL})
    return (sale_id, at, step._value_, state._value_, text)  # texts: no enum call, no adapter


@functools.lru_cache(maxsize=8)
def _insert_steps_sql(rows: int) -> str:
    """``rows`` steps in one INSERT (a sale created in a batch and its later steps there)."""
    return _INSERT_STEP + ", (?, ?, ?, ?, ?)" * (rows - 1)


@functools.lru_cache(maxsize=64)
def _update_sql(names: tuple[str, ...]) -> str:
    """A step's UPDATE of the sale, setting ``names`` but the last two (``sale_id`` and
    ``was``, its state on disk): one text per set of fields, so SQLite's prepared statement is
    reused (the connection keeps them by their text)."""
    sets = ", ".join(f"{k} = :{k}" for k in names[:-2])
    return f"UPDATE sales SET {sets} WHERE sale_id = :sale_id AND state = :was"  # noqa: S608


def _write_beside(db: sqlite3.Connection, sale_id: str, row: Mapping[str, Any]) -> None:
    """The sale's facts kept beside ``sales`` (``_BESIDE``), when it has any."""
    for columns, upsert in _BESIDE_UPSERTS:
        if columns is LATER_COLUMNS:  # the record's one field for them
            values = dict(zip(columns, row.get("later") or (None,) * len(columns), strict=True))
        else:
            values = {c: row.get(c) for c in columns}
        if all(value is None for value in values.values()):
            continue
        values["sale_id"] = sale_id
        db.execute(upsert, values)


def _beside_upsert(table: str, columns: tuple[str, ...]) -> str:
    names = ", ".join(columns)
    marks = ", ".join(f":{c}" for c in columns)
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns)
    return (
        f"INSERT INTO {table} (sale_id, {names}) VALUES (:sale_id, {marks}) "  # noqa: S608
        f"ON CONFLICT(sale_id) DO UPDATE SET {updates}"
    )


# each table beside ``sales``: its columns and the one statement that writes them (made once)
_BESIDE_UPSERTS = tuple(
    (columns, _beside_upsert(table, columns)) for table, columns in _BESIDE.items()
)


def _quoted(table: str) -> str:
    """A table's name (from the file's own schema) as a pragma's argument."""
    return "(\"" + table.replace('"', '""') + "\")"


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at ``path`` (device, inode); None when there is none. Raises ``OSError`` when
    it cannot be told (a failing disk): nothing must be put back on that."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


def marker_path(journal: Path) -> Path:
    return journal.with_name(journal.name + MARKER_SUFFIX)


def side_files(journal: Path) -> list[Path]:
    """The journal's WAL and shared-memory files (present or not)."""
    return [journal.with_name(journal.name + s) for s in _SIDE]


def integrity(path: Path, *, quick: bool = False, but: Sequence[str] = ()) -> list[str]:
    """What SQLite finds wrong with the journal at ``path`` (empty: nothing), read-only.

    ``PRAGMA integrity_check`` (``quick_check`` with ``quick``: the same without the index
    cross-checks). With ``but``, each table but those (and its indexes) alone: the agent reads
    every table but ``steps`` before it opens the journal (what its start reads), and the whole
    file in a worker thread after (a year of sales: a second of a core; core/journal_guard.py).
    The WAL beside it is read too: a WAL that does not fit its database shows up here."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as err:
        return [f"cannot open: {err}"]
    try:
        db.execute(f"PRAGMA cache_size=-{ASIDE_CACHE_KIB}")
        pragma = "quick_check" if quick else "integrity_check"
        tables = {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type = "
                                                "'table'")}
        scopes = [""] if not but else [_quoted(name) for name in sorted(tables - set(but))]
        rows = [str(r[0]) for scope in scopes for r in db.execute(f"PRAGMA {pragma}{scope}")]
    except sqlite3.Error as err:
        return [str(err)]
    finally:
        db.close()
    problems = [row for row in rows if row != "ok"][:10]
    if not problems and not {"sales", "steps"} <= tables:
        problems.append("no sales table: the journal is empty")
    return problems


