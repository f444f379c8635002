"""``kiosk-agent sim``: the whole payment service, served locally for tests and demos."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiosk_agent.cli.contract import positive_number, stop_on_signals

# The simulator and the service's settings (pydantic) are imported when a simulator starts:
# `--help` and shell completion build this parser without them.
if TYPE_CHECKING:
    from kiosk_agent.service.settings import ServiceSettings
    from kiosk_agent.sim.server import SimOptions

DEFAULT_PORT = 8990
READY = "READY "  # the line `kiosk-agent sim` prints once it listens: READY {json}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="run the payment service simulator",
        description="Serve the payment service's whole interface locally. Prints one line "
        "'READY {json}' (addresses and credentials) once it listens.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any)"
    )
    parser.add_argument(
        "--time-scale", type=positive_number, default=1.0,
        help="run simulated durations X times faster (default 1)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=1, help="seed of the data set and card tokens")
    parser.add_argument(
        "--transactions",
        type=_count,
        default=1000,
        help="size of the seeded reporting data set",
    )
    parser.add_argument("--webhook-url", help="deliver boarding webhooks to this URL")
    parser.add_argument("--webhook-secret", help="HMAC secret that signs webhook deliveries")
    parser.add_argument(
        "--rate-limit", type=_rate_limit, help="terminal rate limit as R/S: R requests per S s"
    )
    parser.add_argument("--data-dir", type=Path, help="keep state in DIR/sim.db across restarts")
    parser.add_argument(
        "--chaos", action="store_true", help="duplicate and reorder webhook deliveries"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true",
        help="log each request and event (interactions, terminals, webhooks) on one line, stderr",
    )
    parser.set_defaults(handler=run_sim)
    _register_trigger(parser)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    return value


def _port(text: str) -> int:
    value = _count(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {text!r}")
    return value


def _rate_limit(text: str) -> str:
    from kiosk_agent.sim.ratelimit import RateLimit

    try:
        RateLimit.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def settings_from_ready(info: Mapping[str, Any], **tuning: Any) -> ServiceSettings:
    """The client settings that reach a simulator as its merchant, from its READY information
    (``SimServer.ready_info()``, or the JSON of the ``READY`` line); ``tuning``: other fields."""
    from kiosk_agent.service.settings import ServiceSettings

    return ServiceSettings.reaching_simulator(info, **tuning)


def parse_ready(line: str) -> dict[str, Any] | None:
    """The information of a ``READY {json}`` line (another process's simulator); None for any
    other line."""
    if not line.startswith(READY):
        return None
    info: dict[str, Any] = json.loads(line[len(READY) :])
    return info


def options_from_args(args: argparse.Namespace) -> SimOptions:
    from kiosk_agent.sim.server import SimOptions

    return SimOptions(
        host=args.host,
        port=args.port,
        time_scale=args.time_scale,
        seed=args.seed,
        transactions=args.transactions,
        webhook_url=args.webhook_url,
        webhook_secret=args.webhook_secret,
        rate_limit=args.rate_limit,
        data_dir=args.data_dir,
        chaos=args.chaos,
        verbose=args.verbose,
    )


async def run_sim(args: argparse.Namespace) -> int:
    import sqlite3

    from kiosk_agent.sim.server import SimServer

    if args.verbose:
        import logging

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        sim_logs = logging.getLogger("kiosk_agent.sim")
        sim_logs.addHandler(handler)
        sim_logs.setLevel(logging.DEBUG)
        sim_logs.propagate = False
    server = SimServer(options_from_args(args))
    try:
        await server.start()
    except (OSError, sqlite3.Error) as err:
        # a busy port, an unwritable --data-dir, a file there that is not a database
        print(f"error: cannot start the simulator: {err}", file=sys.stderr)
        return 1
    stop = stop_on_signals()
    print(f"{READY}{json.dumps(server.ready_info())}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
    return 0


# -- sim trigger: the test helpers from the command line (as `stripe trigger` does) ------------

SIM_URL_ENV = "KIOSK_BASE_URL"
# Who moves a merchant: service.models.boarding.MerchantTrigger's values, here without pydantic
# for the parser (tests/cli/test_sim_trigger.py holds them equal)
MERCHANT_TRIGGERS = ("api", "ui", "system")


def _register_trigger(parser: argparse.ArgumentParser) -> None:
    from kiosk_agent.cli.contract import case_insensitive, guarded, options

    actions = parser.add_subparsers(dest="sim_action", metavar="ACTION")
    trigger = actions.add_parser(
        "trigger", help="drive a running simulator: settle, terminals offline/online, merchants",
        description="Play one of the simulator's test helpers (POST /sim/...) on a running "
        f"simulator: --url, else ${SIM_URL_ENV}, else http://127.0.0.1:{DEFAULT_PORT}.",
    )
    events = trigger.add_subparsers(dest="event", metavar="EVENT", required=True)
    common = options(config=False, timeout=True)
    settle = events.add_parser("settle", parents=common,
                               help="settle the open batch now (deposits appear in reporting)")
    offline = events.add_parser("terminal-offline", parents=common, help="a reader goes offline")
    online = events.add_parser("terminal-online", parents=common, help="a reader comes back")
    for sub in (offline, online):
        sub.add_argument("device", metavar="DEVICE", help="e.g. SIM-0003")
    status = events.add_parser(
        "merchant-status", parents=common,
        help="move a merchant to any status (the service's own moves; sends its webhook)",
    )
    status.add_argument("merchant_id", metavar="MERCHANT_ID", type=int)
    status.add_argument("status", metavar="STATUS",
                        help="new, sent_for_signature, signed, in_underwriting, boarded, live, "
                        "cancelled, declined, deleted")
    movers = list(MERCHANT_TRIGGERS)
    status.add_argument("--trigger", dest="moved_by", type=case_insensitive(movers),
                        help=f"who moved it: {', '.join(movers)} (default: ui)")
    for sub in (settle, offline, online, status):
        sub.add_argument("--url", help=f"the simulator (default ${SIM_URL_ENV}, else "
                         f"http://127.0.0.1:{DEFAULT_PORT})")
        sub.set_defaults(handler=guarded(trigger_command))


def trigger_request(args: argparse.Namespace) -> tuple[str, dict[str, Any] | None]:
    """(the helper's path, its JSON body) for ``args.event``."""
    if args.event == "settle":
        return "/sim/settle", None
    if args.event in ("terminal-offline", "terminal-online"):
        state = args.event.removeprefix("terminal-")
        return f"/sim/terminals/{args.device}/{state}", None
    body: dict[str, Any] = {"merchant_status": args.status.strip().lower()}
    if args.moved_by:
        body["trigger"] = args.moved_by
    return f"/sim/merchants/{args.merchant_id}/status", body


async def trigger_command(args: argparse.Namespace) -> int:
    import aiohttp

    from kiosk_agent.cli.contract import (
        EXIT_OK,
        EXIT_UNREACHABLE,
        STATUS,
        CliError,
        print_json,
        timeout_of,
        wants_json,
    )

    base = (args.url or os.environ.get(SIM_URL_ENV) or f"http://127.0.0.1:{DEFAULT_PORT}")
    path, body = trigger_request(args)
    within = timeout_of(args)
    try:
        async with (
            STATUS.waiting(f"the simulator at {base}", within),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=within)) as http,
            http.post(base.rstrip("/") + path, json=body) as response,
        ):
            text = await response.text()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as err:
        raise CliError(f"no simulator answered at {base}: {type(err).__name__} {err}".rstrip(),
                       EXIT_UNREACHABLE) from None
    try:
        answer = json.loads(text) if text else {}
    except json.JSONDecodeError:
        answer = {"detail": text[:200]}
    if status != 200:
        detail = answer.get("detail") or answer.get("error") or f"HTTP {status}"
        raise CliError(f"the simulator refused {args.event}: {detail}")
    if wants_json(args):
        print_json(answer)
    else:
        print(_trigger_summary(args, answer))
    return EXIT_OK


def _trigger_summary(args: argparse.Namespace, answer: dict[str, Any]) -> str:
    if args.event == "settle":
        deposits = answer.get("deposits", [])
        return f"settled {answer.get('settled', 0)} transaction(s) into {len(deposits)} deposit(s)"
    if args.event.startswith("terminal-"):
        return f"{args.device} is {'online' if answer.get('online') else 'offline'}"
    return f"merchant {args.merchant_id} is {args.status.strip().lower()} (webhook sent)"
