"""The device's own HTTP servers (admin API, webhook receiver, kiosk API) start and stop alike.

Each binds a configured host and port; port 0 takes any free one (tests, several agents on one
machine), so the port really bound is read back once listening.
"""

from __future__ import annotations

from aiohttp import web


class LocalSite:
    """One aiohttp application served on ``host:port`` until stopped."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self._wanted_port = port
        self.port: int | None = None  # the bound port, once started
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self, app: web.Application) -> None:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        self._runner = runner
        await web.TCPSite(runner, self.host, self._wanted_port).start()
        self.port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
