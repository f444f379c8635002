"""The console examples of docs/cli.md, run: each `$ kiosk-agent ...` whose output the page
shows is run against the simulator, and what it prints must read as the page says.

The page's figures vary from run to run (latencies, ids, dates), so a number matches any number
and a long id any id; the words, signs (`$`), columns and line order must be the same. A line
`...` stands for any lines, a line ending in `...` for any end."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from kiosk_agent.cli import build_parser
from kiosk_agent.cli import contract as cli
from kiosk_agent.sim.server import SimServer

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
# The sections whose examples run against a fresh simulator (the others act on what earlier
# commands made: a charge to void, a vault account to charge).
SECTIONS = ("Exit codes and errors", "Terminals: what to run first when a reader is down",
            "Reports", "Driving the simulator")


@dataclass
class Example:
    section: str
    line: int
    command: str
    expected: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"docs/cli.md:{self.line}: $ {self.command}"


def examples() -> list[Example]:
    """Every `$ kiosk-agent` line of a console block in SECTIONS with the lines it shows."""
    found: list[Example] = []
    section, in_console = "", False
    for number, line in enumerate(PAGE.read_text().splitlines(), 1):
        if line.startswith("## "):
            section = line[3:]
        elif line.startswith("```"):
            in_console = line == "```console"
        elif in_console and section in SECTIONS:
            if line.startswith("$ kiosk-agent "):
                found.append(Example(section, number, line[2:].split("  #")[0].strip()))
            elif line.strip() and found and found[-1].section == section:
                found[-1].expected.append(line)
    return [e for e in found if e.expected and not re.search(r"[|<>]", e.command)]


def pattern(line: str) -> re.Pattern[str]:
    """A shown line as a pattern: numbers and ids free, words and layout fixed."""
    prefix = line.endswith("...")
    words = []
    for word in line.removesuffix("...").split():
        if re.fullmatch(r"[A-Z0-9]{8,}|ka-[0-9a-f]+", word):
            words.append(r"\S+")  # an order id
        else:
            words.append(r"\d+".join(re.escape(part) for part in re.split(r"\d+", word)))
    return re.compile(r"\s+".join(words) + (r".*" if prefix else r"\s*") + "$")


def matches(expected: list[str], printed: list[str]) -> bool:
    """``printed`` reads as ``expected``, a `...` line standing for any lines."""
    if not expected:
        return not printed
    if expected[0] == "...":
        return any(matches(expected[1:], printed[n:]) for n in range(len(printed) + 1))
    return bool(printed) and bool(pattern(expected[0]).match(printed[0])) and matches(
        expected[1:], printed[1:]
    )


EXAMPLES = examples()


def test_the_page_shows_examples_to_run() -> None:
    assert {e.section for e in EXAMPLES} == set(SECTIONS)


@pytest.fixture
def env(sim: SimServer, monkeypatch: pytest.MonkeyPatch) -> None:
    info = sim.ready_info()
    for name in cli.ENVIRONMENT.values():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(cli.CONFIG_ENV, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    for name, key in (("KIOSK_BASE_URL", "base_url"), ("KIOSK_API_KEY", "api_key"),
                      ("KIOSK_MID", "mid"), ("KIOSK_CLIENT_ID", "client_id"),
                      ("KIOSK_CLIENT_SECRET", "client_secret")):
        monkeypatch.setenv(name, info[key])


@pytest.mark.parametrize("section", SECTIONS)
async def test_the_examples_print_what_the_page_shows(
    section: str, env: None, sim: SimServer, capsys: pytest.CaptureFixture[str]
) -> None:
    if section.startswith("Terminals"):  # the page's story: SIM-0003 is down
        async with aiohttp.ClientSession() as http, http.post(
            f"{sim.base_url}/sim/terminals/SIM-0003/offline"
        ) as answer:
            assert answer.status == 200
    for example in (e for e in EXAMPLES if e.section == section):
        argv = shlex.split(re.sub(r"\[.*?\]", "", example.command))[1:]
        args = build_parser(argv[0]).parse_args(argv)
        cli.check_contract(args, build_parser(argv[0]))
        await args.handler(args)
        captured = capsys.readouterr()
        printed = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
        assert matches(example.expected, printed), (
            f"{example} shows\n" + "\n".join(example.expected) + "\nbut it prints\n"
            + "\n".join(printed)
        )
