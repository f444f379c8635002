"""Who holds a lock on a file, from the kernel's table (``/proc/locks``), or listens on a TCP
port (``/proc/net/tcp``): the process another program's lock or socket keeps this one out
with, named in the refusal. Light (no asyncio, nothing of the project): the serial link (a
reader ``flock``ed by another agent), the journal (its write lock held by a ``sqlite3``
shell) and the kiosk API (its port taken by another agent) take it from here; so does the
serial link for a terminal program that holds its port open (``openers``)."""

from __future__ import annotations

import os
from collections.abc import Callable

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


def listeners(port: int) -> list[str]:
    """Each other process listening on TCP ``port`` (any address, IPv4 or IPv6), as ``pid 812:
    its command line``: the sockets' inodes from ``/proc/net/tcp*``, then the processes whose
    descriptors are those sockets (another user's are not readable: none named)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii", errors="replace") as sockets:
                rows = sockets.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()  # sl local_address rem_address st ... uid timeout inode
            if len(fields) > 9 and fields[3] == "0A" and fields[1].endswith(f":{port:04X}"):
                inodes.add(f"socket:[{fields[9]}]")
    return _having(inodes.__contains__) if inodes else []


def openers(path: str | os.PathLike[str]) -> list[str]:
    """Each other process with the file at ``path`` open (a serial port a terminal program
    reads and writes without a lock), as ``pid 901: screen /dev/ttyUSB0``: its descriptors in
    ``/proc`` (another user's are not readable: none named)."""
    target = os.path.realpath(path)
    return _having(lambda link: link == target)


def _having(wanted: Callable[[str], bool]) -> list[str]:
    """Each other process with a descriptor whose link (``socket:[812]``, ``/dev/pts/3``) is
    ``wanted``, named."""
    found: list[str] = []
    me = str(os.getpid())
    try:
        pids = [pid for pid in os.listdir("/proc") if pid.isdigit() and pid != me]
    except OSError:
        return found
    for pid in pids:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
            if any(wanted(os.readlink(f"/proc/{pid}/fd/{fd}")) for fd in descriptors):
                found.append(pid)
        except OSError:
            continue
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
    # another program's words, shown in a log line and health: a line break or an escape in
    # its arguments must not start a line of its own or reach a terminal
    command = "".join(c if c.isprintable() else " " for c in command[:300])
    return f"pid {pid}: {command}" if command else f"pid {pid}"
