"""Where a running demo's admin API is, for `health` and `events` on the demo's configuration,
and its simulator, for the service commands on it (`report`, `payments`, `terminals ping`,
`doctor`: the demo's sales and readers, not a simulator of their own that holds none).

The demo serves the field tech's status page and the admin API on 127.0.0.1 (a port the system
picks) with a token made for the run, and config/demo.yaml has no ``admin:`` section: a secret
is never written in a configuration. So that `kiosk-agent health -c config/demo.yaml` can ask
it, the demo writes its address and token beside its journal (``<journal>.admin``), readable by
its owner only (0600, made new each run, never a file another user left), while it runs, and
removes it when it ends. A reader trusts the file only when it is the user's own, no one else's
to read, and its demo still runs; else it says which of these is wrong. The token is never
logged, nor printed by the reader.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from kiosk_agent.cli.contract import EXIT_UNREACHABLE, EXIT_USAGE, CliError, program_command

SUFFIX = ".admin"


def demo_admin_path(journal: Path) -> Path:
    """The running demo's admin file: beside its journal, named after it."""
    return journal.with_name(journal.name + SUFFIX)


def write_demo_admin(
    path: Path, url: str, token: str, simulator: dict[str, Any] | None = None
) -> None:
    """Write the demo's address and token, readable by the owner only: any file of that name
    is removed first (a stale one, or one another made), and the new one is made 0600 by this
    process (O_EXCL: never opened through a link someone left). ``simulator``: the demo's
    simulator's READY information, so the service commands on its configuration ask the
    simulator that holds its sales (``running_demo_simulator``)."""
    path.unlink(missing_ok=True)
    found: dict[str, Any] = {"url": url, "token": token, "pid": os.getpid()}
    if simulator is not None:
        found["simulator"] = simulator
    started = _started(os.getpid())
    if started is not None:  # a process id reused after a kill -9 is not this demo
        found["started"] = started
    body = json.dumps(found).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                 0o600)
    try:
        os.write(fd, body)
    finally:
        os.close(fd)


def remove_demo_admin(path: Path) -> None:
    """Remove the file this process wrote (not one a later demo wrote over it)."""
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def running_demo(config: Any, config_path: str) -> tuple[str, str] | None:
    """The admin API of the demo running on ``config`` (one without an ``admin:`` section):
    its address and token; None when no demo wrote its file; a CliError when the file is not
    to be trusted or its demo no longer runs."""
    path = _demo_file(config)
    return None if path is None else read_demo_admin(path, config_path)


def running_demo_simulator(config: Any, config_path: str) -> dict[str, Any] | None:
    """The READY information of the simulator of the demo running on ``config``: None where no
    demo runs on it (or its file is not to be trusted, or names none): the service commands
    then start one of their own, as before."""
    path = _demo_file(config)
    if path is None:
        return None
    try:
        found = _read_trusted(path, config_path)
    except CliError:
        return None
    simulator = found.get("simulator")
    if not isinstance(simulator, dict) or not isinstance(simulator.get("base_url"), str):
        return None
    return {**simulator, "pid": found["pid"]}


def demo_admin_of(config: Any) -> Path:
    """Where a demo on ``config`` writes its file: beside the configuration's journal."""
    return demo_admin_path(Path(config.resolve(config["journal"]["path"])))


def _demo_file(config: Any) -> Path | None:
    """The admin file of a demo on ``config`` (beside its journal), or None where none is."""
    path = demo_admin_of(config)
    return path if os.path.lexists(path) else None


def read_demo_admin(path: Path, config_path: str) -> tuple[str, str]:
    """The running demo's address and token; a CliError saying what is wrong otherwise."""
    found = _read_trusted(path, config_path)
    return str(found["url"]), str(found["token"])


def _read_trusted(path: Path, config_path: str) -> dict[str, Any]:
    """The running demo's file as it wrote it; a CliError saying what is wrong otherwise. The
    file is opened once, never through a link (O_NOFOLLOW), and what is checked is what is
    read (its descriptor's own status), not a name another could change in between."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except FileNotFoundError:
        raise CliError(
            f"{config_path} has no admin: section, and no demo is running on it: a demo "
            f"serves its admin API while it runs ({path} names it then)",
            EXIT_UNREACHABLE,
            [f"start it: `{_program()} demo -c {config_path}`, then ask again"],
        ) from None
    except OSError as err:
        if err.errno != errno.ELOOP:  # a link in its place is refused below, as not the demo's
            raise CliError(f"{path}: {err.strerror}", EXIT_USAGE) from None
        fd = None
    try:
        info = None if fd is None else os.fstat(fd)
        if (info is None or not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid()
                or info.st_mode & 0o077):
            raise CliError(
                f"{path} is not the demo's (not a file of yours readable by you alone): not "
                "trusted, its token not used",
                EXIT_USAGE,
                [f"remove it (`rm {path}`); the next demo run writes its own"],
            )
        try:
            found: Any = json.loads(os.read(fd, 65536).decode("utf-8")) if fd is not None else {}
            url, pid, _token = str(found["url"]), int(found["pid"]), str(found["token"])
            started = found.get("started")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise CliError(f"{path} is not a demo's admin file", EXIT_USAGE) from None
    finally:
        if fd is not None:
            os.close(fd)
    if not _running(pid) or (started is not None and _started(pid) not in (None, started)):
        raise CliError(
            f"the demo that served {url} (process {pid}) is no longer running",
            EXIT_UNREACHABLE,
            [f"start it: `{_program()} demo -c {config_path}`, then ask again"],
        )
    written: dict[str, Any] = found  # a dict: its keys were read above
    return written


def _program() -> str:
    """kiosk-agent as this command was started (`.venv/bin/kiosk-agent` from a checkout)."""
    return program_command(sys.argv[0])


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, Linux's /proc), or None where it
    cannot be read: with the process id, it names one process, not a later one given its id."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as proc:
            fields = proc.read().rsplit(")", 1)[1].split()
        return fields[19]  # starttime, the 22nd field (the 3rd follows the command's name)
    except (OSError, IndexError):
        return None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: the file's owner check already refused
    return True
