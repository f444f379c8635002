"""Background tasks: stopped by cancelling and waiting until they have really ended."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kiosk_agent.tasks import BackgroundTask, TaskSet, cancel_and_wait, read_ahead, wait_event


async def test_cancel_and_wait_returns_once_the_task_has_run_its_cleanup() -> None:
    cleaned = asyncio.Event()

    async def holds_a_port() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0)  # a close that takes a turn of the loop
            cleaned.set()

    task = asyncio.create_task(holds_a_port())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.cancelled()
    assert cleaned.is_set()


async def test_cancel_and_wait_accepts_no_task() -> None:
    await cancel_and_wait(None)


async def test_cancel_and_wait_raises_what_the_task_failed_with() -> None:
    async def broken() -> None:
        raise RuntimeError("the port vanished")

    task = asyncio.create_task(broken())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="the port vanished"):
        await cancel_and_wait(task)


async def test_task_set_forgets_finished_tasks_and_ends_the_rest() -> None:
    tasks = TaskSet()
    quick = tasks.spawn(asyncio.sleep(0), name="quick")
    slow = tasks.spawn(asyncio.sleep(60), name="slow")
    await quick
    await asyncio.sleep(0)  # the done callback runs on the next turn
    assert len(tasks) == 1
    await tasks.cancel_all()
    assert slow.cancelled()
    assert slow.get_name() == "slow"
    assert len(tasks) == 0


async def test_a_background_task_starts_once_and_stops_for_good() -> None:
    rounds = 0

    async def heartbeat() -> None:
        nonlocal rounds
        while True:
            rounds += 1
            await asyncio.sleep(0)

    loop = BackgroundTask(heartbeat, "heartbeat")
    loop.start()
    loop.start()  # already started: still one loop
    assert loop.started
    await asyncio.sleep(0.01)
    await loop.stop()
    assert not loop.started
    stopped_at = rounds
    await asyncio.sleep(0.01)
    assert rounds == stopped_at > 0
    await loop.stop()  # a second stop is harmless


async def test_wait_event_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 5) is True


async def test_a_stop_that_lands_as_the_event_is_set_still_ends_the_loop() -> None:
    """A loop that waits on an event between rounds, cancelled in the very step the event is
    set (a stop right after a wake): the cancellation must end it. ``asyncio.wait_for`` on
    Python 3.11 returned normally here and the loop ran on; its owner's stop never ended."""
    event = asyncio.Event()
    rounds = 0

    async def rounds_until_cancelled() -> None:
        nonlocal rounds
        while True:
            rounds += 1
            event.clear()
            await wait_event(event, 60)

    task = asyncio.create_task(rounds_until_cancelled())
    await asyncio.sleep(0)  # it waits now
    event.set()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    assert done == {task}, "the cancellation was lost: the loop runs on"
    assert task.cancelled()
    assert rounds == 1


class Source:
    """A collection read over the network: its first item waits for ``answer`` (its round
    trip); records whether it was asked, is in flight, and was closed."""

    def __init__(self, items: list[int], fails: bool = False) -> None:
        self.items, self.fails = items, fails
        self.asked = self.closed = False
        self.answer = asyncio.Event()
        self.in_flight: list[Source] = []  # shared by the sources of one test

    async def rows(self) -> AsyncIterator[int]:
        self.asked = True
        self.in_flight.append(self)
        try:
            try:
                await self.answer.wait()
            finally:
                self.in_flight.remove(self)
            if self.fails:
                raise ConnectionError("reporting went away")
            for item in self.items:
                yield item
        finally:
            self.closed = True


def sources(*made: Source) -> list[Source]:
    in_flight: list[Source] = []
    for source in made:
        source.in_flight = in_flight
    return list(made)


async def _answer_when_asked(all_sources: list[Source], most_in_flight: list[int]) -> None:
    """Answers every source once asked, noting how many were in flight together."""
    while not all(s.answer.is_set() for s in all_sources):
        await asyncio.sleep(0)
        most_in_flight.append(len(all_sources[0].in_flight))
        for source in all_sources:
            if source.asked:
                source.answer.set()


async def test_read_ahead_gives_every_item_in_the_sources_order_with_their_round_trips_together(
) -> None:
    made = sources(Source([1, 2]), Source([]), Source([3]), Source([4, 5]), Source([6]))
    in_flight: list[int] = []
    answering = asyncio.create_task(_answer_when_asked(made, in_flight))
    read = [pair async for pair in read_ahead([(n, s.rows()) for n, s in enumerate(made)], 3)]
    await answering
    assert read == [(0, 1), (0, 2), (2, 3), (3, 4), (3, 5), (4, 6)]
    assert max(in_flight) == 3  # three asked at once, never more
    assert all(s.closed for s in made if s.items)


async def test_read_ahead_one_at_a_time_asks_the_next_source_only_once_one_is_read() -> None:
    made = sources(Source([1]), Source([2]), Source([3]))
    in_flight: list[int] = []
    answering = asyncio.create_task(_answer_when_asked(made, in_flight))
    read = [pair async for pair in read_ahead([(n, s.rows()) for n, s in enumerate(made)], 1)]
    await answering
    assert read == [(0, 1), (1, 2), (2, 3)]
    assert max(in_flight) == 1


async def test_a_source_that_fails_ends_the_read_and_every_source_started_is_ended() -> None:
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    made = sources(Source([1]), Source([2], fails=True), Source([3]), Source([4]))
    for source in made[:3]:
        source.answer.set()  # the fourth is still in flight when the second fails
    read: list[tuple[int, int]] = []

    async def read_all() -> None:
        async for pair in read_ahead([(n, s.rows()) for n, s in enumerate(made)], 4):
            read.append(pair)

    with pytest.raises(ConnectionError):
        await read_all()
    assert read == [(0, 1)]
    assert made[3].asked
    assert not made[3].in_flight  # its round trip was cancelled, not left running
    assert made[3].closed
    assert made[2].closed  # started and answered, never read: closed all the same
    await asyncio.sleep(0)
    assert unretrieved == []
    loop.set_exception_handler(None)


async def test_leaving_a_read_early_ends_the_sources_asked_ahead() -> None:
    made = sources(Source([1, 2]), Source([3]), Source([4]))
    for source in made:
        source.answer.set()
    reader = read_ahead([(n, s.rows()) for n, s in enumerate(made)], 3)
    assert await anext(reader) == (0, 1)
    await reader.aclose()
    assert all(s.asked for s in made)
    assert all(s.closed for s in made)
    assert not made[0].in_flight
