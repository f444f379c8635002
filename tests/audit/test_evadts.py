"""The EVA-DTS reader and writer: the cases real files bring, the envelope, and fuzzing."""

from __future__ import annotations

import contextlib
import dataclasses
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiosk_agent.audit import AuditError, AuditFile, Counters, crc16_arc, parse_audit, render_audit
from kiosk_agent.audit.books import figures_of
from kiosk_agent.audit.evadts import Tally

A_MACHINE = [
    ("ID1", "SN0001", "MODEL7", "1", "Lobby", "", "A-17"),
    ("ID4", "2", "1978", "EUR"),
    ("ID5", "20260114", "0930"),
    ("CB1", "CB-9", "VMC2", "0102"),
    ("VA1", "1250", "6", "500", "2"),
    ("VA2", "200", "1", "0", "0"),
    ("VA3", "0", "3", "0", "1"),
    ("CA2", "750", "4", "250", "1"),
    ("CA3", "900", "600", "300", "0", "1900", "1200", "700", "0"),
    ("CA4", "150", "0", "350", "20"),
    ("DA1", "RDR-1", "CARDS", "0100"),
    ("DA2", "500", "2", "250", "1"),
    ("DA4", "20", "20"),
    ("PA1", "11", "250", "Cola  "),
    ("PA2", "3", "750", "1", "250"),
    ("PA7", "11", "CA", "0", "250", "2", "500", "1", "250"),
    ("PA7", "11", "DA", "0", "250", "1", "250", "0", "0"),
    ("PA1", "12", "125", "Water"),
    ("PA2", "4", "500", "1", "250"),
    ("PA5", "260113", "1802"),
    ("LA1", "0", "11", "250", "3", "1"),
    ("EA1", "EGS", "260110", "0815", "12"),
    ("EA2", "EGS", "1", "4", "", "1"),
    ("EA3", "7", "260114", "0930", "TERM1", "260101", "1200", "TERM0", "", "9", "7"),
    ("MA5", "DETECTED TEMPERATURE", "600", "C"),
]


def a_file(body: list[tuple[str, ...]] = A_MACHINE, **options: object) -> bytes:
    return render_audit(body, **options)  # type: ignore[arg-type]


def lines_of(data: bytes) -> list[bytes]:
    return data.split(b"\r\n")


def test_a_complete_file_is_read_into_typed_fields_in_cents():
    audit = parse_audit(a_file())
    assert audit.sender == "KSK0000001"
    assert audit.decimal_places == 2
    assert audit.currency == "EUR"
    assert audit.machine is not None
    assert audit.machine.serial == "SN0001"
    assert audit.machine.asset_number == "A-17"
    assert audit.read_at == datetime(2026, 1, 14, 9, 30)
    assert audit.paid_vends == Counters.of(1250, 6, 500, 2)
    assert audit.cash_sales == Counters.of(750, 4, 250, 1)
    assert audit.cash_in is not None
    assert audit.cash_in.to_tubes_since_init == 700
    assert audit.cash_out is not None
    assert audit.cash_out.manually_dispensed_since_init == 20
    card = audit.cashless_device("DA")
    assert card is not None
    assert card.sales == Counters.of(500, 2, 250, 1)
    assert card.identity is not None
    assert card.identity.serial == "RDR-1"
    assert [p.column for p in audit.products] == ["11", "12"]
    assert audit.products[0].paid == Counters.of(750, 3, 250, 1)
    assert audit.products[1].last_sale == datetime(2026, 1, 13, 18, 2)
    assert [(s.product, s.device, s.sales.value_since_init) for s in audit.device_sales] == [
        ("11", "CA", 500),
        ("11", "DA", 250),
    ]
    assert audit.price_list_sales[0].count_since_init == 3
    assert audit.events[0].at == datetime(2026, 1, 10, 8, 15)
    assert audit.event_counts[0].active is True
    assert audit.reads is not None
    assert audit.reads.resets_since_init == 7
    assert audit.notes == ()


def test_an_lf_only_copy_reads_the_same_and_its_g85_holds():
    crlf, lf = parse_audit(a_file()), parse_audit(a_file(line_end=b"\n"))
    assert lf == crlf
    assert lf.check is not None


def test_a_file_without_g85_is_read_on_its_segment_count():
    audit = parse_audit(a_file(with_check=False))
    assert audit.check is None
    assert audit.paid_vends == Counters.of(1250, 6, 500, 2)


def test_trailing_spaces_count_in_the_check_and_leave_the_name():
    audit = parse_audit(a_file())
    cola = audit.products[0]
    assert cola.name == "Cola"
    assert next(s for s in audit.segments if s.line == cola.line).text.endswith("Cola  ")


def test_empty_elements_and_elements_left_out_are_none():
    audit = parse_audit(
        a_file([("VA1", "100", "1", "", ""), ("DA5", "", "", "", ""), ("CA2", "5")])
    )
    assert audit.paid_vends == Counters.of(100, 1, None, None)
    card = audit.cashless_device("DA")
    assert card is not None
    assert card.discounts is None
    assert audit.cash_sales == Counters(None)  # a value without its count: no pair known


def test_empty_since_initialisation_counts_are_not_sent_never_zero():
    audit = parse_audit(
        a_file(
            [
                ("VA1", "1250", "", "500", "2"),
                ("DA2", "", "", "250", "1"),
                ("PA1", "11", "250"),
                ("PA2", "", "", "1", "250"),
                ("PA7", "11", "DA", "0", "250", "", "", "1", "250"),
            ]
        )
    )
    assert audit.paid_vends == Counters(None, Tally(2, 500))
    assert audit.cashless["DA"] == Counters(None, Tally(1, 250))
    [column] = audit.products
    assert column.paid == Counters(None, Tally(1, 250))
    assert column.by_device["DA"] == Counters(None, Tally(1, 250))


def test_a_since_reset_pair_with_one_figure_empty_keeps_the_one_sent_never_a_zero():
    audit = parse_audit(
        a_file(
            [
                ("VA1", "1250", "6", "", "2"),
                ("DA2", "500", "2", "250", ""),
                ("PA1", "11", "250"),
                ("PA2", "3", "750", "1", ""),  # the Animo's form: vends since reset, no value
            ]
        )
    )
    vends, card, [column] = audit.paid_vends, audit.cashless["DA"], audit.products
    assert column.paid is not None
    for pair, count, value in ((vends, 2, None), (card, None, 250), (column.paid, 1, None)):
        assert pair.since_init is not None
        assert pair.since_reset is None  # half a pair: nothing compared or reset rests on it
        assert (pair.count_since_reset, pair.value_since_reset) == (count, value)  # as sent
        assert Counters.from_dict(pair.as_dict()) == pair  # stored and read back as it was


def test_a_pa7_without_counts_is_no_sales_known_even_beside_a_price_list_with_them():
    audit = parse_audit(
        a_file(
            [
                ("PA1", "11", "250"),
                ("PA7", "11", "DA", "0", "250", "3", "750", "1", "250"),
                ("PA7", "11", "DA", "1", "250"),  # its counts left out: not 0 sales
                ("PA7", "11", "CA", "0", "250", "2", "500"),
            ]
        )
    )
    [column] = audit.products
    assert column.by_device["DA"].since_init is None
    assert column.by_device["CA"] == Counters.of(500, 2)
    assert [s.sales.since_init for s in audit.device_sales] == [Tally(3, 750), None, Tally(2, 500)]


@pytest.mark.parametrize(
    ("body", "line", "tag", "first"),
    [
        ([("DA2", "500", "2"), ("VA1", "100", "1"), ("DA2", "700", "3")], 5, "DA2", 3),
        ([("VA1", "100", "1"), ("VA1", "100", "1")], 4, "VA1", 3),  # even the same figures
        ([("ID4", "2", "840", "USD"), ("ID4", "0")], 4, "ID4", 3),
        ([("ID1", "SN1"), ("CA2", "1", "1"), ("ID1", "SN2")], 5, "ID1", 3),
        ([("PA1", "11", "250"), ("PA2", "1", "250"), ("PA2", "2", "500")], 5, "PA2", 4),
        ([("PA1", "11", "250"), ("PA1", "12", "250"), ("PA1", "11 ", "300")], 5, "PA1", 3),
        (
            [("PA1", "11", "250"), ("PA7", "11", "DA", "0", "250", "1", "250"),
             ("PA7", "", "DA", "0", "250", "2", "500")],
            5, "PA7", 4,
        ),
    ],
)
def test_a_block_stated_twice_is_refused_naming_both_lines(body, line, tag, first):
    with pytest.raises(AuditError) as refused:
        parse_audit(a_file(body))
    assert (refused.value.line, refused.value.field) == (line, tag)
    assert f"a second {tag}" in refused.value.problem
    assert f"the first on line {first}" in refused.value.problem


@pytest.mark.parametrize(
    ("body", "tag", "where", "first", "line"),
    [
        ([("VA1", "100", "1"), ("VA2", "50", "1"), ("DA2", "100", "1"), ("VA2", "70", "2")],
         "VA2", "the file", 4, 6),
        ([("ID1", "SN1"), ("ID5", "20260114", "0930"), ("ID5", "20260115", "1000"),
          ("DA2", "100", "1")], "ID5", "the file", 4, 5),
        ([("DA1", "CARD-1"), ("DA2", "100", "1"), ("DA1", "CARD-2")], "DA1", "the file", 3, 5),
        ([("DA2", "100", "1"), ("EA3", "5"), ("EA3", "6")], "EA3", "the file", 4, 5),
        ([("PA1", "11", "250"), ("PA2", "1", "250"), ("PA3", "1", "0"), ("PA3", "2", "0"),
          ("DA2", "100", "1")], "PA3", "column 11", 5, 6),
    ],
)
def test_a_block_the_comparison_does_not_use_stated_twice_is_noted_and_not_read(
    body, tag, where, first, line
):
    # docs/audit.md: a block stated twice is unusable, but only that block; the file's DA2,
    # VA1 and columns are read as they would be without it
    audit = parse_audit(a_file(body))
    assert audit.notes == (
        f"line {line}, {tag}: a second {tag} for {where} (the first on line {first}): which one "
        f"the machine means cannot be known; no {tag} of {where} is read (the comparison does "
        "not use it)",
    )
    without = parse_audit(a_file([b for b in body if b[0] != tag]))
    assert figures_of(audit) == figures_of(without)
    assert audit.cashless == without.cashless == {"DA": Counters.of(100, 1)}
    # every copy is kept as sent, none read: which one the machine meant cannot be known
    assert [s.line for s in audit.other if s.tag == tag] == [first, line]
    assert (audit.test_vends, audit.read_at, audit.reads) == (None, None, None)
    assert audit.cashless_device("DA") == without.cashless_device("DA")
    assert all(p.test is None for p in audit.products)


def test_blocks_a_maker_invented_are_kept_as_sent():
    body = [("EA250705", "1", "x"), ("MA5", "DB", "0.10"), ("ZZ9",), ("VA1", "100", "1")]
    audit = parse_audit(a_file(body))
    assert [s.text for s in audit.other] == ["EA250705*1*x", "MA5*DB*0.10", "ZZ9"]


@pytest.mark.parametrize(
    ("price", "cents"),
    [("USD", None), ("EUR 1.50", 150), ("1,20 EUR", 120), ("EUR125", 125), ("", None)],
)
def test_a_price_with_its_currency_written_in_it(price, cents):
    audit = parse_audit(a_file([("PA1", "7", price, "Tea")]))
    assert audit.products[0].price == cents
    assert audit.products[0].name == "Tea"


def test_decimal_places_come_from_id4():
    one = parse_audit(a_file([("ID4", "1", "643"), ("VA1", "125", "1")]))
    three = parse_audit(a_file([("ID4", "3", "414", "KWD"), ("VA1", "1250", "1")]))
    assert one.paid_vends is not None
    assert one.paid_vends.value_since_init == 1250
    assert three.paid_vends is not None
    assert three.paid_vends.value_since_init == 125
    with pytest.raises(AuditError, match=r"line 4, VA101: .*whole number of cents"):
        parse_audit(a_file([("ID4", "3"), ("VA1", "1255", "1")]))


def test_a_wrong_segment_count_is_refused_without_g85():
    data = a_file([("VA1", "100", "1"), ("CA2", "100", "1")], with_check=False)
    data = data.replace(b"SE*4*", b"SE*5*")
    with pytest.raises(AuditError) as caught:
        parse_audit(data)
    assert (caught.value.line, caught.value.field) == (5, "SE01")
    assert "says 5 segments, the set has 4" in str(caught.value)


def test_a_wrong_segment_count_under_a_verified_g85_is_noted_not_refused():
    data = a_file([("VA1", "100", "1")]).replace(b"SE*4*", b"SE*3*")
    audit = parse_audit(data)
    assert audit.notes == (
        "line 5, SE01: says 3 segments, the set has 4 (ST to SE); G85 vouches for the data",
    )


def test_a_bad_check_value_names_g85_and_both_values():
    data = a_file([("VA1", "100", "1")]).replace(b"VA1*100", b"VA1*900")
    with pytest.raises(AuditError, match=r"^line 4, G8501: check value [0-9A-F]{4} does not match"):
        parse_audit(data)


def test_a_lost_line_is_caught_by_the_check():
    lines = lines_of(a_file())
    del lines[5]
    with pytest.raises(AuditError, match="G8501"):
        parse_audit(b"\r\n".join(lines))


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (
            [("VA1", "12x", "3")],
            "line 3, VA101: not an amount: expected up to 15 digits, got '12x'",
        ),
        ([("VA1", "1", "-3")], "line 3, VA102: expected a number, got '-3'"),
        ([("ID5", "20261340", "0930")], "line 3, ID501: no such date and time"),
        ([("ID5", "2026", "0930")], "line 3, ID501: expected YYMMDD or CCYYMMDD"),
        ([("PA1", "", "100")], "line 3, PA101: a product needs its identifier"),
        ([("PA1", "1"), ("PA7", "1", "", "0", "100")], "line 4, PA702: "),
        ([("EA2", "X", "1", "1", "", "yes")], "line 3, EA205: "),
        ([("ID4", "9")], "line 3, ID401: expected 0 to 6 decimal places"),
        ([("VA1", "1" * 16, "1")], "line 3, VA101: not an amount: expected up to 15 digits"),
        ([("va1", "1")], "line 3, segment id: expected an id like VA1, got 'va1'"),
    ],
)
def test_a_malformed_element_names_its_line_and_field(body, where):
    with pytest.raises(AuditError) as caught:
        parse_audit(a_file(body, with_check=False))
    assert str(caught.value).startswith(where)


@pytest.mark.parametrize(
    ("mangle", "where"),
    [
        (lambda d: d[: d.index(b"SE*")], "SE: the file ends before SE"),
        (lambda d: d[: d.index(b"DXE*")], "DXE: the file ends before DXE"),
        (lambda d: d + d, "DXE: data after DXE"),
        (lambda d: d.replace(b"DXS*", b"DXS "), "line 1, DXS: no DXS. anywhere in the file"),
        (lambda d: b"ST*0\r\n" + d.replace(b"\r\nST*", b"\r\nXX*"), "line 3, ST: DXS must be "),
        (lambda d: d.replace(b"ST*001*0001\r\n", b""), "line 2, ST: DXS must be followed by ST"),
        (lambda d: b"", "line 1, DXS: the file is empty"),
        (lambda d: d.replace(b"DXE*1*1", b"DXE*1*2"), "DXE02: says '2' sets"),
        (lambda d: d.replace(b"VA1*", b"ST*"), "line 3, ST: inside the set"),
    ],
)
def test_a_broken_envelope_is_refused_naming_where(mangle, where):
    with pytest.raises(AuditError, match=where):
        parse_audit(mangle(a_file([("VA1", "100", "1")])))


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (b"<000|AVSZONE003|N&W BlueRed|20191203|155622|daa|321>", b"<AAAA|BBBB>"),
        (b"\xef\xbb\xbf", b""),  # a byte order mark
        (b"\x00\x13\x11line noise\r\n\r\n", b"\x04"),  # noise lines, then EOT
        (b"", b"VA1*1*1\r\n"),
    ],
)
def test_what_a_collector_wrote_around_the_audit_is_left_out_and_noted(before, after):
    audit = parse_audit(before + a_file() + after)
    assert audit.paid_vends == parse_audit(a_file()).paid_vends
    assert audit.check is not None
    expected = []
    if before:
        expected.append(f"{len(before)} bytes before DXS left out")
    if after:
        expected.append(f"{len(after)} bytes after DXE left out")
    assert [note.split(" (")[0] for note in audit.notes] == expected


def test_a_trailer_on_the_dxe_line_itself_is_left_out():
    audit = parse_audit(a_file()[:-2] + b"<AAAA|BBBB>")
    assert audit.notes == ("11 bytes after DXE left out (a collector's trailer)",)


def test_lines_keep_their_number_in_the_file_after_a_wrapper_of_lines():
    wrapped = b"HEADER\r\nMORE HEADER\r\n" + a_file([("VA1", "1x", "2")], with_check=False)
    with pytest.raises(AuditError, match=r"^line 5, VA101: not an amount"):
        parse_audit(wrapped)


def test_a_wrapper_without_any_audit_is_refused():
    with pytest.raises(AuditError, match=r"^line 1, DXS: no DXS\* anywhere in the file"):
        parse_audit(b"<000|AVSZONE003|N&W BlueRed>\r\n<AAAA|BBBB>")


def test_debited_and_credited_amounts_go_to_their_own_fields_in_the_order_sent():
    audit = parse_audit(a_file([("DB1", "RDR-2"), ("DB3", "110", "990"), ("DB4", "220", "20")]))
    device = audit.cashless_device("DB")
    assert device is not None
    assert (device.debited_since_reset, device.debited_since_init) == (110, 990)
    assert (device.credited_since_init, device.credited_since_reset) == (220, 20)


def test_a_columns_pa7_lines_add_up_with_or_without_a_since_reset_pair():
    audit = parse_audit(
        a_file(
            [
                ("PA1", "7", "100"),
                ("PA7", "7", "CA", "0", "100", "2", "200", "1", "100"),
                ("PA7", "7", "CA", "1", "120", "1", "120", "1", "120"),
                ("PA7", "7", "DA", "0", "100", "3", "300"),
                ("PA7", "7", "DA", "1", "120", "1", "120", "1", "120"),
            ]
        )
    )
    [column] = audit.products
    assert column.by_device == {
        "CA": Counters.of(320, 3, 220, 2),
        "DA": Counters.of(420, 4, 120, 1),
    }


def test_what_the_reader_builds_quickly_is_what_the_constructors_build():
    """The reader sets the slots of its most frequent objects itself (audit/evadts.py,
    _tally): each must equal, hash and stay frozen as one its dataclass built."""
    audit = parse_audit(a_file())
    built = [*audit.segments, *audit.device_sales, *audit.products]
    built += [p.paid for p in audit.products if p.paid] + [audit.paid_vends]
    for made in built:
        again = type(made)(*(getattr(made, f.name) for f in dataclasses.fields(made)))
        assert made == again
        assert repr(made) == repr(again)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, dataclasses.fields(made)[0].name, None)
    tally = audit.paid_vends.since_init  # type: ignore[union-attr]
    assert hash(tally) == hash(Tally(tally.count, tally.value))
    assert tally == Tally(6, 1250)


def test_text_with_a_character_beyond_one_byte_is_refused_naming_its_line():
    text = a_file([("PA1", "1", "100", "Tea")]).decode().replace("Tea", "T€a")
    with pytest.raises(AuditError, match=r"^line 3, text: character '\\u20ac'"):
        parse_audit(text)


def test_a_block_after_g85_before_se_is_read_but_outside_the_check():
    data = a_file([("VA1", "100", "1")]).replace(b"SE*4*", b"CA2*100*1\r\nSE*5*")
    audit = parse_audit(data)
    assert audit.cash_sales == Counters.of(100, 1, None, None)


def test_the_crc_is_crc16_arc():
    assert crc16_arc(b"123456789") == 0xBB3D
    assert crc16_arc(b"6789", crc16_arc(b"12345")) == 0xBB3D


def test_the_writer_refuses_an_element_that_would_split_the_line():
    with pytest.raises(ValueError, match="separator or a line end"):
        render_audit([("PA1", "1", "Cola*Zero")])


# --- generated -------------------------------------------------------------------------------

_elements = st.text(st.sampled_from("0123456789AZaz ._-,/"), max_size=8)
_tags = st.sampled_from(
    [
        "VA1",
        "VA2",
        "CA2",
        "CA3",
        "DA2",
        "DB5",
        "PA1",
        "PA2",
        "PA7",
        "LA1",
        "ID1",
        "ID4",
        "ID5",
        "EA1",
        "EA2",
        "EA3",
        "MA5",
        "EA250705",
        "CB1",
    ]
)
_blocks = st.lists(st.tuples(_tags, st.lists(_elements, max_size=10)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_are_an_audit_or_an_audit_error(data):
    with contextlib.suppress(AuditError):
        assert isinstance(parse_audit(data), AuditFile)


@settings(max_examples=100, deadline=None)
@given(_blocks, st.booleans())
def test_generated_blocks_are_an_audit_or_an_audit_error_naming_a_line(blocks, with_check):
    data = render_audit([(tag, *elements) for tag, elements in blocks], with_check=with_check)
    refused = None
    try:
        parse_audit(data)
    except AuditError as err:
        refused = err
    assert refused is None or 3 <= refused.line <= len(blocks) + 2


_mutations = st.sampled_from(["delete", "insert", "replace", "drop line", "repeat line"])


@settings(max_examples=200, deadline=None)
@given(st.data(), _mutations)
def test_a_near_valid_file_is_read_or_refused_never_crashes(data, mutation):
    raw = bytearray(a_file())
    at = data.draw(st.integers(0, len(raw) - 1))
    if mutation == "delete":
        del raw[at]
    elif mutation == "insert":
        raw.insert(at, data.draw(st.integers(0, 255)))
    elif mutation == "replace":
        raw[at] = data.draw(st.integers(0, 255))
    else:
        lines = bytes(raw).split(b"\r\n")
        line = data.draw(st.integers(0, len(lines) - 1))
        lines[line : line + 1] = [] if mutation == "drop line" else [lines[line]] * 2
        raw = bytearray(b"\r\n".join(lines))
    try:
        audit = parse_audit(bytes(raw))
    except AuditError:
        return
    # Read anyway: only where the change left the data the check vouches for as it was.
    assert audit.paid_vends == parse_audit(a_file()).paid_vends or audit.check is None


@settings(max_examples=100, deadline=None)
@given(
    st.binary(max_size=120).filter(lambda b: b"DXS*" not in b),
    st.binary(max_size=120).filter(lambda b: b"DXE*" not in b),
    st.sampled_from([b"\r\n", b"\n"]),
)
def test_any_wrapper_around_an_audit_leaves_it_read_as_it_is(before, after, line_end):
    clean = parse_audit(a_file(line_end=line_end))
    audit = parse_audit(before + a_file(line_end=line_end) + after)
    shift = before.count(b"\n")  # each line keeps its number in the file as stored
    assert [(s.line - shift, s.tag, s.elements) for s in audit.segments] == [
        (s.line, s.tag, s.elements) for s in clean.segments
    ]
    assert [dataclasses.replace(p, line=p.line - shift) for p in audit.products] == list(
        clean.products
    )
    assert (audit.paid_vends, audit.cashless, audit.check) == (
        clean.paid_vends,
        clean.cashless,
        clean.check,
    )
    assert len(audit.notes) == bool(before) + bool(after.strip(b"\r\n"))


_count = st.integers(0, 10**6)
_tally = st.tuples(_count, _count, _count, _count)


@settings(max_examples=100, deadline=None)
@given(
    vends=_tally,
    cash=_tally,
    products=st.lists(
        st.tuples(st.integers(1, 99), _count, _tally), max_size=6, unique_by=lambda p: p[0]
    ),
    places=st.integers(0, 2),
    line_end=st.sampled_from([b"\r\n", b"\n"]),
)
def test_what_is_written_is_read_back(vends, cash, products, places, line_end):
    body = [("ID4", str(places), "840", "USD"), ("VA1", *map(str, vends)), ("CA2", *map(str, cash))]
    for selection, price, paid in products:
        body += [("PA1", str(selection), str(price), f"Item {selection}"), ("PA2", *map(str, paid))]
    audit = parse_audit(render_audit(body, line_end=line_end))
    scale = 10 ** (2 - places)
    assert audit.paid_vends == Counters.of(vends[0] * scale, vends[1], vends[2] * scale, vends[3])
    assert audit.cash_sales == Counters.of(cash[0] * scale, cash[1], cash[2] * scale, cash[3])
    assert [(p.column, p.price, p.paid) for p in audit.products] == [
        (str(s), price * scale, Counters.of(paid[1] * scale, paid[0], paid[3] * scale, paid[2]))
        for s, price, paid in products
    ]
    assert [s.text for s in audit.body()] == ["*".join(block) for block in body]
