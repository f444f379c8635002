"""The factories the commands hand to ``kiosk_agent.app``: the simulator a configuration embeds
(``service: {simulator: ...}``) and the simulated machines of its ``virtual`` triggers.

Apart from ``cli.sim`` (the ``sim`` command, its options and its READY line), so that every
``run`` hands them over without importing that command: each imports the simulator only when it
makes one, and nothing below the command line imports ``kiosk_agent.sim``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kiosk_agent.sim.machine import VirtualController
    from kiosk_agent.sim.server import SimServer


def embedded_simulator(conf: dict[str, Any]) -> SimServer:
    """The simulator a configuration embeds (``service: {simulator: ...}``) on a free port: the
    factory the commands hand to ``app.configured_service``."""
    from kiosk_agent.sim.server import SimOptions, SimServer

    options = SimOptions(port=0, time_scale=conf["time_scale"], seed=conf["seed"],
                         transactions=conf["transactions"])
    return SimServer(options)


class RunningSimulator:
    """The simulator of the demo running on a configuration, as the service commands on that
    configuration use it: the demo's sales and readers are there (one started for the command
    would hold none of them). Never started nor stopped here: it is the demo's."""

    def __init__(self, info: dict[str, Any]) -> None:
        self._info = {k: v for k, v in info.items() if k != "pid"}
        self.pid = info.get("pid")

    @property
    def base_url(self) -> str:
        return str(self._info["base_url"])

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def ready_info(self) -> dict[str, Any]:
        return dict(self._info)


def command_simulator(config: Any) -> Callable[[dict[str, Any]], SimServer | RunningSimulator]:
    """The simulator factory of a service command on ``config``: the running demo's simulator
    where a demo runs on it (cli/demo_admin.py), else one started for the command."""
    from kiosk_agent.cli.demo_admin import running_demo_simulator

    found = running_demo_simulator(config, str(config.path))
    if found is None:
        return embedded_simulator
    return lambda _conf: RunningSimulator(found)


def simulated_machines(
    *, products: dict[str, int], dispense_time: float, dex: bool, seed: int | None
) -> VirtualController:
    """The factory of the agent's ``virtual`` triggers (``Agent.machines``), imported only when a
    machine is made. Not in ``cli.virtual`` (the ``virtual`` command, with the MDB adapter's wire
    codec): every ``run`` hands it over, and one with no virtual trigger loads neither."""
    from kiosk_agent.sim.machine import make_machine

    return make_machine(products=products, dispense_time=dispense_time, dex=dex, seed=seed)
