"""serial_line: a device described by expressions and templates, here the virtual MDB controller.

The virtual controller speaks the MDB adapter's lines; configured with matching expressions the
generic serial_line platform sells through it over a real pty, no MDB code involved.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from kiosk_agent.cli.sim import settings_from_ready
from kiosk_agent.health.availability import short_reason
from kiosk_agent.money import parse_wire_amount
from kiosk_agent.platforms import mdb_protocol as wire
from kiosk_agent.platforms.serial import SerialSettings
from kiosk_agent.platforms.serial_line import PLATFORM_SCHEMA, LineRules, SerialLineDevice, Vend
from kiosk_agent.sales.model import DispenseStatus, Flow, SaleRequest
from kiosk_agent.sales.states import SaleState
from kiosk_agent.sim.context import SimOptions
from kiosk_agent.sim.machine import Status, VirtualController, VisitOutcome
from kiosk_agent.sim.server import SimServer

from ..helpers import ErrorLog, sim_call, until
from .agent_rig import running_agent
from .vending_rig import CardDesk, LineDevice, given_up_while_waiting

MDB_AS_LINES = {
    "platform": "serial_line",
    "name": "vmc",
    "port": "/dev/null",
    "init": ["C,0", "C,1"],
    "vend_request": r"^c,STATUS,VEND,(?P<price>[\d.]+),(?P<product>\w+)$",
    "dispense_ok": r"^c,VEND,SUCCESS",
    "dispense_failed": r"^c,ERR,(?P<reason>VEND.*)$",
    "cancel": r"^c,STATUS,(INACTIVE|DISABLED)",
    "approve": "C,VEND,{amount}",
    "deny": "C,STOP",
    "vend_timeout": 0.5,
}


@pytest.fixture
async def device(controller: VirtualController) -> AsyncIterator[SerialLineDevice]:
    config = PLATFORM_SCHEMA(dict(MDB_AS_LINES))
    dev = SerialLineDevice(
        CardDesk(),
        SerialSettings(port=controller.port, reconnect_min=0.02, reconnect_max=0.2),
        LineRules.from_config(config),
        source="serial_line:vmc",
        vend_timeout=config["vend_timeout"],
    )
    await dev.start()
    await asyncio.wait_for(controller.wait_enabled(), 3)
    yield dev
    await dev.stop()


def desk(device: SerialLineDevice) -> CardDesk:
    assert isinstance(device.sales, CardDesk)
    return device.sales


async def test_vend_request_is_approved_with_the_template(
    device: SerialLineDevice, controller: VirtualController
) -> None:
    visit = await controller.customer("B1")

    assert visit.outcome is VisitOutcome.VENDED
    assert "C,VEND,3.25" in controller.received
    [final] = await desk(device).settled()
    assert final.state is SaleState.COMPLETED
    assert final.captured_cents == 325
    assert final.product == "B1"


async def test_decline_sends_the_deny_template(
    device: SerialLineDevice, controller: VirtualController
) -> None:
    visit = await controller.customer("D2")
    assert visit.outcome is VisitOutcome.DENIED
    [final] = await desk(device).settled()
    assert final.state is SaleState.DECLINED


async def test_the_next_request_starts_once_the_terminal_is_free_not_after_the_capture(
    device: SerialLineDevice, controller: VirtualController
) -> None:
    desk(device).capture_time = 0.3  # the payments API is slow to capture
    first = await controller.customer("A2")
    second = await controller.customer("A1")  # at once, while the first captures

    assert (first.outcome, second.outcome) == (VisitOutcome.VENDED, VisitOutcome.VENDED)
    assert not desk(device).sales[0].final.done()  # still capturing
    finals = await asyncio.wait_for(desk(device).settled(), 3)
    assert [f.captured_cents for f in finals] == [250, 150]
    assert device.outcomes["vended"] == 2


async def test_dispense_failure_and_no_result(
    device: SerialLineDevice, controller: VirtualController
) -> None:
    failed = await controller.customer("A1", fail=True)
    silent = await controller.customer("A2", no_result=True)
    first, second = desk(device).sales
    assert failed.outcome is VisitOutcome.FAILED
    assert (await first.result()).state is SaleState.REVERSED
    assert first.outcome is not None
    assert first.outcome.detail == "dispense failed: VEND 3"
    assert silent.outcome is VisitOutcome.NO_RESULT
    assert (await asyncio.wait_for(second.result(), 2)).state is SaleState.REVERSED
    assert second.outcome is not None
    assert second.outcome.status is DispenseStatus.TIMEOUT


async def test_cancel_expression_cancels_the_waiting_sale(
    device: SerialLineDevice, controller: VirtualController
) -> None:
    desk(device).card_time = 1.0
    visit_task = asyncio.create_task(controller.customer("A1"))
    async with asyncio.timeout(2):
        while not desk(device).sales:
            await asyncio.sleep(0.005)
    controller.reset()
    assert (await visit_task).outcome is VisitOutcome.ABORTED
    final = await asyncio.wait_for(desk(device).sales[0].result(), 2)
    assert final.state is SaleState.CANCELLED


async def test_garbage_and_replug(device: SerialLineDevice, controller: VirtualController) -> None:
    unmatched = device.unmatched
    controller.send_raw(b"\xff\xfe\x00\nnothing we know\nc,STATUS,VEND,x.yz,A1\n")
    async with asyncio.timeout(2):
        while device.unmatched < unmatched + 2:
            await asyncio.sleep(0.005)
    controller.unplug()
    controller.plug()  # init lines are sent again on reconnect: C,0 / C,1 enables it
    await asyncio.wait_for(controller.wait_enabled(), 3)
    visit = await controller.customer("A1")
    assert visit.outcome is VisitOutcome.VENDED
    assert device.link.stats.reconnects == 1
    assert device.link.stats.dropped == 1


def test_schema_errors_name_the_problem() -> None:
    with pytest.raises(Exception, match=r"named group \(\?P<price>"):
        PLATFORM_SCHEMA({**MDB_AS_LINES, "vend_request": "^REQ (\\w+)$"})
    with pytest.raises(Exception, match="not a valid regular expression"):
        PLATFORM_SCHEMA({**MDB_AS_LINES, "dispense_ok": "(unclosed"})
    with pytest.raises(Exception, match=r"unknown template field \{card\}"):
        PLATFORM_SCHEMA({**MDB_AS_LINES, "approve": "VEND {card}"})


async def test_stopping_while_the_card_is_read_cancels_the_sale(
    device: SerialLineDevice, controller: VirtualController
) -> None:
    desk(device).card_time = 5.0
    visit_task = asyncio.create_task(controller.customer("A1", walk_away_after=1.0))
    async with asyncio.timeout(2):
        while not desk(device).sales:
            await asyncio.sleep(0.005)
    await asyncio.wait_for(device.stop(), 1.0)
    final = await asyncio.wait_for(desk(device).sales[0].result(), 1.0)
    assert final.state is SaleState.CANCELLED
    visit_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await visit_task


# -- out of service, like mdb: the real agent and simulator ---------------------------------------

QUICK_HEALTH = {"health": {"ping_interval": 1, "hold_off": 0.2, "recheck_interval": 0.1}}
OUT = "C,STOP,out of service: terminal offline"


def _following(controller: VirtualController) -> dict[str, Any]:
    """MDB as lines that also leave the bus while out of service and say why when denying."""
    return {**MDB_AS_LINES, "port": controller.port, "vend_timeout": 5,
            "deny": "C,STOP,{reason}", "out_of_service": "C,0", "in_service": "C,1"}


async def test_a_vend_request_while_out_of_service_starts_no_sale_and_is_denied_with_why(
    tmp_path: Path, sim: Any, sim_settings: Any, controller: VirtualController
) -> None:
    async with running_agent(
        tmp_path, sim_settings, [_following(controller)], sections=QUICK_HEALTH
    ) as agent:
        [platform] = agent.platforms
        await asyncio.wait_for(controller.wait_enabled(), 5)
        assert (await controller.customer("A2")).outcome is VisitOutcome.VENDED
        sold = len(list(agent.journal))

        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/offline")
        # the out_of_service line takes the reader off the bus, as the mdb platform does
        await until(lambda: controller.status is Status.INACTIVE, timeout=3)
        assert platform.status()["available"] is False
        assert platform.status()["unavailable_reason"] == "terminal offline"
        # a controller that did not hear it keeps asking: every request is denied, with why
        for _ in range(20):
            controller.send(wire.vend_request_line(150, "A1"))
        await until(lambda: controller.received.count(OUT) == 20)
        assert platform.status()["denied_out_of_service"] == 20
        assert len(list(agent.journal)) == sold  # no sale started

        await sim_call(sim, "POST", "/sim/terminals/SIM-0001/online")
        await asyncio.wait_for(controller.wait_enabled(), 3)  # in_service: C,1
        assert (await controller.customer("A1")).outcome is VisitOutcome.VENDED
        assert len(list(agent.journal)) == sold + 1


async def test_a_sale_in_progress_ends_before_the_device_hears_out_of_service(
    device: SerialLineDevice, controller: VirtualController
) -> None:
    device.rules.out_of_service = "C,0"
    # the vend outlasts the test's steps by far, and the agent waits for it longer still: on a
    # loaded machine a 0.5 s dispense against a 0.5 s vend timeout ended the sale either way
    controller.options.dispense_time = 1.0
    device.vend_timeout = 10.0
    customer = asyncio.create_task(controller.customer("A2"))
    await until(lambda: "C,VEND,2.50" in controller.received)
    device.set_available(False, "service unreachable: timed out")
    assert "C,0" not in controller.received[controller.received.index("C,VEND,2.50"):]
    assert (await asyncio.wait_for(customer, 5)).outcome is VisitOutcome.VENDED
    await until(lambda: controller.status is Status.INACTIVE)  # told once the sale ended


def test_the_reason_on_the_wire_is_short_and_printable() -> None:
    assert short_reason("terminal offline") == "out of service: terminal offline"
    assert short_reason("service unreachable: ClientConnectorError: [Errno 111] ...; "
                        "terminal offline") == "out of service: service unreachable"
    assert short_reason("") == "out of service"
    key = "API key expired or refused and cannot be refreshed: HTTP 401"
    assert short_reason(key) == f"out of service: {key.split(':')[0]}"


@given(st.text(max_size=300))
def test_any_reason_gives_a_bounded_printable_line(reason: str) -> None:
    line = short_reason(reason)
    assert line.startswith("out of service")
    assert len(line) <= len("out of service: ") + 52
    assert all(" " <= c <= "~" for c in line)


# -- any line, any order: a hostile device over a real pty into the running agent -------------

MAX_PRICE = 500  # the trigger's max_price, cents
DEVICE_RULES = {
    "platform": "serial_line", "name": "locker", "init": ["HELLO"],
    "vend_request": r"^REQ (?P<product>\w+) (?P<price>\S+)$",
    "dispense_ok": r"^DONE", "dispense_failed": r"^FAIL (?P<reason>.*)$", "cancel": r"^ABORT",
    "approve": "OPEN {product} {cents}", "deny": "NO {reason}", "max_price": "5.00",
    "vend_timeout": 0.4,
}
PRICE_TEXTS = st.one_of(
    st.integers(min_value=0, max_value=700).map(lambda c: f"{c // 100}.{c % 100:02d}"),
    st.sampled_from(["1e2", "-1.00", "+2.50", "2.5", "2.500", "99999999.99", "0x10", "1_0.00",
                     "\u0662.50", "nan", "", "5.01", "4.99", "0.01"]),
    st.text(max_size=14),
)
GOOD_PRICES = st.sampled_from(["1.50", "2.50", "5.00", "3.02"])  # x.02: the card is declined
DEVICE_STEPS = st.one_of(
    st.tuples(st.just("req"), st.sampled_from(["A1", "B2", "x" * 90]), PRICE_TEXTS),
    st.tuples(st.just("req"), st.sampled_from(["A1", "B2"]), GOOD_PRICES),
    st.tuples(st.just("req_twice"), st.sampled_from(["A1", "B2"]), GOOD_PRICES),
    st.tuples(st.just("done")),
    st.tuples(st.just("fail"), st.text(max_size=30)),
    st.tuples(st.just("abort")),
    st.tuples(st.just("raw"), st.binary(max_size=80)),
    st.tuples(st.just("long"), st.integers(min_value=400, max_value=3000)),
    st.tuples(st.just("pause"), st.sampled_from([0.0, 0.01, 0.05, 0.2])),
)


@pytest.mark.slow(seconds=13)
@settings(max_examples=12, deadline=None, derandomize=True,
          phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(steps=st.lists(DEVICE_STEPS, min_size=1, max_size=14),
       split=st.integers(min_value=1, max_value=9),
       flow=st.sampled_from(["charge_card", "authorize_capture"]))
def test_a_hostile_device_moves_no_money_it_was_not_approved_for(
    tmp_path_factory: Any, steps: list[tuple[Any, ...]], split: int, flow: str
) -> None:
    """Whatever a device writes (prices of any shape, results out of turn, garbage, overlong and
    split lines): a sale only at a price it asked within max_price, at most one capture per
    approval and per DONE, every sale ended, the agent sells again afterwards."""
    asyncio.run(_hostile_device(tmp_path_factory.mktemp("line"), steps, split, flow))


async def _hostile_device(
    workdir: Path, steps: list[tuple[Any, ...]], split: int, flow: str
) -> None:
    sim = SimServer(SimOptions(port=0, time_scale=200, transactions=0, seed=1))
    await sim.start()
    device = LineDevice()
    errors = ErrorLog()
    try:
        trigger = {**DEVICE_RULES, "port": device.port, "flow": flow}
        settings = settings_from_ready(sim.ready_info())
        async with asyncio.timeout(25), running_agent(workdir, settings, [trigger]) as agent:
            await until(lambda: "HELLO" in device.heard, timeout=5)
            asked: list[int] = []  # every price the device asked, as cents, when it was one
            for step in steps:
                await _device_step(device, step, split, asked)
            await _settled(agent, device)
            _check_money(agent, device, steps, asked)
            await _sells_again(agent, device)
    finally:
        errors.close()
        device.close()
        await sim.stop()
    assert not errors.records, [r.getMessage() for r in errors.records]


async def _device_step(
    device: LineDevice, step: tuple[Any, ...], split: int, asked: list[int]
) -> None:
    match step:
        case ("req", product, price):
            with contextlib.suppress(ValueError):
                asked.append(parse_wire_amount(price, "dollars"))
            line = f"REQ {product} {price}\n".encode("utf-8", "surrogatepass")
            device.write(line[:split])  # a line split across reads
            await asyncio.sleep(0.002)
            device.write(line[split:])
        case ("req_twice", product, price):
            asked.append(parse_wire_amount(price, "dollars"))
            device.write(f"REQ {product} {price}\nREQ {product} {price}\n".encode())
        case ("done",):
            device.write(b"DONE\n")
        case ("fail", reason):
            device.write(f"FAIL {reason}\n".encode("utf-8", "surrogatepass"))
        case ("abort",):
            device.write(b"ABORT\n")
        case ("raw", data):
            device.write(data)
        case ("long", size):
            device.write(b"REQ A1 1.50" + b"9" * size + b"\n")
        case ("pause", seconds):
            await asyncio.sleep(seconds)
    await asyncio.sleep(0.005)


async def _settled(agent: Any, device: LineDevice) -> None:
    """Until the agent has read every byte the device wrote, and then the device is done and
    every sale has ended (a lost DONE times out at 0.4 s). Without the first, a loaded machine
    (the pty's bytes reach the agent's side a moment later) could look settled before the last
    request was read: "sells again" then came while that sale ran, and was denied as busy."""
    [platform] = agent.platforms
    await until(
        lambda: platform.device.link.stats.bytes_in == device.written
        and platform.device.vend is None and not agent.sales.running, timeout=15
    )


def _check_money(
    agent: Any, device: LineDevice, steps: list[tuple[Any, ...]], asked: list[int]
) -> None:
    records = agent.journal.query()
    approvals = [line for line in device.heard if line.startswith("OPEN ")]
    dones = sum(1 for step in steps if step == ("done",))
    completed = [r for r in records if r.state is SaleState.COMPLETED]
    for record in records:
        assert record.state.final, record
        kept = record.captured_cents - record.reversed_cents  # a void gives back a hold only
        assert record.state is SaleState.COMPLETED or kept <= 0, record
        assert record.amount_cents in asked, (record, asked)
        assert 0 < record.amount_cents <= MAX_PRICE, record
        assert record.captured_cents <= record.amount_cents, record
    assert len(completed) <= min(len(approvals), dones), (completed, approvals, dones)
    approved_cents = sorted(int(line.rsplit(" ", 1)[1]) for line in approvals)
    for record in completed:
        assert record.captured_cents in approved_cents, (record, approved_cents)


async def _sells_again(agent: Any, device: LineDevice) -> None:
    # the honest request on a vend timeout the test can meet however loaded the machine: the
    # rules' 0.4 s (short, so the lies' vends end) ran out starved before DONE was read
    [platform] = agent.platforms
    platform.device.vend_timeout = 60.0
    before = {r.sale_id for r in agent.journal.query()}
    heard = len(device.heard)
    device.write(b"\nREQ A1 1.50\n")  # a fresh line after any half-written one
    await until(lambda: "OPEN A1 150" in device.heard[heard:], timeout=10)
    device.write(b"DONE\n")
    await until(lambda: any(r.sale_id not in before and r.state.final
                            for r in agent.journal.query()), timeout=10)
    [new] = [r for r in agent.journal.query() if r.sale_id not in before]
    assert (new.state, new.captured_cents) == (SaleState.COMPLETED, 150), new


async def test_a_dispense_success_heard_after_the_sale_gave_up_is_told_not_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As on MDB (tests/platforms/test_mdb_phases.py): the sale stopped waiting (its vend
    timeout) and gives the money back; the device then says the locker opened. Said once at
    WARNING naming the sale, counted in the device's status; a repeat is not a second one."""

    class StartsNothing:
        running: tuple[Any, ...] = ()

        async def start(self, request: Any, dispenser: Any) -> Any:
            await asyncio.Event().wait()

    config = PLATFORM_SCHEMA({**DEVICE_RULES, "port": "/dev/null"})
    device = SerialLineDevice(StartsNothing(), SerialSettings(port="/dev/null"),  # type: ignore[arg-type]
                              LineRules.from_config(config), source="serial_line:locker")
    sent: list[str] = []
    device.send = lambda line: sent.append(line) is None  # type: ignore[method-assign]
    vend = Vend(device, SaleRequest("serial_line:locker", Flow.CHARGE_CARD, 150, product="A1"),
                "1.50")  # fmt: skip
    vend.sale_id = "s-late"
    device.vend = vend
    await given_up_while_waiting(vend.dispense(150))
    assert sent == ["OPEN A1 150"]
    with caplog.at_level("WARNING"):
        device.handle_line("DONE")  # while the sale still gives the money back
        device.vend = None
        device.handle_line("DONE")
    assert (device.status()["late_vends"], device.status()["last_late_vend_sale"]) == (
        1, "s-late")  # fmt: skip
    [said] = [r.getMessage() for r in caplog.records if "s-late" in r.getMessage()]
    assert "A1 went out unpaid" in said


class HearingDesk(CardDesk):
    """The agent's runner as a start after a crash mid-dispense finds it: recovery listens for
    how sale ``left1`` (B1) ended, its setup held back meanwhile, and holds the terminal (a new
    sale is refused at once: TerminalBusy). ``hearing`` is set as the hearing ends."""

    def __init__(self) -> None:
        super().__init__()
        self.held_elsewhere = True
        self.hearing: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def left_dispensing(self, source: str) -> list[tuple[str, str | None]]:
        return [("left1", "B1")]

    def listening_after_restart(self, sale_id: str | None) -> asyncio.Future[Any] | None:
        return self.hearing if sale_id == "left1" and not self.hearing.done() else None


@pytest.mark.parametrize("first", ["the deadline", "the request"])
async def test_the_init_lines_held_for_the_hearing_never_cut_into_a_refused_request(
    first: str
) -> None:
    """The init lines (``C,0``, ``C,1``: a reset of the controller's session) held back while
    recovery listens for the dispense a restart left come once the hearing ends; a customer's
    request heard in the same turn as the hearing's deadline is refused (recovery still holds
    the terminal while it gives that money back). Whichever comes first in that turn, the
    device hears the refusal (``C,STOP``) and then the init lines: never a reset between its
    request and the answer. Before, the deadline first sent the init lines into the request
    still waiting for its answer (a window of a loop turn)."""
    adapter = LineDevice()
    sales = HearingDesk()
    config = PLATFORM_SCHEMA(dict(MDB_AS_LINES, port=adapter.port))
    device = SerialLineDevice(
        sales, SerialSettings(port=adapter.port, reconnect_min=0.02, reconnect_max=0.2),
        LineRules.from_config(config), source="serial_line:vmc",
    )
    try:
        await device.start()
        await until(lambda: device.link.connected)
        await asyncio.sleep(0.05)
        assert adapter.heard == []  # held back while recovery listens
        if first == "the deadline":
            sales.hearing.set_result(None)
            device.handle_line("c,STATUS,VEND,2.50,A2")
        else:
            device.handle_line("c,STATUS,VEND,2.50,A2")
            sales.hearing.set_result(None)
        await until(lambda: len(adapter.heard) >= 3)
        await asyncio.sleep(0.05)
        assert adapter.heard == ["C,STOP", "C,0", "C,1"]
        assert sales.refused == 1
        assert device.vend is None
    finally:
        await device.stop()
        adapter.close()
