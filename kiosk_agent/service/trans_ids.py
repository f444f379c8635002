"""Transaction reference numbers as the agent compares them: one comparison, everywhere."""

from __future__ import annotations


def trans_key(trans_id: str | None) -> str:
    """A transaction reference number as compared, wherever the agent compares two: the
    interface types it a string and says no more, so a charge answer and reporting may write
    one charge otherwise (whitespace around it, letters' case, leading zeros). Compared
    exactly, a completed sale's own capture read as another charge of its order id and was
    given back (the charge check), and a refund whose row named its charge otherwise read as
    a void (recovery, the attention sweeper), and a capture's answer naming the sale's own
    transaction was taken for an answer about another: one comparison, here, for all of them
    (the service's answers, reporting's rows, the journal's)."""
    key = (trans_id or "").strip().casefold()
    return key.lstrip("0") or key
