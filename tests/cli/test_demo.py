"""`kiosk-agent demo` as a real process: simulator, virtual machine and agent, clean end.

Each demo run is a process of its own, forked from the test process's warm interpreter
(crash_driver.WarmCommands, as AgentProcess's agents are): its own pid, environment, signals and
output, its imports done once for the test process rather than in a cold interpreter each run
(about 0.3 s of CPU of a run's 0.65)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

from kiosk_agent.cli import main
from kiosk_agent.cli.demo import program_command
from kiosk_agent.health.availability import TerminalState
from kiosk_agent.sales.states import SaleState

from ..assembly.crash_driver import WarmCommand, WarmCommands
from ..helpers import until

DEMO_CONFIG = Path(__file__).parents[2] / "config" / "demo.yaml"
REPO = Path(__file__).parents[2]
MAIN = str(REPO / "kiosk_agent" / "__main__.py")  # sys.argv[0] of `python -m kiosk_agent`


@pytest.fixture(autouse=True)
def demo_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The demo keeps its journal under ~/.local/state: a home of the test's own."""
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def _env() -> dict[str, str]:
    return dict(os.environ)


async def _start_demo(
    *args: str, out: Path, err: Path, env: dict[str, str] | None = None
) -> WarmCommand:
    """``python -m kiosk_agent demo ARGS...`` started from the checkout's top, its standard
    output in ``out`` (a file, or a terminal's ``/dev/pts/N``), its standard error in ``err``."""
    commands = await asyncio.to_thread(WarmCommands.shared)
    return await asyncio.to_thread(
        commands.start, ["demo", *args], env or _env(), err, stdout=out, cwd=REPO, argv0=MAIN
    )


def _said(out: Path) -> str:
    """What the demo has written so far (nothing before it opened its output)."""
    return out.read_text() if out.exists() else ""


async def _demo(*args: str, home: Path, within: float = 60.0) -> tuple[int, str, str]:
    """A whole demo run: its exit code, standard output and standard error (``within``: a
    hang's guard)."""
    run = len(list(home.glob("demo*.out")))  # the home's runs so far: each its own files
    out, err = home / f"demo{run}.out", home / f"demo{run}.err"
    proc = await _start_demo(*args, out=out, err=err)
    async with asyncio.timeout(within):
        code = await proc.wait()
    return code, out.read_text(), err.read_text()


async def test_demo_runs_sales_ends_by_itself_and_the_next_run_after_its_duration(
    demo_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two demo runs in one home, one after the other, for what three tests proved with four:
    ``--sales 4`` ends by itself after 4 sales, says where its sales stay, and they can be
    looked at afterwards; then ``--duration 1.5`` ends by itself after its duration, on a
    journal of its own (the first run's deleted on purpose, not reported as lost)."""
    code, out, err = await _demo("--sales", "4", "--speed", "5", home=demo_home)
    assert code == 0, err
    assert "\x1b[" not in out, "plain lines when stdout is not a terminal"
    assert re.search(r"customer #1 selects \w+ \(\$\d+\.\d\d\)", out)
    assert "present a card" in out
    assert "stopping: a sale under way is finished or its money given back" in out
    summary = out.strip().splitlines()[-1]
    counted = re.match(
        r"demo ended after [\d.]+s: (\d+) sales, .*captured \$\d+\.\d\d"
        r"(?:; (\d+) card sessions? ended with no selection, \$0\.00 kept)?$", summary
    )
    assert counted, summary
    # every sale that ended is shown and counted, also one that ended while the agent stopped
    finals = re.findall(r"(COMPLETED|DECLINED|REVERSED|CANCELLED|FAILED|ATTENTION):", out)
    assert len(finals) == int(counted.group(1)) == 4  # --sales 4 stops after 4, not 5
    # the journal holds what the summary says, by the same rule (sales.kinds)
    # the view's lines ("... with no selection (cancelled, $0.00 kept)"), not the summary's own
    # "1 card session ended with no selection, $0.00 kept"
    apart = out.count("card session ended with no selection (")
    assert int(counted.group(2) or 0) == apart, out  # the lines, to tell which session
    assert len(_sales_listed(capsys)) == 4
    assert len(_sales_listed(capsys, "--kind", "no_selection")) == apart
    assert "Traceback" not in err
    # the banner says where the simulator listens and how to stop
    assert re.search(r"simulator listening on http://127\.0\.0\.1:\d+; Ctrl-C stops the demo", out)
    assert "present a card (present a card" not in out  # each step said once
    # the machine's books, read over its DEX port at the end (docs/audit.md): the virtual
    # machine is honest, so no interval it compared is a mismatch (on a loaded machine the
    # first read may have met the first customer: no boundary then, nothing compared)
    assert "reading the books of snacks (DEX)" in out
    assert "5 columns" in out
    assert "last read: 20" in out
    assert "MISMATCH" not in out
    # where its sales stay, and how to look at them: as this test started the demo (python -m
    # kiosk_agent), a hint that runs as pasted
    journal = demo_home / ".local" / "state" / "kiosk-agent" / "demo-journal.db"
    hint = f"{program_command(MAIN)} sales -c config/demo.yaml"
    assert hint.endswith("python -m kiosk_agent sales -c config/demo.yaml"), hint
    assert f"sales journal: {journal} (kept after the demo: {hint})" in out
    assert f"the demo's sales stay in {journal}: {hint}" in out

    # the next run, ended by its duration, starts a journal of its own
    code, out, err = await _demo("--duration", "1.5", "--speed", "5", home=demo_home)
    assert code == 0, err
    _ended_after_its_duration(out, 1.5)
    # the journal it deleted on purpose is not reported as a lost one
    assert "missing" not in out + err, out + err
    listed = int(out.strip().splitlines()[-1].split(": ", 1)[1].split()[0])
    assert len(_sales_listed(capsys)) == listed  # its own sales only, none of the first 4


def test_the_hint_names_the_program_as_it_was_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`./dev demo` runs .venv/bin/kiosk-agent; its hint said `kiosk-agent sales ...`, which
    is "command not found" where the venv is not on $PATH."""
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    program = venv_bin / "kiosk-agent"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    (venv_bin / "python").symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert program_command(".venv/bin/kiosk-agent") == ".venv/bin/kiosk-agent"
    assert program_command(str(program)) == ".venv/bin/kiosk-agent"
    # python -m kiosk_agent: the interpreter as named, not the file its link points to
    main = "/somewhere/kiosk_agent/__main__.py"
    assert program_command(main, str(venv_bin / "python")) == ".venv/bin/python -m kiosk_agent"
    # on $PATH (an activated venv, a system install): the bare name runs it
    monkeypatch.setenv("PATH", f"{venv_bin}:/usr/bin:/bin")
    assert program_command(str(program)) == "kiosk-agent"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not under the current directory: the whole path
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert program_command(str(program)) == str(program)


def _sales_listed(capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict[str, object]]:
    """`kiosk-agent sales -c config/demo.yaml --json`, in this process (the demo, which wrote
    the journal, is the real process; $HOME is the test's, so ~ is the same place)."""
    capsys.readouterr()
    assert main(["sales", "-c", str(DEMO_CONFIG), "--json", *extra]) == 0
    listed: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return listed


def _ended_after_its_duration(out: str, duration: float) -> None:
    """The duration ended the demo by itself (the caller's 60 s is a hang's guard), and its stop
    ended the sale under way rather than waiting out sales.stop_timeout (30 s) and parking it.
    A bound of 15 s on the whole process, interpreter and start included, failed at load
    11-15."""
    summary = out.strip().splitlines()[-1]
    ended = re.fullmatch(r"demo ended after ([\d.]+)s: \d+ sales?((?:, \d+ \w+)*); .*", summary)
    assert ended, summary
    assert float(ended.group(1)) >= duration  # not before its duration
    # as the journal holds them: every sale ended, none parked in a state of its way
    states = [SaleState(state) for state in re.findall(r", \d+ (\w+)", ended.group(2))]
    assert all(state.final for state in states), summary


def test_demo_with_a_broken_config_names_the_mistake(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "demo.yaml"
    broken.write_text(
        "service: {simulator: {time_scale: 10}}\n"
        "terminals: [{device_id: SIM-0001}]\n"
        "triggers:\n  - platform: virtual\n    fail_rate: lots\n"
    )
    # in this process: the demo never starts (the real demo process is tested above)
    assert main(["demo", "--config", str(broken), "--sales", "1"]) == 2  # exit 2 everywhere
    assert "fail_rate" in capsys.readouterr().err


async def _on_a_terminal(env: dict[str, str]) -> tuple[int, str]:
    """A ``--sales 2`` demo with its standard output on a pseudo-terminal: its exit code and
    what it drew there."""
    master, slave = os.openpty()
    os.set_blocking(master, False)
    chunks: list[bytes] = []

    def drain() -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # nothing more for now; EIO: closed
            while data := os.read(master, 65536):
                chunks.append(data)

    loop = asyncio.get_running_loop()
    loop.add_reader(master, drain)
    proc = None
    try:
        # the demo opens the terminal by its name; this end stays open until it has ended
        proc = await _start_demo("--sales", "2", "--speed", "5", out=Path(os.ttyname(slave)),
                                 err=Path(os.environ["HOME"], "demo.err"), env=env)  # fmt: skip
        async with asyncio.timeout(60):  # a hang's guard
            code = await proc.wait()
        drain()
    finally:
        loop.remove_reader(master)
        os.close(slave)
        os.close(master)
        if proc is not None and proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
    return code, b"".join(chunks).decode(errors="replace")


async def test_demo_on_a_terminal_draws_colours_and_a_running_total() -> None:
    code, screen = await _on_a_terminal({**_env(), "TERM": "xterm"})
    assert code == 0
    assert "\x1b[1m" in screen  # the bold running total line
    assert "total: " in screen
    assert "demo ended after" in screen


async def test_demo_with_no_color_keeps_the_running_total_without_colours() -> None:
    code, screen = await _on_a_terminal({**_env(), "NO_COLOR": "1"})
    assert code == 0
    assert "total: " in screen
    assert "\x1b[3" not in screen  # no colour codes
    assert "\x1b[1m" not in screen


def test_demo_help_is_plain_text(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # as wide as a piped process's help
    with pytest.raises(SystemExit) as done:
        main(["demo", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out
    assert "config/demo.yaml" in out


async def test_demo_serves_its_status_page_and_ends_cleanly_on_ctrl_c(demo_home: Path) -> None:
    """One demo run (a real process) for two promises: its banner names a status page that
    answers and takes the token it prints, and Ctrl-C mid-customer ends it with its summary,
    exit 0 and no traceback."""
    import aiohttp

    out, err = demo_home / "demo.out", demo_home / "demo.err"
    proc = await _start_demo("--speed", "5", out=out, err=err)
    try:
        await until(lambda: "status page: " in _said(out), 30)
        found = re.search(
            r"status page: (http://127\.0\.0\.1:\d+)/ \(log in with (\S+), a token made for "
            r"this demo run\)", out.read_text(),
        )  # fmt: skip
        assert found, "the demo names its status page"
        url, token = found.groups()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async with http.get(url + "/") as page:
                assert "text/html" in page.headers["Content-Type"]
            async with http.post(url + "/session", json={"token": token},
                                 headers={"Origin": url}) as answer:  # fmt: skip
                assert (await answer.json())["role"] == "admin"
        # until the machine has a customer
        await until(lambda: "selects" in _said(out), 30)
        os.kill(proc.pid, signal.SIGINT)
        async with asyncio.timeout(30):
            code = await proc.wait()
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
    assert code == 0, err.read_text()
    assert out.read_text().strip().splitlines()[-1].startswith("demo ended after")
    assert "Traceback" not in err.read_text()


def test_the_demos_lines_say_their_time_in_utc_as_the_status_page_it_announces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: the live view stamped its lines in the machine's zone, unlabelled, beside the
    status page (and every other command) writing UTC."""

    from kiosk_agent.cli.demo import LiveView

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        out = io.StringIO()
        LiveView(out, fancy=False).note("simulator listening")
        line = out.getvalue()
        now = time.gmtime()
    finally:
        monkeypatch.undo()  # the zone this process had
        time.tzset()
    stamp = line.split()[0]
    assert re.fullmatch(r"\d\d:\d\d:\d\dZ", stamp), line
    shown = int(stamp[:2]) * 60 + int(stamp[3:5])
    assert abs(shown - (now.tm_hour * 60 + now.tm_min)) % (24 * 60) in (0, 1, 1439)



READING = "journal: reading its file whole before money moves on it"


def _view_lines(states: list[TerminalState]) -> list[str]:
    from kiosk_agent.cli.demo import LiveView

    out = io.StringIO()
    view = LiveView(out, fancy=False)
    for state in states:
        view.availability(state)
    return [line.split(" ", 2)[2] for line in out.getvalue().splitlines()]  # no stamp, source


def test_the_demo_says_a_terminal_waiting_for_the_start_is_starting_in_healths_words() -> None:
    """Before: the live view said OUT OF SERVICE for a terminal that was only starting, and
    then "back in service ... again" for the end of a start, where `kiosk-agent health` said
    STARTING since ...."""
    from kiosk_agent.cli.fleet import format_health

    waiting = TerminalState("SIM-0001", False, READING, 0.0, starting=True)
    started = TerminalState("SIM-0001", True, "", 60.0)
    shown, taking = _view_lines([waiting, started])
    health = format_health({"status": "ok", "service": {"reachable": True}, "problems": [],
                            "availability": [waiting.as_dict()]})
    [card] = [line for line in health.splitlines() if line.startswith("card:")]
    words = card.split("SIM-0001", 1)[1].strip()  # "STARTING since 00:00:00Z: journal: ..."
    assert words == f"STARTING since 00:00:00Z: {READING}"
    assert shown.startswith(words), shown
    assert "OUT OF SERVICE" not in shown
    assert taking == "in service: card readers enabled"  # a start ends; nothing came back


def test_the_demo_still_says_an_outage_is_one_and_its_end_a_return() -> None:
    waiting = TerminalState("SIM-0001", False, READING, 0.0, starting=True)
    started = TerminalState("SIM-0001", True, "", 60.0)
    out = TerminalState("SIM-0001", False, "terminal offline", 120.0)
    back = TerminalState("SIM-0001", True, "", 130.0)
    lines = _view_lines([waiting, started, out, back])
    assert lines[2].startswith("OUT OF SERVICE since 00:02:00Z: terminal offline; the reader "
                               "steps aside"), lines
    assert lines[3] == "back in service: card readers enabled again"
    # a start that became an outage (a new reason once the readers were on) ends as one
    became = TerminalState("SIM-0001", False, "service unreachable: timed out", 70.0)
    assert _view_lines([waiting, became, back])[2] == "back in service: card readers enabled again"


async def test_the_demo_shows_a_terminal_still_starting_when_its_view_begins() -> None:
    """The view follows the agent's decider after the agent's start: a terminal still
    starting then is shown so, and its first change reads as the start's end."""
    from kiosk_agent.cli.demo import LiveView, Outage
    from kiosk_agent.health.availability import Availability
    from kiosk_agent.health.model import Health

    health = Health("1")
    health.report_service(True)
    health.report_terminal("SIM-0001", online=True)
    availability = Availability(health, ["SIM-0001"], starting=True)
    health.report_journal_state(file_checking=True)
    availability.evaluate(at_start=True)
    availability.readers_started()  # the file check outlasts the start of the readers
    out = io.StringIO()
    outage = Outage("http://127.0.0.1:9", "SIM-0001", LiveView(out, fancy=False))
    async with outage:
        outage.follow(availability, after=None)
        await until(lambda: "STARTING" in out.getvalue())
        health.report_journal_state(file_checking=False)
        availability.evaluate()
        await until(lambda: "card readers enabled" in out.getvalue())
    starting, started = out.getvalue().splitlines()
    assert "SIM-0001 STARTING since " in starting
    assert starting.endswith(
        f"{READING}; the reader waits for the agent's start, the machine sells for cash")
    assert started.endswith("SIM-0001 in service: card readers enabled")


def _demo_admin_file(home: Path) -> Path:
    return home / ".local" / "state" / "kiosk-agent" / "demo-journal.db.admin"


async def _health(home: Path, command: str = "health") -> tuple[int, str, str]:
    """`kiosk-agent health -c config/demo.yaml --json` (or another command) as a field tech
    runs it: a process."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kiosk_agent", *command.split(), "-c", str(DEMO_CONFIG), "--json",
        cwd=REPO, env={**_env(), "HOME": str(home)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_health_on_the_demos_configuration_asks_the_running_demo(demo_home: Path) -> None:
    """config/demo.yaml has no admin: section (no token in a config file): before, `health -c
    config/demo.yaml` said "the agent serves no admin API" while the demo served one. The demo
    writes its address and token beside its journal, 0600, while it runs; health asks it, and
    what it says of today's sales is what the journal holds; once the demo ended, health says
    no demo is running (exit 4), and the file is gone."""
    from kiosk_agent.sales.journal import Journal

    out, err = demo_home / "demo.out", demo_home / "demo.err"
    proc = await _start_demo("--speed", "5", out=out, err=err)
    admin_file = _demo_admin_file(demo_home)
    try:
        await until(lambda: "status page: " in _said(out), 30)
        await until(lambda: " completed" in _said(out) or "captured" in _said(out), 30)
        assert stat.S_IMODE(admin_file.stat().st_mode) == 0o600
        token = json.loads(admin_file.read_text())["token"]
        assert token in _said(out)  # the token the demo shows to log in with
        journal = Journal(admin_file.with_name("demo-journal.db"))
        journal.open()
        try:
            before = journal.today()
            code, said, complaint = await _health(demo_home)
            after = journal.today()
        finally:
            journal.close()
        assert code in (0, 1), complaint  # answered: ok, or degraded with its problems
        assert token not in said + complaint  # never printed by health
        sales = json.loads(said)["sales"]
        assert before[0] <= sales["today_count"] <= after[0]
        assert before[1] <= sales["today_amount_cents"] <= after[1]
        # the readers, as the demo's agent has them from its simulator (before: exit 4, "no
        # admin: section to ask its agent"; no second simulator is started for the command)
        code, said, complaint = await _health(demo_home, "terminals list")
        assert code == 0, complaint
        assert {"SIM-0007", "SIM-0008"} <= {t["device_id"] for t in json.loads(said)}
        os.kill(proc.pid, signal.SIGINT)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0, err.read_text()
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
    assert not admin_file.exists()
    code, said, complaint = await _health(demo_home)
    assert code == 4
    assert "no demo is running" in said + complaint


@pytest.mark.parametrize(("mode", "pid", "code", "said"), [
    (0o644, None, 2, "not trusted"),  # readable by others: its token is not used
    (0o600, 2**22 + 1, 4, "is no longer running"),  # a demo killed, its file left
])
def test_health_trusts_a_demos_file_only_when_it_is_its_own_and_running(
    demo_home: Path, capsys: pytest.CaptureFixture[str], mode: int, pid: int | None, code: int,
    said: str,
) -> None:
    admin_file = _demo_admin_file(demo_home)
    admin_file.parent.mkdir(parents=True)
    admin_file.write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "t0ken-s3cret",
                                      "pid": pid or os.getpid()}))
    admin_file.chmod(mode)
    assert main(["health", "-c", str(DEMO_CONFIG)]) == code
    shown = capsys.readouterr()
    assert said in shown.out + shown.err
    assert "t0ken-s3cret" not in shown.out + shown.err


def test_health_on_a_demos_file_whose_process_id_was_reused_says_the_demo_ended(
    demo_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A demo killed with -9 left its file, and its process id now names another process (this
    test's own, which serves no admin API). The file says when its demo's process started: a
    process started otherwise is not the demo, and health says the demo no longer runs and how
    to start it (exit 4), its token unused. Before, it asked the old address and gave the
    systemd hint of an agent installed as a service, which a demo is not."""
    admin_file = _demo_admin_file(demo_home)
    admin_file.parent.mkdir(parents=True)
    admin_file.write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "t0ken-s3cret",
                                      "pid": os.getpid(), "started": "1"}))
    admin_file.chmod(0o600)
    assert main(["health", "-c", str(DEMO_CONFIG)]) == 4
    shown = capsys.readouterr()
    said = shown.out + shown.err
    assert "is no longer running" in said, said
    assert "systemctl" not in said, said
    assert "t0ken-s3cret" not in said


def test_health_does_not_follow_a_link_in_place_of_the_demos_file(
    demo_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A link where the demo's file belongs (to a file of the user's own, 0600, that reads as a
    demo's) is not the demo's: not trusted, exit 2, its token unused."""
    admin_file = _demo_admin_file(demo_home)
    admin_file.parent.mkdir(parents=True)
    target = demo_home / "elsewhere"
    target.write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "t0ken-s3cret",
                                  "pid": os.getpid()}))
    target.chmod(0o600)
    admin_file.symlink_to(target)
    assert main(["health", "-c", str(DEMO_CONFIG)]) == 2
    shown = capsys.readouterr()
    assert "not trusted" in shown.out + shown.err
    assert "t0ken-s3cret" not in shown.out + shown.err


async def test_a_second_demo_beside_a_running_one_is_refused_as_run_is(demo_home: Path) -> None:
    """A newcomer starts the demo again in another terminal while the first runs: refused at
    once, naming the running demo, with `run`'s exit code for a journal another agent owns (5,
    the exit codes' one table; before: 1), and the running demo's journal and admin file left
    as they were."""
    out, err = demo_home / "demo.out", demo_home / "demo.err"
    proc = await _start_demo("--speed", "5", out=out, err=err)
    admin_file = _demo_admin_file(demo_home)
    try:
        await until(lambda: "status page: " in _said(out), 30)
        await until(lambda: " completed" in _said(out) or "captured" in _said(out), 30)
        journal = admin_file.with_name("demo-journal.db")
        inode = journal.stat().st_ino
        code, said, complaint = await _demo("--sales", "1", home=demo_home)
        assert code == 5, complaint
        assert f"is owned by another agent (pid {proc.pid}," in complaint
        assert "only one agent may run on a journal" in complaint
        assert "unexpected" not in complaint
        assert said == ""  # nothing of a demo was started
        assert journal.stat().st_ino == inode  # not made anew under the running demo
        assert admin_file.exists()
        os.kill(proc.pid, signal.SIGINT)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0, err.read_text()
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)


def test_a_demo_on_a_journal_of_its_own_that_it_cannot_have_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A demo with a configuration of one's own claims its journal as the agent starts: another
    agent holding it was "unexpected JournalOwned ... (please report this)", exit 1; a journal
    it cannot make was the same. Now `run`'s words and codes: 5 naming the holder, and 1 with
    the reason. In this process: the demo never starts."""
    from kiosk_agent.sales.owner import JournalLock

    journal = tmp_path / "own" / "journal.db"
    own = tmp_path / "demo.yaml"
    own.write_text(re.sub(r"(?m)^(\s*path:).*demo-journal\.db.*$", rf"\1 {journal}",
                          DEMO_CONFIG.read_text()))  # fmt: skip
    assert str(journal) in own.read_text()
    other = JournalLock(journal)  # another agent's claim: this process's, on its own descriptor
    other.acquire()
    try:
        assert main(["demo", "--config", str(own), "--sales", "1"]) == 5
    finally:
        other.release()
    said = capsys.readouterr().err
    assert f"the journal {journal} is owned by another agent (pid {os.getpid()}," in said
    assert "unexpected" not in said
    assert "please report" not in said
    assert not journal.exists()  # touched nothing

    (tmp_path / "a-file").write_text("")
    own.write_text(own.read_text().replace(str(journal), str(tmp_path / "a-file" / "j.db")))
    assert main(["demo", "--config", str(own), "--sales", "1"]) == 1
    said = capsys.readouterr().err
    assert "cannot claim the journal" in said
    assert "unexpected" not in said
    assert "please report" not in said


async def test_the_demos_books_line_tells_every_interval_of_the_run_a_refill_cut(
    demo_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo's snack machine with one of each product: its tech refills mid-run (reads the
    books first), so the run has two intervals or more. The closing lines give each with its
    verdict and their sums, the same as `kiosk-agent audit --since` the demo's start, and the
    sums are the journal's own sales of those intervals (summed as Decimal)."""
    from decimal import Decimal

    import yaml

    config = yaml.safe_load(DEMO_CONFIG.read_text())
    config["terminals"] = config["terminals"][:1]
    config["triggers"] = config["triggers"][:1]  # the snack machine alone
    config["triggers"][0]["products"] = {"A1": "1.50", "A2": "2.50"}
    config["dex"]["planogram"] = {"A1": 1, "A2": 1}  # sold out after two drops: the tech comes
    config["dex"]["low_stock"] = 0
    path = demo_home / "one-of-each.yaml"
    path.write_text(yaml.safe_dump(config))
    began = time.time()
    code, out, err = await _demo("-c", str(path), "--sales", "8", "--speed", "5",
                                 home=demo_home, within=120.0)
    assert code == 0, err
    assert "Traceback" not in err
    lines = [line.split(" demo ", 1)[-1] for line in out.splitlines()]
    head = next(n for n, line in enumerate(lines) if line.startswith("journal against"))
    intervals = []
    for line in lines[head + 1:]:
        if not line.startswith("  "):
            break
        intervals.append(line.strip())
    closing = lines[head + 1 + len(intervals)]
    assert len(intervals) >= 2, out  # the tech's read cut the run
    assert all("  match: " in line for line in intervals), intervals  # an honest machine
    assert closing.startswith(f"in all, {len(intervals)} intervals from "), closing
    assert closing.endswith(": every interval matches"), closing

    # the same story as `kiosk-agent audit --since` the demo's start tells it
    since = f"{int(began)}"
    capsys.readouterr()
    # (in a thread: the command runs its own event loop, as from a shell)
    command = ["audit", "-c", str(path), "--json", "--since", since]
    assert await asyncio.to_thread(main, command) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["in_all"]["text"] == closing
    assert len(document["intervals"]) == len(intervals)
    # against the journal's rows: each sale of an interval is a snack sale the journal holds,
    # completed, and the sums are theirs
    assert main(["sales", "-c", str(path), "--json", "--since", since]) == 0
    sales = {s["sale_id"]: s for s in json.loads(capsys.readouterr().out)}
    listed = [s["sale_id"] for c in document["intervals"] for s in c["sales"]]
    assert len(listed) == len(set(listed))
    assert all(sales[i]["source"] == "virtual:snacks" for i in listed)
    held = sum((Decimal(str(sales[i]["captured"])) for i in listed), Decimal(0))
    in_all = document["in_all"]
    assert Decimal(in_all["journal"]["value"]) / 100 == held
    assert in_all["journal"]["count"] == len(listed)
    assert in_all["machine"] == in_all["journal"]
    # every snack sale that captured money after the first interval began is in one of them
    first = document["intervals"][0]["since"]
    captured = [i for i, s in sales.items() if s["source"] == "virtual:snacks"
                and Decimal(str(s["captured"])) > 0 and s["created"] > first]
    assert set(captured) <= set(listed), (captured, listed)
