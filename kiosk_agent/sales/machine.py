"""The machine a journal was made on: what a cloned SD card cannot take with it.

``/etc/machine-id`` is written once per installation, so an SD card cloned to a hundred units
carries the same one everywhere; the hardware's own serial cannot be cloned (a Raspberry Pi's
in ``/proc/cpuinfo`` ``Serial`` or ``/sys/firmware/devicetree/base/serial-number``), nor the
MAC address of a physical network interface (one with a ``device`` in ``/sys/class/net``) where
there is no serial. Both are recorded; a journal found on a machine where either differs was
made elsewhere.

``KIOSK_MACHINE_ROOT`` (default ``/``) is the directory those paths are read under: tests point
it at a made-up machine, and an odd machine at a directory that holds what it lacks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

from kiosk_agent.data_class import data_class

MACHINE_ROOT_ENV = "KIOSK_MACHINE_ROOT"
_MACHINE_ID = "etc/machine-id"
_CPUINFO = "proc/cpuinfo"
_DEVICETREE_SERIAL = "sys/firmware/devicetree/base/serial-number"
_NET = "sys/class/net"
_SERIAL_LINE = re.compile(r"^Serial\s*:\s*([0-9A-Za-z]+)\s*$", re.MULTILINE)
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_MAX_TEXT = 200


@data_class(frozen=True, slots=True)
class Machine:
    """``machine_id`` and ``hardware`` (``serial:...`` or ``mac:...``); empty: not found.
    ``journal``: where the journal was made (a copy at another place on the same machine, a
    second agent's, must not take the first one's id)."""

    machine_id: str = ""
    hardware: str = ""
    journal: str = ""

    def at(self, journal: Path) -> Machine:
        """This machine, holding the journal at ``journal``."""
        return dataclasses.replace(self, journal=str(journal.parent.resolve() / journal.name))

    def describe(self) -> str:
        parts = [f"machine-id {self.machine_id[:12]}" if self.machine_id else "no machine-id"]
        if self.hardware:
            parts.append(self.hardware.replace(":", " ", 1))
        return ", ".join(parts)

    def differs(self, now: Machine) -> str:
        """What tells this machine (recorded) from ``now``; empty when nothing does. A value
        recorded but not found now differs too: it cannot be shown to be the same machine."""
        found = []
        if self.machine_id and self.machine_id != now.machine_id:
            found.append(f"machine-id {self.machine_id[:12]}, here "
                         f"{now.machine_id[:12] or 'none'}")
        if self.hardware and self.hardware != now.hardware:
            found.append(f"{self.hardware}, here {now.hardware or 'none'}")
        if not found and self.journal and now.journal and self.journal != now.journal:
            found.append(f"made at {self.journal}, copied to {now.journal}")
        return "; ".join(found)

    def to_text(self) -> str:
        return json.dumps({"machine_id": self.machine_id, "hardware": self.hardware,
                           "journal": self.journal}, sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> Machine:
        try:
            data = json.loads(text)
            return cls(str(data.get("machine_id", ""))[:_MAX_TEXT],
                       str(data.get("hardware", ""))[:_MAX_TEXT],
                       str(data.get("journal", ""))[:4096])
        except (ValueError, AttributeError):
            return cls()


def machine_root() -> Path:
    return Path(os.environ.get(MACHINE_ROOT_ENV) or "/")


def this_machine(root: Path | None = None) -> Machine:
    """The machine the process runs on (read under ``root``, else ``$KIOSK_MACHINE_ROOT``)."""
    base = root if root is not None else machine_root()
    return Machine(_read(base / _MACHINE_ID).lower(), _hardware(base))


def _hardware(base: Path) -> str:
    serial = _SERIAL_LINE.search(_read(base / _CPUINFO, 65536))
    if serial and serial.group(1).strip("0"):
        return f"serial:{serial.group(1).lower()}"
    tree = _read(base / _DEVICETREE_SERIAL).strip("\x00").strip()
    if tree and tree.isalnum():
        return f"serial:{tree.lower()}"
    mac = _physical_mac(base / _NET)
    return f"mac:{mac}" if mac else ""


def _physical_mac(net: Path) -> str:
    """The MAC of the first physical interface by name (virtual ones have no ``device``)."""
    try:
        names = sorted(p.name for p in net.iterdir())
    except OSError:
        return ""
    for name in names:
        if not (net / name / "device").exists():
            continue
        mac = _read(net / name / "address").lower()
        if _MAC.match(mac) and mac != "00:00:00:00:00:00":
            return mac
    return ""


def _read(path: Path, limit: int = 4096) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read(limit).strip()
    except OSError:
        return ""
