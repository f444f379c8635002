"""`kiosk-agent demo --outage`: the reader steps aside while its terminal is offline, then back."""

from __future__ import annotations

import subprocess

import pytest

from .test_demo import DEMO, _env


@pytest.mark.slow
def test_demo_shows_the_reader_stepping_aside_during_an_outage() -> None:
    done = subprocess.run(
        [*DEMO, "--duration", "16", "--outage", "1", "--speed", "2"],
        capture_output=True, text=True, timeout=90, env=_env(), check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    offline = out.index("SIM-0007 goes offline (simulator)")
    stepped_aside = out.index("SIM-0007 OUT OF SERVICE (terminal offline): the reader steps aside")
    online = out.index("SIM-0007 goes online (simulator)")
    back = out.index("SIM-0007 back in service: card readers enabled again")
    assert offline < stepped_aside < online < back
    assert "Traceback" not in done.stderr
