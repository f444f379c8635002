"""pydantic without its plugin loader where the process has turned its plugins off.

pydantic asks its plugin loader (``pydantic.plugin._loader``) for plugins at every validator it
builds; importing that module imports ``importlib.metadata`` (with csv and zipfile) to read the
installed packages' entry points: 15-19 ms of CPU at the first model a start builds on the shared
2-core machine (load 8), ten times that on a Pi Zero. Under ``PYDANTIC_DISABLE_PLUGINS`` set to
``__all__`` (every command sets it unless it is given: cli/__init__.py) the loader's
``get_plugins()`` answers "none" before it reads any metadata; :func:`skip_plugin_loader` gives
pydantic that same answer without importing it. A plugin set up on purpose (the variable given
otherwise) keeps pydantic's own loader.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Mapping, Sequence
from importlib.machinery import ModuleSpec
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

LOADER = "pydantic.plugin._loader"
# pydantic's own spellings of "no plugin at all" (its get_plugins)
NONE_AT_ALL = frozenset({"__all__", "1", "true"})


def skip_plugin_loader(environ: Mapping[str, str] | None = None) -> bool:
    """Stand in for pydantic's plugin loader, when it is first imported, if plugins are off and
    it is not loaded yet; whether it will. Nothing is imported here: a command that never
    builds a model loads no part of pydantic."""
    environ = os.environ if environ is None else environ
    if environ.get("PYDANTIC_DISABLE_PLUGINS") not in NONE_AT_ALL or LOADER in sys.modules:
        return False
    if not any(isinstance(finder, _NoPluginLoader) for finder in sys.meta_path):
        sys.meta_path.insert(0, _NoPluginLoader())
    return True


def no_plugins() -> tuple[()]:
    """What pydantic's ``get_plugins()`` returns with every plugin disabled."""
    return ()


class _NoPluginLoader:
    """Finds ``pydantic.plugin._loader`` (and nothing else) as a module of no plugins."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: object = None
    ) -> ModuleSpec | None:
        return ModuleSpec(name, cast("Loader", self)) if name == LOADER else None

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # the usual module object

    def exec_module(self, module: types.ModuleType) -> None:
        module.get_plugins = no_plugins  # type: ignore[attr-defined]
        module.PYDANTIC_ENTRY_POINT_GROUP = "pydantic"  # type: ignore[attr-defined]
