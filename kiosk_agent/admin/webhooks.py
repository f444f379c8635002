"""The boarding webhook receiver: verify, de-duplicate durably, keep each merchant's latest state.

A delivery is answered 2xx only after its event is committed to SQLite (WAL, synchronous=FULL),
so an accepted event survives a crash or a power cut; a failure to commit answers 503 and the
sender retries. The idempotency key is the table's unique key, so duplicates are dropped across
restarts. Concurrent deliveries share one commit (group commit): throughput grows with the
sender's concurrency while each answer still waits for its own fsync.

Signature checking, parsing and the out-of-order merchant reducer are the service client's
(`kiosk_agent.service.webhooks`); this module adds the durable store and the HTTP face.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from kiosk_agent.admin.schema import WEBHOOKS_SCHEMA
from kiosk_agent.logs import RefusalLog
from kiosk_agent.service.webhooks import (
    MerchantEvent,
    MerchantStateReducer,
    WebhookEvent,
    WebhookPayloadError,
    WebhookSignatureError,
    describe,
    parse_event,
    verify,
)
from kiosk_agent.tasks import cancel_and_wait
from kiosk_agent.web.server import BodyError, HttpLimits, LocalSite, loads_bounded, read_body

_LOGGER = logging.getLogger(__name__)

HEALTH_PART = "webhook store"  # the part named in health when events cannot be committed

_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS webhook_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    received_at REAL NOT NULL,
    event_type TEXT,
    merchant_id INTEGER,
    body BLOB
)
"""


# SQLite's INTEGER is signed 64-bit: a merchant id outside this is refused before storage.
MERCHANT_ID_RANGE = range(0, 2**63)
DEFAULT_CLOSE_GRACE = 5.0


class StoreUnavailable(RuntimeError):
    """The store cannot take writes now (closed, or its writer stopped); nothing committed."""


@dataclass(slots=True)
class _Write:
    key: str
    event_type: str | None
    merchant_id: int | None
    body: bytes | None
    done: asyncio.Future[bool]
    discard: bool = False


class SqliteIdempotencyStore:
    """Received webhook events on disk, unique by idempotency key.

    Implements the service client's ``IdempotencyStore`` protocol (``add``/``discard``) and
    `record`, which keeps the event's body with its key in the same commit.

    Whatever a commit meets, the writer goes on: the writes of a failed batch are tried one
    by one, each failing write's caller gets the error (the receiver answers 503, the sender
    retries), and ``on_trouble(reason)`` is told, then ``on_trouble(None)`` after the next good
    commit. Should the writer task end anyway, every waiting write fails at once and later ones
    are refused. `close` ends within its grace even while a commit hangs on the disk.
    """

    def __init__(
        self, path: Path | str, *, on_trouble: Callable[[str | None], None] | None = None
    ) -> None:
        self.path = Path(path)
        self._db: sqlite3.Connection | None = None
        self._pending: list[_Write] = []
        self._kick = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Future[bool]] = set()
        self._on_trouble = on_trouble
        self._committing = False  # a worker thread is inside _commit
        self.trouble: str | None = None
        self.commits = 0

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists()
        # One writer task uses the connection, from a worker thread, one batch at a time.
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        if fresh:
            os.chmod(self.path, 0o600)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # an accepted event survives power loss
        self._db.execute(_SCHEMA_SQL)
        self._writer = asyncio.create_task(self._write_loop(), name="webhook-store")
        self._writer.add_done_callback(self._writer_ended)

    async def close(self, grace: float = DEFAULT_CLOSE_GRACE) -> None:
        """Let the writes already submitted reach the disk (within ``grace``), then close."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                async with asyncio.timeout(grace):
                    await self._drain()
            except TimeoutError:
                _LOGGER.error("webhook store: writes still pending after %g s; closing", grace)
            writer.remove_done_callback(self._writer_ended)
            await cancel_and_wait(writer)
        self._fail_waiting(StoreUnavailable("the webhook store closed"))
        if self._db is not None and not self._committing:
            self._db.close()
        # else a worker thread still waits on the disk: it ends by itself (busy timeout) and
        # the process frees the connection; closing it under the thread would be worse.
        self._db = None

    async def _drain(self) -> None:
        """Let every write already submitted reach the disk before closing."""
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    # -- the IdempotencyStore protocol ------------------------------------------------------

    async def add(self, key: str) -> bool:
        return await self._submit(_Write(key, None, None, None, self._future()))

    async def discard(self, key: str) -> None:
        await self._submit(_Write(key, None, None, None, self._future(), discard=True))

    # -- events ------------------------------------------------------------------------------

    async def record(self, key: str, event: WebhookEvent, body: bytes) -> bool:
        """Commit the event under its key; True when new, False for a duplicate."""
        merchant_id = event.merchant_id if isinstance(event, MerchantEvent) else None
        return await self._submit(_Write(key, event.event_type, merchant_id, body, self._future()))

    def bodies(self) -> Iterator[bytes]:
        """Every stored event body, in arrival order (for rebuilding state on start)."""
        if self._db is None:
            raise RuntimeError("the webhook store is not open")
        return _stored_bodies(self._db)

    def __len__(self) -> int:
        if self._db is None:
            raise RuntimeError("the webhook store is not open")
        return int(self._db.execute("SELECT count(*) FROM webhook_events").fetchone()[0])

    # -- group commit ------------------------------------------------------------------------

    @staticmethod
    def _future() -> asyncio.Future[bool]:
        return asyncio.get_running_loop().create_future()

    async def _submit(self, write: _Write) -> bool:
        writer = self._writer
        if writer is None or writer.done():
            raise StoreUnavailable(self.trouble or "the webhook store is not open")
        self._pending.append(write)
        self._inflight.add(write.done)
        write.done.add_done_callback(self._inflight.discard)
        self._kick.set()
        return await write.done

    async def _write_loop(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            batch, self._pending = self._pending, []
            if batch:
                await self._write(batch)

    async def _write(self, batch: list[_Write]) -> None:
        try:
            results = await asyncio.to_thread(self._commit, batch)
        except Exception as err:  # noqa: BLE001 - any fault: the writer must go on
            if len(batch) > 1:
                # one bad write must not fail the others: each on its own
                for write in batch:
                    await self._write([write])
                return
            self._trouble(f"{type(err).__name__}: {err}")
            if not batch[0].done.done():
                batch[0].done.set_exception(err)
            return
        if self.trouble is not None:
            self._trouble(None)
        for write, result in zip(batch, results, strict=True):
            if not write.done.done():
                write.done.set_result(result)

    def _trouble(self, reason: str | None) -> None:
        if reason == self.trouble:
            return
        self.trouble = reason
        if reason is not None:
            _LOGGER.error("webhook store cannot commit: %s", reason)
        if self._on_trouble is not None:
            self._on_trouble(reason)

    def _writer_ended(self, task: asyncio.Task[None]) -> None:
        """The writer ended while open (a bug): fail every waiting write, say so in health."""
        error = task.exception() if not task.cancelled() else None
        reason = f"writer stopped: {type(error).__name__}: {error}" if error else "writer stopped"
        self._trouble(reason)
        self._fail_waiting(StoreUnavailable(reason))

    def _fail_waiting(self, error: Exception) -> None:
        waiting, self._pending = self._pending, []
        for write in waiting:
            if not write.done.done():
                write.done.set_exception(error)
        for future in list(self._inflight):  # taken by a batch the writer will not finish
            if not future.done():
                future.set_exception(error)

    def _commit(self, batch: list[_Write]) -> list[bool]:
        db = self._db
        if db is None:
            raise StoreUnavailable("the webhook store closed")
        self._committing = True
        try:
            return self._commit_batch(db, batch)
        finally:
            self._committing = False

    def _commit_batch(self, db: sqlite3.Connection, batch: list[_Write]) -> list[bool]:
        results: list[bool] = []
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        try:
            for write in batch:
                if write.discard:
                    db.execute("DELETE FROM webhook_events WHERE idempotency_key = ?", (write.key,))
                    results.append(True)
                    continue
                cursor = db.execute(
                    "INSERT OR IGNORE INTO webhook_events"
                    " (idempotency_key, received_at, event_type, merchant_id, body)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (write.key, now, write.event_type, write.merchant_id, write.body),
                )
                results.append(cursor.rowcount == 1)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        self.commits += 1
        return results


class WebhookReceiver:
    """The `webhooks:` component: an aiohttp endpoint for boarding webhook deliveries."""

    def __init__(self, agent: Any, conf: dict[str, Any]) -> None:
        conf = WEBHOOKS_SCHEMA(conf)
        self._secret: str = conf["secret"]
        self._limits = HttpLimits.of(agent)
        self._health = getattr(agent, "health", None)
        self._site = LocalSite(conf["host"], conf["port"], name="webhooks", limits=self._limits,
                               health=self._health, counted_as="webhook receiver",
                               wait_for_port=True, waits=getattr(agent, "clock", None),
                               resolve=getattr(agent, "listen_resolve", None))
        self.path: str = conf["path"]
        self._max_body: int = conf["max_body"]
        self.store = SqliteIdempotencyStore(
            _resolve(agent, conf["store"]), on_trouble=self._store_trouble
        )
        self.reducer = MerchantStateReducer()
        self.outcomes: Counter[str] = Counter()
        self._refused = RefusalLog(_LOGGER, "webhooks")

    @property
    def port(self) -> int | None:
        """The bound port, once started (the configured one may be 0: any free port)."""
        return self._site.port

    @property
    def url(self) -> str:
        return f"{self._site.url}{self.path}"

    def app(self) -> web.Application:
        # aiohttp refuses a larger body with 413 before it is read into memory.
        app = web.Application(client_max_size=self._max_body)
        app.router.add_post(self.path, self.handle)
        return app

    async def start(self) -> None:
        self.store.open()
        self._replay()
        await self._site.start(self.app())
        if self._site.waiting is None:
            _LOGGER.info("boarding webhooks on %s", self.url)

    async def stop(self) -> None:
        """Stop within the grace: requests in progress, then the store's pending writes."""
        await self._site.stop()
        await self.store.close(self._limits.shutdown_grace)

    def _store_trouble(self, reason: str | None) -> None:
        if self._health is None:
            return
        if reason is None:
            self._health.clear_fatal(HEALTH_PART)
        else:
            self._health.report_fatal(HEALTH_PART, f"cannot commit events: {reason}")

    def _replay(self) -> None:
        """Rebuild each merchant's state from the stored events (order does not matter)."""
        count = rebuild_states(self.store.bodies(), self.reducer)
        if count:
            merchants = len(self.reducer.states())
            _LOGGER.info("rebuilt %d merchant(s) from %d stored event(s)", merchants, count)

    async def handle(self, request: web.Request) -> web.Response:
        try:
            body = await read_body(request)
        except BodyError as err:
            return self._refuse(err.status, err.error, err.message)
        try:
            verify(body, request.headers.get("X-Webhook-Signature-256"), self._secret)
        except WebhookSignatureError as err:
            return self._refuse(401, "invalid_signature", str(err))
        try:
            loads_bounded(body)  # a hostile number or nesting is refused before parsing
            event = parse_event(body)
        except BodyError as err:
            return self._refuse(400, "malformed", err.message, field=err.field)
        except WebhookPayloadError as err:
            return self._refuse(400, "malformed", str(err), field=err.field)
        if isinstance(event, MerchantEvent) and event.merchant_id not in MERCHANT_ID_RANGE:
            high = MERCHANT_ID_RANGE.stop - 1
            detail = f"merchant_id must be 0..{high}, got {event.merchant_id}"
            return self._refuse(400, "malformed", detail, field="payload.merchant_id")
        try:
            new = await self.store.record(event.idempotency_key, event, body)
        except Exception as err:  # noqa: BLE001 - not committed, so not accepted: the sender retries
            self.outcomes["store_error"] += 1
            webhook_id = event.envelope.metadata.webhook_id
            self._refused(
                "store_error",
                "cannot store webhook %s: %s",
                webhook_id,
                err,
                level=logging.ERROR,
            )
            detail = "the event could not be stored; retry later"
            return web.json_response({"error": "unavailable", "detail": detail}, status=503)
        if not new:
            self.outcomes["duplicate"] += 1
            return web.json_response({"status": "duplicate"})
        changed = self.reducer.apply(event)
        self.outcomes["accepted"] += 1
        if _LOGGER.isEnabledFor(logging.INFO):  # describe() is not free at thousands per second
            note = "" if changed else " (no change)"
            _LOGGER.info("webhook accepted: %s%s", describe(event), note)
        return web.json_response({"status": "accepted"})

    def _refuse(self, status: int, error: str, detail: str, **extra: str) -> web.Response:
        self.outcomes[error] += 1
        self._refused(error, "webhook refused (%d %s): %s", status, error, detail)
        return web.json_response({"error": error, "detail": detail, **extra}, status=status)

    def merchants(self) -> list[dict[str, Any]]:
        """Each merchant's latest state, for the admin API."""
        from kiosk_agent.export import json_value, model_values  # times: ISO 8601 UTC

        return [{key: json_value(value) for key, value in model_values(row).items()}
                for row in merchant_rows(self.reducer)]


class MerchantStateRow(BaseModel):
    """One merchant as the webhooks describe it: the admin API's and the CLI's shape."""

    merchant_id: int
    status_id: int | None
    status: str | None
    deleted: bool
    mid: str | None
    dba_name: str | None
    reason: str | None
    trigger: str | None
    changed_at: datetime | None
    event_type: str | None
    var_complete: bool


def merchant_rows(reducer: MerchantStateReducer) -> list[MerchantStateRow]:
    rows = []
    for merchant_id, state in sorted(reducer.states().items()):
        status = state.status
        rows.append(
            MerchantStateRow(
                merchant_id=merchant_id,
                status_id=state.status_id,
                status=status.api_name if status is not None else None,
                deleted=state.deleted,
                mid=state.mid,
                dba_name=state.dba_name,
                reason=str(state.reason) if state.reason is not None else None,
                trigger=str(state.trigger) if state.trigger is not None else None,
                changed_at=state.changed_at,
                event_type=state.event_type,
                var_complete=state.var is not None,
            )
        )
    return rows


def rebuild_states(bodies: Iterable[bytes], reducer: MerchantStateReducer) -> int:
    """Apply stored event bodies to ``reducer`` (order does not matter); returns how many."""
    count = 0
    for body in bodies:
        try:
            reducer.apply(parse_event(body))
            count += 1
        except WebhookPayloadError as err:  # stored by an older version, say
            _LOGGER.warning("skipping a stored webhook event: %s", err)
    return count


def read_merchant_states(path: Path) -> list[MerchantStateRow]:
    """The merchant states a receiver's store holds, read without the receiver (the CLI).

    Opened read-only: safe beside a running agent, since the store is in WAL mode.
    """
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        reducer = MerchantStateReducer()
        rebuild_states(_stored_bodies(db), reducer)
        return merchant_rows(reducer)
    finally:
        db.close()


def _stored_bodies(db: sqlite3.Connection) -> Iterator[bytes]:
    rows = db.execute("SELECT body FROM webhook_events WHERE body IS NOT NULL ORDER BY seq")
    for (body,) in rows:
        yield bytes(body)


def _resolve(agent: Any, relative: str) -> Path:
    config = getattr(agent, "config", None)
    resolve = getattr(config, "resolve", None)
    return Path(resolve(relative)) if callable(resolve) else Path(relative)
