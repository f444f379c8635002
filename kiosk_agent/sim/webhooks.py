"""Boarding webhooks: signed envelopes, delivered in the background with retries on virtual time.

Delivery follows the provider's published rules (choices.md): a POST of the envelope as JSON,
``X-Webhook-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>`` and ``X-Idempotency-Key``;
any 2xx ends delivery, otherwise up to eight attempts in all with exponential backoff.

Without chaos, first attempts go out one at a time in the order the events were made, so a
receiver sees the natural order; a failing receiver never holds up the next event because retries
run on their own tasks. With chaos, every delivery waits a random (seeded) moment first and some
are sent twice, so receivers meet the reordering and duplicates the interface warns about.

Events made further apart than that moment never swap, so how much chaos reorders would depend
on how fast its caller makes them; ``held()`` keeps deliveries back while a burst is made, and
lets them go out together, in the order the seed's delays give them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from kiosk_agent.sim.clock import VirtualClock
from kiosk_agent.sim.context import SimContext
from kiosk_agent.sim.http import json_response
from kiosk_agent.sim.store import Store
from kiosk_agent.tasks import BackgroundTask, TaskSet

_LOGGER = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Webhook-Signature-256"
IDEMPOTENCY_HEADER = "X-Idempotency-Key"
MAX_ATTEMPTS = 8
# Virtual seconds before the second attempt; doubled for each later one (5, 10, 20 ... 320 s).
FIRST_BACKOFF_S = 5.0
# Chaos: each delivery waits up to this many virtual seconds first, and this share is sent twice.
CHAOS_MAX_DELAY_S = 2.0
CHAOS_DUPLICATE_SHARE = 0.4
# Real seconds one attempt may take before it counts as failed.
ATTEMPT_TIMEOUT_S = 10.0


def sign(body: bytes, secret: str) -> str:
    """The ``X-Webhook-Signature-256`` value for ``body``."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def signature_matches(body: bytes, secret: str, header: str | None) -> bool:
    """Constant-time check of a received signature header."""
    return header is not None and hmac.compare_digest(sign(body, secret), header)


def backoff_s(failed_attempt: int) -> float:
    """Virtual seconds to wait after attempt number ``failed_attempt`` (1-based) failed."""
    return FIRST_BACKOFF_S * float(2 ** (failed_attempt - 1))


@dataclass(slots=True)
class WebhookEvent:
    """One event and what became of its delivery."""

    event_type: str
    source_id: str
    timestamp: str
    payload: dict[str, Any]
    webhook_id: str
    idempotency_key: str
    attempts: int = 0
    delivered: bool = False
    last_status: int | None = None
    last_error: str | None = None
    statuses: list[int | None] = field(default_factory=list)

    def envelope(self, attempt: int) -> dict[str, Any]:
        return {
            "event_type": self.event_type,
            "source_id": self.source_id,
            "timestamp": self.timestamp,
            "payload": self.payload,
            "metadata": {
                "webhook_id": self.webhook_id,
                "attempt": attempt,
                "idempotency_key": self.idempotency_key,
            },
        }

    def describe(self) -> dict[str, Any]:
        """The ``GET /sim/events`` item: the envelope as last sent, and its delivery state."""
        return {
            "envelope": self.envelope(max(self.attempts, 1)),
            "delivered": self.delivered,
            "attempts": self.attempts,
            "last_status": self.last_status,
            "last_error": self.last_error,
        }


class WebhookDispatcher:
    """Makes envelopes and delivers them to one URL; ``emit`` never waits on the network."""

    def __init__(
        self,
        clock: VirtualClock,
        url: str | None,
        secret: str,
        *,
        chaos: bool = False,
        seed: int = 0,
        store: Store | None = None,
    ) -> None:
        self._clock = clock
        self._url = url
        self._secret = secret
        self._chaos = chaos
        self._random = random.Random(f"webhooks:{seed}")  # chaos decisions only
        self._store = store
        self._queue: asyncio.Queue[WebhookEvent] = asyncio.Queue()
        self._released = asyncio.Event()  # cleared while held()
        self._released.set()
        self._in_hand = False  # the worker's event, between the queue and a delivery task
        self._tasks = TaskSet()  # retries and chaotic deliveries
        self._worker = BackgroundTask(self._run, name="sim-webhooks")
        self._session: aiohttp.ClientSession | None = None
        self.events: list[WebhookEvent] = self._load()

    def _load(self) -> list[WebhookEvent]:
        if self._store is None:
            return []
        self._store.create(_DDL)
        return [
            WebhookEvent(
                event_type=row["event_type"],
                source_id=row["source_id"],
                timestamp=row["timestamp"],
                payload=json.loads(row["payload"]),
                webhook_id=row["webhook_id"],
                idempotency_key=row["idempotency_key"],
                attempts=row["attempts"],
                delivered=bool(row["delivered"]),
                last_status=row["last_status"],
                last_error=row["last_error"],
            )
            for row in self._store.rows("SELECT * FROM webhook_events ORDER BY seq")
        ]

    def _save(self, event: WebhookEvent) -> None:
        if self._store is None:
            return
        self._store.execute(
            "INSERT INTO webhook_events (webhook_id, event_type, source_id, timestamp, payload, "
            "idempotency_key, attempts, delivered, last_status, last_error) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(webhook_id) DO UPDATE SET "
            "attempts = excluded.attempts, delivered = excluded.delivered, "
            "last_status = excluded.last_status, last_error = excluded.last_error",
            (
                event.webhook_id, event.event_type, event.source_id, event.timestamp,
                json.dumps(event.payload), event.idempotency_key, event.attempts,
                int(event.delivered), event.last_status, event.last_error,
            ),
        )  # fmt: skip

    @property
    def url(self) -> str | None:
        return self._url

    def emit(self, event_type: str, source_id: str, payload: dict[str, Any]) -> WebhookEvent:
        event = WebhookEvent(
            event_type=event_type,
            source_id=source_id,
            timestamp=self._clock.iso_now(),
            payload=payload,
            webhook_id=f"wh_{uuid.uuid4().hex}",
            idempotency_key=f"idem_{uuid.uuid4().hex}",
        )
        self.events.append(event)
        self._save(event)
        if self._url is not None:
            self._queue.put_nowait(event)
        return event

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The events made inside are delivered only at its end, all at once (retries already
        under way carry on)."""
        self._released.clear()
        try:
            yield
        finally:
            self._released.set()

    @property
    def busy(self) -> bool:
        """Deliveries still to make: queued, waiting (chaos, backoff) or under way."""
        return not self._queue.empty() or self._in_hand or len(self._tasks) > 0

    async def start(self) -> None:
        if self._url is None or self._worker.started:
            return
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=ATTEMPT_TIMEOUT_S)
        )
        self._worker.start()
        # Deliveries a stopped simulator left unfinished carry on where they stood.
        for event in self.events:
            if event.delivered or event.attempts >= MAX_ATTEMPTS:
                continue
            if event.attempts == 0:
                self._queue.put_nowait(event)
            else:
                self._tasks.spawn(self._retry(event))

    async def stop(self) -> None:
        await self._worker.stop()
        await self._tasks.cancel_all()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            self._in_hand = True
            try:
                await self._released.wait()
                if self._chaos:
                    self._tasks.spawn(self._chaotic(event, duplicate=False))
                    if self._random.random() < CHAOS_DUPLICATE_SHARE:
                        self._tasks.spawn(self._chaotic(event, duplicate=True))
                elif not await self._attempt(event):
                    self._tasks.spawn(self._retry(event))
            finally:
                self._in_hand = False
                self._queue.task_done()

    async def _chaotic(self, event: WebhookEvent, *, duplicate: bool) -> None:
        await self._clock.sleep(self._random.uniform(0, CHAOS_MAX_DELAY_S))
        if duplicate:
            # A duplicate repeats a delivery the receiver may already have: same attempt number,
            # same idempotency key, so only the key tells it apart.
            await self._post(event, max(event.attempts, 1), count=False)
            return
        if not await self._attempt(event):
            await self._retry(event)

    async def _retry(self, event: WebhookEvent) -> None:
        while not event.delivered and event.attempts < MAX_ATTEMPTS:
            await self._clock.sleep(backoff_s(event.attempts))
            await self._attempt(event)
        if not event.delivered:
            _LOGGER.warning(
                "webhook %s (%s) gave up after %d attempts: %s",
                event.webhook_id,
                event.event_type,
                event.attempts,
                event.last_error,
            )

    async def _attempt(self, event: WebhookEvent) -> bool:
        event.attempts += 1
        return await self._post(event, event.attempts, count=True)

    async def _post(self, event: WebhookEvent, attempt: int, *, count: bool) -> bool:
        if self._session is None:
            raise RuntimeError("the webhook sender is not started")
        if self._url is None:
            raise RuntimeError("the webhook sender has no URL")
        body = json.dumps(event.envelope(attempt), separators=(",", ":")).encode()
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(body, self._secret),
            IDEMPOTENCY_HEADER: event.idempotency_key,
        }
        status: int | None = None
        error: str | None = None
        try:
            async with self._session.post(self._url, data=body, headers=headers) as response:
                status = response.status
                await response.read()
        except (aiohttp.ClientError, TimeoutError) as err:
            error = f"{type(err).__name__}: {err}"
        ok = status is not None and 200 <= status < 300
        _LOGGER.debug("event: webhook %s %s attempt %d -> %s", event.webhook_id,
                      event.event_type, attempt, status or error)  # `kiosk-agent sim -v`
        if count:
            event.statuses.append(status)
            event.last_status = status
            event.last_error = None if ok else (error or f"HTTP {status}")
            event.delivered = event.delivered or ok
            self._save(event)
        return ok


_DDL = """
CREATE TABLE IF NOT EXISTS webhook_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook_id TEXT NOT NULL UNIQUE,
    event_type TEXT NOT NULL,
    source_id TEXT NOT NULL,
    timestamp TEXT NOT NULL,
    payload TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    delivered INTEGER NOT NULL,
    last_status INTEGER,
    last_error TEXT
);
"""

DISPATCHER_KEY = web.AppKey("sim_webhooks", WebhookDispatcher)


async def list_events(request: web.Request) -> web.Response:
    """``GET /sim/events``: every envelope made so far and whether it was delivered."""
    dispatcher = request.app[DISPATCHER_KEY]
    items = [event.describe() for event in dispatcher.events]
    return json_response({"items": items, "count": len(items)})


DEFAULT_SECRET = "sim_webhook_secret"


def dispatcher_for(ctx: SimContext) -> WebhookDispatcher:
    """The one dispatcher of a simulator, made on first use from its options."""
    found = ctx.extras.get("webhooks")
    if isinstance(found, WebhookDispatcher):
        return found
    options = ctx.options
    dispatcher = WebhookDispatcher(
        ctx.clock,
        options.webhook_url,
        options.webhook_secret or DEFAULT_SECRET,
        chaos=options.chaos,
        seed=options.seed,
        store=ctx.store,
    )
    ctx.extras["webhooks"] = dispatcher
    return dispatcher


def setup(app: web.Application, ctx: SimContext) -> WebhookDispatcher:
    """Serve ``GET /sim/events`` and run delivery for the application's lifetime."""
    dispatcher = dispatcher_for(ctx)
    if DISPATCHER_KEY in app:
        return dispatcher
    app[DISPATCHER_KEY] = dispatcher
    app.router.add_get("/sim/events", list_events)

    async def start(_: web.Application) -> None:
        await dispatcher.start()

    async def stop(_: web.Application) -> None:
        await dispatcher.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return dispatcher
