"""Audit files from real machines of four makers: read, and their stated totals agree.

Each file states its totals more than once (VA1 against the columns' PA2, CA2 and DA2 against
the columns' PA7 by payment device); the reader's figures must agree where the machine's do.
Sources in tests/data/dex/README.md.
"""

from __future__ import annotations

from pathlib import Path

from kiosk_agent.audit import AuditFile, Counters, parse_audit

DATA = Path(__file__).parent.parent / "data" / "dex"


def read(name: str) -> AuditFile:
    return parse_audit((DATA / name).read_bytes())


def priced(audit: AuditFile) -> set[str]:
    """The columns but the zero-priced ones: those count events (no cup), not sales."""
    return {p.column for p in audit.products if p.price != 0}


def by_device(audit: AuditFile, device: str) -> Counters | None:
    sales = [
        s.sales for s in audit.device_sales if s.device == device and s.product in priced(audit)
    ]
    return Counters.of(
        sum(s.value_since_init or 0 for s in sales),
        sum(s.count_since_init or 0 for s in sales),
        sum(s.value_since_reset or 0 for s in sales),
        sum(s.count_since_reset or 0 for s in sales),
    )


def paid_columns(audit: AuditFile) -> Counters:
    paid = [p.paid for p in audit.products if p.paid is not None]
    return Counters.of(
        sum(p.value_since_init or 0 for p in paid),
        sum(p.count_since_init or 0 for p in paid),
        sum(p.value_since_reset or 0 for p in paid),
        sum(p.count_since_reset or 0 for p in paid),
    )


def test_jofemar_every_total_agrees():
    audit = read("jofemar.txt")
    assert audit.check == "F66D"
    assert audit.paid_vends == Counters.of(143500, 423, 142450, 421)
    assert paid_columns(audit) == audit.paid_vends
    card = audit.cashless_device("DA")
    assert card is not None
    assert audit.cash_sales == by_device(audit, "CA") == Counters.of(128250, 382, 127200, 380)
    assert card.sales == by_device(audit, "DA") == Counters.of(15250, 41, 15250, 41)


def test_rheavendors_columns_and_devices_agree_with_its_totals():
    audit = read("rheavendors-lucex2.eva_dts")
    assert audit.notes == (
        "line 370, SE01: says 349 segments, the set has 369 (ST to SE); G85 vouches for the data",
    )
    vends = audit.paid_vends
    assert vends is not None
    assert vends.value_since_init == paid_columns(audit).value_since_init == 586530
    assert vends.value_since_reset == paid_columns(audit).value_since_reset
    card, second = audit.cashless_device("DA"), audit.cashless_device("DB")
    assert card is not None
    assert second is not None
    assert audit.cash_sales == by_device(audit, "CA") == Counters.of(312330, 5443, 312330, 5423)
    assert card.sales == by_device(audit, "DA") == Counters.of(274200, 4156, 274200, 4156)
    # VA1's vends are the three devices' vends.
    assert vends.count_since_reset == 5423 + 4156 + (
        second.sales and second.sales.count_since_reset
    )
    assert audit.products[0].name == "KAFFEE SCHWARZ BOHNE"


def test_animo_columns_since_the_reset_make_its_vend_total():
    audit = read("animo-optime.eva_dts")
    assert audit.check == "B9AE"
    vends = audit.paid_vends
    assert vends == Counters.of(816100, 8161, 816100, 8161)
    # Its PA2 sends no value since the reset: each column's vends at its price make VA1.
    columns = [p for p in audit.products if p.paid is not None]
    assert sum(p.paid.count_since_reset or 0 for p in columns if p.paid) == vends.count_since_reset
    assert (
        sum((p.price or 0) * (p.paid.count_since_reset or 0) for p in columns if p.paid)
        == vends.value_since_reset
    )
    assert audit.currency == "EUR"


def test_nw_inside_its_telemetry_wrapping_agrees_since_the_reset():
    audit = read("nw-concerto.daa")  # its telemetry box's wrapper left out by the reader
    assert audit.notes[:2] == (
        "85 bytes before DXS left out (a collector's wrapper or line noise)",
        "11 bytes after DXE left out (a collector's trailer)",
    )
    assert audit.check == "5796"
    assert audit.decimal_places == 0
    vends = audit.paid_vends
    assert vends == Counters.of(0, 3699, 0, 49)  # a machine set to sell at no charge
    columns = paid_columns(audit)
    assert columns.count_since_reset == vends.count_since_reset
    # Since initialisation the machine counts one vend more in VA1 than in its columns.
    assert vends.count_since_init - columns.count_since_init == 1


def test_every_real_file_is_read_with_its_g85_verified():
    for path in sorted(DATA.glob("*")):
        if path.suffix == ".md":
            continue
        audit = parse_audit(path.read_bytes())  # as stored, wrappers and all
        assert audit.check is not None, path.name
        assert audit.products, path.name


def test_the_contracts_view_of_a_real_file():
    audit = read("jofemar.txt")
    assert audit.crc_checked
    assert audit.machine_serial == "JOF"
    assert audit.raw[0].tag == "ST"
    assert audit.cashless["DA"] == audit.cashless_device("DA").sales  # type: ignore[union-attr]
    # each column's PA7 lines, added up by device, make CA2 and DA2
    for device, total in (("CA", audit.cash_sales), ("DA", audit.cashless["DA"])):
        columns = [p.by_device[device] for p in audit.products if device in p.by_device]
        assert total is not None
        assert sum(c.since_init.value for c in columns) == total.since_init.value
        assert sum(c.since_init.count for c in columns) == total.since_init.count
