"""The HTTP heartbeat: each report POSTed as JSON to one configured URL."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp

from kiosk_agent.fleet.loopback import insecure_http
from kiosk_agent.fleet.schema import HTTP_TIMEOUT
from kiosk_agent.fleet.sink import GOODBYE_TIMEOUT, SinkBase
from kiosk_agent.redact import redirect_target

_LOGGER = logging.getLogger(__name__)


class HttpSink(SinkBase):
    """POSTs each report as JSON; anything but a 2xx keeps it queued for the next heartbeat.

    A redirect is not followed: the report goes to the configured URL or nowhere (aiohttp would
    strip the token on the way to another host, but send the report). It counts as a failed
    delivery, naming where it pointed, so the operator fixes the URL.
    """

    name = "http"

    def __init__(self, conf: dict[str, Any], queue_size: int) -> None:
        super().__init__(queue_size)
        self._url: str = conf["url"]
        self._insecure = insecure_http(conf)
        self._timeout = aiohttp.ClientTimeout(total=conf.get("timeout", HTTP_TIMEOUT))
        self._headers = {"Content-Type": "application/json"}
        if conf.get("token"):
            self._headers["Authorization"] = f"Bearer {conf['token']}"
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._insecure:
            _LOGGER.warning(
                "upstream http: %s is plain http to another host (allow_insecure_http): the "
                "fleet token and every report travel in clear; use https://",
                self._url,
            )
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
        await super().start()

    async def stop(self) -> None:
        """The loop ends, then what is still queued (a clean stop's last report, which says
        `stopped`, is the newest) is posted within ``GOODBYE_TIMEOUT``; the session closes."""
        await super().stop()
        if self._session is None:
            return
        try:
            async with asyncio.timeout(GOODBYE_TIMEOUT):
                await self.flush()
        except TimeoutError:
            self._failed(f"no answer from {self._url} within {GOODBYE_TIMEOUT:g} s of the stop")
        except Exception as err:  # noqa: BLE001 - a bug must not keep the process from exiting
            self._unexpected(err)
        if self.queue:
            _LOGGER.warning("upstream http: %d report(s) not delivered at the stop, the last "
                            "one saying it stopped: %s", len(self.queue), self.last_error)
        await self._session.close()
        self._session = None

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                await self.flush()
            except Exception as err:  # noqa: BLE001 - a bug must not end the unit's reports
                self._unexpected(err)  # the report stays queued for the next beat

    async def flush(self) -> None:
        if self._session is None:
            raise RuntimeError("the HTTP reporter flushed before it started")
        while (report := self.queue.peek()) is not None:
            try:
                async with self._session.post(
                    self._url, data=json.dumps(report), allow_redirects=False
                ) as response:
                    if response.status >= 300:
                        self._failed(_refusal(response, self._url))
                        return
            except (aiohttp.ClientError, TimeoutError, OSError) as err:
                self._failed(f"{type(err).__name__} posting to {self._url}")
                return
            self._sent_one()


def _refusal(response: aiohttp.ClientResponse, url: str) -> str:
    if 300 <= response.status < 400:
        where = redirect_target(response.headers.get("Location"))
        return f"HTTP {response.status} from {url}: a redirect to {where}, not followed"
    return f"HTTP {response.status} from {url}"
