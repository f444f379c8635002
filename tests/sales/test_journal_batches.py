"""A batch's steps of sales on disk are held and written at its end (one UPDATE and one INSERT a
sale): what the disk holds after the commit is what one statement a step wrote. A state machine
drives two journals side by side, the agent's and a reference that writes each step at once as
the journal did before (its UPDATE checked by ``AND state``, its INSERT, one a step), with the
same random batches (sales created, steps of sales on disk, of several interleaved, reads
inside, the late-charge net's reopening step, steps that set the row kept beside the sale,
steps the table refuses, an exception inside), a person's writes from another connection
between them, and a disk that fails at the UPDATE, the INSERT or the COMMIT; after each, the
rows of sales, steps and sale_sends and what the reads (the CLI's among them) return are the
same in both, and so is what the flows' memory holds."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from kiosk_agent.sales.journal import Journal, JournalError, SaleMoved, SaleRecord
from kiosk_agent.sales.states import SaleState, Step, TransitionRefused, check_transition

S = SaleState


class Ticks:
    """The journals' clock: moved by the machine only, so both runs date alike."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now - 1_799_000_000.0

    def since_boot(self) -> float | None:
        return None

    def boot_id(self) -> str | None:
        return None


class OneStatementAStep(Journal):
    """The reference: a step inside a batch written at once, as before the batch held them:
    the journal's own write of a step outside a batch (``Journal._write_step``: checked in
    memory, the UPDATE's own ``AND state =``, the row beside, the step's INSERT), in the
    batch's transaction."""

    _update_in_batch = Journal._write_step


class FailsAt:
    """A journal's connection whose first statement beginning with ``prefix`` fails as a full
    disk's does (tests/sales/test_steps.py's CommitFails, at any statement)."""

    def __init__(self, real: sqlite3.Connection, prefix: str) -> None:
        self.real, self.prefix, self.failed = real, prefix, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def execute(self, sql: str, *args: Any) -> Any:
        if not self.failed and sql.startswith(self.prefix):
            self.failed = True
            raise sqlite3.OperationalError("database or disk is full")
        return self.real.execute(sql, *args)


# steps of a charge_card sale: (step, state, fields, detail); the table refuses many of them
# from many states, which the machine wants too
MENU: list[tuple[Step, SaleState | None, dict[str, Any], dict[str, Any] | None]] = [
    (Step.CHARGE_CARD_REQUEST, S.CHARGING,
     {"sent_at": 1.0, "sent_mono": 2.0, "sent_boot": "b", "message": "asking"}, {"n": 1}),
    (Step.CHARGE_CARD_ACCEPTED, None, {"interaction_id": "I1"}, None),
    (Step.DISPENSE_REQUEST, S.DISPENSING,
     {"trans_id": "T1", "authorized_cents": 250, "captured_cents": 250, "message": "vend"},
     None),
    (Step.COMPLETED, S.COMPLETED, {"vended_cents": 250}, None),
    (Step.CHARGE_CARD_NONE, S.FAILED, {"message": "no charge"}, None),
    (Step.LATE_FOUND, S.REVERSING, {"trans_id": "T2", "sent_at": 7.0}, {"found": 1}),
    (Step.RECOVERY_UNDECIDED, S.ATTENTION, {}, {"why": "x"}),
    (Step.ATTENTION_RESOLVED, S.COMPLETED, {"captured_cents": 250}, None),
    (Step.LATE_VEND, None, {}, {"note": "late"}),
    (Step.RECEIPT, None, {}, {"note": "r"}),
]



def _allowed(sale: SaleRecord, m: int, *, moves: bool = False) -> tuple[
        Step, SaleState | None, dict[str, Any], dict[str, Any] | None]:
    """The first entry of MENU from ``m`` on that the table allows from the sale's state (the
    late-charge net's only after a no-charge end, unknown here: tried as any other); ``moves``:
    only one to another state."""
    for entry in MENU[m:] + MENU[:m]:
        step, state, fields, _ = entry
        if moves and state in (None, sale.state):
            continue
        try:
            check_transition(sale.sale_id, sale.flow, sale.state, state or sale.state, step,
                             Step.CHARGE_CARD_NONE, frozenset(fields))
        except TransitionRefused:
            continue
        return entry
    return MENU[m]


Op = tuple[Any, ...]
# (sale, menu entry, whether a refusal is caught inside, whether the flow takes the first entry
# from there that the table allows from the state its memory holds, whether it writes from the
# record it held at the batch's start, from the state it holds: if_state)
STEPS = st.tuples(st.just("step"), st.integers(0, 7), st.integers(0, len(MENU) - 1),
                  st.booleans(), st.booleans(), st.booleans())
OPS = st.one_of(
    st.tuples(st.just("create")),
    STEPS, STEPS, STEPS,  # most of a batch: steps
    st.tuples(st.just("read"), st.integers(0, 7), st.sampled_from(["get", "find", "steps"])),
)
WHERE = ["UPDATE sales", "INSERT INTO steps", "INSERT INTO sale_sends", "COMMIT"]


class Boom(Exception):
    """A caller's own error inside a batch."""


class BatchesAsSteps(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(_TMP.pop())
        self.clock = Ticks()
        self.agent = Journal(self.dir / "agent.db", clock=cast(Any, self.clock))
        self.reference = OneStatementAStep(self.dir / "reference.db", clock=cast(Any, self.clock))
        self.people = [Journal(self.dir / "agent.db", clock=cast(Any, self.clock)),
                       Journal(self.dir / "reference.db", clock=cast(Any, self.clock))]
        for journal in (self.agent, self.reference, *self.people):
            journal.open()
        # what the flows hold in memory of each sale, one map a journal
        self.memory: list[dict[str, SaleRecord]] = [{}, {}]
        self.sales: list[str] = []

    def teardown(self) -> None:
        for journal in (self.agent, self.reference, *self.people):
            journal.close()

    def _run(self, journal: Journal, memory: dict[str, SaleRecord], ops: list[Op],
             start: float) -> tuple[str | None, list[Any], dict[str, SaleRecord]]:
        """``ops`` in one batch of ``journal``: how it ended, what each op gave, the memory."""
        self.clock.now = start
        seen: list[Any] = []
        held = dict(memory)
        made = len(self.sales)
        try:
            with journal.batch():
                for n, op in enumerate(ops):
                    self.clock.now = start + n
                    seen.append(self._op(journal, held, memory, op, n, made))
                    if op[0] == "create":
                        made += 1
        except (SaleMoved, TransitionRefused, JournalError, Boom) as err:
            return type(err).__name__, seen, memory  # rolled back whole: as before it
        return None, seen, held

    def _op(self, journal: Journal, held: dict[str, SaleRecord], start: dict[str, SaleRecord],
            op: Op, n: int, made: int) -> Any:
        if op[0] == "create":
            sale_id = f"s{made}"
            held[sale_id] = journal.create(SaleRecord(
                sale_id=sale_id, order_id=f"KA{made:06d}", source="virtual:front",
                flow="charge_card", terminal="SIM-0001", amount_cents=250,
                state=SaleState.STARTED), {"at": n})
            return held[sale_id]
        if op[0] == "raise":
            raise Boom("inside")
        known = sorted(held)
        if not known:
            return None
        sale_id = known[op[1] % len(known)]
        if op[0] == "read":
            if op[2] == "get":
                return journal.get(sale_id)
            if op[2] == "find":
                return journal.find(held[sale_id].order_id)
            return journal.steps(sale_id)
        step, state, fields, detail = _allowed(held[sale_id], op[2]) if op[4] else MENU[op[2]]
        fields = {k: v + n if isinstance(v, float) else v for k, v in fields.items()}
        base, if_state = held[sale_id], None
        if op[5] and sale_id in start:  # a record from before the batch's steps of the sale
            base, if_state = start[sale_id], held[sale_id].state
        try:
            held[sale_id] = journal.record(base, step, state, detail, if_state=if_state,
                                           **fields)
        except TransitionRefused as refused:
            if not op[3]:
                raise
            return str(refused)  # caught inside the batch: it goes on
        return held[sale_id]

    def _both(self, ops: list[Op]) -> None:
        start = self.clock.now + 1
        ref = self._run(self.reference, self.memory[1], ops, start)
        agent = self._run(self.agent, self.memory[0], ops, start)
        self.clock.now = start + len(ops)
        if ref[0] is None:
            assert agent[0] is None, (agent, ref)
            assert agent[1] == ref[1]
        elif ref[0] in ("SaleMoved", "JournalError"):
            # written at the end, a sale moved before the batch (or a disk failing at its
            # UPDATE or INSERT) is found there: what ran after the step may raise first (a
            # refused step, a caller's error); either way the batch is rolled back whole
            assert agent[0] is not None, (agent, ref)
        else:
            assert agent[0] == ref[0], (agent, ref)
            assert agent[1] == ref[1]
        self.memory = [agent[2], ref[2]]
        if ref[0] in ("SaleMoved", "JournalError"):
            # the flows read their sales back as the journal holds them (the runner does, for
            # SaleMoved; what SaleSteps keeps itself is tests/sales/test_steps.py's)
            for journal, memory in zip((self.agent, self.reference), self.memory, strict=True):
                for sale_id in memory:
                    found = journal.get(sale_id)
                    assert found is not None
                    memory[sale_id] = found
        if ref[0] is None:
            self.sales = sorted(self.memory[1])

    @rule(ops=st.lists(OPS, min_size=1, max_size=7))
    def a_batch(self, ops: list[Op]) -> None:
        self._both(ops)

    @rule(ops=st.lists(OPS, min_size=1, max_size=7), at=st.integers(0, 7))
    def a_batch_that_raises(self, ops: list[Op], at: int) -> None:
        """The caller's own error inside, after some of its writes: all rolled back."""
        self._both([*ops[:at], ("raise",)])

    @rule(ops=st.lists(OPS, min_size=1, max_size=5), where=st.sampled_from(WHERE))
    def a_batch_on_a_failing_disk(self, ops: list[Op], where: str) -> None:
        """Both disks fail at their first such statement: where the reference fails at a step,
        the agent fails at the batch's end; nothing of either batch is on disk."""
        real = [self.agent._db, self.reference._db]
        self.agent._db = cast(Any, FailsAt(cast(sqlite3.Connection, real[0]), where))
        self.reference._db = cast(Any, FailsAt(cast(sqlite3.Connection, real[1]), where))
        try:
            self._both(ops)
        finally:
            self.agent._db, self.reference._db = real

    @rule(k=st.integers(0, 7), m=st.integers(0, len(MENU) - 1))
    def a_person_moves_a_sale(self, k: int, m: int) -> None:
        """Another process on the same file (a person's `kiosk-agent resolve`) writes a step
        from what the disk holds; the flows' memory does not hear it."""
        if not self.sales:
            return
        sale_id = self.sales[k % len(self.sales)]
        self.clock.now += 1
        outcomes = []
        for person in self.people:
            found = person.get(sale_id)
            assert found is not None
            step, state, fields, detail = _allowed(found, m, moves=True)
            try:
                outcomes.append(person.record(found, step, state, detail, **fields))
            except TransitionRefused as refused:
                outcomes.append(str(refused))
        assert outcomes[0] == outcomes[1]

    @invariant()
    def the_disks_and_the_memories_are_alike(self) -> None:
        assert self.memory[0] == self.memory[1]
        rows = []
        for journal in (self.agent, self.reference):
            db = journal.db
            assert not db.in_transaction
            rows.append([
                db.execute("SELECT * FROM sales ORDER BY sale_id").fetchall(),
                db.execute("SELECT * FROM steps ORDER BY id").fetchall(),
                db.execute("SELECT * FROM sale_sends ORDER BY sale_id").fetchall(),
                journal.query(),
                [journal.steps(sale_id) for sale_id in self.sales],
            ])
        assert rows[0] == rows[1]
        for sale_id in self.sales:  # the CLI's `sales show`: by order id or by id
            got = self.agent.get(sale_id)
            assert got is not None
            assert self.agent.find(got.order_id) == self.reference.find(got.order_id)
            assert self.agent.find(sale_id) == self.reference.find(sale_id)


_TMP: list[str] = []


def test_a_batchs_writes_at_its_end_are_what_one_statement_a_step_wrote(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    class Machine(BatchesAsSteps):
        def __init__(self) -> None:
            _TMP.append(str(tmp_path_factory.mktemp("batches")))
            super().__init__()

    run_state_machine_as_test(Machine, settings=settings(stateful_step_count=12))


def test_a_later_step_that_sets_nothing_beside_leaves_what_an_earlier_one_set(
    tmp_path: Path,
) -> None:
    """A step sets the money call's send (``sale_sends``, its deadline's anchor after a
    restart); a later step of the same batch, written from a record taken before it (its
    ``if_state`` the state the batch left), sets nothing kept beside the sale. One statement a
    step writes the send once and keeps it: so must the batch, not the later record's none."""
    rows = []
    for journal in (Journal(tmp_path / "agent.db", clock=cast(Any, Ticks())),
                    OneStatementAStep(tmp_path / "reference.db", clock=cast(Any, Ticks()))):
        journal.open()
        try:
            sale = journal.create(SaleRecord(
                sale_id="s0", order_id="KA000000", source="virtual:front", flow="charge_card",
                terminal="SIM-0001", amount_cents=250, state=SaleState.STARTED))
            with journal.batch():
                journal.record(sale, Step.CHARGE_CARD_REQUEST, S.CHARGING, sent_at=1.0,
                               sent_mono=2.0, sent_boot="b")
                journal.record(sale, Step.DISPENSE_REQUEST, S.DISPENSING, trans_id="T1",
                               if_state=S.CHARGING)
            held = journal.get("s0")
            assert held is not None
            assert (held.state, held.trans_id, held.sent_at, held.sent_boot) == (
                S.DISPENSING, "T1", 1.0, "b")
            rows.append(journal.db.execute("SELECT * FROM sale_sends").fetchall())
        finally:
            journal.close()
    assert rows[0] == rows[1]
