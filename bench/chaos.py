"""Chaos: hundreds of SIGKILLs of the agent while the service is slow, loses answers and fails.

    python bench/chaos.py [--kills 300] [--machines 2] [--seed 1] [--no-faults]
                          [--no-clock-steps] [--dir DIR]
                          [--disk-full P] [--damage-journal wal_deleted|page_overwritten]
                          [--card-first] [--vend-timeout S]

The agent (``kiosk-agent run``), the simulator (``kiosk-agent sim``) and ``--machines`` vending
machines (``kiosk-agent virtual``) run as separate processes; the harness is
``tests/assembly/crash_driver.py`` (``Chaos``), the same one ``tests/assembly/test_chaos.py``
runs for 20 kills or more (until 10 sales: the test counts, this bench times them:
``sales_per_minute``).
The agent is killed during start, during recovery, within milliseconds of a money call and at
random, then restarted after a random pause, while ``/sim/faults`` makes some money calls slow
(longer than the pause), lose their answers or fail, and the agent's wall clock steps (libfaketime:
days or hours, either way, at random moments, kept across restarts). At the end one agent ends
every sale and the simulator's ledger and the machines' records judge the journal.

Prints kills, sales, sales recovered, every violation with the sale's journal steps, the unpaid
vends (vends the machine confirmed whose money went back because the agent died before hearing
the result; one with no ``late.vend`` on its sale, told to no person, is a violation:
``unpaid_vend_untold``) and the unpaid-vend window (journaled ``dispense.request`` to the vend
result journaled), the sales told "may have dispensed" (of them, how many the machine vended
nothing for: false alarms, a person checks the stock for nothing; and how many the machine's
later failure closed), then one JSON line. ``--vend-timeout S`` sets every trigger's vend
timeout: one below the machines' 0.05 s dispense makes live vend timeouts.

The journal's disk (root only): ``--disk-full P`` puts the journal on a tmpfs of its own and
fills it for 0.2 to 1.5 s in a fraction P of the rounds while sales run; ``--damage-journal``
deletes its WAL (or overwrites a page) once, half-way, between a kill and the restart.

``--card-first``: the authorize_capture machines (the even ones) sell card first: the agent
authorizes $5.00 (``max_funds``), opens the session, the customer chooses; the judge holds that
the chosen price the machine vended is what was kept, never the funds (``kept_wrong_amount``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._support import load_harness

# the harness is the test tree's file, loaded as it runs as a script: no `tests` package
_driver = load_harness("tests/assembly/crash_driver.py")
Chaos, ChaosOptions = _driver.Chaos, _driver.ChaosOptions


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=300)
    parser.add_argument("--machines", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-faults", action="store_true", help="kills only, no service faults")
    parser.add_argument(
        "--no-clock-steps", action="store_true", help="never step the agent's wall clock"
    )
    parser.add_argument("--dir", type=Path, help="keep the journal, records and logs here")
    parser.add_argument("--quiet", action="store_true", help="no line per kill")
    parser.add_argument("--disk-full", type=float, default=0.0, metavar="P",
                        help="fill the journal's own tmpfs in this fraction of the rounds")
    parser.add_argument("--damage-journal", choices=["wal_deleted", "page_overwritten"],
                        default="", help="damage the journal once, half-way")
    parser.add_argument("--card-first", action="store_true",
                        help="the authorize_capture machines sell card first")
    parser.add_argument("--vend-timeout", type=float, default=5.0, metavar="S",
                        help="every trigger's vend timeout (the machines dispense in 0.05 s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chaos-") as scratch:
        workdir = args.dir or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        options = ChaosOptions(
            workdir=workdir,
            kills=args.kills,
            machines=args.machines,
            seed=args.seed,
            faults=not args.no_faults,
            disk_full=args.disk_full,
            damage_journal=args.damage_journal,
            card_first=args.card_first,
            vend_timeout=args.vend_timeout,
            clock_steps=not args.no_clock_steps,
            log=(lambda _line: None) if args.quiet else (lambda line: print(line, flush=True)),
        )
        async with Chaos(options) as chaos:
            report = await chaos.run()
    summary = report.summary()
    print()
    print(f"kills             {report.kills}  {report.kill_modes}")
    print(f"agent starts      {report.restarts}")
    print(f"faults armed      {report.faults_armed} (contract: {report.fault_contract})")
    print(f"journal disk      {report.disk_full_episodes} time(s) full, "
          f"damaged: {report.journal_damaged or 'no'}")
    steps = ", ".join(f"{offset / 3600:+g} h" for offset in report.clock_steps) or "none"
    print(f"clock steps       {len(report.clock_steps)}: {steps}")
    print(f"sales             {report.sales}  {report.states}")
    print(f"sales recovered   {report.sales_recovered}")
    print(f"vends             {report.vends}")
    print(f"unpaid vends      {len(report.unpaid_vends)}")
    for line in report.unpaid_vends:
        print(f"  {line}")
    print(f"told maybe        {report.maybes} ('may have dispensed'; closed by the machine's "
          f"failure: {report.maybes_closed}; the machine vended nothing, a false alarm: "
          f"{len(report.maybe_not_vended)})")
    for line in report.maybe_not_vended:
        print(f"  {line}")
    print(
        f"unpaid-vend window p50 {summary['unpaid_vend_window_p50_ms']} ms, "
        f"p99 {summary['unpaid_vend_window_p99_ms']} ms (dispense.request -> vend result)"
    )
    print(f"violations        {len(report.violations)}")
    for violation in report.violations:
        print(f"  {violation.describe()}")
    print(f"duration          {report.duration_s:.0f} s, "
          f"{summary['sales_per_minute']} sales a minute (load average {os.getloadavg()[0]:.1f})")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
