"""Files replaced whole, durably: the new file's content is on disk before the rename, and the
rename on disk before the caller goes on. A power cut then leaves the old file or the new one,
never an empty one or neither: a rename is only a change to the directory, which the file
system may still hold in memory when the power goes."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path) -> None:
    """What was written to ``path`` (a file or a directory) is on disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def replace(source: Path, target: Path) -> None:
    """``os.replace(source, target)``, durable: ``source``'s content first, then the directory's
    entries (the rename, and any other rename made in that directory before it). Raises
    :class:`OSError`; the target is then the old file or the new one."""
    fsync_path(source)
    os.replace(source, target)
    fsync_path(target.parent)
