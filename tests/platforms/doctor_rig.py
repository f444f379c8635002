"""A configuration with a kiosk API (its port an HTTP port) and an MDB trigger on a serial port,
for the doctor's checks of serial ports (tests/platforms/test_serial_doctor.py) and the
``kiosk-agent doctor`` command (tests/test_doctor.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..helpers import endpoint_config


@pytest.fixture
def pty_port() -> Iterator[str]:
    """A real pty: the mdb trigger's serial port (present and accessible). Only the device's
    side (the master) is kept open: a program with the port's own side open is one the doctor
    warns of (a terminal program beside the agent)."""
    master, slave = os.openpty()
    name = os.ttyname(slave)
    os.close(slave)
    try:
        yield name
    finally:
        os.close(master)


def mixed_config(directory: Path, sim: Any, pty: str) -> Path:
    """One terminal; a kiosk API (its port is an HTTP port) and an mdb trigger on ``pty``."""
    path = endpoint_config(directory, sim, "  - device_id: SIM-0001", _triggers(pty))
    with (directory / "secrets.yaml").open("a") as secrets:
        secrets.write("kiosk_token: kiosk-token-0123456789\n")
    return path


def _triggers(pty: str) -> str:
    return f"""
triggers:
  - platform: kiosk_api
    name: screen
    token: !secret kiosk_token
    port: 8765
  - platform: mdb
    name: front
    port: {pty}
"""
