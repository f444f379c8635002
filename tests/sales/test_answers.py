"""Which customers wait for their machine's answer, and back-office work that waits for them
(sales/answers.py), on the fake clock."""

from __future__ import annotations

import asyncio

import pytest

from kiosk_agent.sales.answers import CAPTURE_WAITS_FOR_CUSTOMER_S, WaitingCustomers
from kiosk_agent.sales.clock import FakeClock


async def turns(count: int = 20) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_back_office_work_goes_at_once_when_nobody_waits() -> None:
    clock = FakeClock()
    customers = WaitingCustomers(clock)
    began = clock.monotonic()
    await asyncio.wait_for(customers.none_waiting(), 1)
    assert clock.monotonic() == began
    assert clock.pending() == []  # no wait was armed


async def test_it_waits_for_every_waiting_customer_to_be_answered() -> None:
    customers = WaitingCustomers(FakeClock())
    customers.waits("a")
    customers.waits("b")
    waiting = asyncio.create_task(customers.none_waiting())
    await turns()
    customers.answered("a")
    await turns()
    assert not waiting.done()  # b still waits
    customers.answered("b")
    await asyncio.wait_for(waiting, 1)
    assert customers.waiting() == 0


async def test_it_waits_a_bounded_time_under_a_stream_of_customers() -> None:
    # one customer after another, never a moment without one: the work goes at the bound
    clock = FakeClock()
    customers = WaitingCustomers(clock)
    customers.waits("first")
    waiting = asyncio.create_task(customers.none_waiting())
    await turns()
    began = clock.monotonic()
    for n in range(9):
        customers.waits(f"next-{n}")
        customers.answered("first" if n == 0 else f"next-{n - 1}")
        await clock.advance(CAPTURE_WAITS_FOR_CUSTOMER_S / 10)
        assert not waiting.done()
    await clock.advance(CAPTURE_WAITS_FOR_CUSTOMER_S / 10)
    await asyncio.wait_for(waiting, 1)
    assert clock.monotonic() - began == pytest.approx(CAPTURE_WAITS_FOR_CUSTOMER_S)
    assert customers.waiting() == 1  # the last customer still waits: gone at the bound


async def test_a_stop_ends_every_wait_and_later_customers_hold_nothing() -> None:
    customers = WaitingCustomers(FakeClock())
    customers.waits("a")
    waiting = asyncio.create_task(customers.none_waiting())
    await turns()
    customers.stop()
    await asyncio.wait_for(waiting, 1)
    customers.waits("b")  # a sale still finishing during the drain
    await asyncio.wait_for(customers.none_waiting(), 1)


async def test_a_request_read_as_the_work_begins_is_served_first() -> None:
    # The last answer and the next customer's request come in together: the work lets the turns
    # from the request's read to its sale's start pass (mdb: the line's handler spawns the
    # sale's task, whose first step marks its customer), then waits for that customer.
    customers = WaitingCustomers(FakeClock())

    async def sale_starts() -> None:
        customers.waits("next")

    def request_read() -> None:  # the select's turn: the platform's handler
        asyncio.get_running_loop().create_task(sale_starts())

    waiting = asyncio.create_task(customers.none_waiting())
    await asyncio.sleep(0)  # the work has begun: its first turn ran
    asyncio.get_running_loop().call_soon(request_read)  # the request, read at the next select
    await turns()
    assert not waiting.done()
    customers.answered("next")
    await asyncio.wait_for(waiting, 1)
