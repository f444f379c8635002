"""The event bus's subscriptions: a reader takes the next event, or stops when told to."""

from __future__ import annotations

import asyncio
import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.bus import EventBus, Subscription
from tests.helpers import PythonCalls


async def test_next_gives_the_event_or_none_once_told_to_stop() -> None:
    queue: Subscription[str] = Subscription(8)
    stop = asyncio.Event()
    stopper = asyncio.ensure_future(stop.wait())
    queue.put_nowait("completed")
    assert await queue.next(stopper) == "completed"

    waiting = asyncio.ensure_future(queue.next(stopper))
    await asyncio.sleep(0)
    stop.set()
    assert await waiting is None
    queue.put_nowait("receipt")  # nobody took it meanwhile: still there for the next reader
    assert await queue.next() == "receipt"


async def test_next_told_to_stop_takes_nothing_that_is_queued() -> None:
    queue: Subscription[str] = Subscription(8)
    stopped = asyncio.get_running_loop().create_future()
    stopped.set_result(None)
    queue.put_nowait("completed")
    assert await queue.next(stopped) is None
    assert queue.get_nowait() == "completed"  # left for whoever drains it


async def test_next_cancelled_by_a_timeout_leaves_no_reader_behind() -> None:
    queue: Subscription[str] = Subscription(8)
    never = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await queue.next(never)
    queue.put_nowait("completed")
    await asyncio.sleep(0)
    assert queue.get_nowait() == "completed"
    assert never.done() is False  # and nothing of the wait is left on it
    never.set_result(None)


async def test_a_published_event_wakes_its_reader_in_one_loop_turn() -> None:
    # a reader's getter task raced against its stop by asyncio.wait took three turns (the
    # getter's, its completion callback's, the reader's): a turn each event, on every stream
    bus: EventBus[str] = EventBus()
    async with bus.subscribe() as queue:
        stopper = asyncio.get_running_loop().create_future()
        reader = asyncio.ensure_future(queue.next(stopper))
        await asyncio.sleep(0)  # the reader waits
        bus.publish("approved")
        await asyncio.sleep(0)  # one turn
        assert reader.done()
        assert reader.result() == "approved"
        stopper.cancel()


async def test_two_readers_of_one_subscription_each_take_one_event() -> None:
    queue: Subscription[str] = Subscription(8)
    first = asyncio.ensure_future(queue.next())
    second = asyncio.ensure_future(queue.next())
    await asyncio.sleep(0)
    queue.put_nowait("a")
    await asyncio.sleep(0)
    queue.put_nowait("b")
    assert set(await asyncio.gather(first, second)) == {"a", "b"}


async def test_a_full_subscription_drops_the_oldest_and_says_how_many_before_the_next() -> None:
    bus: EventBus[int] = EventBus(queue_size=2)
    async with bus.subscribe() as queue:
        for step in range(5):
            bus.publish(step)
        assert await queue.next() == 3
        assert queue.take_missed() == 3  # 0, 1 and 2 were lost just before it
        assert await queue.next() == 4
        assert queue.take_missed() == 0
    assert bus.dropped == 3


async def test_a_keyed_subscriber_gets_its_keys_events_with_no_filter_called() -> None:
    # a stream of one sale: handed that sale's steps by key, not by a filter run on each step
    bus: EventBus[str] = EventBus(queue_size=3)
    assert not bus.reaches("s1")
    async with bus.subscribe(key="s1") as mine, bus.subscribe(lambda e: e != "x") as every:
        assert bus.reaches("s1")
        assert bus.reaches("s2")  # the unkeyed one hears every key
        bus.publish("a", "s1")
        bus.publish("b", "s2")
        bus.publish("c")
        assert [mine.get_nowait()] == ["a"]
        assert mine.empty()
        assert [every.get_nowait(), every.get_nowait(), every.get_nowait()] == ["a", "b", "c"]
        for step in "defgh":
            bus.publish(step, "s1")
        assert await mine.next() == "f"  # full at three: the oldest lost, and counted
        assert mine.take_missed() == 2
        assert bus.subscriber_count == 2
    assert bus.subscriber_count == 0
    assert not bus.reaches("s1")
    assert bus.dropped == 2 + 2  # each subscriber lost two of d..h


async def test_a_keyed_subscriber_with_a_filter_gets_only_its_keys_events_it_wants() -> None:
    bus: EventBus[str] = EventBus()
    async with bus.subscribe(lambda e: e != "note", key="s1") as mine:
        bus.publish("note", "s1")
        bus.publish("approved", "s1")
        assert mine.get_nowait() == "approved"
        assert mine.empty()


@given(st.lists(st.one_of(st.integers(0, 99), st.none()), max_size=40), st.integers(1, 4))
def test_a_subscription_keeps_the_newest_and_counts_each_loss_before_the_next_taken(
    script: list[int | None], size: int
) -> None:
    # the queue a stream reads, against a model of it: a number is published, None is a take
    asyncio.run(_follow_script(script, size))


async def _follow_script(script: list[int | None], size: int) -> None:
    bus: EventBus[int] = EventBus(queue_size=size)
    kept: collections.deque[int] = collections.deque()
    lost = every_loss = 0
    async with bus.subscribe() as queue:
        for item in script:
            if item is not None:
                bus.publish(item)
                if len(kept) == size:
                    kept.popleft()
                    lost += 1
                    every_loss += 1
                kept.append(item)
            elif kept:
                assert queue.get_nowait() == kept.popleft()
                assert queue.take_missed() == lost
                lost = 0
            else:
                with pytest.raises(asyncio.QueueEmpty):
                    queue.get_nowait()
            assert queue.qsize() == len(kept)
            assert queue.full() == (len(kept) == size)
    assert bus.dropped == every_loss


async def test_a_get_waits_for_the_next_event_and_a_cancelled_one_takes_nothing() -> None:
    bus: EventBus[str] = EventBus()
    async with bus.subscribe() as queue:
        given_up = asyncio.ensure_future(queue.get())
        await asyncio.sleep(0)
        given_up.cancel()
        await asyncio.sleep(0)
        waiting = asyncio.ensure_future(queue.get())
        await asyncio.sleep(0)
        bus.publish("approved")
        assert await waiting == "approved"
        assert queue.empty()


async def test_an_event_reaches_a_subscriber_and_is_taken_in_a_few_python_calls() -> None:
    # asyncio.Queue under a subscription made a put and a take a dozen Python calls (its full(),
    # qsize(), _put, _get and _wakeup_next hooks, ours over them): five or six a sale's stream
    bus: EventBus[str] = EventBus()
    async with bus.subscribe(key="s1") as queue:
        with PythonCalls() as calls:
            bus.publish("approved", "s1")
            taken = queue.get_nowait()
            missed = queue.take_missed()
    assert (taken, missed) == ("approved", 0)
    assert len(calls) <= 6, calls


async def test_a_subscription_is_entered_and_left_in_a_few_python_calls() -> None:
    # a generator context manager (asynccontextmanager) around an asyncio.Queue took 15 Python
    # calls to enter and leave: a kiosk API sale's own stream opens one
    bus: EventBus[str] = EventBus()
    with PythonCalls() as calls:
        async with bus.subscribe(key="s1"):
            assert bus.reaches("s1")
    assert not bus.reaches("s1")
    assert len(calls) <= 8 + 2, calls  # and the two looks of reaches()


async def test_a_listener_of_some_kinds_is_not_called_on_the_others() -> None:
    # availability's listener wants a failed end and attention's an ended sale, yet each was
    # called on every step of every sale: two Python calls a step for nothing
    bus: EventBus[str] = EventBus(kind=len)
    heard: list[str] = []
    every: list[str] = []
    stop = bus.listen(heard.append, kinds={3})
    bus.listen(every.append)
    for event in ("one", "three", "six", "seven"):
        bus.publish(event)
    assert heard == ["one", "six"]
    assert every == ["one", "three", "six", "seven"]
    stop()
    bus.publish("two")
    assert heard == ["one", "six"]
    assert bus.subscriber_count == 1


async def test_kinds_are_a_hint_a_bus_without_a_kind_calls_every_listener() -> None:
    bus: EventBus[str] = EventBus()
    heard: list[str] = []
    bus.listen(heard.append, kinds={3})
    bus.publish("three")
    assert heard == ["three"]
