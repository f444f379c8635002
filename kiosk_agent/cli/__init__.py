"""The `kiosk-agent` command line.

Each area owns one module here that exposes ``register(subparsers)``; a command's handler is an
``async def`` taking the parsed arguments and returning the exit code. The options, output and
exit codes every command shares are in :mod:`kiosk_agent.cli.contract`. Importing every module at
start-up would cost the field tech's first keystroke (on a Pi Zero, seconds), so modules are
imported lazily per command: ``--version`` imports nothing, ``--help`` reads the one-line help of
each command from :data:`COMMAND_HELP` (``tests/cli/test_contract.py`` holds it equal to what
the modules register), and a command imports only the module that owns it.

A new command (say ``sales attention``): ``parents=contract.options(...)`` on its parser (with
``timeout=True`` when it calls the service), ``handler=contract.guarded(...)``, results through
``contract.show``/``say``/``print_json`` (or ``--json``'s JSON), failures as ``CliError`` with a
code from ``contract.EXIT_CODES``, and one example in ``tests/cli/test_contract.py``'s
``EXAMPLES``: the test that walks the parser holds it to the contract from then on.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any

from kiosk_agent import __version__

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]

# command name -> module under kiosk_agent.cli that registers it
COMMAND_MODULES: dict[str, str] = {
    "sim": "sim",
    "run": "agent",
    "check-config": "check_config",
    "sales": "sales",
    "audit": "audit",
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
    "unit": "unit",
    "fleet": "fleet",
    "dex": "dex",
    "completion": "completion",
}
# command name -> its one line in `kiosk-agent --help`, so the overview imports no module
COMMAND_HELP: dict[str, str] = {
    "run": "run the agent",
    "check-config": "validate a configuration, start nothing",
    "sales": "list or export the sales journal",
    "audit": "the machine's own books: stock per column, the last read, mismatches",
    "demo": "simulator + virtual vending machine + agent, with a live view (no hardware)",
    "doctor": "check this unit: config, serial ports, service, terminals, printing",
    "health": "the health of a running agent (admin API)",
    "events": "follow a running agent live: sale steps, problems, readers in and out of service",
    "unit": "this unit's id and the machine its journal was made on; adopt a cloned journal",
    "fleet": "the fleet on the MQTT broker (Home Assistant)",
    "terminals": "card readers: list, ping, connect, test print (start here when a reader is down)",
    "report": "transactions, deposits, chargebacks, adjustments (streamed)",
    "payments": "charge, capture, void ...",
    "vault": "stored payment accounts",
    "plans": "recurring billing plans",
    "hpp": "hosted payment pages",
    "keys": "the payments API key",
    "boarding": "merchants and onboarding",
    "sim": "run the payment service simulator",
    "virtual": "run a virtual vending machine (MDB controller) for an agent to drive",
    "dex": "the machine's own audit (EVA-DTS): read it over DEX, or parse a saved one",
    "completion": "print a shell completion script (bash, zsh, fish)",
}
# Options of the top-level parser that take a value (to find the command word after them).
_VALUED = frozenset({"-c", "--config", "--timeout"})


class Parser(argparse.ArgumentParser):
    """argparse, keeping the last refusal so ``--json`` can answer it in JSON too."""

    refused: str | None = None

    def error(self, message: str) -> Any:
        Parser.refused = f"{self.prog}: {message}"
        return super().error(message)


def _top_level() -> tuple[Parser, argparse._SubParsersAction[Parser]]:
    from kiosk_agent.cli.contract import top_level_options

    parser = Parser(
        prog="kiosk-agent",
        description="Card payments for vending machines and self-service kiosks.",
        parents=top_level_options(),
    )
    parser.add_argument("--version", action="version", version=f"kiosk-agent {__version__}")
    return parser, parser.add_subparsers(dest="command", metavar="COMMAND")


def overview_parser() -> Parser:
    """The top-level parser with each command as a name and its help only (no module
    imported): what ``kiosk-agent --help`` and a bare ``kiosk-agent`` show."""
    parser, subparsers = _top_level()
    for name, help_text in COMMAND_HELP.items():
        subparsers.add_parser(name, help=help_text, add_help=False)
    return parser


def build_parser(only: str | None = None) -> Parser:
    """Build the parser; with ``only`` set, import just the module that owns that command."""
    parser, subparsers = _top_level()
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


# A stop signal that comes while `run` is still importing and reading its configuration (before
# its handlers are on the loop) is kept here, not left to the default action (Ctrl-C a
# traceback, SIGQUIT a core dump): the run then ends before starting anything, with that
# signal's exit code (docs/operations.md, "Signals"). The signals are contract.STOP_SIGNALS's.
EARLY_STOPS: list[int] = []


def _keep_early_stops() -> None:
    import signal

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        if signal.getsignal(signum) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
            signal.signal(signum, lambda received, _frame: EARLY_STOPS.append(received))


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = command_word(args_list)
    if command == "run" and argv is None:  # the process's own arguments: its signals are ours
        _keep_early_stops()
    if command is None and "--version" in args_list:
        print(f"kiosk-agent {__version__}")  # what argparse's version action prints, sooner
        return 0
    import json

    from kiosk_agent.cli.contract import (
        EXIT_INTERRUPTED,
        EXIT_USAGE,
        WITHOUT_LOOP,
        check_contract,
        forget_parsers,
        run_without_loop,
    )

    parser = overview_parser() if command is None else build_parser(command)
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
    # a run lives for months: it keeps no parser, neither its command's family nor the leaf
    # the contract check read (args.leaf_parser) nor the contract's shared option parsers
    del parser
    vars(args).pop("leaf_parser", None)
    forget_parsers()
    # pydantic looks for plugins of its own in every installed package's metadata when it builds
    # its first model: 10-17 ms of each start here (ten times that on a Pi Zero) for plugins the
    # program never uses. A plugin set up on purpose (the variable given) is left as asked.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    # and with them off, its plugin loader's import (importlib.metadata: 15-19 ms more)
    from kiosk_agent.pydantic_setup import skip_plugin_loader

    skip_plugin_loader()
    # aiohttp loads the system's trust store into a TLS context that checks no certificate
    # (24-26 ms of CPU here at its import, ten times that on a Pi Zero): not where nothing reads
    # it; and into the one that verifies, the hashed directory alone where it holds the bundle
    from kiosk_agent.aiohttp_setup import skip_unverified_trust_store

    skip_unverified_trust_store()
    # the process's own command line: its signals are the command's to keep, also as it exits
    # (`run` then ignores late ones); a caller in the same process gets its handlers back
    args.owns_process = argv is None
    try:
        if handler in WITHOUT_LOOP:  # a command that reads a file or the journal: no asyncio
            code = run_without_loop(handler, args)
            if args.owns_process:
                end_now(code)
            return code
        import asyncio  # here: `--help` and a usage error never wait for it

        return asyncio.run(handler(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def end_now(code: int) -> None:
    """End a command's own process with ``code`` now, its output written: without the
    interpreter's teardown (each module's objects freed one by one, what the kernel does at once
    as the process ends: 11-13 ms of the 100 ms of CPU of `kiosk-agent sales` here, with the
    handler done and its journal closed). Returns, for the usual exit, where the output cannot
    be written (a reader gone: `... | head`) or a thread of the command still runs (the usual
    exit waits for it)."""
    threading = sys.modules.get("threading")
    if threading is not None and any(
        t.is_alive() and not t.daemon and t is not threading.main_thread()
        for t in threading.enumerate()
    ):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.shutdown()  # its handlers flushed and closed, as at the usual exit
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
