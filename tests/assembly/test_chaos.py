"""SIGKILL the agent at random moments while the service is slow, loses answers and fails.

The agent (``kiosk-agent run``, through ``crash_driver.py agent``), the simulator
(``kiosk-agent sim``) and two vending machines (``kiosk-agent virtual``) run as separate
processes. The agent is killed during start, during recovery, within milliseconds of each money
call and at random, and restarted after a random pause; the simulator meanwhile answers some
money calls late, loses some answers and fails some. Then one last agent ends every sale and
the simulator's ledger and the machines' own records judge the journal (``crash_driver.judge``):
no double charge, no authorization left open, money kept only for a vend the machine confirmed
at the vended price, every sale ended, journal and ledger agree. ``bench/chaos.py`` runs the
same for hundreds of kills.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kiosk_agent.config.load import load_config
from kiosk_agent.money import cents_to_dollars, dollars_to_cents
from kiosk_agent.sales.journal import Journal, SaleRecord, StepRecord
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.models import Transaction, TransStatus
from tests.assembly.crash_driver import (
    CARD_FIRST_FUNDS,
    MONEY_STEPS,
    PRODUCTS,
    Chaos,
    ChaosOptions,
    ChaosReport,
    judge,
)
from tests.faketime import SteppedClock

# Each kind of moment killed at once, planned rather than drawn: 20 drawn rounds met some money
# calls two or three times and could miss one (a moment missed is planned again, below). A kill
# during start, one within milliseconds of each money call, one as recovery begins, two at random.
# Recovery begins only where the round before left a sale open: after a money call's kill, not
# after the start's (the first round's agent, killed within 0.6 s of its spawn, has sold
# nothing). Planned second, it was missed every run, killed at random and planned again after
# the rest, where rounds run out: missing at load 8-10 once (1 of 2 runs).
MOMENTS = ("start", *sorted(MONEY_STEPS), "recovery", "random", "random")
KILLS = len(MOMENTS)
# A money round waits for its step through this many sales begun, and a random round kills at
# a random step of one of the next few sales (counts, not seconds: a loaded machine sells
# slower but reaches the same steps), so the rounds do not grow with the load. The rarest step,
# reverse.request (a failed dispense, 15 % here, or a charge given back), is aimed at with faults
# on its endpoint; a moment missed is planned again, up to MAX_KILLS rounds. (It was: 3 - 6 s
# of wall time after the agent was ready, and more rounds until 10 sales: a loaded machine
# missed more moments and ran up to 40 rounds.)
AIM_SALES = 20
MAX_KILLS = KILLS + 4
# The service's faults on half bench/chaos.py's time scale (slow answers of 0.75-2 s against a
# timeout of 1.5 s, still outlasting it at times): a start after a kill mid-call waits out that
# call's deadline before it sells, 6 s here where it was 12 s, most of a round.
FAULT_SCALE = {"slow": (0.75, 2.0), "timeout": 1.5}


@pytest.mark.slow(seconds=36)
@pytest.mark.timeout(900)  # a bound that only a hang meets, on a machine at load 20 too
async def test_random_sigkills_under_service_faults_keep_the_money_right(tmp_path: Path) -> None:
    options = ChaosOptions(workdir=tmp_path, kills=KILLS, seed=9, pause=(0.05, 0.8),
                           max_kills=MAX_KILLS, moments=MOMENTS, aim_sales=AIM_SALES,
                           **FAULT_SCALE)
    async with Chaos(options) as chaos:
        report = await chaos.run()

    assert KILLS <= report.kills <= MAX_KILLS
    met = {"start", "recovery:recovery.start", *(f"money:{step}" for step in MONEY_STEPS)}
    assert met <= set(report.kill_modes), report.kill_modes
    assert report.sales > 0, report.summary()  # no throughput: a count, however slow
    assert report.vends > 0, report.summary()
    assert sum(report.faults_armed.values()) > 0
    assert report.clock_steps, "the agent's wall clock never stepped"
    assert [v.describe() for v in report.violations] == []


DISK_KILLS = 10  # about 25 s


@pytest.mark.slow(seconds=37)
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting the journal's own tmpfs needs root")
async def test_a_journal_disk_that_fills_and_a_journal_that_loses_its_wal_keep_the_money_right(
    tmp_path: Path,
) -> None:
    """The journal on a small tmpfs filled for a moment in every round once the agent is up
    (when it lives that long), and its WAL deleted
    once between a kill and the restart: every charge still ends right in the ledger."""
    options = ChaosOptions(workdir=tmp_path, kills=DISK_KILLS, seed=12, pause=(0.05, 0.8),
                           disk_full=1.0, damage_journal="wal_deleted", aim_sales=AIM_SALES,
                           **FAULT_SCALE)
    async with Chaos(options) as chaos:
        report = await chaos.run()

    assert report.disk_full_episodes > 0, report.summary()
    assert report.journal_damaged == "wal_deleted"
    # the sales before the damage are gone from the journal: only those after it are counted
    assert report.sales > 0, report.summary()
    assert [v.describe() for v in report.violations] == []


async def test_a_run_is_bounded_by_counts_of_kills_and_sales_not_by_the_clock(
    tmp_path: Path,
) -> None:
    chaos = Chaos(ChaosOptions(workdir=tmp_path, kills=3, min_sales=2, max_kills=5))
    assert chaos._more_rounds()  # fewer than `kills` rounds
    chaos.report.kills = 3
    assert chaos._more_rounds()  # no journal yet: no sale
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    for n in range(2):
        journal.create(_sale(f"s{n}", SaleState.STARTED))
        assert chaos._more_rounds() is (n == 0)
    journal.close()
    chaos.options.min_sales = 3  # the agent sells no more: the run still ends
    chaos.report.kills = 5
    assert not chaos._more_rounds()


def test_planned_moments_are_taken_in_order_and_a_missed_one_keeps_the_run_going(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError, match=r"unknown kill moments \['capture'\]"):
        ChaosOptions(workdir=tmp_path, moments=("start", "capture"))
    chaos = Chaos(ChaosOptions(workdir=tmp_path, kills=1, min_sales=0, max_kills=4,
                               moments=("start", Step.CAPTURE_REQUEST)))
    assert chaos._moment(chaos._planned.popleft()) == ("start", None)
    assert chaos._moment(chaos._planned.popleft()) == ("money", Step.CAPTURE_REQUEST)
    mode, _target = chaos._moment(None)  # nothing planned: drawn
    assert mode in ("start", "recovery", "money", "random")
    chaos.report.kills = 1
    assert not chaos._more_rounds()  # every planned moment met, no sales asked for
    chaos._planned.append(Step.CAPTURE_REQUEST)  # missed: planned again
    assert chaos._more_rounds()
    chaos.report.kills = 4
    assert not chaos._more_rounds()  # up to max_kills only


async def test_an_aimed_kill_waits_through_a_count_of_sales_not_a_time() -> None:
    agent: Any = SimpleNamespace(lines=asyncio.Queue())
    for line in ("ready", "STEP 1.0 created started s1 m1", "STEP 1.1 read_card.request x s1 m1",
                 "STEP 2.0 created started s2 m1", "STEP 2.1 capture.request x s2 m1"):
        agent.lines.put_nowait(line)
    await Chaos._step_line(agent, Step.CAPTURE_REQUEST, sales=2)  # met in the second sale
    assert agent.lines.empty()
    for n in range(3):
        agent.lines.put_nowait(f"STEP {n}.0 created started s{n} m1")
    with pytest.raises(LookupError, match=r"capture\.request not in 2 sales"):
        await Chaos._step_line(agent, Step.CAPTURE_REQUEST, sales=2)
    for n in range(2):
        agent.lines.put_nowait(f"STEP {n}.0 created started s{n} m1")
        agent.lines.put_nowait(f"STEP {n}.1 read_card.request x s{n} m1")
    agent.lines.put_nowait("STEP 9.0 authorize.request x s1 m1")
    await Chaos._nth_step(agent, sales=2, steps=1)  # the 2nd sale's created, then 2 steps more
    assert agent.lines.empty()


# -- the judge itself, on made-up evidence ---------------------------------------------------------


def _sale(sale_id: str, state: SaleState, **fields: Any) -> SaleRecord:
    return SaleRecord(
        sale_id=sale_id, order_id=f"o-{sale_id}", source="mdb:m1", flow="authorize_capture",
        terminal="SIM-0001", amount_cents=150, state=state, **fields,
    )  # fmt: skip


def _steps(sale_id: str, *names: str, at: float = 100.0) -> list[StepRecord]:
    state = SaleState.STARTED
    return [StepRecord(sale_id, at + n, name, state, {}) for n, name in enumerate(names)]


def _row(order_id: str, status: TransStatus, cents: int = 150) -> Transaction:
    return Transaction.model_validate(
        {"trans_id": f"t-{order_id}-{status.value}", "order_id": order_id,
         "amount": cents_to_dollars(cents), "trans_status_id": status.value}
    )  # fmt: skip


def _vend(visit: int, at: float, cents: int = 150) -> list[dict[str, Any]]:
    base = {"machine": "m1", "visit": visit, "product": "A1", "price_cents": cents}
    return [
        {**base, "event": "approval", "at": at, "vended_cents": 0},
        {**base, "event": "dispensed", "at": at + 0.05, "vended_cents": cents},
    ]


def test_the_judge_names_each_broken_rule_and_counts_unpaid_vends() -> None:
    sales = [
        _sale("paid", SaleState.COMPLETED, captured_cents=150),
        _sale("unpaid", SaleState.REVERSED),
        _sale("untold", SaleState.REVERSED),
        _sale("hanging", SaleState.FAILED),
        _sale("twice", SaleState.REVERSED),
        _sale("kept", SaleState.COMPLETED, captured_cents=150),
    ]
    steps = {
        "paid": _steps("paid", Step.CREATED, Step.DISPENSE_REQUEST, Step.CAPTURE_REQUEST, at=100),
        "unpaid": _steps(  # told: a maybe late vend
            "unpaid", Step.CREATED, Step.DISPENSE_REQUEST, Step.RECOVERY_START,
            Step.REVERSE_REQUEST, Step.LATE_VEND, at=200
        ),
        # killed during recovery's give-back, finished untold (2026-11-30, seed 51)
        "untold": _steps(
            "untold", Step.CREATED, Step.DISPENSE_REQUEST, Step.RECOVERY_START,
            Step.REVERSE_REQUEST, Step.RECOVERY_START, Step.RECOVERY_DONE, at=250
        ),
        "hanging": _steps(
            "hanging", Step.CREATED, Step.AUTHORIZE_REQUEST, Step.RECOVERY_START, at=300
        ),
        "twice": _steps("twice", Step.CREATED, Step.REVERSE_REQUEST, at=400),
        "kept": _steps("kept", Step.CREATED, Step.CAPTURE_REQUEST, at=500),
    }
    rows = [
        _row("o-paid", TransStatus.CAPTURED),
        _row("o-unpaid", TransStatus.VOIDED),
        _row("o-untold", TransStatus.VOIDED),
        _row("o-hanging", TransStatus.AUTHORIZED),
        _row("o-twice", TransStatus.VOIDED),
        _row("o-twice", TransStatus.VOIDED),
        _row("o-kept", TransStatus.CAPTURED),
        _row("o-stranger", TransStatus.CAPTURED),
    ]
    records = _vend(1, 101.5) + _vend(2, 201.5) + _vend(3, 251.5)
    report = ChaosReport()

    judge(report, sales, steps, rows, records)

    kinds = sorted((v.kind, v.sale_id) for v in report.violations)
    assert kinds == [
        ("authorization_open", "hanging"),
        ("double_charge", "twice"),
        ("journal_ledger_disagree", "hanging"),
        ("kept_without_vend", "kept"),
        ("ledger_row_unknown", "o-stranger"),
        ("unpaid_vend_untold", "untold"),
    ]
    assert [u.split()[0] for u in report.unpaid_vends] == ["unpaid", "untold"]
    assert (report.sales, report.sales_recovered, report.vends) == (6, 3, 3)
    hanging = next(v for v in report.violations if v.kind == "authorization_open")
    assert "authorize.request[started]" in hanging.describe()


def test_the_judge_counts_maybes_told_their_false_alarms_and_those_the_machine_closed() -> None:
    """A sale told "may have dispensed" (a late.vend with unsure) is counted; one the machine
    vended nothing for is a false alarm (a person checks the stock for nothing), one its later
    failure closed (late.vend.seen by the machine) is counted closed; none is a violation."""

    def noted(sale_id: str, at: float, *more: StepRecord) -> list[StepRecord]:
        return [*_steps(sale_id, Step.CREATED, Step.DISPENSE_REQUEST, Step.DISPENSE_RESULT,
                        at=at),
                StepRecord(sale_id, at + 3, Step.LATE_VEND, SaleState.DISPENSING,
                           {"product": "A1", "unsure": "no vend result within 0.04 s"}),
                *more]

    sales = [_sale(n, SaleState.REVERSED) for n in ("went", "nothing", "closed")]
    steps = {
        "went": noted("went", 100),
        "nothing": noted("nothing", 200),
        "closed": noted("closed", 300, StepRecord(
            "closed", 304, Step.LATE_VEND_SEEN, SaleState.REVERSED,
            {"by": "the machine", "not_vended": "vend failed (3)"})),
    }
    rows = [_row(f"o-{n}", TransStatus.VOIDED) for n in ("went", "nothing", "closed")]
    report = ChaosReport()

    judge(report, sales, steps, rows, _vend(1, 101.5))

    assert report.violations == []
    assert [u.split()[0] for u in report.unpaid_vends] == ["went"]
    assert (report.maybes, len(report.maybe_not_vended), report.maybes_closed) == (3, 2, 1)
    summary = report.summary()
    assert (summary["told_maybe"], summary["maybe_false_alarms"], summary["maybe_closed"]) == (
        3, 2, 1)


def test_a_stepped_journal_time_is_set_back_to_real_time(tmp_path: Path) -> None:
    clock = SteppedClock(tmp_path / "faketime")
    clock.history = [(1000.0, 0.0), (1010.0, 3 * 86_400.0), (1020.0, -7200.0)]
    assert clock.real_time(1005.0) == 1005.0
    assert clock.real_time(1015.0 + 3 * 86_400.0) == 1015.0
    assert clock.real_time(1030.0 - 7200.0) == 1030.0
    assert (tmp_path / "faketime").read_text() == "+0\n"


def test_a_time_written_on_the_old_offset_just_after_a_step_is_placed_by_that_offset(
    tmp_path: Path,
) -> None:
    """The chaos run's agent reads its offset file once a wall second (``immediate=False``):
    in the second after a step it may still write times on the old offset."""
    clock = SteppedClock(tmp_path / "faketime", immediate=False)
    assert clock.env()["FAKETIME_CACHE_DURATION"] == "0"
    assert "FAKETIME_NO_CACHE" not in clock.env()
    assert SteppedClock(tmp_path / "immediate").env()["FAKETIME_NO_CACHE"] == "1"
    now = time.time()
    clock.history = [(now - 30.0, 0.0), (now - 20.0, 3 * 86_400.0), (now - 10.0, -7200.0)]
    assert clock.real_time(now - 19.5) == now - 19.5  # still true, just after the step ahead
    late = now - 9.5 + 3 * 86_400.0  # still three days ahead, just after the step back
    assert clock.real_time(late) == now - 9.5  # not two hours into the future
    assert clock.real_time(now - 5.0 - 7200.0) == now - 5.0


# -- card first (bench/chaos.py --card-first) ----------------------------------------------------


def test_a_card_first_run_sells_card_first_on_its_authorize_capture_machines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's configuration as the harness writes it, read by the agent's own loader: the
    even machines (authorize_capture) card first with funds above every price, the odd ones as
    before."""
    chaos = Chaos(ChaosOptions(workdir=tmp_path, machines=2, card_first=True))
    chaos.ready = {"base_url": "http://127.0.0.1:9/", "reporting_url": "http://127.0.0.1:9/r",
                   "ws_url": "ws://127.0.0.1:9/ws", "mid": "M-1", "client_id": "c-1"}
    for name in ("KIOSK_API_KEY", "KIOSK_CLIENT_SECRET", "KIOSK_ADMIN_TOKEN"):
        monkeypatch.setenv(name, "x" * 24)
    chaos._write_config(["socket://127.0.0.1:7001", "socket://127.0.0.1:7002"])

    first, second = load_config(tmp_path / "config.yaml").triggers
    assert (first["flow"], first.get("mode", "selection_first")) == (
        "charge_card", "selection_first")
    assert (second["flow"], second["mode"]) == ("authorize_capture", "card_first")
    prices = [dollars_to_cents(p.split("=")[1]) for p in PRODUCTS]
    assert second["max_funds"] == dollars_to_cents(CARD_FIRST_FUNDS) > max(prices)
    assert [chaos._card_first(n) for n in (1, 2, 3, 4)] == [False, True, False, True]


def test_the_judge_holds_a_card_first_sale_to_the_chosen_price_never_the_funds() -> None:
    """Card first the card holds the funds ($5.00) and the customer chooses a $3.25 product: the
    sale that captured $3.25 is right, the one that captured the funds is not."""
    sales = [
        _sale("chosen", SaleState.COMPLETED, authorized_cents=500, captured_cents=325),
        _sale("funds", SaleState.COMPLETED, authorized_cents=500, captured_cents=500),
    ]
    steps = {
        "chosen": _steps("chosen", Step.CREATED, Step.DISPENSE_REQUEST, at=100),
        "funds": _steps("funds", Step.CREATED, Step.DISPENSE_REQUEST, at=200),
    }
    rows = [_row("o-chosen", TransStatus.CAPTURED, 325), _row("o-funds", TransStatus.CAPTURED, 500)]
    records = _vend(1, 101.5, cents=325) + _vend(2, 201.5, cents=325)
    report = ChaosReport()

    judge(report, sales, steps, rows, records)

    assert [(v.kind, v.sale_id) for v in report.violations] == [("kept_wrong_amount", "funds")]
    assert "500c kept for a 325c vend" in report.violations[0].text


def test_the_judge_counts_a_maybe_told_where_the_machine_vended_nothing() -> None:
    """A false alarm ("may have dispensed", the machine vended nothing: a kill after the
    ``dispense.request`` commit, before C,VEND left) is counted and listed, never a violation;
    a maybe whose vend the machine made is an unpaid vend told, not a false alarm."""
    sales = [_sale("vended", SaleState.REVERSED), _sale("never", SaleState.REVERSED)]
    maybe = {"unsure": "the agent stopped mid-vend; no vend result heard after the restart"}
    steps = {
        sale_id: [*_steps(sale_id, Step.CREATED, Step.DISPENSE_REQUEST, Step.RECOVERY_START,
                          Step.REVERSE_REQUEST, at=at),
                  StepRecord(sale_id, at + 4, Step.LATE_VEND, SaleState.REVERSING, maybe)]
        for sale_id, at in (("vended", 100.0), ("never", 200.0))
    }
    rows = [_row("o-vended", TransStatus.VOIDED), _row("o-never", TransStatus.VOIDED)]
    report = ChaosReport()

    judge(report, sales, steps, rows, _vend(1, 101.5))

    assert report.violations == []
    assert [u.split()[0] for u in report.unpaid_vends] == ["vended"]
    assert [m.split()[0] for m in report.maybe_not_vended] == ["never"]
    assert report.summary()["maybe_false_alarms"] == 1
