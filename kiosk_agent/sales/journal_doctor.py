"""The doctor's checks of the journal: its directory and disk, its file whole (or quickly, for
the running agent), the unit whose id it holds made on this machine. Reads only.

Beside the journal (``journal.py``, ``journal_guard.py``, ``unit.py``) they check; ``doctor.py``
runs them with the path its configuration names.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from kiosk_agent.verdicts import Report, Verdict


async def check_journal_running(report: Report, path: Path) -> None:
    """The journal's checks for a running agent's doctor (the status page): SQLite's
    ``quick_check`` in a worker thread, on a connection of its own. On the event loop, a year of
    sales (281 MiB) held every request and sale for 4.8 s; the full ``integrity_check`` is the
    command line's (``kiosk-agent doctor``)."""
    await asyncio.to_thread(check_journal, report, path, quick=True)


def check_journal(report: Report, path: Path, *, quick: bool = False) -> None:
    """The journal at ``path`` (as the configuration resolves it) can be kept there and is
    whole; then its unit (``check_unit``)."""
    from kiosk_agent.sales.journal_guard import disk_fault

    directory = path.parent
    if not directory.exists() and _can_create(directory):
        # the agent makes it at start (as the demo's ~/.local/state/kiosk-agent)
        report.add("journal", Verdict.PASS, f"{path} (its directory is made at start)")
    elif not directory.exists():
        report.add(
            "journal",
            Verdict.FAIL,
            f"directory {directory} does not exist",
            f"create it: install -d -o kiosk-agent -m 0700 {directory}",
        )
    elif (fault := disk_fault(directory)) is not None:
        # before the rest: its effects (not writable, "disk I/O error") are no fault of the file
        report.add(
            "journal",
            Verdict.FAIL,
            f"{path}: {fault}; no sale can be journaled, so the unit takes no card",
            "free space on it (or make it writable again); a running agent comes back by "
            "itself, a starting one waits for it",
        )
    elif not os.access(directory, os.W_OK):
        report.add(
            "journal",
            Verdict.FAIL,
            f"{directory} is not writable by this user",
            "run doctor as the service user, or chown the state directory",
        )
    else:
        check_journal_file(report, path, quick=quick)
        check_unit(report, path)


def check_unit(report: Report, path: Path) -> None:
    """The unit's id, and whether its journal was made on this machine (sales/unit.py): a
    cloned SD card's journal takes no customer until a person adopts it. Reads only."""
    from kiosk_agent.sales import unit
    from kiosk_agent.sales.journal import Journal, JournalError
    from kiosk_agent.sales.machine import this_machine

    here = this_machine().at(path)
    history: list[unit.UnitRow] = []
    if path.exists() and path.stat().st_size:
        journal = Journal(path)
        try:
            journal.open_to_read()
            history = unit.rows(journal.db)
        except JournalError:
            return  # the journal check said what is wrong with it
        finally:
            journal.close()
    if not history:
        report.add("unit", Verdict.PASS, f"no unit id yet: made at the agent's next start "
                   f"({here.describe()})")
        return
    current = history[-1]
    mismatch = current.machine.differs(here)
    if mismatch:
        report.add(
            "unit", Verdict.FAIL,
            f"unit {current.unit_id}: its journal was made on another machine ({mismatch}); "
            "it takes no customer and moves no money",
            "a copy of another unit's SD card: `kiosk-agent unit adopt -c CONFIG` gives this "
            "one a new id (the old id's charges stay that unit's); or begin the journal anew",
        )  # fmt: skip
        return
    # no serial, no physical interface: a cloned card's twin is not told apart (unit.py
    # ``OwnUnit.copyable``), and the charge check gives back no charge it cannot place
    weak = ("; no hardware id, so a copy of this card on another such machine would not be "
            "told apart: a charge of no sale the journal holds goes to a person, never given "
            "back") if not current.machine.hardware else ""
    report.add("unit", Verdict.PASS,
               f"unit {current.unit_id}, its journal made on this machine ({here.describe()})"
               f"{weak}")


def check_journal_file(report: Report, path: Path, *, quick: bool = False) -> None:
    """The journal's integrity (``PRAGMA integrity_check``, its WAL read with it; with
    ``quick``, the ``quick_check`` alone), and whether one that was in use here is missing or
    empty (the ``.in-use`` marker beside it)."""
    from kiosk_agent.sales.journal import integrity, marker_path, side_files
    from kiosk_agent.sales.journal_inspect import inspect_journal

    wal = side_files(path)[0]
    wal_text = f"WAL {wal.stat().st_size} bytes" if wal.exists() else "no WAL"
    notice = inspect_journal(path, move_damaged=False)
    if notice is not None and notice.kind == "lost":
        report.add("journal", Verdict.FAIL, notice.message,
                   "restore it from a backup, or delete the marker if it was removed on "
                   "purpose; the agent checks reporting for the charges it held on start")
        return
    if not path.exists():
        report.add("journal", Verdict.PASS, f"{path} not created yet (the first start does)")
        return
    # inspect_journal ran the quick check: its notice says what it found
    problems = integrity(path) if not quick else [] if notice is None else [notice.message]
    if problems:
        found = f"{path} is damaged ({wal_text}): {'; '.join(problems[:3])}"
        if quick:
            found = problems[0]
        report.add(
            "journal", Verdict.FAIL, found,
            "restart the agent: it moves the damaged journal aside (kept for `sqlite3 FILE "
            ".recover`), begins a new one and gives back any charge it can no longer account "
            "for",
        )
        return
    marker = "" if marker_path(path).exists() else "; no in-use marker yet"
    how = "quick check" if quick else "integrity"
    report.add("journal", Verdict.PASS, f"{path}: {how} ok ({wal_text}{marker})")


def _can_create(directory: Path) -> bool:
    """Whether this user may make ``directory``: its nearest existing parent is writable."""
    parent = directory
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)
