"""``kiosk-agent sim``: the whole payment service, served locally for tests and demos."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sqlite3
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kiosk_agent.service.settings import ServiceSettings
from kiosk_agent.sim.ratelimit import RateLimit
from kiosk_agent.sim.server import SimOptions, SimServer

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
        "--time-scale", type=_positive_float, default=1.0,
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
    parser.set_defaults(handler=run_sim)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


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
    try:
        RateLimit.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def settings_from_ready(info: Mapping[str, Any], **tuning: Any) -> ServiceSettings:
    """The client settings that reach a simulator as its merchant, from its READY information
    (``SimServer.ready_info()``, or the JSON of the ``READY`` line); ``tuning``: other fields."""
    return ServiceSettings(
        base_url=info["base_url"],
        reporting_url=info["reporting_url"],
        ws_url=info["ws_url"],
        api_key=info["api_key"],
        refresh_token=info["refresh_token"],
        mid=info["mid"],
        client_id=info["client_id"],
        client_secret=info["client_secret"],
        **tuning,
    )


def parse_ready(line: str) -> dict[str, Any] | None:
    """The information of a ``READY {json}`` line (another process's simulator); None for any
    other line."""
    if not line.startswith(READY):
        return None
    info: dict[str, Any] = json.loads(line[len(READY) :])
    return info


def options_from_args(args: argparse.Namespace) -> SimOptions:
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
    )


async def run_sim(args: argparse.Namespace) -> int:
    server = SimServer(options_from_args(args))
    try:
        await server.start()
    except (OSError, sqlite3.Error) as err:
        # a busy port, an unwritable --data-dir, a file there that is not a database
        print(f"error: cannot start the simulator: {err}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    print(f"{READY}{json.dumps(server.ready_info())}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
    return 0
