"""app.build_agent: the configured triggers and sections become a running agent."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from kiosk_agent.app import build_agent, load_agent
from kiosk_agent.core.config import load_config


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
    agent = build_agent(load_config(write(tmp_path)), sim_settings, systemd=False)
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
    agent = load_agent(write(tmp_path), sim_settings, systemd=False)
    assert agent.settings.default_terminal == "SIM-0001"
    assert agent.config["triggers"][0]["platform"] == "virtual"
