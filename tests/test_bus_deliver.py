"""Attacks on the subscription as i36-sale changed it: a deque with its readers, and a ``deliver``
hook that takes an event at once (a kiosk API stream writing it) while nothing is queued."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.bus import EventBus, Subscription


def _consume(
    queue: Subscription[int], ops: list[tuple[str, bool]]
) -> tuple[list[int | str], int]:
    """Run ``ops`` (put, taking it at once or not; take) and return what the reader saw: each
    event in the order it reached the reader, a gap ("-N") where N were lost before it."""
    seen: list[int | str] = []
    accept = [True]

    def deliver(item: int) -> bool:
        if accept[0]:
            seen.append(item)  # no way to tell the reader of a loss here
        return accept[0]

    def take() -> None:
        item = queue.get_nowait()
        missed = queue.take_missed()
        if missed:
            seen.append(f"-{missed}")
        seen.append(item)

    queue.deliver = deliver
    published = 0
    for op, takes in ops:
        if op == "put":
            accept[0] = takes
            try:
                queue.put_nowait(published)
            except asyncio.QueueFull:
                queue.drop_oldest()
                queue.put_nowait(published)
            published += 1
        elif not queue.empty():
            take()
    while not queue.empty():
        take()
    return seen, published


@given(
    maxsize=st.integers(1, 4),
    ops=st.lists(st.tuples(st.sampled_from(["put", "put", "take"]), st.booleans()), max_size=60),
)
def test_what_is_delivered_at_once_and_what_is_taken_is_every_event_in_order_or_a_counted_gap(
    maxsize: int, ops: list[tuple[str, bool]]
) -> None:
    """Whatever mix of events taken at once and queued, the reader sees them in the order they
    were put, and every loss is said (a gap of exactly that many) before the next it sees."""
    seen, published = _consume(Subscription(maxsize), ops)
    expected = 0
    for entry in seen:
        if isinstance(entry, str):
            expected += int(entry[1:])
        else:
            assert entry == expected, (seen, "a hole nobody was told of, or out of order")
            expected += 1
    assert expected == published


def test_an_event_after_a_loss_is_queued_so_the_loss_is_said_before_it() -> None:
    """A subscription of one: full, its oldest dropped for a new event, so nothing is queued;
    the new event must still be queued (its reader says the gap first), not handed on at once."""
    queue: Subscription[int] = Subscription(1)
    taken: list[int] = []
    queue.deliver = lambda item: bool(taken.append(item)) or False  # refuses: queued
    queue.put_nowait(1)
    queue.deliver = lambda item: not taken.append(item)  # would take it now
    taken.clear()
    with pytest.raises(asyncio.QueueFull):
        queue.put_nowait(2)
    queue.drop_oldest()
    queue.put_nowait(2)
    assert taken == []
    assert queue.get_nowait() == 2
    assert queue.take_missed() == 1


async def test_an_event_delivered_at_once_wakes_no_reader_and_one_refused_wakes_it() -> None:
    queue: Subscription[str] = Subscription(8)
    accept = True
    queue.deliver = lambda item: accept
    reader = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    queue.put_nowait("at once")
    await asyncio.sleep(0)
    assert not reader.done()
    assert queue.empty()
    accept = False
    queue.put_nowait("queued")
    assert await asyncio.wait_for(reader, 1) == "queued"


async def test_a_subscription_whose_body_raises_is_left_and_its_deliver_no_longer_called() -> None:
    bus: EventBus[str] = EventBus()
    delivered: list[str] = []

    async def stream() -> None:
        async with bus.subscribe(key="s1") as queue:
            queue.deliver = lambda item: not delivered.append(item)
            bus.publish("charging", "s1")
            raise RuntimeError("the stream's loop failed")

    with pytest.raises(RuntimeError):
        await stream()
    bus.publish("completed", "s1")
    assert delivered == ["charging"]
    assert bus.subscriber_count == 0
    assert not bus.reaches("s1")


@pytest.mark.parametrize("how", ["get", "next"])
async def test_a_reader_woken_then_cancelled_leaves_the_event_to_the_other_reader(how: str) -> None:
    """asyncio.Queue handed a cancelled getter's wake-up to the next one; the deque wakes every
    reader instead: one cancelled after its wake-up (before it ran) loses no event."""
    queue: Subscription[str] = Subscription(8)
    stop = asyncio.get_running_loop().create_future()

    def read() -> asyncio.Future[str | None]:
        return asyncio.ensure_future(queue.get() if how == "get" else queue.next(stop))

    first, second = read(), read()
    await asyncio.sleep(0)
    queue.put_nowait("completed")
    first.cancel()  # woken, not yet run
    assert await asyncio.wait_for(second, 1) == "completed"
    assert first.cancelled()
    third = read()
    await asyncio.sleep(0)
    third.cancel()  # alone, cancelled while it waits: nothing taken, nobody left waiting
    queue.put_nowait("receipt")
    with pytest.raises(asyncio.CancelledError):
        await third
    assert queue.get_nowait() == "receipt"
    assert queue._readers == []
    assert not stop.done()
