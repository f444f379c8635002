"""ServiceClient: the one object the agent, the CLI and the tools use to reach the service.

```python
async with ServiceClient(settings) as svc:
    result = await svc.payments.charge(ChargeRequest(amount=250, account_token=token))
    handle = await svc.terminal.charge_card("SIM-0001", 250)
    interaction = await handle.wait()
```
Every interface client shares one :class:`Transport` (one aiohttp session, one key manager, one
OAuth token, and the rate limiter of its API key, which every client of the process using that
key shares). ``api_key`` and ``mid`` may be left out by a client that only reports or boards.
"""

from __future__ import annotations

from functools import cached_property
from types import TracebackType
from typing import TYPE_CHECKING

import aiohttp

from kiosk_agent.service.keys import KeysClient
from kiosk_agent.service.payments import PaymentsClient
from kiosk_agent.service.settings import ServiceSettings
from kiosk_agent.service.terminal import TerminalClient
from kiosk_agent.service.transport import Transport

if TYPE_CHECKING:
    from kiosk_agent.service.boarding import BoardingClient
    from kiosk_agent.service.hpp import HostedPagesClient
    from kiosk_agent.service.plans import PlansClient
    from kiosk_agent.service.reporting import ReportingClient
    from kiosk_agent.service.vault import VaultClient

__all__ = ["ServiceClient", "ServiceSettings"]


class ServiceClient:
    def __init__(
        self, settings: ServiceSettings, *, session: aiohttp.ClientSession | None = None
    ) -> None:
        self.settings = settings
        self.transport = Transport(settings, session=session)
        self.payments = PaymentsClient(self.transport)
        self.terminal = TerminalClient(self.transport)
        self.keys = KeysClient(self.transport)

    # The areas a sale rarely or never needs are imported on first use: their models are many,
    # and an agent that never boards a merchant should not build them (on a Pi Zero, megabytes).

    @cached_property
    def vault(self) -> VaultClient:
        from kiosk_agent.service.vault import VaultClient

        return VaultClient(self.transport)

    @cached_property
    def plans(self) -> PlansClient:
        from kiosk_agent.service.plans import PlansClient

        return PlansClient(self.transport)

    @cached_property
    def hpp(self) -> HostedPagesClient:
        from kiosk_agent.service.hpp import HostedPagesClient

        return HostedPagesClient(self.transport)

    @cached_property
    def reporting(self) -> ReportingClient:
        from kiosk_agent.service.reporting import ReportingClient

        return ReportingClient(self.transport)

    @cached_property
    def boarding(self) -> BoardingClient:
        from kiosk_agent.service.boarding import BoardingClient

        return BoardingClient(self.transport)

    async def start(self) -> None:
        await self.transport.start()

    async def close(self) -> None:
        await self.terminal.close()  # the cable rides the transport's session: it goes first
        await self.transport.close()

    async def __aenter__(self) -> ServiceClient:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
