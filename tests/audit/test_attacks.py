"""The reader and the comparison attacked from outside, with generated input.

Whole files built from a model of what the machine meant (blocks in any order, ID4 or none,
0 to 3 decimal places, counts up to 15 digits, CR LF or LF, a collector's bytes around it,
names beyond ASCII, empty fields), each read back to exactly that, or, where one fault was put
in (a block stated twice, a count of 16 digits, a tenth of a cent, a character beyond one byte,
a lost line), refused with an AuditError naming it. And a machine's life between reads (honest
sales, a vend the agent never heard, a sale the machine never vended, a tech's reset, a
re-initialisation, a counter that wraps, another machine, a read during a sale), each read
going through the writer, the reader, the store and the comparison: the verdict is the truth,
"not compared" with its cause or the machine's books reset (a counter went back), never a match
that is not one, and no sale is touched.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiosk_agent.audit.books import figures_of
from kiosk_agent.audit.evadts import (
    AuditError,
    Counters,
    Tally,
    parse_audit,
    render_audit,
)
from kiosk_agent.audit.ledger import record_read
from kiosk_agent.audit.store import AuditStore
from kiosk_agent.sales.journal import Journal
from tests.audit.helpers import MACHINE, unvended_sale, vended_sale

# --- whole files ---------------------------------------------------------------------------------

_units = st.integers(0, 10**15 - 1)  # up to 15 digits, as EVA-DTS allows
_count = st.integers(0, 10**15 - 1)
_column_id = st.text(st.sampled_from("ABC0123456789"), min_size=1, max_size=3)
# latin-1 beyond ASCII (a machine's own code page), trailing spaces kept in the check
_name = st.text(st.sampled_from("Tea Cola é ñ ß\xa0"), max_size=12)


@dataclass
class Meant:
    """What the machine meant: the figures the reader must give back, in cents."""

    places: int | None  # None: no ID4 (two places)
    serial: str
    va1: tuple[int, int, tuple[int, int] | None]  # value units, count, since reset
    da2: tuple[int, int] | None  # value units, count; None: its since-init fields left empty
    columns: list[tuple[str, int, str, tuple[int, int], tuple[int, int] | None]] = field(
        default_factory=list
    )  # id, price units, name, PA2 (count, value units), PA7 DA (count, value units) or empty

    @property
    def scale(self) -> int:
        places = 2 if self.places is None else self.places
        return 10 ** (2 - places) if places <= 2 else 1

    def cents(self, units: int) -> int:
        places = 2 if self.places is None else self.places
        return units * self.scale if places <= 2 else units // 10 ** (places - 2)

    def blocks(self) -> list[list[tuple[str, ...]]]:
        """The file's blocks in groups a machine may send in any order (a column's PA2 and PA7
        follow its PA1)."""
        value, count, reset = self.va1
        va1 = ("VA1", str(value), str(count), *((str(reset[0]), str(reset[1])) if reset else ()))
        da2 = ("DA2", "", "", "0", "0") if self.da2 is None else ("DA2", *map(str, self.da2))
        groups = [[("ID1", self.serial, "MODEL")], [va1], [da2]]
        if self.places is not None:
            groups.append([("ID4", str(self.places), "978", "EUR")])
        for column, price, name, paid, card in self.columns:
            pa7 = ("PA7", column, "DA", "0", str(price), *(
                ("", "") if card is None else (str(card[0]), str(card[1]))
            ))
            groups.append([("PA1", column, str(price), name), ("PA2", *map(str, paid)), pa7])
        return groups


def _units_for(places: int | None) -> st.SearchStrategy[int]:
    if places is not None and places > 2:  # a part of a cent is refused: whole cents only here
        step = 10 ** (places - 2)
        return st.integers(0, 10**15 // step - 1).map(lambda u: u * step)
    return _units


@st.composite
def _meant(draw: st.DrawFn) -> Meant:
    places = draw(st.sampled_from([None, 0, 1, 2, 3, 4, 6]))
    units = _units_for(places)
    columns = draw(st.lists(
        st.tuples(_column_id, units, _name, st.tuples(_count, units),
                  st.none() | st.tuples(_count, units)),
        max_size=4, unique_by=lambda c: c[0],
    ))
    return Meant(
        places=places,
        serial=draw(st.text(st.sampled_from("VM-0123é"), min_size=1, max_size=8)),
        va1=(draw(units), draw(_count), draw(st.none() | st.tuples(units, _count))),
        da2=draw(st.none() | st.tuples(units, _count)),
        columns=columns,
    )


_FAULTS = [
    "none", "repeat", "16 digits", "tenth of a cent", "beyond one byte", "lost line", "ID4 of 7"
]


@settings(max_examples=150, deadline=None)
@given(
    meant=_meant(),
    order=st.randoms(use_true_random=False),
    line_end=st.sampled_from([b"\r\n", b"\n"]),
    with_check=st.booleans(),
    before=st.binary(max_size=40).filter(lambda b: b"DXS*" not in b and b"ST*" not in b),
    after=st.binary(max_size=40).filter(lambda b: b"DXE*" not in b and b"DXS*" not in b),
    fault=st.sampled_from(_FAULTS),
    pick=st.integers(0, 10**6),
)
def test_a_whole_file_reads_back_to_what_the_machine_meant_or_names_its_fault(
    meant, order, line_end, with_check, before, after, fault, pick
):
    groups = meant.blocks()
    order.shuffle(groups)
    body = [block for group in groups for block in group]
    expected_tag = ""
    if fault == "repeat":  # any block stated once, stated again just after
        at = pick % len(body)
        body.insert(at + 1, body[at])
        expected_tag = body[at][0]
    elif fault == "ID4 of 7":  # at most 6 decimal places
        body = [b for b in body if b[0] != "ID4"] + [("ID4", "7")]
        expected_tag = "ID401"
    elif fault == "16 digits":
        body.append(("CA2", "1" * 16, "1"))
        expected_tag = "CA2"
    elif fault == "tenth of a cent" and meant.places is not None and meant.places > 2:
        body.append(("CA2", "1" + "0" * (meant.places - 1) + "5", "1"))  # 10.0...05
        expected_tag = "CA2"
    elif fault == "tenth of a cent":
        fault = "none"  # (only a file of 3 places or more can say a part of a cent)
    data = before + render_audit(body, line_end=line_end, with_check=with_check) + after
    if fault == "lost line":
        lines = data.split(b"\n")
        index = next(i for i, line in enumerate(lines) if line.startswith(b"ST*")) + 1
        index += pick % len(body)
        del lines[index]
        data = b"\n".join(lines)
    refused: AuditError | None = None
    try:
        audit = parse_audit(
            data.decode("latin-1") + "\N{EURO SIGN}" if fault == "beyond one byte" else data
        )
    except AuditError as err:
        refused = err
    if refused is None:
        assert fault == "none", fault  # every block the model writes is once a file or column
        _read_as_meant(audit, meant, before, after)
        return
    assert fault != "none", refused
    assert refused.field.startswith(expected_tag), refused
    if fault == "repeat":
        assert "a second" in refused.problem
    if fault == "lost line":
        assert refused.field in {"G8501", "SE01"}, refused
    if fault == "beyond one byte":
        assert refused.field == "text"


def _read_as_meant(audit, meant: Meant, before: bytes, after: bytes) -> None:
    cents = meant.cents
    value, count, reset = meant.va1
    assert audit.decimal_places == (2 if meant.places is None else meant.places)
    assert audit.paid_vends == Counters(
        Tally(count, cents(value)), Tally(reset[1], cents(reset[0])) if reset else None
    )
    card = audit.cashless["DA"]
    if meant.da2 is None:
        assert card == Counters(None, Tally(0, 0))  # not sent: no count of 0 made up
    else:
        assert card == Counters(Tally(meant.da2[1], cents(meant.da2[0])), None)
    assert audit.machine_serial == meant.serial
    read = {p.column: p for p in audit.products}
    assert sorted(read) == sorted(c[0] for c in meant.columns)
    for column, price, name, paid, pa7 in meant.columns:
        product = read[column]
        assert (product.price, product.name) == (cents(price), name.rstrip())
        assert product.paid == Counters(Tally(paid[0], cents(paid[1])))
        sent = None if pa7 is None else Tally(pa7[0], cents(pa7[1]))
        assert product.by_device["DA"].since_init == sent
    figures = figures_of(audit)
    assert figures.cashless == card
    assert {name: c.cashless for name, c in figures.columns.items()} == {
        p.column: p.by_device["DA"] for p in audit.products
    }
    assert len(audit.notes) >= bool(before) + bool(after.strip(b"\r\n"))


# --- a machine's life between reads -------------------------------------------------------------

_EVENTS = st.sampled_from(
    ["sale", "sale", "sale", "unheard", "phantom", "reset", "reinitialise", "wrap", "swap",
     "read", "read", "read during a sale"]
)
PRICE = 150


@dataclass
class Machine:
    serial: str = "VM-1"
    init: Tally = field(default_factory=lambda: Tally(0, 0))
    since_reset: Tally = field(default_factory=lambda: Tally(0, 0))
    paid: int = 0  # PA2 count since initialisation

    def vend(self) -> None:
        self.init += Tally(1, PRICE)
        self.since_reset += Tally(1, PRICE)
        self.paid += 1

    def file(self) -> bytes:
        init, reset = self.init, self.since_reset
        return render_audit([
            ("ID1", self.serial),
            ("VA1", str(init.value), str(init.count), str(reset.value), str(reset.count)),
            ("DA2", str(init.value), str(init.count), str(reset.value), str(reset.count)),
            ("PA1", "A1", str(PRICE), "Cola"),
            ("PA2", str(self.paid), str(self.paid * PRICE)),
            ("PA7", "A1", "DA", "0", str(PRICE), str(init.count), str(init.value)),
        ])


@dataclass
class Interval:
    """What happened since the last clean read, as the truth."""

    honest: int = 0
    unheard: int = 0
    phantom: int = 0
    reinitialised: bool = False
    wrapped: bool = False  # the since-initialisation counter rolled over
    reset: bool = False  # a tech cleared the counters
    swapped: bool = False


@settings(max_examples=60, deadline=None)
@given(st.lists(_EVENTS, min_size=1, max_size=25), st.integers(1, 40))
def test_a_machines_life_between_reads_is_compared_truly_or_not_at_all(events, wrap_at):
    # a journal of its own each example, in memory where the system has it (no disk waits)
    memory = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(dir=memory) as folder:
        journal = Journal(Path(folder) / "journal.db")
        journal.open()
        try:
            _live(journal, events, wrap_at)
        finally:
            journal.close()


def _live(journal: Journal, events: list[str], wrap_at: int) -> None:
    store = AuditStore(lambda: journal.db)
    store.open()
    machine, interval, at = Machine(), Interval(), 1_764_324_000.0
    base: Tally | None = None  # the last clean read's DA2 since initialisation
    base_reset = Tally(0, 0)  # and since the reset

    def read(clean: bool) -> None:
        nonlocal interval, base, base_reset, at
        at += 60
        figures = figures_of(parse_audit(machine.file()))
        done = record_read(store, figures, at=at, clean=clean, sources=[MACHINE])
        if not clean:
            assert done.comparison is None
            return
        comparison = done.comparison
        if base is None:
            assert comparison is None
        else:
            assert comparison is not None
            assert comparison == store.last_comparison()
            _truthful(comparison, interval, base, base_reset, machine.init)
        base, base_reset, interval = machine.init, machine.since_reset, Interval()

    sales_before = journal.db.execute("SELECT COUNT(*) FROM sales").fetchone()[0]
    made = 0
    for event in events:
        if event == "sale":
            machine.vend()
            vended_sale(journal, PRICE, "A1")
            interval.honest += 1
        elif event == "unheard":  # the product came out; the agent heard a failure
            machine.vend()
            unvended_sale(journal, PRICE, "A1")
            interval.unheard += 1
        elif event == "phantom":  # the agent heard a vend that never happened
            vended_sale(journal, PRICE, "A1")
            interval.phantom += 1
        elif event == "reset":  # a tech's "clear counters": since-init carries on
            machine.since_reset = Tally(0, 0)
            interval.reset = True
        elif event == "reinitialise" and machine.init.count:
            machine.init, machine.since_reset, machine.paid = Tally(0, 0), Tally(0, 0), 0
            interval.reinitialised = True
        elif event == "wrap" and machine.init.count >= wrap_at:  # a counter of few digits
            count = machine.init.count % wrap_at
            machine.init = Tally(count, count * PRICE)
            interval.wrapped = True
        elif event == "swap":
            machine = Machine(serial=f"VM-{int(machine.serial[3:]) + 1}", init=Tally(7, 7 * PRICE))
            interval.swapped = True
        elif event == "read":
            read(clean=True)
        elif event == "read during a sale":  # the vend lands after the read: no boundary
            read(clean=False)
            machine.vend()
            vended_sale(journal, PRICE, "A1")
            interval.honest += 1
        made += event in ("sale", "unheard", "phantom", "read during a sale")
    read(clean=True)
    # the audit only reports: every sale the life made is there, none more, none changed
    rows = journal.db.execute("SELECT COUNT(*) FROM sales").fetchone()[0]
    assert rows == sales_before + made


def _truthful(comparison, interval: Interval, base: Tally, base_reset: Tally, now: Tally) -> None:
    if interval.swapped:
        assert (comparison.verdict, comparison.cause) == ("not_compared", "machine")
        return
    journal = interval.honest + interval.phantom
    assert comparison.journal == Tally(journal, journal * PRICE)
    if interval.reinitialised or interval.wrapped:
        # seen when the counters went down; or, with no tech's reset between, when they grew
        # less since initialisation than since the reset (a re-initialisation clears both: seen
        # when the machine had been reset before; a wrap, the since-reset counter keeps)
        lost_unseen_by_the_reset_counter = (
            interval.wrapped and not interval.reinitialised
        ) or base.count > base_reset.count
        seen = now.went_down_from(base) or (
            not interval.reset and lost_unseen_by_the_reset_counter
        )
        if seen:
            # the machine's books reset: no mismatch, a new baseline, the interval not checked
            assert (comparison.verdict, comparison.cause, comparison.machine) == (
                "books_reset", "reinitialised", None), comparison.text()
        return  # climbed back past the last read with nothing else to tell: the counts decide
    counted = interval.honest + interval.unheard
    assert comparison.machine == Tally(counted, counted * PRICE)
    # a vend the agent never heard and a sale the machine never vended cancel in one
    # interval's counts: only the counts can be compared, not which vend was which
    assert comparison.verdict == ("match" if counted == journal else "mismatch"), comparison.text()


# --- real files' shapes ------------------------------------------------------------------------

_DATA = Path(__file__).parent.parent / "data" / "dex"
# EVA-DTS: once a file, or once a column (PA7: once a column, device and price list)
_ONCE = {"ID1", "ID4", "ID5", "CB1", "VA1", "VA2", "VA3", "CA2", "CA3", "CA4", "EA3", "PA1",
         "PA2", "PA3", "PA4", "PA5", "PA7", *(f"D{d}{n}" for d in "AB" for n in range(1, 6))}
# of those, the ones the unit's figures are taken from: stated twice, the file is refused; any
# other one stated twice is noted and not read (docs/audit.md)
_USED = {"ID1", "ID4", "VA1", "CA2", "DA2", "DB2", "PA1", "PA2", "PA7"}
_REAL = sorted(p for p in _DATA.glob("*") if p.suffix != ".md")


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(_REAL), st.integers(0, 10**6), st.sampled_from([b"\r\n", b"\n"]))
def test_a_real_files_blocks_rewritten_read_the_same_and_its_faults_are_named(
    path, pick, line_end
):
    real = parse_audit(path.read_bytes())
    body = [(s.tag, *s.elements) for s in real.body()]
    again = parse_audit(render_audit(body, line_end=line_end))
    assert figures_of(again) == figures_of(real)
    # any block of it stated twice: refused, or kept where EVA-DTS lets it repeat
    at = pick % len(body)
    twice = [*body[: at + 1], body[at], *body[at + 1 :]]
    tag = body[at][0]
    if tag in _USED:
        with pytest.raises(AuditError) as refused:
            parse_audit(render_audit(twice, line_end=line_end))
        assert (refused.value.field, refused.value.line) == (tag, at + 4)
        assert "a second" in refused.value.problem
    elif tag in _ONCE:  # only that block is unusable: the figures read as without it
        read = parse_audit(render_audit(twice, line_end=line_end))
        assert figures_of(read) == figures_of(real)
        assert [n.split(":")[0] for n in read.notes] == [f"line {at + 4}, {tag}"], read.notes
        assert "the comparison does not use it" in read.notes[0]
    else:  # LA1, EA1, EA2, a maker's own: they may repeat
        parse_audit(render_audit(twice, line_end=line_end))
    # its DA2 with the since-initialisation fields left empty: not sent, and not compared
    blank = [(b[0], "", "", *b[3:]) if b[0] == "DA2" else b for b in body]
    if any(b[0] == "DA2" for b in body):
        figures = figures_of(parse_audit(render_audit(blank, line_end=line_end)))
        assert figures.cashless is not None
        assert figures.cashless.since_init is None


# any element of a real file's block made malformed (a sign, a decimal point where a count is,
# 16 digits, a letter, a byte a machine's firmware garbled, nothing), the file rewritten with a
# good G85 so the check vouches for it as the machine's own
_MALFORMED = st.sampled_from([
    "", "-1", "9" * 16, "1.5", "x", "\xff", " 1", "1e3", "0x10", "\x00", "1,5", "+1", "\t",
    "99999999999", ".5", "EUR", "1 2",
]) | st.text(st.characters(max_codepoint=255, exclude_characters="*\r\n"), max_size=8)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(_REAL), st.data(), _MALFORMED)
def test_a_real_file_with_any_element_malformed_is_read_or_refused_naming_its_line_and_field(
    path, data, malformed
):
    body = [(s.tag, *s.elements) for s in parse_audit(path.read_bytes()).body()]
    at = data.draw(st.integers(0, len(body) - 1))
    block = list(body[at])
    position = data.draw(st.integers(1, len(block) + 1))
    block += [""] * (position + 1 - len(block))
    block[position] = malformed
    body[at] = tuple(block)
    line = at + 3  # after DXS and ST
    refused: AuditError | None = None
    try:
        audit = parse_audit(render_audit(body))
    except AuditError as err:
        refused = err
    if refused is None:  # read: the block is kept as sent, at its line
        kept = audit.segments[at + 1]
        assert (kept.line, kept.tag, kept.elements) == (line, block[0], tuple(block[1:]))
        return
    # the line changed and its block's field (VA102: the second element of VA1); or, where the
    # change made it a second block of a kind stated once, both lines
    assert str(refused) == f"line {refused.line}, {refused.field}: {refused.problem}"
    assert refused.field.startswith(block[0]), refused
    assert line == refused.line or f"(the first on line {line})" in refused.problem, refused
    assert refused.problem.strip(), refused
