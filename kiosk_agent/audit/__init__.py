"""The machine's own books: the EVA-DTS reader and writer, and the links that fetch an audit.

The API other parts use (``from kiosk_agent.audit import ...``, the shared contract's names):
``parse`` (bytes or text -> ``AuditFile``, or ``AuditError`` naming the line and field),
``render`` (blocks -> a complete file with its G85 and SE count), the typed fields of an
``AuditFile`` (``Counters`` of ``Tally`` pairs), and ``link.read_audit(port, "dex_ucs" | "ddcmp")``.
"""

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
