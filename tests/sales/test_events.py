import asyncio

from kiosk_agent.bus import EventBus


async def test_each_subscriber_sees_every_event() -> None:
    bus: EventBus[int] = EventBus()
    async with bus.subscribe() as first, bus.subscribe() as second:
        bus.publish(1)
        bus.publish(2)
        assert [first.get_nowait(), first.get_nowait()] == [1, 2]
        assert [second.get_nowait(), second.get_nowait()] == [1, 2]
    assert bus.subscriber_count == 0


async def test_a_slow_subscriber_loses_the_oldest_not_the_publisher() -> None:
    bus: EventBus[int] = EventBus(queue_size=2)
    async with bus.subscribe() as slow:
        for n in range(5):
            bus.publish(n)
        assert [slow.get_nowait(), slow.get_nowait()] == [3, 4]
        assert bus.dropped == 3
        assert slow.empty()  # the two kept were taken; nothing left behind


async def test_a_listener_is_called_in_publish_and_its_error_stays_its_own() -> None:
    bus: EventBus[int] = EventBus()
    heard: list[int] = []

    def broken(event: int) -> None:
        raise ValueError(f"cannot take {event}")

    stop_broken = bus.listen(broken)
    stop = bus.listen(heard.append)
    async with bus.subscribe() as queue:
        bus.publish(1)  # no await: the listeners have it already
        assert heard == [1]
        assert queue.get_nowait() == 1
        assert bus.listener_errors == 1
        stop()
        stop_broken()
        bus.publish(2)
    assert heard == [1]
    assert bus.listener_errors == 1
    assert bus.subscriber_count == 0


async def test_a_slow_subscriber_learns_how_many_it_missed_and_where() -> None:
    bus: EventBus[int] = EventBus(queue_size=2)
    async with bus.subscribe() as slow:
        bus.publish(0)
        assert slow.get_nowait() == 0
        assert slow.take_missed() == 0
        for n in range(1, 6):
            bus.publish(n)  # 1, 2 and 3 are lost: the queue holds 4 and 5
        assert slow.get_nowait() == 4
        assert slow.take_missed() == 3  # between 0, taken before, and 4
        assert slow.get_nowait() == 5
        assert slow.take_missed() == 0


async def test_a_subscriber_queues_only_what_it_wants_and_counts_only_those_lost() -> None:
    bus: EventBus[int] = EventBus(queue_size=2)

    def broken(event: int) -> bool:
        raise ValueError(f"cannot judge {event}")

    async with bus.subscribe(lambda n: n % 2 == 0) as evens, bus.subscribe(broken) as all_:
        for n in range(7):
            bus.publish(n)
        assert evens.get_nowait() == 4
        assert evens.take_missed() == 2  # 0 and 2; the odd ones were never its
        assert evens.get_nowait() == 6
        assert [all_.get_nowait(), all_.get_nowait()] == [5, 6]  # a broken filter: not a hole
        assert bus.listener_errors == 7


async def test_the_gap_is_placed_before_the_item_a_waiting_reader_takes() -> None:
    """A reader already waiting in get() takes its item only when its task runs: what is lost
    meanwhile lies before whatever it then takes, and it is told so with that item."""
    bus: EventBus[int] = EventBus(queue_size=2)
    async with bus.subscribe() as slow:
        getter = asyncio.ensure_future(slow.get())
        await asyncio.sleep(0)  # waiting
        for n in range(5):
            bus.publish(n)  # before the reader runs: 0, 1 and 2 are lost
        assert await getter == 3
        assert slow.take_missed() == 3
        assert slow.take_missed() == 0  # told once
        assert slow.get_nowait() == 4
        assert slow.take_missed() == 0
