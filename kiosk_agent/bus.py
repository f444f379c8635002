"""A small in-process publish/subscribe bus: sale steps and health changes, fanned out.

Subscribers get their own bounded queue so a slow live view can never stall a sale: when a
queue is full the oldest item is dropped and counted, and the subscription keeps how many it lost
since it last looked (``Subscription.take_missed``), so a reader can say where its history has a
hole instead of showing one as if it were whole. Listeners are called in ``publish`` itself,
for quick bookkeeping in memory (health, availability, a platform's latest steps): no task wakes
per event for them, which on a small computer is a good part of a sale's CPU.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Collection, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_LOGGER = logging.getLogger(__name__)


class Subscription(Generic[T]):
    """A subscriber's bounded queue of events, with the count of those it lost to a full queue.

    A deque and the readers waiting on it: what the bus needs of a queue (put without waiting,
    take, wait for the next), not ``asyncio.Queue``'s bookkeeping around them (its putters, its
    unfinished tasks, a Python hook or two at each put and take): a dozen Python calls fewer for
    each event a stream sends, five or six a kiosk API sale."""

    def __init__(self, maxsize: int, wanted: Callable[[T], bool] | None = None) -> None:
        self.maxsize = maxsize  # 0 or less: unbounded, as asyncio.Queue's
        self.wanted = wanted  # only these are queued (and counted when lost)
        self._items: deque[T] = deque()
        self._missed = 0  # lost since the item last taken: all before the oldest still queued
        self._missed_before_taken = 0
        self._readers: list[asyncio.Future[None]] = []  # set by the next event put
        # hands an event on at once when nothing is queued before it (True: taken, so neither
        # queued nor a reader woken): a stream that can write it now (kiosk API); must not raise
        self.deliver: Callable[[T], bool] | None = None

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def full(self) -> bool:
        return 0 < self.maxsize <= len(self._items)

    def put_nowait(self, item: T) -> None:
        """Queue ``item`` and wake every reader (each looks again: one takes it, the others
        wait on); :class:`asyncio.QueueFull` when full (the bus drops the oldest first).
        Handed to :attr:`deliver` instead when nothing waits before it, no loss is still to be
        said, and it takes it."""
        # not after a loss (a queue of one just dropped its only event): its reader says it first
        if self.deliver is not None and not self._items and not self._missed and self.deliver(item):
            return
        if 0 < self.maxsize <= len(self._items):
            raise asyncio.QueueFull
        self._items.append(item)
        for reader in self._readers:
            if not reader.done():
                reader.set_result(None)

    def get_nowait(self) -> T:
        """The oldest event (:class:`asyncio.QueueEmpty` when none); the loss counted before
        it is the one :meth:`take_missed` tells next."""
        if not self._items:
            raise asyncio.QueueEmpty
        self._missed_before_taken, self._missed = self._missed, 0
        return self._items.popleft()

    async def get(self) -> T:
        """The next event, waiting for one (a reader nothing stops but its cancel)."""
        item = await self.next()
        if item is None:  # next() without ``until`` only returns an event
            raise RuntimeError("a subscription's reader woke with no event")
        return item

    async def next(self, *until: asyncio.Future[Any]) -> T | None:
        """The next event; None when one of ``until`` ends first (a stop, the reader's socket
        closed). Cancelled, or given up, it takes nothing: the event stays for the next read.

        The reader waits on one future that the put sets (and that ``until`` ending sets),
        not on a getter task raced against ``until`` by ``asyncio.wait``: a published event
        wakes its reader in one loop turn instead of three (the getter's, its completion
        callback's, the reader's)."""
        while not self._items:
            if _any_done(until):
                return None
            reader: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._readers.append(reader)

            def wake(_ended: object, reader: asyncio.Future[None] = reader) -> None:
                if not reader.done():
                    reader.set_result(None)

            for future in until:
                future.add_done_callback(wake)
            try:
                await reader
            finally:
                self._readers.remove(reader)
                for future in until:
                    future.remove_done_callback(wake)
        if until and _any_done(until):
            return None  # told to stop: what is queued stays (a caller drains it, or not)
        return self.get_nowait()

    def drop_oldest(self) -> None:
        """Make room for a new event: the oldest is lost, and counted."""
        self._items.popleft()
        self._missed += 1

    def take_missed(self) -> int:
        """How many events were lost just before the item last taken (0: none), once."""
        missed, self._missed_before_taken = self._missed_before_taken, 0
        return missed


def _any_done(futures: tuple[asyncio.Future[Any], ...]) -> bool:
    # a loop, not any() over a generator: no generator frame made and resumed at each look
    for future in futures:  # noqa: SIM110
        if future.done():
            return True
    return False


class EventBus(Generic[T]):
    def __init__(
        self, queue_size: int = 256, kind: Callable[[T], Hashable] | None = None
    ) -> None:
        self._queue_size = queue_size
        # an event's kind (a sale step's state: operator.attrgetter, no Python call), which a
        # listener may name the only ones of (listen(kinds=)): the others are not called
        self._kind = kind
        self._subscribers: set[Subscription[T]] = set()
        # subscribers of one key's events only (a sale's stream): reached without a filter
        self._keyed: dict[Hashable, set[Subscription[T]]] = {}
        self._listeners: list[tuple[Callable[[T], None], Collection[Hashable] | None]] = []
        self.dropped = 0
        self.listener_errors = 0  # listeners that raised (logged; the publisher never sees it)

    def publish(self, event: T, key: Hashable = None) -> None:
        """``event`` to every listener and subscriber, and to those of ``key`` (when given)."""
        kind = None if self._kind is None else self._kind(event)
        for listener, kinds in tuple(self._listeners):
            if kinds is not None and kind is not None and kind not in kinds:
                continue
            try:
                listener(event)
            except Exception:  # a listener's bug must not fail the step that published
                self.listener_errors += 1
                _LOGGER.exception("an event listener failed on %r", event)
        for queue in self._subscribers:
            if queue.wanted is not None and not self._wanted(queue.wanted, event):
                continue
            self._offer(queue, event)
        if key is not None and (keyed := self._keyed.get(key)):
            for queue in keyed:
                if queue.wanted is None or self._wanted(queue.wanted, event):
                    self._offer(queue, event)

    def _offer(self, queue: Subscription[T], event: T) -> None:
        try:
            queue.put_nowait(event)  # it looks whether it is full itself: no second look first
        except asyncio.QueueFull:
            queue.drop_oldest()
            self.dropped += 1
            queue.put_nowait(event)

    def reaches(self, key: Hashable = None) -> bool:
        """Whether an event published now (for ``key``) would reach anyone: a publisher that
        must make the event first (encode it) skips that for nobody."""
        if self._subscribers or self._listeners:
            return True
        return key is not None and key in self._keyed

    def _wanted(self, wanted: Callable[[T], bool], event: T) -> bool:
        try:
            return wanted(event)
        except Exception:  # a filter's bug: the subscriber gets the event rather than a hole
            self.listener_errors += 1
            _LOGGER.exception("an event filter failed on %r", event)
            return True

    def subscribe(
        self, wanted: Callable[[T], bool] | None = None, *, key: Hashable = None
    ) -> _Subscribed[T]:
        """``async with bus.subscribe() as queue``: a queue of every event published from now on
        (only those ``wanted``, when given: quick and synchronous, called in ``publish``), for
        as long as the context runs.

        ``key``: only the events published for that key (``publish(event, key)``), found by
        the key rather than by a filter called on every event (a stream of one sale)."""
        return _Subscribed(self, Subscription(self._queue_size, wanted), key)

    def _add(self, queue: Subscription[T], key: Hashable) -> None:
        if key is None:
            self._subscribers.add(queue)
        else:
            self._keyed.setdefault(key, set()).add(queue)

    def _drop(self, queue: Subscription[T], key: Hashable) -> None:
        if key is None:
            self._subscribers.discard(queue)
        else:
            self._drop_keyed(key, queue)

    def _drop_keyed(self, key: Hashable, queue: Subscription[T]) -> None:
        keyed = self._keyed.get(key)
        if keyed is not None:
            keyed.discard(queue)
            if not keyed:
                del self._keyed[key]

    def listen(
        self, listener: Callable[[T], None], *, kinds: Collection[Hashable] | None = None
    ) -> Callable[[], None]:
        """Call ``listener(event)`` on every publish, in it (quick and synchronous only);
        returns the function that stops it.

        ``kinds``: the only kinds of event (the bus's ``kind``) the listener acts on; the
        others do not call it (a listener of sales' ends is not called on each of their steps).
        A hint, not a filter the listener may rely on: a bus with no ``kind`` calls it on all."""
        entry = (listener, kinds)
        self._listeners.append(entry)

        def stop() -> None:
            if entry in self._listeners:
                self._listeners.remove(entry)

        return stop

    async def listen_until_cancelled(
        self, listener: Callable[[T], None], *, kinds: Collection[Hashable] | None = None
    ) -> None:
        """``listen`` for as long as the calling task runs (an owner's background task)."""
        stop = self.listen(listener, kinds=kinds)
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            stop()

    @property
    def subscriber_count(self) -> int:
        keyed = sum(len(queues) for queues in self._keyed.values())
        return len(self._subscribers) + keyed + len(self._listeners)


class _Subscribed(Generic[T]):
    """A subscription while its context runs: a class, not a generator context manager (three
    Python calls where that took six, at each stream a kiosk API sale opens)."""

    __slots__ = ("_bus", "_key", "_queue")

    def __init__(self, bus: EventBus[T], queue: Subscription[T], key: Hashable) -> None:
        self._bus, self._queue, self._key = bus, queue, key

    async def __aenter__(self) -> Subscription[T]:
        self._bus._add(self._queue, self._key)
        return self._queue

    async def __aexit__(self, *_exc: object) -> None:
        self._bus._drop(self._queue, self._key)
