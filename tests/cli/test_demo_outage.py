"""`kiosk-agent demo --outage`: the reader steps aside while its terminal is offline, then back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .test_demo import _demo, _env, demo_home  # noqa: F401 - its own home (tmp_path)

# A cold `python -m kiosk_agent demo`, for the run that needs a terminal of its own to control
# (its keys and its Ctrl-C come through it): a warm fork has none.
DEMO = [sys.executable, "-m", "kiosk_agent", "demo"]


@pytest.mark.slow(seconds=17)
async def test_demo_shows_the_reader_stepping_aside_during_an_outage(tmp_path: Path) -> None:
    code, out, err = await _demo(
        "--duration", "16", "--outage", "1", "--speed", "2", home=tmp_path, within=90
    )
    assert code == 0, err
    offline = out.index("SIM-0007 goes offline (simulator)")
    stepped_aside = out.index("SIM-0007 OUT OF SERVICE since ")  # in `kiosk-agent health`'s words
    assert out.index("terminal offline; the reader steps aside", stepped_aside) < out.index(
        "SIM-0007 goes online (simulator)")
    online = out.index("SIM-0007 goes online (simulator)")
    back = out.index("SIM-0007 back in service: card readers enabled again")
    assert offline < stepped_aside < online < back
    assert "Traceback" not in err


def test_ctrl_c_after_taking_a_reader_offline_ends_within_two_seconds() -> None:
    """On a terminal: `o` takes the reader offline, a customer waits at the machine for it to
    come back; Ctrl-C must not wait for that customer (it waited 10 s in silence before)."""
    import os
    import pty
    import select
    import time

    pid, fd = pty.fork()
    if pid == 0:  # the child: the demo on a pseudo-terminal, as a person runs it
        os.execvpe(DEMO[0], [*DEMO, "--speed", "5"], {**_env(), "TERM": "xterm"})  # noqa: S606
    seen = b""

    def read_for(seconds: float) -> None:
        nonlocal seen
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if select.select([fd], [], [], 0.05)[0]:
                try:
                    seen += os.read(fd, 65536)
                except OSError:
                    return

    try:
        deadline = time.monotonic() + 30
        while b"press o to take" not in seen and time.monotonic() < deadline:
            read_for(0.2)
        assert b"press o to take" in seen, seen[-2000:]
        os.write(fd, b"o")
        while b"OUT OF SERVICE" not in seen and time.monotonic() < deadline:
            read_for(0.2)
        assert b"OUT OF SERVICE" in seen, seen[-2000:]
        read_for(1.0)  # a customer comes and waits for the reader
        os.write(fd, b"\x03")  # Ctrl-C, through the terminal
        began = time.monotonic()
        status = None
        while time.monotonic() - began < 15:
            read_for(0.05)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
        took = time.monotonic() - began
    finally:
        if status is None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)
    assert status is not None
    assert os.waitstatus_to_exitcode(status) == 0
    assert took < 2.0, f"Ctrl-C took {took:.1f} s"
    assert b"demo ended after" in seen
