"""MDB's cashless session is one enum, one table of allowed moves and one setter that refuses
the rest, checked as sales/states.py is: each allowed move is made, each other is refused by
name and changes nothing, and no sequence of the controller's news leaves the table. It keeps
no timer: the sale does (tests/test_layers.py holds platforms to it). A fake device stands in
for the adapter link (no pty: the session's rules, not the serial line, are under test here)."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiosk_agent.platforms import mdb_protocol as wire
from kiosk_agent.platforms.base import LateVends
from kiosk_agent.platforms.mdb import (
    PHASES,
    MdbCashless,
    MdbOptions,
    MdbSession,
    MdbStats,
    Mode,
    Phase,
    PhaseRefused,
)
from kiosk_agent.platforms.serial import SerialSettings
from kiosk_agent.sales.model import DispenseStatus, Flow, SaleRequest, Selection
from kiosk_agent.sales.states import SaleState

from .vending_rig import given_up_while_waiting


class FakeLink:
    def now(self) -> float:
        return 0.0


class FakeCashless:
    """What a session uses of ``MdbCashless``: its options, stats and lines sent."""

    def __init__(self, mode: Mode = Mode.SELECTION_FIRST) -> None:
        self.name = "mdb:test"
        self.options = MdbOptions(source=self.name, mode=mode)
        self.stats = MdbStats()
        self.link = FakeLink()
        self.sent: list[str] = []
        self.cancelled: list[MdbSession] = []
        self.gave_up_on: MdbSession | None = None
        self.late = LateVends(self.name)
        self.vends_over = 0

    def send(self, line: str) -> bool:
        self.sent.append(line)
        return True

    def cancel_sale(self, session: MdbSession) -> None:
        self.cancelled.append(session)

    def vend_over(self) -> None:  # the setup a link's return mid-vend held back: none here
        self.vends_over += 1


def session(mode: Mode = Mode.SELECTION_FIRST) -> MdbSession:
    request = SaleRequest("mdb:test", Flow.AUTHORIZE_CAPTURE, 150, product="A1")
    return MdbSession(FakeCashless(mode), request)  # type: ignore[arg-type]


def in_phase(phase: Phase) -> MdbSession:
    if phase is Phase.QUEUED:  # a selection heard while the sale before it holds the terminal
        before = session()
        return MdbSession(before.device, before.request, behind=before)
    made = session()
    path = {Phase.AUTHORIZING: [], Phase.SELECTING: [Phase.SELECTING],
            Phase.VENDING: [Phase.VENDING], Phase.ABORTED: [Phase.ABORTED],
            Phase.ENDED: [Phase.ENDED]}[phase]
    for step in path:
        made.move_to(step)
    return made


ALLOWED = [(source, target) for source, targets in PHASES.items() for target in sorted(targets)]
REFUSED = [(source, target) for source, target in itertools.product(Phase, Phase)
           if target not in PHASES[source]]


def test_the_table_names_every_phase_and_ended_is_final() -> None:
    assert set(PHASES) == set(Phase)
    assert PHASES[Phase.ENDED] == frozenset()
    assert all(Phase.ENDED in PHASES[p] for p in Phase if p is not Phase.ENDED)


@pytest.mark.parametrize(("source", "target"), ALLOWED, ids=[f"{a}->{b}" for a, b in ALLOWED])
async def test_every_allowed_move_is_made(source: Phase, target: Phase) -> None:
    made = in_phase(source)
    made.move_to(target)
    assert made.phase is target


@pytest.mark.parametrize(("source", "target"), REFUSED, ids=[f"{a}->{b}" for a, b in REFUSED])
async def test_every_other_move_is_refused_by_name_and_changes_nothing(
    source: Phase, target: Phase
) -> None:
    made = in_phase(source)
    with pytest.raises(PhaseRefused) as refused:
        made.move_to(target)
    assert (refused.value.current, refused.value.wanted) == (source, target)
    assert f"mdb:test: MDB session {source.value} -> {target.value} refused" in str(refused.value)
    assert made.phase is source


NEWS = st.lists(st.sampled_from(
    ["selection", "vended", "failed", "abort", "deny", "choose", "dispense", "give_up", "begin"]),
    max_size=12)
SALE_NEWS = {"deny", "choose", "dispense", "give_up"}  # only once its sale has begun


@settings(max_examples=150, deadline=None)
@given(mode=st.sampled_from(list(Mode)), queued=st.booleans(), news=NEWS)
def test_no_sequence_of_news_leaves_the_table(mode: Mode, queued: bool, news: list[str]) -> None:
    """The controller's news in any order, the sale's dispense and denial among them, and the
    sale giving up its wait, for a session that begins at once or queued behind another: the
    phase moves only along the table, the outcome is settled once, the session has ended
    exactly when it is, only a vend takes money, and one dropped while queued counts nothing."""
    asyncio.run(_play(mode, news, queued=queued))


async def _play(mode: Mode, news: list[str], *, queued: bool = False) -> None:
    made = session(mode)
    if queued:
        made = MdbSession(made.device, made.request, behind=made)
    seen = [made.phase]
    dispensing: asyncio.Task[Any] | None = None
    for item in news:
        if made.phase is Phase.QUEUED and item in SALE_NEWS:
            continue  # no sale has it yet
        match item:
            case "begin" if made.phase is Phase.QUEUED:
                made.move_to(Phase.AUTHORIZING)  # the sale before it let the terminal go
            case "selection":
                made.on_selection(wire.VendRequested(150, "A1"))
            case "vended":
                made.on_vend_result(DispenseStatus.VENDED, "vend success")
            case "failed":
                made.on_vend_result(DispenseStatus.FAILED, "vend failed")
            case "abort":
                made.abort("controller reset")
            case "deny":
                await made.deny("declined")
            case "choose" if dispensing is None and mode is Mode.CARD_FIRST:
                dispensing = asyncio.create_task(made.choose(500))
            case "dispense" if dispensing is None or dispensing.done():
                dispensing = asyncio.create_task(made.dispense(500))
            case "give_up" if dispensing is not None:
                dispensing.cancel()
        for _ in range(3):
            await asyncio.sleep(0)
        if made.phase is not seen[-1]:
            assert made.phase in PHASES[seen[-1]], (seen, made.phase)
            seen.append(made.phase)
        assert (made.phase is Phase.ENDED) == made.ended
    if dispensing is not None and not dispensing.done():
        dispensing.cancel()
    ended = await asyncio.gather(*(t for t in [dispensing] if t), return_exceptions=True)
    assert not [e for e in ended if isinstance(e, Exception)], ended  # no move refused
    if seen == [Phase.QUEUED, Phase.ENDED]:
        assert not made.device.stats.outcomes  # dropped before its sale: nothing sold
    elif made.ended:
        outcome = made.result.result()
        assert sum(made.device.stats.outcomes.values()) == 1
        assert made.device.stats.outcomes == Counter({outcome.status.value: 1})
        assert outcome.vended_cents == (150 if outcome.status is DispenseStatus.VENDED else 0)


@pytest.mark.parametrize("mode", list(Mode))
async def test_an_abort_before_the_vend_is_a_phase_and_the_machine_hears_no_stop(
    mode: Mode,
) -> None:
    """The controller ended the session while the card was read: ABORTED (no flag beside the
    phase); the sale's denial then sends no C,STOP out of turn, and a dispense is CANCELLED."""
    made = session(mode)
    made.abort("controller inactive mid-session")
    assert made.phase is Phase.ABORTED
    assert made.device.cancelled == [made]  # the sale is asked to stop reading the card
    assert not made.machine_waiting
    outcome = await made.dispense(500)
    assert (outcome.status, outcome.detail) == (
        DispenseStatus.CANCELLED, "controller inactive mid-session")
    await made.deny("cancelled")
    assert made.device.sent == []
    assert made.phase is Phase.ENDED


async def test_the_card_first_choice_has_no_timer_of_its_own() -> None:
    """Card first: the session offers the funds and waits for a choice as long as the sale
    does (the sale keeps the choice timeout); the sale giving up leaves the session SELECTING,
    and its denial then closes it with C,STOP."""
    made = session(Mode.CARD_FIRST)
    choosing = asyncio.create_task(made.choose(500))
    for _ in range(5):
        await asyncio.sleep(0)
    assert made.phase is Phase.SELECTING
    assert made.device.sent == [wire.start_session(500, made.device.options.unit)]
    assert not choosing.done()  # it waits for the customer, not for a time
    choosing.cancel()  # the sale's choice timeout
    await asyncio.gather(choosing, return_exceptions=True)
    assert made.phase is Phase.SELECTING
    assert not made.ended
    await made.deny("session timeout: nothing selected within 60 s")
    assert made.device.sent[-1] == wire.deny_vend()
    assert made.result.result().status is DispenseStatus.CANCELLED
    assert made.phase is Phase.ENDED


async def test_a_card_first_choice_is_reported_and_the_vend_approves_it() -> None:
    made = session(Mode.CARD_FIRST)
    choosing = asyncio.create_task(made.choose(500))
    await asyncio.sleep(0)
    assert made.on_selection(wire.VendRequested(275, "B2"))
    assert await choosing == Selection("B2", 275)
    vending = asyncio.create_task(made.dispense(500))
    await asyncio.sleep(0)
    assert made.phase is Phase.VENDING
    assert made.device.sent[-1] == wire.approve_vend(275, made.device.options.unit)
    assert made.on_vend_result(DispenseStatus.VENDED, "vend success")
    outcome = await vending
    assert (outcome.status, outcome.vended_cents, outcome.product) == (
        DispenseStatus.VENDED, 275, "B2")


async def test_card_first_a_dispense_without_a_choice_vends_nothing() -> None:
    made = session(Mode.CARD_FIRST)
    outcome = await made.dispense(500)
    assert outcome.status is DispenseStatus.CANCELLED
    assert made.device.sent == []


async def test_the_vend_wait_has_no_timer_of_its_own() -> None:
    """Selection first: approved, the session waits for the machine as long as the sale does;
    the sale giving up ends it as TIMEOUT, counted, and a late result is no vend."""
    made = session()
    waiting = asyncio.create_task(made.dispense(150))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()
    assert made.phase is Phase.VENDING
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert made.result.result().status is DispenseStatus.TIMEOUT
    assert made.device.stats.timeouts == 1
    assert made.device.vends_over == 1  # a setup held back by the link's return goes now
    assert not made.on_vend_result(DispenseStatus.VENDED, "late")


# -- a selection queued behind the last customer's sale (the device, at the trigger seam) -------


class HeldSale:
    """A sale whose terminal the test lets go of (its card read being cancelled, say)."""

    def __init__(self, sale_id: str, request: SaleRequest) -> None:
        self.sale_id, self.request = sale_id, request
        self.released = asyncio.Event()
        self.final: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def terminal_released(self) -> None:
        await self.released.wait()

    async def result(self) -> Any:
        return await asyncio.shield(self.final)

    def end(self) -> None:
        self.final.set_result(SimpleNamespace(
            sale_id=self.sale_id, state=SaleState.CANCELLED, message="cancelled"))
        self.released.set()


class HoldingRunner:
    """``agent.sales`` whose sales hold the terminal until the test ends them."""

    def __init__(self) -> None:
        self.sales: list[HeldSale] = []
        self.cancelled: list[str] = []
        self.running: list[Any] = []

    async def start(self, request: SaleRequest, dispenser: Any) -> HeldSale:
        sale = HeldSale(f"sale-{len(self.sales) + 1}", request)
        self.sales.append(sale)
        return sale

    async def cancel(self, sale_id: str) -> None:
        self.cancelled.append(sale_id)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def walked_away(sales: HoldingRunner) -> MdbCashless:
    """A customer chose A1 and walked away (ENABLED) while the card was read: the machine is
    done with the session; its sale, being cancelled, still holds the terminal."""
    device = MdbCashless(sales, SerialSettings(port="/dev/null"), MdbOptions(source="mdb:t"))
    device.handle_line(wire.vend_request_line(150, "A1"))
    await settle()
    device.handle_line(wire.status_line(wire.ControllerStatus.ENABLED))
    await settle()
    assert device.status()["session"] == Phase.ABORTED.value
    assert sales.cancelled == ["sale-1"]
    return device


async def test_a_selection_heard_while_the_terminal_is_held_is_a_queued_session() -> None:
    """The next customer's selection is a session in QUEUED (no flag beside the table); a newer
    one replaces it; it starts, as AUTHORIZING, once the sale before it lets the terminal go."""
    sales = HoldingRunner()
    device = await walked_away(sales)
    device.handle_line(wire.vend_request_line(250, "A2"))
    device.handle_line(wire.vend_request_line(100, "A3"))  # that customer chose again
    await settle()
    assert device.status()["session"] == Phase.QUEUED.value
    assert len(sales.sales) == 1  # no sale for it while the terminal is held
    sales.sales[0].end()
    await settle()
    assert [s.request.product for s in sales.sales] == ["A1", "A3"]
    assert device.status()["session"] == Phase.AUTHORIZING.value
    assert device.stats.outcomes == Counter({"cancelled": 1})  # the replaced one was no sale
    await device.stop()


async def test_a_queued_session_the_controller_ends_is_dropped_the_sale_before_keeps_it() -> None:
    sales = HoldingRunner()
    device = await walked_away(sales)
    device.handle_line(wire.vend_request_line(250, "A2"))
    await settle()
    device.handle_line(wire.status_line(wire.ControllerStatus.ENABLED))  # gone too
    await settle()
    assert device.status()["session"] == Phase.ABORTED.value  # the first one's, still held
    sales.sales[0].end()
    await settle()
    assert device.status()["session"] is None
    assert len(sales.sales) == 1  # nothing started for the customer who left
    await device.stop()


async def test_a_vend_success_heard_after_the_sale_gave_up_is_told_not_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sale stopped waiting (its vend timeout) and gave the money back; then the machine
    says the product came out. The agent cannot take the money again, but it knows the product
    went unpaid: said once at WARNING naming the sale, counted in the device's status (the
    page, the admin API), never taken for a later vend's result."""
    device = MdbCashless(_StartsNothing(), SerialSettings(port="/dev/null"),
                         MdbOptions(source="mdb:front"))  # fmt: skip
    late = MdbSession(device, SaleRequest("mdb:front", Flow.AUTHORIZE_CAPTURE, 150, product="A1"))
    late.sale_id = "s-late"
    sent: list[str] = []
    device.send = lambda line: sent.append(line) is None  # type: ignore[method-assign]
    device.session = late
    await given_up_while_waiting(late.dispense(150))
    assert sent == ["C,VEND,1.50"]
    device.session = None  # the sale let the machine go (its money given back)
    with caplog.at_level("WARNING"):
        device.handle_line(wire.VEND_SUCCESS_LINE)
        device.handle_line(wire.VEND_SUCCESS_LINE)  # a repeat is not a second product
    status = device.status()
    assert (status["late_vends"], status["last_late_vend_sale"]) == (1, "s-late")
    [said] = [r.getMessage() for r in caplog.records if "s-late" in r.getMessage()]
    assert "after its vend timeout" in said
    # the next customer's vend: a result now is theirs, and no late one
    device.handle_line(wire.vend_request_line(150, "B1"))
    assert device.late.count == 1
    await device.stop()


class _StartsNothing:
    """``agent.sales`` that never starts a sale (the test drives the session itself)."""

    def __init__(self) -> None:
        self.running: list[Any] = []

    async def start(self, request: SaleRequest, dispenser: Any) -> Any:
        await asyncio.Event().wait()

    async def cancel(self, sale_id: str) -> None:
        return None

    async def pause_before_offer(self, source: str) -> None:
        await asyncio.Event().wait()
