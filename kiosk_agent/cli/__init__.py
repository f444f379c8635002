"""The `kiosk-agent` command line.

Each area owns one module here that exposes ``register(subparsers)``; a command's handler is an
``async def`` taking the parsed arguments and returning the exit code. The options, output and
exit codes every command shares are in :mod:`kiosk_agent.cli.contract`. Importing every module at
start-up would cost the field tech's first keystroke, so modules are imported lazily per command.

A new command (say ``sales attention``): ``parents=contract.options(...)`` on its parser (with
``timeout=True`` when it calls the service), ``handler=contract.guarded(...)``, results through
``contract.show``/``say``/``print_json`` (or ``--json``'s JSON), failures as ``CliError`` with a
code from ``contract.EXIT_CODES``, and one example in ``tests/cli/test_contract.py``'s
``EXAMPLES``: the test that walks the parser holds it to the contract from then on.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
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
    "terminals": "terminals",
    "report": "report",
    "payments": "payments",
    "vault": "payments",
    "plans": "payments",
    "hpp": "payments",
    "boarding": "boarding",
    "keys": "payments",
    "doctor": "fleet",
    "health": "fleet",
    "events": "events",
    "fleet": "fleet",
    "completion": "completion",
}
# Options of the top-level parser that take a value (to find the command word after them).
_VALUED = frozenset({"-c", "--config", "--timeout"})


class Parser(argparse.ArgumentParser):
    """argparse, keeping the last refusal so ``--json`` can answer it in JSON too."""

    refused: str | None = None

    def error(self, message: str) -> Any:
        Parser.refused = f"{self.prog}: {message}"
        return super().error(message)


def build_parser(only: str | None = None) -> Parser:
    """Build the parser; with ``only`` set, import just the module that owns that command."""
    from kiosk_agent.cli.contract import top_level_options

    parser = Parser(
        prog="kiosk-agent",
        description="Card payments for vending machines and self-service kiosks.",
        parents=top_level_options(),
    )
    parser.add_argument("--version", action="version", version=f"kiosk-agent {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {COMMAND_MODULES[only]} if only in COMMAND_MODULES else set(COMMAND_MODULES.values())
    for name in sorted(modules):
        module = importlib.import_module(f"kiosk_agent.cli.{name}")
        module.register(subparsers)
    for _path, sub in walk(parser):
        if sub is not parser:
            sub.set_defaults(leaf_parser=sub)  # the contract check reads which options it takes
    return parser


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser under ``parser`` with its command words: (), ("terminals",), ..."""
    yield path, parser
    for action in parser._actions:  # argparse has no public listing of subparsers
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias
                    continue
                seen.add(id(sub))
                yield from walk(sub, (*path, name))


def command_word(argv: Sequence[str]) -> str | None:
    """The command in ``argv``, after any top-level options (``-c FILE --json terminals``)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _VALUED:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def main(argv: Sequence[str] | None = None) -> int:
    from kiosk_agent.cli.contract import EXIT_INTERRUPTED, EXIT_USAGE, check_contract

    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(command_word(args_list))
    try:
        args = parser.parse_args(args_list)
        check_contract(args, parser)
    except SystemExit as exit_:
        if exit_.code == EXIT_USAGE and "--json" in args_list:
            print(json.dumps({"error": Parser.refused or "usage", "exit_code": EXIT_USAGE}))
        raise
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return asyncio.run(handler(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
