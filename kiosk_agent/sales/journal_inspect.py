"""The journal's file looked at before it is opened: found lost (a marker says one was in use
here), damaged (SQLite's ``quick_check`` fails; moved aside with its WAL), or fine.

Kept apart from the guard (``journal_guard.py``, which imports the sale steps, the service's
models and asyncio with them) so that ``kiosk-agent run`` can begin it before it imports the
agent (:func:`inspect_ahead`).
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import logging
import threading
from pathlib import Path

from kiosk_agent.data_class import data_class
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sales.journal import Journal, integrity, side_files

_LOGGER = logging.getLogger(__name__)

DAMAGE_NOTE_SUFFIX = ".damage-found"
# The journal's bulk (most of a year's file): read after it opened, in a worker thread, before
# money moves; the start reads none of it but an open sale's steps (JournalGuard._read_whole)
BULK = ("steps",)


@data_class(frozen=True, slots=True)
class JournalNotice:
    """What was found wrong with the journal's file at start (``kind``: lost or damaged)."""

    kind: str
    message: str
    kept_at: Path | None = None


def inspect_journal(
    path: Path, *, move_damaged: bool = True, whole: bool = True, clock: Clock = SYSTEM_CLOCK
) -> JournalNotice | None:
    """Check the journal's file before it is opened; None when it is fine (or new). With
    ``whole`` False every table but the steps (``BULK``), unless the last run's check in the
    worker thread found it damaged (``damage_note``): then the whole ``quick_check``. A damaged
    one moved aside is named after the ``clock``'s wall time."""
    marker = Journal(path).marker
    present = path.exists() and path.stat().st_size > 0
    if not present:
        if not marker.exists():
            return None  # a first start
        what = "missing" if not path.exists() else "empty (0 bytes)"
        return _lost(path, marker, what)
    noted = damage_note(path)
    # what the start reads (every table but the steps) unless told to read it whole
    problems = integrity(path, quick=True, but=() if whole or noted.exists() else BULK)
    if not problems or _not_damage(problems):
        if not problems and move_damaged:  # read whole (the note made it) and found sound
            noted.unlink(missing_ok=True)
        return None  # readable, or a fault of the disk (full, read-only): open() says which
    if problems == ["no sales table: the journal is empty"]:
        if marker.exists():
            return _lost(path, marker, "empty (no tables: its WAL was removed, or never synced)")
        return None
    kept = _move_aside(path, clock.time()) if move_damaged else None
    found = "; ".join(problems[:3])
    if kept is None:
        return JournalNotice("damaged", f"the journal at {path} is damaged ({found})")
    return JournalNotice(
        "damaged",
        f"the journal at {path} was damaged ({found}); it was moved to {kept} (with its WAL) "
        "and a new journal begun. Its sales are not lost to you: `sqlite3 "
        f"{kept} .recover` saves what it can. Reporting's recent charges were compared with "
        "the new journal; any it did not hold was given back or put to attention",
        kept,
    )


# Inspections of a journal's file begun ahead of its agent's start (inspect_ahead), by path:
# taken by the guard that opens it (JournalGuard.before_open), once.
_AHEAD: dict[Path, concurrent.futures.Future[JournalNotice | None]] = {}


def inspect_ahead(path: Path, clock: Clock = SYSTEM_CLOCK) -> None:
    """Begin :func:`inspect_journal` of ``path`` (as a start does: all but the steps) in a
    thread of its own, for the guard that opens it next to take. ``kiosk-agent run`` calls it
    once it holds the journal's claim (nothing else reads or moves the file then), before it
    imports the agent: SQLite reads without Python's lock, so a year of sales' check (0.3 s of
    a core) runs beside the imports on a second core, not before the open."""
    future: concurrent.futures.Future[JournalNotice | None] = concurrent.futures.Future()

    def inspect() -> None:
        try:
            future.set_result(inspect_journal(path, whole=False, clock=clock))
        except Exception as err:  # noqa: BLE001 - raised where the result is taken
            future.set_exception(err)

    _AHEAD[path] = future
    threading.Thread(target=inspect, name="journal-inspect", daemon=True).start()


def damage_note(path: Path) -> Path:
    """Beside the journal: the check after the last open found it damaged; the next start
    reads it whole before it opens, and moves it aside."""
    return path.with_name(path.name + DAMAGE_NOTE_SUFFIX)


def _not_damage(problems: list[str]) -> bool:
    """An error of the disk (full, read-only, I/O), not of the file: nothing is moved aside."""
    text = " ".join(problems).lower()
    return any(word in text for word in ("disk i/o", "disk is full", "readonly", "read-only",
                                         "unable to open"))


def _lost(path: Path, marker: Path, what: str) -> JournalNotice:
    return JournalNotice(
        "lost",
        f"the journal at {path} is {what}, but {marker} says one was in use here. If it was "
        "removed on purpose, delete that marker; else restore it from a backup to see its "
        "sales. Reporting's recent charges were compared with the new journal; any it did "
        "not hold was given back or put to attention",
    )


def _move_aside(path: Path, now: float) -> Path | None:
    stamp = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    kept = path.with_name(f"{path.name}.damaged-{stamp}")
    try:
        path.rename(kept)
        for side, moved in zip(side_files(path), side_files(kept), strict=True):
            if side.exists():
                side.rename(moved)
        damage_note(path).unlink(missing_ok=True)
    except OSError as err:
        _LOGGER.error("cannot move the damaged journal %s aside: %s", path, err)
        return None
    return kept


def taken_ahead(path: Path) -> concurrent.futures.Future[JournalNotice | None] | None:
    """The inspection of ``path`` begun by :func:`inspect_ahead`, taken (once); None if none
    was begun."""
    return _AHEAD.pop(path, None)
