"""Who holds a lock on a file, from the kernel's table (``/proc/locks``): the process another
program's lock keeps this one waiting on, named in the refusal. Light (no asyncio, nothing of
the project): the serial link (a reader ``flock``ed by another agent) and the journal (its
write lock held by a ``sqlite3`` shell) take it from here."""

from __future__ import annotations

import os

LOCKS = "/proc/locks"


def holders(path: str | os.PathLike[str], *, kind: str, byte: int | None = None) -> list[str]:
    """Each other process holding a write lock of ``kind`` (``FLOCK``, or ``POSIX`` with the
    lock's ``byte``: SQLite's locks are ranges of bytes) on the file at ``path``, as ``pid 812:
    its command line``; none where that cannot be read (no /proc, the file gone)."""
    try:
        node = os.stat(path)
        with open(LOCKS, encoding="ascii", errors="replace") as locks:
            table = locks.read()
    except OSError:
        return []
    here = f"{os.major(node.st_dev):02x}:{os.minor(node.st_dev):02x}:{node.st_ino}"
    me = str(os.getpid())
    found: list[str] = []
    for line in table.splitlines():
        # "6: POSIX  ADVISORY  WRITE 13070 fe:00:2149888 120 120" ("->" after the number: a
        # process waiting for it, not holding it)
        fields = line.split()
        if len(fields) < 8 or fields[1] != kind or fields[3] != "WRITE" or fields[5] != here:
            continue
        if byte is not None and not _covers(fields[6], fields[7], byte):
            continue
        pid = fields[4]
        if pid != me and pid.isdigit() and pid not in found:
            found.append(pid)
    return [_named(pid) for pid in found]


def describe(names: list[str]) -> str:
    """``pid 812: ...`` for one holder, ``pid 812: ...; pid 901: ...`` for more, ``another
    process`` where the table names none this process may see."""
    return "; ".join(names) if names else "another process"


def _covers(start: str, end: str, byte: int) -> bool:
    try:
        return int(start) <= byte and (end == "EOF" or byte <= int(end))
    except ValueError:
        return False


def _named(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as found:
            raw = found.read()
    except OSError:
        return f"pid {pid}"
    command = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    return f"pid {pid}: {command[:300]}" if command else f"pid {pid}"
