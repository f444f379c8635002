"""durable.replace: the new file's content on disk before the rename, the rename on disk after."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kiosk_agent import durable


def fsyncs_and_renames(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, object]]:
    """Record, in order, each fsync (a directory, or a file by its content) and each replace."""
    seen: list[tuple[str, object]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor: int) -> None:
        info = os.fstat(descriptor)
        if stat.S_ISDIR(info.st_mode):
            seen.append(("fsync dir", info.st_ino))
        else:
            seen.append(("fsync file", os.pread(descriptor, 100, 0)))
        real_fsync(descriptor)

    def replace(source: str | Path, target: str | Path) -> None:
        seen.append(("replace", Path(target).name))
        real_replace(source, target)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    monkeypatch.setattr(durable.os, "replace", replace)
    return seen


def test_replace_puts_the_content_then_the_rename_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "unit.json"
    target.write_text("old")
    scratch = tmp_path / "unit.json.new"
    scratch.write_text("new")
    seen = fsyncs_and_renames(monkeypatch)

    durable.replace(scratch, target)

    assert seen == [
        ("fsync file", b"new"),
        ("replace", "unit.json"),
        ("fsync dir", tmp_path.stat().st_ino),
    ]
    assert target.read_text() == "new"
    assert not scratch.exists()


def test_replace_that_cannot_rename_leaves_the_old_file_and_says_why(tmp_path: Path) -> None:
    target = tmp_path / "unit.json"
    target.mkdir()  # a directory in its place: the rename is refused
    scratch = tmp_path / "unit.json.new"
    scratch.write_text("new")
    with pytest.raises(IsADirectoryError):
        durable.replace(scratch, target)
    assert target.is_dir()
    assert scratch.read_text() == "new"
