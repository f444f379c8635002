"""The docs are held to the code: every configuration a page shows loads, every default it
states is the schema's, and every `check-config` message it quotes is one the loader writes.

A page that drifts from the code fails here, naming the page and line (docs/cli.md's options
and exit codes are held by tests/cli/test_contract.py)."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.config.load import CORE_SECTIONS, SECTION_OWNERS, check_config, load_config

ROOT = Path(__file__).resolve().parent.parent
# The pages whose configuration snippets must load (README's are commands, not YAML).
CONFIG_PAGES = ("README.md", "docs/configuration.md", "docs/platforms.md",
                "docs/operations.md", "docs/status-page.md", "docs/journal.md")
# Top-level keys of YAML on those pages that is not the agent's configuration.
NOT_AGENT_CONFIG = {"scrape_configs"}  # Prometheus's own scrape configuration

BASE = """\
service:
  simulator: {time_scale: 10}
terminals:
  - {device_id: SIM-0001, name: front}
"""
SECTIONS = set(CORE_SECTIONS) | set(SECTION_OWNERS)
SECTION_KEY = re.compile(r"^([a-z_]+):", re.M)


@dataclass(frozen=True)
class Snippet:
    page: str
    line: int
    heading: str  # the nearest heading above it
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def fenced(page: str, lang: str) -> list[Snippet]:
    """The fenced ```lang blocks of a page (```` ``` ```` alone: lang ""), each with its line
    and nearest heading."""
    found = []
    heading, body = "", list[str]()
    opened: tuple[int, str] | None = None  # the open fence's line and language
    for number, line in enumerate((ROOT / page).read_text().splitlines(), 1):
        if opened is None and line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif opened is None and line.startswith("```"):
            opened, body = (number, line[3:].strip()), []
        elif opened is not None and line == "```":
            if opened[1] == lang:
                found.append(Snippet(page, opened[0], heading, "".join(body)))
            opened = None
        elif opened is not None:
            body.append(line + "\n")
    return found


def as_config(snippet: Snippet) -> str | None:
    """A whole configuration holding ``snippet``: sections as they are, a list of triggers
    under ``triggers:``, a platform's own keys (no ``platform:``) as a trigger of the platform
    its heading names. None for YAML that is not the agent's."""
    body = textwrap.dedent(snippet.text)
    if body.lstrip().startswith("- "):
        return BASE + "triggers:\n" + textwrap.indent(body, "  ")
    keys = set(SECTION_KEY.findall(body))
    if keys & NOT_AGENT_CONFIG:
        return None
    if keys <= SECTIONS:
        return ("" if keys & {"service", "terminals"} else BASE) + body
    platform = re.search(r"`(\w+)`", snippet.heading)
    assert platform, f"{snippet}: neither sections nor under a platform's heading"
    trigger = f"platform: {platform.group(1)}\nport: /dev/ttyUSB0\n" + body
    return BASE + "triggers:\n  - " + textwrap.indent(trigger, "    ").lstrip()


def secrets_for(texts: list[str]) -> str:
    names = sorted({name for text in texts for name in re.findall(r"!secret (\w+)", text)})
    return "".join(f"{name}: {name}-0123456789abcdefghijklmnopqrstuvwxyz\n" for name in names)


SNIPPETS = [s for page in CONFIG_PAGES for s in fenced(page, "yaml")]


def test_the_pages_show_configuration_snippets() -> None:
    assert len(SNIPPETS) >= 8  # a change in how pages are read must not test nothing


@pytest.mark.parametrize("snippet", SNIPPETS, ids=str)
def test_every_yaml_snippet_in_the_docs_loads(snippet: Snippet, tmp_path: Path) -> None:
    config = as_config(snippet)
    if config is None:
        pytest.skip("not the agent's configuration")
    path = tmp_path / "config.yaml"
    path.write_text(config)
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text(secrets_for([config]))
    secrets.chmod(0o600)
    errors = [str(e) for e in check_config(path)]
    assert errors == [], f"{snippet} does not load:\n{config}\n" + "\n".join(errors)


# -- defaults -----------------------------------------------------------------------------------

# A default as a page states it: a table row "| `key` | 15 |" under "### `section`", or prose:
# "`health.ping_interval`, default 60 s", "`health.hold_off` (default 0.5 s)",
# "`http.max_connections` (256)", "`health.ping_interval`, 60 s by default".
TABLE_ROW = re.compile(r"^\| `(\w+)` \| (?:`([^`|]+)`|(\d[\d.,]*)) \|", re.M)
# and under "### `journal`": "`path` (default `journal.db`, ...", "`keep_days` (400: ..."
SECTION_PROSE = re.compile(r"`(\w+)` \((?:default )?(?:`([^`]+)`|(\d[\d.,]*))")
PROSE = re.compile(r"`([a-z_]+)\.([a-z_]+)`(?:,|\s\()\s*(?:default\s)?(?:`([^`]+)`|(\d[\d.,]*))")


@dataclass(frozen=True)
class Default:
    where: str
    section: str
    key: str
    value: str

    def __str__(self) -> str:
        return f"{self.where}: {self.section}.{self.key} = {self.value}"


def documented_defaults() -> list[Default]:
    found = []
    text = (ROOT / "docs/configuration.md").read_text()
    for part in re.split(r"^### ", text, flags=re.M)[1:]:
        section = re.match(r"`(\w+)`", part)
        if section is None:
            continue
        line = text.index(part)
        for row in [*TABLE_ROW.finditer(part), *SECTION_PROSE.finditer(part)]:
            where = f"docs/configuration.md:{text[: line + row.start()].count(chr(10)) + 1}"
            found.append(Default(where, section.group(1), row.group(1),
                                 row.group(2) or row.group(3)))
    for page in CONFIG_PAGES:
        text = (ROOT / page).read_text()
        for match in PROSE.finditer(text):
            if match.group(1) not in SECTIONS:
                continue
            where = f"{page}:{text[: match.start()].count(chr(10)) + 1}"
            found.append(Default(where, match.group(1), match.group(2),
                                 match.group(3) or match.group(4)))
    return found


def loaded_defaults(tmp_path: Path) -> dict[str, Any]:
    """Every section as the loader fills it from an empty one (the service's from its
    settings, whose defaults the loader does not repeat)."""
    from kiosk_agent.assembly.agent import service_settings_from_config

    secrets = tmp_path / "secrets.yaml"
    secrets.write_text("api_key: sim_api_key\n")
    secrets.chmod(0o600)
    path = tmp_path / "config.yaml"
    path.write_text(
        "service: {base_url: 'http://127.0.0.1:1', mid: '1', api_key: !secret api_key}\n"
        "terminals: [{device_id: SIM-0001}]\nhealth: {}\nupstream: {}\n"
    )
    config = load_config(path)
    data: dict[str, Any] = {key: dict(value) for key, value in config.data.items()
                            if isinstance(value, dict)}
    settings = service_settings_from_config(config)
    data["service"] = {**settings.model_dump(), **data["service"]}
    return data


def same(documented: str, actual: Any) -> bool:
    documented = documented.replace(",", "")
    if isinstance(actual, bool) or documented in ("true", "false"):
        return str(actual).lower() == documented
    if isinstance(actual, int | float) and re.fullmatch(r"\d+(\.\d+)?", documented):
        return float(documented) == float(actual)
    return str(actual) == documented


DEFAULTS = documented_defaults()


def test_the_pages_state_defaults() -> None:
    assert len(DEFAULTS) >= 20


def test_every_default_the_docs_state_is_the_schemas(tmp_path: Path) -> None:
    loaded = loaded_defaults(tmp_path)
    wrong = []
    for default in DEFAULTS:
        if default.section not in loaded:
            continue  # a list (triggers): its keys' defaults are each platform's
        section = loaded[default.section]
        if default.value in section:
            continue  # another key's value (reporting_url: `base_url`)
        if default.key not in section:
            wrong.append(f"{default}: the loader fills in no {default.key}")
        elif not same(default.value, section[default.key]):
            wrong.append(f"{default}: the code's default is {section[default.key]!r}")
    assert wrong == []


# -- the messages docs/configuration.md quotes ---------------------------------------------------

# A file with the mistakes of the page's first example, each on the line the page names.
MISTAKES = """\
service:
  simulator: {}
terminals:
  - device_id: SIM-0001
triggers:
  - platform: virtual
    products: {A1: "1.50"}
  - platform: gpio
    chip: /dev/gpiochip0
    buttons:
      - line: 5
        product: A1
        relay: 6
        price: 2.5
receipts:
  print: auto
sales:
  retries: 2
health:
  ping_interval: 60
admn:
  port: 8124
"""
# One file per YAML syntax error the page quotes, in its order.
SYNTAX = [
    "service:\n  simulator: {}\nterminals:\n  - device_id: SIM-0001\n   name: front\n",
    "service:\n  simulator\n    seed: 1\n",
    "service:\n  base_url: http://example.com/abcd: b\n",
    "service:\n\tsimulator: {}\n",
]


def quoted_blocks() -> list[list[str]]:
    """The unlabelled fenced blocks of docs/configuration.md: what check-config prints."""
    return [s.text.splitlines() for s in fenced("docs/configuration.md", "")]


def check_config_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> tuple[int, list[str]]:
    from kiosk_agent.cli import main

    path = tmp_path / "config.yaml"
    path.write_text(text)
    code = main(["check-config", str(path)])
    err = capsys.readouterr().err.replace(str(path), "/etc/kiosk-agent/config.yaml")
    return code, err.splitlines()


def test_the_check_config_example_is_what_check_config_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command, *printed = quoted_blocks()[0]
    assert command == "$ kiosk-agent check-config /etc/kiosk-agent/config.yaml"
    code, lines = check_config_output(tmp_path, capsys, MISTAKES)
    assert (code, lines) == (2, printed)


def test_the_yaml_syntax_messages_are_what_check_config_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quoted = quoted_blocks()[1]
    assert len(quoted) == len(SYNTAX)
    for text, line in zip(SYNTAX, quoted, strict=True):
        code, lines = check_config_output(tmp_path, capsys, text)
        assert code == 2
        assert lines[0] == line, text


# -- doctor's output as the pages show it --------------------------------------------------------


def doctor_blocks() -> list[Snippet]:
    """Every fenced block of a `kiosk-agent doctor` run shown whole (no elided `...` lines)."""
    return [
        snippet
        for page in ("docs/cli.md", "docs/operations.md")
        for lang in ("", "console")
        for snippet in fenced(page, lang)
        if re.search(r"^\[(PASS|FAIL|WARN|SKIP)\] ", snippet.text, re.M)
        and not re.search(r"^\.\.\.$", snippet.text, re.M)
    ]


def test_doctors_summary_line_in_the_docs_is_the_one_it_prints() -> None:
    from kiosk_agent.cli.fleet import verdict
    from kiosk_agent.doctor import Report, Verdict

    blocks = doctor_blocks()
    assert blocks
    for block in blocks:
        report = Report()
        for found in re.finditer(r"^\[(\w+)\] ([^:]+): ", block.text, re.M):
            report.add(found.group(2), Verdict(found.group(1)))
        summary = block.text.rstrip().splitlines()[-1]
        assert summary == verdict(report), block


# -- each platform's keys, as docs/platforms.md lists them ---------------------------------------


def schema_keys(schema: Any) -> dict[str, Any]:
    """A platform schema's own keys (not the base keys every trigger has) and their defaults."""
    import voluptuous as vol

    from kiosk_agent.config.load import PLATFORM_SCHEMA

    def mapping(node: Any) -> dict[Any, Any]:
        while not isinstance(node, dict):
            node = node.schema if isinstance(node, vol.Schema) else next(
                v for v in node.validators if isinstance(v, dict | vol.Schema))
        return node

    base = {str(key.schema) for key in mapping(PLATFORM_SCHEMA)}
    return {
        str(key.schema): key.default() if key.default is not vol.UNDEFINED else None
        for key in mapping(schema)
        if str(key.schema) not in base
    }


def listed_keys(section: str) -> dict[str, str | None]:
    """The keys of a platform's "Its keys:" paragraph, each with the default it shows (the first
    value in its parentheses, when that is a number or code)."""
    paragraph = re.search(r"^Its keys: (.*?)(?:\n\n|\s*\Z)", section, re.M | re.S)
    assert paragraph, "no 'Its keys:' paragraph"
    items, depth, current = [], 0, ""
    for char in paragraph.group(1).replace("\n", " "):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    listed: dict[str, str | None] = {}
    for item in items:
        names, _, shown = item.partition("(")
        keys = re.findall(r"`(\w+)`", names)
        value = re.match(r"`([^`]+)`|(\d[\d.]*)", shown)
        for key in keys:
            listed[key] = (value.group(1) or value.group(2)) if value and len(keys) == 1 else None
    return listed


@pytest.mark.parametrize("platform", ["mdb", "serial_line", "gpio", "kiosk_api", "virtual"])
def test_docs_list_every_key_of_each_platform_with_its_default(platform: str) -> None:
    import importlib

    text = (ROOT / "docs/platforms.md").read_text()
    section = text.split(f"## `{platform}`", 1)[1].split("\n## ", 1)[0]
    schema = schema_keys(importlib.import_module(f"kiosk_agent.platforms.{platform}")
                         .PLATFORM_SCHEMA)
    listed = listed_keys(section)
    assert set(listed) == set(schema), f"docs/platforms.md `{platform}`: keys differ"
    for key, shown in listed.items():
        if shown is not None:
            documented = str(int(shown, 0)) if shown.startswith("0x") else shown
            assert same(documented, schema[key]), f"{platform}.{key}: {shown} vs {schema[key]!r}"
