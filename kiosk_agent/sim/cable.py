"""The ActionCable endpoint ``/cable``: interaction changes pushed to ``terminal_job:<id>``.

Protocol (choices.md): the server says ``welcome``, pings every 3 real seconds, answers a
``subscribe`` with ``confirm_subscription`` (then at once the interaction's current record, so
one that already finished is still seen) or ``reject_subscription``, and sends each change as
``{identifier, message}``. A used or expired token is refused with HTTP 401 before the upgrade.
Each connection has one writer task fed by a queue, so frames leave in the order of changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp import WSMsgType, web

from kiosk_agent.sim.auth import Credential
from kiosk_agent.sim.context import SimContext
from kiosk_agent.sim.faults import faults_of
from kiosk_agent.sim.http import ApiError, dumps
from kiosk_agent.tasks import cancel_and_wait

_LOGGER = logging.getLogger(__name__)

PING_INTERVAL_S = 3.0  # real seconds, never scaled
CHANNEL_PREFIX = "terminal_job:"
PROTOCOLS = ("actioncable-v1-json", "actioncable-unsupported")
_CLOSE = object()


class CableConnection:
    def __init__(self, ctx: SimContext, ws: web.WebSocketResponse, credential: Credential) -> None:
        self._ctx = ctx
        self._ws = ws
        self._credential = credential
        # (frame, changed_at or None); _CLOSE ends the writer
        self._outbox: asyncio.Queue[Any] = asyncio.Queue()
        self._subscriptions: dict[str, Callable[[], None]] = {}

    async def run(self) -> None:
        writer = asyncio.create_task(self._write())
        pinger = asyncio.create_task(self._ping())
        try:
            self._send({"type": "welcome"})
            async for message in self._ws:
                if message.type == WSMsgType.TEXT:
                    self._on_text(message.data)
                elif message.type == WSMsgType.ERROR:
                    break
        finally:
            for unsubscribe in self._subscriptions.values():
                unsubscribe()
            self._subscriptions.clear()
            self._outbox.put_nowait(_CLOSE)
            await cancel_and_wait(pinger)
            # the writer ends at _CLOSE; a socket gone meanwhile is no error. A cancel while it
            # ends (the server stopping) is this task's and goes on: never swallowed here.
            with contextlib.suppress(ConnectionError):
                await writer

    def disconnect(self, reason: str, reconnect: bool) -> None:
        self._send({"type": "disconnect", "reason": reason, "reconnect": reconnect})
        self._outbox.put_nowait(_CLOSE)

    def _send(self, frame: dict[str, Any], changed_at: float | None = None) -> None:
        self._outbox.put_nowait((dumps(frame), changed_at))

    async def _write(self) -> None:
        while True:
            item = await self._outbox.get()
            if item is _CLOSE:
                await self._ws.close()
                return
            text, changed_at = item
            if self._ws.closed:
                continue
            try:
                await self._ws.send_str(text)
            except ConnectionError:
                return
            if changed_at is not None:
                self._ctx.push_stats.record(time.monotonic() - changed_at)

    async def _ping(self) -> None:
        while True:
            await asyncio.sleep(PING_INTERVAL_S)
            self._send({"type": "ping", "message": int(time.time())})

    def _on_text(self, text: str) -> None:
        try:
            command = json.loads(text)
        except json.JSONDecodeError:
            _LOGGER.debug("Ignoring a cable frame that is not JSON")
            return
        if not isinstance(command, dict):
            return
        identifier = command.get("identifier")
        if not isinstance(identifier, str):
            return
        if command.get("command") == "subscribe":
            self._subscribe(identifier)
        elif command.get("command") == "unsubscribe":
            unsubscribe = self._subscriptions.pop(identifier, None)
            if unsubscribe is not None:
                unsubscribe()

    def _subscribe(self, identifier: str) -> None:
        interaction_id = _interaction_id(identifier)
        try:
            stored = (
                self._ctx.terminals.interaction(interaction_id, self._credential.mids)
                if interaction_id
                else None
            )
        except ApiError:
            stored = None
        if stored is None:
            self._send({"type": "reject_subscription", "identifier": identifier})
            return
        if identifier not in self._subscriptions:

            def push(record: dict[str, Any], changed_at: float) -> None:
                self._send({"identifier": identifier, "message": record}, changed_at)

            self._subscriptions[identifier] = self._ctx.terminals.subscribe(interaction_id, push)
        self._send({"type": "confirm_subscription", "identifier": identifier})
        faults = faults_of(self._ctx)
        if faults is not None and faults.drop_after_confirm():
            self._outbox.put_nowait(_CLOSE)  # injected: the socket goes before any record
            return
        self._send({"identifier": identifier, "message": stored["record"]})


def _interaction_id(identifier: str) -> str:
    try:
        parsed = json.loads(identifier)
    except json.JSONDecodeError:
        return ""
    channel = parsed.get("channel") if isinstance(parsed, dict) else None
    if not isinstance(channel, str) or not channel.startswith(CHANNEL_PREFIX):
        return ""
    return channel[len(CHANNEL_PREFIX) :]


class Cable:
    def __init__(self, ctx: SimContext) -> None:
        self._ctx = ctx
        self.connections: set[CableConnection] = set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        token = request.query.get("token", "")
        credential = self._ctx.auth.consume_ws_token(token) if token else None
        if credential is None:
            raise ApiError(401, "invalid_token", "the WebSocket token is unknown, used or expired")
        ws = web.WebSocketResponse(protocols=PROTOCOLS, autoping=True)
        await ws.prepare(request)
        connection = CableConnection(self._ctx, ws, credential)
        self.connections.add(connection)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)
        return ws

    async def shutdown(self, _: web.Application) -> None:
        for connection in list(self.connections):
            connection.disconnect("server_restart", reconnect=True)


CABLE_KEY = web.AppKey("sim_cable", Cable)


def setup(app: web.Application, ctx: SimContext) -> None:
    cable = Cable(ctx)
    app[CABLE_KEY] = cable
    app.on_shutdown.append(cable.shutdown)
    app.router.add_get("/cable", cable.handle)
