"""The factories the commands hand to ``kiosk_agent.app``: the simulator a configuration embeds
(``service: {simulator: ...}``) and the simulated machines of its ``virtual`` triggers.

Apart from ``cli.sim`` (the ``sim`` command, its options and its READY line), so that every
``run`` hands them over without importing that command: each imports the simulator only when it
makes one, and nothing below the command line imports ``kiosk_agent.sim``.
"""

from __future__ import annotations

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


def simulated_machines(
    *, products: dict[str, int], dispense_time: float, dex: bool, seed: int | None
) -> VirtualController:
    """The factory of the agent's ``virtual`` triggers (``Agent.machines``), imported only when a
    machine is made. Not in ``cli.virtual`` (the ``virtual`` command, with the MDB adapter's wire
    codec): every ``run`` hands it over, and one with no virtual trigger loads neither."""
    from kiosk_agent.sim.machine import make_machine

    return make_machine(products=products, dispense_time=dispense_time, dex=dex, seed=seed)
