"""requirements-dev.lock is what every ./dev installs, by uv or by pip: it must pin every
dependency pyproject.toml names, at a version pyproject.toml allows (./dev lock remakes it)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;]+)(?:\s*;\s*(.+))?$")


def _pins() -> dict[str, tuple[Version, Marker | None]]:
    pins = {}
    for line in (ROOT / "requirements-dev.lock").read_text().splitlines():
        if not line.strip() or line.startswith(("#", " ")):
            continue
        match = PIN.match(line)
        assert match, f"not a pin: {line!r}"
        name, version, marker = match.groups()
        pins[canonicalize_name(name)] = (Version(version), Marker(marker) if marker else None)
    return pins


def test_the_lock_pins_every_dependency_at_a_version_pyproject_allows() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + project["optional-dependencies"]["dev"]
    wanted = [Requirement(r) for r in listed]
    pins = _pins()
    assert len(pins) > len(wanted)  # their own dependencies are pinned too
    assert "uv" in pins  # the uv ./dev fetches is the lock's version
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in requirements-dev.lock: run ./dev lock"
        version, _marker = pins[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"the lock pins {name}=={version}, pyproject.toml wants {requirement}: run ./dev lock"
        )

