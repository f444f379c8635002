"""A small in-process publish/subscribe bus: sale steps and health changes, fanned out.

Subscribers get their own bounded queue so a slow live view can never stall a sale: when a
queue is full the oldest item is dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

T = TypeVar("T")


class EventBus(Generic[T]):
    def __init__(self, queue_size: int = 256) -> None:
        self._queue_size = queue_size
        self._subscribers: set[asyncio.Queue[T]] = set()
        self.dropped = 0

    def publish(self, event: T) -> None:
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

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)
