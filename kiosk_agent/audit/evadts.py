"""EVA-DTS 6.1 audit files: the reader (a pure function) and the writer.

A file is one line per segment, elements separated by ``*``, lines ending CR LF as the machine
sends them (a copy stored with LF only is read the same way)::

    DXS*<sender>*VA*V0/6*1          the transmission (DXE closes it)
    ST*001*0001                     the transaction set (SE closes it)
    ID1*...  VA1*... PA1*... ...    the data blocks
    G85*<CRC>                       CRC-16/ARC of every byte from ``ST`` to the CR LF before G85
    SE*<segments>*0001              segments from ST to SE, both counted
    DXE*1*1

The envelope is checked (the order, SE's segment count, G85's check value when the machine
sends one). ``ID4`` says how many decimal places the amounts have; every amount is read through
``kiosk_agent.money`` into integer cents. The blocks the agent uses are read into typed fields
(``AuditFile``); every other block, a maker's own included, is kept as sent in ``other`` and
is never an error. A file that breaks the grammar raises ``AuditError`` naming the line and the
field (``VA102``: the second element of VA1), and nothing else is ever raised.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from kiosk_agent.audit.crc import crc16_arc
from kiosk_agent.money import MoneyError, dollars_to_cents, scaled_to_cents

SEPARATOR = "*"
CRLF = b"\r\n"
# A segment id: VA1, PA7, a maker's own EA250705; upper-case letters and digits.
_TAG = re.compile(r"[A-Z][A-Z0-9]{0,15}", re.ASCII)
_COUNT = re.compile(r"[0-9]{1,15}", re.ASCII)
_HEX4 = re.compile(r"[0-9A-Fa-f]{4}", re.ASCII)
# A price written with its currency (``EUR 1.50``, ``1,50 EUR``) or a currency alone (``USD``).
_PRICE_WITH_CURRENCY = re.compile(
    r"(?:([A-Z]{3}) ?)?([0-9]{1,9})?(?:[.,]([0-9]{1,6}))?(?: ?([A-Z]{3}))?", re.ASCII
)
_ENVELOPE = frozenset({"DXS", "ST", "G85", "SE", "DXE"})
_DEFAULT_PLACES = 2  # EVA-DTS: amounts have two decimal places unless ID4 says otherwise


class AuditError(ValueError):
    """A file that is no EVA-DTS audit: says the line (1 = first) and the field."""

    def __init__(self, line: int, field_name: str, problem: str) -> None:
        super().__init__(f"line {line}, {field_name}: {problem}")
        self.line = line
        self.field = field_name
        self.problem = problem


@dataclass(frozen=True, slots=True)
class Segment:
    """One line of the file as sent: its id and its elements (``VA1*100*2`` -> ``100``, ``2``)."""

    line: int
    tag: str
    elements: tuple[str, ...]

    def element(self, position: int) -> str:
        """The element EVA-DTS numbers ``position`` (VA102 is ``element(2)``); "" when left out."""
        return self.elements[position - 1] if 0 < position <= len(self.elements) else ""

    @property
    def text(self) -> str:
        return SEPARATOR.join((self.tag, *self.elements))


@dataclass(frozen=True, slots=True)
class Tally:
    """One counter pair: how many vends, and how much (integer cents, through money.py). The
    one such type: the reader's, the figures a read keeps (``audit.books``) and the
    comparisons' (``audit.reconcile``); stored as ``{"count": ..., "value": ...}``."""

    count: int
    value: int

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.count + other.count, self.value + other.value)

    def __sub__(self, other: Tally) -> Tally:
        return Tally(self.count - other.count, self.value - other.value)

    def went_down_from(self, other: Tally) -> bool:
        return self.count < other.count or self.value < other.value

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "value": self.value}

    @classmethod
    def from_dict(cls, data: Any) -> Tally | None:
        """As stored by ``as_dict``; None for anything that is not a mapping (None stored)."""
        if not isinstance(data, Mapping):
            return None
        return cls(int(data["count"]), int(data["value"]))


@dataclass(frozen=True, slots=True)
class Counters:
    """A counter pair since initialisation, and since the last reset (None where the file
    gives no since-reset pair). Each is None where the machine left either of its two figures
    empty: an element left empty is *not sent*, never 0, so no comparison, reset or stock is
    built on it. A since-reset pair sent by half keeps the figure sent in ``reset_half``
    (count, value; the other None), for showing as sent: the Animo sends its columns' vends
    since the reset without their value."""

    since_init: Tally | None
    since_reset: Tally | None = None
    reset_half: tuple[int | None, int | None] | None = None

    @classmethod
    def of(
        cls,
        value_since_init: int | None = None,
        count_since_init: int | None = None,
        value_since_reset: int | None = None,
        count_since_reset: int | None = None,
    ) -> Counters | None:
        """The four figures as read; None when the machine sent none of them."""
        figures = (value_since_init, count_since_init, value_since_reset, count_since_reset)
        if all(figure is None for figure in figures):
            return None
        reset, half = None, None
        if value_since_reset is not None and count_since_reset is not None:
            reset = Tally(count_since_reset, value_since_reset)
        elif value_since_reset is not None or count_since_reset is not None:
            half = (count_since_reset, value_since_reset)
        since_init = None
        if count_since_init is not None and value_since_init is not None:
            since_init = Tally(count_since_init, value_since_init)
        return cls(since_init, reset, half)

    def as_dict(self) -> dict[str, Any]:
        """The stored form: ``{"since_init": {...} or None, "since_reset": {...} or None}``,
        and ``"reset_half": {"count": ..., "value": ...}`` (one of them null) where it is."""
        stored: dict[str, Any] = {
            "since_init": self.since_init.as_dict() if self.since_init else None,
            "since_reset": self.since_reset.as_dict() if self.since_reset else None,
        }
        if self.reset_half is not None:
            stored["reset_half"] = {"count": self.reset_half[0], "value": self.reset_half[1]}
        return stored

    @classmethod
    def from_dict(cls, data: Any) -> Counters | None:
        """As stored by ``as_dict``; None for anything that is not a mapping (None stored)."""
        if not isinstance(data, Mapping):
            return None
        since_init, since_reset = data.get("since_init"), data.get("since_reset")
        half = data.get("reset_half")
        sent = (half.get("count"), half.get("value")) if isinstance(half, Mapping) else None
        return cls(Tally.from_dict(since_init), Tally.from_dict(since_reset), sent)

    @property
    def value_since_init(self) -> int | None:
        return None if self.since_init is None else self.since_init.value

    @property
    def count_since_init(self) -> int | None:
        return None if self.since_init is None else self.since_init.count

    @property
    def value_since_reset(self) -> int | None:
        """As sent: the pair's, or the one figure of a pair sent by half."""
        if self.since_reset is not None:
            return self.since_reset.value
        return None if self.reset_half is None else self.reset_half[1]

    @property
    def count_since_reset(self) -> int | None:
        if self.since_reset is not None:
            return self.since_reset.count
        return None if self.reset_half is None else self.reset_half[0]


@dataclass(frozen=True, slots=True)
class Machine:
    """ID1: the vending machine itself."""

    serial: str = ""
    model: str = ""
    build_standard: str = ""
    location: str = ""
    asset_number: str = ""  # ID106


@dataclass(frozen=True, slots=True)
class Device:
    """A part's identity (CB1 control board, DA1/DB1 cashless device): serial, model, revision."""

    serial: str = ""
    model: str = ""
    revision: str = ""


@dataclass(frozen=True, slots=True)
class CashIn:
    """CA3: money put in, since the last reset and since initialisation (cents)."""

    cash_in_since_reset: int | None = None
    to_cash_box_since_reset: int | None = None
    to_tubes_since_reset: int | None = None
    bills_in_since_reset: int | None = None
    cash_in_since_init: int | None = None
    to_cash_box_since_init: int | None = None
    to_tubes_since_init: int | None = None
    bills_in_since_init: int | None = None


@dataclass(frozen=True, slots=True)
class CashOut:
    """CA4: change paid out, by the changer and by hand (cents)."""

    dispensed_since_reset: int | None = None
    manually_dispensed_since_reset: int | None = None
    dispensed_since_init: int | None = None
    manually_dispensed_since_init: int | None = None


@dataclass(frozen=True, slots=True)
class Cashless:
    """One cashless device, ``DA`` (device 1) or ``DB`` (device 2): blocks DA1-DA5 / DB1-DB5."""

    device: str
    identity: Device | None = None  # DA1
    sales: Counters | None = None  # DA2
    debited_since_reset: int | None = None  # DA3: value debited from cards
    debited_since_init: int | None = None
    credited_since_init: int | None = None  # DA4: value credited (revalued) to cards
    credited_since_reset: int | None = None
    discounts: Counters | None = None  # DA5


@dataclass(frozen=True, slots=True)
class Product:
    """PA1 and the PA2-PA7 after it: one column of the machine."""

    column: str  # PA101, stripped
    price: int | None = None  # cents; None when left out or a currency stood in its place
    name: str = ""
    paid: Counters | None = None  # PA2
    test: Counters | None = None  # PA3
    free: Counters | None = None  # PA4
    # PA7 by payment device ('CA', 'DA', 'DB', 'TA'), its price lists added up
    by_device: dict[str, Counters] = field(default_factory=dict)
    last_sale: datetime | None = None  # PA5, the machine's own clock
    line: int = 0


@dataclass(frozen=True, slots=True)
class DeviceSale:
    """PA7: one product's sales through one payment device (CA cash, DA/DB cashless, TA token)."""

    line: int
    product: str
    device: str
    price_list: str
    price: int | None
    sales: Counters


@dataclass(frozen=True, slots=True)
class PriceListSale:
    """LA1: vends of a product at one price list's price."""

    line: int
    price_list: str
    product: str
    price: int | None
    count_since_init: int | None
    count_since_reset: int | None


@dataclass(frozen=True, slots=True)
class Event:
    """EA1: an event the machine recorded (a door opened, a fault)."""

    line: int
    event_id: str
    at: datetime | None
    duration_minutes: int | None


@dataclass(frozen=True, slots=True)
class EventCount:
    """EA2: how often an event happened, and whether it is still on."""

    line: int
    event_id: str
    count_since_reset: int | None
    count_since_init: int | None
    active: bool


@dataclass(frozen=True, slots=True)
class Reads:
    """EA3: this read and the one before it."""

    reads_with_reset_since_init: int | None = None
    read_at: datetime | None = None
    terminal: str = ""
    last_read_at: datetime | None = None
    last_terminal: str = ""
    reads_since_init: int | None = None  # EA309
    resets_since_init: int | None = None  # EA310


@dataclass(frozen=True, slots=True)
class AuditFile:
    """One audit as the machine stated it. Amounts in cents, counts in vends."""

    sender: str  # DXS01: the communication id of the machine
    version: str  # DXS03
    segments: tuple[Segment, ...]  # every segment from ST to SE, as sent
    check: str | None  # G85 as sent (verified); None when the machine sends none
    currency: str = ""  # ID403, the alphabetic code (EUR); "" when the file names none
    decimal_places: int = _DEFAULT_PLACES  # ID401 (2 when there is no ID4)
    currency_number: str = ""  # ID402, ISO 4217 numeric (or a country code on older machines)
    machine: Machine | None = None
    control_board: Device | None = None
    read_at: datetime | None = None  # ID5, the machine's own clock
    paid_vends: Counters | None = None  # VA1
    test_vends: Counters | None = None  # VA2
    free_vends: Counters | None = None  # VA3
    cash_sales: Counters | None = None  # CA2
    cash_in: CashIn | None = None  # CA3
    cash_out: CashOut | None = None  # CA4
    cashless: dict[str, Counters] = field(default_factory=dict)  # DA2 -> 'DA', DB2 -> 'DB'
    cashless_devices: tuple[Cashless, ...] = ()  # DA1-DA5 / DB1-DB5 in full
    products: tuple[Product, ...] = ()
    device_sales: tuple[DeviceSale, ...] = ()  # PA7
    price_list_sales: tuple[PriceListSale, ...] = ()  # LA1
    events: tuple[Event, ...] = ()  # EA1
    event_counts: tuple[EventCount, ...] = ()  # EA2
    reads: Reads | None = None  # EA3
    other: tuple[Segment, ...] = ()  # every block not read above, as sent
    # What the reader let pass, in words: bytes a collector wrote around the audit, and the
    # machine's own slips (an SE count a verified G85 vouches against: the data is whole, the
    # machine counted wrong).
    notes: tuple[str, ...] = ()

    def body(self) -> tuple[Segment, ...]:
        """The data blocks: the segments between ST and G85/SE."""
        return tuple(s for s in self.segments if s.tag not in _ENVELOPE)

    def cashless_device(self, device: str) -> Cashless | None:
        return next((c for c in self.cashless_devices if c.device == device), None)

    @property
    def raw(self) -> tuple[Segment, ...]:
        """Every segment from ST to SE as read (tag, elements, line number)."""
        return self.segments

    @property
    def crc_checked(self) -> bool:
        """G85 was sent and verified."""
        return self.check is not None

    @property
    def machine_serial(self) -> str:
        return self.machine.serial if self.machine else ""

    @property
    def machine_model(self) -> str:
        return self.machine.model if self.machine else ""


# --- the reader ------------------------------------------------------------------------------


def parse_audit(data: bytes | str) -> AuditFile:
    """Read one EVA-DTS file; ``AuditError`` (line and field) for anything else. What a
    collector wrote around the audit (before ``DXS*``, after the ``DXE`` segment) is left out
    and noted."""
    raw = _one_byte_each(data) if isinstance(data, str) else data
    audit, around = _unwrapped(raw)
    lines = _split_lines(audit)
    envelope = _Envelope.read(lines)
    fields = _Fields(_places(envelope.body))
    draft = _read_body(envelope.body, fields, frozenset())
    if draft.unusable:  # read again without every copy of a block stated twice that is not used
        repeated = draft.unusable
        draft = _read_body(envelope.body, fields, frozenset(repeated))
        draft.unusable = repeated
    return AuditFile(
        sender=envelope.sender,
        version=envelope.version,
        segments=envelope.segments,
        check=envelope.check,
        currency=draft.currency_code,
        decimal_places=fields.places,
        currency_number=draft.currency_number,
        machine=draft.machine,
        control_board=draft.control_board,
        read_at=draft.read_at,
        paid_vends=draft.tallies.get("VA1"),
        test_vends=draft.tallies.get("VA2"),
        free_vends=draft.tallies.get("VA3"),
        cash_sales=draft.tallies.get("CA2"),
        cash_in=draft.cash_in,
        cash_out=draft.cash_out,
        cashless={c.device: c.sales for c in draft.cashless.values() if c.sales is not None},
        cashless_devices=tuple(draft.cashless.values()),
        products=_products(draft.products, draft.device_sales),
        device_sales=tuple(draft.device_sales),
        price_list_sales=tuple(draft.price_list_sales),
        events=tuple(draft.events),
        event_counts=tuple(draft.event_counts),
        reads=draft.reads,
        other=tuple(draft.other),
        notes=around + envelope.notes + tuple(note for _, note in draft.unusable.values()),
    )


def _read_body(body: Iterable[Segment], fields: _Fields, skip: frozenset[_Where]) -> _Draft:
    """The blocks read into a draft. A block the comparison uses stated twice where EVA-DTS has
    it once is malformed (``AuditError``); any other one is noted in ``unusable`` (read again
    with it in ``skip``: every copy kept as sent, none read)."""
    draft = _Draft(skip=skip)
    skipped = {tag for tag, column in skip if not column}  # the file's, by tag alone
    first_of: dict[str, int] = {}  # each block stated once: its line
    for segment in body:
        tag = segment.tag
        reader = _READERS.get(tag)
        if reader is None or tag in skipped:
            draft.other.append(segment)
            continue
        if tag in _ONCE and first_of.setdefault(tag, segment.line) != segment.line:
            draft.repeated(segment, first_of[tag], "")
            continue
        reader(draft, fields, segment)
    return draft


def _unwrapped(raw: bytes) -> tuple[bytes, tuple[str, ...]]:
    """The audit without what a collector wrote around it, and what was left out, in words.

    A telemetry box or a handheld may write its own header before ``DXS*`` (N&W's BlueRed:
    ``<000|AVSZONE003|...|321>DXS*...``), line noise may come before it, and a trailer, a
    NUL or an EOT after the last ``DXE`` segment. The bytes before the first ``DXS*`` become
    their line ends only, so every line keeps its number in the file as stored."""
    notes: list[str] = []
    start = raw.find(b"DXS*")
    if start < 0 and raw.strip():
        raise AuditError(1, "DXS", "no DXS* anywhere in the file: it holds no EVA-DTS audit")
    if start > 0:
        notes.append(f"{start} bytes before DXS left out (a collector's wrapper or line noise)")
        raw = b"\n" * raw.count(b"\n", 0, start) + raw[start:]
    dxe = _last_dxe(raw)
    if dxe is not None:
        end = dxe.end()
        trailing = raw[end:]
        if trailing.strip(b"\r\n"):
            notes.append(f"{len(trailing)} bytes after DXE left out (a collector's trailer)")
            raw = raw[:end]
    return raw, tuple(notes)


# The DXE segment (its two counts) and its line end: what follows it is no longer the audit.
_DXE = re.compile(rb"DXE(?:\*[0-9 ]*){0,2}\r?\n?", re.ASCII)


def _last_dxe(raw: bytes) -> re.Match[bytes] | None:
    """The last ``DXE*`` that begins a line."""
    at = raw.rfind(b"DXE*")
    if at < 0 or (at > 0 and raw[at - 1] != 0x0A):
        return None
    return _DXE.match(raw, at)


def _split_lines(raw: bytes) -> list[str]:
    """The file's lines, each without its line end (CR LF or LF), decoded once (one byte a
    character: what the machine sent, whatever it meant)."""
    lines = raw.decode("latin-1").replace("\r\n", "\n").split("\n")
    if lines[-1].endswith("\r"):  # the last line's CR without its LF
        lines[-1] = lines[-1][:-1]
    return lines


def _one_byte_each(text: str) -> bytes:
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError as err:
        line = text.count("\n", 0, err.start) + 1
        problem = f"character {text[err.start]!a} is not one byte"
        raise AuditError(line, "text", problem) from None


@dataclass
class _Envelope:
    sender: str
    version: str
    segments: tuple[Segment, ...]
    body: tuple[Segment, ...]
    check: str | None
    notes: tuple[str, ...]

    @classmethod
    def read(cls, lines: list[str]) -> _Envelope:
        numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip(" \t")]
        if not numbered:
            raise AuditError(1, "DXS", "the file is empty")
        dxs = _segment(*numbered[0])
        _expect(dxs, "DXS", "the file must start with DXS")
        if len(numbered) < 2:
            raise AuditError(dxs.line, "ST", "the file ends after DXS (cut short?)")
        st = _segment(*numbered[1])
        _expect(st, "ST", "DXS must be followed by ST")
        segments = [st]
        body: list[Segment] = []
        check: Segment | None = None
        se: Segment | None = None
        position = 2
        while position < len(numbered):
            line_number, text = numbered[position]
            segment = _segment(line_number, text)
            position += 1
            segments.append(segment)
            tag = segment.tag
            if tag not in _ENVELOPE:
                body.append(segment)
            elif tag == "G85":
                check = _check_value(segment, check, lines, st.line)
            elif tag == "SE":
                se = segment
                break
            else:  # DXS, ST, DXE
                raise AuditError(segment.line, tag, "inside the set (before SE)")
        last_line = numbered[-1][0]
        if se is None:
            raise AuditError(last_line, "SE", "the file ends before SE (cut short?)")
        notes = _check_count(se, len(segments), vouched=check is not None)
        _check_trailer(numbered[position:], se)
        return cls(
            sender=dxs.element(1).rstrip(),
            version=dxs.element(3).rstrip(),
            segments=tuple(segments),
            body=tuple(body),
            check=None if check is None else check.element(1).strip(),
            notes=notes,
        )


def _segment(line_number: int, text: str) -> Segment:
    tag, *elements = text.split(SEPARATOR)
    if tag not in _KNOWN_TAGS and _TAG.fullmatch(tag) is None:
        raise AuditError(line_number, "segment id", f"expected an id like VA1, got {_shown(tag)}")
    made = _new(Segment)  # Segment(line_number, tag, tuple(elements)), quicker (see _tally)
    _set_line(made, line_number)
    _set_tag(made, tag)
    _set_elements(made, tuple(elements))
    return made


def _expect(segment: Segment, tag: str, problem: str) -> None:
    if segment.tag != tag:
        raise AuditError(segment.line, tag, f"{problem}, got {segment.tag}")


def _check_value(
    segment: Segment, earlier: Segment | None, lines: list[str], st_line: int
) -> Segment:
    if earlier is not None:
        raise AuditError(segment.line, "G85", f"a second G85 (the first on line {earlier.line})")
    stated = segment.element(1).strip()
    if _HEX4.fullmatch(stated) is None:
        raise AuditError(segment.line, "G8501", f"expected 4 hex digits, got {_shown(stated)}")
    # As the machine sent it: every line from ST up to G85, each ending CR LF.
    data = "\r\n".join(lines[st_line - 1 : segment.line - 1]).encode("latin-1") + CRLF
    computed = crc16_arc(data)
    if int(stated, 16) != computed:
        raise AuditError(
            segment.line, "G8501", f"check value {stated} does not match the data ({computed:04X})"
        )
    return segment


def _check_count(se: Segment, counted: int, *, vouched: bool) -> tuple[str, ...]:
    """SE01 against the segments read. The count is the only guard against lost lines when
    there is no G85; under a verified G85 the data is whole and a wrong count is the machine's
    own slip (a Rheavendors LuceX2 leaves its EA2 lines out): noted, not refused."""
    stated = se.element(1).strip()
    if _COUNT.fullmatch(stated) is None:
        raise AuditError(se.line, "SE01", f"expected the number of segments, got {_shown(stated)}")
    if int(stated) == counted:
        return ()
    problem = f"says {int(stated)} segments, the set has {counted} (ST to SE)"
    if not vouched:
        raise AuditError(se.line, "SE01", problem)
    return (f"line {se.line}, SE01: {problem}; G85 vouches for the data",)


def _check_trailer(rest: list[tuple[int, str]], se: Segment) -> None:
    if not rest:
        raise AuditError(se.line, "DXE", "the file ends before DXE (cut short?)")
    dxe = _segment(*rest[0])
    _expect(dxe, "DXE", "SE must be followed by DXE")
    sets = dxe.element(2).strip()
    if sets and sets != "1":
        raise AuditError(dxe.line, "DXE02", f"says {_shown(sets)} sets, the file has 1")
    if len(rest) > 1:
        raise AuditError(rest[1][0], "DXE", "data after DXE")


def _places(body: Iterable[Segment]) -> int:
    id4 = next((s for s in body if s.tag == "ID4"), None)
    if id4 is None or not id4.element(1).strip():
        return _DEFAULT_PLACES
    places = _Fields(_DEFAULT_PLACES).count(id4, 1)
    if places is None or places > 6:
        raise AuditError(id4.line, "ID401", f"expected 0 to 6 decimal places, got {places}")
    return places


class _Fields:
    """Typed elements of a segment; each error names its field (VA102). The common case (plain
    digits) is taken first: a 10 kB audit has some 15,000 elements."""

    def __init__(self, places: int) -> None:
        self.places = places
        # Whole units of 10**-places to cents, for the common case (money.scaled_to_cents's
        # rule: at most 2 places multiply; more go through it and may be refused).
        self.scale = scaled_to_cents("1", places) if places <= 2 else 0

    def text(self, segment: Segment, position: int) -> str:
        elements = segment.elements
        return elements[position - 1].rstrip() if position <= len(elements) else ""

    def count(self, segment: Segment, position: int) -> int | None:
        elements = segment.elements
        value = elements[position - 1] if position <= len(elements) else ""
        if _plain_number(value):
            return int(value)
        value = value.strip()
        if not value:
            return None
        if _COUNT.fullmatch(value) is None:
            raise _field_error(segment, position, f"expected a number, got {_shown(value)}")
        return int(value)

    def amount(self, segment: Segment, position: int) -> int | None:
        elements = segment.elements
        value = elements[position - 1] if position <= len(elements) else ""
        if self.scale and _plain_number(value):
            return int(value) * self.scale  # money.scaled_to_cents's rule (self.scale)
        value = value.strip()
        if not value:
            return None
        try:
            return scaled_to_cents(value, self.places)
        except MoneyError as err:
            raise _field_error(segment, position, f"not an amount: {err}") from None

    def price(self, segment: Segment, position: int) -> int | None:
        """A price; some machines write a currency in its place (``USD``, ``EUR 1.50``)."""
        elements = segment.elements
        value = elements[position - 1] if position <= len(elements) else ""
        if self.scale and value.isdigit() and value.isascii() and len(value) <= 15:
            return int(value) * self.scale  # money.scaled_to_cents's rule (self.scale)
        value = value.strip()
        match = _PRICE_WITH_CURRENCY.fullmatch(value) if len(value) <= 24 else None
        if match is None or not (match.group(1) or match.group(4)):
            return self.amount(segment, position)
        whole, fraction = match.group(2), match.group(3)
        if whole is None:
            return None  # a currency alone: no price
        try:
            if fraction is None:
                return scaled_to_cents(whole, self.places)
            return dollars_to_cents(f"{whole}.{fraction}")  # the point written out
        except MoneyError as err:
            raise _field_error(segment, position, f"not an amount: {err}") from None

    def moment(self, segment: Segment, date_at: int, time_at: int) -> datetime | None:
        """A date (YYMMDD or CCYYMMDD) and a time (HHMM or HHMMSS) as the machine's clock said."""
        date = segment.element(date_at).strip()
        time = segment.element(time_at).strip()
        if not date:
            return None
        formats = {6: "%y%m%d", 8: "%Y%m%d"}
        clock = {0: "", 4: "%H%M", 6: "%H%M%S"}
        if not date.isdigit() or len(date) not in formats:
            raise _field_error(segment, date_at, f"expected YYMMDD or CCYYMMDD, got {_shown(date)}")
        if (time and not time.isdigit()) or len(time) not in clock:
            raise _field_error(segment, time_at, f"expected HHMM or HHMMSS, got {_shown(time)}")
        try:
            return datetime.strptime(date + time, formats[len(date)] + clock[len(time)])
        except ValueError:
            raise _field_error(
                segment, date_at, f"no such date and time: {_shown(date)} {_shown(time)}"
            ) from None

    def tally(self, segment: Segment, *, count_first: bool, at: int = 1) -> Counters | None:
        """VA1-style (value, count, value, count) or PA2-style (count, value, count, value),
        its first element at ``at``."""
        digits = segment.elements[at - 1 : at + 3]
        scale = self.scale
        # each of the four [0-9]{1,15}: one test of them all joined, then their lengths
        joined = "".join(digits)
        if (
            scale
            and len(digits) == 4
            and joined.isdigit()
            and joined.isascii()
            and "" not in digits
            and (len(joined) <= 15 or max(map(len, digits)) <= 15)
        ):
            # the common case in one step, by money.scaled_to_cents's rule (self.scale)
            first, second, third, fourth = map(int, digits)
            if not count_first:
                first, second, third, fourth = second, first, fourth, third
            return _counters(_tally(first, second * scale), _tally(third, fourth * scale))
        value_at, count_at = (at + 1, at) if count_first else (at, at + 1)
        return Counters.of(
            value_since_init=self.amount(segment, value_at),
            count_since_init=self.count(segment, count_at),
            value_since_reset=self.amount(segment, value_at + 2),
            count_since_reset=self.count(segment, count_at + 2),
        )


# Built without the frozen dataclass's __init__ (one object.__setattr__ a field): the same
# objects, in about half the time; a 10 kB audit makes some 1,000 pairs and 350 segments.
_new = object.__new__
_set_count, _set_value = Tally.__dict__["count"].__set__, Tally.__dict__["value"].__set__
_set_init = Counters.__dict__["since_init"].__set__
_set_reset = Counters.__dict__["since_reset"].__set__
_set_half = Counters.__dict__["reset_half"].__set__


_set_line = Segment.__dict__["line"].__set__
_set_tag = Segment.__dict__["tag"].__set__
_set_elements = Segment.__dict__["elements"].__set__
_set_sale_line, _set_product, _set_device, _set_price_list, _set_price, _set_sales = (
    DeviceSale.__dict__[name].__set__
    for name in ("line", "product", "device", "price_list", "price", "sales")
)
# A PA7 whose counts are all empty: sent, but saying nothing (never 0 sales).
_NOTHING_SENT = Counters(None)


def _device_sale(
    line: int, product: str, device: str, price_list: str, price: int | None, sales: Counters
) -> DeviceSale:
    """``DeviceSale(line, product, device, price_list, price, sales)``, quicker."""
    made = _new(DeviceSale)
    _set_sale_line(made, line)
    _set_product(made, product)
    _set_device(made, device)
    _set_price_list(made, price_list)
    _set_price(made, price)
    _set_sales(made, sales)
    return made


def _tally(count: int, value: int) -> Tally:
    """``Tally(count, value)``, quicker."""
    made = _new(Tally)
    _set_count(made, count)
    _set_value(made, value)
    return made


def _counters(since_init: Tally, since_reset: Tally | None) -> Counters:
    """``Counters(since_init, since_reset)``, quicker."""
    made = _new(Counters)
    _set_init(made, since_init)
    _set_reset(made, since_reset)
    _set_half(made, None)
    return made


def _plain_number(text: str) -> bool:
    """``[0-9]{1,15}``, without a regex."""
    return text.isdigit() and text.isascii() and len(text) <= 15


def _repeated(segment: Segment, first: int, where: str) -> AuditError:
    """A block stated twice where EVA-DTS has it once: malformed, never a guess at which."""
    return AuditError(
        segment.line,
        segment.tag,
        f"a second {segment.tag} for {where} (the first on line {first}): which one the machine "
        "means cannot be known",
    )


# A block stated once a file (its tag, "") or once a column (its tag, the column).
_Where = tuple[str, str]


def _field_error(segment: Segment, position: int, problem: str) -> AuditError:
    return AuditError(segment.line, f"{segment.tag}{position:02d}", problem)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 20 else text[:17] + "...")


@dataclass
class _Draft:
    """The typed fields as they are read, in file order."""

    currency_code: str = ""
    currency_number: str = ""
    machine: Machine | None = None
    control_board: Device | None = None
    read_at: datetime | None = None
    tallies: dict[str, Counters | None] = field(default_factory=dict)
    cash_in: CashIn | None = None
    cash_out: CashOut | None = None
    cashless: dict[str, Cashless] = field(default_factory=dict)
    products: list[dict[str, Any]] = field(default_factory=list)  # a Product's fields each
    columns: dict[str, int] = field(default_factory=dict)  # each PA1's column: its line
    # each PA7's product, payment device and price list: its line
    device_lines: dict[tuple[str, str, str], int] = field(default_factory=dict)
    device_sales: list[DeviceSale] = field(default_factory=list)
    price_list_sales: list[PriceListSale] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    event_counts: list[EventCount] = field(default_factory=list)
    reads: Reads | None = None
    other: list[Segment] = field(default_factory=list)
    # blocks stated twice that the comparison does not use: none of their copies is read
    skip: frozenset[_Where] = frozenset()
    unusable: dict[_Where, tuple[int, str]] = field(default_factory=dict)  # first line, a note

    def repeated(self, segment: Segment, first: int, column: str) -> None:
        """A second ``segment`` where EVA-DTS has one (a file's, or ``column``'s): malformed
        when the comparison uses it; otherwise noted, and no copy of it is read."""
        tag = segment.tag
        where = f"column {column}" if column else "the file"
        if tag in _USED:
            raise _repeated(segment, first, where)
        self.unusable.setdefault((tag, column), (first, (
            f"{_repeated(segment, first, where)}; no {tag} of {where} is read (the comparison "
            "does not use it)"
        )))

    def cashless_device(self, tag: str) -> Cashless:
        device = tag[:2]
        return self.cashless.setdefault(device, Cashless(device))

    def set_cashless(self, cashless: Cashless) -> None:
        self.cashless[cashless.device] = cashless

    def update_product(self, segment: Segment, key: str, value: object) -> None:
        """A PA2-PA5 belongs to the PA1 before it; one with none before it is kept as sent."""
        if not self.products:
            self.other.append(segment)
            return
        product = self.products[-1]
        if self.skip and (segment.tag, product["column"]) in self.skip:
            self.other.append(segment)
            return
        first = product.setdefault(segment.tag, segment.line)
        if first != segment.line:
            self.repeated(segment, first, product["column"])
            return
        product[key] = value


_Reader = Callable[[_Draft, _Fields, Segment], None]


def _products(
    products: list[dict[str, Any]], device_sales: list[DeviceSale]
) -> tuple[Product, ...]:
    """Each column with its PA7 lines added up by payment device (over its price lists). The
    PA7 lines are grouped by product once: one pass over them, not one per column."""
    by_product: dict[str, dict[str, Counters]] = {}
    for sale in device_sales:
        by_device = by_product.setdefault(sale.product, {})
        by_device[sale.device] = _added(by_device.get(sale.device), sale.sales)
    return tuple(
        _product(fields, dict(by_product.get(fields["column"], {}))) for fields in products
    )


_PRODUCT_SETTERS = tuple(
    (name, Product.__dict__[name].__set__)
    for name in ("column", "price", "name", "paid", "test", "free", "last_sale", "line")
)
_set_by_device = Product.__dict__["by_device"].__set__


def _product(fields: dict[str, Any], by_device: dict[str, Counters]) -> Product:
    """``Product(**fields, by_device=by_device)``, quicker (see ``_tally``). PA1 gives line,
    column, price and name; what no block gave is None."""
    made = _new(Product)
    get = fields.get
    for name, setter in _PRODUCT_SETTERS:
        setter(made, get(name))
    _set_by_device(made, by_device)
    return made


def _added(total: Counters | None, more: Counters) -> Counters:
    """Two pairs of counters added, since initialisation and since the reset (a since-reset
    pair only one of them has is kept as it is). A since-initialisation pair either of them
    did not send makes the sum unknown (None), never a sum of what was sent; so does a
    since-reset pair either of them sent by half."""
    if total is None:
        return more
    old, new = total.since_init, more.since_init
    since_init = None if old is None or new is None else old + new
    if total.reset_half is not None or more.reset_half is not None:
        return Counters(since_init)
    if total.since_reset is None or more.since_reset is None:
        return Counters(since_init, total.since_reset or more.since_reset)
    return Counters(since_init, total.since_reset + more.since_reset)


def _id1(draft: _Draft, f: _Fields, s: Segment) -> None:
    draft.machine = Machine(f.text(s, 1), f.text(s, 2), f.text(s, 3), f.text(s, 4), f.text(s, 6))


def _id4(draft: _Draft, f: _Fields, s: Segment) -> None:
    draft.currency_number = f.text(s, 2).strip()
    draft.currency_code = f.text(s, 3).strip()


def _id5(draft: _Draft, f: _Fields, s: Segment) -> None:
    draft.read_at = f.moment(s, 1, 2)


def _cb1(draft: _Draft, f: _Fields, s: Segment) -> None:
    draft.control_board = Device(f.text(s, 1), f.text(s, 2), f.text(s, 3))


def _sales_tally(draft: _Draft, f: _Fields, s: Segment) -> None:
    draft.tallies[s.tag] = f.tally(s, count_first=False)


def _ca3(draft: _Draft, f: _Fields, s: Segment) -> None:
    draft.cash_in = CashIn(*(f.amount(s, n) for n in range(1, 9)))


def _ca4(draft: _Draft, f: _Fields, s: Segment) -> None:
    draft.cash_out = CashOut(*(f.amount(s, n) for n in range(1, 5)))


def _cashless_identity(draft: _Draft, f: _Fields, s: Segment) -> None:
    identity = Device(f.text(s, 1), f.text(s, 2), f.text(s, 3))
    draft.set_cashless(replace(draft.cashless_device(s.tag), identity=identity))


def _cashless_sales(draft: _Draft, f: _Fields, s: Segment) -> None:
    sales = f.tally(s, count_first=False)
    draft.set_cashless(replace(draft.cashless_device(s.tag), sales=sales))


def _cashless_amounts(first: str, second: str) -> _Reader:
    """DA3 and DA4: two amounts, read into the device's fields ``first`` and ``second``."""

    def read(draft: _Draft, f: _Fields, s: Segment) -> None:
        amounts: dict[str, Any] = {first: f.amount(s, 1), second: f.amount(s, 2)}
        draft.set_cashless(replace(draft.cashless_device(s.tag), **amounts))

    return read


# DA3: value debited from cards since the reset, then since initialisation; DA4: value credited
# (revalued) to cards since initialisation, then since the reset.
_cashless_debited = _cashless_amounts("debited_since_reset", "debited_since_init")
_cashless_credited = _cashless_amounts("credited_since_init", "credited_since_reset")


def _cashless_discounts(draft: _Draft, f: _Fields, s: Segment) -> None:
    # DA5: value and number since the last reset first, then since initialisation.
    discounts = Counters.of(
        value_since_init=f.amount(s, 3),
        count_since_init=f.count(s, 4),
        value_since_reset=f.amount(s, 1),
        count_since_reset=f.count(s, 2),
    )
    draft.set_cashless(replace(draft.cashless_device(s.tag), discounts=discounts))


def _pa1(draft: _Draft, f: _Fields, s: Segment) -> None:
    column = f.text(s, 1).strip()
    if not column:
        raise _field_error(s, 1, "a product needs its identifier")
    first = draft.columns.setdefault(column, s.line)
    if first != s.line:
        raise _repeated(s, first, f"column {column}")
    draft.products.append(
        {"line": s.line, "column": column, "price": f.price(s, 2), "name": f.text(s, 3)}
    )


def _pa2(draft: _Draft, f: _Fields, s: Segment) -> None:
    draft.update_product(s, "paid", f.tally(s, count_first=True))


def _pa3(draft: _Draft, f: _Fields, s: Segment) -> None:
    draft.update_product(s, "test", f.tally(s, count_first=True))


def _pa4(draft: _Draft, f: _Fields, s: Segment) -> None:
    draft.update_product(s, "free", f.tally(s, count_first=True))


def _pa5(draft: _Draft, f: _Fields, s: Segment) -> None:
    draft.update_product(s, "last_sale", f.moment(s, 1, 2))


def _pa7(draft: _Draft, f: _Fields, s: Segment) -> None:
    elements = s.elements  # PA7 is the most frequent block: its texts read straight
    if len(elements) < 3:
        elements = (*elements, "", "", "")
    product = elements[0].strip() or (draft.products[-1]["column"] if draft.products else "")
    device = elements[1].strip()
    if not device:
        raise _field_error(s, 2, "a sale by payment device needs its device (CA, DA, DB, TA)")
    price_list = elements[2].strip()
    first = draft.device_lines.setdefault((product, device, price_list), s.line)
    if first != s.line:
        raise _repeated(s, first, f"column {product}, device {device}, price list {price_list!r}")
    sales = f.tally(s, count_first=True, at=5) or _NOTHING_SENT
    draft.device_sales.append(
        _device_sale(s.line, product, device, price_list, f.price(s, 4), sales)
    )


def _la1(draft: _Draft, f: _Fields, s: Segment) -> None:
    draft.price_list_sales.append(
        PriceListSale(
            s.line,
            f.text(s, 1).strip(),
            f.text(s, 2).strip(),
            f.price(s, 3),
            f.count(s, 4),
            f.count(s, 5),
        )
    )


def _ea1(draft: _Draft, f: _Fields, s: Segment) -> None:
    draft.events.append(Event(s.line, f.text(s, 1).strip(), f.moment(s, 2, 3), f.count(s, 4)))


def _ea2(draft: _Draft, f: _Fields, s: Segment) -> None:
    active = s.element(5).strip()
    if active not in ("", "0", "1"):
        raise _field_error(s, 5, f"expected 1 (active), 0 or nothing, got {_shown(active)}")
    draft.event_counts.append(
        EventCount(s.line, f.text(s, 1).strip(), f.count(s, 2), f.count(s, 3), active == "1")
    )


def _ea3(draft: _Draft, f: _Fields, s: Segment) -> None:
    draft.reads = Reads(
        reads_with_reset_since_init=f.count(s, 1),
        read_at=f.moment(s, 2, 3),
        terminal=f.text(s, 4).strip(),
        last_read_at=f.moment(s, 5, 6),
        last_terminal=f.text(s, 7).strip(),
        reads_since_init=f.count(s, 9),
        resets_since_init=f.count(s, 10),
    )


_READERS: dict[str, _Reader] = {
    "ID1": _id1,
    "ID4": _id4,
    "ID5": _id5,
    "CB1": _cb1,
    "VA1": _sales_tally,
    "VA2": _sales_tally,
    "VA3": _sales_tally,
    "CA2": _sales_tally,
    "CA3": _ca3,
    "CA4": _ca4,
    "PA1": _pa1,
    "PA2": _pa2,
    "PA3": _pa3,
    "PA4": _pa4,
    "PA5": _pa5,
    "PA7": _pa7,
    "LA1": _la1,
    "EA1": _ea1,
    "EA2": _ea2,
    "EA3": _ea3,
}
for _device in ("DA", "DB"):
    _READERS |= {
        f"{_device}1": _cashless_identity,
        f"{_device}2": _cashless_sales,
        f"{_device}3": _cashless_debited,
        f"{_device}4": _cashless_credited,
        f"{_device}5": _cashless_discounts,
    }


# The blocks EVA-DTS states once a file (the machine, its totals, each cashless device's): a
# second one is malformed. PA2-PA5 are once a column (``_Draft.update_product``), PA1 once a
# column id, PA7 once a column, payment device and price list; LA1, EA1, EA2 repeat.
_ONCE = frozenset(_READERS) - {"PA1", "PA2", "PA3", "PA4", "PA5", "PA7", "LA1", "EA1", "EA2"}
# Of those, and of PA2-PA5, the blocks the unit uses (books.figures_of: the machine, the amounts'
# places, the totals, the cashless devices' sales, a column's paid vends): one stated twice makes
# the file unreadable. Any other one stated twice is noted and none of its copies is read
# (docs/audit.md, "A block stated twice").
_USED = frozenset({"ID1", "ID4", "VA1", "CA2", "DA2", "DB2", "PA2"})

# Tags that need no check of their form (the regex is for the others: a maker's own blocks).
_KNOWN_TAGS = frozenset(_READERS) | _ENVELOPE | {"DXE"}


# The shared contract's names for the two entry points.
def parse(data: bytes | str) -> AuditFile:
    """``parse_audit``: the contract's name."""
    return parse_audit(data)


# --- the writer ------------------------------------------------------------------------------


def render_audit(
    body: Iterable[Sequence[str]],
    *,
    sender: str = "KSK0000001",
    version: str = "V0/6",
    with_check: bool = True,
    line_end: bytes = CRLF,
) -> bytes:
    """A complete file around ``body`` (each block as its id and elements: ``("VA1", "250",
    "1")``): DXS, ST, the blocks, G85 (its CRC over the CR LF form), SE with its count, DXE."""
    blocks = [_render_segment(block) for block in body]
    middle = [b"ST*001*0001", *blocks]
    check = [f"G85*{crc16_arc(CRLF.join(middle) + CRLF):04X}".encode()] if with_check else []
    count = len(middle) + len(check) + 1
    lines = [
        _render_segment(("DXS", sender, "VA", version, "1")),
        *middle,
        *check,
        f"SE*{count}*0001".encode(),
        b"DXE*1*1",
    ]
    return line_end.join(lines) + line_end


def _render_segment(block: Sequence[str]) -> bytes:
    for element in block:
        if SEPARATOR in element or "\n" in element or "\r" in element:
            raise ValueError(f"an element holds a separator or a line end: {element!r}")
    return SEPARATOR.join(block).encode("latin-1")


def render(body: Iterable[Sequence[str]], **options: Any) -> bytes:
    """``render_audit``: the contract's name."""
    return render_audit(body, **options)
