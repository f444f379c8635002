"""The `kiosk-agent` command line.

Each area owns one module here that exposes ``register(subparsers)``; a command's handler is an
``async def`` taking the parsed arguments and returning the exit code. Importing every module at
start-up would cost the field tech's first keystroke, so modules are imported lazily per command.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from kiosk_agent import __version__

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]

# command name -> module under kiosk_agent.cli that registers it
COMMAND_MODULES: dict[str, str] = {
    "sim": "sim",
    "run": "agent",
    "check-config": "agent",
    "sales": "agent",
    "demo": "demo",
    "virtual": "virtual",
    "terminals": "service",
    "report": "service",
    "payments": "service",
    "vault": "service",
    "plans": "service",
    "hpp": "service",
    "boarding": "service",
    "keys": "service",
    "doctor": "fleet",
    "health": "fleet",
    "fleet": "fleet",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Build the parser; with ``only`` set, import just the module that owns that command."""
    parser = argparse.ArgumentParser(
        prog="kiosk-agent",
        description="Card payments for vending machines and self-service kiosks.",
    )
    parser.add_argument("--version", action="version", version=f"kiosk-agent {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {COMMAND_MODULES[only]} if only in COMMAND_MODULES else set(COMMAND_MODULES.values())
    for name in sorted(modules):
        module = importlib.import_module(f"kiosk_agent.cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(first)
    args = parser.parse_args(args_list)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return asyncio.run(handler(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
