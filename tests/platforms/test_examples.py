"""Every shipped configuration loads and validates: the examples are documentation that runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kiosk_agent.config.load import load_config

CONFIG = Path(__file__).resolve().parents[2] / "config"
EXAMPLES = sorted((CONFIG / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_is_valid(example: Path, tmp_path: Path) -> None:
    copy = tmp_path / example.name
    shutil.copy(example, copy)
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text(
        "api_key: key_0123456789\nrefresh_token: refresh_0123456789\n"
        "kiosk_api_token: app-token-0123456789abcdef\n"
    )
    secrets.chmod(0o600)
    config = load_config(copy)
    assert config.triggers, f"{example.name} shows no trigger"


def test_there_is_an_example_for_each_kind_of_machine() -> None:
    platforms = {load_platform(p) for p in EXAMPLES}
    assert {"mdb", "gpio", "kiosk_api", "serial_line"} <= platforms


def test_demo_config_is_valid() -> None:
    config = load_config(CONFIG / "demo.yaml")
    assert "simulator" in config["service"]
    assert {t["platform"] for t in config.triggers} == {"virtual"}  # no hardware


def load_platform(path: Path) -> str:
    import yaml

    text = path.read_text().replace("!secret ", "")
    return str(yaml.safe_load(text)["triggers"][0]["platform"])
