"""app.build_agent: the configured triggers and sections become a running agent."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kiosk_agent.app import NoSimulator, agent_for, build_agent, configured_service, load_agent
from kiosk_agent.cli import contract, service_access
from kiosk_agent.cli.sim import embedded_simulator
from kiosk_agent.cli.virtual import simulated_machines
from kiosk_agent.config.load import load_config
from kiosk_agent.sales.owner import JournalLock, JournalOwned
from kiosk_agent.sales.settings import SaleSettings
from kiosk_agent.service.settings import DEFAULT_TIMEOUT, ServiceSettings


def write(directory: Path) -> Path:
    secrets = directory / "secrets.yaml"
    secrets.write_text("admin_token: an-admin-token-of-at-least-24-chars\n")
    secrets.chmod(0o600)
    path = directory / "config.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            service:
              simulator: {time_scale: 50}
            terminals: [{device_id: SIM-0001}]
            journal: {path: journal.db}
            triggers:
              - platform: virtual
                name: lobby
                customers: false
            admin:
              port: 0
              tokens: [{name: tech, token: !secret admin_token}]
            """
        )
    )
    return path


async def test_triggers_and_sections_are_wired_and_started(
    sim_settings: Any, tmp_path: Path
) -> None:
    agent = build_agent(load_config(write(tmp_path)), sim_settings, systemd=False,
                        machines=simulated_machines)
    await agent.start()
    try:
        [platform] = agent.platforms
        assert platform.name.endswith("lobby")
        assert isinstance(platform.status(), dict)
        assert [type(c).__name__ for c in agent.components] == ["AdminServer"]
    finally:
        await agent.stop()
    assert not agent.started


def test_load_agent_reads_the_file(sim_settings: Any, tmp_path: Path) -> None:
    agent = load_agent(write(tmp_path), sim_settings, systemd=False, machines=simulated_machines)
    assert agent.settings.default_terminal == "SIM-0001"
    assert agent.config["triggers"][0]["platform"] == "virtual"


# -- one assembly, one owner, one default --------------------------------------------------------


async def test_agent_for_refuses_a_journal_another_agent_owns_before_anything_starts(
    tmp_path: Path,
) -> None:
    config = load_config(write(tmp_path))
    journal = tmp_path / "journal.db"
    with JournalLock(journal):  # another agent, as far as this one can tell
        with pytest.raises(JournalOwned):
            async with agent_for(config, systemd=False, simulator=embedded_simulator):
                raise AssertionError("assembled beside the owner")
        assert not journal.exists()  # not opened, not created: nothing read or written
    async with agent_for(
        config, systemd=False, simulator=embedded_simulator, machines=simulated_machines
    ) as (agent, service):
        assert service.simulator is not None  # the embedded one, started for this block
        assert agent.service.settings.base_url == service.simulator.base_url
        await agent.start()
        with pytest.raises(JournalOwned):  # and now this one owns it
            JournalLock(journal).acquire()
    assert not agent.started  # stopped when the block ended, and the journal let go
    JournalLock(journal).acquire()


async def test_configured_service_is_the_real_one_when_no_simulator_is_embedded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIOSK_TEST_KEY", "sk_test_key")
    config = load_config(real_service(tmp_path))
    async with configured_service(config) as service:
        assert service.simulator is None
        assert service.settings.base_url == "https://pay.example.com"
        assert service.settings.credentials_path == tmp_path / "keys.json"


async def test_an_embedded_simulator_is_made_only_by_the_factory_the_command_line_passes(
    tmp_path: Path,
) -> None:
    config = load_config(write(tmp_path))  # service: {simulator: ...}
    with pytest.raises(NoSimulator, match=r"service\.simulator: this caller cannot start"):
        async with configured_service(config):
            raise AssertionError("a simulator made below the command line")
    made: list[dict[str, Any]] = []

    def factory(conf: dict[str, Any]) -> Any:
        made.append(conf)
        return embedded_simulator(conf)

    async with configured_service(config, factory) as service:
        assert service.simulator is not None
        assert service.settings.base_url == service.simulator.base_url
    assert made == [config["service"]["simulator"]]


def real_service(directory: Path, timeout: str = "") -> Path:
    path = directory / ("real-timed.yaml" if timeout else "real.yaml")
    path.write_text(
        textwrap.dedent(
            f"""\
            service:
              base_url: https://pay.example.com
              api_key: !env_var KIOSK_TEST_KEY
              mid: "1"
              {timeout}
            terminals: [{{device_id: SIM-0001}}]
            """
        )
    )
    return path


async def test_service_timeout_has_one_default_in_the_schema_the_cli_and_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIOSK_TEST_KEY", "sk_test_key")
    config = load_config(real_service(tmp_path))
    default = ServiceSettings.model_fields["timeout"].default
    assert default == DEFAULT_TIMEOUT
    assert config["service"]["timeout"] == default  # the config schema's
    assert default == contract.DEFAULT_TIMEOUT_S  # the CLI's --timeout
    assert SaleSettings(mid="1", terminals={}).request_timeout == default
    agent = build_agent(config, systemd=False, machines=simulated_machines)
    assert agent.settings.request_timeout == agent.service.settings.timeout == default

    # a service command: --timeout, else the configuration's service.timeout, else the default
    configured = real_service(tmp_path, timeout="timeout: 7")
    for argv, expected in [
        (["-c", str(configured)], 7.0),
        (["-c", str(configured), "--timeout", "3"], 3.0),
        (["-c", str(real_service(tmp_path))], default),
    ]:
        args = argparse.Namespace(**vars(parse_terminals(argv)))
        async with service_access.service_settings(args) as settings:
            assert settings.timeout == expected, argv


def parse_terminals(argv: list[str]) -> argparse.Namespace:
    from kiosk_agent.cli import build_parser

    return build_parser("terminals").parse_args(["terminals", "list", *argv])


def _files(journal: Path) -> dict[str, tuple[int, int, int]]:
    """Each of the journal's files as (inode, size, mtime in ns): any write shows."""
    found = {}
    for part in (journal, journal.with_name(journal.name + "-wal"),
                 journal.with_name(journal.name + "-shm")):  # fmt: skip
        if part.exists():
            st = part.stat()
            found[part.name] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return found


async def test_a_refused_agent_leaves_an_existing_journal_and_its_open_sale_untouched(
    sim_settings: Any, tmp_path: Path
) -> None:
    """The owner has a sale open (a crash would leave it for recovery): a second agent, by
    ``agent_for`` or by ``Agent.start`` itself, is refused and neither recovers nor writes."""
    from kiosk_agent.sales.journal import Journal, SaleRecord
    from kiosk_agent.sales.states import SaleState, Step

    config = load_config(write(tmp_path))
    path = tmp_path / "journal.db"
    owner = Journal(path)
    owner.open()
    sale = owner.create(
        SaleRecord(sale_id="open1", order_id="KAOPEN1", source="test", flow="charge_card",
                   terminal="SIM-0001", amount_cents=250, state=SaleState.STARTED)
    )  # fmt: skip
    owner.record(sale, Step.CHARGE_CARD_REQUEST, SaleState.CHARGING)
    before = _files(path)
    assert set(before) == {"journal.db", "journal.db-wal", "journal.db-shm"}
    with JournalLock(path):
        with pytest.raises(JournalOwned):
            async with agent_for(config, systemd=False, simulator=embedded_simulator):
                raise AssertionError("assembled beside the owner")
        second = build_agent(config, sim_settings, systemd=False,
                             machines=simulated_machines)
        with pytest.raises(JournalOwned):
            await second.start()
        assert not second.started
        assert second.recovery.state != "done"
        assert _files(path) == before
        [still] = owner.open_sales()
        assert (still.sale_id, still.state) == ("open1", SaleState.CHARGING)
        assert [s.step for s in owner.steps("open1")] == [Step.CREATED, Step.CHARGE_CARD_REQUEST]
    owner.close()
