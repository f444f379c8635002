"""A real process's wall clock, stepped from outside with libfaketime (Debian's ``faketime``).

The process starts with ``LD_PRELOAD`` of libfaketime and an offset file; writing a new offset
("+3d", "-2h", "+0") into the file steps its wall clock at once, as NTP would. Its monotonic
clock is left alone (``FAKETIME_DONT_FAKE_MONOTONIC``): NTP does not step that either.
"""

from __future__ import annotations

import glob
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
        self.offsets: list[str] = []
        self.step("+0")

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

    def step(self, offset: str) -> None:
        """Set the wall clock's offset from real time, e.g. ``"+3d"``, ``"-2h"``, ``"+0"``."""
        scratch = self.path.with_suffix(".new")
        scratch.write_text(offset + "\n")
        scratch.replace(self.path)  # atomic: a read never sees half an offset
        self.offsets.append(offset)
