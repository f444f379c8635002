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
        assert isinstance(slow, asyncio.Queue)


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
