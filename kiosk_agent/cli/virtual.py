"""``kiosk-agent virtual``: a virtual vending machine as its own process.

It plays the machine's controller and its MDB adapter (``sim/machine.py``) on a pty it
creates, or on a TCP port the agent opens as ``socket://host:port``, and keeps random customers
coming. It writes its own record of what it really did (``--record``, JSON lines, see
``VisitRecorder``), so a test knows what came out of the machine whatever happened to the agent.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiosk_agent.cli.contract import positive_int, positive_number, stop_on_signals
from kiosk_agent.cli.embedded import simulated_machines  # noqa: F401 - where the tests take it
from kiosk_agent.platforms import mdb_protocol as wire

# The controller and the configuration's price rule are imported when a machine starts (or a
# price is read): `--help` and shell completion build this parser without them.
if TYPE_CHECKING:
    from kiosk_agent.sim.machine import ControllerOptions, VirtualController

READY = "READY "  # printed once the machine can be opened: READY {json}
DONE = "DONE "  # printed when --count customers were served: DONE {json tally}
DEFAULT_PRODUCTS = ("A1=1.50", "A2=2.50", "B1=3.25")
_SOCKET = re.compile(r"^socket://(?P<host>[^:/]+):(?P<port>\d{1,5})$")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "virtual",
        help="run a virtual vending machine (MDB controller) for an agent to drive",
        description="Play a vending machine's controller and MDB adapter on a pty (default) or "
        "on a TCP port the agent opens as socket://HOST:PORT. Prints one line 'READY {json}' "
        "with the port to configure (a trigger's 'port:'), then random customers come. With "
        "--record, every selection, approval, denial, dispense and session end is written as "
        "a JSON line.",
    )
    parser.add_argument(
        "--listen",
        type=_listen,
        metavar="socket://HOST:PORT",
        help="serve the adapter on TCP instead of a pty (port 0: any free port)",
    )
    parser.add_argument("--name", default="virtual", help="the machine's name in its record")
    parser.add_argument(
        "--product",
        action="append",
        type=_product,
        metavar="CODE=PRICE",
        help='a product and its price ("A1=1.50" or cents "A1=150"); repeatable '
        f"(default {' '.join(DEFAULT_PRODUCTS)})",
    )
    parser.add_argument(
        "--rate", type=positive_number, default=0.5,
        help="customers per second on average (default 0.5)",
    )  # fmt: skip
    parser.add_argument(
        "--count", type=positive_int, help="serve this many customers, then print DONE and wait"
    )
    parser.add_argument("--seed", type=int, help="seed of the customers' choices")
    parser.add_argument(
        "--fail-rate", type=_share, default=0.1,
        help="share of approved vends the machine fails to dispense (default 0.1)",
    )  # fmt: skip
    parser.add_argument(
        "--dispense-time", type=positive_number, default=0.2,
        help="seconds from approval to the vend result (default 0.2)",
    )  # fmt: skip
    parser.add_argument(
        "--patience", type=positive_number, default=60.0,
        help="seconds a customer waits for the agent's answer (default 60)",
    )  # fmt: skip
    parser.add_argument(
        "--mode", choices=["selection_first", "card_first"], default="selection_first",
        help="selection first (default), or card first: wait for the agent's session",
    )  # fmt: skip
    parser.add_argument(
        "--amount-unit", choices=[u.value for u in wire.AmountUnit], default="dollars",
        help="amounts on the wire: 2.50 (dollars, default) or 250 (cents)",
    )  # fmt: skip
    parser.add_argument("--record", type=Path, help="append the machine's record here (JSON lines)")
    parser.add_argument(
        "--cash-rate", type=_share, default=0.0,
        help="share of customers who pay cash: counted in the machine's books only (default 0)",
    )  # fmt: skip
    parser.add_argument(
        "--dex", action="store_true",
        help="answer DEX on a pty of its own with the machine's books (READY's dex_port: a "
        "dex: section's port)",
    )  # fmt: skip
    parser.set_defaults(handler=run_virtual)


def _listen(text: str) -> tuple[str, int]:
    match = _SOCKET.match(text)
    if match is None or int(match["port"]) > 65535:
        raise argparse.ArgumentTypeError(f"expected socket://HOST:PORT, got {text!r}")
    return match["host"], int(match["port"])


def _product(text: str) -> tuple[str, int]:
    import voluptuous as vol

    from kiosk_agent.config.load import positive_price

    code, sep, price = text.partition("=")
    if not sep or not code or "," in code:
        raise argparse.ArgumentTypeError(f"expected CODE=PRICE like A1=1.50, got {text!r}")
    try:
        return code, positive_price(price)
    except vol.Invalid as err:
        raise argparse.ArgumentTypeError(f"price of {code}: {err.msg}") from None


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, got {text!r}")
    return value


def options_from_args(args: argparse.Namespace) -> ControllerOptions:
    from kiosk_agent.sim.machine import ControllerOptions

    products = dict(args.product or [_product(p) for p in DEFAULT_PRODUCTS])
    return ControllerOptions(
        products=products,
        unit=wire.AmountUnit(args.amount_unit),
        dispense_time=args.dispense_time,
        patience=args.patience,
        listen=args.listen,
        dex=args.dex,
    )


async def run_virtual(args: argparse.Namespace) -> int:
    from kiosk_agent.sim.machine import VirtualController, VisitRecorder

    controller = VirtualController(options_from_args(args), seed=args.seed)
    record = args.record.open("a", encoding="utf-8") if args.record else None
    try:
        if record is not None:
            VisitRecorder(record, args.name).attach(controller)
        try:
            await controller.start()
        except OSError as err:
            print(f"error: cannot open the virtual adapter: {err}", file=sys.stderr)
            return 1
        stop = stop_on_signals()
        info = {"name": args.name, "port": controller.port, "record": str(args.record or "")}
        if controller.dex is not None:
            info["dex_port"] = controller.dex.port
        print(f"{READY}{json.dumps(info)}", flush=True)
        customers = asyncio.create_task(_customers(controller, args))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({customers, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if customers.done():
            print(f"{DONE}{json.dumps(controller.tally())}", flush=True)
            await stopping
        # the customer at the machine finishes (a vend in flight is heard to its end)
        controller.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(customers), args.dispense_time + 5.0)
        customers.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await customers
        await controller.stop()
        return 0
    finally:
        if record is not None:
            record.close()


async def _customers(controller: VirtualController, args: argparse.Namespace) -> Any:
    mean = 1.0 / args.rate
    await controller.random_customers(
        args.count,
        card_first=args.mode == "card_first",
        gap=(0.5 * mean, 1.5 * mean),
        fail_rate=args.fail_rate,
        walk_away_rate=0.05,
        cash_rate=args.cash_rate,
    )
