"""What the benches share with the tests, importable without the test tree: a loopback port
for a server that must come back on it (``free_port``), a process's wall clock stepped from
outside with libfaketime (``SteppedClock``), and a harness of the test tree loaded from its file
(``load_harness``: ``bench/chaos.py`` runs ``tests/assembly/crash_driver.py``'s ``Chaos``), and
a small file system of its own for a journal that must fill (``mount_tmpfs``), and the
environment the systemd unit gives the agent (``unit_environment``: the benches run the agent as
installed).

The benches put this directory on ``sys.path`` (``import _support``); the tests import it as
``bench._support`` (``tests/helpers.py``, ``tests/faketime.py``), so each lives here once.

libfaketime: the process starts with ``LD_PRELOAD`` of libfaketime and an offset file; writing
a new offset (in seconds: ``+259200`` is three days ahead) into the file steps its wall clock at
once, as NTP would. Its monotonic clock is left alone (``FAKETIME_DONT_FAKE_MONOTONIC``): NTP does
not step that either.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "systemd" / "kiosk-agent.service"


def unit_environment() -> dict[str, str]:
    """The variables the systemd unit sets for the agent (its ``Environment=`` lines), so that a
    bench measures the agent as a unit runs it (``MALLOC_ARENA_MAX``, docs/operations.md)."""
    variables = {}
    for line in UNIT.read_text().splitlines():
        key, _, assignments = line.partition("=")
        if key.strip() == "Environment":
            for assignment in assignments.split():
                name, _, value = assignment.partition("=")
                variables[name] = value.strip('"')
    return variables


def free_port() -> int:
    """A loopback port free right now, for a server that must come back on the same port.

    Chosen below the kernel's ephemeral range: a port from inside it (what binding port 0
    gives) can be taken meanwhile by any outgoing connection of a parallel test, and a server
    restarted on it then finds it in use."""
    low = _ephemeral_low()
    for _ in range(200):
        port = _RANDOM.randrange(max(1024, low - 12000), low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port below the ephemeral range")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_RANDOM = random.SystemRandom()


def library() -> str | None:
    """Where libfaketime is installed (``./dev`` installs it), or None."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    found += sorted(glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    return found[0] if found else None


class SteppedClock:
    """The offset file of one process tree's wall clock.

    ``immediate``: the process reads the file at every wall clock read, so a step is seen at
    once. That read is a file's open, read and close, and a Python process reads its wall clock
    (and libfaketime the file, for its waits too) thousands of times a second: about half an
    agent's CPU under the chaos run. Not immediate, it reads the file once a wall second at most
    (``FAKETIME_CACHE_DURATION=0``): a step is seen within a second of the file's change, which
    ``real_time`` places right (the offsets it tells apart are hours apart)."""

    def __init__(self, path: Path, *, immediate: bool = True) -> None:
        self.path = path
        self.immediate = immediate
        # (real wall time of the change, offset in seconds from then on), oldest first
        self.history: list[tuple[float, float]] = []
        self.step(0.0)

    def env(self) -> dict[str, str]:
        """What to add to the environment of the process whose clock steps."""
        lib = library()
        if lib is None:
            raise RuntimeError("libfaketime is not installed (apt-get install faketime)")
        return {
            "LD_PRELOAD": lib,
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            **({"FAKETIME_NO_CACHE": "1"} if self.immediate
               else {"FAKETIME_CACHE_DURATION": "0"}),  # read again once its second is past
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def step(self, offset: float) -> None:
        """Set the wall clock ``offset`` seconds from real time (either sign; 0: true again)."""
        scratch = self.path.with_suffix(".new")
        scratch.write_text(f"{offset:+.0f}\n")
        self.history.append((time.time(), offset))
        scratch.replace(self.path)  # atomic: a read never sees half an offset

    def real_time(self, stepped: float) -> float:
        """The real wall time of a moment the process wrote down as ``stepped``.

        The offset in force is the one whose interval the moment falls in; offsets are hours or
        days apart while a run lasts minutes, so only one fits (else the nearest is taken: a
        moment a clock not ``immediate`` wrote on the old offset just after a step). The last
        interval ends now, not never: under a step back, the old offset's moment read with the
        new one would fall hours into the future."""
        ends = [at for at, _ in self.history[1:]] + [time.time()]
        best = stepped
        miss = float("inf")
        for (began, offset), ended in zip(self.history, ends, strict=True):
            real = stepped - offset
            outside = max(0.0, began - real, real - ended)
            if outside < miss:
                best, miss = real, outside
        return best


def load_harness(relative: str) -> ModuleType:
    """A harness of the test tree (``tests/assembly/crash_driver.py``) loaded from its file as a
    module of its own name, as it runs as a script: the ``tests`` package is never imported."""
    path = ROOT / relative
    name = path.stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no harness at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


# Beside each mount point: which process mounted it, so that a mount whose process was killed
# (a test run ended by SIGKILL, a timeout, a crash) is found and given back by the next run
# instead of staying mounted under /tmp for good.
MOUNT_OWNER_SUFFIX = ".mounted-by"


@contextlib.contextmanager
def mount_tmpfs(directory: Path, options: str) -> Iterator[Path]:
    """A tmpfs at ``directory`` (``options`` as ``mount -o`` takes them) for the block; raises
    ``OSError`` with mount's own words where the kernel refuses it (not root, no tmpfs)."""
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        raise OSError(f"cannot mount a tmpfs at {directory}: {mounted.stderr.strip()}")
    with owned_mount(directory):
        yield directory


@contextlib.contextmanager
def owned_mount(mount_point: Path) -> Iterator[None]:
    """For a file system just mounted at ``mount_point``: records this process as its owner for
    the block, then unmounts it (and detaches its loop device, if it has one)."""
    owner = _owner_file(mount_point)
    owner.write_text(json.dumps({"pid": os.getpid(), "started": _process_start(os.getpid())}))
    try:
        yield
    finally:
        _give_back(mount_point, _mounts_under(mount_point.parent).get(mount_point))


def release_leaked_mounts(root: Path) -> list[Path]:
    """Unmount every file system under ``root`` that ``owned_mount`` recorded for a process that
    is gone; the mount points given back. One still owned by a live process (another test run
    at the same time) is left alone, and so is one without an owner file (not ours)."""
    released = []
    for mount_point, source in _mounts_under(root).items():
        try:
            recorded = json.loads(_owner_file(mount_point).read_text())
        except (OSError, ValueError):
            continue
        if _process_start(recorded.get("pid", 0)) == recorded.get("started"):
            continue  # its process still runs
        _give_back(mount_point, source)
        released.append(mount_point)
    return released


def _give_back(mount_point: Path, source: str | None) -> None:
    subprocess.run(["umount", "-l", str(mount_point)], check=False, capture_output=True)
    if source is not None and source.startswith("/dev/loop"):
        subprocess.run(["losetup", "-d", source], check=False, capture_output=True)
    _owner_file(mount_point).unlink(missing_ok=True)


def _owner_file(mount_point: Path) -> Path:
    return mount_point.with_name(mount_point.name + MOUNT_OWNER_SUFFIX)


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): with the
    pid, it names one process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _mounts_under(root: Path) -> dict[Path, str]:
    """Each file system mounted under ``root``: its mount point and its source."""
    prefix = str(root.resolve()).rstrip("/") + "/"
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return {}
    mounts = {}
    for line in lines:
        # fields are octal-escaped in /proc/self/mounts (a space is \\040)
        source, point = (field.encode().decode("unicode_escape") for field in line.split()[:2])
        if point.startswith(prefix):
            mounts[Path(point)] = source
    return mounts
