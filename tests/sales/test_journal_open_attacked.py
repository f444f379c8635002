"""Journal.open attacked since it checks and migrates on a setup connection and runs on one of
its own (106272f, issue 33's idle memory): a crash between the two connections' lives, another
process holding the journal, descriptors running out at the run's connection. Real SQLite files
on disk and real processes."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kiosk_agent.sales.journal import SCHEMA_VERSION, Journal
from kiosk_agent.sales.states import SaleState
from tests.helpers import walk_to
from tests.sales.test_journal import new_sale

ROOT = Path(__file__).parents[2]
SALES = 12


def _python(program: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", program, *args], capture_output=True, text=True, timeout=60,
        cwd=ROOT, check=False,
    )  # fmt: skip


def _an_older_journal_a_crash_left(tmp_path: Path) -> Path:
    """A journal of SALES completed sales at an older schema (no sale_sends, version 1), with
    committed frames a killed writer left in its WAL (every product renamed), copied as the
    kill left the files: the journal, its WAL and its -shm."""
    made = tmp_path / "made.db"
    journal = Journal(made)
    journal.open()
    for n in range(1, SALES + 1):
        walk_to(journal, journal.create(new_sale(n)), SaleState.COMPLETED)
    journal.close()
    older = sqlite3.connect(made, isolation_level=None)
    older.execute("DROP TABLE sale_sends")
    older.execute("PRAGMA user_version=1")
    older.close()
    writer = sqlite3.connect(made, isolation_level=None)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("UPDATE sales SET product = 'crashed-' || sale_id")
    crashed = tmp_path / "crashed.db"
    for side in ("", "-wal", "-shm"):
        shutil.copy(tmp_path / f"made.db{side}", tmp_path / f"crashed.db{side}")
    writer.close()
    assert (tmp_path / "crashed.db-wal").stat().st_size > 0
    return crashed


# Journal.open in a process killed (os._exit: no close, no atexit) at one point between the
# setup connection's life and the run's: "before_run" as the run's connection is made (the
# setup has migrated and is open), "before_setup_closed" as the setup closes (the run's
# connection has read the file)
KILLED_IN_OPEN = """\
import os, sqlite3, sys
from pathlib import Path
from kiosk_agent.sales.journal import Journal

where = sys.argv[2]
made = []

class Killed(sqlite3.Connection):
    def close(self):
        if where == "before_setup_closed" and self is made[0]:
            os._exit(9)
        super().close()

connect = sqlite3.connect

def connecting(*args, **kwargs):
    if where == "before_run" and made:
        os._exit(9)
    made.append(connect(*args, factory=Killed, **kwargs))
    return made[-1]

sqlite3.connect = connecting
Journal(Path(sys.argv[1])).open()
print("opened: not killed")
"""


@pytest.mark.parametrize("where", ["before_run", "before_setup_closed"])
def test_a_crash_between_the_setups_connection_and_the_runs_loses_nothing(
    tmp_path: Path, where: str
) -> None:
    """Killed as the run's connection is made, or as the setup's closes: the next start finds
    every sale, the frames the earlier crash left in the WAL, and the migration whole (its one
    transaction committed on the setup connection, at synchronous=FULL)."""
    crashed = _an_older_journal_a_crash_left(tmp_path)
    done = _python(KILLED_IN_OPEN, str(crashed), where)
    assert done.returncode == 9, (done.stdout, done.stderr)
    assert Path(f"{crashed}-wal").exists()  # nothing checkpointed nor removed it
    journal = Journal(crashed)
    journal.open()
    try:
        db = journal.db
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("SELECT count(*) FROM sale_sends").fetchone()[0] == 0
        products = {r[0] for r in db.execute("SELECT product FROM sales")}
        assert products == {f"crashed-s{n}" for n in range(1, SALES + 1)}
        assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL, the run's own
    finally:
        journal.close()


# Another process holds the journal (a second agent's start, a tech's sqlite3 shell) for
# a while, then lets go
HOLDER = """\
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
if sys.argv[2] == "write":
    db.execute("BEGIN IMMEDIATE")
    db.execute("UPDATE sales SET product = 'held' WHERE sale_id = 's1'")
else:
    db.execute("BEGIN")
    db.execute("SELECT count(*) FROM sales").fetchone()
print("holding", flush=True)
time.sleep(float(sys.argv[3]))
db.execute("ROLLBACK")
"""


@pytest.mark.parametrize("how", ["read", "write"])
def test_a_journal_another_process_holds_opens_with_the_runs_settings(
    tmp_path: Path, how: str
) -> None:
    """A reader elsewhere: open goes on. A writer elsewhere (a tech's shell in a write
    transaction, 0.6 s): open waits for it within busy_timeout (5 s), then opens; either way
    the run's own connection holds every setting, and what the other process held is not
    taken (it rolled back)."""
    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.open()
    for n in range(1, 4):
        walk_to(journal, journal.create(new_sale(n)), SaleState.COMPLETED)
    journal.close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), how, "0.6"], stdout=subprocess.PIPE,
        text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "holding\n"
        journal = Journal(path)
        journal.open()
    finally:
        assert holder.wait(30) == 0
    try:
        settings = {name: journal.db.execute(f"PRAGMA {name}").fetchone()[0]
                    for name in ("synchronous", "foreign_keys", "busy_timeout", "journal_mode")}
        assert settings == {"synchronous": 2, "foreign_keys": 1, "busy_timeout": 5000,
                            "journal_mode": "wal"}
        assert [r.product for r in journal.query()].count("held") == 0
        assert len(journal.query()) == 3
    finally:
        journal.close()


# Journal.open with just enough free descriptors for the setup's connection (the journal,
# its WAL, its -shm), none for the run's
OUT_OF_DESCRIPTORS = """\
import json, os, resource, sys
from pathlib import Path
from kiosk_agent.sales.journal import Journal
from kiosk_agent.sales.model import JournalError

def fds():
    return {int(f) for f in os.listdir("/proc/self/fd")}

free = int(sys.argv[2])
held = fds()  # with listdir's own, free again: one more than counted
limit = next(n for n in range(1, 65536) if len(set(range(n)) - held) == free)
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
reached = []
for_the_run = Journal._for_the_run

def noted(self, setup):
    reached.append(True)  # the setup's connection opened and migrated
    return for_the_run(self, setup)

Journal._for_the_run = noted
journal = Journal(Path(sys.argv[1]))
try:
    journal.open()
    said = "opened"
    journal.close()
except JournalError as err:
    said = str(err)
print(json.dumps({"said": said, "left_open": len(fds() - held), "run_made": bool(reached)}))
"""


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="counts descriptors in /proc")
def test_a_run_connection_that_cannot_be_made_leaves_nothing_open(tmp_path: Path) -> None:
    """The setup's connection opened and migrated, the run's cannot be made (descriptors run
    out): a clear JournalError, the setup's connection closed with it (no descriptor left
    behind, a start that tries again has them all), and the journal opens when it can."""
    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.open()
    walk_to(journal, journal.create(new_sale(1)), SaleState.COMPLETED)
    journal.close()
    refused = f"cannot open the journal at {path}: unable to open database file"
    seen = []
    for free in range(1, 9):  # as many as SQLite needs here for both, and more
        done = _python(OUT_OF_DESCRIPTORS, str(path), str(free))
        assert done.returncode == 0, done.stderr
        seen.append(json.loads(done.stdout))
    assert all(s["left_open"] == 0 for s in seen), seen
    assert all(s["said"] in (refused, "opened") for s in seen), seen
    # the path attacked: the setup's connection made, the run's not
    assert any(s["run_made"] and s["said"] == refused for s in seen), seen
    assert seen[-1]["said"] == "opened", seen
    journal = Journal(path)
    journal.open()
    try:
        assert [r.sale_id for r in journal.query()] == ["s1"]
    finally:
        journal.close()
    assert not os.path.exists(f"{path}-wal")  # the last close checkpointed as ever


# Journal.open on a small file system of its own (a tmpfs in a mount namespace of the test's):
# full (a filler takes every block left) or read-only; then as the disk is made whole again
OPEN_ON = """\
import json, os, sys
from pathlib import Path
from kiosk_agent.sales.journal import Journal
from kiosk_agent.sales.model import JournalError

def fds():
    return len(os.listdir("/proc/self/fd"))

before = fds()
journal = Journal(Path(sys.argv[1]))
try:
    journal.open()
    said = "opened"
    crashed = journal.db.execute(
        "SELECT count(*) FROM sales WHERE product LIKE 'crashed-%'").fetchone()[0]
    synchronous = journal.db.execute("PRAGMA synchronous").fetchone()[0]
    said += f": {crashed} crashed, synchronous {synchronous}"
    journal.close()
except JournalError as err:
    said = str(err).removeprefix(f"cannot open the journal at {sys.argv[1]}: ")
print(json.dumps({"said": said, "left_open": fds() - before}))
"""

ON_A_SMALL_DISK = """\
set -e
mount -t tmpfs -o size=512k tmpfs "$1/disk"
cp "$1/crashed.db" "$1/crashed.db-wal" "$1/crashed.db-shm" "$1/disk/"
if [ "$2" = full ]; then dd if=/dev/zero of="$1/disk/filler" bs=1k 2>/dev/null || true; fi
if [ "$2" = read-only ]; then mount -o remount,ro "$1/disk"; fi
"$3" -c "$4" "$1/disk/crashed.db"
if [ "$2" = full ]; then rm "$1/disk/filler"; fi
if [ "$2" = read-only ]; then mount -o remount,rw "$1/disk"; fi
"$3" -c "$4" "$1/disk/crashed.db"
"""


@pytest.mark.parametrize(("disk", "refusal"), [
    ("full", "database or disk is full"),  # the migration's commit
    ("read-only", "attempt to write a readonly database"),
])  # fmt: skip
def test_a_full_or_read_only_disk_at_open_refuses_clearly_and_loses_nothing(
    tmp_path: Path, disk: str, refusal: str
) -> None:
    """A journal of an older schema an older run left crashed (frames in its WAL), opened on a
    disk that is full or read-only: the migration cannot commit, a clear JournalError naming
    the fault, no descriptor left open; the disk whole again, it opens migrated with every
    crashed frame and the run's settings. (main's one connection answers the same.)"""
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs tmpfs {tmp_path}"],
        capture_output=True, check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.skip("no mount namespace here (needs root and unshare)")
    _an_older_journal_a_crash_left(tmp_path)
    (tmp_path / "disk").mkdir()
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", ON_A_SMALL_DISK, "sh", str(tmp_path), disk,
         sys.executable, OPEN_ON],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    refused, opened = (json.loads(line) for line in done.stdout.splitlines())
    assert refused == {"said": refusal, "left_open": 0}
    assert opened == {"said": f"opened: {SALES} crashed, synchronous 2", "left_open": 0}
