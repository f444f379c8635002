"""Fixtures for the platforms: a virtual vending machine on a real pty, and the agent's side."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kiosk_agent.sim.machine import ControllerOptions, VirtualController

from .vending_rig import Machine, make_machine


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[VirtualController]:
    vc = VirtualController(
        ControllerOptions(
            products={"A1": 150, "A2": 250, "B1": 325, "D2": 102},
            dispense_time=0.01,
            patience=5.0,
            link_path=tmp_path / "usb-Qibixx_MDB_Pi_HAT-if00",
        ),
        seed=7,
    )
    await vc.start()
    yield vc
    await vc.stop()


@pytest.fixture
async def machine(controller: VirtualController) -> AsyncIterator[Machine]:
    # a guard, not a bound: the controller's vend result (in this process, over a pty) comes
    # however late a starved loop reads it; a test that means the timeout sets a short one
    m = await make_machine(controller, vend_timeout=60)
    yield m
    with contextlib.suppress(Exception):
        await m.device.stop()
