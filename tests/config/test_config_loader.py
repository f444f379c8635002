"""The loader under attack: includes that escape, the secrets file, cycles, bombs, huge files.

Each test repeats an attack from the review (issue 10) on the real loader in a temp dir and
checks that it now fails fast, with a clear error, and without printing what it tried to read.
"""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest

from kiosk_agent.cli import main
from kiosk_agent.config.load import check_config, load_config
from kiosk_agent.config.yaml_loader import MAX_FILE_BYTES, MAX_TOTAL_BYTES

HEAD = "service:\n  simulator: {}\nterminals: [{device_id: SIM-0001}]\n"
OUTSIDE_TEXT = "stolen: TOPSECRET-CONTENT-41\n"
SECRET = "sk_live_DO_NOT_PRINT_0123456789"


def write(directory: Path, name: str, text: str, mode: int = 0o644) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    path.chmod(mode)
    return path


def report(path: Path) -> str:
    return "\n".join(str(e) for e in check_config(path))


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A config directory with a private secrets file, beside a directory it must not reach."""
    (tmp_path / "elsewhere").mkdir()
    write(tmp_path / "elsewhere", "other.yaml", OUTSIDE_TEXT)
    config_dir = tmp_path / "etc" / "kiosk"
    config_dir.mkdir(parents=True)
    write(config_dir, "secrets.yaml", f"api_key: {SECRET}\n", mode=0o600)
    return config_dir


# -- includes stay inside the configuration directory ----------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        "../../elsewhere/other.yaml",
        "../../../../../../../../etc/passwd",
        "/etc/passwd",
        "sub/../../../elsewhere/other.yaml",
        "{outside}",  # an absolute path outside
    ],
)
def test_an_include_outside_the_config_directory_is_refused_unread(site: Path, target: str) -> None:
    target = target.format(outside=site.parent.parent / "elsewhere" / "other.yaml")
    path = write(site, "config.yaml", HEAD + f"journal: !include {target}\n")
    text = report(path)
    assert f"config.yaml:4: !include {target}: outside the configuration directory" in text
    assert "TOPSECRET" not in text
    assert "root:" not in text


def test_a_symlink_out_of_the_config_directory_is_resolved_and_refused(site: Path) -> None:
    (site / "journal.yaml").symlink_to(site.parent.parent / "elsewhere" / "other.yaml")
    path = write(site, "config.yaml", HEAD + "journal: !include journal.yaml\n")
    text = report(path)
    assert "!include journal.yaml: outside the configuration directory" in text
    assert "TOPSECRET" not in text


def test_includes_inside_the_directory_still_work_by_relative_and_absolute_path(
    site: Path,
) -> None:
    write(site, "parts/journal.yaml", "path: data/journal.db\n")
    write(site, "parts/terminals.yaml", "- device_id: SIM-0002\n")
    path = write(
        site,
        "config.yaml",
        "service:\n  simulator: {}\n"
        f"terminals: !include {site / 'parts/terminals.yaml'}\n"
        "journal: !include parts/journal.yaml\n",
    )
    config = load_config(path)
    assert config["journal"]["path"] == "data/journal.db"
    assert config["terminals"] == [{"device_id": "SIM-0002"}]


def test_a_nested_include_is_confined_to_the_main_config_directory(site: Path) -> None:
    # parts/ may include its sibling, but not climb out of the configuration directory
    write(site, "parts/journal.yaml", "!include ../../../elsewhere/other.yaml\n")
    path = write(site, "config.yaml", HEAD + "journal: !include parts/journal.yaml\n")
    text = report(path)
    assert "parts/journal.yaml:1: !include ../../../elsewhere/other.yaml: outside" in text
    assert "TOPSECRET" not in text


def test_an_included_file_of_plain_text_is_not_echoed(site: Path) -> None:
    write(site, "notes.txt", "BEGIN PRIVATE KEY hunter2\n")
    path = write(site, "config.yaml", HEAD + "journal: !include notes.txt\n")
    text = report(path)
    assert "!include notes.txt: the file holds a single value, not a mapping or a list" in text
    assert "hunter2" not in text


# -- the secrets file cannot be included -----------------------------------------------------


@pytest.mark.parametrize("mode", [0o600, 0o644])
@pytest.mark.parametrize(
    "name", ["secrets.yaml", "./secrets.yaml", "parts/../secrets.yaml", "{absolute}"]
)
def test_the_secrets_file_cannot_be_included(site: Path, name: str, mode: int) -> None:
    (site / "secrets.yaml").chmod(mode)
    name = name.format(absolute=site / "secrets.yaml")
    (site / "parts").mkdir()
    path = write(site, "config.yaml", HEAD + f"journal: !include {name}\n")
    text = report(path)
    assert f"config.yaml:4: !include {name}: the secrets file cannot be included" in text
    assert SECRET not in text


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_the_secrets_file_cannot_be_included_under_another_name(site: Path, link: str) -> None:
    alias = site / "settings.yaml"
    if link == "symlink":
        alias.symlink_to(site / "secrets.yaml")
    else:
        os.link(site / "secrets.yaml", alias)
    path = write(site, "config.yaml", HEAD + "journal: !include settings.yaml\n")
    text = report(path)
    assert "the secrets file cannot be included" in text
    assert SECRET not in text


def test_secrets_keep_their_mode_check_through_a_symlink(site: Path) -> None:
    # secrets.yaml -> a world-readable file elsewhere: the mode of what is read is checked
    real = write(site.parent, "shared-secrets.yaml", f"api_key: {SECRET}\n", mode=0o644)
    (site / "secrets.yaml").unlink()
    (site / "secrets.yaml").symlink_to(real)
    path = write(site, "config.yaml", HEAD.replace("{}", "{seed: !secret api_key}"))
    text = report(path)
    assert "readable by group or others (mode 644)" in text
    assert SECRET not in text


def test_a_secret_used_in_an_included_file_comes_from_the_main_secrets_file(site: Path) -> None:
    write(
        site,
        "parts/service.yaml",
        "base_url: https://pay.example.com\napi_key: !secret api_key\nmid: '1'\n",
    )
    write(site, "parts/secrets.yaml", "api_key: from-the-wrong-place\n", mode=0o644)
    path = write(
        site, "config.yaml", "service: !include parts/service.yaml\nterminals: [{device_id: T1}]\n"
    )
    assert load_config(path)["service"]["api_key"] == SECRET
    (site / "secrets.yaml").chmod(0o640)
    assert "readable by group or others (mode 640)" in report(path)


def test_a_secret_in_the_wrong_place_is_never_shown(site: Path) -> None:
    path = write(site, "config.yaml", HEAD.replace("{}", "{seed: !secret api_key}"))
    text = report(path)
    assert "service.simulator.seed: expected a whole number, got a value from !secret" in text
    assert SECRET not in text


def test_a_broken_secrets_file_is_located_without_its_contents(site: Path) -> None:
    write(site, "secrets.yaml", f'api_key: "{SECRET}\nother: [1\n', mode=0o600)
    path = write(site, "config.yaml", HEAD.replace("{}", "{seed: !secret api_key}"))
    text = report(path)
    assert "secrets.yaml cannot be read at line" in text
    assert SECRET not in text


# -- cycles, bombs, depth and size -----------------------------------------------------------


def test_an_include_cycle_is_named_not_a_recursion_error(site: Path) -> None:
    write(site, "a.yaml", "x: !include b.yaml\n")
    write(site, "b.yaml", "y: !include a.yaml\n")
    path = write(site, "config.yaml", HEAD + "journal: !include a.yaml\n")
    text = report(path)
    assert (
        "b.yaml:1: !include a.yaml: include cycle config.yaml -> a.yaml -> b.yaml -> a.yaml" in text
    )
    assert "Recursion" not in text


def test_a_file_including_itself_is_a_cycle(site: Path) -> None:
    path = write(site, "config.yaml", HEAD + "journal: !include config.yaml\n")
    assert "include cycle config.yaml -> config.yaml" in report(path)


def test_including_one_file_many_times_is_bounded(site: Path) -> None:
    # not a cycle: a fan-out (each level includes the next one 10 times, 10**6 loads in all)
    for level in range(6):
        items = "".join(f"- !include l{level + 1}.yaml\n" for _ in range(10))
        write(site, f"l{level}.yaml", items)
    write(site, "l6.yaml", "- 1\n")
    path = write(site, "config.yaml", HEAD + "journal: !include l0.yaml\n")
    started = time.process_time()  # CPU, not wall: a bound load cannot pass
    text = report(path)
    assert time.process_time() - started < 10
    assert "more than 100 includes" in text


BILLION_LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{name}: &{name} [{','.join(['*' + prev] * 9)}]\n"
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize("where", ["section", "top"])
def test_an_alias_bomb_fails_fast_with_a_clear_error(
    tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert len(BILLION_LAUGHS) < 460  # 9**9 = 387 million strings once expanded
    body = (
        HEAD + "journal:\n" + textwrap.indent(BILLION_LAUGHS, "  ")
        if where == "section"
        else BILLION_LAUGHS + HEAD
    )
    path = write(tmp_path, "config.yaml", body)
    started = time.process_time()  # CPU, not wall: a bound load cannot pass
    assert main(["check-config", str(path)]) == 2
    assert time.process_time() - started < 5
    err = capsys.readouterr().err
    assert "anchors and aliases expand to more than 100,000 values" in err
    assert "Traceback" not in err


def test_an_alias_of_its_own_container_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "config.yaml", HEAD + "journal: &loop {path: *loop}\n")
    assert "an alias refers to the list or mapping that holds it" in report(path)


def test_ordinary_anchors_and_merges_still_work(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "config.yaml",
        """\
        service:
          simulator: &sim {time_scale: 10}
        terminals:
          - &front {device_id: SIM-0001, name: front}
          - {<<: *front, device_id: SIM-0002, name: back}
        """,
    )
    assert load_config(path)["terminals"][1] == {"device_id": "SIM-0002", "name": "back"}


def test_deep_nesting_is_an_error_not_a_recursion_error(tmp_path: Path) -> None:
    path = write(tmp_path, "config.yaml", HEAD + "journal: " + "[" * 50_000 + "]" * 50_000 + "\n")
    text = report(path)
    assert "mappings and lists nested more than 64 deep" in text


def test_a_5_6_mb_config_is_refused_before_it_is_read(tmp_path: Path) -> None:
    line = "  - {device_id: SIM-0001, name: front-counter-reader}\n"
    body = HEAD.replace("terminals: [{device_id: SIM-0001}]\n", "terminals:\n")
    path = write(tmp_path, "config.yaml", body + line * (5_600_000 // len(line)))
    assert path.stat().st_size > 5_500_000
    started = time.process_time()  # CPU, not wall: a bound load cannot pass
    [error] = check_config(path)
    assert time.process_time() - started < 1
    assert error.message == (
        f"{path} is {path.stat().st_size:,} bytes; a configuration file may have at most "
        f"{MAX_FILE_BYTES:,}"
    )


def test_includes_share_one_size_budget(tmp_path: Path) -> None:
    # each file within its own bound, together above the budget; the bytes are a comment so
    # each include costs its read, not a quarter megabyte of pure-Python YAML parsing
    size = MAX_FILE_BYTES - 1000
    reader = "- {device_id: SIM-0001, name: a-reader}\n"
    write(tmp_path, "t.yaml", reader + "#" * (size - len(reader) - 1) + "\n")
    assert (tmp_path / "t.yaml").stat().st_size == size
    includes = MAX_TOTAL_BYTES // size + 1
    body = "service:\n  simulator: {}\nterminals: !include t.yaml\n" + "".join(
        f"x{n}: !include t.yaml\n" for n in range(includes)
    )
    path = write(tmp_path, "config.yaml", body)
    assert f"(all files together: {MAX_TOTAL_BYTES:,})" in report(path)


def test_a_fifo_is_refused_instead_of_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.yaml")
    path = write(tmp_path, "config.yaml", HEAD + "journal: !include pipe.yaml\n")
    assert "pipe.yaml is not a regular file" in report(path)


def test_numbers_and_dates_that_cannot_be_read_are_located(tmp_path: Path) -> None:
    for value in ["9" * 5000, "2026-13-45"]:
        path = write(tmp_path, "config.yaml", HEAD.replace("{}", "{seed: " + value + "}"))
        [error] = check_config(path)
        assert (error.line, error.column) == (2, 21)
        assert error.message == (
            "YAML: a number or date that cannot be read (too long or out of range)"
        )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (HEAD + "journal: !include ../../elsewhere/other.yaml\n", "outside the configuration"),
        (HEAD + "journal: !include secrets.yaml\n", "the secrets file cannot be included"),
        (HEAD + "journal: !include config.yaml\n", "include cycle"),
        (BILLION_LAUGHS + HEAD, "anchors and aliases expand to more than"),
    ],
)
def test_run_refuses_each_attack_at_once(
    site: Path, body: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(site, "config.yaml", body)
    started = time.process_time()  # CPU, not wall: a bound load cannot pass
    assert main(["run", "--config", str(path)]) != 0
    assert time.process_time() - started < 5
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert SECRET not in err
    assert "TOPSECRET" not in err
