"""What a sale is (kiosk_agent.sales.kinds): the rule in Python and in the journal's SQL agree,
and read as examples."""

from __future__ import annotations

import dataclasses
import sqlite3
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.sales.kinds import NO_SELECTION_SQL, SaleKind, Tally, kind_sql, no_selection
from kiosk_agent.sales.states import Flow, SaleState


@dataclass(frozen=True)
class Row:
    flow: str
    product: str | None
    vended_cents: int
    captured_cents: int
    state: SaleState
    source: str = "mdb:coffee"
    resolved: bool = False


SESSION = Row(Flow.AUTHORIZE_CAPTURE, None, 0, 0, SaleState.REVERSED)  # a walk-away: hold released


def test_a_card_session_that_ended_with_nothing_chosen_and_nothing_kept_is_not_a_sale() -> None:
    assert no_selection(SESSION)
    assert no_selection(Row(Flow.AUTHORIZE_CAPTURE, "", 0, 0, SaleState.CANCELLED))  # no one came
    assert no_selection(Row(Flow.AUTHORIZE_CAPTURE, None, 0, 0, SaleState.FAILED))  # read expired
    # a choice, money kept, a charge in one call, or a sale a person must decide: sales
    assert not no_selection(Row(Flow.AUTHORIZE_CAPTURE, "K1", 0, 0, SaleState.REVERSED))
    assert not no_selection(Row(Flow.AUTHORIZE_CAPTURE, None, 180, 180, SaleState.COMPLETED))
    assert not no_selection(Row(Flow.CHARGE_CARD, None, 0, 0, SaleState.DECLINED))
    assert not no_selection(Row(Flow.AUTHORIZE_CAPTURE, None, 0, 0, SaleState.ATTENTION))
    # one a person resolved; a kiosk app's or a serial device's sale that named no product
    assert not no_selection(dataclasses.replace(SESSION, resolved=True))
    assert not no_selection(dataclasses.replace(SESSION, source="kiosk_api:app"))
    assert not no_selection(dataclasses.replace(SESSION, source="serial_line:locker"))
    assert no_selection(dataclasses.replace(SESSION, source="virtual:coffee"))


def test_the_tally_counts_sales_by_their_end_and_the_sessions_apart() -> None:
    tally = Tally()
    for row in (SESSION, SESSION, Row(Flow.AUTHORIZE_CAPTURE, "K1", 180, 180,
                                      SaleState.COMPLETED),
                Row(Flow.AUTHORIZE_CAPTURE, "A1", 0, 0, SaleState.FAILED)):
        tally.add(row)
    assert tally.text() == (
        "2 sales, 1 completed, 1 failed; captured $1.80; "
        "2 card sessions ended with no selection, $0.00 kept"
    )


rows = st.builds(
    Row,
    flow=st.sampled_from([f.value for f in Flow]),
    product=st.sampled_from([None, "", "K1"]),
    vended_cents=st.sampled_from([0, 180]),
    captured_cents=st.sampled_from([0, 180]),
    state=st.sampled_from(list(SaleState)),
    source=st.sampled_from(["mdb:coffee", "virtual:coffee", "kiosk_api:app", "mdbx:odd", "gpio:x"]),
    resolved=st.booleans(),
)


@given(st.lists(rows, max_size=20))
def test_the_journals_query_and_the_python_rule_agree(drawn: list[Row]) -> None:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE sales (id INTEGER, flow TEXT, product TEXT, vended_cents INTEGER,"
               " captured_cents INTEGER, state TEXT, source TEXT, resolution TEXT)")
    db.executemany("INSERT INTO sales VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [
        (n, r.flow, r.product, r.vended_cents, r.captured_cents, r.state.value, r.source,
         '{"as": "reversed"}' if r.resolved else None)
        for n, r in enumerate(drawn)
    ])

    def ids(condition: str) -> set[int]:
        where = f" WHERE {condition}" if condition else ""
        return {n for (n,) in db.execute(f"SELECT id FROM sales{where}")}  # noqa: S608

    apart = {n for n, r in enumerate(drawn) if no_selection(r)}
    assert ids(NO_SELECTION_SQL) == ids(kind_sql(SaleKind.NO_SELECTION)) == apart
    assert ids(kind_sql(SaleKind.SALE)) == set(range(len(drawn))) - apart
    assert ids(kind_sql(SaleKind.ALL)) == set(range(len(drawn)))
