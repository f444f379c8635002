"""The reconciliation rule by example: the machine's card vends between two reads against the
journal's card sales of that interval (docs/audit.md)."""

from __future__ import annotations

import dataclasses

from kiosk_agent.audit.books import Figures, figures_of
from kiosk_agent.audit.evadts import Counters, Tally, parse_audit, render_audit
from kiosk_agent.audit.reconcile import CardSale, Comparison, Intervals, Side, changes, compare
from tests.audit.helpers import figures

TEN = 1_764_324_000.0  # a morning, Unix time


def sale(n: int, cents: int, product: str = "A1") -> CardSale:
    return CardSale(f"s{n}", cents, product, "completed", TEN + n)


def test_the_same_vends_on_both_sides_match() -> None:
    before = Side(TEN, figures((10, 1500)))
    after = Side(TEN + 3600, figures((12, 1800)))
    result = compare(before, after, [sale(1, 150), sale(2, 150)])
    assert result.verdict == "match"
    assert result.machine == result.journal == Tally(2, 300)


def test_a_vend_the_journal_does_not_hold_is_a_mismatch_naming_both_sides() -> None:
    before = Side(TEN, figures((10, 1500)))
    after = Side(TEN + 3600, figures((17, 2650)))
    sales = [sale(n, 150) for n in range(5)] + [sale(9, 200)]
    result = compare(before, after, sales)
    assert result.verdict == "mismatch"
    text = result.text()
    assert "the machine counted 7 card vends worth $11.50 since" in text
    assert "the journal holds 6 card vends worth $9.50" in text
    assert {s.sale_id for s in result.sales} == {"s0", "s1", "s2", "s3", "s4", "s9"}


def test_a_sale_for_a_vend_the_machine_never_made_is_a_mismatch() -> None:
    result = compare(Side(TEN, figures((3, 450))), Side(TEN + 60, figures((3, 450))),
                     [sale(1, 150)])
    assert result.verdict == "mismatch"
    assert result.machine == Tally(0, 0)
    assert result.journal == Tally(1, 150)


def test_a_counter_reset_compares_on_the_since_initialisation_counters() -> None:
    before = Side(TEN, figures((40, 6000), reset=(30, 4500)))
    after = Side(TEN + 60, figures((41, 6150), reset=(1, 150)))
    assert compare(before, after, [sale(1, 150)]).verdict == "match"
    assert [c.kind for c in changes(before.figures, after.figures)] == ["reset"]


def test_the_machines_books_gone_back_are_a_reset_not_a_mismatch_and_say_so() -> None:
    # 40 card vends since initialisation, then 1: its memory cleared (or a board replaced)
    result = compare(Side(TEN, figures((40, 6000))), Side(TEN + 60, figures((1, 150))),
                     [sale(1, 150)])
    assert (result.verdict, result.cause, result.machine) == ("books_reset", "reinitialised", None)
    assert not result.mismatch
    assert result.text() == (
        "the machine's books were reset between 2025-11-28 10:00:00Z and 2025-11-28 10:01:00Z "
        "(its memory cleared, a board replaced or a counter wrapped): its DA2 (cashless) since "
        "initialisation went down (40 worth $60.00 -> 1 worth $1.50); the journal's 1 card vend "
        "worth $1.50 of that interval are not checked; no mismatch: the next read compares from "
        "this one"
    )


def test_a_counter_moving_forward_by_more_or_less_than_the_journal_is_still_a_mismatch() -> None:
    # a reset is a counter that went back; forward by one vend too few, or too many, is not one
    before = Side(TEN, figures((40, 6000)))
    for after, held in ((figures((41, 6150)), 2), (figures((43, 6450)), 2)):
        result = compare(before, Side(TEN + 60, after), [sale(n, 150) for n in range(held)])
        assert (result.verdict, result.cause) == ("mismatch", "")


def test_a_reset_stored_before_it_had_its_own_verdict_reads_as_one() -> None:
    stored = {"verdict": "not_compared", "cause": "reinitialised", "since": TEN, "until": TEN + 60,
              "machine": None, "journal": {"count": 0, "value": 0},
              "reason": "the machine was re-initialised (or a counter wrapped): its DA2 (cashless)"
                        " since initialisation went down (40 worth $60.00 -> 1 worth $1.50)"}
    old = Comparison.of(stored)
    fresh = compare(Side(TEN, figures((40, 6000))), Side(TEN + 60, figures((1, 150))), [])
    assert (old.verdict, old.reason, old.text()) == (fresh.verdict, fresh.reason, fresh.text())


def test_another_machine_answering_is_not_compared() -> None:
    result = compare(Side(TEN, figures((4, 600), machine="VM-1")),
                     Side(TEN + 60, figures((5, 750), machine="VM-2")), [sale(1, 150)])
    assert result.verdict == "not_compared"
    assert "another machine" in result.reason
    assert result.text().endswith(
        "; check which machine the audit cable is on (or the board swapped): the next read "
        "compares from this one"), result.text()


def test_per_column_a_vend_in_the_wrong_column_is_a_mismatch() -> None:
    before = Side(TEN, figures((2, 300), columns={"A1": (150, 1, 1), "A2": (150, 1, 1)}))
    after = Side(TEN + 60, figures((3, 450), columns={"A1": (150, 2, 2), "A2": (150, 1, 1)}))
    result = compare(before, after, [sale(1, 150, "A2")])
    assert result.verdict == "mismatch"
    assert [(d.column, d.machine.count, d.journal.count) for d in result.columns] == [
        ("A1", 1, 0), ("A2", 0, 1)
    ]


def test_products_that_are_not_the_machines_columns_are_compared_in_total_only() -> None:
    before = Side(TEN, figures((2, 300), columns={"11": (150, 1, 1)}))
    after = Side(TEN + 60, figures((3, 450), columns={"11": (150, 2, 2)}))
    assert compare(before, after, [sale(1, 150, "A1")]).verdict == "match"


def test_changes_name_prices_and_columns_added_or_removed() -> None:
    before = figures((0, 0), columns={"A1": (150, 0, 0), "A2": (250, 0, 0)})
    after = figures((0, 0), columns={"A1": (175, 0, 0), "B1": (325, 0, 0)})
    assert [c.text for c in changes(before, after)] == [
        "column B1 added", "column A2 removed", "column A1 price $1.50 -> $1.75",
    ]


def test_a_comparison_reads_back_from_its_json_as_it_was() -> None:
    result = compare(Side(TEN, figures((1, 150), columns={"A1": (150, 1, 1)})),
                     Side(TEN + 5, figures((3, 450), columns={"A1": (150, 3, 3)})),
                     [sale(1, 150)])
    from kiosk_agent.audit.reconcile import Comparison

    assert Comparison.of(result.as_dict()).as_dict() == result.as_dict()


def test_a_read_whose_da2_since_initialisation_was_not_sent_is_not_compared() -> None:
    sent = figures((40, 6000))
    unsent = dataclasses.replace(sent, cashless=Counters(None, Tally(1, 150)))
    for before, after, which in (
        (sent, unsent, "this read's"), (unsent, sent, "the read before's")
    ):
        result = compare(Side(TEN, before), Side(TEN + 60, after), [sale(1, 150)])
        assert (result.verdict, result.cause, result.machine) == ("not_compared", "unsent", None)
        assert f"{which} DA2 (cashless) has no since-initialisation counts" in result.text()
        assert "not sent, not 0" in result.text()
        assert result.text().endswith(
            "; set the machine's audit to a full one with the cashless device's counters since "
            "initialisation (not since-reset only)"), result.text()
    # and no change is claimed on a figure that was not sent
    assert changes(sent, unsent) == [] == changes(unsent, sent)


def test_a_column_whose_pa7_sent_no_counts_is_said_not_compared_the_total_is() -> None:
    before = figures((2, 300), columns={"A1": (150, 1, 1), "A2": (150, 1, 1)})
    after = figures((3, 450), columns={"A1": (150, 2, 2), "A2": (150, 1, 1)})
    blank = dataclasses.replace(after.columns["A1"], cashless=Counters(None))
    after = dataclasses.replace(after, columns={**after.columns, "A1": blank})
    result = compare(Side(TEN, before), Side(TEN + 60, after), [sale(1, 150, "A1")])
    assert result.verdict == "match"  # the total, on counters the machine sent
    assert result.columns == ()
    assert result.unsent_columns == ("A1",)
    assert "not compared by column: A1" in result.text()


def test_a_machine_reinitialised_says_so_with_both_figures() -> None:
    result = compare(Side(TEN, figures((40, 6000))), Side(TEN + 60, figures((1, 150))), [])
    assert result.cause == "reinitialised"
    assert result.reason == (
        "its DA2 (cashless) since initialisation went down (40 worth $60.00 -> 1 worth $1.50)"
    )


def test_a_machine_reinitialised_whose_counters_climbed_back_is_still_seen() -> None:
    # 40 vends since initialisation, 10 since the tech's last reset; then re-initialised (both
    # to 0) and 41 vends: since initialisation +1, since the reset +31, no reset between
    before = Side(TEN, figures((40, 6000), reset=(10, 1500)))
    after = Side(TEN + 60, figures((41, 6150), reset=(41, 6150)))
    result = compare(before, after, [sale(n, 150) for n in range(41)])
    # the machine's own two counters prove the reset: no mismatch read off the +1
    assert (result.verdict, result.cause) == ("books_reset", "reinitialised")
    assert "grew by 1 worth $1.50 since initialisation but by 31 worth $46.50 since the reset" in (
        result.reason
    )
    assert "reinitialised" in [c.kind for c in changes(before.figures, after.figures)]


def test_a_techs_reset_then_more_vends_than_before_it_is_compared() -> None:
    # since the reset 10 -> 0 -> 12: it went up, but since initialisation went up more
    before = Side(TEN, figures((40, 6000), reset=(10, 1500)))
    after = Side(TEN + 60, figures((52, 7800), reset=(12, 1800)))
    result = compare(before, after, [sale(n, 150) for n in range(12)])
    assert result.verdict == "match"
    assert changes(before.figures, after.figures) == []


def test_a_since_reset_pair_sent_by_half_is_read_as_nothing_never_a_zero() -> None:
    # DA2 since the reset with its value left empty (1 vend of $1.50 in truth), then whole:
    # read as 0 the value "grew" $3.00 since the reset and $1.50 since initialisation, a
    # re-initialisation that never was; and a later half pair's 0 a reset that never was
    half = dataclasses.replace(figures((40, 6000)), cashless=Counters.of(6000, 40, None, 1))
    whole = dataclasses.replace(figures((41, 6150)), cashless=Counters.of(6150, 41, 300, 2))
    half_again = dataclasses.replace(figures((42, 6300)), cashless=Counters.of(6300, 42, None, 3))
    result = compare(Side(TEN, half), Side(TEN + 60, whole), [sale(1, 150)])
    assert (result.verdict, result.machine) == ("match", Tally(1, 150))
    assert changes(half, whole) == [] == changes(whole, half_again)


def test_a_unit_on_device_2_names_db2_in_every_reason_never_da2() -> None:
    def on_db(read: Figures) -> Figures:
        return dataclasses.replace(read, cashless_device="DB")

    sent, reinitialised = on_db(figures((40, 6000))), on_db(figures((1, 150)))
    unsent = dataclasses.replace(sent, cashless=Counters(None, Tally(1, 150)))
    none = dataclasses.replace(sent, cashless=None)
    reasons = [
        compare(Side(TEN, before), Side(TEN + 60, after), [sale(1, 150)]).text()
        for before, after in ((sent, reinitialised), (sent, unsent), (sent, none))
    ]
    assert "its DB2 (cashless) since initialisation went down" in reasons[0]
    assert "this read's DB2 (cashless) has no since-initialisation counts" in reasons[1]
    assert "a read has no DB2 (cashless) counters" in reasons[2]
    changed = [c.text for c in changes(sent, reinitialised)]
    assert changed[-1] == (
        "DB2 cashless since initialisation went down (40 worth $60.00 -> 1 worth $1.50)"
    )
    assert not any("DA2" in text for text in reasons + changed)
    assert Figures.of(sent.as_dict()) == sent  # the device is stored with the read
    assert Figures.of({k: v for k, v in sent.as_dict().items() if k != "cashless_device"}) == (
        dataclasses.replace(sent, cashless_device="DA")  # a read stored before: device 1
    )


def test_the_figures_of_a_file_name_the_device_they_were_taken_for() -> None:
    audit = parse_audit(
        render_audit([("ID1", "SN1"), ("DA2", "250", "1"), ("DB2", "500", "2")])
    )
    assert (figures_of(audit, "DB").cashless_device, figures_of(audit).cashless_device) == (
        "DB", "DA"
    )
    assert figures_of(audit, "DB").cashless == Counters.of(500, 2)


def test_the_cashless_device_changed_between_reads_is_not_compared_and_says_what_to_do() -> None:
    # DA2's counters then DB2's (the unit's cashless_device set to DB between the reads, or the
    # unit moved on the machine's bus): the difference of two devices' counters is no vend count
    on_da = figures((40, 6000), columns={"A1": (150, 40, 40)})
    on_db = dataclasses.replace(  # DB2 says 3 vends, VA1 and PA2 go on from 40
        figures((43, 6450), columns={"A1": (150, 43, 3)}),
        cashless=Counters(Tally(3, 450)), cashless_device="DB",
    )
    on_da_again = figures((45, 6750), columns={"A1": (150, 45, 45)})  # DA2 went on 40 -> 45
    for before, after, was, now in ((on_da, on_db, "DA2", "DB2"),
                                    (on_db, on_da_again, "DB2", "DA2")):
        result = compare(Side(TEN, before), Side(TEN + 60, after), [sale(1, 150)])
        assert (result.verdict, result.cause, result.machine) == ("not_compared", "device", None)
        assert result.columns == () == result.unsent_columns
        assert f"the cashless device compared changed: {was} (cashless) then {now} (cashless)" in (
            result.reason
        )
        assert "the journal holds 1 card vend worth $1.50" in result.text()
        assert result.text().endswith(
            "; set dex: cashless_device to the device the unit is on the machine's bus (DA: 1, "
            "DB: 2): the next read compares from this one"), result.text()
        # the change says the device, not a re-initialisation read off two devices' counters
        assert [(c.kind, c.text) for c in changes(before, after)] == [
            ("device", f"cashless device {was} -> {now}")
        ]


def test_a_stretch_sums_its_intervals_and_names_each_mismatch_even_when_the_sums_agree() -> None:
    # three intervals: a match, a vend the journal lacks, a sale the machine never vended; the
    # two faults cancel in the sums, so the sums alone would say all is well
    reads = [figures((10, 1500)), figures((12, 1800)), figures((14, 2100)), figures((15, 2250))]
    held = [[sale(1, 150), sale(2, 150)], [sale(3, 150)], [sale(4, 150), sale(5, 150)]]
    found = tuple(compare(Side(TEN + 60 * n, reads[n]), Side(TEN + 60 * (n + 1), reads[n + 1]),
                          held[n]) for n in range(3))
    stretch = Intervals(TEN, found)
    assert [c.verdict for c in stretch.comparisons] == ["match", "mismatch", "mismatch"]
    assert stretch.machine == stretch.journal == Tally(5, 750)
    assert stretch.verdict == "mismatch"
    assert stretch.total() == (
        "in all, 3 intervals from 2025-11-28 10:00:00Z to 10:03:00Z: the machine counted 5 card "
        "vends worth $7.50; the journal holds 5 card vends worth $7.50; MISMATCH in 2 intervals: "
        "2025-11-28 10:01:00Z to 10:02:00Z, 2025-11-28 10:02:00Z to 10:03:00Z"
    )
    lines = stretch.lines()
    assert lines[0] == ("2025-11-28 10:00:00Z to 10:01:00Z  match: the machine counted 2 card "
                        "vends worth $3.00; the journal holds 2 card vends worth $3.00")
    assert lines[1].endswith("MISMATCH: the machine counted 2 card vends worth $3.00; the journal "
                             "holds 1 card vend worth $1.50 (sales in the interval: s3)")
    assert lines[3] == stretch.total()


def test_a_reset_of_the_books_stays_out_of_the_sums_said_apart_with_the_journals_side() -> None:
    first = compare(Side(TEN, figures((10, 1500))), Side(TEN + 60, figures((12, 1800))),
                    [sale(1, 150), sale(2, 150)])
    reset = compare(Side(TEN + 60, figures((12, 1800))), Side(TEN + 120, figures((1, 150))),
                    [sale(3, 150)])
    after = compare(Side(TEN + 120, figures((1, 150))), Side(TEN + 180, figures((2, 300))),
                    [sale(4, 150)])
    stretch = Intervals(TEN, (first, reset, after))
    assert (stretch.verdict, stretch.machine, stretch.journal) == (
        "not_checked", Tally(3, 450), Tally(3, 450))
    assert stretch.journal_not_checked == Tally(1, 150)
    assert stretch.total().endswith(
        "; not checked: 1 interval (2025-11-28 10:01:00Z to 10:02:00Z, the machine's books "
        "reset), the journal's 1 card vend worth $1.50 of them outside these sums")
    assert "books reset: its DA2 (cashless) since initialisation went down" in stretch.lines()[1]
    assert Intervals(TEN).total() == (
        "in all since 2025-11-28 10:00:00Z: no interval compared (a comparison needs two reads "
        "taken while no sale of the machine ran)")


def test_intervals_not_checked_are_each_named_apart() -> None:
    reset = compare(Side(TEN, figures((12, 1800))), Side(TEN + 60, figures((1, 150))), [])
    again = compare(Side(TEN + 60, figures((1, 150))), Side(TEN + 120, figures((0, 0))),
                    [sale(1, 150)])
    assert Intervals(TEN, (reset, again)).total() == (
        "in all, 2 intervals from 2025-11-28 10:00:00Z to 10:02:00Z: none compared; not checked: "
        "2 intervals (2025-11-28 10:00:00Z to 10:01:00Z, the machine's books reset; 2025-11-28 "
        "10:01:00Z to 10:02:00Z, the machine's books reset), the journal's 1 card vend worth "
        "$1.50 of them outside these sums")
