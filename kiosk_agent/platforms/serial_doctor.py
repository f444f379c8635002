"""The doctor's checks of the serial ports: each device there and this user may open it, no
other program beside the agent with it open, each ``socket://`` port answering (or, in the
running agent, its own link's state).

Beside the serial transport (``serial.py``) whose ports they check; ``doctor.py`` runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kiosk_agent.platforms.serial_ports import resolve_port, serial_ports_present
from kiosk_agent.service.errors import describe
from kiosk_agent.verdicts import Report, Verdict

if TYPE_CHECKING:
    from kiosk_agent.config.load import Config


def _serial_ports(config: Config) -> list[tuple[str, str, str]]:
    """(name, port, link name in health) of each trigger on a serial port: a serial platform's
    port is a device path or a URL (str); a kiosk_api port is an HTTP port (int)."""
    ports = [
        (t.get("name") or t["platform"], t["port"], f"{t['platform']}:{t.get('name') or ''}")
        for t in config.triggers
        if isinstance(t.get("port"), str) and t["port"]
    ]
    dex = _dex_port(config)
    if dex and not dex.startswith(_VIRTUAL_DEX):
        ports.append(("dex", dex, "dex"))  # the machine's audit port (docs/audit-link.md)
    return ports


# The virtual machine's own DEX pty (audit.component.VIRTUAL_PORT): made inside the agent.
_VIRTUAL_DEX = "virtual:"


def _dex_port(config: Config) -> str:
    section = config.get("dex")
    port = section.get("port") if isinstance(section, dict) else None
    return port if isinstance(port, str) else ""


def check_serial_ports(report: Report, config: Config) -> None:
    """Each serial device is present and this user may open it; a port given as a URL
    (``socket://host:port``) is :func:`check_port_urls`'."""
    ports = _serial_ports(config)
    dex = _dex_port(config)
    if dex.startswith(_VIRTUAL_DEX):
        report.add(
            "serial port dex", Verdict.SKIP,
            f"{dex}: the virtual machine's DEX port, made by the agent itself "
            "(kiosk-agent audit shows its reads)",
        )  # fmt: skip
    if not ports:
        report.add("serial ports", Verdict.SKIP, "no trigger uses a serial port")
        return
    for name, port, _ in ports:
        check = f"serial port {name}"
        if "://" in port:
            continue
        opened = resolve_port(port)  # a glob: its first match, as the transport opens it
        path = Path(opened or port)
        shown = port if opened in (None, port) else f"{port} ({opened})"
        if opened is None or not path.exists():
            present = serial_ports_present()
            report.add(
                check,
                Verdict.FAIL,
                f"{port} is not present",
                "plug the adapter in; list /dev/serial/by-id/ and use that stable name",
                [f"serial ports here: {', '.join(present)}" if present
                 else "serial ports here: none (no adapter is plugged in)"],
            )
        elif not os.access(path, os.R_OK | os.W_OK):
            report.add(
                check,
                Verdict.FAIL,
                f"{shown} exists but this user cannot open it",
                "add the service user to the dialout group (usermod -aG dialout USER)",
            )
        elif others := _programs_on(path):
            report.add(
                check, Verdict.WARN,
                f"{shown} present and accessible, but also open by {'; '.join(others)}: not "
                "an agent (no flock), opened before the agent took the port, so not refused: "
                "it reads what the reader sends and can write into the reader's session",
                "close that program (a tech's screen or minicom), then restart the agent; "
                "opened while the agent holds the port, it is refused",
            )  # fmt: skip
        else:
            report.add(check, Verdict.PASS, f"{shown} present and accessible")


def _programs_on(path: Path) -> list[str]:
    """The other processes with the port open that are not an agent holding it (its flock):
    a terminal program the hold (TIOCEXCL) could not refuse, having opened first. Looked for
    here, on demand, not at each connect of the link: a look through /proc/*/fd."""
    from kiosk_agent.lock_holders import holders, openers

    agents = set(holders(path, kind="FLOCK"))
    return [named for named in openers(path) if named not in agents]


# pyserial's URLs that name a TCP host and port (ser2net, an ESP-Link, the virtual machine's)
_TCP_SCHEMES = ("socket", "rfc2217")


async def check_port_urls(
    report: Report, config: Config, within: float, links: dict[str, Any] | None = None
) -> None:
    """A serial port given as ``socket://host:port`` answers: a TCP connection is made (a
    link down is a failure, not a skip). In the running agent (``links``: its health's links by
    name) the agent's own link says, since a second connection may be refused by, or take the
    port from, a bridge that serves one client (ser2net)."""
    for name, port, link_name in _serial_ports(config):
        if "://" not in port:
            continue
        check = f"serial port {name}"
        parts = urlsplit(port)
        if parts.scheme not in _TCP_SCHEMES or not parts.hostname or parts.port is None:
            report.add(check, Verdict.SKIP, f"{port}: no host and port to check")
            continue
        link = (links or {}).get(link_name)
        if link is not None:
            _link_verdict(report, check, port, link)
            continue
        try:
            async with asyncio.timeout(within):
                _, writer = await asyncio.open_connection(parts.hostname, parts.port)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        except (OSError, TimeoutError) as err:
            report.add(
                check, Verdict.FAIL, f"{port}: {describe(err)}",
                "start the serial bridge there (ser2net, or `kiosk-agent virtual --listen`) "
                "and check the host, the port and the network to it",
            )  # fmt: skip
        else:
            report.add(check, Verdict.PASS, f"{port} accepts connections")


def _link_verdict(report: Report, check: str, port: str, link: Any) -> None:
    if link.healthy:
        report.add(check, Verdict.PASS, f"{port}: the agent's link is {link.state}")
        return
    detail = f" ({link.detail})" if link.detail else ""
    report.add(
        check, Verdict.FAIL, f"{port}: the agent's link is {link.state}{detail}",
        "check the serial bridge there and the network to it; the agent reconnects by itself",
    )  # fmt: skip


