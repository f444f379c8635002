"""Background tasks: stopped by cancelling and waiting until they have really ended."""

from __future__ import annotations

import asyncio

import pytest

from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.tasks import (
    BackgroundTask,
    TaskSet,
    cancel_and_wait,
    cancel_and_wait_within,
    cancel_requested,
    wait_event,
)


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



async def test_a_cancel_of_the_caller_while_it_waits_for_a_cancelled_task_goes_on() -> None:
    """A stop cancelled while it waits for its task's cleanup ends cancelled: that cancel is the
    stop's (a bound around it), not the task's, and was swallowed before."""
    cleaning, ending = asyncio.Event(), asyncio.Event()

    async def slow_to_end() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaning.set()
            await ending.wait()  # a cleanup that waits for something

    task = asyncio.create_task(slow_to_end())
    await asyncio.sleep(0)
    stop = asyncio.create_task(cancel_and_wait(task))
    await cleaning.wait()
    stop.cancel()  # asyncio passes it on to the task it waits for, too
    done, _ = await asyncio.wait({stop}, timeout=5)
    assert done == {stop}
    assert stop.cancelled(), "the stop's own cancel was swallowed"
    assert task.cancelled()
    assert not ending.is_set()


async def test_cancel_and_wait_in_a_cleanup_after_the_callers_own_cancel_returns() -> None:
    """An owner cancelled already (its ``finally`` ends its children) still waits for each."""
    child = asyncio.create_task(asyncio.sleep(60))
    waited = []

    async def owner() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await cancel_and_wait(child)
            waited.append(child.cancelled())

    task = asyncio.create_task(owner())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert waited == [True]

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


async def test_a_cancel_a_library_turned_into_its_error_is_still_asked() -> None:
    """A library waiting with ``asyncio.wait_for`` on Python 3.11 (aiomqtt, for the broker's
    answer) raises the answer's error in place of a cancel that lands with it; the loop around
    it asks ``cancel_requested`` before it goes round, and ends."""
    answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    errors = []

    async def reconnects_until_cancelled() -> None:
        while True:
            try:
                await asyncio.wait_for(answer, 60)
            except ConnectionRefusedError as err:
                errors.append(err)
            if cancel_requested():
                raise asyncio.CancelledError
            await asyncio.sleep(60)  # the back-off: a lost cancel would wait here for ever

    task = asyncio.create_task(reconnects_until_cancelled())
    await asyncio.sleep(0)  # it waits for the answer now
    answer.set_exception(ConnectionRefusedError("not authorized"))
    task.cancel()  # in the same turn
    done, _ = await asyncio.wait({task}, timeout=2)
    assert len(errors) == 1  # the library did hand back its error in place of the cancel
    assert done == {task}, "the cancellation was lost: the loop runs on"
    assert task.cancelled()


async def test_no_cancel_is_asked_of_a_task_whose_own_timeout_fired() -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0):
            await asyncio.sleep(1)
    assert not cancel_requested()


async def test_a_bounded_stop_raises_what_the_task_failed_with() -> None:
    async def broken() -> None:
        raise RuntimeError("the socket vanished")

    task = asyncio.create_task(broken())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="the socket vanished"):
        await cancel_and_wait_within(task, 1.0, FakeClock().wait_for)


async def test_a_bounded_stop_of_a_task_that_ends_at_the_cancel_waits_no_time() -> None:
    task = asyncio.create_task(asyncio.sleep(60))
    await asyncio.sleep(0)
    # a clock nobody moves: had the stop waited for its bound, it would never return
    assert await asyncio.wait_for(cancel_and_wait_within(task, 1.0, FakeClock().wait_for), 5)
    assert task.cancelled()
