"""The service's transaction statuses (reporting's ``trans_status_id``): one contract, in a
module of its own without pydantic, so that what decides about money (sales/reconcile.py) names
them at import without building the reporting models a sale that hears its answers never needs.
``kiosk_agent.service.models.reporting`` re-exports it."""

import enum

__all__ = ["TransStatus"]


class TransStatus(enum.IntEnum):
    """``trans_status_id`` of a reported transaction."""

    AUTHORIZED = 1
    CAPTURED = 2
    SETTLED = 3
    VOIDED = 4
    REFUND = 5  # the refund's own row
    DECLINED = 6
    RETRY = 7
    PARTIALLY_REFUNDED = 8
    REFUNDED = 9

    @classmethod
    def parse(cls, text: str) -> "TransStatus":
        """``"3"``, ``"settled"`` or ``"SETTLED"`` -> SETTLED."""
        text = text.strip()
        if text.isdigit():
            try:
                return cls(int(text))
            except ValueError:
                pass
        else:
            try:
                return cls[text.upper().replace("-", "_").replace(" ", "_")]
            except KeyError:
                pass
        known = ", ".join(f"{s.value}={s.name.lower()}" for s in cls)
        raise ValueError(f"unknown transaction status {text!r} (known: {known})")
