"""Recovery on start: every sale left open is finished from what the service really did."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock, FakeClock
from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.late_vends import late_vended
from kiosk_agent.sales.model import DispenseOutcome, DispenseStatus, Flow, SaleRequest, money_text
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.models import (
    ChargeRequest,
    Interaction,
    TransactionFilter,
    TransStatus,
)
from kiosk_agent.service.terminal import TerminalClient
from tests.assembly.agent_helpers import ScriptedDispenser
from tests.helpers import sim_call, until, walk_to

# every wait's hang guard, not a bound: each takes under a second on a quiet machine, and the
# agent, its simulator and the test share one loop (10 s ones were passed at load 11-15)
WAIT_S = 60.0


async def rows(service: ServiceClient, order_id: str) -> list[Any]:
    query = TransactionFilter(order_id=order_id)
    return [t async for t in service.reporting.transactions(query)]


def leave_open(directory: Path, clock: Clock = SYSTEM_CLOCK, **fields: Any) -> SaleRecord:
    """Write a sale as a crashed agent would have left it (its steps dated on ``clock``)."""
    journal = Journal(directory / "journal.db", clock=clock)
    journal.open()
    base: dict[str, Any] = {
        "sale_id": "crashed1",
        "order_id": "KACRASHED1",
        "source": "test",
        "flow": Flow.AUTHORIZE_CAPTURE.value,
        "terminal": "SIM-0001",
        "amount_cents": 300,
        "state": SaleState.STARTED,
    }
    state = fields.pop("state")
    base["sale_id"] = fields.pop("sale_id", base["sale_id"])
    base["flow"] = fields.pop("flow", base["flow"])
    base["order_id"] = fields.pop("order_id", base["order_id"])
    record = journal.create(SaleRecord(**base))
    record = walk_to(journal, record, state, **fields)
    journal.close()
    return record


async def crashed_charge(sim: Any, *, capture: bool) -> str:
    """:func:`authorize` on a client of its own, under the crashed sale's order id."""
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        return await authorize(service, "KACRASHED1", capture=capture)


async def authorize(service: ServiceClient, order_id: str, capture: bool) -> str:
    """A real charge on the simulator, as the crashed agent had made it."""
    handle = await service.terminal.read_card("SIM-0002", 300)
    card = (await handle.wait(timeout=5)).read_card_result
    assert card is not None
    result = await service.payments.charge(
        ChargeRequest(
            mid=service.settings.mid,
            amount=300,
            account_token=card.token,
            expiration=card.expiration,
            capture=capture,
            order_id=order_id,
        )
    )
    assert result.approved
    return result.trans_id


async def test_a_parked_dispense_is_voided_on_the_next_start(agent_factory: Any) -> None:
    first = await agent_factory()
    machine = ScriptedDispenser(delay=30)
    request = SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=300)
    sale = await first.sales.start(request, machine)
    await asyncio.wait_for(machine.started.wait(), WAIT_S)
    await first.sales.stop(grace=0.05)  # SIGTERM with a machine that never answers: parked
    await first.stop()
    parked = first.journal
    parked.open()
    record = parked.get(sale.sale_id)
    assert record is not None
    assert record.state is SaleState.DISPENSING
    assert parked.steps(sale.sale_id)[-1].step == "parked"
    parked.close()

    second = await agent_factory()
    [event] = await asyncio.wait_for(second.recovery.wait(), WAIT_S)
    assert event.state is SaleState.REVERSED
    [row] = await rows(second.service, record.order_id)
    assert row.status is TransStatus.VOIDED


async def test_a_confirmed_vend_whose_capture_was_lost_is_captured(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    sim = await sim_factory(time_scale=300, transactions=0)
    trans_id = await crashed_charge(sim, capture=False)
    leave_open(
        tmp_path,
        state=SaleState.CAPTURING,
        trans_id=trans_id,
        authorized_cents=300,
        vended_cents=175,
    )
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    assert event.state is SaleState.COMPLETED
    assert event.captured_cents == 175
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.CAPTURED
    assert row.amount_cents == 175


async def test_an_interrupted_refund_is_finished_once(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    sim = await sim_factory(time_scale=300, transactions=0)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        trans_id = await authorize(service, "KACRASHED1", capture=True)
        # the void went through, the crash came before the journal heard of it
        await service.payments.void_or_refund(trans_id)
    leave_open(
        tmp_path,
        state=SaleState.REVERSING,
        trans_id=trans_id,
        captured_cents=300,
        message="dispense failed",
    )
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    assert event.state is SaleState.REVERSED
    assert "given back" in event.message
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.VOIDED


async def test_a_charge_that_never_reached_the_service_fails_cleanly(
    agent_factory: Any, tmp_path: Path
) -> None:
    # the authorization's deadline has passed: the service can no longer answer it
    leave_open(tmp_path, state=SaleState.AUTHORIZING, answer_by=time.time() - 1)
    agent = await agent_factory()
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    assert event.state is SaleState.FAILED
    assert "no charge was made" in event.message


async def test_what_cannot_be_decided_is_marked_for_attention(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    leave_open(tmp_path, state=SaleState.AUTHORIZING, answer_by=time.time() - 1)
    sim = await sim_factory(time_scale=300, transactions=0)
    await sim.stop()  # the service is unreachable: reporting cannot say whether money moved
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    assert event.state is SaleState.ATTENTION
    assert "reporting cannot say" in event.message
    assert agent.health.snapshot().sales.attention == 1


async def test_an_interrupted_enrollment_asks_for_a_person(
    agent_factory: Any, tmp_path: Path
) -> None:
    leave_open(tmp_path, state=SaleState.ENROLLING, flow=Flow.ENROLL.value)
    agent = await agent_factory()
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    assert event.state is SaleState.ATTENTION


async def test_a_terminal_under_recovery_refuses_new_sales(
    agent_factory: Any, tmp_path: Path
) -> None:
    clock = FakeClock(wall=time.time())  # the second passes in recovery's pauses
    leave_open(
        tmp_path,
        state=SaleState.CHARGING,
        flow=Flow.CHARGE_CARD.value,
        answer_by=clock.time() + 1,  # the charge may still be answered for a second
    )
    agent = await agent_factory(clock=clock)
    reason = agent.sales.busy_reason("SIM-0001")
    assert reason is not None
    assert "recovering sale crashed1" in reason
    await clock.run(agent.recovery.wait())
    assert agent.sales.busy_reason("SIM-0001") is None


async def test_a_capturing_sale_does_not_keep_its_terminal_refusing_sales_while_recovered(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    # The older sale had vended and released the terminal (it only captured); the newer one was
    # reading its card when the agent died. The terminal refuses sales while the card read is
    # ended; the capture, slow at the service, goes on beside it, not before or after it.
    sim = await sim_factory(time_scale=300, transactions=0)
    trans_id = await crashed_charge(sim, capture=False)
    leave_open(
        tmp_path, state=SaleState.CAPTURING, trans_id=trans_id, authorized_cents=300,
        vended_cents=300,
    )
    leave_open(tmp_path, state=SaleState.READING_CARD, sale_id="crashed2", order_id="KACRASHED2")
    slow = {"path": "/api/v1/capture", "fault": "delay", "delay_s": 0.5}
    await sim_call(sim, "POST", "/sim/faults", slow)

    agent = await agent_factory(sim=sim)
    assert agent.sales.busy_reason("SIM-0001") == "recovering sale crashed2"
    await until(lambda: agent.sales.busy_reason("SIM-0001") is None)
    capturing = agent.journal.get("crashed1")
    assert capturing is not None
    assert capturing.state is SaleState.CAPTURING  # still with the service
    ended = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    states = {e.sale_id: e.state for e in ended}
    assert states == {"crashed1": SaleState.COMPLETED, "crashed2": SaleState.FAILED}
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.CAPTURED


async def test_a_lost_authorization_being_found_out_does_not_keep_its_terminal_refusing(
    agent_factory: Any, tmp_path: Path
) -> None:
    # The older sale's authorization had lost its answer (the card read, the terminal released);
    # the newer one was reading its card when the agent died. The older one waits for its
    # deadline beside the newer one, not before it: the terminal takes sales once the card
    # read is ended.
    clock = FakeClock(wall=time.time())
    leave_open(tmp_path, state=SaleState.UNRESOLVED, answer_by=clock.time() + 30)
    leave_open(tmp_path, state=SaleState.READING_CARD, sale_id="crashed2", order_id="KACRASHED2")
    agent = await agent_factory(clock=clock)
    assert agent.sales.busy_reason("SIM-0001") == "recovering sale crashed2"
    await until(lambda: agent.sales.busy_reason("SIM-0001") is None)
    unresolved = agent.journal.get("crashed1")
    assert unresolved is not None
    assert unresolved.state is SaleState.UNRESOLVED  # still until its deadline
    ended = await clock.run(agent.recovery.wait())
    states = {e.sale_id: e.state for e in ended}
    assert states == {"crashed1": SaleState.FAILED, "crashed2": SaleState.FAILED}


async def test_a_settled_charge_left_undispensed_is_refunded(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    sim = await sim_factory(time_scale=300, transactions=0)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        trans_id = await authorize(service, "KACRASHED1", capture=True)
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{sim.base_url}/sim/settle") as answer,
        ):
            assert answer.status == 200
    leave_open(tmp_path, state=SaleState.DISPENSING, trans_id=trans_id, captured_cents=300)
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    assert event.state is SaleState.REVERSED
    assert "$3.00 refunded" in event.message
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.reverse_trans_id not in (None, trans_id)
    by_id = {row.trans_id: row for row in await rows(agent.service, "KACRASHED1")}
    assert by_id[trans_id].status is TransStatus.REFUNDED
    assert by_id[record.reverse_trans_id].status is TransStatus.REFUND


class JournalBreakingMachine(ScriptedDispenser):
    """Vends, while the disk under the journal turns read-only."""

    def __init__(self, journal: Journal) -> None:
        super().__init__()
        self.journal = journal

    async def dispense(self, authorized_cents: int) -> Any:
        self.journal.db.execute("PRAGMA query_only=ON")
        return await super().dispense(authorized_cents)


async def test_a_confirmed_vend_that_cannot_be_written_is_written_once_the_journal_is_back(
    agent_factory: Any, sim_factory: Any
) -> None:
    sim = await sim_factory(time_scale=300, transactions=0)
    agent = await agent_factory(sim=sim)
    sale = await agent.sales.start(
        SaleRequest(source="test", flow=Flow.CHARGE_CARD, amount_cents=250),
        JournalBreakingMachine(agent.journal),
    )
    kept = await asyncio.wait_for(sale.result(), WAIT_S)
    # its own kind, carrying what the journal holds: never a state the journal does not
    # (it was published as a final "attention" the journal never held)
    assert kept.unwritten
    assert kept.step == "journal.unwritten"
    on_disk = agent.journal.get(sale.sale_id)
    assert on_disk is not None
    assert (kept.state, kept.captured_cents) == (on_disk.state, on_disk.captured_cents)
    assert kept.state is SaleState.DISPENSING
    assert agent.health.snapshot().journal.unwritten_sales == [sale.sale_id]
    assert not agent.availability.state("SIM-0001").available
    [row] = await rows(agent.service, sale.order_id)
    assert row.status is TransStatus.CAPTURED  # no call was made without its journal step

    agent.journal.db.execute("PRAGMA query_only=OFF")
    async with asyncio.timeout(WAIT_S):
        while agent.unwritten.sale_ids:
            await asyncio.sleep(0.05)
    record = agent.journal.get(sale.sale_id)
    assert record is not None
    assert record.state is SaleState.COMPLETED  # the vend was confirmed: the money stays
    assert "journal.restored" in [s.step for s in agent.journal.steps(sale.sale_id)]
    [row] = await rows(agent.service, sale.order_id)
    assert row.status is TransStatus.CAPTURED


async def charge_on_terminal(service: ServiceClient, order_id: str) -> str:
    """A charge-card the crashed agent never heard the answer of (captured at once)."""
    handle = await service.terminal.charge_card("SIM-0002", 300, order_id=order_id)
    result = (await handle.wait(timeout=5)).charge_result
    assert result is not None
    assert result.approved
    return result.trans_id


@pytest.mark.parametrize("settled", [False, True], ids=["voided", "refunded"])
async def test_a_lost_charge_card_found_already_given_back_shows_the_money_taken_and_back(
    agent_factory: Any, sim_factory: Any, tmp_path: Path, settled: bool
) -> None:
    sim = await sim_factory(time_scale=300, transactions=0)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        trans_id = await charge_on_terminal(service, "KACRASHED1")
        if settled:
            await sim_call(sim, "POST", "/sim/settle")
        back = await service.payments.void_or_refund(trans_id)  # given back before the restart
    leave_open(tmp_path, state=SaleState.UNRESOLVED, flow=Flow.CHARGE_CARD.value)
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    record = agent.journal.get("crashed1")
    assert record is not None
    assert event.state is SaleState.REVERSED
    # what the service holds: $3.00 charged, then given back under the journal's trans_id
    assert (record.trans_id, record.captured_cents, record.reversed_cents) == (trans_id, 300, 300)
    assert record.reverse_trans_id == back.trans_id
    assert money_text(record) == money_text(event) == "nothing charged ($3.00 given back)"


async def test_a_lost_authorization_killed_before_reporting_first_answered_frees_its_terminal(
    agent_factory: Any, tmp_path: Path
) -> None:
    # The agent died while the first lookup in reporting was on its way (slow reporting): the
    # sale had journaled its lost answer and released the terminal, but was still AUTHORIZING,
    # and the next customer was reading a card. The terminal takes sales once that read is
    # ended, as for an UNRESOLVED one, not after the older sale's deadline.
    clock = FakeClock(wall=time.time())
    leave_open(
        tmp_path, state=SaleState.AUTHORIZING, step=Step.AUTHORIZE_LOST,
        answer_by=clock.time() + 30,
    )
    leave_open(tmp_path, state=SaleState.READING_CARD, sale_id="crashed2", order_id="KACRASHED2")
    agent = await agent_factory(clock=clock)
    assert agent.sales.busy_reason("SIM-0001") == "recovering sale crashed2"
    await until(lambda: agent.sales.busy_reason("SIM-0001") is None)
    lost = agent.journal.get("crashed1")
    assert lost is not None
    assert not lost.state.final  # reporting is asked until its deadline
    ended = await clock.run(agent.recovery.wait())
    states = {e.sale_id: e.state for e in ended}
    assert states == {"crashed1": SaleState.FAILED, "crashed2": SaleState.FAILED}


async def test_a_card_read_sent_before_the_crash_is_waited_out_by_the_next_customer(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    # The agent died after sending a read-card, before its answer (its id never journaled):
    # the read still waits for a card on the terminal (..05: nobody taps). The next customer
    # is served once it ends, not refused with "terminal busy". The read ends when the test
    # cancels it, once the customer is seen waiting: its 3-minute lifetime (36 s here) never
    # decides the test, however slow the machine (a 0.6 s lifetime did, under load). The agent
    # is told the same time scale: on the tests' usual 300 it counted the lost read over after
    # 0.6 s, and a starved loop's next customer was refused "terminal busy", not made to wait.
    sim = await sim_factory(time_scale=5, transactions=0)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        read = await service.terminal.read_card("SIM-0001", 305)
        leave_open(tmp_path, state=SaleState.READING_CARD, amount_cents=305)
        agent = await agent_factory(sim=sim, time_scale=5)
        [ended] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
        assert ended.state is SaleState.FAILED
        machine = ScriptedDispenser(DispenseStatus.VENDED, vended_cents=300)
        sale = await agent.sales.start(
            SaleRequest(source="test", flow=Flow.AUTHORIZE_CAPTURE, amount_cents=300), machine
        )

        def waiting() -> bool:
            return "terminal.wait" in [s.step for s in agent.journal.steps(sale.sale_id)]

        async with asyncio.timeout(WAIT_S):
            while not waiting():
                await asyncio.sleep(0.02)
        assert not sale.task.done()  # waiting, not refused
        await service.terminal.cancel("SIM-0001", read.interaction_id)
        event = await asyncio.wait_for(sale.result(), WAIT_S)
    assert event.state is SaleState.COMPLETED, event.message


async def test_a_charge_card_result_naming_another_charge_is_not_given_back_by_recovery(
    agent_factory: Any, sim_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crashed sale's charge-card succeeded; the terminal's record of it, read at
    recovery, names another program's order and charge on the same merchant. Recovery gives
    back the charge reporting holds under the sale's own order id, never the one named."""
    sim = await sim_factory(time_scale=300, transactions=0)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        handle = await service.terminal.charge_card("SIM-0001", 300, order_id="KACRASHED1")
        interaction = await handle.wait(timeout=5)
        own = interaction.charge_result
        assert own is not None
        assert own.approved
        foreign = await service.payments.charge(ChargeRequest(
            amount=300, account_token="9412345678901111", expiration="1230",
            order_id="OTHER-PROGRAM-7", terminal_id="SIM-0001",
        ))  # fmt: skip
    leave_open(
        tmp_path, state=SaleState.CHARGING, flow=Flow.CHARGE_CARD.value,
        interaction_id=interaction.interaction_id, interaction_kind="charge_card",
    )  # fmt: skip
    get_interaction = TerminalClient.get_interaction

    async def contradicted(self: TerminalClient, *args: Any) -> Interaction:
        record = await get_interaction(self, *args)
        named = {**(record.result or {}), "order_id": "OTHER-PROGRAM-7",
                 "trans_id": foreign.trans_id}  # fmt: skip
        return record.model_copy(update={"result": named})

    monkeypatch.setattr(TerminalClient, "get_interaction", contradicted)
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    assert event.state is SaleState.REVERSED, event.message
    [mine] = await rows(agent.service, "KACRASHED1")
    assert mine.status is TransStatus.VOIDED
    [theirs] = await rows(agent.service, "OTHER-PROGRAM-7")
    assert theirs.status is TransStatus.CAPTURED  # another's money: never moved
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.trans_id == own.trans_id


async def test_a_capture_found_above_the_vend_at_recovery_is_put_to_a_person(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """Killed while capturing the $1.75 vended of a $3.00 hold; the service captured the
    whole $3.00 (its fault). Recovery finds it captured, and does not call the sale paid
    $3.00 for a $1.75 vend: a person decides, shown both amounts."""
    sim = await sim_factory(time_scale=300, transactions=0)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        trans_id = await authorize(service, "KACRASHED1", capture=False)
        await service.payments.capture(trans_id)  # in full, not the 175 the agent asked
    leave_open(
        tmp_path, state=SaleState.CAPTURING, trans_id=trans_id, authorized_cents=300,
        vended_cents=175,
    )  # fmt: skip
    agent = await agent_factory(sim=sim)
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)
    assert event.state is SaleState.ATTENTION, event.message
    assert "$3.00 for the $1.75 asked" in event.message
    assert event.captured_cents == 300  # what the service holds
    # nor does the attention sweeper, which bounded a capture by the price held, not the vend
    assert await agent.attention.sweep() == []
    record = agent.journal.get("crashed1")
    assert record is not None
    assert record.state is SaleState.ATTENTION


async def _left_dispensing(
    sim_factory: Any, tmp_path: Path, boot: str = "fake-boot-1", product: str | None = "B1",
    **fields: Any,
) -> tuple[Any, FakeClock]:
    """A sale a crashed agent left dispensing B1 on boot ``fake-boot-1``: authorized on a new
    simulator, approved a second before the next start, its answer due 29 s after (``fields``
    added, as its source). The simulator, and the next start's clock, on ``boot``."""
    sim = await sim_factory(time_scale=300, transactions=0)
    trans_id = await crashed_charge(sim, capture=False)
    clock = FakeClock(wall=time.time(), boot_id=boot)
    # its steps dated on the next start's clock too: dated in real time, the dispense's step
    # (placed on the monotonic clock through the send's anchor) moved on by the real time the
    # setup took, and on a starved loop the vend's deadline came 2.2 s late
    leave_open(
        tmp_path, clock, state=SaleState.DISPENSING, trans_id=trans_id, authorized_cents=300,
        product=product, sent_at=clock.time() - 1, sent_mono=clock.monotonic() - 1,
        sent_boot="fake-boot-1", answer_by=clock.time() + 29, **fields,
    )
    return sim, clock


@pytest.mark.parametrize("boot", ["fake-boot-1", "fake-boot-2"], ids=["same_boot", "rebooted"])
async def test_a_sale_left_dispensing_is_listened_for_until_its_vend_deadline_on_this_boot(
    agent_factory: Any, sim_factory: Any, tmp_path: Path, boot: str
) -> None:
    """Standing rule 13 across a restart: the vend's deadline is the journaled approval (the
    dispense.request step, placed on the monotonic clock by the money call's send anchor) plus
    the vend timeout. On the same boot recovery listens until then (the machine may still say
    how the vend ended; none does here) and gives the money back at the deadline, saying so.
    After a reboot (a power cut: the controller restarted too) there is nothing to hear: the
    money goes back at once, as before."""
    sim, clock = await _left_dispensing(sim_factory, tmp_path, boot)
    agent = await agent_factory(sim=sim, clock=clock)
    listening = agent.sales.listening_after_restart("crashed1")
    started = clock.monotonic()
    [event] = await clock.run(agent.recovery.wait(), horizon=600)
    assert event.state is SaleState.REVERSED
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.VOIDED
    if boot == "fake-boot-1":
        assert listening is not None
        assert "no vend result within its vend timeout after the restart" in event.message
        # its deadline: approved a second before the start, then the vend timeout
        assert clock.monotonic() - started >= agent.sales.vend_timeout_of("test") - 1
    else:
        assert listening is None
        assert "after the restart" not in event.message


async def test_a_sale_left_dispensing_by_the_demos_virtual_machine_is_given_back_at_once(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """The ``virtual`` platform's machine is made anew with each agent, so nothing of a vend the
    last run left can be heard: on the same boot recovery gives the money back at once instead
    of refusing the demo's customers for a vend timeout (found by i39-restart-tests)."""
    sim, clock = await _left_dispensing(sim_factory, tmp_path, source="virtual:vending")

    agent = await agent_factory(
        "triggers: [{platform: virtual, name: vending, terminal: SIM-0001, customers: false}]\n",
        sim=sim, clock=clock,
    )
    assert agent.sales.listening_after_restart("crashed1") is None
    [event] = await clock.run(agent.recovery.wait(), horizon=600)
    assert event.state is SaleState.REVERSED
    assert "after the restart" not in event.message  # not a vend timeout's wait
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.VOIDED


async def test_a_vend_result_heard_as_the_listening_deadline_passes_is_not_dropped(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """An attack on the restart's hearing: the machine says VEND,SUCCESS in the very turns its
    deadline passes. The runner took the result (``restart_vend_heard`` answered True, so the
    platform counts it settled and makes no late vend of it), but the timeout had already
    woken recovery. Before, recovery gave the money back as if nothing was heard ("no vend
    result within its vend timeout"), and the product gone out unpaid reached nobody. Now a
    result the runner took is the one recovery settles on: captured."""
    sim, clock = await _left_dispensing(sim_factory, tmp_path)
    agent = await agent_factory(sim=sim, clock=clock)
    started = clock.monotonic()
    recovered = asyncio.ensure_future(agent.recovery.wait())
    deadline = started - 1 + agent.sales.vend_timeout_of("test")
    await until(lambda: any(abs(due - deadline) < 1.5 for due in clock.pending()))
    [due] = [d for d in clock.pending() if abs(d - deadline) < 1.5]
    accepted: list[bool] = []
    success = DispenseOutcome(DispenseStatus.VENDED, 0, "B1", "vend success")
    loop = asyncio.get_running_loop()
    # the result comes two loop turns after the deadline's timer fired: the timer has woken
    # the wait, recovery has not run yet
    loop.call_soon(loop.call_soon, loop.call_soon,
                   lambda: accepted.append(agent.sales.restart_vend_heard("crashed1", success)))
    await clock.advance_to(due)
    [event] = await clock.run(recovered, horizon=600)
    assert accepted == [True]  # the runner took it: the platform makes no late vend of it
    assert event.state is SaleState.COMPLETED, event.message
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.CAPTURED


async def _card_first_left_dispensing(
    sim_factory: Any, tmp_path: Path, chose_ago: float | None, boot: str = "fake-boot-1",
    **detail: Any,
) -> tuple[Any, FakeClock]:
    """A card-first sale a crashed agent left dispensing: $3.00 authorized, no product named
    with the request; its customer chose A2 at $2.50 ``chose_ago`` seconds before the next
    start (None: had not chosen), as the flow journals it (``dispense.chosen``; ``detail``
    written over it). The next start's clock on ``boot``."""
    # the mdb platform's (the only one with card-first sessions), as a journal of the release
    # before chosen_at_machine has it: no flag on its created step
    sim, clock = await _left_dispensing(sim_factory, tmp_path, boot, product=None,
                                        source="mdb:front")
    if chose_ago is not None:
        journal = Journal(tmp_path / "journal.db")
        journal.open()
        record = journal.get("crashed1")
        assert record is not None
        journal.record(record, Step.DISPENSE_CHOSEN, product="A2", detail={
            "product": "A2", "cents": 250, "mono": clock.monotonic() - chose_ago, **detail})
        journal.close()
    return sim, clock


@pytest.mark.parametrize("heard", [True, False], ids=["success", "silence"])
async def test_a_card_first_sale_left_dispensing_is_listened_for_from_its_choice(
    agent_factory: Any, sim_factory: Any, tmp_path: Path, heard: bool
) -> None:
    """Card first, the price comes with the customer's choice, journaled before its vend was
    approved (with this boot's monotonic time): recovery listens for that vend until the choice
    plus the vend timeout, as for a selection-first sale, and a success is captured at the
    chosen price ($2.50), not the $3.00 held; silence gives the money back at that deadline.
    Before, no price was journaled and the money went back at once."""
    sim, clock = await _card_first_left_dispensing(sim_factory, tmp_path, chose_ago=0.5)
    agent = await agent_factory(sim=sim, clock=clock)
    started = clock.monotonic()
    assert agent.sales.listening_after_restart("crashed1") is not None
    deadline = started - 0.5 + agent.sales.vend_timeout_of("test")
    await until(lambda: any(abs(due - deadline) < 0.1 for due in clock.pending()))  # listens
    recovered = asyncio.ensure_future(agent.recovery.wait())
    if heard:
        success = DispenseOutcome(DispenseStatus.VENDED, 0, "A2", "vend success")
        assert agent.sales.restart_vend_heard("crashed1", success)
    else:  # its deadline: the choice, half a second before the start, plus the vend timeout
        # (2 s); not the approval's (dispense.request, a second later than the choice here)
        await clock.advance_to(deadline - 0.1)
        await asyncio.sleep(0.05)
        assert not recovered.done()
        assert agent.journal.get("crashed1").state is SaleState.DISPENSING
        await clock.advance_to(deadline)
    [event] = await asyncio.wait_for(recovered, WAIT_S)  # the clock moved no further
    [row] = await rows(agent.service, "KACRASHED1")
    if heard:
        assert (event.state, event.captured_cents, event.product) == (
            SaleState.COMPLETED, 250, "A2"), event.message
        assert (row.status, row.amount_cents) == (TransStatus.CAPTURED, 250)
        return
    assert event.state is SaleState.REVERSED
    assert "no vend result within its vend timeout after the restart" in event.message
    assert row.status is TransStatus.VOIDED


@pytest.mark.parametrize(
    "choice", ["none", "unreadable", "rebooted", "nothing", "negative", "after the start"])
async def test_a_card_first_sale_left_before_its_customer_chose_is_given_back_at_once(
    agent_factory: Any, sim_factory: Any, tmp_path: Path, choice: str
) -> None:
    """Card first, the session was open but nobody had chosen: no vend was approved, nothing
    can be heard of one, and the money goes back at once (no hearing holds the terminal). So
    too for a choice's step not as the flow writes it (a hand-edited journal: unreadable, a
    price of nothing or less, a time this boot had not come to): the start goes on, the vend
    is not listened for. And for a choice on another boot (a power cut, which may also lose
    that step, committed without an fsync of its own: the controller restarted too)."""
    if choice == "none":
        sim, clock = await _card_first_left_dispensing(sim_factory, tmp_path, chose_ago=None)
    elif choice == "unreadable":
        sim, clock = await _card_first_left_dispensing(sim_factory, tmp_path, chose_ago=0.5,
                                                       mono="yesterday", cents=None)
    elif choice in ("nothing", "negative"):  # the flow never approves these (vend_refusal):
        # listened for, a success would have captured 0 (which a service may read as "all"),
        # or less than nothing
        cents = 0 if choice == "nothing" else -250
        sim, clock = await _card_first_left_dispensing(sim_factory, tmp_path, chose_ago=0.5,
                                                       cents=cents)
    elif choice == "after the start":  # this boot's clock had not come to it: heard for an
        # hour past the vend timeout
        sim, clock = await _card_first_left_dispensing(sim_factory, tmp_path, chose_ago=-3600)
    else:
        sim, clock = await _card_first_left_dispensing(sim_factory, tmp_path, chose_ago=0.5,
                                                       boot="fake-boot-2")
    agent = await agent_factory(sim=sim, clock=clock)
    started = clock.monotonic()
    assert agent.sales.listening_after_restart("crashed1") is None
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)  # the clock never moved
    assert clock.monotonic() == started
    assert event.state is SaleState.REVERSED
    assert "after the restart" not in event.message
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.VOIDED


async def test_a_vend_result_heard_before_recovery_comes_to_its_sale_is_settled_on(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """An attack on the restart's hearing: recovery finishes a terminal's open sales one after
    the other, and the one before the sale left dispensing (an authorization whose answer was
    lost, looked up in reporting until its deadline, 29 s) takes longer than that vend's
    deadline (2 s). The controller says VEND,SUCCESS at once, in time: the runner takes it
    (``restart_vend_heard`` answers True, so the platform makes no late vend of it). Before,
    recovery found the hearing over when it came to the sale and gave the money back
    ("interrupted before the dispense was confirmed"): the product went out unpaid and nobody
    was told. Now what was heard is settled on: captured."""
    wall = time.time()
    leave_open(tmp_path, sale_id="lost1", order_id="KALOST1", state=SaleState.AUTHORIZING,
               sent_at=wall - 1, sent_mono=999.0, sent_boot="fake-boot-1", answer_by=wall + 29)
    sim, clock = await _left_dispensing(sim_factory, tmp_path)  # after it, on one terminal
    assert clock.monotonic() == 1000.0  # the lost authorization's send anchor, a second ago
    agent = await agent_factory(sim=sim, clock=clock)
    success = DispenseOutcome(DispenseStatus.VENDED, 0, "B1", "vend success")
    assert agent.sales.restart_vend_heard("crashed1", success)  # the platform counts it settled
    events = await clock.run(agent.recovery.wait(), horizon=600)
    assert clock.monotonic() > 1002.0  # the vend's deadline passed behind the lost answer
    ended = {event.sale_id: event for event in events}
    assert ended["lost1"].state is SaleState.FAILED, ended["lost1"].message
    assert (ended["crashed1"].state, ended["crashed1"].captured_cents) == (
        SaleState.COMPLETED, 300), ended["crashed1"].message
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.CAPTURED


@pytest.mark.parametrize("flow", ["selection first", "card first"])
async def test_a_sale_killed_after_the_machine_said_its_vend_failed_is_not_listened_for(
    agent_factory: Any, sim_factory: Any, tmp_path: Path, flow: str
) -> None:
    """Found by the card-first crash driver (test_crash.py): the machine said the vend failed
    (``dispense.result``, journaled) and the agent was killed before the give-back's request,
    the sale still dispensing. That vend is over and its result known: the money goes back at
    once. Before, recovery listened for it until its deadline, holding the terminal and the
    controller's setup for a vend that had ended, and would have captured a success heard
    then (a vend the journal says the machine did not make)."""
    if flow == "card first":
        sim, clock = await _card_first_left_dispensing(sim_factory, tmp_path, chose_ago=0.5)
    else:
        sim, clock = await _left_dispensing(sim_factory, tmp_path)
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    record = journal.get("crashed1")
    assert record is not None
    journal.record(record, Step.DISPENSE_RESULT,
                   detail={"status": "failed", "vended_cents": 0, "detail": "vend failure"})
    journal.close()
    agent = await agent_factory(sim=sim, clock=clock)
    started = clock.monotonic()
    assert agent.sales.listening_after_restart("crashed1") is None
    success = DispenseOutcome(DispenseStatus.VENDED, 0, "B1", "vend success")
    assert not agent.sales.restart_vend_heard("crashed1", success)  # nobody takes it as paid
    [event] = await asyncio.wait_for(agent.recovery.wait(), WAIT_S)  # the clock never moved
    assert clock.monotonic() == started
    assert (event.state, event.captured_cents) == (SaleState.REVERSED, 0), event.message
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.VOIDED


@pytest.mark.parametrize("flow", ["selection first", "card first"])
async def test_the_terminal_takes_the_next_sale_while_recovery_captures_a_vend_it_heard(
    agent_factory: Any, sim_factory: Any, tmp_path: Path, flow: str
) -> None:
    """Once the machine said how the vend a restart left ended, what is left of that sale is
    the payments API's (a capture, or money given back): a live sale lets its terminal go
    before its capture, and so now does recovery for its terminal's last sale. Before,
    recovery held the terminal through its capture: the next customer (card first, the
    machine's next offer) was refused (TerminalBusy) while the capture ran, and the offers
    came ever more slowly (``offer_pause``) behind a slow one."""
    if flow == "card first":
        sim, clock = await _card_first_left_dispensing(sim_factory, tmp_path, chose_ago=0.5)
    else:
        sim, clock = await _left_dispensing(sim_factory, tmp_path)
    slow = {"path": "/api/v1/capture", "fault": "delay", "delay_s": 1.0}  # real seconds
    await sim_call(sim, "POST", "/sim/faults", slow)
    agent = await agent_factory(sim=sim, clock=clock)
    assert agent.sales.busy_reason("SIM-0001") == "recovering sale crashed1"  # it listens
    recovered = asyncio.ensure_future(agent.recovery.wait())
    success = DispenseOutcome(DispenseStatus.VENDED, 0, "A2", "vend success")
    assert agent.sales.restart_vend_heard("crashed1", success)
    await until(lambda: agent.journal.get("crashed1").state is SaleState.CAPTURING)
    await asyncio.sleep(0.05)  # the capture is with the service, slow to answer
    assert not recovered.done()
    assert agent.sales.busy_reason("SIM-0001") is None  # the next customer may start
    [event] = await clock.run(recovered, horizon=600)
    assert event.state is SaleState.COMPLETED, event.message
    assert event.captured_cents == (250 if flow == "card first" else 300)


@pytest.mark.parametrize(
    "left", ["silence", "rebooted", "card first", "card first unchosen", "said failed", "virtual"])
async def test_a_vend_left_in_flight_and_never_heard_is_told_to_a_person(
    agent_factory: Any, sim_factory: Any, tmp_path: Path, left: str
) -> None:
    """Found by bench/chaos.py (2026-11-30, i40-chaos): an agent killed with a vend in flight
    (``dispense.request`` journaled, C,VEND sent) whose machine said how it ended while no agent
    listened. Recovery heard nothing and gave the money back: right for the money, but every
    such sale in three runs had vended (6 of 6 in one, 6 of 9 in another) and no person was
    told: not a late vend (none was heard), no problem in health. Now it is told as a
    dispenser's error is: a ``late.vend`` note with ``unsure`` on the sale, and health's problem
    line until a person acknowledges it. Not for a vend that cannot have been made: the machine
    had said it failed, a card-first customer never chose, or the demo's machine, made anew
    with each agent."""
    source = "virtual:vending" if left == "virtual" else "test"
    if left in ("card first", "card first unchosen"):
        chose_ago = 0.5 if left == "card first" else None
        sim, clock = await _card_first_left_dispensing(sim_factory, tmp_path, chose_ago=chose_ago)
    else:
        boot = "fake-boot-2" if left == "rebooted" else "fake-boot-1"
        sim, clock = await _left_dispensing(sim_factory, tmp_path, boot, source=source)
    if left == "said failed":
        journal = Journal(tmp_path / "journal.db")
        journal.open()
        record = journal.get("crashed1")
        assert record is not None
        journal.record(record, Step.DISPENSE_RESULT,
                       detail={"status": "failed", "vended_cents": 0, "detail": "vend failure"})
        journal.close()
    triggers = ("triggers: [{platform: virtual, name: vending, terminal: SIM-0001, "
                "customers: false}]\n") if left == "virtual" else None
    agent = await agent_factory(triggers or "", sim=sim, clock=clock)

    [event] = await clock.run(agent.recovery.wait(), horizon=600)

    assert event.state is SaleState.REVERSED, event.message
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.VOIDED  # the money went back either way
    noted = late_vended(agent.journal).get("crashed1")
    problem = agent.sales.late_vends.problem()
    if left in ("card first unchosen", "said failed", "virtual"):
        assert noted is None
        assert problem is None
        return
    assert noted is not None
    assert noted.product == ("A2" if left == "card first" else "B1")
    assert noted.unsure.startswith("the agent stopped mid-vend")
    assert noted.text().startswith(f"may have dispensed {noted.product} ")
    assert problem is not None
    assert problem.startswith(
        "1 product(s) that may have been dispensed (the agent stopped mid-vend), unpaid"), problem
    assert "sale crashed1" in problem


@pytest.mark.parametrize("voided", [False, True], ids=["not sent", "made"])
async def test_a_give_back_a_kill_left_without_its_note_still_tells_of_the_unheard_vend(
    agent_factory: Any, sim_factory: Any, tmp_path: Path, voided: bool
) -> None:
    """A sale reversing whose vend was approved (``dispense.request``) and never heard end, with
    no late vend on it: what an earlier release's recovery left when killed after its
    ``reverse.request`` (it wrote the note once the money was back; 2026-11-30, the lead's
    chaos run, seed 51). The next start finished it by its reversing path, which knew nothing
    of vends: the product may have gone out unpaid, told to nobody. Now that path reads the
    journal's facts, not which code decided the give-back: told, with the vend's price, in
    the commit that ends the sale, whether the give-back is sent again or found made."""
    sim, clock = await _left_dispensing(sim_factory, tmp_path)
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    record = journal.get("crashed1")
    assert record is not None
    assert record.trans_id is not None
    journal.record(record, Step.RECOVERY_START, detail={"state": "dispensing"})
    record = journal.get("crashed1")
    assert record is not None
    journal.record(record, Step.REVERSE_REQUEST, SaleState.REVERSING,
                   detail={"trans_id": record.trans_id},
                   message="interrupted before the dispense was confirmed")
    journal.close()
    if voided:  # the give-back the killed agent sent was made
        async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
            await service.payments.void_or_refund(record.trans_id)
    agent = await agent_factory(sim=sim, clock=clock)

    [event] = await clock.run(agent.recovery.wait(), horizon=600)

    assert event.state is SaleState.REVERSED, event.message
    [row] = await rows(agent.service, "KACRASHED1")
    assert row.status is TransStatus.VOIDED
    steps = [s.step for s in agent.journal.steps("crashed1")]
    assert steps.count(Step.LATE_VEND) == 1, steps
    noted = late_vended(agent.journal)["crashed1"]
    assert (noted.product, noted.cents) == ("B1", 300)
    assert noted.unsure.startswith("the agent stopped mid-vend"), noted
    problem = agent.sales.late_vends.problem()
    assert problem is not None
    assert "sale crashed1" in problem, problem
    assert agent.sales.late_vends.counts() == (0, 1)


async def test_a_vend_left_in_flight_with_no_charge_id_is_told_before_a_person_decides(
    agent_factory: Any, sim_factory: Any, tmp_path: Path
) -> None:
    """A sale left dispensing with no charge id in its journal (a hand-edited or damaged one:
    the flows write it with the approval). Recovery has no request step to share a commit with:
    the vend it approved is told as a step of its own before anything else is decided; then
    reporting cannot be waited on from ``dispensing`` (the table has no move to
    ``unresolved``), so a person decides (``attention``), as before."""
    sim = await sim_factory(time_scale=300, transactions=0)
    clock = FakeClock(wall=time.time(), boot_id="fake-boot-2")
    leave_open(tmp_path, state=SaleState.DISPENSING, product="B1",
               sent_at=clock.time() - 1, sent_mono=clock.monotonic() - 1,
               sent_boot="fake-boot-1", answer_by=clock.time() + 2)
    agent = await agent_factory(sim=sim, clock=clock)

    [event] = await clock.run(agent.recovery.wait(), horizon=600)

    assert event.state is SaleState.ATTENTION, event.message
    steps = [s.step for s in agent.journal.steps("crashed1")]
    # recovery's last two steps (the attention sweep, on the same clock, may end the sale
    # after them: reporting shows no charge under its order id)
    error = steps.index(Step.RECOVERY_ERROR)
    assert steps[error - 1:error + 1] == [Step.LATE_VEND, Step.RECOVERY_ERROR], steps
    assert steps.count(Step.LATE_VEND) == 1, steps
    noted = late_vended(agent.journal)["crashed1"]
    assert (noted.product, noted.cents) == ("B1", 300)
    assert agent.sales.late_vends.counts() == (0, 1)
