"""Background tasks that an owner starts and, on stop, ends for good.

Stopping always waits for the end: a task cancelled but not awaited may still hold a serial port,
a socket or a database connection when the next start (or the next test) wants it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from asyncio import tasks as _asyncio_tasks
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Sequence
from typing import Any, Generic, TypeVar

K = TypeVar("K")
T = TypeVar("T")


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to do) and wait until it has ended.

    Its ``CancelledError`` stays here; any other error it ended with is raised. A cancel aimed
    at the caller while it waits is the caller's, not the task's: it goes on (a stop with a
    bound put around this one must still end at its bound).
    """
    if task is None:
        return
    caller = asyncio.current_task()
    asked_before = 0 if caller is None else caller.cancelling()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if caller is not None and caller.cancelling() > asked_before:
            raise


def cancel_requested() -> bool:
    """Whether the running task was asked to end, though no ``CancelledError`` may have reached it.

    On Python 3.11 ``asyncio.wait_for`` returns what it waited for, or raises its error, when a
    cancel lands in the turn that it completes (aiomqtt waits for the broker's answers so): a loop
    that takes that error for one more failure and goes round again never ends, and its owner's
    stop waits for ever. Such a loop asks this before it goes round (``asyncio.timeout`` takes
    back only the cancels it made itself, so the count stays up for the owner's).
    """
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def cancel_and_wait_within(
    task: asyncio.Future[Any],
    seconds: float,
    wait_for: Callable[[Awaitable[Any], float], Awaitable[Any]],
) -> bool:
    """Cancel ``task`` and wait at most ``seconds`` for its end; whether it ended.

    ``wait_for`` is a clock's (``sales.clock.Clock.wait_for``: the deadline is the clock's).
    Halfway the task is cancelled once more: a library may have lost the first cancel, or waits
    out a timeout of its own on the way out. A task that still runs is left to run; its owner
    says so. An error it ended with, other than its ``CancelledError``, is raised.
    """
    for _ in range(2):
        task.cancel()
        with contextlib.suppress(TimeoutError):
            await wait_for(asyncio.wait({task}), seconds / 2)
        if task.done():
            if not task.cancelled():
                task.result()
            return True
    return False


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set or ``seconds`` pass; whether it is set.

    Not ``asyncio.wait_for(event.wait(), timeout)``: on Python 3.11 that returns normally when
    the task is cancelled just as the event is set, and the cancellation is lost, so a loop
    around it never ends and its owner's stop waits for ever (``asyncio.timeout`` passes it on).
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()


async def read_ahead(
    sources: Sequence[tuple[K, AsyncIterator[T]]], ahead: int
) -> AsyncIterator[tuple[K, T]]:
    """Every item of each source, as ``(its source's key, item)``, in the sources' order; the
    first item of the next ``ahead`` sources asked for while one is read, so their round trips
    are in flight together instead of one after the other. At most ``ahead`` sources are started
    and not yet read (each holds what its first item needs, a page of a collection). Leaving
    early, or an error of any source, ends every source started (none is left running)."""
    firsts: dict[int, asyncio.Future[T]] = {}
    try:
        for index, (key, items) in enumerate(sources):
            for started in range(index, min(index + ahead, len(sources))):
                if started not in firsts:  # a source's first step, as a task of its own
                    firsts[started] = asyncio.ensure_future(_first(sources[started][1]))
            try:
                first = await firsts.pop(index)
            except StopAsyncIteration:
                continue
            yield key, first
            async for item in items:
                yield key, item
    finally:
        # before their sources are closed (each runs in its own); what one raised meanwhile is
        # taken here, not left for the loop to report as never retrieved
        for pending in firsts.values():
            pending.cancel()
        if firsts:
            await asyncio.wait(firsts.values())
        for pending in firsts.values():
            if not pending.cancelled():
                pending.exception()
        for _key, items in sources:
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()


async def _first(items: AsyncIterator[T]) -> T:
    return await anext(items)


class FirstStep(Generic[T]):
    """``work`` run at once, in the caller's own turn of the event loop, to its first wait;
    awaited, what is left of it (nothing, when it ended there: ``done``, its result at once).

    What a task would do a turn later, done now: a vend request's sale is journaled and its task
    made in the turn that read the request (``platforms/mdb.py``), where a task of the line's own
    took a turn of the customer's wait first. An error it ends with, at its first step or later,
    is raised where it is awaited (and by :meth:`result`), as a task's would be. Sends, throws
    and closes reach ``work`` as ``await`` passes them (PEP 380), so a cancel of the awaiting
    task cancels it."""

    __slots__ = ("_error", "_result", "_waiting_on", "_work", "done")

    def __init__(self, work: Coroutine[Any, Any, T]) -> None:
        self._work = work
        self._result: T | None = None
        self._error: Exception | None = None
        self._waiting_on: Any = None
        self.done = False
        try:
            self._waiting_on = work.send(None)
        except StopIteration as ended:
            self.done, self._result = True, ended.value
        except Exception as err:  # noqa: BLE001 - raised where it is awaited, as a task's
            self.done, self._error = True, err

    @property
    def ended_well(self) -> bool:
        """It has ended, with a result (no error)."""
        return self.done and self._error is None

    def result(self) -> T:
        """Its result once ``done``; the error it ended with is raised."""
        if not self.done:
            raise RuntimeError("the work has not ended")
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    def __await__(self) -> Generator[Any, Any, T]:
        work, waiting_on = self._work, self._waiting_on
        while not self.done:
            try:
                sent = yield waiting_on
            except GeneratorExit:
                work.close()
                raise
            except BaseException as thrown:  # noqa: BLE001 - a cancel: the work handles it
                try:
                    waiting_on = work.throw(thrown)
                except StopIteration as ended:
                    self.done, self._result = True, ended.value
            else:
                try:
                    waiting_on = work.send(sent)
                except StopIteration as ended:
                    self.done, self._result = True, ended.value
        return self.result()


class EagerStart(Generic[T]):
    """A task made now whose first step its maker runs by hand (:meth:`first_step`), in the
    maker's own turn of the event loop, as the task: ``asyncio.current_task()`` is the task
    there, as ``asyncio.timeout`` and aiohttp's timers need (``FirstStep`` runs in the caller's
    task, or in none). A task made by ``create_task`` runs its first step a loop turn later,
    after whatever the loop queued meanwhile; Python 3.12's ``eager_start`` runs it inside the
    making, before the maker has said where the task is kept. Here the maker keeps the task
    first, then runs the step; the task's first scheduled step takes over where it waits.

    A cancel that comes before that scheduled step reaches the work where it waits, as a task's
    cancel does: what it waits on is cancelled and waited for to its end (a task it awaits ends
    its cleanup first); an error of the first step is the task's, raised where it is awaited.
    The step runs in the task's own copy of the context.

    Running a task's step by hand rests on asyncio's own task switch, which is private
    (``asyncio.tasks._enter_task``/``_leave_task``, 3.11 to 3.13). A Python without them gets
    the public path instead: :meth:`first_step` does nothing and the task's scheduled step runs
    the work a loop turn later, as any task ``create_task`` makes (slower by that turn, the
    sale the same)."""

    __slots__ = ("_context", "_resumed", "task")

    def __init__(self, work: Coroutine[Any, Any, T], name: str | None = None) -> None:
        self._resumed = _Resumed(work)
        self._context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        self.task: asyncio.Task[T] = loop.create_task(
            self._resumed, name=name, context=self._context
        )

    def first_step(self) -> None:
        """Run the work to its first wait now, as its task (once; the maker's caller's task,
        if any, is current again after it). Nothing, when the task has stepped already (a loop
        whose task factory starts tasks eagerly ran it in the making), or where asyncio has no
        task switch to lend (the class's docstring): the task steps at its scheduled turn."""
        if self._resumed.started:
            return
        enter = getattr(_asyncio_tasks, "_enter_task", None)
        leave = getattr(_asyncio_tasks, "_leave_task", None)
        if enter is None or leave is None:  # a Python without them: the task's own turn
            return
        loop = self.task.get_loop()
        caller = asyncio.current_task(loop)
        if caller is not None:
            leave(loop, caller)
        enter(loop, self.task)
        try:
            self._context.run(self._resumed.step_first)
        finally:
            leave(loop, self.task)
            if caller is not None:
                enter(loop, caller)


_WAITS, _RETURNED, _RAISED = 0, 1, 2


class _Resumed(Coroutine[Any, Any, T]):
    """An :class:`EagerStart` task's coroutine: the work, its first step maybe run already.
    The task's first send then gets what that step ended on (the future the work waits on,
    its return, its error); every later send and throw is the work's own."""

    def __init__(self, work: Coroutine[Any, Any, T]) -> None:
        self._work = work
        self._first: tuple[int, Any] | None = None  # what the hand-run first step ended on
        self.started = False  # the work has stepped (by hand, or by its task)
        # the work's name, as a coroutine has it (a task factory, the task's repr read it)
        self.__qualname__ = getattr(work, "__qualname__", type(work).__qualname__)

    def __repr__(self) -> str:
        return repr(self._work)

    def step_first(self) -> None:
        if self.started:
            raise RuntimeError("the first step has run")
        self.started = True
        try:
            self._first = (_WAITS, self._work.send(None))
        except StopIteration as ended:
            self._first = (_RETURNED, ended.value)
        except (Exception, asyncio.CancelledError) as err:  # noqa: BLE001 - the task's, as awaited
            self._first = (_RAISED, err)
        except BaseException as err:  # KeyboardInterrupt, SystemExit: out of the maker's turn,
            # once, as out of a task's step; the task then ends cancelled (raised again at its
            # scheduled step, it went out of asyncio.run's cleanup a second time)
            stopped = asyncio.CancelledError(f"its first step raised {type(err).__name__}")
            self._first = (_RAISED, stopped)
            raise

    def send(self, value: Any) -> Any:
        first, self._first = self._first, None
        if first is None:  # not run by hand (or run and taken over): the work's own
            self.started = True
            return self._work.send(value)
        kind, what = first
        if kind == _WAITS:
            return what
        if kind == _RETURNED:
            raise StopIteration(what)
        raise what

    def throw(self, kind: Any, value: Any = None, traceback: Any = None) -> Any:
        first, self._first = self._first, None
        self.started = True
        if first is not None and first[0] == _WAITS:
            waiting_on = first[1]
            cancel = isinstance(kind, asyncio.CancelledError) or kind is asyncio.CancelledError
            if cancel and isinstance(waiting_on, asyncio.Future) and not waiting_on.done():
                # as a task's cancel does: what it waits on is cancelled, and the task waits on
                # it to its end (a task awaited ends its cleanup first), then hears how it ended
                # where it awaits it
                error = kind if isinstance(kind, BaseException) else value
                message = error.args[0] if error is not None and error.args else None
                if waiting_on.cancel(message):
                    return waiting_on
        elif first is not None:  # the work ended in its first step: a cancel finds it ended
            if first[0] == _RETURNED:
                raise StopIteration(first[1])
            raise first[1]
        if value is None and traceback is None:
            return self._work.throw(kind)
        return self._work.throw(kind, value, traceback)

    def close(self) -> None:
        self._first = None
        self.started = True
        self._work.close()

    def __await__(self) -> Generator[Any, None, T]:
        raise TypeError("an EagerStart's coroutine is its task's alone")


class BackgroundTask:
    """One long-running task (a loop, a watchdog) that its owner starts once and stops for good."""

    def __init__(self, run: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        self._run = run
        self.name = name
        self._task: asyncio.Task[None] | None = None

    @property
    def started(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        """Start it; a second start while started does nothing."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def stop_within(
        self, seconds: float, wait_for: Callable[[Awaitable[Any], float], Awaitable[Any]]
    ) -> bool:
        """Stop it, waiting at most ``seconds`` (``cancel_and_wait_within``); whether it ended.
        Either way it is no longer this owner's: a second start makes a new one."""
        task, self._task = self._task, None
        return task is None or await cancel_and_wait_within(task, seconds, wait_for)


class TaskSet:
    """Fire-and-forget tasks (a sale, a cancel request), kept so that stop can end them all."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def cancel_all(self) -> None:
        """Cancel every task still running, then wait for each to end."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def __len__(self) -> int:
        return len(self._tasks)
