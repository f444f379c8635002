"""A small in-process publish/subscribe bus: sale steps and health changes, fanned out.

Subscribers get their own bounded queue so a slow live view can never stall a sale: when a
queue is full the oldest item is dropped and counted. Listeners are called in ``publish`` itself,
for quick bookkeeping in memory (health, availability, a platform's latest steps): no task wakes
per event for them, which on a small computer is a good part of a sale's CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

T = TypeVar("T")

_LOGGER = logging.getLogger(__name__)


class EventBus(Generic[T]):
    def __init__(self, queue_size: int = 256) -> None:
        self._queue_size = queue_size
        self._subscribers: set[asyncio.Queue[T]] = set()
        self._listeners: list[Callable[[T], None]] = []
        self.dropped = 0
        self.listener_errors = 0  # listeners that raised (logged; the publisher never sees it)

    def publish(self, event: T) -> None:
        for listener in tuple(self._listeners):
            try:
                listener(event)
            except Exception:  # a listener's bug must not fail the step that published
                self.listener_errors += 1
                _LOGGER.exception("an event listener failed on %r", event)
        for queue in self._subscribers:
            if queue.full():
                queue.get_nowait()
                self.dropped += 1
            queue.put_nowait(event)

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[T]]:
        queue: asyncio.Queue[T] = asyncio.Queue(self._queue_size)
        self._subscribers.add(queue)
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)

    def listen(self, listener: Callable[[T], None]) -> Callable[[], None]:
        """Call ``listener(event)`` on every publish, in it (quick and synchronous only);
        returns the function that stops it."""
        self._listeners.append(listener)

        def stop() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return stop

    async def listen_until_cancelled(self, listener: Callable[[T], None]) -> None:
        """``listen`` for as long as the calling task runs (an owner's background task)."""
        stop = self.listen(listener)
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            stop()

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers) + len(self._listeners)
