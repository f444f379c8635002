"""What the benches share with the tests, importable without the test tree: a loopback port
for a server that must come back on it (``free_port``), a process's wall clock stepped from
outside with libfaketime (``SteppedClock``), and a harness of the test tree loaded from its file
(``load_harness``: ``bench/chaos.py`` runs ``tests/assembly/crash_driver.py``'s ``Chaos``).

The benches put this directory on ``sys.path`` (``import _support``); the tests import it as
``bench._support`` (``tests/helpers.py``, ``tests/faketime.py``), so each lives here once.

libfaketime: the process starts with ``LD_PRELOAD`` of libfaketime and an offset file; writing
a new offset (in seconds: ``+259200`` is three days ahead) into the file steps its wall clock at
once, as NTP would. Its monotonic clock is left alone (``FAKETIME_DONT_FAKE_MONOTONIC``): NTP does
not step that either.
"""

from __future__ import annotations

import glob
import importlib.util
import random
import socket
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


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
