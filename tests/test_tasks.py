"""Background tasks: stopped by cancelling and waiting until they have really ended."""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from kiosk_agent.sales.clock import FakeClock
from kiosk_agent.tasks import (
    BackgroundTask,
    EagerStart,
    FirstStep,
    TaskSet,
    cancel_and_wait,
    cancel_and_wait_within,
    cancel_requested,
    read_ahead,
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


@pytest.mark.parametrize(
    "stop",
    [cancel_and_wait, lambda task: cancel_and_wait_within(task, 1.0, FakeClock().wait_for)],
    ids=["cancel_and_wait", "cancel_and_wait_within"],
)
async def test_a_stop_raises_what_the_task_failed_with(
    stop: Callable[[asyncio.Task[None]], Awaitable[object]],
) -> None:
    async def broken() -> None:
        raise RuntimeError("the port vanished")

    task = asyncio.create_task(broken())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="the port vanished"):
        await stop(task)



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
    # the library did hand back its error in place of the cancel: Python 3.11's wait_for; from
    # 3.12 on wait_for is asyncio.timeout's, which lets the cancel through
    assert len(errors) == (1 if sys.version_info < (3, 12) else 0)
    assert done == {task}, "the cancellation was lost: the loop runs on"
    assert task.cancelled()


async def test_no_cancel_is_asked_of_a_task_whose_own_timeout_fired() -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0):
            await asyncio.sleep(1)
    assert not cancel_requested()


async def test_a_bounded_stop_of_a_task_that_ends_at_the_cancel_waits_no_time() -> None:
    task = asyncio.create_task(asyncio.sleep(60))
    await asyncio.sleep(0)
    # a clock nobody moves: had the stop waited for its bound, it would never return
    assert await asyncio.wait_for(cancel_and_wait_within(task, 1.0, FakeClock().wait_for), 5)
    assert task.cancelled()


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


async def test_first_step_runs_work_that_makes_no_wait_to_its_end_in_the_callers_turn() -> None:
    ran: list[str] = []

    async def journal_and_start() -> str:
        ran.append("started")
        return "sale-1"

    step = FirstStep(journal_and_start())
    assert ran == ["started"]  # no loop turn has passed
    assert step.done
    assert step.ended_well
    assert step.result() == "sale-1"
    assert await step == "sale-1"


async def test_first_step_leaves_the_rest_of_work_that_waits_to_whoever_awaits_it() -> None:
    go = asyncio.Event()
    ran: list[str] = []

    async def waits_for_the_terminal() -> str:
        ran.append("asked")
        await go.wait()
        ran.append("answered")
        return "sale-2"

    step = FirstStep(waits_for_the_terminal())
    assert ran == ["asked"]
    assert not step.done
    with pytest.raises(RuntimeError, match="not ended"):
        step.result()
    task = asyncio.ensure_future(_awaited(step))
    await asyncio.sleep(0)
    go.set()
    assert await task == "sale-2"
    assert ran == ["asked", "answered"]
    assert step.done
    assert step.ended_well


async def _awaited(step: FirstStep[str]) -> str:
    return await step


async def test_first_step_raises_an_error_where_it_is_awaited_as_a_task_would() -> None:
    async def refused() -> str:
        raise ValueError("no terminal")

    step = FirstStep(refused())  # not raised here: the caller's turn goes on
    assert step.done
    assert not step.ended_well
    with pytest.raises(ValueError, match="no terminal"):
        await step


async def test_a_cancel_of_whoever_awaits_a_first_step_reaches_the_work() -> None:
    cleaned: list[str] = []

    async def waits() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.append("cleaned")

    step = FirstStep(waits())
    task = asyncio.ensure_future(_awaited_none(step))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["cleaned"]


async def _awaited_none(step: FirstStep[None]) -> None:
    await step


_SALE: contextvars.ContextVar[str] = contextvars.ContextVar("sale", default="none")


def _eager_from_a_callback(work: Any, made: list[EagerStart[Any]], seen: list[Any]) -> None:
    """What a line's callback does (no task current): keep the task, then run its first step."""
    starting = EagerStart(work, name="sale-1")
    made.append(starting)
    seen.append(asyncio.current_task())  # nobody's before the step
    starting.first_step()
    seen.append(asyncio.current_task())  # and after it


async def test_an_eager_start_runs_the_first_step_in_the_makers_turn_as_the_task() -> None:
    # the sale's first step, up to its read-card request, in the turn that read the customer's
    # line: asyncio.timeout and aiohttp's timers ask for the current task, which is the sale's
    ran: list[Any] = []
    go = asyncio.Event()

    async def sale() -> str:
        ran.append(asyncio.current_task())
        _SALE.set("mine")
        async with asyncio.timeout(10):  # needs the task: raises outside one
            await go.wait()
        ran.append(_SALE.get())
        return "completed"

    made: list[EagerStart[str]] = []
    seen: list[Any] = []
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.call_soon(lambda: (_eager_from_a_callback(sale(), made, seen), done.set_result(None)))
    await done  # the callback's turn is over: no loop turn has run the task yet
    [starting] = made
    assert ran == [starting.task]  # the first step ran, as the task, in the callback
    assert seen == [None, None]
    assert _SALE.get() == "none"  # the task's own context, not the maker's
    go.set()
    assert await starting.task == "completed"
    assert ran == [starting.task, "mine"]


async def test_an_eager_start_from_a_task_leaves_that_task_current_after_the_step() -> None:
    caller = asyncio.current_task()
    inside: list[Any] = []

    async def work() -> int:
        inside.append(asyncio.current_task())
        await asyncio.sleep(0)
        return 3

    starting = EagerStart(work())
    starting.first_step()
    assert inside == [starting.task]
    assert asyncio.current_task() is caller
    assert await starting.task == 3


async def test_an_eager_starts_first_step_that_ends_or_fails_is_the_tasks_end() -> None:
    async def ends() -> str:
        return "refused at once"

    async def fails() -> str:
        raise ValueError("no terminal")

    ended, failed = EagerStart(ends()), EagerStart(fails())
    ended.first_step()
    failed.first_step()  # not raised here: the maker's turn goes on
    assert await ended.task == "refused at once"
    with pytest.raises(ValueError, match="no terminal"):
        await failed.task


async def test_a_cancel_before_an_eager_tasks_scheduled_step_reaches_the_work_where_it_waits() -> (
    None
):
    cleaned: list[str] = []
    waited_on: list[asyncio.Future[None]] = []

    async def waits() -> None:
        fut = asyncio.get_running_loop().create_future()
        waited_on.append(fut)
        try:
            await fut
        finally:
            cleaned.append("cleaned")

    starting = EagerStart(waits())
    starting.first_step()
    starting.task.cancel()  # before the loop ran the task's first scheduled step
    with pytest.raises(asyncio.CancelledError):
        await starting.task
    assert cleaned == ["cleaned"]
    assert waited_on[0].cancelled()  # what it waited on is cancelled, as a task's cancel does


async def test_a_cancel_before_an_eager_tasks_scheduled_step_waits_for_the_task_it_awaits() -> None:
    # a task's cancel cancels what it waits on and waits for that to end (a task awaited: its
    # own cleanup first, as it would for a task made by create_task); the eager task did not
    # wait: its await raised at once while the task it awaited still cleaned up
    steps: list[str] = []

    async def inner() -> None:
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            await asyncio.sleep(0)  # a cleanup that takes a turn (a socket's close)
            steps.append("inner cleaned")

    waiting = asyncio.ensure_future(inner())
    await asyncio.sleep(0)  # the inner task waits now

    async def work() -> None:
        try:
            await waiting
        finally:
            steps.append("work cleaned")

    starting = EagerStart(work())
    starting.first_step()
    starting.task.cancel("the customer cancelled")  # before the task's scheduled step
    with pytest.raises(asyncio.CancelledError):
        await starting.task
    assert steps == ["inner cleaned", "work cleaned"]


async def test_a_cancel_inside_an_eager_first_step_reaches_its_first_wait() -> None:
    # the work cancels its task (a stop, the customer's cancel heard within the step) or its own
    # timeout has passed by its first wait: as in a task made by create_task
    seen: list[str] = []

    async def cancels_itself() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            seen.append("cancelled at its wait")
            raise

    async def times_out() -> str:
        try:
            async with asyncio.timeout(0):
                await asyncio.get_running_loop().create_future()
        except TimeoutError:
            return "timed out"
        return "waited"

    cancelled, timed = EagerStart(cancels_itself()), EagerStart(times_out())
    cancelled.first_step()
    timed.first_step()
    with pytest.raises(asyncio.CancelledError):
        await cancelled.task
    assert seen == ["cancelled at its wait"]
    assert await timed.task == "timed out"


async def test_an_eager_first_steps_error_does_not_reach_the_callback_that_made_it() -> None:
    # the line's callback (the serial protocol's data_received) goes on to its next line: the
    # error is the task's, taken where it is awaited; the loop's exception handler hears nothing
    loop = asyncio.get_running_loop()
    handled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: handled.append(context))
    after: list[str] = []
    made: list[EagerStart[None]] = []

    async def fails() -> None:
        raise ValueError("the journal is full")

    def on_line() -> None:
        made.append(EagerStart(fails()))
        made[0].first_step()
        after.append("next line")

    try:
        loop.call_soon(on_line)
        await asyncio.sleep(0)
        assert after == ["next line"]
        with pytest.raises(ValueError, match="the journal is full"):
            await made[0].task
        await asyncio.sleep(0)
        assert handled == []
    finally:
        loop.set_exception_handler(None)


async def test_an_eager_start_inside_an_eager_first_step_is_its_own_task_then_the_outers() -> None:
    # a sale started from the step of another (a card-first offer made as a sale ends at once)
    current: list[tuple[str, asyncio.Task[Any] | None]] = []
    made: list[EagerStart[Any]] = []

    async def inner() -> str:
        current.append(("inner", asyncio.current_task()))
        async with asyncio.timeout(5):
            await asyncio.sleep(0)
        return "inner done"

    async def outer() -> str:
        current.append(("outer", asyncio.current_task()))
        made.append(EagerStart(inner()))
        made[-1].first_step()
        current.append(("outer again", asyncio.current_task()))
        async with asyncio.timeout(5):  # needs its own task current again
            await asyncio.sleep(0)
        return "outer done"

    starting = EagerStart(outer())
    starting.first_step()
    assert asyncio.current_task() is not starting.task
    [nested] = made
    assert current == [("outer", starting.task), ("inner", nested.task),
                       ("outer again", starting.task)]
    assert await starting.task == "outer done"
    assert await nested.task == "inner done"


@pytest.mark.skipif(sys.version_info < (3, 12), reason="asyncio.eager_task_factory is 3.12's")
async def test_an_eager_start_under_an_eager_task_factory_runs_its_first_step_once() -> None:
    # the loop's factory already ran the first step in the making: the hand-run one must not
    # send into the work again (a send into a work awaiting a future: "await wasn't used with
    # future" inside the sale's flow)
    loop = asyncio.get_running_loop()
    steps: list[str] = []
    go = loop.create_future()

    async def work() -> str:
        steps.append("first")
        await asyncio.sleep(0)  # a bare yield: a second send runs the work on from here
        steps.append("on")
        await go
        steps.append("second")
        return "done"

    loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined,unused-ignore]
    try:
        starting = EagerStart(work())
        starting.first_step()
    finally:
        loop.set_task_factory(None)
    assert steps == ["first"]  # run once, by the factory (nothing run again by hand)
    go.set_result(None)
    assert await starting.task == "done"
    assert steps == ["first", "on", "second"]


def test_an_eager_first_steps_system_exit_leaves_the_loop_once() -> None:
    # SystemExit (or KeyboardInterrupt) in the first step goes out of the maker's turn at once,
    # as out of a task's step; the task then ends cancelled: its scheduled step must not raise
    # it a second time out of asyncio.run's own cleanup (which cancels the tasks left, then
    # closes the async generators and the executor)
    loop = asyncio.new_event_loop()
    made: list[EagerStart[None]] = []

    async def exits() -> None:
        raise SystemExit(3)

    def on_line() -> None:
        made.append(EagerStart(exits()))
        made[0].first_step()

    async def idle() -> None:
        await asyncio.sleep(5)

    try:
        loop.call_soon(on_line)
        with pytest.raises(SystemExit):
            loop.run_until_complete(idle())
        [starting] = made
        loop.run_until_complete(asyncio.wait({starting.task}, timeout=1))  # once, not again
        assert starting.task.cancelled()
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


@pytest.mark.parametrize("hidden", ["_enter_task", "_leave_task"])
async def test_an_eager_start_without_asyncios_task_switch_takes_the_tasks_own_turn(
    monkeypatch: pytest.MonkeyPatch, hidden: str
) -> None:
    # asyncio's task switch is private: a Python without it (either half) degrades to a task
    # as create_task makes it, its first step at its scheduled turn, never to an error
    monkeypatch.delattr(asyncio.tasks, hidden)
    caller = asyncio.current_task()
    ran: list[Any] = []

    async def work() -> str:
        ran.append(asyncio.current_task())
        async with asyncio.timeout(10):  # needs the task: raises outside one
            await asyncio.sleep(0)
        return "completed"

    starting = EagerStart(work(), name="sale-1")
    starting.first_step()
    assert ran == []  # not by hand: nothing ran in the maker's turn
    assert asyncio.current_task() is caller
    assert await starting.task == "completed"
    assert ran == [starting.task]  # its own step, as the task
