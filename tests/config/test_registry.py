"""The platform registry: bundled platforms by name, shared modules never taken for one."""

from __future__ import annotations

import types
from typing import Any

import pytest

from kiosk_agent.config import load, registry
from kiosk_agent.config.load import known_keys
from kiosk_agent.config.registry import (
    PlatformNotFound,
    get_platform,
    known_platforms,
    platform_checks,
    validate_trigger,
)


def test_the_bundled_platforms_are_listed_and_their_helpers_are_not() -> None:
    known = known_platforms()
    assert {"gpio", "kiosk_api", "mdb", "serial_line", "virtual"} <= set(known)
    assert not {"base", "serial", "mdb_protocol"} & set(known)
    assert not [name for name in known if name.endswith("_schema")]


def test_a_shared_module_is_an_unknown_platform() -> None:
    with pytest.raises(PlatformNotFound) as err:
        get_platform("mdb_protocol")
    assert str(err.value) == (
        "unknown platform 'mdb_protocol'; known platforms: gpio, kiosk_api, mdb, serial_line, "
        "virtual"
    )


def test_a_platform_module_has_its_schema_and_setup() -> None:
    module = get_platform("serial_line")
    assert module.PLATFORM_SCHEMA is not None
    assert callable(module.async_setup_platform)


@pytest.mark.parametrize("name", ["mdb", "virtual", "serial_line", "gpio"])
def test_a_platform_checked_from_its_schema_module_is_checked_by_the_schema_it_runs_with(
    name: str,
) -> None:
    """check-config reads the schema from `<name>_schema` (no link, no asyncio); the platform
    reads that module's schema, so what is checked is what runs. Neither keeps it: it is built
    on each read (a running agent checks its configuration once, at start)."""
    checks = platform_checks(name)
    assert checks.__name__ == f"kiosk_agent.platforms.{name}_schema"
    platform = get_platform(name)
    assert "PLATFORM_SCHEMA" not in vars(platform)
    assert "PLATFORM_SCHEMA" not in vars(checks)
    assert known_keys(platform.PLATFORM_SCHEMA) == known_keys(checks.PLATFORM_SCHEMA)
    with pytest.raises(PlatformNotFound, match=f"unknown platform '{name}_schema'"):
        get_platform(f"{name}_schema")


def test_a_platform_without_a_schema_module_is_checked_from_its_own_module() -> None:
    assert platform_checks("kiosk_api") is get_platform("kiosk_api")


@pytest.mark.parametrize("name", ["kiosk_api", "mdb", "virtual", "serial_line", "gpio"])
def test_finding_a_platform_builds_no_schema(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its schema is built on each read: the registry does not build one only to see that it is
    there (a start built each trigger's twice, the first thrown away); validating a trigger
    builds it once."""
    builds: list[str] = []
    build = load._BuiltOnRead.__call__

    def counted(self: Any, attribute: str) -> Any:
        built = build(self, attribute)  # AttributeError for a name it does not build (the
        builds.append(attribute)  # import system's look for __path__ at a first import)
        return built

    monkeypatch.setattr(load._BuiltOnRead, "__call__", counted)
    get_platform.cache_clear()
    platform_checks.cache_clear()
    module = get_platform(name)
    assert builds == []
    assert load.gives_platform_schema(module)
    trigger = {"platform": name}
    validate_trigger(trigger, trigger, ["triggers", 0])
    assert builds == ["PLATFORM_SCHEMA"]


def test_a_module_gives_a_platform_schema_only_when_it_has_one() -> None:
    module = types.ModuleType("kiosk_agent.platforms.broken")
    module.async_setup_platform = lambda agent, conf: None  # type: ignore[attr-defined]
    assert not load.gives_platform_schema(module)
    module.PLATFORM_SCHEMA = load.PLATFORM_SCHEMA  # type: ignore[attr-defined]
    assert load.gives_platform_schema(module)
@pytest.mark.parametrize(
    "name",
    ["mdb", "kiosk_api", "virtual", "mdb_schema", "base", "mdb_protocol", "_private", "__init__",
     "nonexistent", "", "mdb.schema", "../mdb", "mdb ", "class", "Mdb", "serial"],
)
def test_a_platform_is_looked_up_by_name_as_the_packages_listing_would_find_it(name: str) -> None:
    # a run asks the import system for its one platform; listing the package (pkgutil) is left
    # to the names an error or a listing shows
    assert registry._is_bundled(name) == (name in registry._bundled_modules())
    if not name.startswith("_"):  # the package's own __init__ is no module of it
        assert registry._in_package(name) == (name in registry._package_modules())
