"""The payments API key: rotate it on demand (the transport also does it before expiry)."""

from __future__ import annotations

from kiosk_agent.service.credentials import ApiCredentials
from kiosk_agent.service.transport import Transport


class KeysClient:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def refresh(self) -> ApiCredentials:
        """Rotate now; the new key and refresh token are saved before they are used."""
        await self._transport.keys.refresh()
        return self._transport.keys.credentials

    @property
    def current(self) -> ApiCredentials:
        """The credentials in use (repr shows only the expiry)."""
        return self._transport.keys.credentials
