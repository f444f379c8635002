"""What a field tech reads in `kiosk-agent health` when the MDB adapter is unplugged under a
running agent: the real agent, its adapter a pty behind a by-id style link, the health the
admin API sends (its JSON), read by the command's own formatter."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from kiosk_agent.cli.fleet import format_health
from kiosk_agent.sim.machine import VirtualController

from ..helpers import until
from .agent_rig import front, front_link, running_agent


async def test_an_unplugged_adapter_says_what_is_missing_what_to_check_and_since_when(
    tmp_path: Path, sim_settings: Any, controller: VirtualController
) -> None:
    trigger = front(controller)
    async with running_agent(tmp_path, sim_settings, [trigger]) as agent:
        await asyncio.wait_for(controller.wait_enabled(), 5)
        await until(lambda: any(a.available for a in agent.health.snapshot().availability))

        controller.unplug()  # the pty and its by-id link are gone, as when the cable is pulled
        await until(lambda: "adapter not found" in front_link(agent).detail)
        snapshot = agent.health.snapshot().model_dump(mode="json")
        text = format_health(snapshot)
        [line] = [line for line in text.splitlines() if line.startswith("link:")]
        # what is missing (the path configured), what to check, since when; no pyserial errno
        assert f"{controller.port} is not there" in line
        assert "check the USB cable and the adapter" in line
        assert "`ls /dev/serial/by-id/`" in line
        assert re.search(r" disconnected since \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ adapter", line)
        assert "Errno" not in line
        assert line.endswith("<-")
        assert text.count("adapter not found") == 1  # the link's problem is that line, once
        assert "link mdb:front disconnected adapter not found" in " ".join(snapshot["problems"])
        # the reader still takes cards at the service, as Home Assistant's Card payments says;
        # the line says no customer can pay on that machine meanwhile
        [cards] = [line for line in text.splitlines() if line.startswith("cards:")]
        assert cards == ("cards:    1 of 1 reader can take cards at the service, but no customer "
                         "can pay on mdb:front: the machine cannot reach the agent (link below)")
        assert [a["available"] for a in snapshot["availability"]] == [True]

        controller.plug()  # back: the line is the connected one, the cards line plain again
        await asyncio.wait_for(controller.wait_enabled(), 5)
        text = format_health(agent.health.snapshot().model_dump(mode="json"))
        assert "cards:    1 of 1 reader can take cards\n" in text + "\n"
        assert "adapter not found" not in text
