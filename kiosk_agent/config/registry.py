"""The platform registry: which module handles a trigger's ``platform:``.

Bundled platforms live in ``kiosk_agent.platforms.<name>`` and are found by name; third-party
packages add theirs through the ``kiosk_agent.platforms`` entry-point group, Home Assistant style.
A platform module provides ``PLATFORM_SCHEMA`` (extending ``config.load.PLATFORM_SCHEMA``) and
``async def async_setup_platform(agent, config) -> PlatformInstance``.

A bundled platform whose module is heavy (a serial link, asyncio) keeps its schema (and its
optional ``environment_problems``) in a module of their own, ``<name>_schema``, which the
platform's module re-exports: checking a configuration (:func:`platform_checks`) imports that
one alone, so ``check-config`` and every command that loads a configuration wait for no
platform's runtime (``tests/cli/test_startup.py``).
"""

from __future__ import annotations

import importlib
import importlib.util
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from kiosk_agent.config.load import (
    ConfigError,
    Position,
    format_path,
    gives_platform_schema,
    known_keys,
    locate,
    validate,
)
from kiosk_agent.config.yaml_loader import suggest

if TYPE_CHECKING:
    from importlib import metadata

ENTRY_POINT_GROUP = "kiosk_agent.platforms"
BUNDLED_PACKAGE = "kiosk_agent.platforms"
# Modules in the platforms package that are shared code, not platforms: never imported as
# candidates (nor offered as "did you mean").
_NOT_PLATFORMS = frozenset({"base", "serial", "mdb_protocol", "mdb_units"})
SCHEMA_SUFFIX = "_schema"  # a bundled platform's schema module: mdb_schema for mdb


class PlatformInstance(Protocol):
    """What ``async_setup_platform`` returns: one running trigger."""

    name: str

    async def stop(self) -> None: ...

    def status(self) -> dict[str, Any]: ...


class PlatformSetup(Protocol):
    # agent: the assembly's Agent, typed Any as every platform takes it: naming it here would
    # make the configuration import the assembly that imports it
    async def __call__(self, agent: Any, config: dict[str, Any]) -> PlatformInstance: ...


class CannotStart(Exception):
    """A trigger that cannot start on this machine as it is (a chip that does not exist, a
    package not installed): its message says why and what to do, with no traceback."""


def environment_problems(config: dict[str, Any]) -> list[str]:
    """What keeps a valid trigger from starting on this machine, from its platform's optional
    ``environment_problems(config)``: check-config warns of it, doctor fails it, and the
    platform's setup refuses with it (:class:`CannotStart`)."""
    try:
        check = getattr(platform_checks(str(config.get("platform"))), "environment_problems",
                        None)
    except PlatformNotFound:
        return []
    return list(check(config)) if check is not None else []


class PlatformNotFound(LookupError):
    def __init__(self, name: str, known: list[str], reason: str = "") -> None:
        self.name = name
        self.known = known
        close = suggest(name, known)
        hint = f"; did you mean {close!r}?" if close else ""
        why = f" ({reason})" if reason else ""
        super().__init__(
            f"unknown platform {name!r}{why}; known platforms: {', '.join(known) or 'none'}{hint}"
        )


def _entry_points() -> dict[str, metadata.EntryPoint]:
    # asked only for a platform not bundled: reading every installed package's metadata costs
    # a Pi Zero a noticeable part of its start
    from importlib import metadata

    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


@cache
def _package_modules() -> frozenset[str]:
    """Every module of the platforms package, listed (for the known platforms' names)."""
    import pkgutil  # here: a run looks its platform up by name (_in_package), lists nothing

    package = importlib.import_module(BUNDLED_PACKAGE)
    return frozenset(info.name for info in pkgutil.iter_modules(package.__path__))


@cache
def _in_package(name: str) -> bool:
    """Whether the platforms package has a module ``name``: asked of the import system by name,
    as the import itself will (listing the package needs pkgutil, some 55 KiB that a running
    agent kept for this one look-up)."""
    if not name.isidentifier():
        return False
    try:
        return importlib.util.find_spec(f"{BUNDLED_PACKAGE}.{name}") is not None
    except (ImportError, ValueError):
        return False


def _is_bundled(name: str) -> bool:
    """Whether ``name`` is one of :func:`_bundled_modules`, without listing the package."""
    return (
        not name.startswith("_") and name not in _NOT_PLATFORMS
        and not name.endswith(SCHEMA_SUFFIX) and _in_package(name)
    )


def _bundled_modules() -> list[str]:
    return sorted(
        name
        for name in _package_modules()
        if not name.startswith("_") and name not in _NOT_PLATFORMS
        and not name.endswith(SCHEMA_SUFFIX)
    )


def bundled_platforms() -> list[str]:
    """Bundled modules that really are platforms (shared helpers in the package are skipped)."""
    names = []
    for name in _bundled_modules():
        try:
            module = importlib.import_module(f"{BUNDLED_PACKAGE}.{name}")
        except Exception:  # noqa: BLE001, S112 - a broken module is not offered as a choice
            continue
        if hasattr(module, "async_setup_platform"):
            names.append(name)
    return names


def known_platforms() -> list[str]:
    return sorted(set(bundled_platforms()) | set(_entry_points()))


@cache
def get_platform(name: str) -> ModuleType:
    """The module for platform ``name``: bundled first, then the entry-point group."""
    if _is_bundled(name):
        module = importlib.import_module(f"{BUNDLED_PACKAGE}.{name}")
    else:
        entry = _entry_points().get(name)
        if entry is None:
            raise PlatformNotFound(name, known_platforms())
        loaded = entry.load()
        if not isinstance(loaded, ModuleType):
            raise PlatformNotFound(name, known_platforms(), "its entry point is not a module")
        module = loaded
    if not gives_platform_schema(module) or not hasattr(module, "async_setup_platform"):
        raise PlatformNotFound(
            name, known_platforms(), "the module lacks PLATFORM_SCHEMA or async_setup_platform"
        )
    return module


@cache
def platform_checks(name: str) -> ModuleType:
    """Where platform ``name``'s ``PLATFORM_SCHEMA`` (and ``environment_problems``) are read
    from to check a configuration: a bundled platform's ``<name>_schema`` module when it has
    one (voluptuous and plain data: no link, no asyncio), else the platform's own module."""
    if _is_bundled(name) and _in_package(f"{name}{SCHEMA_SUFFIX}"):
        return importlib.import_module(f"{BUNDLED_PACKAGE}.{name}{SCHEMA_SUFFIX}")
    return get_platform(name)


def validate_trigger(
    trigger: Any, raw: Any, prefix: list[Any]
) -> tuple[dict[str, Any] | None, list[ConfigError]]:
    """Check one trigger entry against its platform's schema; located errors, never a raise."""
    default = locate(raw, prefix, None) or Position("?", 0)
    name = str(trigger.get("platform"))
    try:
        module = platform_checks(name)
    except PlatformNotFound as err:
        where = locate(raw, [*prefix, "platform"], default) or default
        return None, [ConfigError(where.file, where.line, _path(prefix, "platform"), str(err))]
    except Exception as err:  # noqa: BLE001 - a broken third-party platform must not hide other mistakes
        where = locate(raw, [*prefix, "platform"], default) or default
        return None, [
            ConfigError(
                where.file,
                where.line,
                _path(prefix, "platform"),
                f"platform {name!r} failed to load: {type(err).__name__}: {err}",
            )
        ]
    schema = module.PLATFORM_SCHEMA  # read once: a platform may build it on each read
    value, errors = validate(schema, trigger, raw, prefix, default)
    errors.extend(_unknown_keys(schema, trigger, raw, prefix, default))
    return (value if not errors else None), errors


def _unknown_keys(
    schema: Any, trigger: dict[str, Any], raw: Any, prefix: list[Any], default: Position
) -> list[ConfigError]:
    """Keys no schema knows. The base schema allows extras so platforms can extend it, which
    would let a typo (``prise:``) pass silently; so they are checked here."""
    known = known_keys(schema)
    if not known:  # a schema that cannot be read this way: trust it
        return []
    errors = []
    for key in trigger:
        if key in known:
            continue
        where = locate(raw, [*prefix, key], default) or default
        close = suggest(str(key), sorted(known))
        fix = f"did you mean {close!r}?" if close else f"known keys: {', '.join(sorted(known))}"
        errors.append(
            ConfigError(
                where.file, where.line, _path(prefix, str(key)), f"unknown key {key!r}", fix
            )
        )
    return errors


def _path(prefix: list[Any], key: str) -> str:
    return format_path([*prefix, key])


def setup_function(name: str) -> PlatformSetup:
    setup: PlatformSetup = get_platform(name).async_setup_platform
    return setup
