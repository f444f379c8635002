"""`kiosk-agent events` and `health --watch` follow a running agent, as a tech at the machine
runs them: a real process reading the admin API's event stream, ended with Ctrl-C."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.admin import page
from kiosk_agent.app import load_agent
from kiosk_agent.cli.events import Filters, event_line
from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.states import SaleState
from tests.admin.conftest import ADMIN_TOKEN, write_config
from tests.admin.test_server import _sell
from tests.assembly.crash_driver import PipedCommand
from tests.child_signals import send_signal, stop
from tests.helpers import free_port, walk_to

WAIT_S = 20.0  # the longest any wait here lasts (a busy 2-core machine)


async def _follow(admin_server: Any, *argv: str) -> PipedCommand:
    """``kiosk-agent ARGV --url ...`` as its own process (forked from the test process's warm
    server, not a cold interpreter's 0.2 s of imports), once its stream is open."""
    env = {**os.environ, "KIOSK_AGENT_TOKEN": ADMIN_TOKEN}
    env.pop("KIOSK_CONFIG", None)
    proc = await PipedCommand.start([*argv, "--url", admin_server.url], env)
    deadline = time.monotonic() + WAIT_S
    while admin_server.page._streams == 0:  # the follower listens
        assert proc.returncode is None, (await proc.communicate())[1]
        assert time.monotonic() < deadline, "the follower never opened the stream"
        await asyncio.sleep(0.02)
    return proc


@pytest.fixture
def quiet_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's stream sends nothing unasked (its keepalive an hour away): a follower that
    ends on Ctrl-C within WAIT_S did not wait for the stream's next line. (A bound of 2 s on
    the follower's whole exit read 2.02 s at load 11-15: an interpreter's exit, not a wait.)"""
    monkeypatch.setattr(page, "KEEPALIVE_S", 3600.0)


async def _interrupt(proc: PipedCommand) -> tuple[int, str]:
    send_signal(proc, signal.SIGINT)
    _out, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
    return proc.returncode or 0, err.decode()


async def test_events_show_a_sales_steps_in_order_and_end_on_ctrl_c(
    agent: Any, admin_server: Any, quiet_stream: None
) -> None:
    proc = await _follow(admin_server, "events", "--kind", "sale", "--terminal", "SIM-0007",
                         "--json")
    try:
        final = await _sell(agent, 250)
        steps: list[dict[str, Any]] = []
        assert proc.stdout is not None
        async with asyncio.timeout(WAIT_S):
            while not steps or steps[-1]["step"] != "receipt":
                event = json.loads(await proc.stdout.readline())  # one object a line
                if event["sale_id"] == final.sale_id:
                    steps.append(event)
        code, err = await _interrupt(proc)
    finally:
        await stop(proc)
    # the steps as the journal has them, in its order, each once
    journaled = [s.step for s in agent.journal.steps(final.sale_id)]
    assert [e["step"] for e in steps] == journaled
    assert {e["kind"] for e in steps} == {"sale"}
    assert steps[-1]["state"] == "completed"
    assert steps[-1]["money"] == "$2.50 charged"
    assert code == 130  # interrupted, as the contract's exit table says
    assert "Traceback" not in err


async def test_events_take_a_terminal_by_its_configured_name(
    agent: Any, admin_server: Any
) -> None:
    """`--terminal printer` (SIM-0007's name in the configuration, as triggers name it) showed
    nothing at all: only a device id matched."""
    proc = await _follow(admin_server, "events", "--kind", "sale", "--terminal", "printer",
                         "--json")
    try:
        final = await _sell(agent, 250)  # on SIM-0007
        assert proc.stdout is not None
        async with asyncio.timeout(WAIT_S):
            event = json.loads(await proc.stdout.readline())
        code, _err = await _interrupt(proc)
    finally:
        await stop(proc)
    assert (event["sale_id"], event["terminal"]) == (final.sale_id, "SIM-0007")
    assert code == 130


async def test_events_name_a_reader_that_stops_taking_cards(
    agent: Any, admin_server: Any
) -> None:
    proc = await _follow(admin_server, "events", "--kind", "problem", "--kind", "status")
    try:
        agent.health.report_terminal("SIM-0001", online=False, detail="ping: terminal offline")
        assert proc.stdout is not None
        lines = []
        async with asyncio.timeout(WAIT_S):
            while len(lines) < 2:
                lines.append((await proc.stdout.readline()).decode())
        code, _err = await _interrupt(proc)
    finally:
        await stop(proc)
    assert lines[0].split("  ", 1)[1].strip() == "status      status ok -> degraded"
    assert "problem: terminal SIM-0001 offline" in lines[1]
    assert code == 130


async def test_health_watch_prints_the_health_again_when_it_changes(
    agent: Any, admin_server: Any, quiet_stream: None
) -> None:
    proc = await _follow(admin_server, "health", "--watch", "--json")
    try:
        assert proc.stdout is not None
        first = json.loads(await asyncio.wait_for(proc.stdout.readline(), WAIT_S))
        agent.health.report_terminal("SIM-0001", online=False, detail="ping: terminal offline")
        second = json.loads(await asyncio.wait_for(proc.stdout.readline(), WAIT_S))
        code, err = await _interrupt(proc)
    finally:
        await stop(proc)
    assert first["status"] == "ok"
    assert second["status"] == "degraded"
    assert code == 130
    assert "Traceback" not in err


async def test_health_watch_prints_no_health_again_when_only_the_pages_platforms_moved(
    agent: Any, admin_server: Any, quiet_stream: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream sends ``health`` again when only the page's platforms moved (a machine's
    tally, at each customer): `health --watch` prints health when health changed. Before, a
    busy demo's watch printed the same health again and again (31 of 46 snapshots in 8 s)."""
    tally = {"customers": 0}
    looks: list[int] = []  # the stream's looks at the platforms, each with the tally it saw

    def platforms() -> list[dict[str, Any]]:
        looks.append(tally["customers"])
        return [{"name": "virtual:snacks", "status": {"virtual": dict(tally)}}]

    monkeypatch.setattr(admin_server.page, "_platforms", platforms)
    proc = await _follow(admin_server, "health", "--watch", "--json")
    try:
        assert proc.stdout is not None
        first = json.loads(await asyncio.wait_for(proc.stdout.readline(), WAIT_S))
        for customer in (1, 2, 3):  # each a health event sent again, the health the same
            tally["customers"] = customer
            seen = len([c for c in looks if c == customer])
            async with asyncio.timeout(WAIT_S):  # sent, and the stream's next look after it
                while len([c for c in looks if c == customer]) < seen + 2:
                    await asyncio.sleep(0.02)
        agent.health.report_terminal("SIM-0001", online=False, detail="ping: terminal offline")
        second = json.loads(await asyncio.wait_for(proc.stdout.readline(), WAIT_S))
        code, err = await _interrupt(proc)
    finally:
        await stop(proc)
    assert first["status"] == "ok"
    assert second["status"] == "degraded"  # the next line printed: no "ok" again between
    assert code == 130
    assert "Traceback" not in err


def test_a_terminal_the_agent_does_not_have_is_named_once() -> None:
    health = {"terminals": [{"device_id": "SIM-0001", "name": "front"},
                            {"device_id": "SIM-0007", "name": None}]}
    assert Filters(terminal="front").learn(health) is None
    assert Filters(terminal="SIM-0007").learn(health) is None
    assert Filters(terminal="SIM-001").learn(health) == (
        "warning: this agent has no terminal 'SIM-001' (it has SIM-0001 (front), SIM-0007)"
    )
    assert Filters().learn(health) is None


def test_filters_pick_by_terminal_sale_and_kind() -> None:
    sale = {"sale_id": "3f2a9c0d", "order_id": "ka-1", "terminal": "SIM-0007", "step": "created"}
    assert Filters(terminal="SIM-0007").wants("sale", sale)
    assert not Filters(terminal="SIM-0001").wants("sale", sale)
    assert Filters(sale="3f2a").wants("sale", sale)
    assert Filters(sale="ka-1").wants("sale", sale)
    assert not Filters(sale="ka").wants("sale", sale)  # an order id is whole
    assert not Filters(sale="3f2a").wants("problem", {"text": "x"})
    assert not Filters(kinds=frozenset({"problem"})).wants("sale", sale)
    note = {"kind": "availability", "device_id": "SIM-0001", "text": "SIM-0001 cannot take cards"}
    assert Filters(terminal="SIM-0001").wants("availability", note)
    line = event_line("sale", {**sale, "at": 0, "state": "started", "money": "$5.00 requested"})
    assert line.endswith("SIM-0007    sale 3f2a9c0d  created -> started  $5.00 requested")
    late = event_line("sale", {**sale, "at": 3600.0, "state": "started"})
    assert late.startswith("01:00:00Z  ")  # UTC, said, whatever the zone of the machine


def test_an_event_line_shows_outside_words_and_never_obeys_them() -> None:
    sale = {"sale_id": "3f2a9c0d", "terminal": "SIM-0007", "step": "charge_card.declined",
            "state": "declined", "money": "nothing charged", "at": 0,
            "message": "declined (\x1b[2J\x1b]0;owned\x07Do not honor\u202e)\nnext"}
    line = event_line("sale", sale)
    for char in ("\x1b", "\x07", "\u202e"):
        assert char not in line
    assert "\n" not in line  # one event, one line
    assert line.endswith("declined (\ufffd[2J\ufffd]0;owned\ufffdDo not honor\ufffd) next")
    note = event_line("problem", {"at": 0, "text": "problem: \x1b[31mred"})
    assert note.endswith("problem: \ufffd[31mred")


def _burst(agent: Any, count: int) -> list[str]:
    """``count`` sale steps published at once (no reader runs meanwhile): more than a
    subscriber's queue holds. Their sale ids, in order."""
    from kiosk_agent.sales.model import SaleEvent
    from kiosk_agent.sales.states import SaleState, Step

    ids = [f"burst{n:011d}" for n in range(count)]
    for sale_id in ids:
        agent.events.publish(SaleEvent(
            sale_id=sale_id, order_id=f"o-{sale_id}", source="burst", state=SaleState.STARTED,
            amount_cents=100, terminal="SIM-0007", at=time.time(), step=Step.CREATED,
        ))  # fmt: skip
    return ids


async def test_a_reader_that_fell_behind_is_told_how_many_steps_it_missed_and_where(
    agent: Any, admin_server: Any
) -> None:
    """Before: a reader slower than the agent lost the steps past its 256-item queue without a
    word, and showed a history with a hole as if it were whole."""
    proc = await _follow(admin_server, "events", "--kind", "sale", "--json")
    try:
        ids = _burst(agent, 300)  # the stream's queue holds 256: the first 44 are lost
        assert proc.stdout is not None
        lines: list[dict[str, Any]] = []
        async with asyncio.timeout(WAIT_S):
            while not lines or lines[-1].get("sale_id") != ids[-1]:
                lines.append(json.loads(await proc.stdout.readline()))
        code, err = await _interrupt(proc)
    finally:
        await stop(proc)
    shown = [line for line in lines if line.get("sale_id", "").startswith("burst")
             or line["kind"] == "gap"]
    assert shown[0] == {**shown[0], "kind": "gap", "missed": 44}  # where the hole is
    assert [line["sale_id"] for line in shown[1:]] == ids[44:]  # then the rest, each once
    assert "warning: 44 event(s) missed here: this reader fell behind the agent" in err
    assert code == 130


async def test_events_follow_the_agent_through_a_restart_and_fetch_what_they_missed(
    tmp_path: Path, sim_settings: Any
) -> None:
    """Before: `events` exited 4 when the agent restarted. Now it says it reconnects, comes
    back on its own, and shows the steps journaled while it was away, each once."""
    path = write_config(tmp_path)
    path.write_text(path.read_text().replace("admin:\n  port: 0", f"admin:\n  port: {free_port()}"))
    first = load_agent(path, sim_settings, systemd=False)
    await first.start()
    proc = await _follow(_admin(first), "events", "--kind", "sale", "--json")
    second = None
    try:
        before = await _sell(first, 250)
        seen = await _lines_until(proc, before.sale_id, "receipt")
        await first.stop()
        assert proc.stderr is not None
        said = (await asyncio.wait_for(proc.stderr.readline(), WAIT_S)).decode()
        assert said.startswith(f"reconnecting to the agent at {_admin(first).url}: ")

        missed = _a_sale_journaled_meanwhile(tmp_path / "journal.db")
        second = load_agent(path, sim_settings, systemd=False)
        await second.start()
        said = (await asyncio.wait_for(proc.stderr.readline(), WAIT_S)).decode()
        steps = len(second.journal.steps(missed))
        assert said == (f"reconnected to the agent at {_admin(first).url}; {steps} event(s) "
                        "missed were fetched\n")
        after = await _sell(second, 250)
        seen += await _lines_until(proc, after.sale_id, "receipt")
        code, err = await _interrupt(proc)
    finally:
        await stop(proc)
        if second is not None:
            await second.stop()
    shown = [(e["sale_id"], e["step"]) for e in seen]
    for sale_id in (before.sale_id, missed, after.sale_id):
        assert [step for s, step in shown if s == sale_id] == [
            s.step for s in _steps(tmp_path / "journal.db", sale_id)
        ], sale_id  # every step, in order, each once
    assert code == 130
    assert "Traceback" not in err


def _admin(agent: Any) -> Any:
    return next(c for c in agent.components if type(c).__name__ == "AdminServer")


async def _lines_until(
    proc: PipedCommand, sale_id: str, step: str
) -> list[dict[str, Any]]:
    assert proc.stdout is not None
    lines: list[dict[str, Any]] = []
    async with asyncio.timeout(WAIT_S):
        while not lines or (lines[-1]["sale_id"], lines[-1]["step"]) != (sale_id, step):
            lines.append(json.loads(await proc.stdout.readline()))
    return lines


def _a_sale_journaled_meanwhile(path: Path) -> str:
    """A sale the next agent finds finished in the journal, its steps written while no agent
    ran: what a follower away at that moment missed."""
    journal = Journal(path)
    journal.open()
    try:
        record = journal.create(SaleRecord(
            sale_id="meanwhile-0001", order_id="ka-meanwhile", source="test",
            flow="charge_card", terminal="SIM-0007", amount_cents=250, state=SaleState.STARTED,
        ))  # fmt: skip
        walk_to(journal, record, SaleState.DECLINED, message="declined (Do not honor)")
    finally:
        journal.close()
    return record.sale_id


def _steps(path: Path, sale_id: str) -> list[Any]:
    journal = Journal(path)
    journal.open_to_read()
    try:
        return journal.steps(sale_id)
    finally:
        journal.close()


def test_a_terminal_filter_keeps_every_problem_and_clear_about_that_terminal() -> None:
    """Before: `--terminal SIM-0001` dropped "problem: terminal SIM-0001 offline" (a problem
    note carried no device)."""
    from kiosk_agent.admin.page import health_changes

    terminals = [{"device_id": "SIM-0001", "name": "front"}, {"device_id": "SIM-0007"}]
    ok = {"status": "ok", "problems": [], "terminals": terminals}
    down = {**ok, "status": "degraded", "problems": ["terminal SIM-0001 offline ping: no answer",
                                                     "terminal SIM-0007 offline"]}
    notes = {n["text"]: n for n in health_changes(ok, down) + health_changes(down, ok)}
    assert notes["problem: terminal SIM-0001 offline ping: no answer"]["device_id"] == "SIM-0001"
    assert notes["cleared: terminal SIM-0001 offline ping: no answer"]["device_id"] == "SIM-0001"
    by_name = Filters(terminal="front")
    assert by_name.learn({"terminals": terminals}) is None
    kept = [t for t, n in notes.items() if by_name.wants(n["kind"], n)]
    assert kept == ["problem: terminal SIM-0001 offline ping: no answer",
                    "cleared: terminal SIM-0001 offline ping: no answer"]
    # an older agent's note, with no device: the text names it
    assert Filters(terminal="SIM-0001").wants("problem", {"text": "problem: terminal SIM-0001 "
                                                                  "offline", "device_id": None})
    assert not Filters(terminal="SIM-000").wants("problem", {"text": "problem: terminal "
                                                                     "SIM-0001 offline"})


def test_a_card_session_of_no_selection_is_said_not_to_be_a_sale() -> None:
    """The rule of every face (sales.kinds): `events` says so where the session ends."""
    from kiosk_agent.admin.page import sale_event_view
    from kiosk_agent.sales.model import SaleEvent
    from kiosk_agent.sales.states import SaleState, Step

    walked = SaleEvent(sale_id="c0ffee00", order_id="o-1", source="virtual:coffee",
                       state=SaleState.REVERSED, amount_cents=500, terminal="SIM-0008",
                       step=Step.REVERSE_DONE, flow="authorize_capture", at=1.0)
    line = event_line("sale", sale_event_view(walked))
    assert line.endswith("(card session ended with no selection: not a sale)"), line
    chose = dataclasses.replace(walked, product="K1")  # the vend failed: a sale, reversed
    assert "not a sale" not in event_line("sale", sale_event_view(chose))
