"""The terminal actions a person may ask for from afar: ping a reader, a test print. One
contract, used by the admin API's buttons (admin/server.py) and Home Assistant's (fleet/
commands.py). Neither moves money nor touches a sale.
"""

from __future__ import annotations

from typing import Any

from kiosk_agent.sales.states import SaleState


class ActionRefused(Exception):
    """The action cannot be done as asked: ``status`` and ``code`` for the admin API."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


async def ping_terminal(agent: Any, service: Any, device_id: str) -> Any:
    """Ping the reader; its answer goes into health at once (the page, the next report)."""
    answer = await service.terminal.ping(device_id)
    agent.health.report_terminal(
        device_id,
        online=answer.online,
        latency_ms=answer.latency_ms,
        pinged=True,
        detail="" if answer.online else "ping: terminal offline",
    )
    return answer


async def print_test_receipt(
    agent: Any, service: Any, device_id: str, trans_id: str | None = None
) -> str:
    """Print the receipt of ``trans_id`` (default: the last completed sale's) on the reader;
    returns the transaction printed."""
    listed = {t.device_id: t for t in await service.terminal.list()}
    if device_id not in listed:
        raise ActionRefused(404, "unknown_terminal",
                            f"the service lists no terminal {device_id!r}")
    if not listed[device_id].capabilities.receipt_printing:
        raise ActionRefused(400, "capability_unsupported",
                            f"terminal {device_id} cannot print receipts")
    trans_id = trans_id or last_trans_id(agent)
    if not trans_id:
        raise ActionRefused(409, "nothing_to_print",
                            'no sale with a transaction yet; send {"trans_id": ...}')
    await service.terminal.print_receipt(device_id, str(trans_id))
    return str(trans_id)


def last_trans_id(agent: Any) -> str | None:
    journal = getattr(agent, "journal", None)
    if journal is None:
        return None
    for record in journal.query(states=[SaleState.COMPLETED], limit=20):
        if record.trans_id:
            return str(record.trans_id)
    return None
