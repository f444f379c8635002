"""sales.journal_doctor: the doctor's checks of the journal, its directory, disk and file."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from kiosk_agent.sales.journal import Journal
from kiosk_agent.sales.journal_doctor import check_journal, check_journal_running
from kiosk_agent.verdicts import Report, Verdict


def test_a_journal_directory_the_agent_will_make_passes(tmp_path: Path) -> None:
    report = Report()
    check_journal(report, tmp_path / "state/new/journal.db")
    [check] = report.checks
    assert check.verdict is Verdict.PASS  # Journal.open makes it, as the demo's state dir
    assert check.detail == f"{tmp_path}/state/new/journal.db (its directory is made at start)"
    # a parent that is a file: it cannot be made
    (tmp_path / "blocked").write_text("")
    report = Report()
    check_journal(report, tmp_path / "blocked/new/journal.db")
    assert report.checks[0].verdict is Verdict.FAIL
    assert "does not exist" in report.checks[0].detail


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_journal_on_a_full_or_read_only_disk_is_named_so_not_damaged(
    tmp_path: Path, fault: str
) -> None:
    """doctor called a whole journal on a full disk "damaged (disk I/O error)", with the fix
    "restart the agent: it moves the damaged journal aside"; on a read-only one, "not writable
    by this user: run doctor as the service user, or chown"."""
    from ..assembly.disk_helpers import fill, small_disk

    with small_disk(tmp_path / "disk") as disk:
        journal = Journal(disk / "journal.db")
        journal.open()
        journal.close()  # whole, its WAL gone: reading it must make files
        if fault == "full":
            fill(disk)
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        report = Report()
        check_journal(report, disk / "journal.db")
        [check] = report.checks
        assert check.verdict is Verdict.FAIL
        assert f"the file system of {disk} is {fault}" in check.detail
        assert "damaged" not in check.detail + check.fix
        assert "free space" in check.fix


async def test_a_running_agents_doctor_checks_the_journal_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The status page's doctor: on the event loop, a year of sales' integrity check held every
    request and sale for 4.8 s. The check here waits for the loop to turn, which it can only do
    from another thread (on the loop it would wait out its bound and say so)."""
    import threading

    from kiosk_agent.sales import journal_inspect

    journal = Journal(tmp_path / "journal.db")
    journal.open()
    journal.close()
    loop_turned = threading.Event()
    seen: list[tuple[bool, bool]] = []

    def integrity(path: Path, *, quick: bool = False, but: object = ()) -> list[str]:
        seen.append((quick, loop_turned.wait(timeout=10)))
        return []

    monkeypatch.setattr(journal_inspect, "integrity", integrity)

    async def turn() -> None:
        await asyncio.sleep(0)
        loop_turned.set()

    report = Report()
    turning = asyncio.create_task(turn())
    await check_journal_running(report, tmp_path / "journal.db")
    await turning
    assert seen == [(True, True)]  # one quick check, made while the loop went on
    [check] = [c for c in report.checks if c.name == "journal"]  # beside it: the unit's
    assert check.verdict is Verdict.PASS
    assert "quick check ok" in check.detail
