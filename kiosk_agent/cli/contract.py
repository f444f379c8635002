"""The command line's contract, in one place: every command's options, output and exit codes.

- ``-c/--config FILE`` (else ``$KIOSK_CONFIG``) on every command that reads a configuration,
  before or after the subcommand (:func:`options`, :func:`config_path`).
- ``--json`` on every command that prints a result; a command without it refuses the option
  (argparse, exit 2), it is never ignored. A failure under ``--json`` still prints one JSON
  object, ``{"error": ..., "exit_code": N}``, on standard output (:func:`guarded`).
- ``--timeout S`` on every command that calls the service: each service call, retries and 429
  waits included, ends within S (it is ``ServiceSettings.timeout``, the one bound the service
  client derives its timeouts from), so a service that never answers ends the command with a
  clear error within S. Without it: the configuration's ``service.timeout``, else that
  setting's one default (``service.settings.DEFAULT_TIMEOUT``). On a terminal a line says
  what it waits for (:class:`StatusLine`, drawn by ``cli.waiting``, which the commands that
  wait import: a run draws none).
- Exit codes from :data:`EXIT_CODES` (docs/cli.md has the same table; a test compares them).
- ``NO_COLOR`` and TTY detection (:func:`use_colour`), progress with a clean final line
  (``cli.waiting.Progress``).
- Service commands work with a configuration that uses the embedded simulator: it is started
  for the command, as ``doctor`` and ``run`` do (``cli.service_access.service_settings``, through
  ``app.configured_service``, the one place that choice is made).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import json
import math
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from kiosk_agent import moments
from kiosk_agent.moments import display_time
from kiosk_agent.money import MoneyError, format_cents, parse_price
from kiosk_agent.service.timeouts import DEFAULT_TIMEOUT

# asyncio, pydantic, the service and the configuration loader are imported where a command
# uses them: every command's parser is built from this module, and `--help` or shell completion
# must not wait for them (tests/cli/test_startup.py)
if TYPE_CHECKING:
    import asyncio

    from pydantic import BaseModel, ValidationError

    from kiosk_agent.config.load import Config
    from kiosk_agent.sales.journal import Journal

# -- exit codes (docs/cli.md, "Exit codes and errors") -------------------------------------------

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_UNREACHABLE = 4
EXIT_JOURNAL_OWNED = 5
EXIT_HANGUP = 129
EXIT_INTERRUPTED = 130
EXIT_QUIT = 131

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "done; the check passed; the charge was approved",
    EXIT_FAILED: "the check failed (reader down or offline, no printer), a charge was declined, "
    "the service said no, a sale waits (`sales attention`), or the machine's books disagree "
    "with the journal (`audit`)",
    EXIT_USAGE: "bad input: an option, an amount, a date, a missing credential, a broken config "
    "file",
    EXIT_AUTH: "the service refused the credentials",
    EXIT_UNREACHABLE: "the service could not be reached or did not answer within --timeout",
    EXIT_JOURNAL_OWNED: "`run` and `demo`: another agent owns the journal; this one touched "
    "nothing (the systemd unit does not restart on it)",
    EXIT_HANGUP: "stopped by SIGHUP (its terminal closed: a dropped SSH session); `run` "
    "finished or parked its running sale first",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C, SIGINT); `run` finished or parked its running sale "
    "first",
    EXIT_QUIT: "stopped by SIGQUIT; `run` finished or parked its running sale first",
}

# What a signal does to a long-running command (`run`, `demo`, `sim`, `virtual`): each of these
# is a graceful stop (`run` refuses new sales, and finishes or parks the running one first);
# `run` then exits with the code given. SIGTERM is systemd's own stop: a clean exit.
# docs/operations.md ("Signals") has this table; a test compares them.
STOP_SIGNALS: dict[signal.Signals, int] = {
    signal.SIGTERM: EXIT_OK,
    signal.SIGINT: EXIT_INTERRUPTED,
    signal.SIGHUP: EXIT_HANGUP,
    signal.SIGQUIT: EXIT_QUIT,
}
# Signals whose default would kill the process mid-sale and that mean nothing to the agent:
# logged and ignored; the real-time ones (SIGRTMIN to SIGRTMAX) too. So are the terminal's stops
# (Ctrl-Z; a background agent writing to, or reading from, its terminal): by default they freeze
# the process, and a sale with it, card authorized and product half dropped, for as long as
# nobody resumes it. (SIGPIPE Python ignores itself; SIGKILL and SIGSTOP cannot be caught, and
# CRASH_SIGNALS are a crash: the next start recovers what they left open. The rest by default
# are ignored.)
IGNORED_SIGNALS: tuple[int, ...] = (
    *(
        getattr(signal, name)
        for name in (
            "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF", "SIGIO", "SIGPWR",
            "SIGSTKFLT", "SIGXCPU", "SIGXFSZ", "SIGTSTP", "SIGTTIN", "SIGTTOU",
        )
        if hasattr(signal, name)  # SIGPWR and SIGSTKFLT are Linux's
    ),
    *range(signal.SIGRTMIN, signal.SIGRTMAX + 1),
)  # fmt: skip
# What the kernel sends a process that crashed (or ``kill`` imitates): handled as a crash.
CRASH_SIGNALS = frozenset(
    {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT,
     signal.SIGTRAP, signal.SIGSYS}
)  # fmt: skip


def signal_name(signum: int) -> str:
    """``SIGHUP``; a real-time signal without a name of its own as ``SIGRTMIN+3``."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"

M = TypeVar("M", bound="BaseModel")
T = TypeVar("T")

CONFIG_ENV = "KIOSK_CONFIG"
DEFAULT_TIMEOUT_S = DEFAULT_TIMEOUT  # --timeout: the service's one default (service.timeout)

# settings field -> environment variable
ENVIRONMENT = {
    "base_url": "KIOSK_BASE_URL",
    "reporting_url": "KIOSK_REPORTING_URL",
    "ws_url": "KIOSK_WS_URL",
    "api_key": "KIOSK_API_KEY",
    "refresh_token": "KIOSK_REFRESH_TOKEN",
    "mid": "KIOSK_MID",
    "isv": "KIOSK_ISV",
    "client_id": "KIOSK_CLIENT_ID",
    "client_secret": "KIOSK_CLIENT_SECRET",
    "credentials_path": "KIOSK_CREDENTIALS_PATH",
}

__all__ = [
    "CONFIG_ENV",
    "ENVIRONMENT",
    "EXIT_CODES",
    "EXIT_JOURNAL_OWNED",
    "CliError",
    "guarded",
    "options",
]


class CliError(Exception):
    """One line for the person at the keyboard (and more lines under it), and the exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.details = list(details)


Handler = Callable[[argparse.Namespace], Awaitable[int]]


# -- options -------------------------------------------------------------------------------------


def positive_number(text: str) -> float:
    """An argparse ``type``: a finite number above zero (seconds, a time scale)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def zero_or_more_seconds(text: str) -> float:
    """An argparse ``type``: finite seconds, 0 or more (a pause that may be left out)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text!r}")
    return value


@functools.cache
def _parent(part: str) -> argparse.ArgumentParser:
    # default=SUPPRESS: an option may stand before or after the subcommand (`-c F terminals
    # list`, `terminals list -c F`); one not given is simply absent, read through the helpers.
    parent = argparse.ArgumentParser(add_help=False)
    if part == "config":
        parent.add_argument(
            "-c", "--config", metavar="FILE", default=argparse.SUPPRESS,
            help=f"the agent's YAML configuration (default: ${CONFIG_ENV})",
        )  # fmt: skip
    elif part == "json":
        parent.add_argument(
            "--json", action="store_true", default=argparse.SUPPRESS,
            help="print the result as JSON on standard output",
        )  # fmt: skip
    else:
        parent.add_argument(
            "--timeout", metavar="S", type=positive_number, default=argparse.SUPPRESS,
            help=f"seconds each service request may take (default {DEFAULT_TIMEOUT_S:g})",
        )  # fmt: skip
    return parent


def described(docstring: str | None, command: str) -> str:
    """A command's ``--help`` description from its module's docstring (without its leading
    ``kiosk-agent COMMAND:``), or its one line in the overview where docstrings were dropped
    (``PYTHONOPTIMIZE=2``, as the systemd unit runs Python)."""
    if docstring:
        return docstring.split(": ", 1)[1]
    from kiosk_agent.cli import COMMAND_HELP

    return COMMAND_HELP[command]


def options(
    *, config: bool = True, json: bool = True, timeout: bool = False
) -> list[argparse.ArgumentParser]:
    """The contract's options a command takes, as ``parents=`` of its parser (and of each of its
    actions, so they stand before or after the action)."""
    wanted = [("config", config), ("json", json), ("timeout", timeout)]
    return [_parent(name) for name, on in wanted if on]


def forget_parsers() -> None:
    """Let go of the option parsers :func:`options` shares, once the command line is parsed:
    a run would keep them (and the actions they hold) for months."""
    _parent.cache_clear()


def top_level_options() -> list[argparse.ArgumentParser]:
    """``kiosk-agent -c FILE --json --timeout S COMMAND``: each applies where the command has it."""
    return options(config=True, json=True, timeout=True)


def check_contract(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse a contract option given before a command that does not take it (never ignored)."""
    leaf = getattr(args, "leaf_parser", None)
    if leaf is None:
        return
    taken = leaf._option_string_actions  # argparse has no public listing
    for dest, flag in (("config", "--config"), ("json", "--json"), ("timeout", "--timeout")):
        if hasattr(args, dest) and flag not in taken:
            parser.error(f"{leaf.prog} does not take {flag}")


def config_path(args: argparse.Namespace) -> Path:
    """``-c/--config``, else ``$KIOSK_CONFIG``; a usage error without one, or when missing."""
    return existing_config(named_config(args))


def named_config(args: argparse.Namespace) -> Path:
    """``-c/--config``, else ``$KIOSK_CONFIG`` (not checked); a usage error without one."""
    given = getattr(args, "config", None) or os.environ.get(CONFIG_ENV)
    if not given:
        raise CliError(f"no configuration: give -c/--config FILE or set ${CONFIG_ENV}", EXIT_USAGE)
    return Path(given)


def optional_config_path(args: argparse.Namespace) -> Path | None:
    """``-c/--config``, else ``$KIOSK_CONFIG``, else None; a usage error when it is missing."""
    given = getattr(args, "config", None) or os.environ.get(CONFIG_ENV)
    return existing_config(Path(given)) if given else None


def existing_config(path: Path) -> Path:
    if not path.is_file():
        raise CliError(f"config file {path} does not exist", EXIT_USAGE)
    return path


def load(path: Path, **loader_options: Any) -> Config:
    """The configuration at ``path``; a broken one is exit 2 with every mistake listed."""
    from kiosk_agent.config.load import ConfigInvalid, load_config

    try:
        return load_config(path, **loader_options)
    except ConfigInvalid as err:
        count = len(err.errors)
        lines = [str(e) for e in err.errors]
        raise CliError(
            f"{plural(count, 'mistake')} in {path} (`kiosk-agent check-config {path}`):",
            EXIT_USAGE, lines,
        ) from None


def unit_config(args: argparse.Namespace) -> Config:
    """The configuration of a command that reads the unit's own files (its journal), not its
    hardware: the platforms are not checked (it runs beside the agent that owns them)."""
    return load(config_path(args), check_platforms=False)


def open_journal(config: Config, *, to_write: bool = False) -> Journal:
    """The configuration's journal; only to read it unless ``to_write`` (a reader never writes:
    it works beside the agent, and on a full or read-only disk). A journal not made yet or one
    that cannot be opened is a clear refusal (exit 1)."""
    import sqlite3

    from kiosk_agent.sales.journal import Journal, JournalError

    path = config.resolve(config["journal"]["path"])
    if not path.exists():
        raise CliError(f"no journal at {path} (the agent has not run yet)")
    journal = Journal(path)
    try:
        if to_write:
            journal.open()
            # a command is on no path to ready: the indexes open() left are built now
            journal.build_indexes()
        else:
            journal.open_to_read()
    except (JournalError, sqlite3.Error) as err:
        raise CliError(str(err)) from None
    return journal


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


def timeout_of(args: argparse.Namespace) -> float:
    value: float = getattr(args, "timeout", DEFAULT_TIMEOUT_S)
    return value


def plural(count: int, noun: str) -> str:
    """``1 transaction``, ``2 transactions``, ``1,200 sales``."""
    if count == 1:
        return f"1 {noun}"
    ending = "es" if noun.endswith(("s", "x", "ch", "sh")) else "s"
    return f"{count:,} {noun}{ending}"


# -- failures ------------------------------------------------------------------------------------


def stop_on_signals() -> asyncio.Event:
    """An event any of :data:`STOP_SIGNALS` sets: a long-running command's way to end cleanly."""
    return StopSignals("stopping").install().event


class StopSignals:
    """The signals of :data:`STOP_SIGNALS` and :data:`IGNORED_SIGNALS`, handled on the running
    loop: the first stop signal sets ``event`` and is kept (for :attr:`exit_code`); each one is
    logged with what happens next, so a stop is never a mystery in the log."""

    def __init__(self, doing: str) -> None:
        import asyncio

        self.event = asyncio.Event()
        # a second stop signal: the drain ends now, what is open parked as at its deadline
        self.again = asyncio.Event()
        self.received: signal.Signals | None = None
        self._doing = doing  # what the first stop signal starts, for the log line
        self._inherited_ignore = False
        self._previous: dict[int, Any] = {}  # the ignored signals' handlers before install

    def install(self) -> StopSignals:
        import asyncio

        # Started under `nohup` (SIGHUP ignored), the agent keeps ignoring it, as asked.
        self._inherited_ignore = signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(signum, self._on_signal, signum)
        # The 40 ignored ones only log: a plain handler each, which hands the line to the loop
        # (woken by the descriptor asyncio set up for the stop signals). The loop's own
        # add_signal_handler rebuilds the set of valid signals at every call: 3 ms of each
        # start here for these alone, ten times that on a Pi Zero.
        self._previous = {
            signum: signal.signal(signum, self._on_ignored_signal(loop))
            for signum in IGNORED_SIGNALS
        }
        from kiosk_agent.cli import EARLY_STOPS

        for early in EARLY_STOPS:  # came before this (`run` keeps them from its first line)
            self._on_signal(early)
        EARLY_STOPS.clear()
        return self

    def _on_ignored_signal(self, loop: asyncio.AbstractEventLoop) -> Callable[[int, Any], None]:
        def handler(signum: int, frame: Any) -> None:
            loop.call_soon_threadsafe(self._on_signal, signum)

        return handler

    def remove(self, *, then_ignore: bool = False) -> None:
        """The handlers before :meth:`install` back; ``then_ignore``: every one of these
        signals ignored instead, for a command that is done and only exits now (a signal
        landing then must neither kill it nor change the exit code it owes the first)."""
        import asyncio

        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError):
                loop.remove_signal_handler(signum)
            if then_ignore:
                signal.signal(signum, signal.SIG_IGN)
        for ignored, previous in self._previous.items():
            signal.signal(ignored, signal.SIG_IGN if then_ignore else previous)
        self._previous = {}

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.received is None else STOP_SIGNALS[self.received]

    async def wait(self) -> signal.Signals | None:
        await self.event.wait()
        return self.received

    def _on_signal(self, signum: int) -> None:
        import logging

        log = logging.getLogger("kiosk_agent.signals")
        name = signal_name(signum)
        if signum not in STOP_SIGNALS:
            log.warning("%s received: ignored (it does not stop the agent)", name)
        elif signum == signal.SIGHUP and self._inherited_ignore:
            log.warning("%s received: ignored (started with SIGHUP ignored, as by nohup)", name)
        elif self.received is None:
            self.received = signal.Signals(signum)
            log.warning("%s received: %s", name, self._doing)
            self.event.set()
        elif not self.again.is_set():
            self.again.set()
            log.warning("%s received: already stopping: the wait for running sales ends now, "
                        "what is still open is parked (the next start finishes it)", name)
        else:
            log.warning("%s received: already stopping, the wait for running sales ended", name)


def guarded(handler: Handler, *, loop: bool = True) -> Handler:
    """Every expected failure becomes one line on stderr (and, under ``--json``, a JSON object
    on stdout) and an exit code from the table; never a traceback.

    ``loop=False``: the handler never waits (it reads a file or the journal), so it runs without
    an event loop and asyncio is never imported (:func:`run_without_loop`)."""

    @functools.wraps(handler)
    async def run(args: argparse.Namespace) -> int:
        try:
            return await handler(args)
        except BrokenPipeError:  # `... | head`: the reader left, nothing to say
            return EXIT_OK
        except BaseException as err:
            if isinstance(err, KeyboardInterrupt | SystemExit) or _cancelled(err):
                raise
            message, code, details, scrub = _explain(err)
            _fail(args, message, code, details, scrub=scrub)
            return code

    if not loop:
        WITHOUT_LOOP.add(run)
    return run


# The handlers that run without an event loop: asyncio's import (and ssl's, and subprocess's,
# which it brings) was a third of the CPU of `sales` or `check-config` at their start.
WITHOUT_LOOP: set[Handler] = set()


def _cancelled(err: BaseException) -> bool:
    """Whether ``err`` is asyncio's cancellation; without asyncio imported, none can be."""
    asyncio = sys.modules.get("asyncio")
    return asyncio is not None and isinstance(err, asyncio.CancelledError)


async def awaited_anyhow(step: Coroutine[Any, Any, T]) -> T:
    """``step``'s result, from a handler made with ``guarded(..., loop=False)`` that waits only
    on some paths (``terminals``: the service, not the running agent): awaited on the caller's
    loop where there is one (a test, an in-process caller), else run in a loop of its own."""
    import asyncio  # this path waits: the import is its own

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # started without a loop (the command line)
        return asyncio.run(step)
    return await step


async def off_the_loop(call: Callable[[], T]) -> T:
    """A blocking call from a handler made with ``guarded(..., loop=False)``: made right here
    when it runs without a loop (the command line), in a worker thread where a caller's loop
    runs (a test, an in-process caller: the loop may serve what the call asks)."""
    loaded = sys.modules.get("asyncio")  # not imported: no loop can be running
    if loaded is None:
        return call()
    try:
        loaded.get_running_loop()
    except RuntimeError:
        return call()
    result: T = await loaded.to_thread(call)
    return result


def run_without_loop(handler: Handler, args: argparse.Namespace) -> int:
    """Run a handler made with ``guarded(..., loop=False)`` to its end on this thread. One that
    waits after all (a step given to an event loop that is not there) is a mistake of its
    registration, said as such."""
    step = handler(args)
    if not isinstance(step, Coroutine):
        raise TypeError(f"{handler.__name__} is not a coroutine function")
    try:
        step.send(None)
    except StopIteration as done:
        result: int = done.value
        return result
    step.close()
    raise RuntimeError(f"{handler.__name__} waited for an event loop: register it with "
                       "guarded(..., loop=True)")


def _explain(err: BaseException) -> tuple[str, int, list[str], bool]:
    """(message, exit code, more lines, whether the message needs scrubbing)."""
    from kiosk_agent.service import errors

    if isinstance(err, CliError):
        return str(err), err.code, err.details, False  # our words (and the loader's): no secrets
    if isinstance(err, errors.MissingCredentialsError):
        return str(err), EXIT_USAGE, [], False
    if isinstance(err, errors.AuthenticationError):
        return (f"credentials refused: {err}. Check KIOSK_API_KEY / client id and secret.",
                EXIT_AUTH, [], True)
    if isinstance(err, errors.ServiceUnreachableError):
        # the transport's own words (what was asked, host and port, the exception's type):
        # scrubbing would turn "OAuth token: no answer" into "OAuth token: [REDACTED] answer"
        return (f"service unreachable: {err}. Check {SERVICE_ADDRESS_FROM['base_url']} and the "
                "network; --timeout gives slow links longer.", EXIT_UNREACHABLE, [], False)
    if isinstance(err, errors.ServiceError):
        return f"the service said no: {err}", EXIT_FAILED, [], True
    if isinstance(err, MoneyError | ValueError):
        return str(err), EXIT_USAGE, [], True
    from kiosk_agent.web.server import ListenError

    if isinstance(err, ListenError):
        return str(err.strerror), EXIT_FAILED, [], False
    return f"unexpected {type(err).__name__}: {err} (please report this)", EXIT_FAILED, [], True


def _fail(
    args: argparse.Namespace, message: str, code: int, details: Sequence[str], *, scrub: bool
) -> None:
    from kiosk_agent.redact import redact
    from kiosk_agent.text import for_terminal

    STATUS.clear()
    # The service's words and unexpected errors pass through redact, the net under a slip.
    text = redact(message) if scrub else message
    # and are shown, never obeyed: a terminal escape in a service's error stays on the page
    print(f"error: {for_terminal(text)}", file=sys.stderr)
    for line in details:
        print(f"  {for_terminal(line)}", file=sys.stderr)
    if wants_json(args):
        answer: dict[str, object] = {"error": text, "exit_code": code}
        if details:
            answer["details"] = list(details)
        print(json.dumps(answer))


def usage_error_json(argv: Sequence[str], message: str) -> None:
    """argparse refused the command line: under ``--json`` say so in JSON too."""
    if "--json" in argv:
        print(json.dumps({"error": message, "exit_code": EXIT_USAGE}))


# -- output: colours, status line, progress ----------------------------------------------------


def use_colour(stream: TextIO) -> bool:
    """Colours only on a terminal, and never with ``NO_COLOR`` set (no-color.org) or TERM=dumb."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return is_tty(stream)


def is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class StatusLine:
    """One redrawn line on stderr (a terminal only): what the command waits for, or how far a
    pull is. ``done()`` and ``clear()`` wipe it whole, so no junk is left behind."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._shown = False

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    @property
    def live(self) -> bool:
        return is_tty(self.stream)

    def show(self, text: str) -> None:
        if not self.live:
            return
        self.stream.write(f"\r\x1b[K{text}")
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False

    def done(self, text: str) -> None:
        """A final line, wherever stderr goes."""
        self.clear()
        self.stream.write(text + "\n")
        self.stream.flush()


STATUS = StatusLine()  # a command line runs one command: one status line on stderr


# -- dates ---------------------------------------------------------------------------------------


def parse_moment(
    text: str | None, *, end: bool = False, option: str = "--since", now: dt.datetime | None = None
) -> dt.datetime | None:
    """``--since``/``--until``: the grammar of :mod:`kiosk_agent.moments` (the admin API's too);
    None when the option is not given."""
    if text is None:
        return None
    try:
        return moments.parse_moment(text, end=end, now=now)
    except moments.MomentError as err:
        raise CliError(f"{option}: {err}", EXIT_USAGE) from None


def case_insensitive(choices: Sequence[str]) -> Callable[[str], str]:
    """An argparse ``type`` matching ``choices`` whatever the case (statuses, states); its
    ``choices`` are what shell completion offers."""
    return _CaseInsensitive(tuple(choices))


class _CaseInsensitive:
    def __init__(self, choices: tuple[str, ...]) -> None:
        self.choices = choices
        self._by_folded = {c.casefold(): c for c in choices}

    def __call__(self, text: str) -> str:
        try:
            return self._by_folded[text.strip().casefold()]
        except KeyError:
            raise argparse.ArgumentTypeError(
                f"expected one of {', '.join(self.choices)}, got {text!r}"
            ) from None


# -- service settings ----------------------------------------------------------------------------
# (how a service command reaches the service: cli/service_access.py, imported by those commands)

# Where the service's address of this command came from, for the "unreachable" message: the
# variable that set it, or the configuration file and line (one command per process).
SERVICE_ADDRESS_FROM = {"base_url": "KIOSK_BASE_URL"}


def first_problem(err: ValidationError) -> str:
    """The first validation message, without pydantic's "Value error, " prefix."""
    message = str(err.errors(include_input=False)[0]["msg"])
    return message.removeprefix("Value error, ")


# -- results: text for people, JSON with --json ---------------------------------------------------


def given(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The options among ``names`` that the command line set."""
    return {name: value for name in names if (value := getattr(args, name, None)) is not None}


def validated(model: type[M], what: str, fields: dict[str, Any]) -> M:
    """``model`` of ``fields``; refused fields are a usage error that starts with ``what``."""
    from pydantic import ValidationError

    try:
        return model.model_validate(fields)
    except ValidationError as err:
        raise CliError(f"{what}: {first_problem(err)}", EXIT_USAGE) from None


# The largest whole number an option takes: SQLite's INTEGER, where a limit or an id ends up.
MAX_WHOLE = 2**63 - 1


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number above zero, in ASCII digits only (``int`` also
    takes ``"٣"``, ``"+5"``, ``"1_000"``; the admin API's ``limit`` does not) and at most
    :data:`MAX_WHOLE`."""
    shown = text if len(text) <= 40 else f"{text[:40]}..."
    value = int(text) if text.isascii() and text.isdigit() else None
    if value is None:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {shown!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number above zero, got {shown!r}")
    if value > MAX_WHOLE:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_WHOLE}, got {shown!r}")
    return value


def parse_amount(text: str) -> int:
    """A dollars string from the command line ("2.50", "$2.50") -> integer cents."""
    try:
        cents = parse_price(text)
    except MoneyError as err:
        raise CliError(f"amount: {err}", EXIT_USAGE) from None
    if cents <= 0:
        raise CliError(f"amount must be above zero, got {text!r}", EXIT_USAGE)
    return cents


def safe_dump(model: BaseModel) -> dict[str, Any]:
    """A model as JSON-ready data without tokens or keys, times and amounts as exports have them."""
    from kiosk_agent.export import json_value, model_values

    return {key: json_value(value) for key, value in model_values(model).items()}


def jsonable(value: object) -> object:
    from kiosk_agent.export import is_model, json_value

    if is_model(value):
        return safe_dump(value)
    return json_value(value)


def as_text(value: object) -> str:
    """A value for people: ``-`` for none (or an empty list), yes/no, ``$2.50``, times in UTC to
    the second, a list's items with commas."""
    from kiosk_agent.export import Amount, plain  # on use: a run never prints a record

    if value is None:
        return "-"
    if isinstance(value, Amount):
        return format_cents(value.cents, value.currency)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Decimal):
        return f"{value:.2f}"
    if isinstance(value, dt.datetime):  # UTC, and said, as every time the command line prints
        return display_time(value)
    if isinstance(value, list | tuple):
        return ", ".join(as_text(item) for item in value) or "-"
    from kiosk_agent.text import for_terminal  # on use: `--help` does not wait for it

    # the service's words (a name, a reason, a custom field): shown, never obeyed
    return for_terminal(str(plain(value)))


def print_record(pairs: Iterable[tuple[str, object]], *, as_json: bool, out: TextIO) -> None:
    from kiosk_agent.export import HIDDEN_FIELDS

    items = [(k, v) for k, v in pairs if k not in HIDDEN_FIELDS]
    if as_json:
        print(json.dumps({k: jsonable(v) for k, v in items}, indent=2), file=out)
        return
    width = max((len(k) for k, _ in items), default=0)
    for key, value in items:
        print(f"{key:<{width}}  {as_text(value)}", file=out)


def show(args: argparse.Namespace, pairs: Iterable[tuple[str, object]]) -> None:
    """One record on stdout, as text or (``--json``) JSON."""
    STATUS.clear()
    print_record(pairs, as_json=wants_json(args), out=sys.stdout)


def say(args: argparse.Namespace, line: str, **result: object) -> None:
    """A verdict: ``line`` for people, or ``result`` (with ``message``) as JSON."""
    STATUS.clear()
    if wants_json(args):
        print(json.dumps({**{k: jsonable(v) for k, v in result.items()}, "message": line},
                         indent=2))
    else:
        from kiosk_agent.text import for_terminal  # a service's words (a trans_id): never obeyed

        print(for_terminal(line, keep_lines=True))  # its own line ends are its layout


def print_json(data: object) -> None:
    STATUS.clear()
    print(json.dumps(data, indent=2))


def program_command(argv0: str, executable: str = sys.executable) -> str:
    """How to run kiosk-agent again as this process was started, for a hint to paste:
    ``kiosk-agent`` when that name on $PATH is this program, else its path
    (``.venv/bin/kiosk-agent``: `./dev demo` runs it from the venv, not from $PATH), or
    ``.venv/bin/python -m kiosk_agent``. A bare ``kiosk-agent`` was "command not found"."""
    import shutil

    program = Path(argv0)
    if program.name == "__main__.py":  # python -m kiosk_agent
        return f"{_unresolved(Path(executable))} -m kiosk_agent"
    found = shutil.which(program.name)
    if found is not None and Path(found).resolve() == Path(os.path.abspath(program)).resolve():
        return program.name
    return _unresolved(program)


def _unresolved(path: Path) -> str:
    """``path`` from the current directory when under it, else absolute; a symbolic link is
    kept as named (a venv's ``bin/python`` is one)."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)
