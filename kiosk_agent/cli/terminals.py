"""`kiosk-agent terminals [list|ping|connect|test-print]`: the card readers, for a field tech.

What to run first when a reader is down. Every command exits 0 only when every reader it looked
at is fine: ``list`` exits 1 with a reader offline, ``ping`` with no answer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from kiosk_agent.cli.contract import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    STATUS,
    CliError,
    as_text,
    awaited_anyhow,
    guarded,
    off_the_loop,
    options,
    print_json,
    safe_dump,
    say,
    wants_json,
)
from kiosk_agent.cli.service_access import service_client
from kiosk_agent.service.timeouts import DEFAULT_TIMEOUT

SERVICE = options(timeout=True)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "terminals",
        parents=SERVICE,
        help="card readers: list, ping, connect, test print (start here when a reader is down)",
        description="List the card readers with their capabilities and online state, or check one.",
    )
    parser.set_defaults(handler=guarded(terminals_list, loop=False))
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.add_parser("list", parents=SERVICE, help="every reader and its state").set_defaults(
        handler=guarded(terminals_list, loop=False)
    )
    for name, handler, text in (
        ("ping", terminals_ping, "is the reader online, and how fast does it answer"),
        ("connect", terminals_connect, "open a session on the reader"),
    ):
        sub = actions.add_parser(name, parents=SERVICE, help=text)
        sub.add_argument("device", metavar="DEVICE", help="device id, e.g. SIM-0001")
        sub.set_defaults(handler=guarded(handler))
    sub = actions.add_parser("test-print", parents=SERVICE, help="print a receipt on the reader")
    sub.add_argument("device", metavar="DEVICE")
    sub.add_argument("--trans-id", help="transaction to print (default: the latest one)")
    sub.set_defaults(handler=guarded(terminals_test_print))


async def terminals_list(args: argparse.Namespace) -> int:
    """Registered without an event loop: the running agent is asked with the standard library
    (:func:`agents_terminals`); the service in a loop of its own."""
    terminals = await agents_terminals(args)
    if terminals is None:
        terminals = await awaited_anyhow(_service_terminals(args))
    out = sys.stdout
    offline = [t["device_id"] for t in terminals if not t.get("online")]
    code = EXIT_FAILED if offline else EXIT_OK  # a reader down is a failed check
    configured = configured_names(args)
    if wants_json(args):
        print_json([{**t, "configured_name": configured.get(t["device_id"])} for t in terminals])
        return code
    header = ("DEVICE", "CONFIGURED", "SERVICE NAME", "VENDOR", "MODEL", "ONLINE", "SESSION",
              "SIGNATURE", "PRINTS", "LAST SEEN")
    now = datetime.now(UTC)
    rows = []
    for t in terminals:
        can = t.get("capabilities") or {}
        rows.append((
            t["device_id"], configured.get(t["device_id"]), t.get("name"), t.get("vendor"),
            t.get("model"), t.get("online"), t.get("connected"), can.get("signature_capture"),
            can.get("receipt_printing"), seen(_instant(t.get("last_seen_at")), now),
        ))  # fmt: skip
    _print_table(header, rows, out)
    if not terminals:
        print("no terminals on this account", file=out)
    elif offline:
        from kiosk_agent.text import for_terminal  # the service's device ids: never obeyed

        print(
            for_terminal(
                f"\n{len(offline)} of {len(terminals)} offline: {', '.join(offline)}. "
                f"Fix: check power and network of the reader, then `kiosk-agent terminals "
                f"ping {offline[0]}`.", keep_lines=True,
            ),
            file=out,
        )
    else:
        print(f"\nall {len(terminals)} terminals online", file=out)
    return code


async def _service_terminals(args: argparse.Namespace) -> list[dict[str, Any]]:
    async with service_client(args) as svc:
        return [safe_dump(t) for t in await svc.terminal.list()]


async def agents_terminals(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """The terminals as the agent running on this configuration has them from its service
    (``GET /api/terminals`` of its admin API), when the configuration embeds the simulator:
    that simulator lives in the agent, and one started for the command would be another (its
    readers fresh, none of the agent's offline ones), and cost a second to start. None where
    the service itself is to be asked (no configuration, a real service, or a ``KIOSK_*``
    service address given). With no agent to ask (none listens at its admin API, or the
    configuration has no ``admin:`` section), a :class:`CliError` (exit 4) that says so at
    once and names the configured readers: no simulator is started."""
    from kiosk_agent.cli.contract import ENVIRONMENT, load, optional_config_path

    path = optional_config_path(args)
    if path is None or os.environ.get(ENVIRONMENT["base_url"]):
        return None
    config = load(path, check_platforms=False)
    from kiosk_agent.cli.fleet import check_admin_answer, configured_admin, get_once

    address = configured_admin(config)
    if config["service"].get("simulator") is None:
        # a real service: asked through its agent where one runs (it asks the service as the
        # command would, without the command's service client: 1.3 s of CPU on a loaded
        # 2-core machine); else, or when that agent cannot say, the service itself
        return None if address is None else await _through_the_agent(path, address, args)
    if address is None:  # a demo serves an admin API of its own while it runs
        from kiosk_agent.cli.demo_admin import running_demo

        address = running_demo(config, str(path))
    if address is None:
        raise _no_agent_to_ask(
            path, config, f"{path} has no admin: section to ask its agent, and no demo runs "
            "on it",
            "give it an admin: section (docs/operations.md) to ask the agent running on it; "
            "`kiosk-agent demo` shows its readers in its live view and on its status page")
    url, token = address
    within = getattr(args, "timeout", None) or DEFAULT_TIMEOUT
    try:
        status, location, body = await off_the_loop(
            lambda: get_once(f"{url}/api/terminals", token, within))
    except ConnectionRefusedError:
        raise _no_agent_to_ask(
            path, config, f"no agent runs on {path}: nothing listens at its admin API ({url})",
            f"start it (`kiosk-agent run -c {path}`) and ask again",
        ) from None
    except (OSError, ValueError) as err:
        from kiosk_agent.service.errors import network_words

        raise CliError(
            f"the agent at {url} runs the simulator of {path}; asking it for its terminals "
            f"failed: {network_words(err)}", EXIT_UNREACHABLE,
        ) from None
    check_admin_answer(url, status, location)
    try:
        listed: list[dict[str, Any]] = json.loads(body)["terminals"]
    except (ValueError, KeyError, TypeError):
        raise CliError(f"{url} answered no terminal list: is it the agent's admin API?") from None
    STATUS.done(f"{path}: the terminals of the agent running on it ({url}), from its embedded "
                "simulator")
    return listed


async def _through_the_agent(
    path: object, address: tuple[str, str], args: argparse.Namespace
) -> list[dict[str, Any]] | None:
    """The service's terminals as the agent running on ``path`` lists them (its admin API
    asks the service at once); None when no agent answers them (none runs, a token refused,
    its service unreachable from it): the command asks the service itself."""
    from kiosk_agent.cli.fleet import get_once

    url, token = address
    within = getattr(args, "timeout", None) or DEFAULT_TIMEOUT
    try:
        status, _location, body = await off_the_loop(
            lambda: get_once(f"{url}/api/terminals", token, within))
        if status != 200:
            return None
        listed: list[dict[str, Any]] = json.loads(body)["terminals"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    STATUS.done(f"{path}: the terminals of its service, as the agent running on it ({url}) "
                "has just asked it")
    return listed


def _no_agent_to_ask(path: object, config: Any, why: str, fix: str) -> CliError:
    """The answer of ``terminals`` on a configuration that embeds the simulator when no agent
    can be asked: the simulator runs inside the agent, so there is no service to ask, and one
    started for the command would list readers of its own, none of the agent's."""
    readers = ", ".join(
        f"{t['device_id']} ({t['name']})" if t.get("name") else t["device_id"]
        for t in config["terminals"]
    )
    return CliError(
        f"{why}; its service is the embedded simulator, which runs inside the agent: no "
        "reader's state to show",
        EXIT_UNREACHABLE,
        [f"its readers: {readers}", fix],
    )


def _instant(text: object) -> datetime | None:
    """An ISO 8601 time of the JSON (``...Z``), as a datetime; None when there is none."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def configured_names(args: argparse.Namespace) -> dict[str, str | None]:
    """device_id -> the name the configuration gives it (``front``: what the unit's triggers,
    logs and `events --terminal` say), when a configuration is given."""
    from kiosk_agent.cli.contract import load, optional_config_path

    path = optional_config_path(args)
    if path is None:
        return {}
    config = load(path, check_platforms=False)
    return {t["device_id"]: t.get("name") for t in config["terminals"]}


def seen(at: datetime | None, now: datetime) -> object:
    """When the service last saw a reader; a time ahead of this machine's clock (a service,
    or a simulator run faster, whose clock is ahead) is "just now", never the future."""
    if at is None:
        return None
    stamp = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return "just now" if stamp > now else at


def _print_table(header: Sequence[str], rows: Sequence[Sequence[object]], out: TextIO) -> None:
    cells = [[as_text(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(), file=out)
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


async def terminals_ping(args: argparse.Namespace) -> int:
    from kiosk_agent.service.errors import NotFoundError

    async with service_client(args) as svc:
        try:
            result = await svc.terminal.ping(args.device)
        except NotFoundError:
            raise _unknown_device(args.device) from None
    if result.online:
        latency = f" in {result.latency_ms:.0f} ms" if result.latency_ms is not None else ""
        say(args, f"OK    {args.device} is online and answered{latency}",
            device_id=args.device, ok=True, online=True, latency_ms=result.latency_ms)
        return EXIT_OK
    say(
        args,
        f"DOWN  {args.device} does not answer.\n"
        f"Fix:  check that the reader has power and network (cable, Wi-Fi), wait for it to "
        f"boot, then run `kiosk-agent terminals ping {args.device}` again.",
        device_id=args.device, ok=False, online=False, latency_ms=None,
    )
    return EXIT_FAILED


def _unknown_device(device: str) -> CliError:
    return CliError(f"no terminal {device} on this account; `kiosk-agent terminals` lists them")


async def terminals_connect(args: argparse.Namespace) -> int:
    from kiosk_agent.service.errors import (
        ConflictError,
        NotFoundError,
        ServiceError,
        ServiceUnreachableError,
        conflict_words,
    )

    async with service_client(args) as svc:
        try:
            connection = await svc.terminal.connect(args.device)
        except NotFoundError:
            raise _unknown_device(args.device) from None
        except ServiceUnreachableError:
            raise  # no answer: exit 4 like every command, not a refusal
        except ConflictError as err:  # offline or busy: in words, not "HTTP 409 [...]"
            raise CliError(
                f"{args.device}: no session: {conflict_words(err, args.device)}. Fix: "
                f"`kiosk-agent terminals ping {args.device}` to see whether it is online."
            ) from None
        except ServiceError as err:
            raise CliError(
                f"{args.device} refused the session: {err}. Fix: `kiosk-agent terminals ping "
                f"{args.device}` to see whether it is online."
            ) from None
    if connection.connected:
        say(args, f"OK    {args.device} session open", device_id=args.device, ok=True,
            connected=True)
        return EXIT_OK
    say(args, f"DOWN  {args.device} did not open a session; is it online? "
        f"`kiosk-agent terminals ping {args.device}`", device_id=args.device, ok=False,
        connected=False)
    return EXIT_FAILED


async def terminals_test_print(args: argparse.Namespace) -> int:
    async with service_client(args) as svc:
        terminals = await svc.terminal.list()
        terminal = next((t for t in terminals if t.device_id == args.device), None)
        if terminal is None:
            raise _unknown_device(args.device)
        if not terminal.capabilities.receipt_printing:
            printers = [t.device_id for t in terminals if t.capabilities.receipt_printing]
            hint = f" Readers that print: {', '.join(printers)}." if printers else ""
            raise CliError(
                f"{args.device} has no receipt printer (its capabilities lack receipt_printing); "
                f"customers get e-mailed receipts.{hint}"
            )
        if not terminal.online:
            raise CliError(
                f"{args.device} is offline. Fix: check power and network, then "
                f"`kiosk-agent terminals ping {args.device}`."
            )
        trans_id = args.trans_id or await _latest_trans_id(svc)
        await svc.terminal.print_receipt(args.device, trans_id)
    say(args, f"OK    {args.device} printed the receipt of transaction {trans_id}",
        device_id=args.device, ok=True, trans_id=trans_id)
    return EXIT_OK


async def _latest_trans_id(svc: Any) -> str:
    """The newest transaction's id, read from reporting (needs the OAuth client)."""
    from kiosk_agent.service.errors import MissingCredentialsError

    newest: tuple[float, str] | None = None
    try:
        async for transaction in svc.reporting.transactions(page_size=1000):
            when = transaction.trans_at
            when = -math.inf if when is None else when
            if newest is None or when > newest[0]:
                newest = (when, transaction.trans_id)
    except MissingCredentialsError:
        raise CliError("give --trans-id (reporting credentials are not set to find one)",
                       EXIT_USAGE) from None
    if newest is None:
        raise CliError("no transaction to print yet; give --trans-id", EXIT_USAGE)
    return newest[1]
