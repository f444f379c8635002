"""check-config reports every mistake at once, located, with hints that do not mislead."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from kiosk_agent.cli import main
from kiosk_agent.config.load import ConfigError, check_config
from kiosk_agent.config.yaml_loader import suggest

HEAD = "service:\n  simulator: {}\nterminals: [{device_id: SIM-0001}]\n"
QUOTE_FIX = 'write the price in quotes, like "2.50", or as integer cents'


def write(directory: Path, text: str, name: str = "config.yaml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def with_token(directory: Path) -> None:
    secrets = directory / "secrets.yaml"
    secrets.write_text("kiosk_token: a-kiosk-token-of-some-length\n")
    secrets.chmod(0o600)


def test_three_float_prices_in_products_are_three_mistakes(tmp_path: Path) -> None:
    with_token(tmp_path)
    path = write(
        tmp_path,
        HEAD
        + """\
triggers:
  - platform: kiosk_api
    token: !secret kiosk_token
    products:
      coffee: 2.5
      tea: "1.80"
      cake: 3.1
      water: 1.25
""",
    )
    errors = check_config(path)
    assert [(e.line, e.path, e.message) for e in errors] == [
        (8, "triggers[0].products.coffee", 'expected an amount like "2.50", got 2.5'),
        (10, "triggers[0].products.cake", 'expected an amount like "3.10", got 3.1'),
        (11, "triggers[0].products.water", 'expected an amount like "1.25", got 1.25'),
    ]
    assert all(e.fix == QUOTE_FIX for e in errors)


def test_every_bad_price_in_a_buttons_list_is_reported(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        HEAD
        + """\
triggers:
  - platform: gpio
    buttons:
      - {line: 17, product: espresso, price: 2.5, relay: 22}
      - {line: 18, product: latte, price: "3.00", relay: 23}
      - {line: 19, product: mocha, price: 3.5, relay: 24}
      - {line: 20, product: tea, price: 0, relay: 25}
      - {line: 21, product: water, relay: 26}
""",
    )
    assert [(e.line, e.path) for e in check_config(path)] == [
        (7, "triggers[0].buttons[0].price"),
        (9, "triggers[0].buttons[2].price"),
        (10, "triggers[0].buttons[3].price"),
        (11, "triggers[0].buttons[4].price"),
    ]


def test_every_bad_item_of_a_core_list_is_reported(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        service:
          simulator: {}
        terminals:
          - name: front
          - device_id: SIM-0002
          - {device_id: 7}
          - nonsense
          - {device_id: SIM-0003, nme: back}
        """,
    )
    assert [(e.line, e.path, e.message) for e in check_config(path)] == [
        (4, "terminals[0].device_id", "required key 'device_id' is missing"),
        (6, "terminals[2].device_id", "expected text, got 7"),
        (7, "terminals[3]", "expected a dictionary"),
        (8, "terminals[4].nme", "unknown key 'nme'"),
    ]


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("path", None),  # difflib's default cutoff says 'health'
        ("heath", "did you mean 'health'?"),
        ("admn", "did you mean 'admin'?"),
        ("Journal", "did you mean 'journal'?"),
        ("triger", "did you mean 'triggers'?"),
        ("secrets", None),
    ],
)
def test_a_suggestion_is_given_only_when_it_is_close(
    tmp_path: Path, key: str, hint: str | None
) -> None:
    path = write(tmp_path, HEAD + f"{key}: {{}}\n")
    [error] = check_config(path)
    assert error.message == f"unknown section {key!r}"
    if hint is None:
        assert error.fix is not None
        assert error.fix.startswith("known sections: ")
    else:
        assert error.fix == hint


def test_suggest_is_case_blind_and_strict() -> None:
    assert suggest("pth", ["path", "keep_days"]) == "path"
    assert suggest("prise", ["price", "relay"]) == "price"
    assert suggest("PRICE", ["price"]) == "price"
    assert suggest("path", ["health", "admin"]) is None
    assert suggest("x", []) is None


# -- YAML syntax: line, column, a plain explanation and a hint; never PyYAML's raw text --------


SYNTAX = [
    (
        "service:\n  simulator: {}\nterminals:\n  - device_id: A\n   name: x\n",
        (5, 4),
        "this line does not line up with the block above it (in the block that starts on line 4)",
        "line 5 is indented 3 spaces and line 4 2; the keys of one mapping (and the items of "
        "one list) start in the same column",
    ),
    (
        "service:\n  simulator\n    seed: 1\nterminals: []\n",
        (3, 9),
        "a `key:` where a value was expected",
        "line 2 has no ':' after its key, so line 3 cannot be indented under it",
    ),
    (
        "service:\n  base_url: https://pay.example.com: 443\n",
        (2, 36),
        "a `key:` where a value was expected",
        "line 2 holds a second ': '; put its value in quotes",
    ),
    (
        "service:\n\tsimulator: {}\n",
        (2, 1),
        "a tab character",
        "YAML indents with spaces only; replace the tab with spaces",
    ),
    (
        'terminals:\n  - device_id: "SIM-0001\n  - device_id: SIM-0002\n',
        (4, 1),
        "the file ends inside a quoted string (in the quoted string that starts on line 2)",
        "close the quote",
    ),
    (
        "service:\n  simulator: {time_scale: 1\nterminals: []\n",
        (3, 10),
        "a { ... } mapping is not closed, or lacks a comma (in the { ... } mapping that starts "
        "on line 2)",
        None,
    ),
    ("a: 1\n---\nb: 2\n", (2, 1), "more than one document (---) in one file", None),
]


@pytest.mark.parametrize(("text", "where", "message", "hint"), SYNTAX)
def test_a_yaml_syntax_error_gets_line_column_and_a_hint(
    tmp_path: Path, text: str, where: tuple[int, int], message: str, hint: str | None
) -> None:
    path = write(tmp_path, text)
    [error] = check_config(path)
    assert (error.file, error.line, error.column) == ("config.yaml", *where)
    assert error.message.removeprefix("YAML syntax: ").removeprefix("YAML: ") == message
    if hint is not None:
        assert error.fix == hint
    shown = str(error)
    assert shown.startswith(f"config.yaml:{where[0]}:{where[1]}: YAML")
    for raw in ("while parsing", "while scanning", "<unicode string>", "^"):
        assert raw not in shown


def test_check_config_exits_2_with_every_mistake_and_a_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, HEAD + "path: x\nreceipts: {print: sometimes}\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("config.yaml:4: path: unknown section 'path' (fix: known sections:")
    assert err[1].startswith("config.yaml:5: receipts.print: value must be one of")
    assert err[2] == f"2 mistakes in {path}"


def test_a_syntax_error_exits_2_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "service:\n\tsimulator: {}\n")
    assert main(["check-config", str(path)]) == 2
    assert "config.yaml:2:1: YAML syntax: a tab character" in capsys.readouterr().err


def test_a_mistake_as_json_has_every_field() -> None:
    error = ConfigError("config.yaml", 3, "a.b", "bad", "fix it", 7)
    assert json.loads(json.dumps(error.as_dict())) == {
        "file": "config.yaml",
        "line": 3,
        "column": 7,
        "path": "a.b",
        "message": "bad",
        "fix": "fix it",
    }
    assert str(error) == "config.yaml:3:7: a.b: bad (fix: fix it)"


def test_a_long_value_is_cut_in_a_message(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + "sales: {card_timeout: " + "x" * 5000 + "}\n")
    [error] = check_config(path)
    assert error.path == "sales.card_timeout"
    assert error.message.startswith("expected a number, got 'xxx")
    assert len(error.message) == 300


def test_control_characters_from_the_file_never_reach_the_terminal(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + 'journal: !include "a\\0b"\n"\\e[2J\\x9b": 1\n')
    shown = "\n".join(str(e) for e in check_config(path))
    assert "config.yaml:4: !include needs a file name" in shown
    assert "unknown section '\\x1b[2J\\x9b'" in shown
    assert not any(ord(c) < 0x20 and c != "\n" for c in shown)
