"""Hosted payment pages: a link on which a customer pays an amount."""

from __future__ import annotations

from urllib.parse import quote

from kiosk_agent.service.models.hpp import HostedPage, HostedPageLink, hpp_client_id_from_url
from kiosk_agent.service.parsing import parse, sent_back
from kiosk_agent.service.transport import MidPlacement, Transport

_PATH = "/api/v1/hpp"


class HostedPagesClient:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def create(self, page: HostedPage) -> HostedPageLink:
        """Create a page; ``cc_mid`` defaults to the client's merchant when no mid is given."""
        if not page.name:
            raise ValueError("a hosted page needs a name")
        body = page.to_wire()
        if "cc_mid" not in body and "ach_mid" not in body:
            body["cc_mid"] = self._transport.settings.mid
        return await self._transport.request_model(
            HostedPageLink,
            "POST",
            _PATH,
            json=body,
            mid=MidPlacement.NONE,
            what=f"create hosted page {page.name!r}",
        )

    async def edit(self, page_id_or_url: str, changes: HostedPage) -> HostedPageLink | None:
        """Change the fields set in ``changes``; the rest keep their value. cc_mid is fixed."""
        if changes.cc_mid is not None:
            raise ValueError("cc_mid cannot be changed after a hosted page is created")
        client_id = (
            hpp_client_id_from_url(page_id_or_url) if "/" in page_id_or_url else page_id_or_url
        )
        what = f"edit hosted page {client_id}"
        data = await self._transport.request(
            "PUT", f"{_PATH}/{quote(client_id, safe='')}", json=changes.to_wire(), what=what
        )
        return parse(HostedPageLink, data, what=what) if sent_back(data, "url") else None
