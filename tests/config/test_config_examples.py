"""The bundled configurations pass the check their own comments tell you to run."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from kiosk_agent.cli import main

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"
EXAMPLES = sorted((CONFIG / "examples").glob("*.yaml"))
SECRETS_EXAMPLE = CONFIG / "secrets.example.yaml"


def header(path: Path) -> list[str]:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").rstrip())
    return lines


def test_there_are_examples() -> None:
    assert [p.name for p in EXAMPLES] == [
        "button-relay-kiosk.yaml",
        "serial-line-device.yaml",
        "touchscreen-kiosk.yaml",
        "vending-mdb.yaml",
    ]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_an_example_passes_the_steps_in_its_own_header(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run its header's `cp`, `chmod` and `kiosk-agent check-config` lines in a copy."""
    steps = [
        shlex.split(line) for line in header(example) if re.match(r"(cp|chmod|kiosk-agent) ", line)
    ]
    assert [s[0] for s in steps] == ["cp", "chmod", "kiosk-agent"], header(example)
    shutil.copytree(CONFIG, tmp_path / "config", ignore=shutil.ignore_patterns("secrets.yaml"))
    for step in steps:
        if step[0] == "cp":
            shutil.copyfile(tmp_path / step[1], tmp_path / step[2])
        elif step[0] == "chmod":
            (tmp_path / step[2]).chmod(int(step[1], 8))
        else:
            assert step[1:] == ["check-config", f"config/examples/{example.name}"]
            code = main(["check-config", str(tmp_path / step[2])])
            captured = capsys.readouterr()
            assert code == 0, captured.err
            assert "valid" in captured.out


@pytest.mark.parametrize("name", ["demo.yaml", "minimal.yaml"])
def test_the_demo_and_minimal_configs_pass_as_they_are(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", str(CONFIG / name)]) == 0, capsys.readouterr().err


def test_the_secrets_example_holds_every_secret_the_bundled_configs_use() -> None:
    used = {
        name
        for path in [*CONFIG.glob("*.yaml"), *EXAMPLES]
        for line in path.read_text().splitlines()
        if not line.lstrip().startswith("#")
        for name in re.findall(r"!secret\s+([\w.-]+)", line)
    }
    assert used, "the examples use secrets"
    listed = set(re.findall(r"^([\w.-]+):", SECRETS_EXAMPLE.read_text(), flags=re.MULTILINE))
    assert used <= listed
