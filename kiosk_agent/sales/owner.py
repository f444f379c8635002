"""One agent per journal: an OS lock beside it that dies with its holder.

An agent that runs sales claims ``journal.db.lock`` (beside the journal) with ``flock`` before it
reads, recovers or writes anything, and writes who it is into the file. The kernel lets the lock
go when the holder's last descriptor closes, however it ends (a SIGKILL, a power cut), so a
dead agent never blocks its successor; the file's text only names a live holder to whoever is
refused. Readers (``sales``, ``doctor``) and ``sales resolve``, whose one write is conditional
in SQLite, never take it: they work beside a running agent.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import time
from pathlib import Path

from kiosk_agent.data_class import data_class
from kiosk_agent.moments import display_time
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sales.journal import JournalError

_LOGGER = logging.getLogger(__name__)

LOCK_SUFFIX = ".lock"
# A holder writes its name right after it takes the lock: a refused reader that finds the file
# still empty waits this long (in small steps) for the name before saying it is unknown.
_NAME_WAIT_S = 0.2


def lock_path(journal: Path | str) -> Path:
    """``journal.db.lock`` beside the journal's real file (symlinks resolved, so two
    configurations that reach one journal by different paths meet on one lock)."""
    real = Path(journal).resolve()
    return real.with_name(real.name + LOCK_SUFFIX)


@data_class(frozen=True, slots=True)
class Holder:
    """The process that holds a journal, as it described itself in the lock file."""

    pid: int | None
    started_at: float | None = None  # Unix time, for display
    command: str | None = None

    def describe(self) -> str:
        if self.pid is None:
            return "another process (it has not written its name yet)"
        parts = [f"pid {self.pid}"]
        if self.started_at is not None:
            parts.append(f"started {display_time(self.started_at)}")
        if self.command:
            parts.append(f"command: {self.command}")
        return ", ".join(parts)

    def text(self) -> str:
        return json.dumps({"pid": self.pid, "started_at": self.started_at, "command": self.command})

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """The holder a lock file names; None for an empty or unreadable file."""
        try:
            data = json.loads(text)
            pid = data["pid"]
            started = data.get("started_at")
            command = data.get("command")
        except (ValueError, TypeError, KeyError):
            return None
        if not isinstance(pid, int) or isinstance(pid, bool):
            return None
        return cls(
            pid,
            float(started) if isinstance(started, int | float) else None,
            command[:300] if isinstance(command, str) else None,
        )


class JournalOwned(JournalError):
    """Another live process owns the journal: this one must not touch it."""

    def __init__(self, journal: Path, holder: Holder) -> None:
        super().__init__(
            f"the journal {journal} is owned by another agent ({holder.describe()}): only one "
            "agent may run on a journal; stop that one first, or give this one its own "
            "journal.path"
        )
        self.journal = journal
        self.holder = holder


class JournalLock:
    """The claim of one agent on one journal. ``acquire`` refuses with :class:`JournalOwned`
    while another process holds it; ``release`` (or the process's end) lets it go."""

    def __init__(self, journal: Path | str, clock: Clock = SYSTEM_CLOCK) -> None:
        self.journal = Path(journal)
        self.clock = clock  # the holder's start time, written in; the wait for a holder's name
        self._fd: int | None = None
        self.lost = False  # another process claimed the journal while this one held it

    @property
    def path(self) -> Path:
        return lock_path(self.journal)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, _attempt: int = 1) -> None:
        """Take the journal, or raise :class:`JournalOwned` naming who has it (never waits).
        Taking it again while held is a no-op."""
        if self._fd is not None:
            return
        path = self.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = _open_lock_file(path)
        except PermissionError as err:
            _refuse_if_held(self.journal, path, self.clock)  # another user's agent holds it: say so
            raise JournalError(f"cannot claim the journal: {path}: {err.strerror}") from err
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise JournalError(
                    f"cannot claim the journal: {path} is a symbolic link; remove it (the agent "
                    "makes its own lock file)"
                ) from err
            raise JournalError(f"cannot claim the journal: {path}: {err.strerror}") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd, self.clock)
            os.close(fd)
            raise JournalOwned(self.journal, holder) from None
        except OSError as err:
            os.close(fd)
            raise JournalError(f"cannot claim the journal: {path}: {err.strerror}") from err
        if not _names(path, fd):
            # removed or replaced between the open and the lock (its holder putting it back:
            # keep()): the claim is on the file the path names now, or it is nobody's
            os.close(fd)
            if _attempt >= 3:
                raise JournalError(f"cannot claim the journal: {path} keeps being replaced")
            self.acquire(_attempt + 1)
            return
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, _me(self.clock).text().encode(), 0)
        except OSError:
            pass  # the claim holds without the name; a refused agent then says "another process"
        self._fd = fd

    def keep(self) -> bool:
        """Put the claim back when its file was removed or replaced under the holder (a person
        cleaning up, taking it for a dead agent's): a second agent would otherwise find no claim
        and run on this journal too. Called every second or so; False when another process
        claimed the journal meanwhile (two agents on one journal: a person must stop one)."""
        if self._fd is None:
            return True
        if _names(self.path, self._fd):
            return True
        stale, self._fd = self._fd, None
        try:
            self.acquire()
        except JournalOwned as err:
            self._fd = stale
            if not self.lost:
                _LOGGER.error(
                    "%s was removed while this agent ran, and %s claimed the journal since: two "
                    "agents run on one journal; stop the other one",
                    self.path, err.holder.describe(),
                )
            self.lost = True
            return False
        except JournalError:  # cannot be made again now (read-only): the next look tries again
            self._fd = stale
            return True
        os.close(stale)
        _LOGGER.warning("%s was removed while this agent ran; claimed again (it must stay while "
                        "an agent runs)", self.path)
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> JournalLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` is still the file open as ``fd`` (True when it cannot be told)."""
    try:
        named = os.stat(path, follow_symlinks=False)
        mine = os.fstat(fd)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)


def _open_lock_file(path: Path) -> int:
    # O_CLOEXEC: a child process must not inherit (and so keep) the claim. O_NOFOLLOW: the
    # claim truncates and writes the file, never the one a planted symlink names.
    flags = os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o600)
    except OSError as err:
        if err.errno != errno.EROFS or not path.exists():
            raise
    # A file system turned read-only keeps its lock file: flock needs no write, so the claim
    # holds (without the holder's name) and the agent goes on to wait for its journal's disk.
    return os.open(path, os.O_RDONLY | flags)


def _refuse_if_held(journal: Path, path: Path, clock: Clock) -> None:
    """A lock file this user may not write (another user's agent made it): raise
    :class:`JournalOwned` if a live process holds it; the holder is named if it can be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise JournalOwned(journal, _read_holder(fd, clock)) from None
    except OSError:
        return
    finally:
        os.close(fd)  # a probe that got the lock lets go at once


def _read_holder(fd: int, clock: Clock) -> Holder:
    deadline = clock.monotonic() + _NAME_WAIT_S
    while True:
        try:
            holder = Holder.parse(os.pread(fd, 4096, 0).decode(errors="replace"))
        except OSError:
            holder = None
        if holder is not None:
            return holder
        if clock.monotonic() >= deadline:
            return Holder(None)
        time.sleep(0.01)


def _me(clock: Clock) -> Holder:
    return Holder(os.getpid(), clock.time(), _command_line(os.getpid()))


def _command_line(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part) or None
