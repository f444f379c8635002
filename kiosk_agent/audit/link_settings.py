"""What a read of the machine's audit is told: the protocol, the line, the waits. Plain data, so
that checking the `dex:` section (``check-config``, every command reading a configuration) loads
neither the link, its codecs nor asyncio (``tests/cli/test_startup.py``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# The communication ids each side says at the first handshake (the `dex:` section's `comm_id`
# is the agent's; the virtual machine answers with its own)
AGENT_COMM_ID = "KIOSKAGENT"
MACHINE_COMM_ID = "VIRTUALVMC"
BAUDRATE = 9600  # DEX/UCS's and DDCMP's usual line speed
DEADLINE = 120.0  # seconds for the whole read (a 10 kB audit takes about 11 s)


class LinkProtocol(enum.StrEnum):
    DEX = "dex_ucs"  # DEX/UCS
    DDCMP = "ddcmp"  # DDCMP as EVA-DTS uses it (docs/audit-link.md)


@dataclass(frozen=True, slots=True)
class DexTimeouts:
    answer: float = 1.0  # a handshake answer or an acknowledgement
    block: float = 3.0  # the next data block (245 bytes take 0.26 s at 9600 baud)
    retries: int = 3  # each wait, and each block refused, this many times before the read ends


@dataclass(frozen=True, slots=True)
class LinkSettings:
    port: str
    protocol: LinkProtocol = LinkProtocol.DEX
    baudrate: int = BAUDRATE
    comm_id: str = AGENT_COMM_ID
    deadline: float = DEADLINE
    max_bytes: int = 2 << 20  # every byte heard, garbage included
    timeouts: DexTimeouts = field(default_factory=DexTimeouts)  # both protocols' waits
