"""The service commands on a running demo's configuration ask the demo's simulator, where its
sales and readers are: a remote admin's `report transactions -c config/demo.yaml` beside a
selling demo said "0 transactions" (a simulator started for the command, holding none of the
journal's charges), `terminals ping` found a reader the demo had offline online, and `doctor`
passed every ping meanwhile (i42-newcomer). Each is a process, as a person runs it, held to the
journal (`sales --json`) and the demo's own simulator."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import stat
import sys
from decimal import Decimal
from pathlib import Path

from kiosk_agent.sales.machine import MACHINE_ROOT_ENV
from tests.cli.test_demo import (  # noqa: F401 - demo_home: the demo's home, autouse there
    DEMO_CONFIG,
    REPO,
    _demo_admin_file,
    _env,
    _said,
    _start_demo,
    demo_home,
)
from tests.helpers import sim_call, until


async def _command(home: Path, *argv: str) -> tuple[int, str, str]:
    """``kiosk-agent ARGV -c config/demo.yaml`` as a process, with no ``KIOSK_*`` service
    variables (the configuration alone says where the service is), on the tests' machine
    (``KIOSK_MACHINE_ROOT``, tests/conftest.py) as the demo is: else its unit check reads the
    host's, and the demo's journal is one made on another machine."""
    env = {k: v for k, v in _env().items()
           if not k.startswith("KIOSK_") or k == MACHINE_ROOT_ENV}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kiosk_agent", *argv, "-c", str(DEMO_CONFIG),
        cwd=REPO, env={**env, "HOME": str(home)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


class _Sim:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url


async def test_service_commands_on_a_running_demos_configuration_ask_its_simulator(
    demo_home: Path,  # noqa: F811 - the fixture imported above
) -> None:
    out, err = demo_home / "demo.out", demo_home / "demo.err"
    proc = await _start_demo("--speed", "5", out=out, err=err)
    admin_file = _demo_admin_file(demo_home)
    try:
        await until(lambda: "COMPLETED" in _said(out), 60)
        assert stat.S_IMODE(admin_file.stat().st_mode) == 0o600
        [listening] = re.findall(r"simulator listening on (http://\S+);", _said(out))
        sim = _Sim(listening)

        # the journal first, then reporting: every charge the journal holds is there, as much
        code, said, complaint = await _command(demo_home, "sales", "--kind", "all", "--all",
                                               "--json")
        assert code == 0, complaint
        sales = [s for s in json.loads(said) if s["trans_id"]]
        assert sales, said
        code, said, complaint = await _command(demo_home, "report", "transactions", "--json")
        assert code == 0, complaint
        assert "the simulator of the demo running on it" in complaint
        rows = {r["trans_id"]: r for r in json.loads(said)}
        for sale in sales:
            row = rows[sale["trans_id"]]  # before: 0 transactions, a simulator of its own
            assert row["order_id"] == sale["order_id"]
            if sale["state"] == "completed":
                assert (row["status"], Decimal(row["amount"])) == (
                    "captured", Decimal(sale["captured"]))
            elif sale["state"] == "reversed":
                assert (row["status"], Decimal(row["amount"])) == (
                    "voided", Decimal(sale["reversed"]))
        completed = [s for s in sales if s["state"] == "completed"]
        assert sum(Decimal(s["captured"]) for s in completed) == sum(
            Decimal(rows[s["trans_id"]]["amount"]) for s in completed)

        # a reader the demo's simulator has offline is offline for `terminals ping` and doctor
        await sim_call(sim, "POST", "/sim/terminals/SIM-0008/offline")
        code, said, complaint = await _command(demo_home, "terminals", "ping", "SIM-0008",
                                               "--json")
        assert code == 1, said + complaint  # before: 0, online on a simulator of its own
        assert json.loads(said)["online"] is False
        code, said, complaint = await _command(demo_home, "doctor", "--json")
        assert code == 1, said + complaint
        failed = [c for c in json.loads(said)["checks"] if c["verdict"] == "FAIL"]
        assert [c["name"] for c in failed] == ["ping SIM-0008"], failed
        await sim_call(sim, "POST", "/sim/terminals/SIM-0008/online")

        os.kill(proc.pid, signal.SIGINT)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0, err.read_text()
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
    # the demo ended: a command starts a simulator of its own again, and says so
    code, said, complaint = await _command(demo_home, "report", "transactions", "--json")
    assert code == 0, complaint
    assert "started the embedded simulator" in complaint
    assert json.loads(said) == []
