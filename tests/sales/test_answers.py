"""Which customers wait for their machine's answer (sales/answers.py), driven by hypothesis.

Customers start waiting and are answered in any order (a card-first customer waits twice: from
the tap and from the choice), captures start waiting for them at any moment, the sale clock
moves, the agent may stop. The promises a capture's money rests on: it waits for nobody when
nobody waits, never longer than its bound, and from a stop on not at all.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kiosk_agent.sales.answers import CAPTURE_WAITS_FOR_CUSTOMER_S, WaitingCustomers
from kiosk_agent.sales.clock import FakeClock

SALES = ("s1", "s2", "s3")
OPS = st.one_of(
    st.tuples(st.just("waits"), st.sampled_from(SALES)),
    st.tuples(st.just("answered"), st.sampled_from(SALES)),
    st.tuples(st.just("capture"), st.just("")),
    st.tuples(st.just("advance"), st.sampled_from(["0.3", "0.7", "1.0"])),
    st.tuples(st.just("stop"), st.just("")),
)


async def drive(ops: list[tuple[str, str]]) -> None:
    clock = FakeClock()
    customers = WaitingCustomers(clock)
    waiting: set[str] = set()  # the model: who waits now
    stopped = False
    captures: list[tuple[asyncio.Task[None], float]] = []  # each wait, and when it began
    for op, arg in ops:
        if op == "waits":
            customers.waits(arg)
            waiting.add(arg)
        elif op == "answered":
            customers.answered(arg)
            waiting.discard(arg)
        elif op == "capture":
            captures.append((asyncio.ensure_future(customers.none_waiting()), clock.monotonic()))
        elif op == "advance":
            await clock.advance(float(arg))
        else:
            customers.stop()
            stopped = True
        for _ in range(3):  # the loop's turns: a woken wait ends
            await asyncio.sleep(0)
        assert customers.waiting() == len(waiting)
        for task, began in captures:
            due = clock.monotonic() >= began + CAPTURE_WAITS_FOR_CUSTOMER_S
            if stopped or not waiting or due:
                assert task.done(), (op, arg, waiting, stopped, clock.monotonic() - began)
            if task.done():
                task.result()  # a bound reached is no error
    for task, _ in captures:
        task.cancel()


@settings(deadline=None)  # the profile's examples: 100 in the suite
@given(ops=st.lists(OPS, min_size=1, max_size=25))
def test_a_capture_waits_only_while_a_customer_waits_and_never_past_its_bound(
    ops: list[Any],
) -> None:
    asyncio.run(drive(ops))


def test_a_capture_waiting_for_a_customer_is_not_ended_early() -> None:
    """The property above cannot fail by ending every wait at once: one that must still wait,
    does."""

    async def one() -> None:
        clock = FakeClock()
        customers = WaitingCustomers(clock)
        customers.waits("s1")
        task = asyncio.ensure_future(customers.none_waiting())
        await clock.advance(CAPTURE_WAITS_FOR_CUSTOMER_S / 2)
        assert not task.done()
        customers.waits("s2")
        customers.answered("s1")
        await asyncio.sleep(0)
        assert not task.done()  # s2 still waits
        customers.answered("s2")
        await asyncio.wait_for(task, 1)

    asyncio.run(one())
