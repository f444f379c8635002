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


@pytest.mark.slow(seconds=13)
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


# -- libyaml's events, PyYAML's composer (config/yaml_loader.py's _on_libyaml)


def composed(loader: type[Any], text: str) -> Any:
    """What ``loader`` composes of ``text`` as far as the configuration uses it: every node's
    tag, value and start (a key's position, an error's place); or its error (type and words).
    Not the end marks or a scalar's style, which no constructor reads and libyaml sets
    otherwise (a sequence ends where its next line starts; an empty scalar's style is '')."""
    reading = loader(text)
    try:
        return _shape(reading.get_single_node())
    except yaml.YAMLError as err:
        return (type(err).__name__, str(err))
    finally:
        reading.dispose()


def _shape(node: Any, holding: frozenset[int] = frozenset()) -> Any:
    if node is None:
        return None
    if id(node) in holding:  # an alias of the list or mapping that holds it
        return "itself"
    places = (node.start_mark.line, node.start_mark.column)
    if isinstance(node, yaml.ScalarNode):
        return (node.tag, node.value, places)
    inner = holding | {id(node)}
    if isinstance(node, yaml.SequenceNode):
        return (node.tag, [_shape(child, inner) for child in node.value], places)
    return (node.tag, [(_shape(k, inner), _shape(v, inner)) for k, v in node.value], places)


def assert_read_alike(text: str) -> None:
    from kiosk_agent.config import yaml_loader

    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml: the configuration is read by PyYAML alone")
    assert composed(yaml_loader._FILE_LOADER, text) == composed(yaml_loader._Loader, text)


# line breaks and characters the two might count otherwise (a column, a line)
BREAKS = ["\r\n", "\r", "\x85", "\u2028", "\u2029", "\ufeff", "é", "€", "😀", "\u00a0"]


@given(st.lists(st.sampled_from(TOKENS + BREAKS), max_size=80))
def test_libyaml_reads_a_soup_of_tokens_as_pyyaml_does(tokens: list[str]) -> None:
    # where libyaml refuses, PyYAML reads the file again: the same error, in PyYAML's words
    assert_read_alike("".join(tokens))


@given(SECTIONS, st.sampled_from([None, True, False]), st.integers(2, 6))
def test_libyaml_reads_well_formed_yaml_as_pyyaml_does(
    config: dict[str, Any], flow: bool | None, indent: int
) -> None:
    assert_read_alike(
        yaml.safe_dump(config, allow_unicode=True, default_flow_style=flow, indent=indent)
    )


def test_libyaml_reads_the_shipped_configurations_as_pyyaml_does() -> None:
    shipped = sorted(Path(__file__).resolve().parents[2].glob("config/*.yaml"))
    assert shipped
    for path in shipped:
        assert_read_alike(path.read_text())


def test_a_configuration_is_read_without_pyyamls_scanner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml: the configuration is read by PyYAML alone")

    def refused(*_: Any) -> None:
        raise AssertionError("PyYAML's scanner, in Python, read the file")

    monkeypatch.setattr(yaml.scanner.Scanner, "fetch_more_tokens", refused)
    demo = Path(__file__).resolve().parents[2] / "config" / "demo.yaml"
    assert load_config(demo)["terminals"]
