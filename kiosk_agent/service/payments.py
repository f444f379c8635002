"""Payments: charge, capture, void or refund, surcharge check, e-mailed receipts.

Amounts are integer cents. A charge carries an ``order_id`` made here when the caller gave none,
so that an answer lost on the way back can be reconciled by that id instead of charging again.
"""

from __future__ import annotations

import uuid
from typing import Any

from kiosk_agent.service.errors import ServerError, ServiceUnreachableError
from kiosk_agent.service.models.payments import (
    ChargeRequest,
    ChargeResult,
    ReceiptSent,
    Surcharge,
    VoidOrRefundResult,
)
from kiosk_agent.service.parsing import answer_to
from kiosk_agent.service.transport import MidPlacement, Transport


def new_order_id() -> str:
    """An order id made on the device: unique, short, safe in logs."""
    return f"ka-{uuid.uuid4().hex[:20]}"


class PaymentsClient:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    @property
    def _mid(self) -> str:
        return self._transport.settings.mid

    def _on_transaction(self, trans_id: str, amount: int | None) -> dict[str, Any]:
        """The body of a call on one transaction (capture, void or refund): in full without
        ``amount``, else for that many cents."""
        body: dict[str, Any] = {"trans_id": trans_id, "mid": self._mid}
        if amount is not None:
            body["amount"] = require_cents(amount)
        return body

    async def charge(self, request: ChargeRequest) -> ChargeResult:
        """Charge (or, with ``capture=False``, authorize) an account token or vaulted account.

        A lost answer raises ``ServiceUnreachableError`` (a 5xx, ``ServerError``) whose
        ``order_id`` is the id to reconcile by (interaction status, then reporting).
        """
        body = request.to_wire()
        body.setdefault("mid", self._mid)
        body.setdefault("order_id", request.order_id or new_order_id())
        what = f"charge order {body['order_id']}"
        try:
            answer = await self._transport.request_model(
                ChargeResult,
                "POST",
                "/api/v1/charge",
                json=body,
                mid=MidPlacement.NONE,  # mid is in the body already
                what=what,
            )
        except (ServiceUnreachableError, ServerError) as exc:
            exc.order_id = body["order_id"]  # the outcome is unknown: reconcile by this id
            raise
        return answer_to(body, answer, ("order_id", "mid", "currency"), what)

    async def capture(self, trans_id: str, amount: int | None = None) -> ChargeResult:
        """Capture an authorization, in full or for ``amount`` cents (at most the authorized)."""
        body = self._on_transaction(trans_id, amount)
        what = f"capture {trans_id}"
        answer = await self._transport.request_model(
            ChargeResult,
            "POST",
            "/api/v1/capture",
            json=body,
            mid=MidPlacement.NONE,
            what=what,
        )
        return answer_to(body, answer, ("trans_id", "mid"), what)

    async def void_or_refund(
        self, trans_id: str, amount: int | None = None, user_identifier: str | None = None
    ) -> VoidOrRefundResult:
        """Void an unsettled transaction or refund a settled one (partly, with ``amount``)."""
        body = self._on_transaction(trans_id, amount)
        if user_identifier is not None:
            body["user_identifier"] = user_identifier
        return await self._transport.request_model(
            VoidOrRefundResult,
            "POST",
            "/api/v1/void-or-refund",
            json=body,
            mid=MidPlacement.NONE,
            what=f"void or refund {trans_id}",
        )

    async def surcharge(
        self, amount: int, *, account_token: str | None = None, card_bin: str | None = None
    ) -> Surcharge:
        """Whether charging ``amount`` cents to this card incurs a surcharge, and how much."""
        if (account_token is None) == (card_bin is None):
            raise ValueError("give exactly one of account_token and card_bin")
        params: dict[str, str | int] = {"mid": self._mid, "amount": require_cents(amount)}
        if account_token is not None:
            params["account_token"] = account_token
        else:
            params["card_bin"] = str(card_bin)
        return await self._transport.request_model(
            Surcharge,
            "GET",
            "/api/v1/surcharge",
            params=params,
            mid=MidPlacement.NONE,
            what="surcharge check",
        )

    async def send_receipt(self, trans_id: str, email: str) -> ReceiptSent:
        """E-mail the receipt of ``trans_id`` (an ISV key's mid goes in the body)."""
        return await self._transport.request_model(
            ReceiptSent,
            "POST",
            "/api/v1/send_receipt",
            json={"trans_id": trans_id, "email": email},
            mid=MidPlacement.BODY,
            retry_safe=True,  # a second e-mail is harmless; a lost one is not
            what=f"send receipt for {trans_id}",
        )


def require_cents(amount: int) -> int:
    """``amount`` if it is positive integer cents; a float or a string is refused."""
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise TypeError(f"amount must be integer cents, got {type(amount).__name__}")
    if amount <= 0:
        raise ValueError(f"amount must be positive cents, got {amount}")
    return amount
