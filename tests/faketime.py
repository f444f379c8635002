"""A real process's wall clock, stepped from outside with libfaketime (Debian's ``faketime``).

The process starts with ``LD_PRELOAD`` of libfaketime and an offset file; writing a new offset
(in seconds: ``+259200`` is three days ahead) into the file steps its wall clock at once, as NTP
would. Its monotonic
clock is left alone (``FAKETIME_DONT_FAKE_MONOTONIC``): NTP does not step that either.
"""

from __future__ import annotations

import glob
import time
from pathlib import Path


def library() -> str | None:
    """Where libfaketime is installed (``./dev`` installs it), or None."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    found += sorted(glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    return found[0] if found else None


class SteppedClock:
    """The offset file of one process tree's wall clock."""

    def __init__(self, path: Path) -> None:
        self.path = path
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
            "FAKETIME_NO_CACHE": "1",  # read the file at every clock read: a step is immediate
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
        days apart while a run lasts minutes, so only one fits (else the nearest is taken)."""
        ends = [at for at, _ in self.history[1:]] + [float("inf")]
        best = stepped
        miss = float("inf")
        for (began, offset), ended in zip(self.history, ends, strict=True):
            real = stepped - offset
            outside = max(0.0, began - real, real - ended)
            if outside < miss:
                best, miss = real, outside
        return best
