"""pydantic's plugin loader is not imported where plugins are off (kiosk_agent/pydantic_setup.py):
its import (importlib.metadata) cost every start 15-19 ms of CPU for plugins no command uses."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pydantic

from kiosk_agent.pydantic_setup import LOADER, NONE_AT_ALL, no_plugins, skip_plugin_loader

# A process that builds and uses a model the way a start does, then says what it imported.
BUILD_A_MODEL = """\
import sys
from kiosk_agent.pydantic_setup import skip_plugin_loader
skip_plugin_loader()
from pydantic import BaseModel
class Price(BaseModel):
    cents: int
assert Price.model_validate_json('{"cents": 250}').cents == 250
print(sorted(m for m in ("importlib.metadata", "csv", "zipfile") if m in sys.modules))
print(type(sys.modules["pydantic.plugin._loader"].get_plugins()).__name__)
"""


def run_building(plugins: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    if plugins is not None:
        env["PYDANTIC_DISABLE_PLUGINS"] = plugins
    done = subprocess.run(
        [sys.executable, "-c", BUILD_A_MODEL], capture_output=True, text=True, timeout=60,
        env=env, check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_with_every_plugin_off_a_model_is_built_without_reading_package_metadata() -> None:
    assert run_building("__all__") == ["[]", "tuple"]


def test_a_plugin_set_up_on_purpose_keeps_pydantics_own_loader() -> None:
    # the variable names a plugin to leave out: the others are looked for in the metadata
    imported, found = run_building("logfire")
    assert "importlib.metadata" in imported
    assert found == "dict_values"


def test_the_stand_in_answers_as_pydantics_loader_does_with_plugins_off() -> None:
    assert {"__all__", "1", "true"} == NONE_AT_ALL
    assert skip_plugin_loader({"PYDANTIC_DISABLE_PLUGINS": "some_plugin"}) is False
    assert skip_plugin_loader({}) is False
    real, finders = sys.modules.pop(LOADER, None), list(sys.meta_path)
    try:
        assert skip_plugin_loader({"PYDANTIC_DISABLE_PLUGINS": "__all__"}) is True
        assert skip_plugin_loader({"PYDANTIC_DISABLE_PLUGINS": "__all__"}) is True
        assert len(sys.meta_path) == len(finders) + 1  # one stand-in however often asked
        assert LOADER not in sys.modules  # nothing imported until pydantic asks for it
        assert importlib.import_module(LOADER).get_plugins() == no_plugins() == ()
        # once loaded (the real one or this), left as it is
        assert skip_plugin_loader({"PYDANTIC_DISABLE_PLUGINS": "__all__"}) is False
    finally:
        sys.meta_path[:] = finders
        if real is None:
            del sys.modules[LOADER]
        else:
            sys.modules[LOADER] = real


def test_pydantic_takes_from_its_loader_only_what_the_stand_in_has() -> None:
    """A pydantic upgrade that asks its loader for more names breaks here, not at a start."""
    package = Path(pydantic.__file__).parent
    taken: set[str] = set()
    for source in package.rglob("*.py"):
        if source.name == "_loader.py":
            continue
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_loader"):
                taken.update(alias.name for alias in node.names)
    assert taken == {"get_plugins"}
