"""The command line's one contract, checked on every subcommand the parser has.

A test walks the parser, so a command added later is held to the same rules:
- ``-c/--config`` and ``$KIOSK_CONFIG`` on every command that reads a configuration, before or
  after the subcommand;
- ``--json`` prints one valid JSON document (also when the command fails), or the parser
  refuses it, in either position;
- ``--timeout`` on every service command: a service that accepts connections and never answers
  ends each of them with a clear error within its timeout;
- exit codes only from the table, which docs/cli.md shows as it is in the code.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kiosk_agent.cli import build_parser, command_word, main, walk
from kiosk_agent.cli import contract as cli
from kiosk_agent.sales import unit
from kiosk_agent.sales.journal import Journal
from kiosk_agent.sales.machine import this_machine
from kiosk_agent.sim.server import SimServer
from tests.helpers import json_time_problems as problems

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok_4111111111111111"

# One example per command that prints a result, in an order where each finds what it needs.
# {name} is filled from an earlier result (or, where nothing ran, a placeholder).
EXAMPLES: list[tuple[str, ...]] = [
    ("terminals",),
    ("terminals", "list"),
    ("terminals", "ping", "SIM-0001"),
    ("terminals", "connect", "SIM-0001"),
    ("payments", "charge", "--amount", "2.50", "--token", TOKEN, "--expiration", "1230",
     "--auth-only"),
    ("payments", "capture", "{trans_id}"),
    ("terminals", "test-print", "SIM-0007", "--trans-id", "{trans_id}"),
    ("payments", "receipt", "{trans_id}", "--email", "ann@example.com"),
    ("payments", "void", "{trans_id}"),
    ("payments", "surcharge", "--amount", "10.00", "--bin", "411111"),
    ("vault", "create", "--token", TOKEN, "--name", "Ann Lee", "--account-zip", "62701",
     "--address1", "1 Main St", "--city", "Springfield", "--region", "IL", "--country", "US",
     "--email", "ann@example.com", "--phone", "2175550100"),
    ("vault", "get", "{uuid}"),
    ("vault", "update", "{uuid}", "--email", "new@example.com"),
    ("plans", "create", "--name", "gym", "--vault-uuid", "{uuid}", "--amount", "9.99",
     "--start", "2026-12-01", "--until", "2027-03-01"),
    ("plans", "get", "{id}"),
    ("plans", "cancel", "{id}"),
    ("vault", "delete", "{uuid}"),
    ("hpp", "create", "--name", "Donate", "--amount", "25.00"),
    ("hpp", "edit", "{page_id}", "--amount", "30.00"),
    ("boarding", "create", "--dba-name", "Corner Snacks"),
    ("boarding", "merchant", "{merchant_id}"),
    ("boarding", "update", "{merchant_id}", "--status", "sent_for_signature"),
    ("boarding", "merchants", "--limit", "2"),
    ("report", "transactions", "--limit", "2"),
    ("report", "deposits", "--since", "30d", "--limit", "2"),
    ("check-config", "{config}"),
    ("sales", "-c", "{config}"),
    ("sales", "list", "-c", "{config}"),
    ("sales", "attention", "-c", "{config}"),
    ("sales", "late-vends", "-c", "{config}"),
    ("sales", "show", "nosuchsale", "-c", "{config}"),
    ("sales", "resolve", "nosuchsale", "--as", "reversed", "--why", "by hand", "-c", "{config}"),
    ("audit", "-c", "{config}"),
    ("audit", "fill", "A1", "-c", "{config}"),
    ("doctor", "-c", "{config}"),
    ("unit", "-c", "{config}"),
    ("unit", "show", "-c", "{config}"),
    ("unit", "adopt", "-c", "{config}"),
    ("health", "--url", "http://127.0.0.1:9"),  # the token: $KIOSK_AGENT_TOKEN (env below)
    ("events", "--url", "http://127.0.0.1:9", "--kind", "sale"),
    ("fleet", "forget", "-c", "{config}", "--wait", "0.1"),
    ("fleet", "list", "-c", "{config}", "--wait", "0.1"),
    ("fleet", "show", "unit-1", "-c", "{config}", "--wait", "0.1"),
    ("sim", "trigger", "settle"),
    ("sim", "trigger", "terminal-offline", "SIM-0003"),
    ("sim", "trigger", "terminal-online", "SIM-0003"),
    ("sim", "trigger", "merchant-status", "{merchant_id}", "LIVE"),
    ("dex", "parse", "{dex_file}"),
    ("dex", "read", "-c", "{config}"),  # its config names no DEX port (test_dex_cli reads one)
    ("sim", "trigger", "sale", "--terminal", "SIM-0002"),
    ("sim", "trigger", "declined", "--terminal", "SIM-0002"),
    ("sim", "trigger", "reader-offline", "SIM-0004"),
    ("sim", "trigger", "reader-online", "SIM-0004"),
    # each fault only on a path no later example calls; `clear` disarms them all
    ("sim", "trigger", "service-500", "--count", "1"),
    ("sim", "trigger", "lost-answer"),
    ("sim", "trigger", "fault", "latency", "--path", "/nothing/*", "--delay", "0.1"),
    ("sim", "trigger", "faults"),
    ("sim", "trigger", "clear"),
    ("keys", "refresh"),  # last: the rotated key is what the later commands would use
]
# The few that print no result take no --json (and refuse it).
NO_JSON = {("run",), ("demo",), ("sim",), ("virtual",), ("completion",)}
# The ones that read no configuration (`sim trigger` talks to a simulator by --url).
NO_CONFIG = {("sim",), ("virtual",), ("completion",), ("dex", "parse"), *(
    ("sim", "trigger", event) for event in (
        "settle", "terminal-offline", "terminal-online", "merchant-status", "sale", "declined",
        "reader-offline", "reader-online", "service-500", "lost-answer", "fault", "faults",
        "clear"))}
# Every command that calls the payment service.
SERVICE_GROUPS = {"terminals", "payments", "vault", "plans", "hpp", "boarding", "report", "keys"}
PLACEHOLDERS = {"trans_id": "700000000001", "uuid": "u-1", "id": "1", "page_id": "p1",
                "merchant_id": "100001",
                "dex_file": str(ROOT / "tests" / "data" / "dex" / "jofemar.txt")}


def leaves() -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for path, parser in walk(build_parser()):
        if path and parser.get_default("handler") is not None:
            yield path, parser


def flags(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


@functools.cache
def known_commands() -> frozenset[tuple[str, ...]]:
    """Every command's words, from one walk of the parser (building it is the costly part)."""
    return frozenset(path for path, _ in leaves())


def command_of(argv: tuple[str, ...]) -> tuple[str, ...]:
    known = known_commands()
    words = tuple(a for a in argv if not a.startswith("-"))
    for n in range(len(words), 0, -1):
        if words[:n] in known:
            return words[:n]
    raise AssertionError(f"no command in {argv}")


def fill(argv: tuple[str, ...], values: dict[str, str]) -> list[str]:
    return [a.format(**values) if "{" in a else a for a in argv]


@pytest.fixture
def env(sim: SimServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    info = sim.ready_info()
    for name in cli.ENVIRONMENT.values():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(cli.CONFIG_ENV, raising=False)
    values = {
        "KIOSK_BASE_URL": info["base_url"], "KIOSK_API_KEY": info["api_key"],
        "KIOSK_MID": info["mid"], "KIOSK_CLIENT_ID": info["client_id"],
        "KIOSK_CLIENT_SECRET": info["client_secret"],
        "KIOSK_REFRESH_TOKEN": info["refresh_token"],
        "KIOSK_CREDENTIALS_PATH": str(tmp_path / "keys.json"),
        "KIOSK_AGENT_TOKEN": "t" * 24,  # health and events: a running agent's admin API token
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """An agent configuration on the embedded simulator, with an (empty) journal."""
    path = tmp_path / "agent.yaml"
    path.write_text("service: {simulator: {time_scale: 50}}\n"
                    "terminals: [{device_id: SIM-0001}]\njournal: {path: journal.db}\n")
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    unit.load(journal.db, journal.path, this_machine())  # as the agent's start makes it
    journal.close()
    return path


async def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    """One command in-process, parsed and dispatched as `kiosk-agent` does."""
    parser = build_parser(command_word(argv))
    args = parser.parse_args(argv)
    cli.check_contract(args, parser)
    code = await args.handler(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- the parser, statically ------------------------------------------------------------------


def test_every_command_has_the_contract_options_it_needs() -> None:
    for path, parser in leaves():
        taken = flags(parser)
        name = " ".join(path)
        assert ({"-c", "--config"} <= taken) == (path not in NO_CONFIG), name
        assert ("--json" in taken) == (path not in NO_JSON), name
        calls_out = path[0] in {*SERVICE_GROUPS, "doctor", "health", "events"} or path[:2] == (
            "sim", "trigger"
        )
        assert ("--timeout" in taken) == calls_out, name


def test_every_since_and_until_is_told_in_the_same_words_with_its_zone() -> None:
    helps: dict[str, set[str]] = {"--since": set(), "--until": set()}
    for _, parser in leaves():
        if "--since" not in flags(parser):
            continue  # a plan's --until is its last day, not a moment to list up to
        for action in parser._actions:
            for flag in helps.keys() & set(action.option_strings):
                helps[flag].add(str(action.help))
    assert len(helps["--since"]) == 1, helps["--since"]
    assert len(helps["--until"]) == 1, helps["--until"]
    assert "UTC" in helps["--since"].pop()


def test_every_command_that_prints_a_result_has_an_example_here() -> None:
    covered = {command_of(example) for example in EXAMPLES}
    wanted = {path for path, _ in leaves() if path not in NO_JSON}
    assert wanted <= covered, f"add an example for {sorted(wanted - covered)}"


@pytest.mark.parametrize("path", sorted(NO_JSON))
def test_json_is_refused_where_there_is_no_result(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["bash"] if path == ("completion",) else []
    for argv in ([*path, *extra, "--json"], ["--json", *path, *extra]):
        with pytest.raises(SystemExit) as refused:
            main(argv)
        assert refused.value.code == cli.EXIT_USAGE
        out, err = capsys.readouterr()
        assert "--json" in err
        assert json.loads(out)["exit_code"] == cli.EXIT_USAGE  # a script still gets JSON


def test_a_command_without_its_docstring_is_described_by_its_overview_line() -> None:
    """Under the unit's PYTHONOPTIMIZE=2 a module has no docstring: the description falls back."""
    assert cli.described(None, "demo") == "simulator + virtual vending machine + agent, with a " \
        "live view (no hardware)"
    assert cli.described("`kiosk-agent completion`: print a script.", "completion") == \
        "print a script."


def test_every_commands_help_is_made_without_docstrings() -> None:
    """Python as the systemd unit runs it (PYTHONOPTIMIZE=2: no docstrings, no asserts) builds
    every command's parser and help: no command reads a docstring it cannot do without."""
    walk_every_help = (
        "import sys\n"
        "sys.exit('not optimized') if sys.flags.optimize != 2 else None\n"
        "from kiosk_agent.cli import build_parser, walk\n"
        "print(sum(len(sub.format_help()) > 0 for _, sub in walk(build_parser())))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", walk_every_help], env={**os.environ, "PYTHONOPTIMIZE": "2"},
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout) == len(list(walk(build_parser())))


def test_the_exit_code_table_in_docs_is_the_one_in_the_code() -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    section = text.split("## Exit codes and errors", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| (.+?) \|$", section, re.M)
    assert {int(code): meaning for code, meaning in rows} == cli.EXIT_CODES


def test_docs_name_every_command_and_only_options_it_takes() -> None:
    """docs/cli.md matches --help: each command is named, and each option shown in a
    `kiosk-agent ...` example is one that command takes."""
    text = (ROOT / "docs" / "cli.md").read_text()
    by_path = dict(leaves())
    for path in by_path:
        if path[0] in ("run", "sim", "demo"):
            continue  # documented in README, simulator.md
        assert f"kiosk-agent {' '.join(path)}" in text or (
            f"kiosk-agent {path[0]}" in text and path[-1] in text
        ), f"docs/cli.md does not mention `kiosk-agent {' '.join(path)}`"
    lines = re.findall(r"^\$ (kiosk-agent .*)$", text, re.M)
    for line in (part.strip() for found in lines for part in found.split("  $ ")):
        argv = line.split("#")[0].replace("\\", "").split()[1:]
        if not argv or argv[0] in ("sim",):
            continue
        parser = by_path.get(command_of(tuple(argv)))
        assert parser is not None, line
        for option in (a.split("=")[0] for a in argv if a.startswith("-") and a != "-"):
            assert option in flags(parser), f"{line}: {option} is not an option of it"


# -- config: -c before or after, and $KIOSK_CONFIG ---------------------------------------------


def _placeholder_argv(path: tuple[str, ...]) -> list[str]:
    example = next((e for e in EXAMPLES if command_of(e) == path), path)
    values = {**PLACEHOLDERS, "config": "{config}"}
    return [a for a in fill(example, values) if a != "{config}"]


@pytest.mark.slow(seconds=13)
@pytest.mark.parametrize("where", ["after", "before", "environment"])
async def test_every_command_reads_the_config_it_is_given(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = str(tmp_path / "nowhere.yaml")
    for name in cli.ENVIRONMENT.values():
        monkeypatch.delenv(name, raising=False)
    for path, _parser in leaves():
        if path in NO_CONFIG or path in (("demo",), ("health",), ("events",)):
            continue
        argv = [a for a in _placeholder_argv(path) if a != "-c"]
        monkeypatch.delenv(cli.CONFIG_ENV, raising=False)
        if where == "after":
            argv = [*argv, "-c", missing]
        elif where == "before":
            argv = ["--config", missing, *argv]
        else:
            monkeypatch.setenv(cli.CONFIG_ENV, missing)
        code, out, err = await run(capsys, argv)
        assert code == cli.EXIT_USAGE, (argv, out, err)
        assert "nowhere.yaml" in out + err, argv


async def test_health_and_demo_read_the_config_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(cli.CONFIG_ENV, str(tmp_path / "nowhere.yaml"))
    for argv in (["health"], ["events"], ["demo", "--sales", "1"],
                 ["boarding", "merchants", "--webhooks"]):
        code, _out, err = await run(capsys, argv)
        assert code == cli.EXIT_USAGE
        assert "nowhere.yaml" in err


# -- --json everywhere, exit codes from the table --------------------------------------------


async def test_every_command_prints_valid_json_and_exits_with_a_code_from_the_table(
    env: dict[str, str], config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = {**PLACEHOLDERS, "config": str(config)}
    ran: dict[tuple[str, ...], int] = {}
    times: dict[str, list[str]] = {}  # each command's times that are not ISO 8601 UTC
    for example in EXAMPLES:
        argv = fill(example, values)
        json_first = len(ran) % 2 == 0  # before the command half of the time
        code, out, err = await run(capsys, ["--json", *argv] if json_first else [*argv, "--json"])
        assert code in cli.EXIT_CODES, (argv, code)
        try:
            result = json.loads(out)
        except json.JSONDecodeError:
            pytest.fail(f"{argv}: not JSON: {out!r} (stderr {err!r})")
        ran[command_of(example)] = code
        if example[:2] != ("dex", "parse"):  # its read_at is the machine's clock, zone unknown
            times[" ".join(example[:3])] = list(problems(result))
        if isinstance(result, dict) and code == 0:
            keys = ["id"] if argv[0] == "plans" else ["trans_id", "uuid", "page_id", "merchant_id"]
            values.update({k: str(result[k]) for k in keys if result.get(k) is not None})
        if code != 0:
            assert "error" in result or "ok" in result, (argv, result)
    failed = {path: code for path, code in ran.items() if code != 0}
    # only what cannot pass here: no agent is running for `health`, no broker for `fleet`
    # (tests/cli/test_fleet_cli.py runs both for real), no sale in attention to resolve
    # (tests/cli/test_agent_cli.py resolves one)
    assert failed == {
        ("health",): cli.EXIT_UNREACHABLE,
        ("events",): cli.EXIT_UNREACHABLE,  # tests/admin/test_events_follow.py follows one
        ("unit", "adopt"): cli.EXIT_FAILED,  # made here: nothing to adopt (test_unit_cli)
        ("fleet", "forget"): cli.EXIT_USAGE,
        ("fleet", "list"): cli.EXIT_USAGE,
        ("fleet", "show"): cli.EXIT_USAGE,
        ("sales", "resolve"): cli.EXIT_FAILED,
        ("sales", "show"): cli.EXIT_FAILED,  # no such sale (tests/cli/test_sales_cli.py shows one)
        ("dex", "read"): cli.EXIT_USAGE,  # no dex: section (tests/cli/test_dex_cli.py reads one)
    }, failed
    wrong = {k: v for k, v in times.items() if v}
    assert wrong == {}, json.dumps(wrong, indent=1)


# -- --timeout: a service that never answers ---------------------------------------------------


@pytest.fixture
async def black_hole() -> AsyncIterator[str]:
    """A server that accepts every connection, reads, and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


@pytest.mark.slow(seconds=14)
async def test_a_service_that_never_answers_ends_every_command_within_its_timeout(
    env: dict[str, str], black_hole: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KIOSK_BASE_URL", black_hole)
    timeout = 0.2  # each of the 26 commands waits it out: short, one after the other
    for example in EXAMPLES:
        path = command_of(example)
        if path[0] not in SERVICE_GROUPS:
            continue
        argv = fill(example, {**PLACEHOLDERS})
        started = time.monotonic()
        code, out, err = await run(capsys, [*argv, "--timeout", str(timeout), "--json"])
        took = time.monotonic() - started
        assert json.loads(out)["exit_code"] == cli.EXIT_UNREACHABLE  # one JSON answer
        assert code == cli.EXIT_UNREACHABLE, (argv, out, err)
        assert err.startswith("error: service unreachable:"), (argv, err)
        assert err.count("\n") == 1, err
        assert "--timeout" in err
        assert took < timeout * 2 + 1.5, (argv, took)  # one request's worth, not retries


@pytest.mark.parametrize("command", [["health"], ["health", "--watch"], ["events"]])
async def test_health_and_events_give_up_on_an_agent_that_never_answers(
    black_hole: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    command: list[str],
) -> None:
    monkeypatch.setenv("KIOSK_AGENT_TOKEN", "t" * 24)
    started = time.monotonic()
    code, _out, err = await run(capsys, [*command, "--url", black_hole, "--timeout", "0.5"])
    assert code == cli.EXIT_UNREACHABLE
    assert "cannot reach the agent" in err
    assert time.monotonic() - started < 3


# -- the demo config: service commands start the embedded simulator ----------------------------


async def test_service_commands_work_with_the_demo_config(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in cli.ENVIRONMENT.values():
        monkeypatch.delenv(name, raising=False)
    # the demo's journal (and the file a running demo leaves beside it) is under ~: a demo
    # someone runs on this machine meanwhile, from any checkout, is not this test's
    monkeypatch.setenv("HOME", str(tmp_path))
    demo = str(ROOT / "config" / "demo.yaml")
    # the list of readers is the running agent's (none here, and the demo config has no admin:
    # section to ask one): said at once, no simulator started for it
    code, out, err = await run(capsys, ["terminals", "--config", demo, "--json"])
    assert code == 4, err
    assert "its readers: SIM-0007 (snacks-reader), SIM-0008 (coffee-reader)" in out
    monkeypatch.setenv(cli.CONFIG_ENV, demo)
    code, out, _err = await run(capsys, ["terminals", "ping", "SIM-0001", "--json"])
    assert code == 0
    assert json.loads(out)["online"] is True



@pytest.mark.parametrize("command", [["health"], ["health", "--watch"], ["events"]])
async def test_health_and_events_do_not_follow_a_redirect_with_the_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: list[str],
) -> None:
    """An address that answers 307 to another server: the admin token goes nowhere else."""
    from aiohttp import web

    elsewhere: list[str] = []

    async def record(request: web.Request) -> web.Response:
        elsewhere.append(request.headers.get("Authorization", ""))
        return web.json_response({})

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"{other}{request.path}?token=leaked")

    servers = []
    for handler in (record, redirect):
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        servers.append(runner)
        port = runner.addresses[0][1]
        if handler is record:
            other = f"http://127.0.0.1:{port}"
    try:
        monkeypatch.setenv("KIOSK_AGENT_TOKEN", "t" * 24)
        code, _out, err = await run(capsys, [*command, "--url", f"http://127.0.0.1:{port}"])
    finally:
        for runner in servers:
            await runner.cleanup()
    assert code == cli.EXIT_UNREACHABLE
    assert "HTTP 307, a redirect to" in err
    assert f"{other}/api/" in err
    assert "leaked" not in err  # the address's query is not echoed
    assert elsewhere == []


async def test_health_asks_for_the_health_with_its_token_and_refuses_an_answer_not_json(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """health's one GET (the standard library's, cli/fleet.get_once) to something that is not
    the agent: a web server answering a page."""
    from aiohttp import web

    asked: list[tuple[str, str]] = []

    async def page(request: web.Request) -> web.Response:
        asked.append((request.path, request.headers.get("Authorization", "")))
        return web.Response(text="<html>a router's login page</html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        monkeypatch.setenv("KIOSK_AGENT_TOKEN", "t" * 24)
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
        code, out, err = await run(capsys, ["health", "--url", url])
    finally:
        await runner.cleanup()
    assert asked == [("/api/health", "Bearer " + "t" * 24)]
    assert code == cli.EXIT_FAILED
    assert err == f"error: {url} answered no JSON: is it the agent's admin API?\n"
    assert out == ""


# -- the unit's journal: one way to open it ------------------------------------------------------

JOURNAL_READERS = [["sales"], ["sales", "attention"], ["sales", "show", "s1"],
                   ["sales", "late-vends"],
                   ["sales", "resolve", "s1", "--as", "reversed", "--why", "by hand"],
                   ["audit"], ["audit", "fill", "A1"], ["unit", "show"], ["unit", "adopt"]]


async def test_every_command_on_the_journal_refuses_a_journal_not_made_yet_in_the_same_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(cli.CONFIG_ENV, raising=False)
    config = tmp_path / "agent.yaml"
    config.write_text("service: {simulator: {}}\nterminals: [{device_id: SIM-0001}]\n"
                      "journal: {path: journal.db}\n")
    for argv in JOURNAL_READERS:
        code, out, err = await run(capsys, [*argv, "-c", str(config)])
        assert code == cli.EXIT_FAILED, (argv, out, err)
        assert err == f"error: no journal at {tmp_path / 'journal.db'} (the agent has not run " \
                      "yet)\n", argv
        assert not (tmp_path / "journal.db").exists(), argv  # a reader never makes one


def test_only_the_contract_opens_the_units_journal_for_a_command() -> None:
    # cli/agent, cli/unit and cli/audit each had a copy of the preamble (config, path, missing
    # journal, open to read or write, the refusal); a fourth would drift from them
    openers = sorted(path.name for path in (ROOT / "kiosk_agent" / "cli").glob("*.py")
                     if "open_to_read" in path.read_text())
    assert openers == ["contract.py"]
