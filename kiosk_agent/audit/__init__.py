"""The machine's own books: the EVA-DTS reader and writer, and the links that fetch an audit.

The API other parts use (``from kiosk_agent.audit import ...``): ``parse_audit`` (bytes or text
-> ``AuditFile``, or ``AuditError`` naming the line and field), ``render_audit`` (blocks -> a
complete file with its G85 and SE count), and the typed fields of an ``AuditFile``.
"""

from kiosk_agent.audit.crc import crc16_arc
from kiosk_agent.audit.evadts import (
    AuditError,
    AuditFile,
    CashIn,
    Cashless,
    CashOut,
    Currency,
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
    parse_audit,
    render_audit,
)

__all__ = [
    "AuditError",
    "AuditFile",
    "CashIn",
    "CashOut",
    "Cashless",
    "Currency",
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
    "parse_audit",
    "render_audit",
]
