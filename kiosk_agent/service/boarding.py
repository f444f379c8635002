"""Boarding: list, create, read and update merchants (OAuth, like reporting).

Webhooks about merchants are received by :mod:`kiosk_agent.service.webhooks`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from kiosk_agent.service.models.boarding import (
    Merchant,
    MerchantCreate,
    MerchantFilter,
    MerchantStatus,
    MerchantUpdate,
)
from kiosk_agent.service.parsing import parse
from kiosk_agent.service.reporting import CollectionClient

MERCHANTS_PATH = "/ords/sprint/api/3p/boarding/v1/merchants"


class BoardingClient(CollectionClient):
    def merchants(
        self,
        filters: MerchantFilter | None = None,
        *,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Merchant]:
        """Every merchant matching ``filters``, one page in memory at a time."""
        return self._collection(MERCHANTS_PATH, Merchant, filters, page_size, limit)

    async def create(self, merchant: MerchantCreate) -> Merchant:
        """Create a merchant (status ``new``; the service emits ``merchant.new``/``created``)."""
        body = merchant.to_wire()
        data = await self._transport.oauth_request("POST", self._url(), json=body)
        return parse(Merchant, data, what="created merchant")

    async def get(self, merchant_id: int) -> Merchant:
        data = await self._transport.oauth_request("GET", self._url(merchant_id))
        return parse(Merchant, data, what=f"merchant {merchant_id}")

    async def update(
        self,
        merchant_id: int,
        changes: MerchantUpdate | None = None,
        *,
        status: MerchantStatus | str | None = None,
        **fields: Any,
    ) -> Merchant:
        """Change a merchant; ``status`` by name (``"sent_for_signature"`` sends or resends).

        ``update(7, status="new")`` retracts an application out for signature.
        """
        if changes is None:
            changes = MerchantUpdate.model_validate({"merchant_status": status, **fields})
        elif status is not None or fields:
            raise TypeError("pass either a MerchantUpdate or keyword changes, not both")
        body = changes.to_wire()
        if not body:
            raise ValueError("nothing to update: give a status or at least one field")
        data = await self._transport.oauth_request("PUT", self._url(merchant_id), json=body)
        return parse(Merchant, data, what=f"updated merchant {merchant_id}")

    def _url(self, merchant_id: int | None = None) -> str:
        path = MERCHANTS_PATH if merchant_id is None else f"{MERCHANTS_PATH}/{int(merchant_id)}"
        return self._transport.reporting_url(path)
