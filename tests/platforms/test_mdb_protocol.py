"""The MDB adapter's text protocol: every line both ends say, parsed and formatted."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.money import MAX_CENTS
from kiosk_agent.platforms import mdb_protocol as wire
from kiosk_agent.platforms.mdb_protocol import AmountUnit, ControllerStatus


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("c,STATUS,ENABLED", wire.StatusChanged(ControllerStatus.ENABLED)),
        ("c,STATUS,INACTIVE\r", wire.StatusChanged(ControllerStatus.INACTIVE)),
        ("c,STATUS,IDLE,5.00", wire.StatusChanged(ControllerStatus.IDLE, 500)),
        ("c,STATUS,VEND,2.50,12", wire.VendRequested(250, "12")),
        ("c,VEND,SUCCESS", wire.VendSucceeded()),
        ("c,ERR,VEND 3", wire.VendFailed("VEND 3")),
        ("c,ERR,START -1", wire.AdapterError("START -1")),
        ("r,ACK", wire.Chatter("r,ACK")),
        ("c,1", wire.Chatter("c,1")),
        ("d,STATUS,IDLE", wire.Chatter("d,STATUS,IDLE")),
    ],
)
def test_adapter_lines(line: str, message: wire.AdapterMessage) -> None:
    assert wire.parse_adapter_line(line) == message


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("hello", "not an adapter line"),
        ("c,STATUS", "STATUS without a state"),
        ("c,STATUS,SLEEPING", "unknown status 'SLEEPING'"),
        ("c,STATUS,VEND,2.50", "needs exactly an amount and a product"),
        ("c,STATUS,VEND,2.50,A1,extra", "needs exactly an amount and a product"),
        ("c,STATUS,IDLE,5.00,9", "at most one amount"),
        ("c,STATUS,VEND,2.505,A1", "bad amount: expected dollars like \"2.50\", got '2.505'"),
        ("c,STATUS,VEND,abc,A1", "bad amount: .* got 'abc'"),
        ("c,STATUS,VEND,-1.00,A1", "bad amount: .* got '-1.00'"),
        # the attack review's lines: each was once charged
        ("c,STATUS,VEND,1e2,A1", "bad amount: .* got '1e2'"),
        ("c,STATUS,VEND,1_0.00,A1", "bad amount: .* got '1_0.00'"),
        ("c,STATUS,VEND,\u0662.\u0665\u0660,A1", "bad amount"),
        ("c,STATUS,VEND,1,5", "bad amount: .* got '1'"),
        ("c,STATUS,VEND, 1.00,A1", "bad amount"),
        ("c,STATUS,VEND,+1.00,A1", "bad amount"),
        ("c,STATUS,VEND,99999999.00,A1", "bad amount"),
        ("c,STATUS,VEND,1e999990,A1", "bad amount: .* got '1e999990'"),
        ("c,FOO,1", "unknown adapter message 'FOO'"),
    ],
)
def test_bad_adapter_lines_name_the_problem(line: str, error: str) -> None:
    with pytest.raises(wire.ProtocolError, match=error):
        wire.parse_adapter_line(line)


def test_cents_unit_for_firmwares_that_send_integers() -> None:
    assert wire.parse_adapter_line("c,STATUS,VEND,250,A1", AmountUnit.CENTS) == (
        wire.VendRequested(250, "A1")
    )
    assert wire.approve_vend(250, AmountUnit.CENTS) == "C,VEND,250"
    with pytest.raises(wire.ProtocolError, match="expected cents like"):
        wire.parse_adapter_line("c,STATUS,VEND,2.50,A1", AmountUnit.CENTS)
    with pytest.raises(wire.ProtocolError, match="expected cents like"):
        wire.parse_adapter_line("c,STATUS,VEND,9999999999,A1", AmountUnit.CENTS)


def test_agent_commands_round_trip() -> None:
    assert wire.setup_commands(0x10) == ["C,0", "C,SETCONF,mdb-addr=0x10", "C,1"]
    assert wire.approve_vend(250) == "C,VEND,2.50"
    assert wire.start_session(500) == "C,START,5.00"
    assert wire.deny_vend() == "C,STOP"
    assert wire.parse_agent_line("C,VEND,2.50") == wire.AgentCommand("VEND", 250)
    assert wire.parse_agent_line("C,START,5.00") == wire.AgentCommand("START", 500)
    assert wire.parse_agent_line("C,SETCONF,mdb-addr=0x10").argument == "mdb-addr=0x10"
    assert wire.parse_agent_line("C,STOP") == wire.AgentCommand("STOP")
    with pytest.raises(wire.ProtocolError, match="needs an amount"):
        wire.parse_agent_line("C,VEND")


def test_controller_lines_parse_back() -> None:
    line = wire.vend_request_line(325, "B1")
    assert line == "c,STATUS,VEND,3.25,B1"
    assert wire.parse_adapter_line(line) == wire.VendRequested(325, "B1")
    assert wire.parse_adapter_line(wire.VEND_FAILED_LINE) == wire.VendFailed("VEND 3")
    assert wire.parse_adapter_line(wire.status_line(ControllerStatus.IDLE, 500)) == (
        wire.StatusChanged(ControllerStatus.IDLE, 500)
    )


# -- properties: any line from the adapter ------------------------------------------------------

ADAPTER_LINES = st.one_of(
    st.text(max_size=300),
    st.builds(
        lambda status, amount, product: f"c,STATUS,{status},{amount},{product}",
        st.sampled_from(["VEND", "IDLE", "ENABLED", "vend"]),
        st.one_of(st.text(max_size=30), st.from_regex(r"[0-9.e+_-]{0,15}", fullmatch=True)),
        st.text(max_size=10),
    ),
    st.lists(st.sampled_from(["c", "C", "STATUS", "VEND", "ERR", "SUCCESS", "1.00", "A1", ""]),
             max_size=7).map(",".join),
)


@given(line=ADAPTER_LINES, unit=st.sampled_from(list(AmountUnit)))
def test_any_adapter_line_is_a_message_or_a_clear_error(line: str, unit: AmountUnit) -> None:
    started = time.perf_counter()
    try:
        message = wire.parse_adapter_line(line, unit)
    except wire.ProtocolError as err:
        error = str(err)  # says what was wrong
        assert error
    else:
        if isinstance(message, wire.VendRequested):
            # a vend request carries an amount written in the one strict grammar
            amount_text = line.strip().split(",")[3]
            assert amount_text.isascii()
            assert amount_text.replace(".", "").isdigit()
            assert message.amount_cents == int(amount_text.replace(".", ""))
            assert 0 <= message.amount_cents <= MAX_CENTS
    assert time.perf_counter() - started < 1.0
