"""Receipts after a paid sale: printed on the terminal when it can print, mailed when an address
is known. A receipt is a courtesy: its failure is noted, never turned into a failed sale.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from kiosk_agent.data_class import data_class
from kiosk_agent.sales.defaults import EMAIL, PRINT  # the ``receipts:`` section's
from kiosk_agent.service.errors import ServiceError

if TYPE_CHECKING:
    from kiosk_agent.service.client import ServiceClient

_LOGGER = logging.getLogger(__name__)




@data_class(frozen=True, slots=True)
class ReceiptSettings:
    """``print``: auto (when the terminal's capabilities say it prints), always or never."""

    print: str = PRINT
    email: bool = EMAIL


async def send_receipts(
    service: ServiceClient,
    device_id: str,
    trans_id: str,
    email: str | None,
    settings: ReceiptSettings,
    can_print: Callable[[str], Awaitable[bool]] | None,
    printing: bool | None = None,
) -> list[str]:
    """Print and/or mail the receipt; return notes for the journal (never the address).

    ``printing``: whether it is printed on the terminal, when the caller decided already."""
    notes: list[str] = []
    if printing is None:
        printing = await prints_on_terminal(device_id, settings, can_print)
    if printing:
        print_call = service.terminal.print_receipt(device_id, trans_id)
        notes.append(await _note(print_call, "printed", trans_id))
    if settings.email and email:
        mailing = service.payments.send_receipt(trans_id, email)
        notes.append(await _note(mailing, "mailed", trans_id))
    return notes


async def _note(call: Awaitable[Any], done: str, trans_id: str) -> str:
    """Make one receipt call; the note says how it went."""
    try:
        await call
    except ServiceError as err:
        _LOGGER.warning("receipt for %s not %s: %s", trans_id, done, err)
        return f"receipt not {done}: {err}"
    return f"receipt {done}"


async def prints_on_terminal(
    device_id: str, settings: ReceiptSettings, can_print: Callable[[str], Awaitable[bool]] | None
) -> bool:
    """Whether a completed sale's receipt is printed on its terminal (a terminal call)."""
    if settings.print == "never":
        return False
    if settings.print == "always":
        return True
    if can_print is None:
        return False
    try:
        return await can_print(device_id)
    except ServiceError as err:
        _LOGGER.info("capabilities of %s unknown, not printing: %s", device_id, err)
        return False
