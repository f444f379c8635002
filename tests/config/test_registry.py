"""The platform registry: bundled platforms by name, shared modules never taken for one."""

from __future__ import annotations

import pytest

from kiosk_agent.config.registry import PlatformNotFound, get_platform, known_platforms


def test_the_bundled_platforms_are_listed_and_their_helpers_are_not() -> None:
    known = known_platforms()
    assert {"gpio", "kiosk_api", "mdb", "serial_line", "virtual"} <= set(known)
    assert not {"base", "serial", "mdb_protocol"} & set(known)


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
