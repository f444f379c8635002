"""The vault: payment accounts kept by the service, charged later by their uuid."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from kiosk_agent.service.models.vault import VaultAccountRequest, VaultPaymentAccount
from kiosk_agent.service.parsing import parse, sent_back
from kiosk_agent.service.transport import MidPlacement, Transport

_PATH = "/api/v1/vault_payment_accounts"


class VaultClient:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def create(self, account: VaultAccountRequest) -> VaultPaymentAccount:
        body = account.to_wire()
        body.setdefault("mid", self._transport.settings.mid)
        return await self._transport.request_model(
            VaultPaymentAccount,
            "POST",
            _PATH,
            json=body,
            mid=MidPlacement.NONE,
            what="create vault payment account",
        )

    async def get(self, account_uuid: str) -> VaultPaymentAccount:
        """The account; ``NotFoundError`` when it does not exist or was deleted."""
        return await self._transport.request_model(
            VaultPaymentAccount,
            "GET",
            f"{_PATH}/{quote(account_uuid, safe='')}",
            what=f"get vault payment account {account_uuid}",
        )

    async def update(self, account_uuid: str, **changes: Any) -> VaultPaymentAccount:
        """Change the fields given; the others keep their value."""
        if not changes:
            raise ValueError("nothing to update: name at least one field")
        return await self._transport.request_model(
            VaultPaymentAccount,
            "PUT",
            f"{_PATH}/{quote(account_uuid, safe='')}",
            json=changes,
            what=f"update vault payment account {account_uuid}",
        )

    async def delete(self, account_uuid: str) -> VaultPaymentAccount | None:
        """Soft-delete the account (``is_deleted`` 1); it then reads back as not found.

        The deleted record when the service sends it back.
        """
        what = f"delete vault payment account {account_uuid}"
        data = await self._transport.request(
            "DELETE", f"{_PATH}/{quote(account_uuid, safe='')}", what=what
        )
        return parse(VaultPaymentAccount, data, what=what) if sent_back(data) else None
