"""`kiosk-agent run | check-config | sales` as a field tech types them."""

from __future__ import annotations

import asyncio
import csv
import gc
import io
import json
import os
import signal
import sqlite3
import subprocess
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent import cli
from kiosk_agent.cli import main
from kiosk_agent.cli.contract import EXIT_FAILED, EXIT_OK, EXIT_USAGE, STOP_SIGNALS, StopSignals
from kiosk_agent.cli.sales import parse_since
from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.states import SaleState, Step
from tests.assembly.crash_driver import WarmCommands, warm_command
from tests.child_signals import SignalledChild
from tests.helpers import walk_to

GOOD = """\
service:
  simulator: {time_scale: 300}
terminals: [{device_id: SIM-0001, name: front}]
journal: {path: journal.db}
"""


def write(directory: Path, text: str) -> Path:
    path = directory / "config.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_check_config_summarises_a_good_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD)
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}: valid" in out
    assert "embedded simulator (time scale 300)" in out
    assert "terminals: SIM-0001" in out


def test_check_config_prints_every_mistake_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        """\
        service:
          base_url: https://pay.example.com
          api_key: sk_live_inline
          mid: "1"
        terminals: [{device_id: SIM-0001}]
        receipts: {print: sometimes}
        """,
    )
    assert main(["check-config", str(path)]) == 2  # a broken config file: exit 2 everywhere
    err = capsys.readouterr().err
    assert "config.yaml:3: service.api_key: a secret is written inline" in err
    assert "config.yaml:6: receipts.print: value must be one of" in err
    assert "2 mistakes in" in err
    assert "Traceback" not in err
    assert "sk_live_inline" not in err


def test_check_config_names_each_bad_value_with_its_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        """\
        service: {simulator: {}}
        terminals: [{device_id: SIM-0001}]
        receipts: {email: maybe}
        triggers:
          - platform: virtual
            products:
              A1: "1.5x"
              A2: "2.50"
              A3: abc
        """,
    )
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert ("config.yaml:3: receipts.email: expected true or false, got 'maybe' "
            "(fix: write `email: true` or `email: false`)") in err
    # each bad price, not only the first
    assert 'config.yaml:7: triggers[0].products.A1: expected an amount like "2.50", got' in err
    assert 'config.yaml:9: triggers[0].products.A3: expected an amount like "2.50", got' in err
    assert "2.50'" not in err
    assert "3 mistakes in" in err


def test_check_config_warns_of_a_serial_port_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        """\
        service: {simulator: {}}
        terminals: [{device_id: SIM-0001}]
        triggers:
          - platform: mdb
            name: front
            port: /dev/ttyUSB77
        """,
    )
    assert main(["check-config", str(path)]) == 0  # valid: it may be meant for another machine
    out, err = capsys.readouterr()
    assert f"{path}: valid" in out
    assert err.startswith(
        "warning: config.yaml:6: triggers[0].port: /dev/ttyUSB77 does not exist on this machine "
        "(serial ports here: "
    ), err
    assert main(["check-config", str(path), "--json"]) == 0
    [warning] = json.loads(capsys.readouterr().out)["warnings"]
    assert "/dev/ttyUSB77 does not exist" in warning


def test_check_config_takes_a_glob_port_as_the_serial_transport_opens_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a glob (which the transport opens as its first match) was warned of as a port
    that does not exist, whatever was plugged in."""
    (tmp_path / "ttyACM0").touch()
    config = """\
        service: {simulator: {}}
        terminals: [{device_id: SIM-0001}]
        triggers:
          - platform: mdb
            name: front
            port: PORT
        """
    path = write(tmp_path, config.replace("PORT", f"{tmp_path}/ttyACM*"))
    assert main(["check-config", str(path)]) == 0
    assert capsys.readouterr().err == ""
    path = write(tmp_path, config.replace("PORT", f"{tmp_path}/ttyUSB*"))
    assert main(["check-config", str(path)]) == 0
    assert f"triggers[0].port: {tmp_path}/ttyUSB* does not exist" in capsys.readouterr().err


def fill_journal(directory: Path) -> None:
    journal = Journal(directory / "journal.db")
    journal.open()
    for n, state in enumerate([SaleState.COMPLETED, SaleState.DECLINED, SaleState.COMPLETED]):
        sale = journal.create(
            SaleRecord(
                sale_id=f"s{n}",
                order_id=f"KA{n}",
                source="mdb:front",
                flow="charge_card",
                terminal="SIM-0001",
                amount_cents=150 + n,
                state=SaleState.STARTED,
            )
        )
        walk_to(
            journal, sale, state, captured_cents=150 + n if state.value == "completed" else 0
        )
    journal.close()


def test_sales_export_as_csv_and_json_filtered_by_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD)
    fill_journal(tmp_path)
    assert main(["sales", "--config", str(path), "--format", "csv", "--state", "completed"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["order_id"], r["amount"], r["captured"]) for r in rows] == [
        ("KA2", "1.52", "1.52"),
        ("KA0", "1.50", "1.50"),
    ]
    assert main(["sales", "--config", str(path), "--format", "json", "--since", "1h"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [s["state"] for s in listed] == ["completed", "declined", "completed"]
    assert main(["sales", "--config", str(path)]) == 0
    table = capsys.readouterr().out
    assert "KA1" in table
    assert table.rstrip().endswith("3 sales")


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_sales_and_sales_attention_read_a_journal_on_a_full_or_read_only_disk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str
) -> None:
    """They opened the journal to write (a migration, its WAL): on a full disk, "cannot open
    the journal: disk I/O error"; on a read-only one, "unable to open database file", just when
    a tech needs to see what the journal holds. They only read now, in place or from a copy."""
    from tests.assembly.disk_helpers import fill, small_disk

    with small_disk(tmp_path / "disk") as disk:
        path = write(disk, GOOD)
        fill_journal(disk)
        if fault == "full":
            fill(disk)
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        try:
            assert main(["sales", "--config", str(path), "--format", "json"]) == 0
            listed = json.loads(capsys.readouterr().out)
            assert [s["order_id"] for s in listed] == ["KA2", "KA1", "KA0"]
            assert main(["sales", "attention", "--config", str(path)]) == 0
            assert "0 sales in attention" in capsys.readouterr().out
            assert main(["sales", "show", "s1", "--config", str(path)]) == 0
            assert "declined" in capsys.readouterr().out
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
        assert not list(Path(tempfile.gettempdir()).glob("kiosk-agent-journal-*"))


def test_sales_shows_the_newest_and_says_how_many_more_like_journalctl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD)
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    for n in range(30):
        journal.create(SaleRecord(
            sale_id=f"s{n:02}", order_id=f"KA{n:02}", source="mdb:front", flow="charge_card",
            terminal="SIM-0001", amount_cents=100 + n, state=SaleState.STARTED,
            created_at=1_700_000_000 + n,
        ))  # fmt: skip
    journal.close()
    assert main(["sales", "-c", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.rstrip().endswith("25 sales")
    assert "KA29" in out
    assert "KA04" not in out  # the 5 oldest are left out, and said to be
    assert err == "5 more (older); use --limit N or --all\n"
    assert main(["sales", "-c", str(path), "--all"]) == 0
    out, err = capsys.readouterr()
    assert out.rstrip().endswith("30 sales")
    assert err == ""
    assert main(["sales", "-c", str(path), "--limit", "3"]) == 0
    assert capsys.readouterr().err == "27 more (older); use --limit N or --all\n"
    # an export is every sale unless told: a file, not a screen
    assert main(["sales", "-c", str(path), "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 31
    assert main(["sales", "-c", str(path), "--limit", "3", "--all"]) == 2
    assert "give --limit N or --all, not both" in capsys.readouterr().err


def test_sales_show_prints_one_sale_with_its_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD)
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    sale = journal.create(SaleRecord(
        sale_id="3f2a9c0d11", order_id="ka-3f2a", source="virtual:coffee",
        flow="authorize_capture", terminal="SIM-0007", amount_cents=500,
        state=SaleState.STARTED, created_at=1_700_000_000,
    ))  # fmt: skip
    # the steps an authorize-capture sale goes through, as the state table allows them
    sale = journal.record(sale, Step.READ_CARD_REQUEST, SaleState.READING_CARD)
    sale = journal.record(sale, Step.READ_CARD_DONE, card_brand="2", last_four="2397")
    sale = journal.record(sale, Step.AUTHORIZE_REQUEST, SaleState.AUTHORIZING)
    sale = journal.record(sale, Step.AUTHORIZE_APPROVED, authorized_cents=500,
                          trans_id="700000000009")
    sale = journal.record(sale, Step.DISPENSE_REQUEST, SaleState.DISPENSING)
    sale = journal.record(sale, Step.CAPTURE_REQUEST, SaleState.CAPTURING)
    journal.record(sale, Step.COMPLETED, SaleState.COMPLETED, captured_cents=180,
                   message="paid $1.80 (captured)")
    journal.close()
    assert main(["sales", "show", "3f2a", "-c", str(path)]) == 0
    out = capsys.readouterr().out
    assert "money       $1.80 charged\n" in out
    assert "authorized  $5.00\n" in out
    assert "card        Mastercard 2397\n" in out
    assert "steps (8):" in out
    steps = [line.split()[2] for line in out.splitlines() if line.startswith("  20")]
    assert steps == ["created", "read_card.request", "read_card.done", "authorize.request",
                     "authorize.approved", "dispense.request", "capture.request", "completed"]
    # by order id, and as the admin API's GET /api/sales/{id} answers
    assert main(["sales", "show", "ka-3f2a", "-c", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["sale"]["captured_cents"] == 180
    assert [s["step"] for s in shown["steps"]] == steps
    assert main(["sales", "show", "nope", "-c", str(path)]) == 1
    assert "no sale 'nope' in the journal" in capsys.readouterr().err


def test_sales_with_a_bad_since_says_what_it_expected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD)
    fill_journal(tmp_path)
    assert main(["sales", "--config", str(path), "--since", "last week"]) == 2
    assert (
        '--since: expected "today", "yesterday", "2026-11-22", "2026-11-22T10:00:00Z", or back '
        'from now: "90m", "24h"' in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        # past what a datetime holds: was "unexpected OverflowError ... (please report this)"
        (["--since", "99999999w"], "--since: expected"),
        # past SQLite's INTEGER: was "unexpected OverflowError: Python int too large"
        (["--limit", "99999999999999999999999"], "--limit: expected at most 9223372036854775807"),
        (["--limit", "\u0663"], "--limit: expected a whole number, got '\u0663'"),  # Arabic 3
        (["--limit", "+5"], "--limit: expected a whole number, got '+5'"),  # as the API says
        (["--limit", "0"], "--limit: expected a number above zero, got '0'"),
    ],
)
def test_sales_refuses_a_moment_or_limit_out_of_range_as_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    path = write(tmp_path, GOOD)
    fill_journal(tmp_path)
    try:
        code = main(["sales", "--config", str(path), *argv])
    except SystemExit as refused:  # argparse's own usage error
        code = refused.code
    assert code == 2
    err = capsys.readouterr().err
    assert said in err
    assert "unexpected" not in err


def test_parse_since_relative_and_absolute() -> None:
    assert parse_since("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_since("2026-11-01T00:00:00+00:00") == 1793491200.0


async def test_run_sells_on_the_embedded_simulator_and_stops_on_sigterm(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        GOOD
        + textwrap.dedent(
            """\
            sales: {interaction_lifetime: 0.6}
            logging: {format: json}
            triggers:
              - platform: virtual
                name: lobby
                gap: [0.05, 0.1]
                fail_rate: 0
                walk_away_rate: 0
                dispense_time: 0.05
                seed: 4
            """
        ),
    )
    log = tmp_path / "agent.log"  # a file, not a pipe: a full pipe would stall the agent
    # a process of its own, forked from the test process's warm interpreter (WarmCommands)
    commands = await asyncio.to_thread(WarmCommands.shared)
    agent = await asyncio.to_thread(
        commands.start, ["run", "--config", str(path)], dict(os.environ), log
    )
    child = SignalledChild(agent)
    try:
        async with asyncio.timeout(30):  # a hang's guard
            while _completed_in(tmp_path / "journal.db") < 3:
                assert agent.returncode is None, log.read_text()[-3000:]
                await asyncio.sleep(0.2)
        # read beside the running agent by another process, as a tech would
        code, out, listing_err = await warm_command(
            ["sales", "--config", str(path), "--format", "json", "--state", "completed"],
            tmp_path,
        )  # fmt: skip
        assert code == 0, listing_err
        assert len(json.loads(out)) >= 3, log.read_text()[-3000:]
        child.send(signal.SIGTERM)
        async with asyncio.timeout(20):
            code = await agent.wait()
    finally:
        await child.close()
    err = log.read_text()
    assert code == 0, err[-3000:]
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any("ready in" in line["msg"] for line in lines)


def _completed_in(journal: Path) -> int:
    """Sales completed in ``journal`` so far, read as any reader beside the agent would."""
    if not journal.exists():
        return 0
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)
    try:
        return int(db.execute("SELECT count(*) FROM sales WHERE state = 'completed'").fetchone()[0])
    except sqlite3.OperationalError:  # created, its tables not yet
        return 0
    finally:
        db.close()


def test_check_config_show_prints_the_resolved_config_with_secrets_masked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "secrets.yaml").write_text("api_key: sk_live_123\n")
    (tmp_path / "secrets.yaml").chmod(0o600)
    path = write(
        tmp_path,
        """\
        service:
          base_url: https://pay.example.com
          api_key: !secret api_key
          mid: "1"
        terminals: [{device_id: SIM-0001}]
        """,
    )
    assert main(["check-config", "--show", "-c", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "api_key: '***'" in shown
    assert "journal:" in shown  # defaults filled in
    assert main(["check-config", str(path), "--show", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["valid"] is True
    assert answer["config"]["service"]["api_key"] == "***"
    assert "sk_live_123" not in json.dumps(answer)


def test_check_config_json_gives_each_mistake_by_its_parts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD.replace("journal: {path: journal.db}", "jornal: {}"))
    assert main(["check-config", str(path), "--json"]) == 2
    answer = json.loads(capsys.readouterr().out)
    assert answer["valid"] is False
    [mistake] = answer["errors"]
    assert mistake == {
        "file": "config.yaml", "line": 4, "column": None, "path": "jornal",
        "message": "unknown section 'jornal'", "fix": "did you mean 'journal'?",
        "text": "config.yaml:4: jornal: unknown section 'jornal' (fix: did you mean 'journal'?)",
    }


def test_check_config_show_prints_the_same_text_every_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The loader fills defaults in no fixed order; --show sorts every mapping, so two runs
    (or two units) can be compared with diff."""
    import yaml

    path = write(tmp_path, GOOD)
    assert main(["check-config", "--show", "-c", str(path)]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert main(["check-config", "--show", "--json", "-c", str(path)]) == 0
    as_json = json.loads(capsys.readouterr().out)["config"]

    def sorted_everywhere(value: Any) -> bool:
        if isinstance(value, dict):
            return list(value) == sorted(value) and all(map(sorted_everywhere, value.values()))
        if isinstance(value, list):
            return all(map(sorted_everywhere, value))
        return True

    assert sorted_everywhere(shown)
    assert sorted_everywhere(as_json)
    assert shown["sales"]["retries"] == 2  # defaults filled in


def test_sales_attention_shows_an_open_sale_that_has_not_moved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # as a running agent leaves it on disk while its journal cannot take the next step
    path = write(tmp_path, GOOD)
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    held = journal.create(
        SaleRecord(sale_id="9a8b7c6d5e", order_id="KAHELD", source="kiosk_api:screen",
                   flow="charge_card", terminal="SIM-0001", amount_cents=250,
                   state=SaleState.STARTED)
    )  # fmt: skip
    journal.record(held, "charge_card.request", SaleState.CHARGING)
    journal.db.execute("UPDATE sales SET updated_at = updated_at - 120")
    journal.close()

    assert main(["sales", "attention", "-c", str(path)]) == EXIT_FAILED  # a cron job alerts
    listed = capsys.readouterr().out
    assert "9a8b7c6d5e  KAHELD  kiosk_api:screen  open (charging) since" in listed
    assert "not moved for 120 s" in listed
    # the count says what was listed (before: "0 sales in attention", exit 1, i42-newcomer)
    assert listed.splitlines()[-1] == (
        "0 sales in attention, 1 open sale not moving (the agent finishes it)")
    assert main(["sales", "attention", "-c", str(path), "--json"]) == EXIT_FAILED
    [stalled] = json.loads(capsys.readouterr().out)["stalled_open"]
    assert stalled["state"] == "charging"
    # NTP stepped the clock back an hour since its last step: still shown, not hidden an hour
    db = sqlite3.connect(tmp_path / "journal.db")
    with db:
        db.execute("UPDATE sales SET updated_at = updated_at + 120 + 3600")
    db.close()
    assert main(["sales", "attention", "-c", str(path)]) == EXIT_FAILED
    listed = capsys.readouterr().out
    assert "9a8b7c6d5e  KAHELD  kiosk_api:screen  open (charging) since" in listed
    assert "after now (the clock was stepped back since)" in listed


def test_sales_attention_lists_another_units_open_sales_and_resolve_only_records_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29: a journal adopted under a new id holds the original unit's open sale (money
    held). `sales attention` lists it with why, never as one the agent finishes, and exits 1;
    `sales resolve` writes the person's word and nothing else (no money step), and it is gone
    from the list. Checked against what the journal holds (unit_ids, the sale's steps)."""
    from kiosk_agent.sales import unit
    from kiosk_agent.sales.machine import Machine

    path = write(tmp_path, GOOD)
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    made = unit.load(journal.db, journal.path, Machine("e" * 32, "serial:a1"))
    theirs = journal.create(SaleRecord(
        sale_id="0c1a0e5a1e", order_id=made.order_id("0c1a0e5a1e00beef"), source="mdb:front",
        flow="authorize_capture", terminal="SIM-0001", amount_cents=250,
        state=SaleState.STARTED,
    ))  # fmt: skip
    theirs = walk_to(journal, theirs, SaleState.CAPTURING, authorized_cents=250,
                     vended_cents=250, trans_id="700000001234")
    journal.db.execute("UPDATE sales SET updated_at = updated_at - 120")  # and not moved since
    _, adopted = unit.adopt(journal.db, journal.path, Machine("e" * 32, "serial:b2"))
    ours = journal.create(SaleRecord(
        sale_id="0a0a0a0a0a", order_id=unit.make_order_id(adopted.unit_id, adopted.key,
                                                          "0a0a0a0a0a00cafe"),
        source="mdb:front", flow="charge_card", terminal="SIM-0001", amount_cents=100,
        state=SaleState.STARTED,
    ))  # fmt: skip
    history = unit.rows(journal.db)
    before = journal.steps("0c1a0e5a1e")
    journal.close()
    assert [r.unit_id for r in history] == [made.id, adopted.unit_id]

    why = (f"made by unit {history[0].unit_id} before this journal was adopted: its money is "
           "that unit's; the agent will not move it")
    assert main(["sales", "attention", "-c", str(path)]) == EXIT_FAILED  # a cron job alerts
    listed = capsys.readouterr().out
    assert f"0c1a0e5a1e  {theirs.order_id}  mdb:front" in listed
    assert "open (capturing) since" in listed
    assert why in listed
    assert "the agent finishes it" not in listed  # not said of another unit's sale
    assert ours.sale_id not in listed  # this unit's own, just begun
    assert "0 sales in attention, 1 open sale(s) of another unit id; resolve each with" in listed
    assert main(["sales", "attention", "-c", str(path), "--json"]) == EXIT_FAILED
    shown = json.loads(capsys.readouterr().out)
    assert shown["stalled_open"] == []
    [other] = shown["other_unit_open"]
    assert (other["sale_id"], other["state"], other["why"]) == ("0c1a0e5a1e", "capturing", why)

    assert main(["sales", "resolve", "0c1a", "--as", "captured", "--why", "the original unit "
                 "captured it (its portal)", "-c", str(path)]) == EXIT_OK
    capsys.readouterr()
    journal.open_to_read()
    record = journal.get("0c1a0e5a1e")
    steps = journal.steps("0c1a0e5a1e")
    journal.close()
    assert record is not None
    assert record.state is SaleState.COMPLETED
    assert record.trans_id == "700000001234"
    assert steps[:len(before)] == before
    put, decided = steps[len(before):]  # only the person's word: no money call, no capture
    assert (put.step, put.state, put.detail) == (
        "attention.resolved", SaleState.ATTENTION, {"not_this_units": why})
    assert (decided.step, decided.state) == ("attention.resolved", SaleState.COMPLETED)
    assert main(["sales", "attention", "-c", str(path), "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["other_unit_open"] == []
    # this unit's own open sale is not a person's to resolve
    assert main(["sales", "resolve", ours.sale_id, "--as", "captured", "--why", "x",
                 "-c", str(path)]) == 1
    assert "started, not attention" in capsys.readouterr().err


def test_sales_attention_lists_what_a_person_must_decide_and_resolve_records_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD)
    fill_journal(tmp_path)
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    stuck = journal.create(
        SaleRecord(sale_id="3f2a9c0d1e", order_id="KASTUCK", source="mdb:front",
                   flow="authorize_capture", terminal="SIM-0001", amount_cents=250,
                   state=SaleState.STARTED)
    )  # fmt: skip
    walk_to(journal, stuck, SaleState.ATTENTION, Step.CAPTURE_FAILED, authorized_cents=250,
            vended_cents=250, message="dispensed, but the capture failed twice")  # fmt: skip
    journal.close()

    assert main(["sales", "attention", "-c", str(path)]) == EXIT_FAILED  # a sale waits
    listed = capsys.readouterr().out
    assert "3f2a9c0d1e  KASTUCK  mdb:front  $2.50 held, undecided  since" in listed
    assert "capture failed twice" in listed
    assert "1 sale in attention; resolve each with" in listed
    # a charge whose answer was lost holds nothing known: it said "held $0.00"
    journal.open()
    lost = journal.create(SaleRecord(
        sale_id="77aa", order_id="KALOST", source="mdb:front", flow="charge_card",
        terminal="SIM-0001", amount_cents=333, state=SaleState.STARTED,
    ))  # fmt: skip
    walk_to(journal, lost, SaleState.ATTENTION, Step.CHARGE_CARD_UNKNOWN)
    journal.close()
    assert main(["sales", "attention", "-c", str(path)]) == EXIT_FAILED
    listed = capsys.readouterr().out
    assert "77aa  KALOST  mdb:front  $3.33, outcome unknown  since" in listed
    assert "$0.00" not in listed
    assert main(["sales", "resolve", "77aa", "--as", "reversed", "--why", "no charge in the "
                 "portal", "-c", str(path)]) == 0
    capsys.readouterr()

    # a unique start of the id is enough, as the list prints whole ids
    argv = ["sales", "resolve", "3f2a", "--as", "Captured", "--why", "captured in the portal"]
    assert main([*argv, "-c", str(path), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["sale"]["state"] == "completed"
    assert answer["sale"]["resolution"]["as"] == "captured"
    assert answer["sale"]["resolution"]["by"].startswith("cli (")
    assert answer["sale"]["captured_cents"] == 250

    assert main(["sales", "attention", "-c", str(path), "--json"]) == EXIT_OK  # none waits
    assert json.loads(capsys.readouterr().out) == {
        "sales": [], "stalled_open": [], "other_unit_open": []}
    # resolving twice is refused, and says why
    assert main([*argv, "-c", str(path)]) == 1
    assert "completed, not attention" in capsys.readouterr().err


def test_a_run_that_ends_before_settling_leaves_the_collector_running(tmp_path: Path) -> None:
    """`run` pauses the collector for start-up (assembly/collector.py); a run that ends before its
    agent settles, here on a missing configuration, resumes it."""
    assert gc.isenabled()
    assert main(["run", "--config", str(tmp_path / "missing.yaml")]) == EXIT_USAGE
    assert gc.isenabled()


def test_a_stop_signal_while_run_still_imports_is_kept_not_left_to_its_default() -> None:
    """Ctrl-C while `run` imports would be a traceback, SIGQUIT a core dump: from its first
    line `run` keeps each stop signal for its handlers, which take it once they are in place."""
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    try:
        # as a service manager starts it; a shell's background job inherits SIGQUIT ignored,
        # which `run` rightly leaves so (nohup's SIGHUP likewise)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
        cli._keep_early_stops()
        os.kill(os.getpid(), signal.SIGQUIT)
        assert cli.EARLY_STOPS == [signal.SIGQUIT]

        async def handlers_in_place() -> StopSignals:
            taken = StopSignals("stopping").install()
            taken.remove()
            return taken

        taken = asyncio.run(handlers_in_place())
        assert taken.received is signal.SIGQUIT
        assert taken.exit_code == STOP_SIGNALS[signal.SIGQUIT]
        assert cli.EARLY_STOPS == []
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        cli.EARLY_STOPS.clear()


def test_a_run_stopped_before_its_handlers_starts_nothing(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    config = tmp_path / "config.yaml"
    config.write_text(f"service: {{simulator: {{}}}}\nterminals: [{{device_id: SIM-0001}}]\n"
                      f"journal: {{path: {journal}}}\n")
    cli.EARLY_STOPS.append(signal.SIGINT)  # as a Ctrl-C during the imports leaves it
    try:
        assert main(["run", "--config", str(config)]) == STOP_SIGNALS[signal.SIGINT]
    finally:
        cli.EARLY_STOPS.clear()
    assert not journal.exists()  # no journal opened, no simulator, no agent


def _many_sales(directory: Path, count: int) -> None:
    """``count`` completed sales, straight into SQLite (a busy machine's months in a second)."""
    fill_journal(directory)
    journal = Journal(directory / "journal.db")
    journal.open()
    db = journal.db
    columns = [r[1] for r in db.execute("PRAGMA table_info(sales)")]
    row = dict(zip(columns, db.execute("SELECT * FROM sales WHERE sale_id = 's0'").fetchone(),
                   strict=True))
    names, marks = ", ".join(columns), ", ".join("?" for _ in columns)
    db.execute("BEGIN")
    db.executemany(
        f"INSERT INTO sales ({names}) VALUES ({marks})",  # noqa: S608 - the table's own names
        [tuple({**row, "sale_id": f"m{n:06}", "order_id": f"KAM{n:06}",
                "created_at": row["created_at"] - 60 * (n + 1)}[c] for c in columns)
         for n in range(count)],
    )  # fmt: skip
    db.execute("COMMIT")
    journal.close()


@pytest.mark.slow(seconds=12)
@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_an_export_is_written_as_the_journal_is_read(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], fmt: str
) -> None:
    """Read whole, 100,000 sales took 270 MB in `kiosk-agent sales --format csv`: on a small
    unit, enough to push the agent beside it out of memory. Written a page at a time, the
    memory it takes does not grow with the journal."""
    import tracemalloc

    path = write(tmp_path, GOOD)
    # once untraced, so the modules the command imports are not counted in the first peak only
    # (they hid a whole-file read at these sizes)
    _many_sales(tmp_path, 0)
    assert main(["sales", "-c", str(path), "--format", fmt]) == 0
    _forget_journal(tmp_path)
    peaks = []
    for count in (1_000, 3_000):  # two pages of 500 against six: tracing costs CPU per sale
        _many_sales(tmp_path, count - 3)
        capfd.readouterr()
        tracemalloc.start()
        assert main(["sales", "-c", str(path), "--format", fmt]) == 0
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        out = capfd.readouterr().out  # a file, not memory: only the command's own is measured
        assert out.count("KAM") == count - 3
        _forget_journal(tmp_path)
    assert peaks[1] < peaks[0] * 1.5, peaks  # three times the sales, not three times the memory


def _forget_journal(directory: Path) -> None:
    (directory / "journal.db").unlink()
    for side in directory.glob("journal.db-*"):
        side.unlink()


ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m"  # a window title, a cleared screen, red
RLO = "\u202e"  # right-to-left override: "gnp.exe" reads as "exe.png"


def test_words_from_outside_are_shown_never_obeyed_by_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A service's answer (its resptext, a device's stage error) lands in a sale's message as
    sent; `sales`, `sales show` and `sales attention` printed it raw, so an escape sequence in
    it cleared the tech's screen or retitled their terminal, as the status page never lets it."""
    path = write(tmp_path, GOOD)
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    sale = journal.create(SaleRecord(
        sale_id="e5c4", order_id="KAESC", source="mdb:front", flow="charge_card",
        terminal="SIM-0001", amount_cents=250, state=SaleState.STARTED,
    ))  # fmt: skip
    walk_to(journal, sale, SaleState.ATTENTION, Step.CHARGE_CARD_UNKNOWN,
            message=f"declined ({ESCAPES}Do not honor{RLO}) line\nbreak")
    journal.close()
    for argv, code in (([], 0), (["show", "e5c4"], 0), (["attention"], EXIT_FAILED)):
        assert main(["sales", *argv, "-c", str(path)]) == code
        out = capsys.readouterr().out
        for char in ("\x1b", "\x07", RLO):
            assert char not in out, (argv, out)
        assert "\ufffd[2J\ufffd[31mDo not honor\ufffd" in out, argv
    # JSON keeps the text as stored (escaped by JSON itself)
    assert main(["sales", "show", "e5c4", "--json", "-c", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["sale"]["message"].startswith(
        f"declined ({ESCAPES}"
    )


def test_sales_attention_help_says_its_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    # a remote admin writing the cron job reads --help, not docs/cli.md's table
    with pytest.raises(SystemExit):
        main(["sales", "attention", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit 1 when it lists any" in text
    assert "0 when there is none" in text
