"""One agent per journal: the claim on ``journal.db.lock`` and how a refusal names the holder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kiosk_agent.sales.clock import SYSTEM_CLOCK
from kiosk_agent.sales.journal import JournalError
from kiosk_agent.sales.owner import Holder, JournalLock, JournalOwned, lock_path

# A process that claims the journal named on its command line, says so, and waits to be killed.
HOLDER = textwrap.dedent(
    """\
    import sys, time
    from kiosk_agent.sales.owner import JournalLock
    JournalLock(sys.argv[1]).acquire()
    print("HELD", flush=True)
    time.sleep(60)
    """
)


def test_a_second_claim_is_refused_naming_the_holder_until_the_first_lets_go(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal.db"
    first = JournalLock(journal)
    first.acquire()
    first.acquire()  # again while held: nothing changes
    with pytest.raises(JournalOwned) as refused:
        JournalLock(journal).acquire()
    assert refused.value.holder.pid == os.getpid()
    assert f"pid {os.getpid()}" in str(refused.value)
    assert str(journal) in str(refused.value)
    assert refused.value.holder.command  # this process's command line, from /proc
    assert not journal.exists()  # claiming reads and writes nothing of the journal itself
    assert (lock_path(journal).stat().st_mode & 0o777) == 0o600
    first.release()
    with JournalLock(journal) as second:
        assert second.held


def test_two_spellings_of_one_journal_meet_on_one_lock(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with JournalLock(tmp_path / "real" / "journal.db"), pytest.raises(JournalOwned):
        JournalLock(tmp_path / "link" / ".." / "real" / "journal.db").acquire()
    with JournalLock(tmp_path / "real" / "journal.db"), pytest.raises(JournalOwned):
        JournalLock(tmp_path / "link" / "journal.db").acquire()


def test_a_sigkilled_holder_blocks_nobody(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(journal)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "HELD"
        with pytest.raises(JournalOwned) as refused:
            JournalLock(journal).acquire()
        assert refused.value.holder.pid == holder.pid
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    # its name is still in the file, but the kernel let go of its lock with it
    assert Holder.parse(lock_path(journal).read_text()) is not None
    with JournalLock(journal) as successor:
        assert successor.held


@pytest.mark.parametrize("text", ["", "{", '{"pid": "12"}', '{"pid": true}', "[1]", "null"])
def test_a_lock_file_that_names_nobody_is_read_as_unknown(text: str) -> None:
    assert Holder.parse(text) is None
    assert Holder(None).describe() == "another process (it has not written its name yet)"


def test_a_holder_is_described_by_pid_start_and_command() -> None:
    holder = Holder.parse('{"pid": 812, "started_at": 1795586403.5, "command": "kiosk-agent run"}')
    assert holder is not None
    assert holder.describe() == (
        "pid 812, started 2026-11-25 06:00:03Z, command: kiosk-agent run"
    )



def test_a_lock_this_user_may_only_read_is_probed_for_its_holder(tmp_path: Path) -> None:
    """Another user's agent made the lock file (this one may not open it to write): the probe
    on a read-only descriptor still finds the holder, so the refusal names it. (The other user
    itself cannot be played here: the probe is asked directly.)"""
    from kiosk_agent.sales.owner import _refuse_if_held

    journal = tmp_path / "journal.db"
    with JournalLock(journal):
        with pytest.raises(JournalOwned) as refused:
            _refuse_if_held(journal, lock_path(journal), SYSTEM_CLOCK)
        assert refused.value.holder.pid == os.getpid()
    _refuse_if_held(journal, lock_path(journal), SYSTEM_CLOCK)  # nobody holds it: nothing to say
    _refuse_if_held(journal, tmp_path / "missing.lock", SYSTEM_CLOCK)


@pytest.mark.parametrize("target", ["a file", "nothing"])
def test_a_lock_file_that_is_a_symlink_is_refused_and_its_target_left_alone(
    tmp_path: Path, target: str
) -> None:
    """A symlink planted where the lock goes: the claim would truncate and write the file it
    names (the agent often runs as root). It is refused, clearly, and nothing is written."""
    journal = tmp_path / "journal.db"
    victim = tmp_path / "victim"
    if target == "a file":
        victim.write_text("keep me")
    lock_path(journal).symlink_to(victim)
    with pytest.raises(JournalError, match=r"journal\.db\.lock is a symbolic link"):
        JournalLock(journal).acquire()
    if target == "a file":
        assert victim.read_text() == "keep me"
    else:
        assert not victim.exists()
    assert not journal.exists()


def test_a_lock_file_that_is_a_directory_or_garbage(tmp_path: Path) -> None:
    """A directory where the lock goes is refused with the reason; garbage left in a lock
    file (no live holder) is claimed and overwritten with this agent's name."""
    blocked = tmp_path / "a" / "journal.db"
    lock_path(blocked).parent.mkdir()
    lock_path(blocked).mkdir()
    with pytest.raises(JournalError, match=r"journal\.db\.lock: Is a directory"):
        JournalLock(blocked).acquire()
    garbage = tmp_path / "b" / "journal.db"
    lock_path(garbage).parent.mkdir()
    lock_path(garbage).write_bytes(bytes(range(256)) * 40)
    with JournalLock(garbage):
        holder = Holder.parse(lock_path(garbage).read_text())
        assert holder is not None
        assert holder.pid == os.getpid()


def test_a_lock_file_on_a_file_system_turned_read_only_is_still_claimed(tmp_path: Path) -> None:
    """The claim opened its file for writing: on a read-only file system `run` stopped at
    "cannot claim the journal: Read-only file system" before it could wait for the disk."""
    from tests.assembly.disk_helpers import small_disk

    with small_disk(tmp_path / "disk") as disk:
        journal = disk / "journal.db"
        with JournalLock(journal):  # a lock file from an earlier run
            pass
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        try:
            first = JournalLock(journal)
            first.acquire()
            assert first.held
            with pytest.raises(JournalOwned):  # and it still keeps a second agent out
                JournalLock(journal).acquire()
            first.release()
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)


def test_a_claim_whose_file_was_removed_is_put_back(tmp_path: Path) -> None:
    """A person removing journal.db.lock under a running agent (taking it for a dead one's)
    let a second agent start on the same journal: it found no claim."""
    journal = tmp_path / "journal.db"
    with JournalLock(journal) as claim:
        assert claim.keep()  # nothing changed: nothing done
        lock_path(journal).unlink()
        assert claim.keep()  # put back, and held
        with pytest.raises(JournalOwned) as refused:
            JournalLock(journal).acquire()
        assert refused.value.holder.pid == os.getpid()
        lock_path(journal).unlink()
        lock_path(journal).write_text("")  # replaced by another file: the same
        assert claim.keep()
        with pytest.raises(JournalOwned):
            JournalLock(journal).acquire()


def test_a_claim_taken_by_another_process_while_its_file_was_gone_is_reported(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal.db"
    claim = JournalLock(journal)
    claim.acquire()
    lock_path(journal).unlink()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(journal)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "HELD"
        assert not claim.keep()
        assert claim.lost
    finally:
        holder.kill()
        holder.wait()
        claim.release()
