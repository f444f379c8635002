"""The agent as a real process for the crash test: recover, then sell once, and stop dead on cue.

    python crash_driver.py CONFIG MARKERS [FLOW CENTS DISPENSE KILL_AT[a]]

It builds the Agent from CONFIG exactly as ``kiosk-agent run`` would (minus platforms), lets
recovery finish whatever the previous (killed) process left open, then starts one sale with a
scripted machine. Every journal step is announced on stdout as ``STEP n name state sale_id``
right after it is committed; at step KILL_AT the process prints ``KILLME`` and freezes so the
test can SIGKILL it before the call that step announced. With ``KILL_AT`` suffixed ``a``
it freezes instead when that call's answer arrives, before the flow can journal it: the
"answer lost" crash. A confirmed vend is appended (and
fsynced) to MARKERS before the machine reports it, as a real machine's counter would be.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from kiosk_agent.core.agent import Agent, service_settings_from_config
from kiosk_agent.core.config import load_config
from kiosk_agent.core.journal import Journal, SaleRecord
from kiosk_agent.core.sale import (
    DispenseOutcome,
    DispenseStatus,
    Flow,
    SaleRequest,
)


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def freeze() -> None:
    say("KILLME")
    time.sleep(3600)  # frozen: the test SIGKILLs this process now


class MarkedJournal(Journal):
    """The real journal, announcing each committed step; frozen at the chosen one."""

    kill_at = 0
    on_answer = False  # freeze when the next service call answers, not at the step itself
    armed = False
    selling = False
    count = 0

    def arm(self, spec: str) -> None:
        """``"5"``: freeze after step 5; ``"5a"``: freeze when the call after step 5 answers."""
        self.on_answer = spec.endswith("a")
        self.kill_at = int(spec.rstrip("a"))
        self.count = 0
        self.selling = True

    def _announce(self, sale: SaleRecord, step: str) -> None:
        if not self.selling:
            return
        self.count += 1
        say(f"STEP {self.count} {step} {sale.state.value} {sale.sale_id}")
        if self.count == self.kill_at:
            if self.on_answer:
                self.armed = True
            else:
                freeze()  # after the commit, before the call it announces

    def create(self, sale: SaleRecord, detail: Any = None) -> SaleRecord:
        created = super().create(sale, detail)
        self._announce(created, "created")
        return created

    def record(
        self, sale: SaleRecord, step: str, state: Any = None, detail: Any = None, **changes: Any
    ) -> SaleRecord:
        updated = super().record(sale, step, state, detail, **changes)
        self._announce(updated, step)
        return updated


# The calls of the flows that move money or start an interaction.
MONEY_CALLS = {
    "terminal": ("charge_card", "read_card"),
    "payments": ("charge", "capture", "void_or_refund"),
}


def freeze_on_answer(agent: Agent, journal: MarkedJournal) -> None:
    """Wrap the real client's calls so an armed journal freezes the process on their answer."""
    for part, names in MONEY_CALLS.items():
        client = getattr(agent.service, part)
        for name in names:
            call = getattr(client, name)

            async def answered(*args: Any, _call: Any = call, **kwargs: Any) -> Any:
                result = await _call(*args, **kwargs)
                if journal.armed:
                    freeze()  # the service acted; the agent never hears of it
                return result

            setattr(client, name, answered)


class Machine:
    def __init__(self, status: DispenseStatus, markers: Path) -> None:
        self.status = status
        self.markers = markers
        self.sale_id = ""

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        vended = min(authorized_cents, 175) if self.status is DispenseStatus.VENDED else 0
        if self.status is DispenseStatus.VENDED:
            with self.markers.open("a") as out:
                out.write(f"{self.sale_id} {vended}\n")
                out.flush()
                os.fsync(out.fileno())
        return DispenseOutcome(self.status, vended_cents=vended)

    async def deny(self, reason: str) -> None:
        return None


async def main(argv: list[str]) -> int:
    config = load_config(argv[0])
    if os.environ.get("CRASH_DRIVER_LOG"):
        logging.basicConfig(level=os.environ["CRASH_DRIVER_LOG"])
    markers = Path(argv[1])
    journal = MarkedJournal(config.resolve(config["journal"]["path"]))
    agent = Agent(config, service_settings_from_config(config), journal=journal)
    freeze_on_answer(agent, journal)
    if os.environ.get("CRASH_RECOVERY_KILL"):  # crash again, while recovering
        journal.arm(os.environ["CRASH_RECOVERY_KILL"])
    await agent.start()
    recovered = await agent.recovery.wait()
    journal.selling = journal.armed = False
    say("RECOVERED " + json.dumps({e.sale_id: e.state.value for e in recovered}))
    if len(argv) > 2:
        flow, cents, dispense, kill_at = Flow(argv[2]), int(argv[3]), argv[4], argv[5]
        machine = Machine(DispenseStatus(dispense), markers)
        journal.arm(kill_at)
        sale = await agent.sales.start(
            SaleRequest(source="crash:driver", flow=flow, amount_cents=cents), machine
        )
        machine.sale_id = sale.sale_id
        event = await sale.result()
        journal.selling = False
        say(f"DONE {event.sale_id} {event.state.value}")
    await agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
