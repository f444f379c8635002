"""The transition table, as the journal holds every write to it: each allowed move is taken,
every other is refused by name and leaves nothing on disk, and no sequence of writes, from one
writer or two, ever leaves a final state."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiosk_agent.sales.journal import Journal, SaleMoved, SaleRecord
from kiosk_agent.sales.states import (
    ANY_STEP,
    FLOW_STATES,
    NO_CHARGE_STEPS,
    TRANSITIONS,
    Flow,
    SaleState,
    Step,
    TransitionRefused,
    allowed_moves,
    check_transition,
)
from tests.helpers import shortest_path, walk_to

S = SaleState
# nothing leaves these, and a completed sale only gains receipt notes
FOR_GOOD = frozenset({S.COMPLETED, S.DECLINED, S.CANCELLED, S.REVERSED})
# notes any sale takes (sales/late_vends.py): they change none of its fields
LATE_VEND_NOTES = frozenset({Step.LATE_VEND, Step.LATE_VEND_SEEN})
# the steps that may decide an ATTENTION sale: the sweeper's and a person's
SWEEPER_OR_PERSON = frozenset(
    {Step.ATTENTION_RECHECK, Step.ATTENTION_FOUND, Step.ATTENTION_DONE, Step.ATTENTION_RESOLVED,
     Step.REVERSE_REQUEST, Step.REVERSE_UNKNOWN, Step.CAPTURE_REQUEST}
)


@pytest.fixture(scope="module")
def journal() -> Iterator[Journal]:
    """One journal for the module (opening one costs more than a test): each test its own
    sale."""
    with tempfile.TemporaryDirectory() as directory:
        opened = Journal(Path(directory) / "journal.db")
        opened.open()
        opened.db.execute("PRAGMA synchronous=OFF")  # the table is under test here, not fsync
        yield opened
        opened.close()


_count = itertools.count()


def new_sale(journal: Journal, flow: Flow) -> SaleRecord:
    n = next(_count)
    return journal.create(
        SaleRecord(
            sale_id=f"sale{n}", order_id=f"KA{n:08d}", source="test", flow=flow.value,
            terminal="SIM-0001", amount_cents=250, state=S.STARTED,
        )
    )


def reachable(flow: Flow, state: SaleState) -> bool:
    return state is S.STARTED or bool(shortest_path(flow.value, S.STARTED, state))


def sale_in(journal: Journal, flow: Flow, state: SaleState) -> SaleRecord:
    """A sale of ``flow`` that reached ``state`` the table's way; a FAILED one ended on "no
    charge" after a lost answer (the only kind the late-charge net may reopen)."""
    record = new_sale(journal, flow)
    if state is S.STARTED:
        return record
    last = Step.RECOVERY_NONE if state is S.FAILED else None
    return walk_to(journal, record, state, last)


# every listed edge, in every flow that may take it, with each step it allows (any: one)
EDGES = [
    pytest.param(flow, source, target, step, id=f"{flow}:{source}->{target}:{step}")
    for source, target, steps in allowed_moves()
    for flow in Flow
    if {source, target} <= FLOW_STATES[flow] and reachable(flow, source)
    for step in (sorted(steps) if steps is not ANY_STEP else [Step.RECOVERY_UNDECIDED])
]


@pytest.mark.parametrize(("flow", "source", "target", "step"), EDGES)
def test_every_allowed_move_is_written(
    journal: Journal, flow: Flow, source: SaleState, target: SaleState, step: Step
) -> None:
    record = sale_in(journal, flow, source)
    moved = journal.record(record, step, target)
    assert journal.get(record.sale_id) == moved
    assert (journal.steps(record.sale_id)[-1].step, moved.state) == (step, target)


def test_every_running_state_takes_notes(journal: Journal) -> None:
    for flow in Flow:
        for state in FLOW_STATES[flow] - {s for s in S if s.final}:
            record = sale_in(journal, flow, state)
            noted = journal.record(record, Step.CANCEL_REQUESTED)
            assert noted.state is state


def refused_moves() -> Iterator[tuple[Flow, SaleState, SaleState, Step]]:
    """For each state a flow reaches, each state it may not move to (one step), and each step
    an edge limited to some steps refuses."""
    for flow in Flow:
        for source in sorted(FLOW_STATES[flow]):
            if not reachable(flow, source):
                continue
            edges = TRANSITIONS[source]
            for target in sorted(FLOW_STATES[flow]):
                note = target is source and not source.final
                if target not in edges and not note:
                    yield flow, source, target, Step.RECOVERY_DONE
                elif edges.get(target, ANY_STEP) is not ANY_STEP:
                    others = set(Step) - set(edges[target] or ())
                    yield flow, source, target, min(others)


@pytest.mark.parametrize(("flow", "source", "target", "step"), list(refused_moves()))
def test_every_other_move_is_refused_by_name_and_writes_nothing(
    journal: Journal, flow: Flow, source: SaleState, target: SaleState, step: Step
) -> None:
    record = sale_in(journal, flow, source)
    steps = journal.steps(record.sale_id)
    with pytest.raises(TransitionRefused) as refused:
        journal.record(record, step, target, message="should not be kept")
    assert refused.value.sale_id == record.sale_id
    assert (refused.value.current, refused.value.wanted) == (source, target)
    assert f"sale {record.sale_id}: {source.value} -> {target.value}" in str(refused.value)
    assert journal.get(record.sale_id) == record
    assert journal.steps(record.sale_id) == steps


def test_a_state_outside_the_flow_is_refused(journal: Journal) -> None:
    record = new_sale(journal, Flow.CHARGE_CARD)
    with pytest.raises(TransitionRefused, match="a charge_card sale is never reading_card"):
        journal.record(record, Step.READ_CARD_REQUEST, S.READING_CARD)


def test_a_sale_is_created_started_only(journal: Journal) -> None:
    done = SaleRecord(
        sale_id="born-done", order_id="KABORN", source="test", flow="charge_card",
        terminal="SIM-0001", amount_cents=250, state=S.COMPLETED,
    )
    with pytest.raises(TransitionRefused, match=r"\(new\) -> completed"):
        journal.create(done)
    assert journal.get("born-done") is None


def test_a_name_that_is_no_step_is_refused(journal: Journal) -> None:
    record = new_sale(journal, Flow.CHARGE_CARD)
    with pytest.raises(TransitionRefused, match="'oops' refused: not a journal step"):
        journal.record(record, "oops")  # type: ignore[arg-type]


def test_the_flow_is_read_by_its_name_and_an_unknown_one_is_refused() -> None:
    for flow in Flow:  # the journal stores the name; a Flow is that name too
        assert check_transition("s", flow.value, None, S.STARTED, "created") is Step.CREATED
        assert check_transition("s", flow, None, S.STARTED, Step.CREATED) is Step.CREATED
    for unknown in ("barter", "", None, 3):
        with pytest.raises(TransitionRefused, match="unknown flow"):
            check_transition("s", unknown, None, S.STARTED, Step.CREATED)  # type: ignore[arg-type]


def test_the_late_charge_net_reopens_only_a_sale_that_ended_on_no_charge(
    journal: Journal,
) -> None:
    for ended_by in sorted(NO_CHARGE_STEPS):
        record = walk_to(journal, new_sale(journal, Flow.AUTHORIZE_CAPTURE), S.FAILED, ended_by)
        assert journal.record(record, Step.LATE_FOUND, S.REVERSING, trans_id="T").state is (
            S.REVERSING
        )
    faulted = walk_to(journal, new_sale(journal, Flow.CHARGE_CARD), S.FAILED,
                      Step.CHARGE_CARD_FAULT)
    with pytest.raises(TransitionRefused, match="reopens only a sale that ended on no charge"):
        journal.record(faulted, Step.LATE_FOUND, S.REVERSING, trans_id="T")


def test_a_stale_writer_is_told_the_sale_moved(journal: Journal) -> None:
    """Two writers hold the same sale: the second to write learns it moved; nothing of its
    write is kept."""
    record = walk_to(journal, new_sale(journal, Flow.CHARGE_CARD), S.DISPENSING)
    journal.record(record, Step.COMPLETED, S.COMPLETED)
    with pytest.raises(SaleMoved, match="is completed now"):
        journal.record(record, Step.REVERSE_REQUEST, S.REVERSING)
    assert journal.get(record.sale_id).state is S.COMPLETED  # type: ignore[union-attr]


def test_a_second_process_cannot_rewrite_a_completed_sale(journal: Journal) -> None:
    """The issue's two agents on one journal: the second, in its own process, tries to void a
    sale the first had just completed; the journal refuses it in the second's transaction."""
    record = walk_to(journal, new_sale(journal, Flow.CHARGE_CARD), S.DISPENSING)
    script = (
        "import sys\n"
        "from kiosk_agent.sales.journal import Journal, SaleMoved\n"
        "from kiosk_agent.sales.states import SaleState, Step, TransitionRefused\n"
        "j = Journal(sys.argv[1]); j.open()\n"
        "seen = j.get(sys.argv[2])\n"  # DISPENSING, as recovery would read it
        "sys.stdout.write('read\\n'); sys.stdout.flush(); sys.stdin.readline()\n"
        "try:\n"
        "    j.record(seen, Step.REVERSE_REQUEST, SaleState.REVERSING)\n"
        "except (TransitionRefused, SaleMoved) as err:\n"
        "    print(type(err).__name__, err)\n"
    )
    second = subprocess.Popen(
        [sys.executable, "-c", script, str(journal.path), record.sale_id],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert second.stdout is not None
    assert second.stdout.readline() == "read\n"
    journal.record(record, Step.COMPLETED, S.COMPLETED)  # the first confirms the vend
    out, _ = second.communicate("go\n", timeout=30)
    assert out.startswith("SaleMoved sale "), out
    assert "is completed now" in out
    assert journal.get(record.sale_id).state is S.COMPLETED  # type: ignore[union-attr]
    assert journal.steps(record.sale_id)[-1].step == Step.COMPLETED


def test_a_receipt_note_cannot_rewrite_a_completed_sale(journal: Journal) -> None:
    """The one step a completed sale takes is a note: it may not change what was charged."""
    record = walk_to(journal, new_sale(journal, Flow.CHARGE_CARD), S.DISPENSING, trans_id="T1")
    done = journal.record(record, Step.COMPLETED, S.COMPLETED, captured_cents=250)
    for fields in ({"captured_cents": 0}, {"trans_id": None}, {"finished_at": 0.0}):
        with pytest.raises(TransitionRefused, match="completed is final: a note changes none"):
            journal.record(done, Step.RECEIPT, **fields)  # type: ignore[arg-type]
        assert journal.get(record.sale_id) == done
    noted = journal.record(done, Step.RECEIPT, detail={"note": "printed"})
    assert (noted.captured_cents, noted.trans_id) == (250, "T1")
    assert noted.finished_at == done.finished_at


# -- random writes ---------------------------------------------------------------------------

WRITES = st.lists(
    st.tuples(
        st.integers(0, 1),  # which of two writers (each holds its own copy of the sale)
        st.sampled_from(list(Step)),
        st.sampled_from(list(SaleState)) | st.none(),  # None: a note, the state kept
        # fields the write sets too: a note on a settled sale may set none
        st.sampled_from([{}, {"captured_cents": 0}, {"trans_id": "T-other", "message": "x"}]),
    ),
    min_size=1,
    max_size=14,
)


# half the sales start at an end: the writes that matter most are the ones made after it
ENDS = sorted(s for s in SaleState if s.final)


@settings(max_examples=120, deadline=None)
@given(
    flow=st.sampled_from(list(Flow)),
    start=st.sampled_from(ENDS) | st.sampled_from(list(SaleState)),
    writes=WRITES,
)
def test_no_sequence_of_writes_leaves_a_final_state(
    journal: Journal,
    flow: Flow,
    start: SaleState,
    writes: list[tuple[int, Step, SaleState | None, dict[str, object]]],
) -> None:
    """Random steps to random states, by two writers with their own (maybe stale) copies:
    every write kept is one the table allows from the state on disk; a refused one leaves the
    sale and its steps as they were; once final for good, a sale stays so."""
    if start not in FLOW_STATES[flow] or not reachable(flow, start):
        start = S.STARTED
    record = sale_in(journal, flow, start)
    copies = [record, record]
    for writer, step, state, fields in writes:
        before = journal.get(record.sale_id)
        assert before is not None
        kept_steps = journal.steps(record.sale_id)
        wanted = state or copies[writer].state
        try:
            copies[writer] = journal.record(copies[writer], step, state, **fields)
        except (TransitionRefused, SaleMoved):
            assert journal.get(record.sale_id) == before
            assert journal.steps(record.sale_id) == kept_steps
            continue
        # kept: the writer's copy was the state on disk, and the table allows the move
        assert copies[writer].state is wanted
        check_transition(record.sale_id, flow, before.state, wanted, step, kept_steps[-1].step)
        if before.state in FOR_GOOD:  # only a note: a receipt, a late vend and its ack
            assert wanted is before.state
            assert step in LATE_VEND_NOTES or (before.state, step) == (S.COMPLETED, Step.RECEIPT)
            after = journal.get(record.sale_id)
            assert after is not None
            assert after == dataclasses.replace(before, updated_at=after.updated_at)
        if before.state is S.ATTENTION and wanted is not S.ATTENTION:
            assert step in SWEEPER_OR_PERSON
        if before.state is S.FAILED and step not in LATE_VEND_NOTES:
            assert (wanted, step) == (S.REVERSING, Step.LATE_FOUND)
            assert kept_steps[-1].step in NO_CHARGE_STEPS


# -- the drawing in docs/journal.md ----------------------------------------------------------

JOURNAL_DOC = Path(__file__).parents[2] / "docs" / "journal.md"
Edge = tuple[str, str, frozenset[str] | None]


def drawn() -> tuple[set[Edge], str]:
    """The edges of the doc's mermaid state diagram, and the text after it."""
    text = JOURNAL_DOC.read_text()
    start = text.index("```mermaid\nstateDiagram-v2\n")
    end = text.index("```", start + 3)
    edges: set[Edge] = set()
    for line in text[start:end].splitlines()[2:]:
        arrow, _, label = line.strip().partition(" : ")
        source, target = arrow.split(" --> ")
        steps = frozenset(label.split(", ")) if label else None
        edges.add((source, target, steps))
    return edges, text[end:]


def tabled() -> set[Edge]:
    edges: set[Edge] = {("[*]", S.STARTED.value, None)}
    edges |= {(s.value, "[*]", None) for s in S if s.final}
    for source, target, steps in allowed_moves():
        named = None if steps is ANY_STEP else frozenset(str(step) for step in steps)
        edges.add((source.value, target.value, named))
    return edges


def test_the_docs_state_diagram_is_the_table() -> None:
    edges, _ = drawn()
    assert edges - tabled() == set(), "drawn in docs/journal.md but not in the table"
    assert tabled() - edges == set(), "in the table but not drawn in docs/journal.md"


def test_the_docs_list_each_flows_states() -> None:
    _, after = drawn()
    rows = {
        cells[0].strip("` "): {c.strip("` ") for c in cells[1].split(",")}
        for line in after.split("\n## ")[0].splitlines()
        if line.startswith("| `")
        for cells in [line.strip("|").split("|")]
    }
    assert rows == {
        flow.value: {s.value for s in FLOW_STATES[flow] if not s.final} for flow in Flow
    }
