"""A small file system of its own for the journal: filled, made read-only, given back.

A tmpfs of a few MiB is mounted for the test (the tests run as root); where the kernel refuses
the mount, the test is skipped and says why.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench._support import mount_tmpfs, owned_mount
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import Transaction, TransactionFilter

BALLAST = "ballast"


@contextlib.contextmanager
def small_disk(directory: Path, size: str = "4m", options: str = "") -> Iterator[Path]:
    """A tmpfs of ``size`` at ``directory`` (``options``: more of mount's, e.g. ``nr_inodes=40``);
    the test is skipped where the kernel refuses the mount."""
    mount_options = ",".join(filter(None, [f"size={size}", "mode=0700", options]))
    with contextlib.ExitStack() as mounted:
        try:
            mounted.enter_context(mount_tmpfs(directory, mount_options))
        except OSError as err:
            pytest.skip(str(err))
        yield directory


def fill(disk: Path) -> int:
    """Write until the file system is full; the bytes written."""
    written = 0
    chunk = b"\0" * 65536
    with (disk / BALLAST).open("ab", buffering=0) as ballast:
        while True:
            try:
                written += ballast.write(chunk)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                break
    # and the last partial page, byte by byte
    with (disk / BALLAST).open("ab", buffering=0) as ballast, contextlib.suppress(OSError):
        for _ in range(4096):
            written += ballast.write(b"\0")
    return written


def free(disk: Path) -> None:
    (disk / BALLAST).unlink(missing_ok=True)


@contextlib.contextmanager
def ext4_disk(directory: Path, size_mb: int = 16) -> Iterator[tuple[Path, Callable[[], None]]]:
    """ext4 on a loop device at ``directory``; with the function that unmounts and mounts it
    again (the file system back after a shutdown, as a reboot finds it)."""
    image = directory.with_suffix(".img")
    mount_point = directory / "mnt"
    mount_point.mkdir(parents=True, exist_ok=True)
    with image.open("wb") as f:
        f.truncate(size_mb * 1024 * 1024)
    attached = subprocess.run(["losetup", "-f", "--show", str(image)],
                              capture_output=True, text=True, check=False)
    if attached.returncode != 0:
        pytest.skip(f"no loop device for an ext4 file system: {attached.stderr.strip()}")
    device = attached.stdout.strip()

    def mount() -> None:
        subprocess.run(["mount", device, str(mount_point)], check=True)

    def remount_fresh() -> None:
        subprocess.run(["umount", str(mount_point)], check=True)
        mount()

    try:
        subprocess.run(["mkfs.ext4", "-q", device], check=True)
        mount()
        with owned_mount(mount_point):
            yield mount_point, remount_fresh
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
        subprocess.run(["losetup", "-d", device], check=False)


# ext4's EXT4_IOC_SHUTDOWN with EXT4_GOING_FLAGS_NOLOGFLUSH: every later write fails
_EXT4_IOC_SHUTDOWN = 0x8004587D
_NOLOGFLUSH = 2


def shut_down(disk: Path) -> None:
    """The file system dies under whoever has files open on it (until mounted again)."""
    fd = os.open(disk, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, _EXT4_IOC_SHUTDOWN, struct.pack("I", _NOLOGFLUSH))
    finally:
        os.close(fd)


async def ledger(service: ServiceClient, order_id: str) -> list[Transaction]:
    """The service's own record of an order (every attempt of it)."""
    rows: list[Transaction] = []
    for suffix in ("", "-2", "-3"):
        query = TransactionFilter(order_id=order_id + suffix)
        rows += [row async for row in service.reporting.transactions(query)]
    return rows
