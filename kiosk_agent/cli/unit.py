"""`kiosk-agent unit show|adopt`: this unit's identity (kiosk_agent/sales/unit.py).

``show`` reads the journal only. ``adopt`` is what a person runs on a unit whose journal was
made on another machine (a cloned SD card): it gives the unit a new id on this machine, so
its future order ids differ and the charges under the old id stay the original unit's. It
works beside the running agent, which takes it within a second (docs/journal.md, "Whose
money").
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kiosk_agent.cli.contract import (
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    guarded,
    open_journal,
    options,
    say,
    show,
    unit_config,
)
from kiosk_agent.moments import in_utc

if TYPE_CHECKING:
    pass


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    unit = subparsers.add_parser(
        "unit", parents=options(),
        help="this unit's id and the machine its journal was made on; adopt a cloned journal",
        description="The unit's identity, kept in its journal. Without an action: `unit show`.",
    )  # fmt: skip
    unit.set_defaults(handler=guarded(show_command))
    actions = unit.add_subparsers(dest="action", metavar="ACTION")
    shown = actions.add_parser(
        "show", parents=options(),
        help="the unit's id, the machine its journal was made on and when (the default)",
    )  # fmt: skip
    shown.set_defaults(handler=guarded(show_command))
    adopt = actions.add_parser(
        "adopt", parents=options(),
        help="confirm a journal made on another machine (a cloned SD card) under a new unit id",
        description="A journal found on another machine than the one it was made on takes no "
        "customer until a person confirms it here. The unit gets a new id on this machine: its "
        "future order ids carry it, and every charge and open sale under the old id stays the "
        "original unit's (never given back from here). Works beside the running agent.",
    )  # fmt: skip
    adopt.set_defaults(handler=guarded(adopt_command))


async def show_command(args: argparse.Namespace) -> int:
    from kiosk_agent.sales import unit
    from kiosk_agent.sales.machine import this_machine

    journal = open_journal(unit_config(args))
    try:
        history = unit.rows(journal.db)
    finally:
        journal.close()
    if not history:
        raise CliError(f"the journal at {journal.path} has no unit id yet: the agent makes one "
                       "at its next start")
    current, here = history[-1], this_machine().at(journal.path)
    mismatch = current.machine.differs(here)
    show(args, [
        ("unit_id", current.unit_id),
        ("machine", current.machine.describe()),
        ("made_at", in_utc(current.made_at)),  # ISO 8601 in JSON, 2026-11-28 21:47:03Z here
        ("why", current.why),
        ("this_machine", here.describe()),
        ("confirmed", not mismatch),
        ("mismatch", mismatch or None),
        ("former_ids", [r.unit_id for r in history[:-1]]),
    ])  # fmt: skip
    return EXIT_FAILED if mismatch else EXIT_OK


async def adopt_command(args: argparse.Namespace) -> int:
    from kiosk_agent.sales import unit
    from kiosk_agent.sales.machine import this_machine

    journal = open_journal(unit_config(args), to_write=True)
    here = this_machine().at(journal.path)
    try:
        current = unit.current(journal.db)
        if current is None:
            raise CliError(f"the journal at {journal.path} has no unit id yet: nothing to adopt "
                           "(the agent makes one at its next start)")
        if not current.machine.differs(here):
            raise CliError(f"unit {current.unit_id}'s journal was made on this machine "
                           f"({here.describe()}): nothing to adopt")
        former, fresh = unit.adopt(journal.db, journal.path, here)
    finally:
        journal.close()
    say(
        args,
        f"unit adopted on this machine: now unit {fresh.unit_id} (was {former.unit_id}, made on "
        f"{former.machine.describe()}). Its new order ids carry {fresh.unit_id}; charges and "
        f"open sales under {former.unit_id} stay that unit's. A running agent takes it within "
        "a second.",
        unit_id=fresh.unit_id, former_unit_id=former.unit_id,
        machine=here.describe(), former_machine=former.machine.describe(),
    )  # fmt: skip
    return EXIT_OK
