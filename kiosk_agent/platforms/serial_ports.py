"""Where a serial port is: the port a configuration names resolved as the serial transport opens
it (a glob to its first match), the ports this machine has, and the serial links' defaults.
Light (no pyserial, no asyncio): the transport (``serial.py``), the doctor's check
(``serial_doctor.py``), the platforms' schemas and ``check-config``'s warnings all take it from
here.
"""

from __future__ import annotations

import glob

_GLOB_CHARS = frozenset("*?[")

# The serial platforms' shared defaults, written once (tests/config/test_defaults.py)
BAUDRATE = 115200  # the MDB adapters' speed (a plain serial line has its own: serial_line.py)
RECONNECT_MAX = 30.0  # the reconnect back-off's cap, seconds
LINE_END = "\n"


def resolve_port(port: str) -> str | None:
    """The port to open now: URLs as given, globs to their first match, paths as configured.

    Paths are kept as written (a by-id symlink is reopened through the link each time, so an adapter
    that comes back as ttyUSB1 instead of ttyUSB0 is found again).
    """
    if "://" in port:
        return port
    if _GLOB_CHARS & set(port):
        matches = sorted(glob.glob(port))
        return matches[0] if matches else None
    return port


# Where serial adapters appear on Linux: the stable names first, then the kernel's.
SERIAL_PORT_PATTERNS = ("/dev/serial/by-id/*", "/dev/ttyUSB*", "/dev/ttyACM*", "/dev/ttyAMA*",
                        "/dev/ttyS[0-3]")


def serial_ports_present(patterns: tuple[str, ...] = SERIAL_PORT_PATTERNS) -> list[str]:
    """The serial ports that exist on this machine (at most 12 named, stable names first)."""
    found = [p for pattern in patterns for p in sorted(glob.glob(pattern))]
    return found[:12] + ([f"... {len(found) - 12} more"] if len(found) > 12 else [])


def port_holder(port: str) -> str:
    """Who holds ``port`` (a device node another process has ``flock``ed, as the serial link
    does; else each that has it open, as a program that set ``TIOCEXCL`` without ``flock``):
    ``pid 812: /opt/.../python -m kiosk_agent run -c ...``, or ``another process`` where that
    cannot be read (another user's process in a namespace this one cannot see)."""
    from kiosk_agent.lock_holders import describe, holders, openers

    return describe(holders(port, kind="FLOCK") or openers(port))
