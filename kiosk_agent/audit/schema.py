"""The ``dex:`` section: which port the machine's audit is read from, how, and how often.

dex:
  port: /dev/serial/by-id/usb-FTDI_DEX-if00-port0   # or socket://host:port, or a glob
  protocol: dex_ucs      # DEX/UCS, or ddcmp
  baudrate: 9600
  comm_id: KIOSK00001    # our communication id in the handshake (10 characters)
  interval: 3600         # seconds between scheduled reads
  deadline: 120          # seconds one read may take, all told
"""

from __future__ import annotations

from typing import Any

import voluptuous as vol

from kiosk_agent.audit.link_settings import (
    AGENT_COMM_ID,
    BAUDRATE,
    DEADLINE,
    LinkProtocol,
    LinkSettings,
)
from kiosk_agent.audit.settings import BOOKS_KEYS
from kiosk_agent.config.load import register_section

DEX_SCHEMA = vol.Schema(
    {
        vol.Required("port"): vol.All(str, vol.Length(min=1, max=512)),
        vol.Optional("protocol", default=LinkProtocol.DEX.value): vol.In(
            [p.value for p in LinkProtocol]
        ),
        vol.Optional("baudrate", default=BAUDRATE): vol.In([1200, 2400, 4800, 9600, 19200, 38400]),
        vol.Optional("comm_id", default=AGENT_COMM_ID): vol.All(
            str, vol.Match(r"^[A-Za-z0-9]{1,10}$", msg="1 to 10 letters or digits")
        ),
        vol.Optional("deadline", default=DEADLINE): vol.All(
            vol.Coerce(float), vol.Range(min=5.0, max=3600.0)
        ),
        # the books' keys: whose sales, first read, back-off, planogram (audit/settings.py)
        **BOOKS_KEYS,
    }
)

register_section("dex", DEX_SCHEMA)


def link_settings(section: dict[str, Any], *, port: str | None = None) -> LinkSettings:
    """The link as the validated section says (``port`` given on the command line wins)."""
    return LinkSettings(
        port=port or section["port"],
        protocol=LinkProtocol(section["protocol"]),
        baudrate=section["baudrate"],
        comm_id=section["comm_id"],
        deadline=section["deadline"],
    )
