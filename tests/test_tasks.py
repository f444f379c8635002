"""Background tasks: stopped by cancelling and waiting until they have really ended."""

from __future__ import annotations

import asyncio

import pytest

from kiosk_agent.tasks import TaskSet, cancel_and_wait


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
