"""Any file fed to the loader gives a config or located mistakes, quickly; never a traceback.

Three generators: arbitrary text, a soup of YAML tokens (indents, anchors, aliases, merges, tags,
includes, quotes, flow brackets), and well-formed YAML of the config's own sections with
random values. The config directory holds a private secrets file and files that include each
other, so !secret and !include paths are exercised too.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent.config.load import ConfigError, ConfigInvalid, check_config, load_config

SECRET = "sk_live_PROPERTY_0123456789"
SECONDS = 5.0  # far above the real figure (milliseconds); a hang or an expansion breaks it


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("config")
    secrets = directory / "secrets.yaml"
    secrets.write_text(f"api_key: {SECRET}\ntoken: a-token-long-enough-for-kiosk\n")
    secrets.chmod(0o600)
    (directory / "x.yaml").write_text("a: !include y.yaml\nb: [1, 2]\n")
    (directory / "y.yaml").write_text("- !include x.yaml\n- &z {k: v}\n- *z\n")
    (directory / "t.yaml").write_text("- device_id: SIM-0001\n")
    (directory.parent / "outside.yaml").write_text("stolen: OUTSIDE-CONTENT\n")
    return directory


def check_text(directory: Path, text: str) -> list[ConfigError]:
    path = directory / "config.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    started = time.monotonic()
    errors = check_config(path)
    assert time.monotonic() - started < SECONDS
    for error in errors:
        assert isinstance(error, ConfigError)
        assert error.file
        assert error.message
        shown = str(error)
        assert SECRET not in shown
        assert "OUTSIDE-CONTENT" not in shown
    if not errors:  # what check_config accepts, load_config loads
        load_config(path)
    return errors


# these three take as many examples as the profile asks (tests/conftest.py)
@given(st.text(max_size=400))
def test_any_text(config_dir: Path, text: str) -> None:
    check_text(config_dir, text)


TOKENS = [
    "\n", "\n", "\n", "  ", "  ", "    ", "\t", "- ", "-", ": ", ":", ", ", "{", "}", "[", "]",
    "? ", "# c", "---\n", "...\n", "%YAML 1.1\n", '"', "'", "\\", "|\n", ">-\n",
    "service", "simulator", "terminals", "device_id", "triggers", "platform", "gpio",
    "kiosk_api", "mdb", "buttons", "products", "price", "line", "relay", "token", "journal",
    "path", "admin", "health", "x", "SIM-0001",
    "1", "0", "-1", "2.5", '"2.50"', "1e999", "9" * 60, "2026-13-45", "0x1F", ".nan", "~", "null",
    "true", "&a ", "&b ", "*a", "*b", "<<: ", "<<: *a", "!include ", "!secret ", "!env_var ",
    "x.yaml", "y.yaml", "t.yaml", "secrets.yaml", "config.yaml", "../outside.yaml",
    "/etc/passwd", "api_key", "token", "HOME", "!!binary ", "!!set ", "!!omap ", "!!str ",
    "!!python/object:os.system ", "!nope ",
]  # fmt: skip


@given(st.lists(st.sampled_from(TOKENS), max_size=80))
def test_a_soup_of_yaml_tokens(config_dir: Path, tokens: list[str]) -> None:
    check_text(config_dir, "".join(tokens))


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(["2.50", "$1.00", "1e2", "1_0.00", "٢.٥٠", "gpio", "kiosk_api", "mdb"]),
)
KEYS = st.one_of(
    st.sampled_from(
        [
            "platform",
            "name",
            "terminal",
            "flow",
            "max_price",
            "price",
            "products",
            "buttons",
            "line",
            "relay",
            "product",
            "port",
            "token",
            "device_id",
            "simulator",
            "time_scale",
            "seed",
            "base_url",
            "api_key",
            "mid",
            "path",
            "keep_days",
            "print",
            "email",
            "retries",
            "level",
            "format",
        ]
    ),
    st.text(max_size=8),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=20,
)
SECTIONS = st.fixed_dictionaries(
    {},
    optional={
        "service": st.one_of(st.just({"simulator": {}}), VALUES),
        "terminals": st.one_of(st.just([{"device_id": "SIM-0001"}]), VALUES),
        "triggers": st.lists(
            st.one_of(
                st.fixed_dictionaries(
                    {"platform": st.sampled_from(["gpio", "kiosk_api", "mdb", "serial_line"])},
                    optional={"buttons": VALUES, "products": VALUES, "port": VALUES},
                ),
                VALUES,
            ),
            max_size=3,
        ),
        "journal": VALUES,
        "receipts": VALUES,
        "sales": VALUES,
        "logging": VALUES,
        "admin": VALUES,
        "health": VALUES,
        "webhooks": VALUES,
        "upstream": VALUES,
        "path": VALUES,
    },
)


@pytest.mark.slow
@given(SECTIONS)
def test_well_formed_yaml_of_the_config_sections(config_dir: Path, config: dict[str, Any]) -> None:
    errors = check_text(config_dir, yaml.safe_dump(config, allow_unicode=True))
    if not errors:
        assert isinstance(load_config(config_dir / "config.yaml").data, dict)


def test_load_config_raises_only_config_invalid(config_dir: Path) -> None:
    path = config_dir / "config.yaml"
    path.write_text("- [")
    with pytest.raises(ConfigInvalid):
        load_config(path)
