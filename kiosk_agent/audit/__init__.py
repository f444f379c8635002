"""The machine's own books: the EVA-DTS reader and writer, and the links that fetch an audit.

The API other parts use (``from kiosk_agent.audit import ...``, the shared contract's names):
``parse`` (bytes or text -> ``AuditFile``, or ``AuditError`` naming the line and field),
``render`` (blocks -> a complete file with its G85 and SE count), the typed fields of an
``AuditFile`` (``Counters`` of ``Tally`` pairs), and ``link.read_audit(port, "dex_ucs" | "ddcmp")``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kiosk_agent.audit.crc import crc16_arc
    from kiosk_agent.audit.evadts import (
        AuditError,
        AuditFile,
        CashIn,
        Cashless,
        CashOut,
        Counters,
        Device,
        DeviceSale,
        Event,
        EventCount,
        Machine,
        PriceListSale,
        Product,
        Reads,
        Segment,
        Tally,
        parse,
        parse_audit,
        render,
        render_audit,
    )

__all__ = [
    "AuditError",
    "AuditFile",
    "CashIn",
    "CashOut",
    "Cashless",
    "Counters",
    "Device",
    "DeviceSale",
    "Event",
    "EventCount",
    "Machine",
    "PriceListSale",
    "Product",
    "Reads",
    "Segment",
    "Tally",
    "crc16_arc",
    "parse",
    "parse_audit",
    "render",
    "render_audit",
]


def __getattr__(name: str) -> Any:
    """The contract's names, imported on their first use (PEP 562): a part that needs one
    module of the package (the ``dex:`` section's schema, which every command that reads a
    configuration checks) does not wait for the EVA-DTS reader's some twenty dataclasses,
    about a sixth of the imports of ``sales`` and ``check-config``."""
    if name == "crc16_arc":
        from kiosk_agent.audit.crc import crc16_arc

        return crc16_arc
    if name in __all__:
        from kiosk_agent.audit import evadts

        return getattr(evadts, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
