"""What the machine's own books counted around one charge: for a charge given back whose sale
the journal lost (sales/audit.py ``lost_sale_note``), the interval of the machine's audit
(two clean reads compared, audit/reconcile.py) that holds the charge's time, so a person who
decides whether the product went out sees the machine's card vends and their value against the
journal's. Shown only: no money is decided on the books alone (the journal's loss may have
taken the interval's vends off the journal's side too, and the service's clock is not the
unit's)."""

from __future__ import annotations

import sqlite3

from kiosk_agent.audit.reconcile import Comparison
from kiosk_agent.audit.store import AuditStore


def books_at(store: AuditStore, at: float) -> Comparison | None:
    """The compared interval (``since`` < ``at`` <= ``until``, the reads' wall times) that holds
    ``at``, or None: no read of the machine's books yet covers it (no ``dex:``, the reads lost
    with the journal, the next read not yet taken), or the audit tables cannot be read."""
    try:
        if not store.exists():
            return None
        for comparison in store.comparisons_since(at):
            if comparison.since < at <= comparison.until:
                return comparison
    except sqlite3.Error:
        return None
    return None


def books_words(comparison: Comparison | None, known: bool) -> str:
    """``books_at``'s answer for people; ``known``: the unit keeps the machine's books at all
    (its journal holds the audit tables): else nothing is said."""
    if comparison is not None:
        return f"the machine's books for the interval holding the charge: {comparison.line()}"
    if known:
        return ("no read of the machine's books covers the charge's time yet (the next read "
                "compares it: `kiosk-agent audit`)")
    return ""
