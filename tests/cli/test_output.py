"""What the command line shows: progress, the waiting line, colours, plurals, statuses in any
case, and the shell completion made from the parser."""

from __future__ import annotations

import asyncio
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kiosk_agent.cli import build_parser, waiting
from kiosk_agent.cli import contract as cli
from kiosk_agent.cli.completion import script
from kiosk_agent.sales.journal import Journal, SaleRecord
from kiosk_agent.sales.states import SaleState
from kiosk_agent.sim.server import SimServer
from tests.helpers import walk_to


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_plurals_are_right() -> None:
    assert cli.plural(1, "transaction") == "1 transaction"
    assert cli.plural(0, "sale") == "0 sales"
    assert cli.plural(12000, "match") == "12,000 matches"


def test_colours_only_on_a_terminal_and_never_with_no_color(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert cli.use_colour(Terminal())
    assert not cli.use_colour(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not cli.use_colour(Terminal())


def test_progress_on_a_terminal_ends_in_one_clean_line(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = Terminal()
    monkeypatch.setattr(waiting.Progress, "INTERVAL_S", 0.0)
    progress = waiting.Progress("transaction", status=cli.StatusLine(screen))
    for n in range(1, 1281):
        progress.tick(scanned=n, matched=n // 10)
    progress.done()
    text = screen.getvalue()
    assert re.search(r"scanned 1,216 transactions, matched 121 \([\d,]+/s\)", text)
    last = text.rsplit("\r\x1b[K", 1)[1]  # what stays on the screen after the last wipe
    assert re.fullmatch(r"scanned 1,280 transactions, matched 128 in \d+\.\d s\n", last)


def test_one_record_is_one_transaction_not_one_transactions() -> None:
    log = io.StringIO()
    progress = waiting.Progress("transaction", status=cli.StatusLine(log))
    progress.tick(scanned=1, matched=1)
    progress.done()
    assert re.fullmatch(r"1 transaction in \d+\.\d s\n", log.getvalue())


async def test_a_waiting_line_while_the_service_is_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "WAIT_LINE_AFTER_S", 0.01)
    screen = Terminal()
    status = cli.StatusLine(screen)
    async with waiting.waiting("the service at http://pay.example", 10.0, status):
        await asyncio.sleep(0.1)
    text = screen.getvalue()
    assert "waiting for the service at http://pay.example: 0 s (gives up after 10 s" in text
    assert text.endswith("\r\x1b[K")  # wiped when the answer came
    quiet = io.StringIO()  # not a terminal: nothing at all
    async with waiting.waiting("the service", 10.0, cli.StatusLine(quiet)):
        await asyncio.sleep(0.05)
    assert quiet.getvalue() == ""


@pytest.fixture
def reporting(sim: SimServer, monkeypatch: pytest.MonkeyPatch) -> SimServer:
    """The OAuth client of ``sim`` in the environment, no configuration."""
    info = sim.ready_info()
    monkeypatch.delenv(cli.CONFIG_ENV, raising=False)
    monkeypatch.setenv("KIOSK_BASE_URL", info["base_url"])
    monkeypatch.setenv("KIOSK_CLIENT_ID", info["client_id"])
    monkeypatch.setenv("KIOSK_CLIENT_SECRET", info["client_secret"])
    return sim


async def test_a_windowed_pull_says_scanned_and_matched(
    reporting: SimServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(waiting.Progress, "PLAIN_INTERVAL_S", 0.0)
    args = build_parser("report").parse_args(
        ["report", "transactions", "--since", "7d", "--format", "csv"]
    )
    assert await args.handler(args) == 0
    captured = capsys.readouterr()
    rows = len(captured.out.splitlines()) - 1
    final = captured.err.splitlines()[-1]
    match = re.fullmatch(r"scanned ([\d,]+) transactions, matched ([\d,]+) in \d+\.\d s", final)
    assert match, final
    assert int(match.group(2).replace(",", "")) == rows < int(match.group(1).replace(",", ""))


async def test_statuses_are_taken_in_any_case(
    reporting: SimServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for kind, spellings in (("transactions", ("settled", "SETTLED", "Settled")),
                            ("chargebacks", ("OPEN", "open")), ("deposits", ("FUNDED", "funded"))):
        results = []
        for status in spellings:
            args = build_parser("report").parse_args(
                ["report", kind, "--status", status, "--limit", "3", "--json", "--quiet"]
            )
            assert await args.handler(args) == 0, (kind, status)
            results.append(json.loads(capsys.readouterr().out))
        assert all(r == results[0] for r in results), kind

    config = tmp_path / "agent.yaml"
    config.write_text("service: {simulator: {}}\nterminals: [{device_id: SIM-0001}]\n"
                      "journal: {path: journal.db}\n")
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    sale = journal.create(SaleRecord(sale_id="s1", order_id="KA1", source="gpio:front",
                                     flow="charge_card", terminal="SIM-0001", amount_cents=150,
                                     state=SaleState.STARTED, created_at=1_790_000_000.0))
    walk_to(journal, sale, SaleState.COMPLETED)
    journal.close()
    for state in ("completed", "COMPLETED", "Completed"):
        args = build_parser("sales").parse_args(["sales", "-c", str(config), "--state", state,
                                                 "--json"])
        assert await args.handler(args) == 0
        assert [s["order_id"] for s in json.loads(capsys.readouterr().out)] == ["KA1"]


# -- completion --------------------------------------------------------------------------------


def _bash_complete(script_text: str, words: list[str]) -> list[str]:
    program = (
        f"{script_text}\nCOMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}\n"
        "_kiosk_agent_complete; printf '%s\\n' \"${COMPREPLY[@]}\"\n"
    )
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return done.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completes_commands_actions_and_options() -> None:
    text = script(build_parser(), "bash")
    assert _bash_complete(text, ["kiosk-agent", "ter"]) == ["terminals"]
    assert _bash_complete(text, ["kiosk-agent", "terminals", "p"]) == ["ping"]
    assert _bash_complete(text, ["kiosk-agent", "-c", "x.yaml", "terminals", "ping", "--t"]) == [
        "--timeout"
    ]
    assert "--status" in _bash_complete(text, ["kiosk-agent", "report", "transactions", "--"])
    actions = _bash_complete(text, ["kiosk-agent", "sales", ""])
    assert {"list", "attention", "resolve"} <= set(actions)
    assert _bash_complete(text, ["kiosk-agent", "sales", "resolve", "x", "--a"]) == ["--as"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completes_values_from_the_parsers_choices(tmp_path: Path) -> None:
    text = script(build_parser(), "bash")
    (tmp_path / "unit.yaml").write_text("{}")
    (tmp_path / "other.txt").write_text("")
    assert _bash_complete(text, ["kiosk-agent", "report", "''"]) == [
        "transactions", "deposits", "chargebacks", "adjustments"
    ]
    assert _bash_complete(text, ["kiosk-agent", "report", "ch"]) == ["chargebacks"]
    assert _bash_complete(text, ["kiosk-agent", "report", "deposits", "--format", "''"]) == [
        "table", "csv", "json"
    ]
    assert _bash_complete(text, ["kiosk-agent", "sales", "--state", "co"]) == ["completed"]
    assert _bash_complete(text, ["kiosk-agent", "sales", "--format", "c"]) == ["csv"]
    assert _bash_complete(text, ["kiosk-agent", "completion", "''"]) == ["bash", "zsh", "fish"]
    assert _bash_complete(text, ["kiosk-agent", "events", "--kind", "av"]) == ["availability"]
    # -c/--config: file names, before or after the command
    for words in (["kiosk-agent", "-c", f"{tmp_path}/u"],
                  ["kiosk-agent", "doctor", "--config", f"{tmp_path}/u"]):
        assert _bash_complete(text, words) == [f"{tmp_path}/unit.yaml"]
    # after a report's kind, its options again (not the kinds)
    assert "--status" in _bash_complete(text, ["kiosk-agent", "report", "transactions", "''"])


def _zsh_lists(script_text: str, line: str, expect: str, tmp_path: Path) -> str:
    """What an interactive zsh shows after ``line`` and Tab, with the script loaded by
    compinit's bashcompinit, as a person would get it (driven through zsh's own pty)."""
    completion = tmp_path / "_kiosk-agent"
    completion.write_text(script_text)
    driver = tmp_path / "drive.zsh"
    driver.write_text(f"""zmodload zsh/zpty zsh/datetime
zpty z 'zsh -f -i'
zpty -w z 'PS1="> "; autoload -U compinit && compinit -u; source {completion}'
zpty -n -w z $'{line}\\t'
out=""; deadline=$(( EPOCHREALTIME + 10 ))
while (( EPOCHREALTIME < deadline )) && [[ $out != *{expect}* ]]; do
  zpty -r -t z chunk && out+="$chunk"
done
print -r -- "$out"
zpty -d z
""")
    done = subprocess.run(["zsh", "-f", str(driver)], capture_output=True, text=True,
                          timeout=30, check=True)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b.|[\x00-\x08\r]", "", done.stdout)


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed (Debian: zsh)")
def test_zsh_completes_commands_and_values_for_real(tmp_path: Path) -> None:
    text = script(build_parser(), "zsh")
    shown = _zsh_lists(text, "kiosk-agent report ", "transactions", tmp_path)
    assert re.search(r"adjustments +chargebacks +deposits +transactions", shown), shown
    shown = _zsh_lists(text, "kiosk-agent completion ", "fish", tmp_path)
    assert re.search(r"bash +fish +zsh", shown), shown
    shown = _zsh_lists(text, "kiosk-agent sales --state co", "completed", tmp_path)
    assert "kiosk-agent sales --state completed" in shown, shown  # one match: inserted


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed (Debian: fish)")
def test_fish_completes_commands_and_values_for_real(tmp_path: Path) -> None:
    completion = tmp_path / "kiosk-agent.fish"
    completion.write_text(script(build_parser(), "fish"))
    (tmp_path / "unit.yaml").write_text("{}")

    def complete(line: str) -> list[str]:
        done = subprocess.run(
            ["fish", "--no-config", "-c", f"source {completion}; complete -C '{line}'"],
            capture_output=True, text=True, timeout=30, check=True, cwd=tmp_path,
        )
        return [row.split("\t")[0] for row in done.stdout.splitlines()]

    assert complete("kiosk-agent report ") == [
        "adjustments", "chargebacks", "deposits", "transactions"
    ]
    assert complete("kiosk-agent report deposits --format ") == ["csv", "json", "table"]
    assert "completed" in complete("kiosk-agent sales --state ")
    assert complete("kiosk-agent completion ") == ["bash", "fish", "zsh"]
    assert complete("kiosk-agent -c u") == ["unit.yaml"]
    assert complete("kiosk-agent ter") == ["terminals"]


def test_zsh_and_fish_scripts_come_from_the_same_parser() -> None:
    parser = build_parser()
    zsh = script(parser, "zsh")
    assert zsh.startswith("#compdef kiosk-agent")
    assert "bashcompinit" in zsh
    assert "_kiosk_agent_complete" in zsh
    fish = script(parser, "fish")
    assert "complete -c kiosk-agent -n '__fish_use_subcommand" in fish
    assert re.search(r"__fish_seen_subcommand_from terminals; and not "
                     r"__fish_seen_subcommand_from list ping connect test-print' -a", fish)
    assert "-l timeout" in fish


def test_completion_runs_as_a_command() -> None:
    done = subprocess.run([sys.executable, "-m", "kiosk_agent", "completion", "fish"],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0
    assert "complete -c kiosk-agent" in done.stdout


def test_a_services_text_is_shown_never_obeyed_by_the_terminal() -> None:
    """Every value a service command prints for people (a report's order id or terminal, a
    vault account's name, a reason) goes through as_text: a terminal escape in it was printed
    raw."""
    from kiosk_agent.cli.contract import as_text

    assert as_text("KA1\x1b[2J\x1b]0;owned\x07") == "KA1\ufffd[2J\ufffd]0;owned\ufffd"
    assert as_text("two\nlines\u202e") == "two lines\ufffd"
    assert as_text("caf\u00e9 \U0001f468\u200d\U0001f469") == "caf\u00e9 \U0001f468\u200d\U0001f469"


def test_a_verdict_line_shows_a_services_words_never_obeyed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`terminals test-print` says which transaction it printed, as the service named it: a
    terminal escape in it was printed raw. JSON keeps the text as it came."""
    args = build_parser("kiosk-agent").parse_args(["terminals", "list"])
    cli.say(args, "OK    SIM-0007 printed transaction 70\x1b[2J", ok=True)
    assert capsys.readouterr().out == "OK    SIM-0007 printed transaction 70\ufffd[2J\n"
    args = build_parser("kiosk-agent").parse_args(["terminals", "list", "--json"])
    cli.say(args, "printed 70\x1b[2J", ok=True)
    assert json.loads(capsys.readouterr().out)["message"] == "printed 70\x1b[2J"


def test_sales_show_says_a_steps_facts_but_never_a_hidden_field() -> None:
    """`sales show` prints a step's detail without a message as key=value, as the page does; a
    field the exports hide (a token, a key) is never among them."""
    from kiosk_agent.cli.sales import step_detail_text

    assert step_detail_text({"product": "C4", "source": "mdb:front"}) == (
        "  product=C4 source=mdb:front")
    assert step_detail_text({"by": "cli (tech)", "token": "tok_secret", "api_key": "k"}) == (
        "  by=cli (tech)")
    assert step_detail_text({"token": "tok_secret"}) == ""
    assert step_detail_text({"message": "declined", "product": "C4"}) == "  declined"
    assert step_detail_text({"n": 2, "x": None}) == "  n=2 x=null"  # as the page writes them
