"""The configuration as a field tech meets it: every mistake located, explained, all at once."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from kiosk_agent.config.load import (
    CORE_SECTIONS,
    ConfigInvalid,
    SecretValue,
    check_config,
    core_schema,
    load_config,
)
from kiosk_agent.service.settings import DEFAULT_TIMEOUT

PLUGIN = """
import voluptuous as vol
from kiosk_agent.config.load import PLATFORM_SCHEMA, positive_price

PLATFORM_SCHEMA = PLATFORM_SCHEMA.extend({vol.Required("price"): positive_price})

async def async_setup_platform(agent, config):
    raise NotImplementedError("validation only")
"""

GOOD = """\
service:
  simulator: {time_scale: 100, seed: 3}
terminals:
  - device_id: SIM-0001
    name: front
journal: {path: data/journal.db}
"""


def write(directory: Path, name: str, text: str, mode: int = 0o644) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text))
    path.chmod(mode)
    return path


@pytest.fixture
def coin_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A third-party platform, installed the way pip would: a module plus an entry point."""
    plugins = tmp_path / "site"
    plugins.mkdir()
    (plugins / "kiosk_coin_box.py").write_text(PLUGIN)
    dist = plugins / "kiosk_coin_box-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kiosk-coin-box\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[kiosk_agent.platforms]\ncoin_box = kiosk_coin_box\n")
    monkeypatch.syspath_prepend(str(plugins))
    yield "coin_box"
    sys.modules.pop("kiosk_coin_box", None)


def messages(path: Path) -> list[str]:
    return [str(error) for error in check_config(path)]


def test_a_good_config_loads_with_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "config.yaml", GOOD))
    assert config["service"] == {"simulator": {"time_scale": 100.0, "seed": 3, "transactions": 0}}
    assert config["receipts"] == {"print": "auto", "email": True}
    assert config["sales"]["retries"] == 2
    assert config.resolve(config["journal"]["path"]) == tmp_path / "data/journal.db"
    assert check_config(tmp_path / "config.yaml") == []


def test_the_core_sections_are_the_core_schemas_keys() -> None:
    assert tuple(str(key.schema) for key in core_schema().schema) == CORE_SECTIONS


def test_a_load_leaves_no_schema_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A running agent reads its configuration once: the schemas it was checked with (the
    core sections', the service's, the sales', the http section's, the kiosk API's) are
    garbage after the load, not kept for the whole run (docs/architecture.md, "Idle memory:
    the start's leftovers")."""
    import gc

    import voluptuous as vol

    from kiosk_agent.config import load
    from kiosk_agent.platforms import kiosk_api
    from kiosk_agent.sales import schema as sales_schema
    from kiosk_agent.web import schema as web_schema

    monkeypatch.setenv("KIOSK_TOKEN", "a-kiosk-token-of-32-characters-x")
    path = write(
        tmp_path, "config.yaml",
        GOOD + "http: {max_connections: 64}\n"
        "triggers:\n  - {platform: kiosk_api, token: !env_var KIOSK_TOKEN, port: 8123}\n",
    )

    def schemas() -> int:
        gc.collect()
        return sum(isinstance(thing, vol.Schema) for thing in gc.get_objects())

    load_config(path)  # the first load imports and registers what it needs
    before = schemas()
    config = load_config(path)
    assert schemas() == before
    assert config["http"]["max_connections"] == 64
    assert config["sales"]["retries"] == 2
    assert config.triggers[0]["port"] == 8123
    kept = {
        f"{module.__name__}.{name}"
        for module in (load, sales_schema, web_schema, kiosk_api)
        for name, value in vars(module).items()
        if isinstance(value, (vol.Schema, vol.All)) and value is not load.PLATFORM_SCHEMA
    }
    assert kept == set()  # only the base a third-party platform extends is kept


def test_a_float_price_is_refused_with_its_line_and_a_fix(tmp_path: Path, coin_box: str) -> None:
    path = write(
        tmp_path,
        "config.yaml",
        GOOD + f'triggers:\n  - platform: {coin_box}\n    price: "1.00"\n'
        f"  - platform: {coin_box}\n    price: 2.5\n",
    )
    assert messages(path) == [
        'config.yaml:11: triggers[1].price: expected an amount like "2.50", got 2.5 '
        '(fix: write the price in quotes, like "2.50", or as integer cents)'
    ]


def test_the_currency_is_a_three_letter_code_in_capitals(tmp_path: Path) -> None:
    lower = write(tmp_path, "lower.yaml", GOOD + "sales: {currency: usd}\n")
    assert load_config(lower)["sales"]["currency"] == "USD"  # as Home Assistant expects it
    for wrong in ("US$", "'840'", "dollars"):
        path = write(tmp_path, "config.yaml", GOOD + f"sales: {{currency: {wrong}}}\n")
        assert messages(path) == [
            "config.yaml:7: sales.currency: expected a three-letter currency code like USD"
        ]


def test_a_third_party_platform_validates_its_own_keys(tmp_path: Path, coin_box: str) -> None:
    path = write(
        tmp_path, "config.yaml", GOOD + f"triggers:\n  - platform: {coin_box}\n    price: 150\n"
    )
    config = load_config(path)
    assert config.triggers == [
        {"platform": "coin_box", "price": 150, "flow": "charge_card", "max_price": 10_000}
    ]


def test_an_unknown_platform_names_the_known_ones(tmp_path: Path, coin_box: str) -> None:
    path = write(tmp_path, "config.yaml", GOOD + "triggers:\n  - platform: coin_bx\n")
    [error] = check_config(path)
    assert error.line == 8
    assert error.path == "triggers[0].platform"
    assert "unknown platform 'coin_bx'" in error.message
    assert "coin_box" in error.message
    assert "did you mean 'coin_box'" in error.message


def test_every_mistake_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "config.yaml",
        """\
        service:
          simulator: {time_scale: -1}
        terminals:
          - name: front
        journal:
          pth: j.db
        receipts: {print: sometimes}
        sales: {retries: many}
        admn: {}
        """,
    )
    assert messages(path) == [
        "config.yaml:2: service.simulator.time_scale: expected a number above zero, got -1",
        "config.yaml:4: terminals[0].device_id: required key 'device_id' is missing "
        "(fix: add `device_id: ...`)",
        "config.yaml:6: journal.pth: unknown key 'pth' (fix: did you mean 'path'?)",
        "config.yaml:7: receipts.print: value must be one of ['always', 'auto', 'never'], "
        "got 'sometimes'",
        "config.yaml:8: sales.retries: expected a whole number, got 'many'",
        "config.yaml:9: admn: unknown section 'admn' (fix: did you mean 'admin'?)",
    ]


def test_a_mistake_about_a_whole_block_is_on_its_keys_line(tmp_path: Path) -> None:
    """`admn:` followed by its indented keys: the mistake names the `admn:` line, which is
    what a reader looks for, not the first line of the block under it."""
    path = write(
        tmp_path,
        "config.yaml",
        """\
        service:
          simulator: {}
        terminals:
          - device_id: SIM-0001
        admn:
          host: 0.0.0.0
        journal:
          pth:
            - j.db
        """,
    )
    assert messages(path) == [
        "config.yaml:5: admn: unknown section 'admn' (fix: did you mean 'admin'?)",
        "config.yaml:8: journal.pth: unknown key 'pth' (fix: did you mean 'path'?)",
    ]


def test_a_missing_section_says_what_to_add(tmp_path: Path) -> None:
    path = write(tmp_path, "config.yaml", "terminals: [{device_id: SIM-0001}]\n")
    assert messages(path) == [
        "config.yaml:1: service: required key 'service' is missing (fix: add `service: ...`)"
    ]


def test_yaml_syntax_errors_give_the_line_not_a_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "config.yaml", "service:\n  simulator: {time_scale: 1\nterminals: []\n")
    [error] = check_config(path)
    assert error.file == "config.yaml"
    assert error.line == 3
    assert error.message.startswith("YAML syntax:")


def test_a_duplicate_key_is_a_mistake(tmp_path: Path) -> None:
    path = write(tmp_path, "config.yaml", GOOD + "journal: {path: other.db}\n")
    assert "config.yaml:7: duplicate key 'journal' (fix: keep only one of them)" in messages(path)


def test_secrets_come_from_a_private_secrets_file(tmp_path: Path) -> None:
    write(tmp_path, "secrets.yaml", "api_key: sk_live_123\nrefresh: rt_456\n", mode=0o600)
    path = write(
        tmp_path,
        "config.yaml",
        """\
        service:
          base_url: https://pay.example.com
          api_key: !secret api_key
          refresh_token: !secret refresh
          mid: "999000000001"
        terminals: [{device_id: T1}]
        """,
    )
    config = load_config(path)
    assert config["service"]["api_key"] == "sk_live_123"
    assert isinstance(config["service"]["api_key"], SecretValue)
    assert "sk_live_123" not in repr(config["service"]["api_key"])


def test_a_secrets_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "secrets.yaml", "api_key: sk_live_123\n", mode=0o644)
    path = write(
        tmp_path,
        "config.yaml",
        "service:\n  base_url: https://pay.example.com\n  api_key: !secret api_key\n  mid: '1'\n"
        "terminals: [{device_id: T1}]\n",
    )
    [error] = messages(path)
    assert error.startswith("config.yaml:3: !secret api_key: ")
    assert "readable by group or others (mode 644)" in error
    assert f"chmod 600 {tmp_path / 'secrets.yaml'}" in error


def test_an_unknown_secret_suggests_the_close_one(tmp_path: Path) -> None:
    write(tmp_path, "secrets.yaml", "api_key: sk\n", mode=0o600)
    path = write(
        tmp_path,
        "config.yaml",
        "service:\n  base_url: https://pay.example.com\n  api_key: !secret apikey\n  mid: '1'\n"
        "terminals: [{device_id: T1}]\n",
    )
    [error] = check_config(path)
    assert error.line == 3
    assert "not found in" in error.message
    assert error.fix == "did you mean !secret api_key?"


def test_a_secret_written_inline_is_refused(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "config.yaml",
        "service:\n  base_url: https://pay.example.com\n  api_key: sk_live_123\n  mid: '1'\n"
        "terminals: [{device_id: T1}]\n",
    )
    [error] = check_config(path)
    assert (error.line, error.path) == (3, "service.api_key")
    assert error.message == "a secret is written inline in the configuration"
    assert "!secret api_key" in (error.fix or "")
    assert "sk_live_123" not in str(error)


def test_env_var_with_and_without_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIOSK_TEST_KEY", "sk_env")
    monkeypatch.delenv("KIOSK_TEST_MISSING", raising=False)
    path = write(
        tmp_path,
        "config.yaml",
        """\
        service:
          base_url: https://pay.example.com
          api_key: !env_var KIOSK_TEST_KEY
          mid: !env_var KIOSK_TEST_MID 999000000001
        terminals: [{device_id: T1}]
        """,
    )
    config = load_config(path)
    assert (config["service"]["api_key"], config["service"]["mid"]) == ("sk_env", "999000000001")
    path.write_text(path.read_text().replace("KIOSK_TEST_KEY", "KIOSK_TEST_MISSING"))
    [error] = check_config(path)
    assert error.line == 3
    assert "KIOSK_TEST_MISSING" in error.message
    assert error.fix == "set KIOSK_TEST_MISSING or write `!env_var KIOSK_TEST_MISSING default`"


def test_include_brings_in_another_file_with_its_own_lines(tmp_path: Path) -> None:
    write(tmp_path, "terminals.yaml", "- device_id: SIM-0001\n- name: back\n")
    path = write(
        tmp_path,
        "config.yaml",
        "service:\n  simulator: {}\nterminals: !include terminals.yaml\n",
    )
    [error] = check_config(path)
    assert (error.file, error.line, error.path) == ("terminals.yaml", 2, "terminals[1].device_id")
    (tmp_path / "terminals.yaml").write_text("- device_id: SIM-0001\n")
    assert load_config(path)["terminals"] == [{"device_id": "SIM-0001"}]


def test_include_of_a_missing_file_is_located(tmp_path: Path) -> None:
    path = write(
        tmp_path, "config.yaml", "service:\n  simulator: {}\nterminals: !include nope.yaml\n"
    )
    errors = messages(path)
    assert errors[0].startswith("config.yaml:3: cannot read")


def test_load_config_raises_with_every_error(tmp_path: Path) -> None:
    path = write(tmp_path, "config.yaml", "service: 3\nterminals: 4\n")
    with pytest.raises(ConfigInvalid) as caught:
        load_config(path)
    assert len(caught.value.errors) == 2
    assert all(e.file == "config.yaml" for e in caught.value.errors)


def test_an_empty_file_says_so(tmp_path: Path) -> None:
    path = write(tmp_path, "config.yaml", "")
    assert messages(path) == ["config.yaml: the file is empty (fix: start with `service:`)"]


def test_secrets_file_mode_is_checked_not_assumed(tmp_path: Path) -> None:
    secrets = write(tmp_path, "secrets.yaml", "k: v\n", mode=0o640)
    assert os.stat(secrets).st_mode & 0o040
    path = write(tmp_path, "config.yaml", GOOD.replace("seed: 3", "seed: !secret k"))
    assert any("readable by group or others (mode 640)" in m for m in messages(path))


def test_a_trigger_on_an_unconfigured_terminal_is_a_mistake(tmp_path: Path, coin_box: str) -> None:
    path = write(
        tmp_path,
        "config.yaml",
        GOOD + f"triggers:\n  - platform: {coin_box}\n    price: 100\n    terminal: frnt\n",
    )
    assert messages(path) == [
        "config.yaml:10: triggers[0].terminal: unknown terminal 'frnt'; configured: SIM-0001, "
        "front (fix: did you mean 'front'?)"
    ]


def test_two_triggers_with_one_name_and_a_misspelt_platform_key(
    tmp_path: Path, coin_box: str
) -> None:
    path = write(
        tmp_path,
        "config.yaml",
        GOOD
        + f"triggers:\n  - platform: {coin_box}\n    name: lobby\n    price: 100\n"
        f"  - platform: {coin_box}\n    name: lobby\n    prise: 100\n",
    )
    assert messages(path) == [
        "config.yaml:11: triggers[1].price: required key 'price' is missing "
        "(fix: add `price: ...`)",
        "config.yaml:12: triggers[1].name: name 'lobby' is already used by triggers[0] "
        "(fix: give every trigger its own name)",
        "config.yaml:13: triggers[1].prise: unknown key 'prise' (fix: did you mean 'price'?)",
    ]


def test_masked_shows_the_resolved_config_without_its_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "secrets.yaml", "api_key: sk_live_123\n", mode=0o600)
    monkeypatch.setenv("KIOSK_TEST_MID", "999000000001")
    path = write(
        tmp_path,
        "config.yaml",
        """\
        service:
          base_url: https://pay.example.com
          api_key: !secret api_key
          mid: !env_var KIOSK_TEST_MID
        terminals: [{device_id: T1}]
        """,
    )
    shown = load_config(path).masked()
    assert shown["service"] == {
        "base_url": "https://pay.example.com",
        "api_key": "***",
        "mid": "999000000001",  # from !env_var but not a secret: the schema made it plain text
        "isv": False,
        "timeout": DEFAULT_TIMEOUT,  # defaults filled in: the one default of service.timeout
    }
    assert shown["terminals"] == [{"device_id": "T1"}]
    assert "sk_live_123" not in repr(shown)


ENROLL_TRIGGERS = """\
triggers:
  - {platform: gpio, flow: enroll, buttons: [{line: 5, price: "1.00", relay: 6, product: A1}]}
  - {platform: mdb, flow: enroll, port: /dev/ttyUSB0}
  - {platform: serial_line, flow: enroll, port: /dev/ttyUSB1, vend_request: 'V(?P<price>\\\\d+)',
     dispense_ok: OK, approve: A}
  - {platform: virtual, flow: enroll}
  - {platform: kiosk_api, flow: enroll, token: !secret kiosk_token}
"""


def test_enroll_is_refused_where_the_customers_details_cannot_be_asked(tmp_path: Path) -> None:
    """Saving a card needs the customer's name, address, e-mail and phone (the vault refuses an
    account without them). Before: a button, a vending machine or a serial line with flow
    enroll passed check-config, then read every customer's card and failed at the vault."""
    write(tmp_path, "secrets.yaml", "kiosk_token: kiosk-app-token-0123456789\n", mode=0o600)
    errors = messages(write(tmp_path, "config.yaml", GOOD + ENROLL_TRIGGERS))
    refused = [e for e in errors if "enroll saves a card" in e]
    assert [e.split(":")[2].strip() for e in refused] == [
        "triggers[0].flow", "triggers[1].flow", "triggers[2].flow", "triggers[3].flow"]
    assert "use it on kiosk_api, whose app sends them" in refused[0]
    assert not [e for e in errors if "triggers[4]" in e]  # the kiosk app's API may enroll
