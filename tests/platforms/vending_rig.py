"""The platforms' test rig: a virtual vending machine on a real pty, and the agent's side.

``CardDesk`` plays ``agent.sales`` for the protocol-layer tests: it follows the authorize/capture
contract of the real sale (sales/) (read a card, approve or decline by the amount's cents like the
simulator, dispense, capture or give back) without a payment service, so the serial protocol is
tested on its own. End-to-end tests use the real Agent and simulator instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
import tty
from collections.abc import Awaitable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from kiosk_agent.platforms.mdb import MdbCashless, MdbOptions, Mode
from kiosk_agent.platforms.serial import SerialSettings
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sales.model import (
    ChoosingDispenser,
    DispenseOutcome,
    Dispenser,
    DispenseStatus,
    SaleEvent,
    SaleRequest,
    vend_refusal,
)
from kiosk_agent.sales.settings import VEND_TIMEOUT, SaleSettings
from kiosk_agent.sales.states import SaleState
from kiosk_agent.sim.machine import VirtualController


class TerminalBusy(Exception):
    pass


@dataclass
class DeskSale:
    sale_id: str
    request: SaleRequest
    outcome: DispenseOutcome | None = None
    final: asyncio.Future[SaleEvent] = field(default_factory=asyncio.Future)
    cancelled: bool = False
    released: asyncio.Event = field(default_factory=asyncio.Event)

    async def result(self) -> SaleEvent:
        return await asyncio.shield(self.final)  # like the real Sale: a waiter may give up

    async def terminal_released(self) -> None:
        await self.released.wait()  # like the real Sale: once the dispense outcome is known


class CardDesk:
    """One terminal: one sale at a time holds it, a card after ``card_time``; ``..02`` cents
    decline. The terminal is free once the dispense outcome is known; the capture (or the void)
    then takes ``capture_time``. ``clock``: the sale's timers (the choice and the vend timeout)
    wait on it, as the real sale's do on the agent's clock; a FakeClock: they fire only when the
    test moves it (a starved loop read an honest VEND,SUCCESS after a real-time 0.3 s)."""

    def __init__(self, card_time: float = 0.005, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.card_time = card_time
        self.clock = clock
        self.cancel_time = 0.0  # how long the terminal takes to cancel a card wait
        self.card_held: asyncio.Event | None = None  # set: the card comes when the test sets it
        self.capture_time = 0.0  # how long the payments API takes to capture or void
        self.sales: list[DeskSale] = []
        self._ids = itertools.count(1)
        self._busy = False
        self._waiting: dict[str, asyncio.Task[None]] = {}
        self.held_elsewhere = False  # another trigger holds the terminal
        self.refused = 0
        self.refused_at: list[float] = []  # loop time of each refusal
        self.unanswered_offers = 0  # card first: the runner's offer pace, played the same way
        self.offer_answered = False

    async def start(self, request: SaleRequest, dispenser: Dispenser) -> DeskSale:
        if self._busy or self.held_elsewhere:
            self.refused += 1
            self.refused_at.append(asyncio.get_running_loop().time())
            raise TerminalBusy("terminal busy with another sale")
        self._busy = True
        sale = DeskSale(f"sale-{next(self._ids)}", request)
        self.sales.append(sale)
        task = asyncio.create_task(self._run(sale, dispenser))
        self._waiting[sale.sale_id] = task
        return sale

    async def pause_before_offer(self, source: str) -> None:
        """Like the real runner: SaleSettings.offer_pause, set back by an authorized offer."""
        if self.offer_answered:
            self.offer_answered, self.unanswered_offers = False, 0
        pause = SaleSettings.offer_pause(self.unanswered_offers)
        self.unanswered_offers += 1
        await asyncio.sleep(pause)

    async def cancel(self, sale_id: str) -> None:
        await asyncio.sleep(self.cancel_time)
        task = self._waiting.get(sale_id)
        if task is not None:
            task.cancel()

    async def _run(self, sale: DeskSale, dispenser: Dispenser) -> None:
        request = sale.request
        try:
            try:
                await asyncio.sleep(self.card_time)  # the card at the terminal
                if self.card_held is not None:
                    await self.card_held.wait()
            except asyncio.CancelledError:
                sale.cancelled = True
                self._finish(sale, SaleState.CANCELLED, 0, "cancelled")
                return
            finally:
                self._waiting.pop(sale.sale_id, None)
            if request.amount_cents % 100 == 2:
                await dispenser.deny("declined")
                self._finish(sale, SaleState.DECLINED, 0, "declined")
                return
            self.offer_answered = request.chosen_at_machine  # authorized
            outcome = await self._dispense(request, dispenser)
            sale.outcome = outcome
            self._release(sale)
            await asyncio.sleep(self.capture_time)
            if outcome.status is DispenseStatus.VENDED:
                self._finish(sale, SaleState.COMPLETED, outcome.vended_cents, "captured")
            else:
                self._finish(sale, SaleState.REVERSED, 0, f"voided: {outcome.detail}")
        finally:
            self._release(sale)

    async def _dispense(self, request: SaleRequest, dispenser: Dispenser) -> DispenseOutcome:
        """Like the real sale: card first, the choice bounded by the sale's choice timeout and
        held to its money rule; the dispense bounded by the vend timeout (the sale's timers,
        SaleSettings.*_for, on the desk's clock), each wait cancelled then."""
        rules = SaleSettings("mid", {}, vend_timeout=VEND_TIMEOUT)
        if request.chosen_at_machine:
            assert isinstance(dispenser, ChoosingDispenser)
            bound = rules.choice_timeout_for(request)
            try:
                chosen = await self.clock.wait_for(dispenser.choose(request.amount_cents), bound)
            except TimeoutError:
                why = f"session timeout: nothing selected within {bound:g} s"
                chosen = DispenseOutcome(DispenseStatus.CANCELLED, detail=why)
                await dispenser.deny(chosen.detail)
            if isinstance(chosen, DispenseOutcome):
                return chosen
            refused = vend_refusal(chosen.amount_cents, request.amount_cents, chosen.product)
            if refused:
                await dispenser.deny(refused)
                return DispenseOutcome(DispenseStatus.CANCELLED, detail=refused)
        bound = rules.vend_timeout_for(request)
        try:
            return await self.clock.wait_for(dispenser.dispense(request.amount_cents), bound)
        except TimeoutError:
            return DispenseOutcome(DispenseStatus.TIMEOUT, detail="no vend result")

    def _release(self, sale: DeskSale) -> None:
        if not sale.released.is_set():
            sale.released.set()
            self._busy = False

    def _finish(self, sale: DeskSale, state: SaleState, captured: int, message: str) -> None:
        assert not sale.final.done(), f"{sale.sale_id} finished twice"
        sale.final.set_result(
            SaleEvent(
                sale_id=sale.sale_id,
                order_id=sale.sale_id,
                source=sale.request.source,
                state=state,
                amount_cents=sale.request.amount_cents,
                captured_cents=captured,
                product=sale.request.product,
                message=message,
            )
        )

    @property
    def running(self) -> list[Any]:
        """Its sales not ended yet, as a journal would hold them (the desk keeps none)."""
        return [
            SimpleNamespace(
                sale_id=sale.sale_id,
                source=sale.request.source,
                state=SaleState.CAPTURING if sale.released.is_set() else SaleState.READING_CARD,
            )
            for sale in self.sales
            if not sale.final.done()
        ]

    async def settled(self) -> list[SaleEvent]:
        return [await sale.result() for sale in self.sales]


@dataclass
class Machine:
    controller: VirtualController
    device: MdbCashless
    desk: CardDesk
    link_states: list[str]

    async def ready(self) -> None:
        await asyncio.wait_for(self.device.link.wait_connected(), 5)
        await asyncio.wait_for(self.controller.wait_enabled(), 5)


async def make_machine(
    controller: VirtualController,
    *,
    mode: Mode = Mode.SELECTION_FIRST,
    link: dict[str, Any] | None = None,
    desk: CardDesk | None = None,
    clock: Clock = SYSTEM_CLOCK,
    **options: object,
) -> Machine:
    """``clock``: the link's (its silence watchdog, its probes); a FakeClock: the test moves it."""
    desk = desk or CardDesk()
    states: list[str] = []
    device = MdbCashless(
        desk,
        SerialSettings(
            port=controller.port, reconnect_min=0.02, reconnect_max=0.2, **(link or {})
        ),
        MdbOptions(source="mdb:test", mode=mode, max_funds_cents=500, **options),  # type: ignore[arg-type]
        on_link_state=lambda state, detail: states.append(state.value),
        clock=clock,
    )
    await device.start()
    machine = Machine(controller, device, desk, states)
    await machine.ready()
    return machine


class LineDevice:
    """The far end of a real pty, playing a device that writes what it is told to."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        os.set_blocking(self.master, False)
        self.port = os.ttyname(self.slave)
        self.heard: list[str] = []
        self.written = 0  # bytes written to the agent
        self._buffer = b""
        asyncio.get_running_loop().add_reader(self.master, self._read)

    def _read(self) -> None:
        with contextlib.suppress(OSError):
            self._buffer += os.read(self.master, 4096)
        *lines, self._buffer = self._buffer.split(b"\n")
        self.heard += [line.decode("ascii", "replace") for line in lines]

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a full pty buffer: the agent reads it soon
            try:
                written = os.write(self.master, view)
                self.written += written
                view = view[written:]
            except BlockingIOError:
                time.sleep(0.001)

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.master)
        os.close(self.master)
        os.close(self.slave)


async def given_up_while_waiting(dispensing: Awaitable[Any]) -> None:
    """``dispensing`` left waiting for the machine a few turns of the loop, then given up on
    as the sale's vend timeout does."""
    waiting = asyncio.ensure_future(dispensing)
    for _ in range(5):
        await asyncio.sleep(0)
    waiting.cancel()  # the sale's vend timeout
    await asyncio.gather(waiting, return_exceptions=True)
