"""Attacks on the sale's cancel as i36-window changed it: a CancelRequest (an Event that calls
back its listeners, which make the task that asks the terminal to end the read) instead of a
task watching for the cancel through every card read. A cancel at each moment of the read, two
cancels, a cancel of an ended sale: the sale ends without money, the terminal is asked at most
once, and no task is left behind."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kiosk_agent.assembly.agent import Agent
from kiosk_agent.sales.model import Flow, SaleEvent
from kiosk_agent.sales.states import SaleState
from kiosk_agent.sales.steps import CancelRequest
from tests.assembly.agent_helpers import ScriptedDispenser
from tests.helpers import ErrorLog, until
from tests.sales.test_flows import request

NO_CARD, CARD = 305, 250  # the simulator's cents: ..05 no card comes (it expires); else approved


class _Handle:
    """The terminal's read, with something done around its wait."""

    def __init__(self, real: Any, around: Any) -> None:
        self._real, self._around = real, around

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def wait(self) -> Any:
        return await self._around(self._real.wait)


def _cancel_reads_left() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if "cancel_read" in repr(t.get_coro()) and not t.done()]


async def _sale_cancelled(
    agent: Agent, monkeypatch: pytest.MonkeyPatch, moment: str
) -> tuple[SaleEvent, list[str]]:
    terminal = agent.service.terminal
    real_read, real_cancel = terminal.read_card, terminal.cancel
    asked: list[str] = []
    sale_id = ""

    async def cancel(device_id: str, interaction_id: str) -> Any:
        asked.append(interaction_id)
        return await real_cancel(device_id, interaction_id)

    async def cancel_sale() -> None:
        assert await agent.sales.cancel(sale_id)

    async def cancel_then_wait(wait: Any) -> Any:
        await cancel_sale()
        if moment == "twice":
            assert await agent.sales.cancel(sale_id)  # still live: asked again, said once
        return await wait()

    async def wait_then_cancel(wait: Any) -> Any:
        interaction = await wait()
        await cancel_sale()  # in the turn the card came, before the read's own end is seen
        return interaction

    async def read_card(device_id: str, amount: int) -> Any:
        nonlocal sale_id
        if moment == "before the read is sent":
            # the sale's first step, run inside start() (its id not returned yet)
            [record] = agent.sales.running
            sale_id = record.sale_id
            await cancel_sale()
        handle = await real_read(device_id, amount)
        if moment in ("after its accepted step", "twice"):
            return _Handle(handle, cancel_then_wait)
        if moment == "as the card comes":
            return _Handle(handle, wait_then_cancel)
        return handle

    cancels: list[asyncio.Future[None]] = []

    def on_step(event: SaleEvent) -> None:
        if event.sale_id == sale_id and event.state is SaleState.AUTHORIZING and not cancels:
            cancels.append(asyncio.ensure_future(cancel_sale()))

    monkeypatch.setattr(terminal, "read_card", read_card)
    monkeypatch.setattr(terminal, "cancel", cancel)
    stop_listening = agent.events.listen(on_step) if moment == "after the card" else None
    cents = CARD if moment in ("as the card comes", "after the card") else NO_CARD
    try:
        sale = await agent.sales.start(request(cents, Flow.AUTHORIZE_CAPTURE), ScriptedDispenser())
        sale_id = sale.sale_id
        event = await asyncio.wait_for(sale.result(), 10)
    finally:
        if stop_listening is not None:
            stop_listening()
    await asyncio.gather(*cancels)
    return event, asked


@pytest.mark.parametrize(
    "moment", ["before the read is sent", "after its accepted step", "twice", "as the card comes"]
)
async def test_a_cancel_during_the_card_read_ends_the_sale_cancelled_without_money(
    agent: Agent, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    event, asked = await _sale_cancelled(agent, monkeypatch, moment)
    assert event.state is SaleState.CANCELLED, event
    assert event.captured_cents == 0
    assert event.authorized_cents == 0
    interaction_id = agent.journal.get(event.sale_id).interaction_id  # type: ignore[union-attr]
    if moment == "as the card comes":
        assert asked in ([], [interaction_id])  # the read ended first: asked at most once
    else:  # no card was coming: the terminal was asked to end the read, once
        assert asked == [interaction_id]
    assert _cancel_reads_left() == []


async def test_a_cancel_after_the_card_gives_the_hold_back_and_asks_no_read_to_end(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    event, asked = await _sale_cancelled(agent, monkeypatch, "after the card")
    assert event.state in (SaleState.CANCELLED, SaleState.REVERSED), event
    assert event.captured_cents == 0
    assert asked == []  # the read had ended: nothing to end
    assert _cancel_reads_left() == []


async def test_a_cancel_of_an_ended_sale_is_refused_and_asks_nothing(agent: Agent) -> None:
    sale = await agent.sales.start(request(CARD, Flow.AUTHORIZE_CAPTURE), ScriptedDispenser())
    event = await asyncio.wait_for(sale.result(), 10)
    assert event.state is SaleState.COMPLETED
    assert not await agent.sales.cancel(sale.sale_id)
    assert _cancel_reads_left() == []


def test_a_cancel_request_calls_each_listener_once_and_not_after_it_is_forgotten() -> None:
    async def run() -> None:
        request_ = CancelRequest()
        heard: list[str] = []
        forget_a = request_.when_set(lambda: heard.append("a"))
        forget_b = request_.when_set(lambda: heard.append("b"))
        forget_b()
        forget_b()  # twice: nothing
        waiter = asyncio.ensure_future(request_.wait())
        request_.set()
        request_.set()  # a second cancel: nobody called again
        assert heard == ["a"]
        forget_a()  # after it was called: nothing
        request_.when_set(lambda: heard.append("late"))  # set already: called at once
        assert heard == ["a", "late"]
        assert await asyncio.wait_for(waiter, 1)

    asyncio.run(run())


@pytest.mark.parametrize("cancelled_first", [False, True])
async def test_a_stop_during_the_card_read_cancels_it_once_and_leaves_no_task(
    agent: Agent, monkeypatch: pytest.MonkeyPatch, cancelled_first: bool
) -> None:
    """The agent stops while a read waits for a card (the stop cancels an unpaid sale: the
    same CancelRequest), after the customer's own cancel too, made in the same turn: the sale
    ends CANCELLED, the terminal is asked once, the stop returns, no cancel task is left."""
    terminal = agent.service.terminal
    real_cancel = terminal.cancel
    asked: list[str] = []

    async def cancel(device_id: str, interaction_id: str) -> Any:
        asked.append(interaction_id)
        return await real_cancel(device_id, interaction_id)

    monkeypatch.setattr(terminal, "cancel", cancel)
    errors = ErrorLog()
    try:
        machine = ScriptedDispenser()
        sale = await agent.sales.start(request(NO_CARD, Flow.AUTHORIZE_CAPTURE), machine)
        await until(lambda: _interaction_of(agent, sale.sale_id) is not None)
        interaction_id = _interaction_of(agent, sale.sale_id)
        if cancelled_first:
            assert await agent.sales.cancel(sale.sale_id)
        await asyncio.wait_for(agent.stop(), 20)
        event = await asyncio.wait_for(sale.result(), 5)
    finally:
        errors.close()
    assert event.state is SaleState.CANCELLED, event
    assert asked == [interaction_id]
    assert _cancel_reads_left() == []
    assert errors.records == []


def _interaction_of(agent: Agent, sale_id: str) -> str | None:
    record = agent.journal.get(sale_id)
    return None if record is None else record.interaction_id
